//! The iptables-nft encoding of a rule list: the nf_tables netlink messages that
//! `iptables-nft-restore --noflush` (iptables 1.8.9) sends for the same restore steps, built here
//! without starting it. Starting iptables-restore (dynamic libraries, extension modules, user
//! database look-ups) costs a few milliseconds per pod; encoding the same messages costs
//! microseconds, and the kernel ends up with the very same tables, chains and expressions, so
//! `iptables-save`, `iptables -C` and Istio's own tooling see no difference.
//!
//! Pure: this module only produces bytes (`netlink::nft_batch` sends them). It covers what sidecar
//! capture needs in the nat table, and DNS capture's conntrack zones in the raw table: interfaces
//! (with `+` wildcards), protocol, addresses and prefixes, single ports, destination multiport, owner UID/GID, and
//! RETURN/ACCEPT/jump/REDIRECT/CT zone. Anything else is [`Unsupported`], and the caller uses
//! iptables-restore as before.

use std::net::IpAddr;

use super::iptables::{RestoreStep, restore_steps};
use super::model::{Family, Match, Position, Proto, Rule, Table, Target, is_builtin_chain};

/// A rule list the encoder does not cover; names what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not covered by the netlink encoding: {0}")]
pub struct Unsupported(pub String);

fn unsupported<T>(what: impl Into<String>) -> Result<T, Unsupported> {
    Err(Unsupported(what.into()))
}

/// nf_tables message types (`NFT_MSG_*`).
pub const NFT_MSG_NEWTABLE: u16 = 0;
pub const NFT_MSG_NEWCHAIN: u16 = 3;
pub const NFT_MSG_NEWRULE: u16 = 6;

/// Netlink header flags used by iptables-nft.
pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_EXCL: u16 = 0x200;
pub const NLM_F_CREATE: u16 = 0x400;
pub const NLM_F_APPEND: u16 = 0x800;

/// One nf_tables message of a transaction, without the netlink header (the sender adds it, with
/// sequence numbers and the batch framing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// `NFT_MSG_*`.
    pub kind: u16,
    /// `NLM_F_*` on top of `NLM_F_REQUEST`.
    pub flags: u16,
    /// `AF_INET` or `AF_INET6`.
    pub family: u8,
    /// The netlink attributes.
    pub attrs: Vec<u8>,
    /// For error messages: what this message does.
    pub what: String,
}

const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

/// The messages for one family's rules, in iptables-nft-restore's order: before each chain or
/// rule the table is (re)created, built-in chains are created when first used, user chains with
/// NLM_F_EXCL (a leftover chain fails the whole transaction, which changes nothing).
pub fn encode(family: Family, rules: &[Rule]) -> Result<Vec<Message>, Unsupported> {
    let af = match family {
        Family::V4 => AF_INET,
        Family::V6 => AF_INET6,
    };
    let mut out = Vec::new();
    for (table, steps) in restore_steps(rules) {
        if !matches!(table, Table::Nat | Table::Raw) {
            return unsupported(format!("table {table}"));
        }
        let mut base_chains_created: Vec<&str> = Vec::new();
        for step in steps {
            out.push(new_table(af, table));
            match step {
                RestoreStep::NewChain(chain) => out.push(Message {
                    kind: NFT_MSG_NEWCHAIN,
                    flags: NLM_F_EXCL,
                    family: af,
                    attrs: Attrs::new().string(1, table.name()).string(3, chain).done(),
                    what: format!("create chain {table}/{chain}"),
                }),
                RestoreStep::Rule(rule) => {
                    if is_builtin_chain(&rule.chain)
                        && !base_chains_created.contains(&rule.chain.as_str())
                    {
                        let Some(hook) = builtin_hook(table, &rule.chain) else {
                            return unsupported(format!("built-in chain {table}/{}", rule.chain));
                        };
                        base_chains_created.push(&rule.chain);
                        out.push(base_chain(af, table, &rule.chain, hook));
                    }
                    out.push(new_rule(af, family, rule)?);
                }
            }
        }
    }
    Ok(out)
}

