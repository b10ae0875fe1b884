//! Our native nftables tables as the kernel dumps them over nfnetlink (`NFT_MSG_NEWTABLE`,
//! `NEWCHAIN`, `NEWSET`, `NEWRULE` records, and the elements of a rule's anonymous sets) read
//! into the same typed form as nft's JSON listing ([`super::nft_decode::NativeState`]), so no
//! process is needed. A rule holding anything our statements do not compile to is
//! [`ForeignRule`]. Dependencies nft adds on its own (`meta nfproto` before an address match,
//! `meta l4proto` before a port match) are dropped as nft's listing drops them
//! ([`super::nft_canon::canonical`]). Pure: bytes in, rules out.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::model::{Family, ForeignRule, Proto};
use super::nft_canon::canonical;
use super::nft_decode::{Hook, ListedRule, NativeState};
use super::nft_model::{
    AddrValue, MarkKey, MarkSource, MaskSpelling, MaskedMark, NftCtState, NftExpr, OwnerKind, Side,
};

use super::nla::read::{attrs, be32, get, text};

/// `NFTA_DATA_VALUE` inside a nested `NFTA_*_DATA`.
fn data_value(v: &[u8]) -> Option<&[u8]> {
    get(&attrs(v)?, 1)
}

/// The anonymous sets a rule looks up: `(table, set)` -> each element's key bytes.
pub type AnonSets = BTreeMap<(String, String), Vec<Vec<u8>>>;

/// The key bytes of every element in `NFTA_SET_ELEM_LIST_*` records.
pub fn element_keys(records: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut keys = Vec::new();
    for record in records {
        let list = attrs(record).unwrap_or_default();
        let elems = get(&list, 3).and_then(attrs).unwrap_or_default();
        for (_, elem) in elems {
            let elem = attrs(elem).unwrap_or_default();
            if let Some(key) = get(&elem, 1).and_then(data_value) {
                keys.push(key.to_vec());
            }
        }
    }
    keys
}

/// The tables named `<prefix>*` among `NFTA_TABLE_*` records.
pub fn table_names(table_records: &[Vec<u8>], prefix: &str) -> Vec<String> {
    table_records
        .iter()
        .filter_map(|r| get(&attrs(r)?, 1).map(text))
        .filter(|t| t.starts_with(prefix))
        .collect()
}

/// The anonymous sets (`NFT_SET_ANONYMOUS`) of the tables named `<prefix>*`: `(table, name)`.
pub fn anonymous_sets(set_records: &[Vec<u8>], prefix: &str) -> Vec<(String, String)> {
    set_records
        .iter()
        .filter_map(|r| {
            let list = attrs(r)?;
            let table = text(get(&list, 1)?);
            let flags = get(&list, 3).and_then(be32).unwrap_or(0);
            let name = text(get(&list, 2)?);
            (table.starts_with(prefix) && flags & 1 != 0).then_some((table, name))
        })
        .collect()
}

