//! The iptables-nft encoding of a rule list: the nf_tables netlink messages that
//! `iptables-nft-restore --noflush` (iptables 1.8.9) sends for the same restore steps, built here
//! without starting it. Starting iptables-restore (dynamic libraries, extension modules, user
//! database look-ups) costs a few milliseconds per pod; encoding the same messages costs
//! microseconds, and the kernel ends up with the very same tables, chains and expressions, so
//! `iptables-save`, `iptables -C` and Istio's own tooling see no difference.
//!
//! Pure: this module only describes the messages ([`NftMessage`], attributes as an
//! [`Attr`] tree); the netlink transport frames and sends them. It covers what sidecar capture
//! needs in the nat table, DNS capture's conntrack zones in the raw table, and the ambient in-pod
//! rules' mangle table: interfaces (with `+` wildcards), protocol (and a bare `-m tcp`), addresses
//! and prefixes, single ports, destination multiport, owner UID/GID, packet and connection marks
//! with masks, and RETURN/ACCEPT/jump/REDIRECT/CT zone/CONNMARK set-xmark and restore-mark. Anything else is [`Unsupported`], and the
//! caller uses iptables-restore as before. The xtables structs inside `match`/`target`
//! expressions are laid out in [`super::xtables`].

use std::net::IpAddr;

use netlink_packet_core::{NLM_F_APPEND, NLM_F_CREATE, NLM_F_EXCL};

use super::model::{Family, Match, OwnerKind, Position, Proto, Rule, Table, Target};
use super::nf_kernel::{
    NF_ACCEPT, NFT_JUMP, NFT_META_IIFNAME, NFT_META_L4PROTO, NFT_META_MARK, NFT_META_OIFNAME,
    NFT_MSG_NEWCHAIN, NFT_MSG_NEWRULE, NFT_MSG_NEWTABLE, NFT_PAYLOAD_NETWORK_HEADER,
    NFT_PAYLOAD_TRANSPORT_HEADER, NFT_RETURN,
};
use super::nft_expr::{bitwise, cmp, counter, expr, meta_load, payload, verdict};
pub use super::nla::{Attr, AttrTooLong, Attrs};
use super::xtables;

/// A rule list the encoder does not cover; names what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not covered by the netlink encoding: {0}")]
pub struct Unsupported(pub String);

/// Why a rule list has no netlink encoding.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    #[error(transparent)]
    Unsupported(#[from] Unsupported),
    #[error("cannot {what}: {source}")]
    TooLong {
        what: String,
        #[source]
        source: AttrTooLong,
    },
}

fn unsupported<T, E: From<Unsupported>>(what: impl Into<String>) -> Result<T, E> {
    Err(Unsupported(what.into()).into())
}

/// One nf_tables request of a transaction, as a neutral description: what to send, not how it is
/// framed (the transport adds the netlink and nfnetlink headers, sequence numbers and the batch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftMessage {
    /// `NFT_MSG_*`.
    pub kind: u16,
    /// `NLM_F_*` on top of `NLM_F_REQUEST`.
    pub flags: u16,
    pub family: Family,
    pub attrs: Vec<Attr>,
    /// For error messages: what this message does.
    pub what: String,
}

impl NftMessage {
    fn new(
        kind: u16,
        flags: u16,
        family: Family,
        attrs: Attrs,
        what: String,
    ) -> Result<NftMessage, EncodeError> {
        match attrs.done() {
            Ok(attrs) => Ok(NftMessage {
                kind,
                flags,
                family,
                attrs,
                what,
            }),
            Err(source) => Err(EncodeError::TooLong { what, source }),
        }
    }
}

/// The messages for one family's rules, in iptables-nft-restore's order: before each chain or
/// rule the table is (re)created, built-in chains are created when first used, user chains with
/// NLM_F_EXCL (a leftover chain fails the whole transaction, which changes nothing).
pub fn encode(family: Family, rules: &[Rule]) -> Result<Vec<NftMessage>, EncodeError> {
    encode_onto(family, rules, &|_, _| false)
}