fn new_table(af: u8, table: Table) -> Message {
    Message {
        kind: NFT_MSG_NEWTABLE,
        flags: NLM_F_CREATE,
        family: af,
        attrs: Attrs::new().string(1, table.name()).done(),
        what: format!("create table {table}"),
    }
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
        "OUTPUT" => 3,
        "POSTROUTING" => 4,
        _ => return None,
    };
    let (priority, kind) = match (table, chain) {
        (Table::Nat, "PREROUTING" | "OUTPUT") => (-100, "nat"),
        (Table::Nat, _) => (100, "nat"),
        (Table::Raw, "PREROUTING" | "OUTPUT") => (-300, "filter"),
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
fn base_chain(af: u8, table: Table, chain: &str, hook: Hook) -> Message {
    let hook_attrs = Attrs::new()
        .u32(1, hook.number)
        .u32(2, hook.priority as u32)
        .done();
    Message {
        kind: NFT_MSG_NEWCHAIN,
        flags: NLM_F_CREATE,
        family: af,
        attrs: Attrs::new()
            .string(1, table.name())
            .string(3, chain)
            .nested(4, &hook_attrs)
            .string(7, hook.kind)
            .done(),
        what: format!("create built-in chain {table}/{chain}"),
    }
}

fn new_rule(af: u8, family: Family, rule: &Rule) -> Result<Message, Unsupported> {
    let flags = match rule.position {
        Position::Append => NLM_F_CREATE | NLM_F_APPEND,
        // Insert at the top is a prepend; other positions need the current rule handles.
        Position::Insert(1) => NLM_F_CREATE,
        Position::Insert(n) => return unsupported(format!("insert at position {n}")),
    };
    let mut exprs = Attrs::new();
    let header = Header::of(rule)?;
    if let Some((name, negate)) = header.in_iface {
        iface(&mut exprs, META_IIFNAME, name, negate);
    }
    if let Some((name, negate)) = header.out_iface {
        iface(&mut exprs, META_OIFNAME, name, negate);
    }
    if let Some(proto) = header.proto {
        meta_load(&mut exprs, META_L4PROTO);
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
        match m {
            Match::DstPort {
                port,
                negate,
                module,
            }
            | Match::SrcPort {
                port,
                negate,
                module,
            } => {
                if header.proto.is_none() || module.is_some_and(|p| Some(p) != header.proto) {
                    return unsupported("port match without its protocol");
                }
                let offset = if matches!(m, Match::SrcPort { .. }) {
                    0
                } else {
                    2
                };
                payload(&mut exprs, PAYLOAD_TRANSPORT, offset, 2);
                cmp(&mut exprs, *negate, &parse_port(port)?.to_be_bytes());
            }
            Match::DstPorts { ports, negate } => {
                if header.proto.is_none() {
                    return unsupported("multiport without its protocol");
                }
                multiport_dst(&mut exprs, ports, *negate)?;
            }
            Match::UidOwner { id, negate } => owner(&mut exprs, OWNER_UID, id, *negate)?,
            Match::GidOwner { id, negate } => owner(&mut exprs, OWNER_GID, id, *negate)?,
            _ => {}
        }
    }
    counter(&mut exprs);
    target(&mut exprs, family, &rule.target)?;
    let compat = Attrs::new()
        .u32(1, header.proto.map(|p| proto_number(p) as u32).unwrap_or(0))
        .u32(2, 0)
        .done();
    Ok(Message {
        kind: NFT_MSG_NEWRULE,
        flags,
        family: af,
        attrs: Attrs::new()
            .string(1, rule.table.name())
            .string(2, &rule.chain)
            .nested(4, &exprs.done())
            .nested(5, &compat)
            .done(),
        what: format!(
            "add rule to {}/{}: {}",
            rule.table,
            rule.chain,
            super::iptables::rule_args(rule).join(" ")
        ),
    })
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
                Match::UidOwner { .. } | Match::GidOwner { .. } | Match::DstPorts { .. } => {}
                other => return unsupported(format!("{other:?}")),
            }
        }
        Ok(h)
    }
}