/// Our tables (`inet`, named `<prefix>*`) from the dumped records: the tables, chains and named
/// sets of [`crate`]'s `netlink::nft_dump::dump_layout` and each table's rules.
pub fn decode_kernel(
    tables: &[Vec<u8>],
    chains: &[Vec<u8>],
    sets: &[Vec<u8>],
    rules: &[Vec<u8>],
    anon: &AnonSets,
    prefix: &str,
) -> NativeState {
    let mut state = NativeState::default();
    let ours = |list: &[(u16, &[u8])]| get(list, 1).map(text).filter(|t| t.starts_with(prefix));
    for r in tables {
        if let Some(t) = attrs(r).as_deref().and_then(ours) {
            state.tables.entry(t).or_default();
        }
    }
    for r in chains {
        let Some(list) = attrs(r) else { continue };
        let (Some(t), Some(name)) = (ours(&list), get(&list, 3).map(text)) else {
            continue;
        };
        let hook = get(&list, 4).and_then(attrs).map(|h| Hook {
            kind: get(&list, 7).map(text).unwrap_or_default(),
            hook: match get(&h, 1).and_then(be32) {
                Some(0) => "prerouting",
                Some(1) => "input",
                Some(2) => "forward",
                Some(3) => "output",
                Some(4) => "postrouting",
                _ => "?",
            }
            .to_string(),
            priority: get(&h, 2)
                .and_then(be32)
                .map_or(i64::MIN, |p| p as i32 as i64),
            policy: match get(&list, 5).and_then(be32) {
                Some(0) => "drop".to_string(),
                Some(1) | None => "accept".to_string(),
                Some(other) => other.to_string(),
            },
        });
        let table = state.tables.entry(t).or_default();
        table.chains.entry(name).or_default().hook = hook;
    }
    for r in sets {
        let Some(list) = attrs(r) else { continue };
        let (Some(t), Some(name)) = (ours(&list), get(&list, 2).map(text)) else {
            continue;
        };
        if get(&list, 3).and_then(be32).unwrap_or(0) & 1 != 0 {
            continue; // anonymous: part of a rule, not a declaration
        }
        let kind = match get(&list, 4).and_then(be32) {
            Some(7) => "ipv4_addr".to_string(),
            Some(8) => "ipv6_addr".to_string(),
            other => format!("type {other:?}"),
        };
        state.tables.entry(t).or_default().sets.insert(name, kind);
    }
    for r in rules {
        let Some(list) = attrs(r) else { continue };
        let (Some(t), Some(chain)) = (ours(&list), get(&list, 2).map(text)) else {
            continue;
        };
        let rule = if get(&list, 7).is_some() {
            Err(ForeignRule("user data (a comment?)".into()))
        } else {
            decode_rule(get(&list, 4).unwrap_or_default(), &t, anon)
        };
        let table = state.tables.entry(t).or_default();
        table.chains.entry(chain).or_default().rules.push(rule);
    }
    state
}

/// One expression: its name and attributes.
struct Expr<'a> {
    name: String,
    data: Vec<(u16, &'a [u8])>,
}

impl Expr<'_> {
    fn u(&self, k: u16) -> Option<u32> {
        get(&self.data, k).and_then(be32)
    }
}

fn decode_rule(exprs: &[u8], table: &str, anon: &AnonSets) -> ListedRule {
    let bad = |what: &str| ForeignRule(what.to_string());
    let list = attrs(exprs).ok_or_else(|| bad("malformed expressions"))?;
    let mut parsed = Vec::new();
    for (_, elem) in list {
        let e = attrs(elem).ok_or_else(|| bad("malformed expression"))?;
        let name = get(&e, 1).map(text).unwrap_or_default();
        let data = attrs(get(&e, 2).unwrap_or_default()).ok_or_else(|| bad("malformed data"))?;
        parsed.push(Expr { name, data });
    }
    let mut out = Vec::new();
    let mut i = 0;
    let mut l4: Option<Proto> = None;
    let mut family: Option<Family> = None;
    while i < parsed.len() {
        let (expr, used) = statement(&parsed[i..], &mut l4, &mut family, table, anon)
            .ok_or_else(|| ForeignRule(format!("{} expression", parsed[i].name)))?;
        out.extend(expr);
        i += used;
    }
    Ok(canonical(&out))
}

/// What a register load reads.
enum Load {
    Meta(u32),
    Ct(u32),
    Payload { base: u32, offset: u32, len: u32 },
}

