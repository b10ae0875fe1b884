//! The inverse of [`super::iptables_nft`]: an nf_tables rule as the kernel dumps it
//! (`NFT_MSG_NEWRULE` attributes) read back into the typed rule model, for the rules
//! iptables-nft writes — what our encoder sends and what iptables-nft-restore sends for the rules
//! the encoder leaves to it. A rule that holds anything the model cannot say exactly (another
//! expression, register, operator, range, flag, user data) is a [`ForeignRule`], never a near match:
//! drift checks count it as a difference.
//!
//! The model keeps values as the operator wrote them (`1337` or `0x539`, `10.0.0.1` or
//! `10.0.0.1/32`); the kernel keeps one meaning. [`canonical`] spells a planned rule the way the
//! decoder reads it back, so "the kernel holds our rules" is `decode(kernel) == canonical(plan)`.
//! Pure: bytes in, rules out.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub use super::iptables_state::{DecodedRule, RuleAt};
use super::model::{
    CtState, Family, ForeignRule, Match, OwnerKind, Position, Proto, Rule, SetDir, Table, Target,
};
use super::nf_kernel::{
    NF_ACCEPT, NF_DROP, NFT_GOTO, NFT_JUMP, NFT_META_IIFNAME, NFT_META_L4PROTO, NFT_META_MARK,
    NFT_META_OIFNAME, NFT_PAYLOAD_NETWORK_HEADER, NFT_PAYLOAD_TRANSPORT_HEADER, NFT_REG_1,
    NFT_RETURN, NFTA_EXPR_DATA, NFTA_EXPR_NAME, NFTA_LIST_ELEM, NFTA_RULE_CHAIN,
    NFTA_RULE_EXPRESSIONS, NFTA_RULE_HANDLE, NFTA_RULE_TABLE, NFTA_RULE_USERDATA,
};
use super::nla::read::{attrs, be32, get, text};
use super::xtables::read::{self, Connmark, Owner};

/// The set names behind `-m set` matches: the kernel keeps the set's index, not its name.
pub trait SetNames {
    fn name_of(&self, index: u16) -> Option<String>;
}

/// No sets known: every set match is foreign.
pub struct NoSets;

impl SetNames for NoSets {
    fn name_of(&self, _: u16) -> Option<String> {
        None
    }
}

/// One expression of a rule, as far as iptables-nft uses them.
#[derive(Debug)]
enum Expr<'a> {
    Meta {
        key: u32,
    },
    Payload {
        base: u32,
        offset: u32,
        len: u32,
    },
    Cmp {
        negate: bool,
        value: &'a [u8],
    },
    /// `reg = (reg & mask) ^ 0`.
    Mask {
        mask: &'a [u8],
    },
    Counter,
    Verdict {
        code: i32,
        chain: Option<String>,
    },
    Xt {
        target: bool,
        name: String,
        rev: u32,
        info: &'a [u8],
    },
}

