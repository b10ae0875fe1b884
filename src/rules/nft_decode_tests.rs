//! The JSON decoder against a listing nft 1.0.6 printed for Istio's `default` ambient golden
//! (its mangle table), and the canonical spelling of planned rules.

use super::*;
use crate::rules::ambient::{AmbientConfig, PodOverrides, inpod_nft_rules};
use crate::rules::model::{Family, Proto};
use crate::rules::nft_model::expr::{daddr, dport, tcp};
use crate::rules::nft_model::{
    MarkKey, MarkSource, MaskSpelling, MaskedMark, NftCtState, OwnerKind, Side,
};
use crate::rules::nftables::NftTable;

/// `nft -j list ruleset` of the `default` golden's mangle table (and a table not ours).
const MANGLE: &str = r#"{"nftables": [{"metainfo": {"version": "1.0.6"}}, {"table": {"family": "inet", "name": "istio-ambient-mangle", "handle": 2}}, {"chain": {"family": "inet", "table": "istio-ambient-mangle", "name": "prerouting", "handle": 1, "type": "filter", "hook": "prerouting", "prio": -150, "policy": "accept"}}, {"chain": {"family": "inet", "table": "istio-ambient-mangle", "name": "output", "handle": 2, "type": "route", "hook": "output", "prio": -150, "policy": "accept"}}, {"chain": {"family": "inet", "table": "istio-ambient-mangle", "name": "istio-prerouting", "handle": 3}}, {"chain": {"family": "inet", "table": "istio-ambient-mangle", "name": "istio-output", "handle": 4}}, {"rule": {"family": "inet", "table": "istio-ambient-mangle", "chain": "prerouting", "handle": 5, "expr": [{"jump": {"target": "istio-prerouting"}}]}}, {"rule": {"family": "inet", "table": "istio-ambient-mangle", "chain": "output", "handle": 6, "expr": [{"jump": {"target": "istio-output"}}]}}, {"rule": {"family": "inet", "table": "istio-ambient-mangle", "chain": "istio-prerouting", "handle": 7, "expr": [{"match": {"op": "==", "left": {"&": [{"meta": {"key": "mark"}}, 4095]}, "right": 1337}}, {"counter": {"packets": 0, "bytes": 0}}, {"mangle": {"key": {"ct": {"key": "mark"}}, "value": {"|": [{"&": [{"ct": {"key": "mark"}}, 4294963473]}, 273]}}}]}}, {"rule": {"family": "inet", "table": "istio-ambient-mangle", "chain": "istio-output", "handle": 8, "expr": [{"match": {"op": "==", "left": {"&": [{"ct": {"key": "mark"}}, 4095]}, "right": 273}}, {"counter": {"packets": 0, "bytes": 0}}, {"mangle": {"key": {"meta": {"key": "mark"}}, "value": {"ct": {"key": "mark"}}}}]}}, {"table": {"family": "inet", "name": "other", "handle": 9}}]}"#;

fn mangle_plan() -> NativeState {
    let set = inpod_nft_rules(&AmbientConfig::default(), &PodOverrides::default());
    expected(&set, &[NftTable::AmbientMangle], &[])
}

#[test]
fn a_listing_decodes_to_the_planned_typed_rules() {
    let state = decode_listing(MANGLE, "istio-ambient-").unwrap();
    assert_eq!(state.tables.len(), 1, "{state:?}");
    let table = &state.tables["istio-ambient-mangle"];
    let pre = &table.chains["istio-prerouting"];
    assert_eq!(pre.hook, None);
    assert_eq!(
        pre.rules,
        vec![Ok(vec![
            NftExpr::MarkMasked {
                key: MarkKey::Meta,
                mark: MaskedMark {
                    value: 0x539,
                    mask: 0xfff
                },
                negate: false,
                spelling: MaskSpelling::Ampersand,
            },
            NftExpr::Counter,
            NftExpr::CtMarkSet(MarkSource::Masked(MaskedMark {
                value: 0x111,
                mask: 0xfff
            })),
        ])]
    );
    assert_eq!(
        table.chains["output"].hook,
        Some(Hook {
            kind: "route".into(),
            hook: "output".into(),
            priority: -150,
            policy: "accept".into()
        })
    );
    assert_eq!(difference(&mangle_plan(), &state), None);
}