/// One statement from the start of `e`: what it says (none for a dependency) and how many
/// expressions it used.
fn statement(
    e: &[Expr],
    l4: &mut Option<Proto>,
    family: &mut Option<Family>,
    table: &str,
    anon: &AnonSets,
) -> Option<(Option<NftExpr>, usize)> {
    let first = e.first()?;
    let load = match first.name.as_str() {
        "counter" => return Some((Some(NftExpr::Counter), 1)),
        "immediate" if first.u(1) == Some(0) => {
            let v = attrs(get(&first.data, 2)?)?;
            let v = attrs(get(&v, 2)?)?;
            let verdict = match be32(get(&v, 1)?)? as i32 {
                0 => NftExpr::Drop,
                1 => NftExpr::Accept,
                -3 => NftExpr::Jump(text(get(&v, 2)?)),
                -5 => NftExpr::Return,
                _ => return None,
            };
            return Some((Some(verdict), 1));
        }
        "immediate" => return immediate_statement(e),
        "meta" if first.u(3).is_none() => Load::Meta(first.u(2)?),
        "ct" if first.u(4).is_none() && first.u(3).is_none() => Load::Ct(first.u(2)?),
        "payload" => Load::Payload {
            base: first.u(2)?,
            offset: first.u(3)?,
            len: first.u(4)?,
        },
        _ => return None,
    };
    let mut used = 1;
    let mut mask: Option<(&[u8], &[u8])> = None;
    if let Some(b) = e.get(1).filter(|b| b.name == "bitwise") {
        if b.u(6).unwrap_or(0) != 0 {
            return None;
        }
        mask = Some((data_value(get(&b.data, 4)?)?, data_value(get(&b.data, 5)?)?));
        used += 1;
    }
    let next = e.get(used)?;
    match (next.name.as_str(), &load) {
        ("cmp", _) => {
            let negate = match next.u(2)? {
                0 => false,
                1 => true,
                _ => return None,
            };
            let value = data_value(get(&next.data, 3)?)?;
            let m = compare(&load, mask, negate, value, l4, family)?;
            Some((m, used + 1))
        }
        ("lookup", Load::Payload { .. }) if mask.is_none() => {
            let set = text(get(&next.data, 1)?);
            let negate = next.u(5).unwrap_or(0) & 1 != 0;
            let m = lookup(&load, &set, negate, *l4, *family, table, anon)?;
            Some((Some(m), used + 1))
        }
        ("meta", Load::Ct(3)) if mask.is_none() && next.u(2) == Some(3) && next.u(3).is_some() => {
            Some((Some(NftExpr::MetaMarkSet(MarkSource::Other)), used + 1))
        }
        ("ct", Load::Meta(3)) if mask.is_none() && next.u(2) == Some(3) && next.u(4).is_some() => {
            Some((Some(NftExpr::CtMarkSet(MarkSource::Other)), used + 1))
        }
        ("ct", Load::Ct(3)) if next.u(2) == Some(3) && next.u(4).is_some() => {
            let (keep, set) = mask?;
            let (keep, set) = (ne32(keep)?, ne32(set)?);
            Some((
                Some(NftExpr::CtMarkSet(MarkSource::Masked(MaskedMark {
                    value: set,
                    mask: !keep,
                }))),
                used + 1,
            ))
        }
        _ => None,
    }
}

fn ne32(v: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(v.try_into().ok()?))
}

fn be16(v: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(v.try_into().ok()?))
}