/// One `NFTA_LIST_ELEM`; Err names what is not an iptables-nft expression on register 1.
fn expr(elem: &[u8]) -> Result<Expr<'_>, ForeignRule> {
    let bad = |what: &str| ForeignRule(what.to_string());
    let list = attrs(elem).ok_or_else(|| bad("malformed expression"))?;
    let name = get(&list, NFTA_EXPR_NAME).map(text).unwrap_or_default();
    let data = attrs(get(&list, NFTA_EXPR_DATA).unwrap_or_default())
        .ok_or_else(|| bad("malformed expression data"))?;
    let u = |k: u16| get(&data, k).and_then(be32);
    let nested_value = |k: u16| {
        get(&data, k)
            .and_then(attrs)
            .and_then(|inner| get(&inner, 1))
    };
    let only = |keys: &[u16]| data.iter().all(|(k, _)| keys.contains(k));
    let parsed = match name.as_str() {
        "meta" if u(1) == Some(NFT_REG_1) && only(&[1, 2]) => u(2).map(|key| Expr::Meta { key }),
        "payload" if u(1) == Some(NFT_REG_1) && only(&[1, 2, 3, 4]) => match (u(2), u(3), u(4)) {
            (Some(base), Some(offset), Some(len)) => Some(Expr::Payload { base, offset, len }),
            _ => None,
        },
        "cmp" if u(1) == Some(NFT_REG_1) && only(&[1, 2, 3]) => match (u(2), nested_value(3)) {
            (Some(op @ (0 | 1)), Some(value)) => Some(Expr::Cmp {
                negate: op == 1,
                value,
            }),
            _ => None,
        },
        "bitwise"
            if u(1) == Some(NFT_REG_1) && u(2) == Some(NFT_REG_1) && only(&[1, 2, 3, 4, 5, 6]) =>
        {
            let boolean = u(6).unwrap_or(0) == 0;
            match (nested_value(4), nested_value(5)) {
                (Some(mask), Some(xor)) if boolean && xor.iter().all(|b| *b == 0) => {
                    (u(3) == Some(mask.len() as u32)).then_some(Expr::Mask { mask })
                }
                _ => None,
            }
        }
        "counter" => Some(Expr::Counter),
        "immediate" if u(1) == Some(0) => {
            let verdict = get(&data, 2)
                .and_then(attrs)
                .and_then(|d| get(&d, 2).and_then(attrs));
            verdict.and_then(|v| {
                Some(Expr::Verdict {
                    code: be32(get(&v, 1)?)? as i32,
                    chain: get(&v, 2).map(text),
                })
            })
        }
        "match" | "target" if only(&[1, 2, 3]) => match (get(&data, 1), u(2), get(&data, 3)) {
            (Some(xt), Some(rev), Some(info)) => Some(Expr::Xt {
                target: name == "target",
                name: text(xt),
                rev,
                info,
            }),
            _ => None,
        },
        _ => None,
    };
    parsed.ok_or_else(|| ForeignRule(format!("{name} expression")))
}

/// Reads one dumped rule of `family` (its attributes after the nfgenmsg header).
pub fn decode_rule(family: Family, record: &[u8], sets: &dyn SetNames) -> DecodedRule {
    let list = attrs(record).unwrap_or_default();
    let table = get(&list, NFTA_RULE_TABLE).map(text).unwrap_or_default();
    let chain = get(&list, NFTA_RULE_CHAIN).map(text).unwrap_or_default();
    let handle = get(&list, NFTA_RULE_HANDLE)
        .and_then(|v| Some(u64::from_be_bytes(v.try_into().ok()?)))
        .unwrap_or(0);
    let exprs: Vec<Result<Expr, ForeignRule>> = get(&list, NFTA_RULE_EXPRESSIONS)
        .and_then(attrs)
        .unwrap_or_default()
        .into_iter()
        .map(|(kind, elem)| match kind {
            NFTA_LIST_ELEM => expr(elem),
            _ => Err(ForeignRule("expression list".into())),
        })
        .collect();
    let jumps_to = exprs.iter().rev().find_map(|e| match e {
        Ok(Expr::Verdict {
            code: NFT_JUMP | NFT_GOTO,
            chain,
        }) => chain.clone(),
        _ => None,
    });
    let rule = if get(&list, NFTA_RULE_USERDATA).is_some() {
        Err(ForeignRule("user data (a comment?)".into()))
    } else {
        decode_exprs(family, &table, &chain, exprs, sets)
    };
    DecodedRule {
        table,
        chain,
        at: RuleAt::Handle(handle),
        jumps_to,
        rule,
    }
}

/// A load's compare: the mask applied first (if any), negated, the value.
type Compare<'a> = (Option<&'a [u8]>, bool, &'a [u8]);