#[test]
fn a_statement_the_model_cannot_say_is_foreign_and_differs() {
    let drifted = MANGLE.replace(
        r#"{"counter": {"packets": 0, "bytes": 0}}, {"mangle": {"key": {"meta""#,
        r#"{"counter": {"packets": 0, "bytes": 0}}, {"log": null}, {"mangle": {"key": {"meta""#,
    );
    assert_ne!(drifted, MANGLE);
    let state = decode_listing(&drifted, "istio-ambient-").unwrap();
    let rule = &state.tables["istio-ambient-mangle"].chains["istio-output"].rules[0];
    assert!(
        rule.as_ref().is_err_and(|f| f.0.contains("log")),
        "{rule:?}"
    );
    let what = difference(&mangle_plan(), &state).unwrap();
    assert!(
        what.contains("istio-output") && what.contains("log"),
        "{what}"
    );
    // A policy change on a base chain is a difference too.
    let dropped = MANGLE.replacen(r#""policy": "accept""#, r#""policy": "drop""#, 1);
    let what = difference(
        &mangle_plan(),
        &decode_listing(&dropped, "istio-ambient-").unwrap(),
    );
    assert!(what.is_some_and(|w| w.contains("hook")));
}

#[test]
fn missing_and_unexpected_tables_and_chains_are_named() {
    let plan = mangle_plan();
    assert_eq!(
        difference(&plan, &NativeState::default()).as_deref(),
        Some("table inet istio-ambient-mangle missing")
    );
    let mut extra = decode_listing(MANGLE, "istio-ambient-").unwrap();
    extra
        .tables
        .insert("ip istio-ambient-nat".into(), NativeTable::default());
    assert_eq!(
        difference(&plan, &extra).as_deref(),
        Some("unexpected table ip istio-ambient-nat")
    );
    let mut chain = decode_listing(MANGLE, "istio-ambient-").unwrap();
    let table = chain.tables.get_mut("istio-ambient-mangle").unwrap();
    table.chains.insert("mine".into(), NativeChain::default());
    assert!(
        difference(&plan, &chain)
            .unwrap()
            .contains("unexpected chain mine")
    );
    assert!(decode_listing("{}", "x").is_err() && decode_listing("not json", "x").is_err());
}

#[test]
fn canonical_spells_a_plan_as_nft_lists_it() {
    let planned = vec![
        tcp(),
        daddr(Family::V4, "127.0.0.1/32", true),
        daddr(Family::V6, "2001:db8::1/32", false),
        NftExpr::Port {
            proto: Proto::Tcp,
            side: Side::Dst,
            ports: vec!["15008".into(), "53".into()],
            negate: true,
        },
        NftExpr::Mark {
            key: MarkKey::MetaShort,
            value: "0x539".into(),
            negate: false,
        },
        NftExpr::Owner {
            key: OwnerKind::Uid,
            id: "1337".into(),
            negate: false,
            with_meta: true,
        },
        NftExpr::CtState(vec![NftCtState::Related, NftCtState::Established]),
        NftExpr::Counter,
        NftExpr::MetaMarkSet(MarkSource::Value("1338".into())),
    ];
    let body: Vec<String> = canonical(&planned)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        body.join(" "),
        "ip daddr != 127.0.0.1 ip6 daddr 2001:db8::/32 tcp dport != { 53, 15008 } meta mark 1337 \
         skuid 1337 ct state related,established counter meta mark set 1338"
    );
    // The protocol match stays where no port match depends on it.
    assert_eq!(
        canonical(&[tcp(), NftExpr::Accept]),
        vec![tcp(), NftExpr::Accept]
    );
    assert_eq!(
        canonical(&[tcp(), dport(Proto::Udp, "53", false)])[0],
        tcp(),
        "a udp port does not hide a tcp match"
    );
}

#[test]
fn an_interface_wildcard_reads_back_as_planned() {
    use crate::rules::nft_model::expr::{iif, oif};
    let listing = r#"{"nftables": [{"table": {"family": "inet", "name": "istio-proxy-nat", "handle": 1}}, {"chain": {"family": "inet", "table": "istio-proxy-nat", "name": "x", "handle": 1}}, {"rule": {"family": "inet", "table": "istio-proxy-nat", "chain": "x", "handle": 2, "expr": [{"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": "tun*"}}, {"match": {"op": "!=", "left": {"meta": {"key": "oifname"}}, "right": "eth*"}}, {"counter": {"packets": 0, "bytes": 0}}]}}]}"#;
    let state = decode_listing(listing, "istio-").unwrap();
    assert_eq!(
        state.tables["istio-proxy-nat"].chains["x"].rules,
        vec![Ok(vec![iif("tun+"), oif("eth+", true), NftExpr::Counter])]
    );
}