/// A loaded value compared: the match it is, or None (no statement) for a dependency.
fn compare(
    load: &Load,
    mask: Option<(&[u8], &[u8])>,
    negate: bool,
    value: &[u8],
    l4: &mut Option<Proto>,
    family: &mut Option<Family>,
) -> Option<Option<NftExpr>> {
    let unmasked = mask.is_none();
    let found = match *load {
        Load::Meta(15) if unmasked && !negate => {
            *family = match value {
                [2] => Some(Family::V4),
                [10] => Some(Family::V6),
                _ => return None,
            };
            return Some(None);
        }
        Load::Meta(16) if unmasked && !negate => {
            let p = match value {
                [6] => Proto::Tcp,
                [17] => Proto::Udp,
                _ => return None,
            };
            *l4 = Some(p);
            NftExpr::L4Proto(p)
        }
        Load::Meta(6) if unmasked => NftExpr::IifName {
            name: ifname(value)?,
            negate,
        },
        Load::Meta(7) if unmasked => NftExpr::OifName {
            name: ifname(value)?,
            negate,
        },
        Load::Meta(k @ (10 | 11)) if unmasked => NftExpr::Owner {
            key: if k == 10 {
                OwnerKind::Uid
            } else {
                OwnerKind::Gid
            },
            id: ne32(value)?.to_string(),
            negate,
            with_meta: false,
        },
        Load::Meta(3) => mark(MarkKey::Meta, mask, negate, value)?,
        Load::Ct(3) => mark(MarkKey::Ct, mask, negate, value)?,
        Load::Ct(0) if negate && ne32(value)? == 0 => ct_state(mask)?,
        Load::Payload {
            base: 1,
            offset,
            len,
        } => addr_compare((*family)?, offset, len, mask, negate, value)?,
        Load::Payload {
            base: 2,
            offset,
            len: 2,
        } if unmasked => NftExpr::Port {
            proto: (*l4)?,
            side: port_side(offset)?,
            ports: vec![be16(value)?.to_string()],
            negate,
        },
        _ => return None,
    };
    Some(Some(found))
}

/// A mark compare, plain or under a mask.
fn mark(key: MarkKey, mask: Option<(&[u8], &[u8])>, negate: bool, value: &[u8]) -> Option<NftExpr> {
    let v = ne32(value)?;
    Some(match mask {
        None => NftExpr::Mark {
            key,
            value: v.to_string(),
            negate,
        },
        Some((m, x)) if ne32(x)? == 0 => NftExpr::MarkMasked {
            key,
            mark: MaskedMark {
                value: v,
                mask: ne32(m)?,
            },
            negate,
            spelling: MaskSpelling::Ampersand,
        },
        _ => return None,
    })
}

/// A whole name is compared with its padding (IFNAMSIZ bytes ending in NUL); nft's `eth*`
/// compares only the prefix's bytes, without a NUL.
fn ifname(value: &[u8]) -> Option<String> {
    match value.len() {
        16 if value.ends_with(&[0]) => Some(text(value)),
        1..16 if !value.contains(&0) => Some(format!("{}*", text(value))),
        _ => None,
    }
}

/// `ct state` compares the masked state bits against zero, negated.
fn ct_state(mask: Option<(&[u8], &[u8])>) -> Option<NftExpr> {
    let (m, x) = mask?;
    if ne32(x)? != 0 {
        return None;
    }
    let bits = ne32(m)?;
    let mut states = Vec::new();
    for (bit, state) in [
        (1, NftCtState::Invalid),
        (2, NftCtState::Established),
        (4, NftCtState::Related),
    ] {
        if bits & bit != 0 {
            states.push(state);
        }
    }
    if bits & !7 != 0 {
        return None;
    }
    states.sort();
    Some(NftExpr::CtState(states))
}

/// A network-header address compare.
fn addr_compare(
    family: Family,
    offset: u32,
    len: u32,
    mask: Option<(&[u8], &[u8])>,
    negate: bool,
    value: &[u8],
) -> Option<NftExpr> {
    // A prefix loads only the bytes it needs (`10.0.0.0/8`: one byte), masked when it
    // does not end on a byte.
    let (family, side) = addr_field(family, offset, len)?;
    let prefix = match mask {
        None => value.len() * 8,
        Some((m, x)) if x.iter().all(|b| *b == 0) => prefix_len(m)?,
        _ => return None,
    };
    let full = if family == Family::V4 { 4 } else { 16 };
    if value.len() > full || prefix > full * 8 {
        return None;
    }
    let mut bytes = value.to_vec();
    bytes.resize(full, 0);
    Some(NftExpr::Addr {
        family,
        side,
        value: AddrValue::Prefix(super::nft_canon::canonical_addr(&format!(
            "{}/{prefix}",
            addr_of(&bytes)?
        ))),
        negate,
    })
}