fn decode_exprs(
    family: Family,
    table: &str,
    chain: &str,
    exprs: Vec<Result<Expr, ForeignRule>>,
    sets: &dyn SetNames,
) -> Result<Rule, ForeignRule> {
    let table = match table {
        "filter" => Table::Filter,
        "mangle" => Table::Mangle,
        "nat" => Table::Nat,
        "raw" => Table::Raw,
        other => return Err(ForeignRule(format!("table {other}"))),
    };
    let exprs = exprs
        .into_iter()
        .collect::<Result<Vec<Expr>, ForeignRule>>()?;
    let mut matches = Vec::new();
    let mut proto = None;
    let mut target = None;
    let mut i = 0;
    while i < exprs.len() {
        if target.is_some() {
            return Err(ForeignRule("expressions after the verdict".into()));
        }
        match &exprs[i] {
            Expr::Meta { key } => {
                let key = *key;
                let decoded = meta_match(key, compare_at(&exprs, &mut i)?, &mut proto);
                matches.push(decoded.ok_or_else(|| ForeignRule(format!("meta key {key} match")))?);
            }
            Expr::Payload { base, offset, len } => {
                let (base, offset, len) = (*base, *offset, *len);
                let compare = compare_at(&exprs, &mut i)?;
                let decoded = payload_match(family, (base, offset, len), compare, proto);
                matches
                    .push(decoded.ok_or_else(|| ForeignRule(format!("payload @{base}+{offset}")))?);
            }
            Expr::Counter => {}
            Expr::Verdict { code, chain } => {
                target = Some(verdict(*code, chain.as_ref())?);
            }
            Expr::Xt {
                target: false,
                name,
                rev,
                info,
            } => matches.push(
                xt_match(name, *rev, info, proto, sets)
                    .ok_or_else(|| ForeignRule(format!("xt match {name} rev {rev}")))?,
            ),
            Expr::Xt {
                target: true,
                name,
                rev,
                info,
            } => {
                target = Some(
                    xt_target(family, name, *rev, info)
                        .ok_or_else(|| ForeignRule(format!("xt target {name} rev {rev}")))?,
                )
            }
            Expr::Cmp { .. } | Expr::Mask { .. } => {
                return Err(ForeignRule("a compare without its load".into()));
            }
        }
        i += 1;
    }
    Ok(Rule {
        table,
        chain: chain.to_string(),
        position: Position::Append,
        matches,
        target: target.ok_or_else(|| ForeignRule("no verdict".into()))?,
    })
}

/// A meta load's match (`iifname`, `oifname`, `l4proto`, `mark`); the protocol match also sets
/// `proto` for the port matches after it.
fn meta_match(
    key: u32,
    (mask, negate, value): Compare,
    proto: &mut Option<Proto>,
) -> Option<Match> {
    let unmasked = |m: Match| mask.is_none().then_some(m);
    match key {
        NFT_META_IIFNAME => {
            iface_name(value).and_then(|name| unmasked(Match::InIface { name, negate }))
        }
        NFT_META_OIFNAME => {
            iface_name(value).and_then(|name| unmasked(Match::OutIface { name, negate }))
        }
        NFT_META_L4PROTO if !negate && mask.is_none() && proto.is_none() => {
            let p = match value {
                [6] => Some(Proto::Tcp),
                [17] => Some(Proto::Udp),
                _ => None,
            };
            *proto = p;
            p.map(Match::Proto)
        }
        NFT_META_MARK => {
            let ne = |b: &[u8]| Some(u32::from_ne_bytes(b.try_into().ok()?));
            let mask = match mask {
                Some(m) => ne(m),
                None => Some(u32::MAX),
            };
            ne(value).zip(mask).map(|(v, m)| Match::Mark {
                value: mark_text(v, m),
                negate,
            })
        }
        _ => None,
    }
}

/// A payload load's match: a network-header address, or a transport port once the protocol is known.
fn payload_match(
    family: Family,
    (base, offset, len): (u32, u32, u32),
    (mask, negate, value): Compare,
    proto: Option<Proto>,
) -> Option<Match> {
    match base {
        NFT_PAYLOAD_NETWORK_HEADER => {
            address(family, offset, len, mask, value).map(|(src, addr)| {
                if src {
                    Match::Src { addr, negate }
                } else {
                    Match::Dst { addr, negate }
                }
            })
        }
        NFT_PAYLOAD_TRANSPORT_HEADER if proto.is_some() && len == 2 && mask.is_none() => {
            let port = u16::from_be_bytes(value.try_into().unwrap_or([0, 0]));
            let port = (value.len() == 2).then(|| port.to_string());
            match offset {
                0 => port.map(|port| Match::SrcPort {
                    port,
                    negate,
                    module: None,
                }),
                2 => port.map(|port| Match::DstPort {
                    port,
                    negate,
                    module: None,
                }),
                _ => None,
            }
        }
        _ => None,
    }
}