const META_L4PROTO: u32 = 16;
const META_IIFNAME: u32 = 6;
const META_OIFNAME: u32 = 7;
const PAYLOAD_NETWORK: u32 = 1;
const PAYLOAD_TRANSPORT: u32 = 2;
const REG_1: u32 = 1;
const OWNER_UID: u8 = 1;
const OWNER_GID: u8 = 2;

fn proto_number(p: Proto) -> u8 {
    match p {
        Proto::Tcp => 6,
        Proto::Udp => 17,
    }
}

/// One expression: a list element holding the expression's name and its data attributes.
fn expr(exprs: &mut Attrs, name: &str, data: Vec<u8>) {
    let elem = Attrs::new().string(1, name).nested(2, &data).done();
    exprs.nested_in_place(1, &elem);
}

fn meta_load(exprs: &mut Attrs, key: u32) {
    expr(exprs, "meta", Attrs::new().u32(2, key).u32(1, REG_1).done());
}

fn payload(exprs: &mut Attrs, base: u32, offset: u32, len: u32) {
    let data = Attrs::new()
        .u32(1, REG_1)
        .u32(2, base)
        .u32(3, offset)
        .u32(4, len)
        .done();
    expr(exprs, "payload", data);
}

fn data_value(value: &[u8]) -> Vec<u8> {
    Attrs::new().bytes(1, value).done()
}

fn cmp(exprs: &mut Attrs, negate: bool, value: &[u8]) {
    const CMP_EQ: u32 = 0;
    const CMP_NEQ: u32 = 1;
    let data = Attrs::new()
        .u32(1, REG_1)
        .u32(2, if negate { CMP_NEQ } else { CMP_EQ })
        .nested(3, &data_value(value))
        .done();
    expr(exprs, "cmp", data);
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
        payload(exprs, PAYLOAD_NETWORK, offset, len as u32);
        cmp(exprs, negate, &masked[..len]);
    } else {
        payload(exprs, PAYLOAD_NETWORK, offset, octets.len() as u32);
        let data = Attrs::new()
            .u32(1, REG_1)
            .u32(2, REG_1)
            .u32(3, octets.len() as u32)
            .nested(4, &data_value(&mask))
            .nested(5, &data_value(&vec![0; octets.len()]))
            .done();
        expr(exprs, "bitwise", data);
        cmp(exprs, negate, &masked);
    }
    Ok(())
}

fn parse_port(text: &str) -> Result<u16, Unsupported> {
    text.parse::<u16>()
        .or_else(|_| unsupported(format!("port {text}")))
}

/// `-m owner --uid-owner`/`--gid-owner` (numeric ids only: names need the user database, which
/// iptables-restore reads): an xt match, revision 1, `struct xt_owner_match_info`.
fn owner(exprs: &mut Attrs, kind: u8, id: &str, negate: bool) -> Result<(), Unsupported> {
    let Ok(id) = id.parse::<u32>() else {
        return unsupported(format!("owner {id}"));
    };
    let mut info = Vec::with_capacity(24);
    let (uid_range, gid_range) = if kind == OWNER_UID { (id, 0) } else { (0, id) };
    for v in [uid_range, uid_range, gid_range, gid_range] {
        info.extend_from_slice(&v.to_ne_bytes());
    }
    info.push(kind);
    info.push(if negate { kind } else { 0 });
    info.resize(24, 0);
    let data = Attrs::new()
        .string(1, "owner")
        .u32(2, 1)
        .bytes(3, &info)
        .done();
    expr(exprs, "match", data);
    Ok(())
}