/// The address field a network-header load reads (its first `len` bytes).
fn addr_field(family: Family, offset: u32, len: u32) -> Option<(Family, Side)> {
    let side = match (family, offset) {
        (Family::V4, 12) | (Family::V6, 8) => Side::Src,
        (Family::V4, 16) | (Family::V6, 24) => Side::Dst,
        _ => return None,
    };
    let full = if family == Family::V4 { 4 } else { 16 };
    (len > 0 && len <= full).then_some((family, side))
}

fn port_side(offset: u32) -> Option<Side> {
    match offset {
        0 => Some(Side::Src),
        2 => Some(Side::Dst),
        _ => None,
    }
}

fn addr_of(v: &[u8]) -> Option<IpAddr> {
    match v.len() {
        4 => Some(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(v).ok()?))),
        16 => Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(v).ok()?))),
        _ => None,
    }
}

/// The length of a contiguous network mask; None for any other mask.
fn prefix_len(mask: &[u8]) -> Option<usize> {
    let ones: usize = mask.iter().map(|b| b.count_ones() as usize).sum();
    let contiguous = mask
        .iter()
        .flat_map(|b| (0..8).rev().map(move |i| b >> i & 1))
        .skip(ones)
        .all(|bit| bit == 0);
    contiguous.then_some(ones)
}

fn lookup(
    load: &Load,
    set: &str,
    negate: bool,
    l4: Option<Proto>,
    family: Option<Family>,
    table: &str,
    anon: &AnonSets,
) -> Option<NftExpr> {
    let Load::Payload { base, offset, len } = *load else {
        return None;
    };
    match base {
        1 => {
            let (family, side) = addr_field(family?, offset, len)?;
            (!anon.contains_key(&(table.to_string(), set.to_string()))).then(|| NftExpr::Addr {
                family,
                side,
                value: AddrValue::Set(set.to_string()),
                negate,
            })
        }
        2 if len == 2 => {
            let keys = anon.get(&(table.to_string(), set.to_string()))?;
            let mut ports: Vec<u16> = keys.iter().map(|k| be16(k)).collect::<Option<_>>()?;
            ports.sort_unstable();
            Some(NftExpr::Port {
                proto: l4?,
                side: port_side(offset)?,
                ports: ports.iter().map(u16::to_string).collect(),
                negate,
            })
        }
        _ => None,
    }
}

/// `immediate reg, value` and the statement that takes it: redirect, tproxy, snat, a mark or
/// zone set.
fn immediate_statement(e: &[Expr]) -> Option<(Option<NftExpr>, usize)> {
    let value = data_value(get(&e[0].data, 2)?)?;
    let next = e.get(1)?;
    let port = || be16(value).map(|p| p.to_string());
    let stmt = match next.name.as_str() {
        "redir" if next.data.iter().all(|(k, _)| matches!(k, 1..=3)) => {
            NftExpr::RedirectTo(port()?)
        }
        "tproxy" if next.u(2).is_none() => NftExpr::Tproxy {
            family: match next.u(1)? {
                2 => Family::V4,
                10 => Family::V6,
                _ => return None,
            },
            port: port()?,
        },
        "nat" if next.u(1) == Some(0) && next.u(5).is_none() => {
            // `snat to A`: addr_min and addr_max the same register, NF_NAT_RANGE_MAP_IPS.
            if next.u(7).unwrap_or(1) != 1 || next.u(4).is_some_and(|r| Some(r) != next.u(3)) {
                return None;
            }
            NftExpr::SnatTo(addr_of(value)?.to_string())
        }
        "meta" if next.u(2) == Some(3) && next.u(3).is_some() => {
            NftExpr::MetaMarkSet(MarkSource::Value(ne32(value)?.to_string()))
        }
        "ct" if next.u(2) == Some(17) && next.u(4).is_some() => {
            NftExpr::CtZoneSet(u16::from_ne_bytes(value.try_into().ok()?))
        }
        _ => return None,
    };
    Some((Some(stmt), 2))
}

#[cfg(test)]
#[path = "nft_kernel_decode_tests.rs"]
mod tests;