/// The target of a verdict expression.
fn verdict(code: i32, chain: Option<&String>) -> Result<Target, ForeignRule> {
    Ok(match (code, chain) {
        (NFT_RETURN, None) => Target::Return,
        (NF_ACCEPT, None) => Target::Accept,
        (NF_DROP, None) => Target::Drop,
        (NFT_JUMP, Some(chain)) => Target::Jump(chain.clone()),
        _ => return Err(ForeignRule(format!("verdict {code}"))),
    })
}

/// The compare (after an optional mask) that completes the load at `i`; `i` moves onto it.
fn compare_at<'a>(exprs: &[Expr<'a>], i: &mut usize) -> Result<Compare<'a>, ForeignRule> {
    let mask = match exprs.get(*i + 1) {
        Some(Expr::Mask { mask }) => {
            *i += 1;
            Some(*mask)
        }
        _ => None,
    };
    *i += 1;
    match exprs.get(*i) {
        Some(Expr::Cmp { negate, value }) => Ok((mask, *negate, *value)),
        _ => Err(ForeignRule("a load without its compare".into())),
    }
}

/// An interface compare: the name with its NUL (exact), or a prefix (`name+`).
fn iface_name(value: &[u8]) -> Option<String> {
    match value.split_last() {
        Some((0, name)) if !name.contains(&0) => Some(String::from_utf8(name.to_vec()).ok()?),
        _ if !value.contains(&0) && !value.is_empty() => {
            Some(format!("{}+", String::from_utf8(value.to_vec()).ok()?))
        }
        _ => None,
    }
}

/// A network-header compare of `family`: (is source, `addr/prefix`).
fn address(
    family: Family,
    offset: u32,
    len: u32,
    mask: Option<&[u8]>,
    value: &[u8],
) -> Option<(bool, String)> {
    let (src, dst, full) = match family {
        Family::V4 => (12, 16, 4usize),
        Family::V6 => (8, 24, 16usize),
    };
    let source = match offset {
        o if o == src => true,
        o if o == dst => false,
        _ => return None,
    };
    let len = len as usize;
    if value.len() != len || len == 0 || len > full {
        return None;
    }
    let prefix = match mask {
        None => len * 8,
        Some(mask) if len == full && mask.len() == full => {
            let ones: u32 = mask.iter().map(|b| b.count_ones()).sum();
            let contiguous = mask
                .iter()
                .enumerate()
                .all(|(i, b)| *b == prefix_byte(ones as usize, i));
            let masked = value.iter().zip(mask).all(|(v, m)| v & !m == 0);
            if !contiguous || !masked {
                return None;
            }
            ones as usize
        }
        Some(_) => return None,
    };
    let mut octets = value.to_vec();
    octets.resize(full, 0);
    Some((source, format!("{}/{prefix}", ip_of(&octets)?)))
}

/// Byte `i` of a `prefix`-bit mask.
fn prefix_byte(prefix: usize, i: usize) -> u8 {
    let bits = prefix.saturating_sub(i * 8).min(8);
    (0xffu16 << (8 - bits)) as u8
}

fn ip_of(octets: &[u8]) -> Option<IpAddr> {
    match octets.len() {
        4 => Some(IpAddr::V4(Ipv4Addr::from(
            <[u8; 4]>::try_from(octets).ok()?,
        ))),
        16 => Some(IpAddr::V6(Ipv6Addr::from(
            <[u8; 16]>::try_from(octets).ok()?,
        ))),
        _ => None,
    }
}