/// `-m multiport --dports a,b,...` (single ports only): an xt match, revision 1,
/// `struct xt_multiport_v1`.
fn multiport_dst(exprs: &mut Attrs, ports: &[String], negate: bool) -> Result<(), Unsupported> {
    const XT_MULTIPORT_DESTINATION: u8 = 1;
    const MAX_PORTS: usize = 15;
    if ports.is_empty() || ports.len() > MAX_PORTS {
        return unsupported(format!("{} multiport ports", ports.len()));
    }
    // flags, count, ports[15], pflags[15] (range markers, none here), invert.
    let mut info = vec![0u8; 2 + 2 * MAX_PORTS + MAX_PORTS + 1];
    info[0] = XT_MULTIPORT_DESTINATION;
    info[1] = ports.len() as u8;
    for (i, port) in ports.iter().enumerate() {
        info[2 + 2 * i..4 + 2 * i].copy_from_slice(&parse_port(port)?.to_ne_bytes());
    }
    info[2 + 3 * MAX_PORTS] = u8::from(negate);
    let data = Attrs::new()
        .string(1, "multiport")
        .u32(2, 1)
        .bytes(3, &info)
        .done();
    expr(exprs, "match", data);
    Ok(())
}

fn counter(exprs: &mut Attrs) {
    let data = Attrs::new().u64(1, 0).u64(2, 0).done();
    expr(exprs, "counter", data);
}

fn verdict(exprs: &mut Attrs, code: i32, chain: Option<&str>) {
    let mut v = Attrs::new().u32(1, code as u32);
    if let Some(chain) = chain {
        v = v.string(2, chain);
    }
    let data = Attrs::new()
        .u32(1, 0)
        .nested(2, &Attrs::new().nested(2, &v.done()).done())
        .done();
    expr(exprs, "immediate", data);
}

fn target(exprs: &mut Attrs, family: Family, target: &Target) -> Result<(), Unsupported> {
    const NF_ACCEPT: i32 = 1;
    const NFT_JUMP: i32 = -3;
    const NFT_RETURN: i32 = -5;
    match target {
        Target::Return => verdict(exprs, NFT_RETURN, None),
        Target::Accept => verdict(exprs, NF_ACCEPT, None),
        Target::Jump(chain) => verdict(exprs, NFT_JUMP, Some(chain)),
        Target::Redirect { port, .. } => {
            // xt REDIRECT, revision 0: IPv4 takes `nf_nat_ipv4_multi_range_compat`, IPv6
            // `nf_nat_range`; both with only the port range set.
            const NF_NAT_RANGE_PROTO_SPECIFIED: u32 = 2;
            let port = parse_port(port)?.to_be_bytes();
            let mut info = Vec::new();
            match family {
                Family::V4 => {
                    info.extend_from_slice(&1u32.to_ne_bytes());
                    info.extend_from_slice(&NF_NAT_RANGE_PROTO_SPECIFIED.to_ne_bytes());
                    info.extend_from_slice(&[0; 8]);
                    info.extend_from_slice(&port);
                    info.extend_from_slice(&port);
                    info.resize(24, 0);
                }
                Family::V6 => {
                    info.extend_from_slice(&NF_NAT_RANGE_PROTO_SPECIFIED.to_ne_bytes());
                    info.extend_from_slice(&[0; 32]);
                    info.extend_from_slice(&port);
                    info.extend_from_slice(&port);
                }
            }
            let data = Attrs::new()
                .string(1, "REDIRECT")
                .u32(2, 0)
                .bytes(3, &info)
                .done();
            expr(exprs, "target", data);
        }
        Target::CtZone(zone) => {
            // xt CT, revision 2: `struct xt_ct_target_info_v1` with only the zone set (the
            // trailing kernel pointer included: 72 bytes).
            let mut info = vec![0u8; 72];
            info[2..4].copy_from_slice(&zone.to_ne_bytes());
            let data = Attrs::new()
                .string(1, "CT")
                .u32(2, 2)
                .bytes(3, &info)
                .done();
            expr(exprs, "target", data);
        }
        other => return unsupported(format!("target {other:?}")),
    }
    Ok(())
}

/// A netlink attribute list under construction: each attribute is a 4-byte header (length, type)
/// and its payload, padded to 4 bytes. Integers are big-endian, as nf_tables expects.
#[derive(Debug, Default)]
pub struct Attrs(Vec<u8>);

impl Attrs {
    pub fn new() -> Attrs {
        Attrs(Vec::new())
    }

