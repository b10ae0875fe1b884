//! A planned rule spelt the way [`super::decode_rule`] reads it back from the kernel: the fixed
//! header first (interfaces, protocol, addresses, as iptables stores them), values in the one
//! spelling the kernel's bytes give (decimal ports and ids, hex marks, `addr/prefix` networks),
//! spellings that mean the same collapsed (`-m tcp --dport` is `--dport`, `--to-port` is
//! `--to-ports`). A value that does not parse is kept as written, so it never equals a decoded
//! rule: unsure is a difference.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::super::model::{Match, Position, Rule, Table, Target, place_in_order};
use super::{Listed, STATES, mark_text};

/// `rule` as the decoder would read it back once applied (appended; see [`as_listed`]).
pub fn canonical(rule: &Rule) -> Rule {
    let header_rank = |m: &Match| match m {
        Match::InIface { .. } => 0,
        Match::OutIface { .. } => 1,
        Match::Proto(_) => 2,
        Match::Src { .. } => 3,
        Match::Dst { .. } => 4,
        _ => 5,
    };
    let mut matches: Vec<Match> = rule.matches.iter().filter_map(canonical_match).collect();
    // Stable: the non-header matches keep their order.
    matches.sort_by_key(header_rank);
    Rule {
        table: rule.table,
        chain: rule.chain.clone(),
        position: Position::Append,
        matches,
        target: canonical_target(&rule.target),
    }
}

/// Each chain's rules in the order the kernel lists them once `rules` are applied in order to
/// chains that held none (an insert at N lands at N), spelt as [`canonical`].
pub fn as_listed(rules: &[Rule]) -> Listed {
    type Placed = Vec<(Option<usize>, Rule)>;
    let mut by_chain: BTreeMap<(Table, &str), Placed> = BTreeMap::new();
    for rule in rules {
        let at = match rule.position {
            Position::Append => None,
            Position::Insert(n) => Some(n.max(1) as usize - 1),
        };
        by_chain
            .entry((rule.table, rule.chain.as_str()))
            .or_default()
            .push((at, canonical(rule)));
    }
    by_chain
        .into_iter()
        .map(|((table, chain), placed)| ((table, chain.to_string()), place_in_order(placed)))
        .collect()
}

fn number(text: &str) -> Option<u32> {
    match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// `VALUE[/MASK]`, the mask all ones when absent.
fn mark(text: &str) -> Option<(u32, u32)> {
    match text.split_once('/') {
        Some((v, m)) => Some((number(v)?, number(m)?)),
        None => Some((number(text)?, u32::MAX)),
    }
}

fn port(text: &str) -> String {
    text.parse::<u16>()
        .map_or_else(|_| text.to_string(), |p| p.to_string())
}

fn id(text: &str) -> String {
    text.parse::<u32>()
        .map_or_else(|_| text.to_string(), |v| v.to_string())
}

/// `addr[/prefix]` as the masked network with its prefix; None for `/0` (matches everything, so
/// iptables stores nothing).
fn network(text: &str) -> Option<String> {
    let (addr, prefix) = text.split_once('/').unwrap_or((text, ""));
    let Ok(addr) = addr.parse::<IpAddr>() else {
        return Some(text.to_string());
    };
    let bits = if addr.is_ipv4() { 32 } else { 128 };
    let prefix = match prefix {
        "" => bits,
        p => match p.parse::<u32>() {
            Ok(p) if p <= bits => p,
            _ => return Some(text.to_string()),
        },
    };
    if prefix == 0 {
        return None;
    }
    let masked = match addr {
        IpAddr::V4(a) => IpAddr::V4((u32::from(a) & (u32::MAX << (32 - prefix))).into()),
        IpAddr::V6(a) => IpAddr::V6((u128::from(a) & (u128::MAX << (128 - prefix))).into()),
    };
    Some(format!("{masked}/{prefix}"))
}

fn canonical_match(m: &Match) -> Option<Match> {
    let mark_or_text =
        |text: &str| mark(text).map_or_else(|| text.to_string(), |(v, m)| mark_text(v, m));
    Some(match m {
        Match::Src { addr, negate } => match network(addr) {
            Some(addr) => Match::Src {
                addr,
                negate: *negate,
            },
            // `! -s 0.0.0.0/0` matches nothing; iptables refuses it, keep it unequal.
            None if *negate => m.clone(),
            None => return None,
        },
        Match::Dst { addr, negate } => match network(addr) {
            Some(addr) => Match::Dst {
                addr,
                negate: *negate,
            },
            None if *negate => m.clone(),
            None => return None,
        },
        Match::DstPort {
            port: p, negate, ..
        } => Match::DstPort {
            port: port(p),
            negate: *negate,
            module: None,
        },
        Match::SrcPort {
            port: p, negate, ..
        } => Match::SrcPort {
            port: port(p),
            negate: *negate,
            module: None,
        },
        Match::DstPorts { ports, negate } => Match::DstPorts {
            ports: ports.iter().map(|p| port(p)).collect(),
            negate: *negate,
        },
        Match::UidOwner { id: v, negate } => Match::UidOwner {
            id: id(v),
            negate: *negate,
        },
        Match::GidOwner { id: v, negate } => Match::GidOwner {
            id: id(v),
            negate: *negate,
        },
        Match::Mark { value, negate } => Match::Mark {
            value: mark_or_text(value),
            negate: *negate,
        },
        Match::ConnMark { value } => Match::ConnMark {
            value: mark_or_text(value),
        },
        Match::CtState(states) => Match::CtState(
            STATES
                .iter()
                .map(|(s, _)| *s)
                .filter(|s| states.contains(s))
                .collect(),
        ),
        other => other.clone(),
    })
}

fn canonical_target(t: &Target) -> Target {
    let both =
        |text: &str| mark(text).map_or_else(|| text.to_string(), |(v, m)| format!("{v:#x}/{m:#x}"));
    match t {
        Target::Redirect { port: p, .. } => Target::Redirect {
            port: port(p),
            plural: true,
        },
        Target::Tproxy { mark: m, port: p } => Target::Tproxy {
            mark: both(m),
            port: port(p),
        },
        // `--set-mark V/M` clears `V|M` and sets V.
        Target::SetMark(text) => {
            Target::SetMark(mark(text).map_or_else(|| text.clone(), |(v, m)| mark_text(v, v | m)))
        }
        Target::ConnmarkSetXmark(text) => Target::ConnmarkSetXmark(both(text)),
        Target::ConnmarkRestore { .. } => Target::ConnmarkRestore { masks: false },
        Target::Snat(addr) => Target::Snat(
            addr.parse::<IpAddr>()
                .map_or_else(|_| addr.clone(), |a| a.to_string()),
        ),
        other => other.clone(),
    }
}