/// A mark as the decoder spells it: `0xVALUE`, with `/0xMASK` unless the mask is all ones.
fn mark_text(value: u32, mask: u32) -> String {
    if mask == u32::MAX {
        format!("{value:#x}")
    } else {
        format!("{value:#x}/{mask:#x}")
    }
}

/// The conntrack states in the model's order, from the kernel's bit mask.
const STATES: [(CtState, u16); 3] = [
    (CtState::Invalid, 1),
    (CtState::Related, 1 << 2),
    (CtState::Established, 1 << 1),
];

fn xt_match(
    name: &str,
    rev: u32,
    info: &[u8],
    proto: Option<Proto>,
    sets: &dyn SetNames,
) -> Option<Match> {
    Some(match (name, rev) {
        ("owner", 1) => match read::owner(info)? {
            Owner::SocketExists => Match::SocketExists,
            Owner::Id { kind, id, negate } => {
                let id = id.to_string();
                match kind {
                    OwnerKind::Uid => Match::UidOwner { id, negate },
                    OwnerKind::Gid => Match::GidOwner { id, negate },
                }
            }
        },
        ("multiport", 1) if proto.is_some() => {
            let (ports, negate) = read::multiport_dst(info)?;
            Match::DstPorts {
                ports: ports.iter().map(u16::to_string).collect(),
                negate,
            }
        }
        ("connmark", 1) => {
            let (mark, mask) = read::connmark_match(info)?;
            Match::ConnMark {
                value: mark_text(mark, mask),
            }
        }
        ("tcp", 0) if proto == Some(Proto::Tcp) && read::tcp_any_port(info) => {
            Match::ProtoModule(Proto::Tcp)
        }
        ("conntrack", 3) => {
            let bits = read::conntrack_states(info)?;
            let states: Vec<CtState> = STATES
                .iter()
                .filter(|(_, bit)| bits & bit != 0)
                .map(|(s, _)| *s)
                .collect();
            let known: u16 = STATES.iter().map(|(_, b)| b).sum();
            if states.is_empty() || bits & !known != 0 {
                return None;
            }
            Match::CtState(states)
        }
        ("set", 4) => {
            let (index, source) = read::set_match(info)?;
            Match::InSet {
                name: sets.name_of(index)?,
                dir: if source { SetDir::Src } else { SetDir::Dst },
            }
        }
        _ => return None,
    })
}

fn xt_target(family: Family, name: &str, rev: u32, info: &[u8]) -> Option<Target> {
    Some(match (name, rev) {
        ("REDIRECT", 0) => Target::Redirect {
            port: read::redirect(family, info)?.to_string(),
            plural: true,
        },
        ("CT", 2) => Target::CtZone(read::ct_zone(info)?),
        ("CONNMARK", 2) => match read::connmark_target(info)? {
            Connmark::SetXmark { ctmark, ctmask } => {
                Target::ConnmarkSetXmark(format!("{ctmark:#x}/{ctmask:#x}"))
            }
            Connmark::Save => Target::ConnmarkSave,
            Connmark::Restore => Target::ConnmarkRestore { masks: false },
        },
        ("MARK", 2) => {
            let (mark, mask) = read::mark_target(info)?;
            Target::SetMark(mark_text(mark, mask))
        }
        ("TPROXY", 1) => {
            let (value, mask, port) = read::tproxy(info)?;
            Target::Tproxy {
                mark: format!("{value:#x}/{mask:#x}"),
                port: port.to_string(),
            }
        }
        ("SNAT", 0) if family == Family::V4 => Target::Snat(read::snat(family, info)?.to_string()),
        ("SNAT", 1) if family == Family::V6 => Target::Snat(read::snat(family, info)?.to_string()),
        _ => return None,
    })
}

#[path = "iptables_nft_canon.rs"]
mod canon;
pub use canon::{as_listed, canonical};

/// Rules by `(table, chain)`, in each chain's order.
pub type Listed = BTreeMap<(Table, String), Vec<Rule>>;

#[cfg(test)]
#[path = "iptables_nft_decode_tests.rs"]
mod tests;