    fn put(&mut self, kind: u16, payload: &[u8]) {
        let len = 4 + payload.len();
        self.0.extend_from_slice(&(len as u16).to_ne_bytes());
        self.0.extend_from_slice(&kind.to_ne_bytes());
        self.0.extend_from_slice(payload);
        self.0.resize(self.0.len().next_multiple_of(4), 0);
    }

    pub fn bytes(mut self, kind: u16, payload: &[u8]) -> Attrs {
        self.put(kind, payload);
        self
    }

    /// A NUL-terminated string.
    pub fn string(self, kind: u16, value: &str) -> Attrs {
        let mut v = value.as_bytes().to_vec();
        v.push(0);
        self.bytes(kind, &v)
    }

    pub fn u32(self, kind: u16, value: u32) -> Attrs {
        self.bytes(kind, &value.to_be_bytes())
    }

    pub fn u64(self, kind: u16, value: u64) -> Attrs {
        self.bytes(kind, &value.to_be_bytes())
    }

    /// A nested attribute (`NLA_F_NESTED` set) holding already-built attributes.
    pub fn nested(mut self, kind: u16, inner: &[u8]) -> Attrs {
        self.nested_in_place(kind, inner);
        self
    }

    fn nested_in_place(&mut self, kind: u16, inner: &[u8]) {
        const NLA_F_NESTED: u16 = 0x8000;
        self.put(kind | NLA_F_NESTED, inner);
    }