/// A user chain, with NLM_F_EXCL: one left over fails the transaction, which changes nothing.
fn new_user_chain(family: Family, table: Table, chain: &str) -> Result<NftMessage, EncodeError> {
    NftMessage::new(
        NFT_MSG_NEWCHAIN,
        NLM_F_EXCL,
        family,
        Attrs::new().string(1, table.name()).string(3, chain),
        format!("create chain {table}/{chain}"),
    )
}

fn new_table(family: Family, table: Table) -> Result<NftMessage, EncodeError> {
    NftMessage::new(
        NFT_MSG_NEWTABLE,
        NLM_F_CREATE,
        family,
        Attrs::new().string(1, table.name()),
        format!("create table {table}"),
    )
}

/// A built-in chain as iptables-nft creates it: hook number, priority and chain type.
struct Hook {
    number: u32,
    priority: i32,
    kind: &'static str,
}

/// The built-in chains of the tables covered here; None for a user chain.
fn builtin_hook(table: Table, chain: &str) -> Option<Hook> {
    let number = match chain {
        "PREROUTING" => 0,
        "INPUT" => 1,
        "FORWARD" => 2,
        "OUTPUT" => 3,
        "POSTROUTING" => 4,
        _ => return None,
    };
    let (priority, kind) = match (table, chain) {
        (Table::Nat, "PREROUTING" | "OUTPUT") => (-100, "nat"),
        (Table::Nat, "INPUT" | "POSTROUTING") => (100, "nat"),
        (Table::Raw, "PREROUTING" | "OUTPUT") => (-300, "filter"),
        // Locally generated packets whose mark changes are routed again: a `route` chain.
        (Table::Mangle, "OUTPUT") => (-150, "route"),
        (Table::Mangle, _) => (-150, "filter"),
        _ => return None,
    };
    Some(Hook {
        number,
        priority,
        kind,
    })
}

/// Creates a built-in chain, or leaves it as it is when it exists already. iptables-nft also sends
/// the policy (accept), but only for chains its cache says are missing; a new base chain's policy
/// is accept anyway, and leaving the attribute out means an existing chain keeps whatever policy
/// its owner gave it.
fn base_chain(
    family: Family,
    table: Table,
    chain: &str,
    hook: Hook,
) -> Result<NftMessage, EncodeError> {
    let hook_attrs = Attrs::new()
        .u32(1, hook.number)
        .u32(2, hook.priority as u32);
    NftMessage::new(
        NFT_MSG_NEWCHAIN,
        NLM_F_CREATE,
        family,
        Attrs::new()
            .string(1, table.name())
            .string(3, chain)
            .nested(4, hook_attrs)
            .string(7, hook.kind),
        format!("create built-in chain {table}/{chain}"),
    )
}

