//! The kernel-record decoder on hand-built records (the conformance test checks it against nft
//! itself): our statements read back, anything else foreign.

use super::*;
use crate::rules::nla::{Attrs, to_bytes};

fn expr(name: &str, data: Attrs) -> Attrs {
    Attrs::new().string(1, name).nested(2, data)
}

fn value(bytes: &[u8]) -> Attrs {
    Attrs::new().bytes(1, bytes)
}

fn rule(table: &str, chain: &str, exprs: Vec<Attrs>) -> Vec<u8> {
    let mut list = Attrs::new();
    for e in exprs {
        list = list.nested(1, e);
    }
    let attrs = Attrs::new()
        .string(1, table)
        .string(2, chain)
        .nested(4, list)
        .done()
        .unwrap();
    to_bytes(&attrs)
}

/// `mark and 0xfff != 0x539 counter redirect to :15001`, as nft compiles it.
fn redirect_rule() -> Vec<Attrs> {
    vec![
        expr("meta", Attrs::new().u32(2, 3).u32(1, 1)),
        expr(
            "bitwise",
            Attrs::new()
                .u32(1, 1)
                .u32(2, 1)
                .u32(3, 4)
                .nested(4, value(&0xfffu32.to_ne_bytes()))
                .nested(5, value(&[0; 4])),
        ),
        expr(
            "cmp",
            Attrs::new()
                .u32(1, 1)
                .u32(2, 1)
                .nested(3, value(&0x539u32.to_ne_bytes())),
        ),
        expr("counter", Attrs::new()),
        expr(
            "immediate",
            Attrs::new()
                .u32(1, 1)
                .nested(2, value(&15001u16.to_be_bytes())),
        ),
        expr("redir", Attrs::new().u32(1, 1).u32(2, 1).u32(3, 2)),
    ]
}

fn decode(rules: &[Vec<u8>]) -> NativeState {
    decode_kernel(&[], &[], &[], rules, &AnonSets::new(), "istio-")
}

#[test]
fn a_compiled_rule_reads_back_as_its_statements() {
    let state = decode(&[rule("istio-ambient-nat", "istio-output", redirect_rule())]);
    let rules = &state.tables["istio-ambient-nat"].chains["istio-output"].rules;
    let body: Vec<String> = rules[0]
        .as_ref()
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        body.join(" "),
        "meta mark & 0xfff != 0x539 counter redirect to :15001"
    );
}

#[test]
fn anything_else_is_foreign_and_other_tables_are_not_read() {
    let mut exprs = redirect_rule();
    exprs.insert(3, expr("log", Attrs::new()));
    let state = decode(&[
        rule("istio-ambient-nat", "istio-output", exprs),
        rule("other", "output", redirect_rule()),
    ]);
    assert_eq!(state.tables.len(), 1);
    let rule = &state.tables["istio-ambient-nat"].chains["istio-output"].rules[0];
    assert!(
        rule.as_ref().is_err_and(|f| f.0.contains("log")),
        "{rule:?}"
    );
    // A load without its compare, or a redirect without its port, is foreign too.
    let cut: Vec<Attrs> = redirect_rule().into_iter().take(1).collect();
    let state = decode(&[rule_of(cut)]);
    assert!(state.tables["istio-ambient-nat"].chains["x"].rules[0].is_err());
    let no_port: Vec<Attrs> = redirect_rule().into_iter().skip(5).collect();
    let state = decode(&[rule_of(no_port)]);
    assert!(state.tables["istio-ambient-nat"].chains["x"].rules[0].is_err());
}

fn rule_of(exprs: Vec<Attrs>) -> Vec<u8> {
    rule("istio-ambient-nat", "x", exprs)
}

#[test]
fn prefixes_are_read_from_contiguous_masks_only() {
    assert_eq!(prefix_len(&[0xff, 0xfe, 0, 0]), Some(15));
    assert_eq!(prefix_len(&[0xff; 4]), Some(32));
    assert_eq!(prefix_len(&[0xff, 0x01, 0, 0]), None);
}

/// `iifname <name> counter` as nft compiles it: `cmp` on the name's bytes (`op` 0 is eq, 1 neq).
fn iifname_rule(data: &[u8], op: u32) -> Vec<Attrs> {
    vec![
        expr("meta", Attrs::new().u32(2, 6).u32(1, 1)),
        expr(
            "cmp",
            Attrs::new().u32(1, 1).u32(2, op).nested(3, value(data)),
        ),
        expr("counter", Attrs::new()),
    ]
}

#[test]
fn interface_wildcards_read_back_as_nft_spells_them() {
    let mut padded = *b"tun0\0\0\0\0\0\0\0\0\0\0\0\0";
    let whole = iifname_rule(&padded, 0);
    // nft compares a wildcard `tun*` on the prefix's bytes only, without a NUL.
    let wildcard = iifname_rule(b"tun", 0);
    let negated = iifname_rule(b"e", 1);
    padded[15] = b'x';
    let unterminated = iifname_rule(&padded, 0);
    let state = decode(&[
        rule_of(whole),
        rule_of(wildcard),
        rule_of(negated),
        rule_of(unterminated),
    ]);
    let rules = &state.tables["istio-ambient-nat"].chains["x"].rules;
    let shown: Vec<String> = rules[..3]
        .iter()
        .map(|r| {
            let body: Vec<String> = r
                .as_ref()
                .unwrap()
                .iter()
                .map(ToString::to_string)
                .collect();
            body.join(" ")
        })
        .collect();
    assert_eq!(
        shown,
        [
            "iifname tun0 counter",
            "iifname tun* counter",
            "iifname != e* counter"
        ]
    );
    assert!(rules[3].is_err(), "{:?}", rules[3]);
}