    pub fn done(self) -> Vec<u8> {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::model::RuleSetBuilder;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn one_rule(matches: Vec<Match>, target: Target) -> Vec<Message> {
        let mut b = RuleSetBuilder::new(false);
        b.append(Table::Nat, "ISTIO_INBOUND", matches, target);
        encode(Family::V4, &b.build().v4).expect("encodable")
    }

    // The expected bytes below were captured (strace) from iptables-nft-restore 1.8.9 applying
    // the same rule.
    #[test]
    fn port_return_rule_matches_iptables_nft() {
        let msgs = one_rule(
            vec![
                Match::Proto(Proto::Tcp),
                Match::DstPort {
                    port: "15008".into(),
                    negate: false,
                    module: None,
                },
            ],
            Target::Return,
        );
        let kinds: Vec<u16> = msgs.iter().map(|m| m.kind).collect();
        assert_eq!(
            kinds,
            [
                NFT_MSG_NEWTABLE,
                NFT_MSG_NEWCHAIN,
                NFT_MSG_NEWTABLE,
                NFT_MSG_NEWRULE
            ]
        );
        assert_eq!(msgs[1].flags, NLM_F_EXCL);
        assert_eq!(msgs[3].flags, NLM_F_CREATE | NLM_F_APPEND);
        // table "nat", chain "ISTIO_INBOUND" (14 bytes with the NUL, padded to 16).
        assert!(
            hex(&msgs[3].attrs)
                .starts_with("080001006e61740012000200495354494f5f494e424f554e440000")
        );
        let exprs = "24000180090001006d6574610000000014000280080002000000001008000100000000012c00018008000100636d700020000280080001000000000108000200000000000c0003800500010006000000340001800c0001007061796c6f6164002400028008000100000000010800020000000002080003000000000208000400000000022c00018008000100636d700020000280080001000000000108000200000000000c000380060001003aa000002c0001800c000100636f756e746572001c0002800c00010000000000000000000c0002000000000000000000300001800e000100696d6d6564696174650000001c0002800800010000000000100002800c00028008000100fffffffb";
        assert!(
            hex(&msgs[3].attrs).contains(exprs),
            "{}",
            hex(&msgs[3].attrs)
        );
        assert!(
            hex(&msgs[3].attrs).ends_with("1400058008000100000000060800020000000000"),
            "compat attribute"
        );
    }

    #[test]
    fn redirect_and_owner_match_iptables_nft() {
        let msgs = one_rule(
            vec![Match::Proto(Proto::Tcp)],
            Target::Redirect {
                port: "15001".into(),
                plural: true,
            },
        );
        assert!(hex(&msgs[3].attrs).contains(
            "480001800b0001007461726765740000380002800d00010052454449524543540000000008000200000000001c000300010000000200000000000000000000003a993a9900000000"
        ));
        let msgs = one_rule(
            vec![
                Match::OutIface {
                    name: "lo".into(),
                    negate: false,
                },
                Match::UidOwner {
                    id: "1337".into(),
                    negate: true,
                },
            ],
            Target::Return,
        );
        let h = hex(&msgs[3].attrs);
        assert!(
            h.contains("0c000380070001006c6f0000"),
            "lo with its NUL: {h}"
        );
        assert!(h.contains(
            "440001800a0001006d61746368000000340002800a0001006f776e657200000008000200000000011c0003003905000039050000000000000000000001010000000000002c000180"
        ), "{h}");
    }

    #[test]
    fn first_rule_in_a_builtin_chain_creates_it_once() {
        let mut b = RuleSetBuilder::new(false);
        b.append(Table::Nat, "PREROUTING", vec![], Target::Jump("X".into()));
        b.append(Table::Nat, "PREROUTING", vec![], Target::Return);
        let msgs = encode(Family::V4, &b.build().v4).unwrap();
        let base: Vec<&Message> = msgs
            .iter()
            .filter(|m| m.kind == NFT_MSG_NEWCHAIN && m.flags == NLM_F_CREATE)
            .collect();
        assert_eq!(base.len(), 1);
        // nat/PREROUTING, hook 0 at priority -100, type nat (no policy: see `base_chain`).
        assert_eq!(
            hex(&base[0].attrs),
            "080001006e6174000f000300505245524f5554494e470000\
             14000480080001000000000008000200ffffff9c\
             080007006e617400"
        );
    }

    #[test]
    fn prefixes_load_whole_bytes_or_mask() {
        let msgs = one_rule(
            vec![Match::Dst {
                addr: "10.16.0.0/12".into(),
                negate: false,
            }],
            Target::Return,
        );
        assert!(hex(&msgs[3].attrs).contains(
            "440001800c0001006269747769736500340002800800010000000001080002000000000108000300000000040c00048008000100fff000000c00058008000100000000002c00018008000100636d700020000280080001000000000108000200000000000c000380080001000a100000"
        ));
        let msgs = one_rule(
            vec![Match::Dst {
                addr: "10.0.0.0/8".into(),
                negate: true,
            }],
            Target::Return,
        );
        let h = hex(&msgs[3].attrs);
        // payload load 1b @ network + 16; cmp neq 0x0a
        assert!(h.contains("0800030000000010080004000000000"), "{h}");
        assert!(
            h.contains("08000200000000010c000380050001000a000000"),
            "{h}"
        );
    }

    #[test]
    fn unsupported_rules_are_named() {
        let mut b = RuleSetBuilder::new(false);
        b.append(Table::Mangle, "PREROUTING", vec![], Target::Return);
        assert!(encode(Family::V4, &b.build().v4).is_err());
        let mut b = RuleSetBuilder::new(false);
        b.append(Table::Raw, "INPUT", vec![], Target::Return);
        assert!(
            encode(Family::V4, &b.build().v4).is_err(),
            "raw has no INPUT"
        );
        let err = one_rule_err(vec![Match::UidOwner {
            id: "istio-proxy".into(),
            negate: false,
        }]);
        assert!(err.0.contains("istio-proxy"), "{err}");
        let err = one_rule_err(vec![
            Match::Proto(Proto::Tcp),
            Match::DstPort {
                port: "1000:2000".into(),
                negate: false,
                module: None,
            },
        ]);
        assert!(err.0.contains("1000:2000"), "{err}");
    }

    fn one_rule_err(matches: Vec<Match>) -> Unsupported {
        let mut b = RuleSetBuilder::new(false);
        b.append(Table::Nat, "ISTIO_INBOUND", matches, Target::Return);
        encode(Family::V4, &b.build().v4).unwrap_err()
    }
}
