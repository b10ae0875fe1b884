//! The planned side of a native nftables read-back ([`super::nft_decode`]): a plan's rules spelt
//! as nft lists them ([`canonical`]), what a transaction leaves in our tables ([`expected`]) and
//! the first way a read differs from it ([`difference`]).
//!
//! The model keeps a golden's spelling (`mark` or `meta mark`, `1337` or `0x539`,
//! `127.0.0.1/32`) and the kernel one meaning. nft hides the protocol match a port match depends
//! on (`meta l4proto tcp tcp dport 53` lists as `tcp dport 53`), so the canonical form drops it
//! too. Pure.

use std::net::IpAddr;

use super::model::Proto;
use super::nft_decode::{Hook, ListedRule, NativeChain, NativeState};
use super::nft_model::{AddrValue, MarkKey, MarkSource, MaskSpelling, NftExpr, NftRuleSet};
use super::nftables::{NftTable, placed};

/// An address or prefix as nft lists it: a full-length prefix as the bare address, any other
/// as its network (`10.1.2.3/8` -> `10.0.0.0/8`). Text that is neither is kept as given.
pub fn canonical_addr(text: &str) -> String {
    if let Ok(net) = text.parse::<ipnet::IpNet>() {
        return if net.prefix_len() == net.max_prefix_len() {
            net.addr().to_string()
        } else {
            net.trunc().to_string()
        };
    }
    text.parse::<IpAddr>()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| text.to_string())
}

/// A number as nft lists it (decimal), from decimal or `0x` hex; other text as given (a user
/// or group name: nft stores its id, so it never compares equal: re-applied, never missed).
fn canonical_number(text: &str) -> String {
    let parsed = match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse::<u64>().ok(),
    };
    parsed.map_or_else(|| text.to_string(), |n| n.to_string())
}

/// A planned rule's statements spelt as they are read back (see the module doc).
pub fn canonical(exprs: &[NftExpr]) -> Vec<NftExpr> {
    let ports_of = |p: Proto| {
        exprs
            .iter()
            .any(|e| matches!(e, NftExpr::Port { proto, .. } if *proto == p))
    };
    exprs
        .iter()
        .filter(|e| !matches!(e, NftExpr::L4Proto(p) if ports_of(*p)))
        .map(|e| {
            let mut e = e.clone();
            respell(&mut e);
            e
        })
        .collect()
}

/// One statement in nft's spelling: the same meaning, the one way nft lists it.
fn respell(e: &mut NftExpr) {
    let number = |text: &mut String| *text = canonical_number(text);
    let source = |s: &mut MarkSource| {
        if let MarkSource::Value(v) = s {
            number(v);
        }
    };
    let key = |k: &mut MarkKey| {
        if *k == MarkKey::MetaShort {
            *k = MarkKey::Meta;
        }
    };
    match e {
        NftExpr::Addr {
            value: AddrValue::Prefix(p),
            ..
        } => *p = canonical_addr(p),
        NftExpr::Port { ports, .. } => {
            ports.iter_mut().for_each(number);
            ports.sort_by_key(|p| p.parse::<u64>().unwrap_or(u64::MAX));
            ports.dedup();
        }
        NftExpr::Owner { id, with_meta, .. } => {
            number(id);
            *with_meta = false;
        }
        NftExpr::CtState(states) => {
            states.sort();
            states.dedup();
        }
        NftExpr::Mark { key: k, value, .. } => {
            key(k);
            number(value);
        }
        NftExpr::MarkMasked {
            key: k, spelling, ..
        } => {
            key(k);
            *spelling = MaskSpelling::Ampersand;
        }
        NftExpr::RedirectTo(port) | NftExpr::Tproxy { port, .. } => number(port),
        NftExpr::MetaMarkSet(s) | NftExpr::CtMarkSet(s) => source(s),
        NftExpr::SnatTo(addr) => *addr = canonical_addr(addr),
        _ => {}
    }
}

/// What our tables hold once `set`'s transaction for `tables` is applied (tables without rules
/// are not created), with the named `sets` (table, name, element type) it declares; in the read
/// form, for [`difference`].
pub fn expected(set: &NftRuleSet, tables: &[NftTable], sets: &[(&str, &str, &str)]) -> NativeState {
    let mut state = NativeState::default();
    for &table in tables {
        let Some(chains) = placed(set, table) else {
            continue;
        };
        let entry = state.tables.entry(table.name().to_string()).or_default();
        for chain in chains {
            entry.chains.insert(
                chain.name.to_string(),
                NativeChain {
                    hook: chain.base.map(parse_hook),
                    rules: chain
                        .rules
                        .iter()
                        .map(|r| Ok(canonical(&r.exprs)))
                        .collect(),
                },
            );
        }
    }
    for (table, name, kind) in sets {
        let entry = state.tables.entry(table.to_string()).or_default();
        entry.sets.insert(name.to_string(), kind.to_string());
    }
    state
}

/// `type nat hook output priority -100` (the renderer's spelling; policy accept).
fn parse_hook(spec: &str) -> Hook {
    let words: Vec<&str> = spec.split_whitespace().collect();
    let after = |w: &str| {
        words
            .iter()
            .position(|x| *x == w)
            .and_then(|i| words.get(i + 1))
            .copied()
            .unwrap_or_default()
    };
    Hook {
        kind: after("type").to_string(),
        hook: after("hook").to_string(),
        priority: after("priority").parse().unwrap_or(i64::MAX),
        policy: "accept".to_string(),
    }
}

fn rule_text(rule: Option<&ListedRule>) -> String {
    match rule {
        None => "nothing".to_string(),
        Some(Err(foreign)) => foreign.to_string(),
        Some(Ok(exprs)) => {
            let parts: Vec<String> = exprs.iter().map(ToString::to_string).collect();
            format!("`{}`", parts.join(" "))
        }
    }
}

/// The first way `actual` differs from `expected`, for logs and events: a table, chain or set
/// missing or unexpected, a hook that differs, or the first rule that differs (with its table
/// and chain). None when they hold the same typed rules. Pure.
pub fn difference(expected: &NativeState, actual: &NativeState) -> Option<String> {
    for name in expected.tables.keys() {
        if !actual.tables.contains_key(name) {
            return Some(format!("table inet {name} missing"));
        }
    }
    if let Some(name) = actual
        .tables
        .keys()
        .find(|t| !expected.tables.contains_key(*t))
    {
        return Some(format!("unexpected table {name}"));
    }
    for (name, want) in &expected.tables {
        let have = &actual.tables[name];
        if want.sets != have.sets {
            return Some(format!(
                "table inet {name}: sets {:?}, expected {:?}",
                have.sets, want.sets
            ));
        }
        for chain in want.chains.keys() {
            if !have.chains.contains_key(chain) {
                return Some(format!("table inet {name}: chain {chain} missing"));
            }
        }
        if let Some(chain) = have.chains.keys().find(|c| !want.chains.contains_key(*c)) {
            return Some(format!("table inet {name}: unexpected chain {chain}"));
        }
        for (chain, want) in &want.chains {
            let have = &have.chains[chain];
            if want.hook != have.hook {
                return Some(format!(
                    "table inet {name} chain {chain}: hook {:?}, expected {:?}",
                    have.hook, want.hook
                ));
            }
            let n = want.rules.len().max(have.rules.len());
            if let Some(i) = (0..n).find(|&i| want.rules.get(i) != have.rules.get(i)) {
                return Some(format!(
                    "table inet {name} chain {chain}: rule {i}: found {}, expected {}",
                    rule_text(have.rules.get(i)),
                    rule_text(want.rules.get(i))
                ));
            }
        }
    }
    None
}