fn new_rule(family: Family, rule: &Rule) -> Result<NftMessage, EncodeError> {
    let flags = match rule.position {
        Position::Append => NLM_F_CREATE | NLM_F_APPEND,
        // Insert at the top is a prepend; other positions need the current rule handles.
        Position::Insert(1) => NLM_F_CREATE,
        Position::Insert(n) => return Err(Unsupported(format!("insert at position {n}")).into()),
    };
    let mut exprs = Attrs::new();
    let header = Header::of(rule)?;
    if let Some((name, negate)) = header.in_iface {
        iface(&mut exprs, NFT_META_IIFNAME, name, negate);
    }
    if let Some((name, negate)) = header.out_iface {
        iface(&mut exprs, NFT_META_OIFNAME, name, negate);
    }
    if let Some(proto) = header.proto {
        meta_load(&mut exprs, NFT_META_L4PROTO);
        cmp(&mut exprs, false, &[proto_number(proto)]);
    }
    let (src_offset, dst_offset) = match family {
        Family::V4 => (12, 16),
        Family::V6 => (8, 24),
    };
    if let Some((addr, negate)) = header.src {
        address(&mut exprs, family, src_offset, addr, negate)?;
    }
    if let Some((addr, negate)) = header.dst {
        address(&mut exprs, family, dst_offset, addr, negate)?;
    }
    for m in &rule.matches {
        if let Some(pm) = m.as_port() {
            if header.proto.is_none() || pm.module.is_some_and(|p| Some(p) != header.proto) {
                return unsupported("port match without its protocol");
            }
            let offset = if pm.source { 0 } else { 2 };
            payload(&mut exprs, NFT_PAYLOAD_TRANSPORT_HEADER, offset, 2);
            cmp(&mut exprs, pm.negate, &parse_port(pm.port)?.to_be_bytes());
            continue;
        }
        match m {
            // Rendered above, by `as_port`.
            Match::DstPort { .. } | Match::SrcPort { .. } => {}
            Match::DstPorts { ports, negate } => {
                if header.proto.is_none() {
                    return unsupported("multiport without its protocol");
                }
                multiport_dst(&mut exprs, ports, *negate)?;
            }
            Match::UidOwner { id, negate } => owner(&mut exprs, OwnerKind::Uid, id, *negate)?,
            Match::GidOwner { id, negate } => owner(&mut exprs, OwnerKind::Gid, id, *negate)?,
            Match::Mark { value, negate } => packet_mark(&mut exprs, value, *negate)?,
            Match::ConnMark { value } => {
                let (mark, mask) = mark_and_mask(value)?;
                xt(
                    &mut exprs,
                    "match",
                    "connmark",
                    1,
                    &xtables::connmark_match_info(mark, mask),
                );
            }
            Match::ProtoModule(proto) => {
                if header.proto != Some(*proto) {
                    return unsupported("protocol module without its protocol");
                }
                xt(&mut exprs, "match", "tcp", 0, &xtables::tcp_any_port_info());
            }
            _ => {}
        }
    }
    counter(&mut exprs);
    target(&mut exprs, family, &rule.target)?;
    let compat = Attrs::new()
        .u32(1, header.proto.map(|p| proto_number(p) as u32).unwrap_or(0))
        .u32(2, 0);
    NftMessage::new(
        NFT_MSG_NEWRULE,
        flags,
        family,
        Attrs::new()
            .string(1, rule.table.name())
            .string(2, &rule.chain)
            .nested(4, exprs)
            .nested(5, compat),
        format!(
            "add rule to {}/{}: {}",
            rule.table,
            rule.chain,
            super::iptables::rule_args(rule).join(" ")
        ),
    )
}

/// The parts iptables keeps in its fixed rule header (emitted first, in this order), whatever
/// their position on the command line.
#[derive(Default)]
struct Header<'a> {
    in_iface: Option<(&'a str, bool)>,
    out_iface: Option<(&'a str, bool)>,
    proto: Option<Proto>,
    src: Option<(&'a str, bool)>,
    dst: Option<(&'a str, bool)>,
}

impl<'a> Header<'a> {
    fn of(rule: &'a Rule) -> Result<Header<'a>, Unsupported> {
        fn once<T>(slot: &mut Option<T>, value: T, what: &str) -> Result<(), Unsupported> {
            if slot.replace(value).is_some() {
                return unsupported(format!("two {what} matches in one rule"));
            }
            Ok(())
        }
        let mut h = Header::default();
        let (mut sport, mut dport) = (false, false);
        for m in &rule.matches {
            match m {
                Match::InIface { name, negate } => once(&mut h.in_iface, (name, *negate), "-i")?,
                Match::OutIface { name, negate } => once(&mut h.out_iface, (name, *negate), "-o")?,
                Match::Proto(p) => once(&mut h.proto, *p, "-p")?,
                Match::Src { addr, negate } => once(&mut h.src, (addr, *negate), "-s")?,
                Match::Dst { addr, negate } => once(&mut h.dst, (addr, *negate), "-d")?,
                // Both ports of one tcp/udp match are one extension; keep to one port per rule.
                Match::SrcPort { .. } if !sport && !dport => sport = true,
                Match::DstPort { .. } if !sport && !dport => dport = true,
                Match::UidOwner { .. }
                | Match::GidOwner { .. }
                | Match::DstPorts { .. }
                | Match::Mark { .. }
                | Match::ConnMark { .. }
                | Match::ProtoModule(Proto::Tcp) => {}
                other => return unsupported(format!("{other:?}")),
            }
        }
        Ok(h)
    }
}

fn proto_number(p: Proto) -> u8 {
    match p {
        Proto::Tcp => 6,
        Proto::Udp => 17,
    }
}

/// `-i`/`-o`: the name with its terminating NUL (exact match), or, for `name+`, the prefix only.
fn iface(exprs: &mut Attrs, key: u32, name: &str, negate: bool) {
    meta_load(exprs, key);
    let value = match name.strip_suffix('+') {
        Some(prefix) => prefix.as_bytes().to_vec(),
        None => {
            let mut v = name.as_bytes().to_vec();
            v.push(0);
            v
        }
    };
    cmp(exprs, negate, &value);
}

/// `-s`/`-d`: a whole-byte prefix loads just those bytes; any other prefix loads the address and
/// masks it. `/0` matches everything and adds nothing.
fn address(
    exprs: &mut Attrs,
    family: Family,
    offset: u32,
    text: &str,
    negate: bool,
) -> Result<(), Unsupported> {
    let (addr, prefix) = match text.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (text, None),
    };
    let Ok(addr) = addr.parse::<IpAddr>() else {
        return unsupported(format!("address {text}"));
    };
    let octets = match (family, addr) {
        (Family::V4, IpAddr::V4(a)) => a.octets().to_vec(),
        (Family::V6, IpAddr::V6(a)) => a.octets().to_vec(),
        _ => return unsupported(format!("address {text} in the other family")),
    };
    let bits = octets.len() * 8;
    let prefix = match prefix.map(str::parse::<usize>) {
        None => bits,
        Some(Ok(p)) if p <= bits => p,
        _ => return unsupported(format!("address {text}")),
    };
    if prefix == 0 {
        return if negate {
            unsupported(format!("negated {text}"))
        } else {
            Ok(())
        };
    }
    let mask: Vec<u8> = (0..octets.len())
        .map(|i| {
            let bits_here = prefix.saturating_sub(i * 8).min(8);
            (0xffu16 << (8 - bits_here)) as u8
        })
        .collect();
    let masked: Vec<u8> = octets.iter().zip(&mask).map(|(a, m)| a & m).collect();
    if prefix % 8 == 0 {
        let len = prefix / 8;
        payload(exprs, NFT_PAYLOAD_NETWORK_HEADER, offset, len as u32);
        cmp(exprs, negate, &masked[..len]);
    } else {
        payload(
            exprs,
            NFT_PAYLOAD_NETWORK_HEADER,
            offset,
            octets.len() as u32,
        );
        bitwise(exprs, &mask, &vec![0; octets.len()]);
        cmp(exprs, negate, &masked);
    }
    Ok(())
}

/// `VALUE/MASK` as iptables reads marks (hex with `0x`, else decimal). A mark without a mask is
/// left to iptables-restore.
fn mark_and_mask(text: &str) -> Result<(u32, u32), Unsupported> {
    let number = |t: &str| match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => t.parse().ok(),
    };
    match text.split_once('/') {
        Some((v, m)) => match (number(v), number(m)) {
            (Some(v), Some(m)) => Ok((v, m)),
            _ => unsupported(format!("mark {text}")),
        },
        None => unsupported(format!("mark {text} without a mask")),
    }
}

/// `-m mark [!] --mark VALUE/MASK`: iptables-nft loads the mark, masks it and compares (native
/// expressions, the register in host byte order).
fn packet_mark(exprs: &mut Attrs, text: &str, negate: bool) -> Result<(), Unsupported> {
    let (value, mask) = mark_and_mask(text)?;
    meta_load(exprs, NFT_META_MARK);
    bitwise(exprs, &mask.to_ne_bytes(), &[0; 4]);
    cmp(exprs, negate, &value.to_ne_bytes());
    Ok(())
}

fn parse_port(text: &str) -> Result<u16, Unsupported> {
    text.parse::<u16>()
        .or_else(|_| unsupported(format!("port {text}")))
}

/// `-m owner --uid-owner`/`--gid-owner` (numeric ids only: names need the user database, which
/// iptables-restore reads): an xt match, revision 1.
fn owner(exprs: &mut Attrs, kind: OwnerKind, id: &str, negate: bool) -> Result<(), Unsupported> {
    let Ok(id) = id.parse::<u32>() else {
        return unsupported(format!("owner {id}"));
    };
    xt(
        exprs,
        "match",
        "owner",
        1,
        &xtables::owner_info(kind, id, negate),
    );
    Ok(())
}

/// `-m multiport --dports a,b,...` (single ports only): an xt match, revision 1.
fn multiport_dst(exprs: &mut Attrs, ports: &[String], negate: bool) -> Result<(), Unsupported> {
    if ports.is_empty() || ports.len() > xtables::MULTIPORT_MAX {
        return unsupported(format!("{} multiport ports", ports.len()));
    }
    let ports = ports
        .iter()
        .map(|p| parse_port(p))
        .collect::<Result<Vec<u16>, _>>()?;
    let info = xtables::multiport_dst_info(&ports, negate);
    xt(exprs, "match", "multiport", 1, &info);
    Ok(())
}

/// An xtables extension inside an nf_tables `match` or `target` expression: name, revision and
/// its struct.
fn xt(exprs: &mut Attrs, expr_name: &str, name: &str, revision: u32, info: &[u8]) {
    let data = Attrs::new().string(1, name).u32(2, revision).bytes(3, info);
    expr(exprs, expr_name, data);
}

fn target(exprs: &mut Attrs, family: Family, target: &Target) -> Result<(), Unsupported> {
    match target {
        Target::Return => verdict(exprs, NFT_RETURN, None),
        Target::Accept => verdict(exprs, NF_ACCEPT, None),
        Target::Jump(chain) => verdict(exprs, NFT_JUMP, Some(chain)),
        Target::Redirect { port, .. } => {
            let info = xtables::redirect_info(family, parse_port(port)?);
            xt(exprs, "target", "REDIRECT", 0, &info);
        }
        Target::CtZone(zone) => xt(exprs, "target", "CT", 2, &xtables::ct_zone_info(*zone)),
        Target::ConnmarkSetXmark(value) => {
            let (mark, mask) = mark_and_mask(value)?;
            let info = xtables::connmark_target_info(xtables::ConnmarkMode::Set, mark, mask);
            xt(exprs, "target", "CONNMARK", 2, &info);
        }
        // With or without the explicit all-ones masks: those are the defaults.
        Target::ConnmarkRestore { .. } => {
            let info = xtables::connmark_target_info(xtables::ConnmarkMode::Restore, 0, u32::MAX);
            xt(exprs, "target", "CONNMARK", 2, &info);
        }
        other => return unsupported(format!("target {other:?}")),
    }
    Ok(())
}

// Deleting and encoding onto existing chains (the drift heal's messages), in a child module so it
// builds on the private builders above.
#[path = "iptables_nft_heal.rs"]
mod heal;
pub use heal::{delete_chain, delete_rule, delete_table, encode_onto, flush_chain};

#[cfg(test)]
#[path = "iptables_nft_tests.rs"]
mod tests;
