//! Native nftables transactions as typed steps ([`NftTransaction`]) and their encoding into the
//! nf_tables messages nft itself would send for the same text (`NFT_MSG_NEWTABLE`, `NEWCHAIN`,
//! `NEWRULE`, `NEWSET`, `NEWSETELEM`, `DELRULE`, `DELTABLE`), so no process is needed to write
//! our tables. The inverse of [`super::nft_kernel_decode`]: every statement of
//! [`super::nft_model`] becomes the expressions (meta, payload, cmp, bitwise, lookup, immediate,
//! ct, counter, redir, tproxy, nat) that decoder reads back, with the dependencies nft adds on
//! its own (`meta nfproto` before an address, `meta l4proto` before a port). A rule's port list
//! becomes an anonymous constant set sent in the same transaction. The same steps also render
//! as nft text ([`NftTransaction::render`]) for dry runs and logs.
//!
//! Pure: this module describes messages ([`NativeMessage`], attributes as an [`Attr`] tree); the
//! netlink transport frames and sends them, all in one batch (all or nothing).

use std::net::IpAddr;

use netlink_packet_core::{NLM_F_APPEND, NLM_F_CREATE};

use super::iptables_nft::EncodeError;
use super::model::{Family, Proto};
use super::nf_kernel::{
    NF_ACCEPT, NF_DROP, NF_NAT_RANGE_MAP_IPS, NF_NAT_RANGE_PROTO_SPECIFIED, NFT_JUMP,
    NFT_META_IIFNAME, NFT_META_L4PROTO, NFT_META_MARK, NFT_META_NFPROTO, NFT_META_OIFNAME,
    NFT_META_SKGID, NFT_META_SKUID, NFT_MSG_DELRULE, NFT_MSG_DELTABLE, NFT_MSG_NEWCHAIN,
    NFT_MSG_NEWRULE, NFT_MSG_NEWSET, NFT_MSG_NEWSETELEM, NFT_MSG_NEWTABLE,
    NFT_PAYLOAD_NETWORK_HEADER, NFT_PAYLOAD_TRANSPORT_HEADER, NFT_REG_1, NFT_RETURN,
};
use super::nft_expr::{bitwise, cmp, counter, expr, meta_load, payload, value, verdict};
use super::nft_model::{
    AddrValue, MarkKey, MarkSource, NftCtState, NftExpr, NftRule, NftRuleSet, OwnerKind, Side,
};
use super::nftables::{NftTable, placed, render_cleanup, render_transaction};
pub use super::nla::{Attr, Attrs};

/// The element type of a named set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetKind {
    Ipv4Addr,
    Ipv6Addr,
}

impl SetKind {
    /// nft's spelling (`type ipv4_addr`).
    pub fn name(self) -> &'static str {
        match self {
            SetKind::Ipv4Addr => "ipv4_addr",
            SetKind::Ipv6Addr => "ipv6_addr",
        }
    }

    /// nft's datatype number and the key length in bytes.
    fn key(self) -> (u32, u32) {
        match self {
            SetKind::Ipv4Addr => (TYPE_IPADDR, 4),
            SetKind::Ipv6Addr => (TYPE_IP6ADDR, 16),
        }
    }
}

/// A named set declared in one of our tables (existing elements are kept).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedSet {
    pub table: &'static str,
    pub name: &'static str,
    pub kind: SetKind,
    pub comment: &'static str,
}

/// One step of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NftStep {
    /// Our tables removed, whatever they hold; a missing one is fine (`add` then `delete`).
    Remove(Vec<NftTable>),
    /// Each table with rules in `set` created if missing, flushed, its chains declared and the
    /// rules added in order (tables without rules are left alone).
    Replace {
        set: NftRuleSet,
        tables: Vec<NftTable>,
    },
    /// The table created if missing and the sets declared in it.
    DeclareSets(Vec<NamedSet>),
}

/// A whole native nftables transaction: its steps, in order, applied all or nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NftTransaction {
    pub steps: Vec<NftStep>,
}

impl NftTransaction {
    pub fn new(steps: Vec<NftStep>) -> NftTransaction {
        NftTransaction { steps }
    }

    /// Whether applying this changes nothing (no step, or only replacements without rules).
    pub fn is_empty(&self) -> bool {
        self.steps.iter().all(|s| match s {
            NftStep::Remove(tables) => tables.is_empty(),
            NftStep::Replace { set, tables } => {
                !set.rules.iter().any(|r| tables.contains(&r.table))
            }
            NftStep::DeclareSets(sets) => sets.is_empty(),
        })
    }

    /// The transaction as `nft -f -` text (what an operator would type; for dry runs and logs).
    pub fn render(&self) -> String {
        let mut out = String::new();
        for step in &self.steps {
            match step {
                NftStep::Remove(tables) => out.push_str(&render_cleanup(tables)),
                NftStep::Replace { set, tables } => out.push_str(&render_transaction(set, tables)),
                NftStep::DeclareSets(sets) => out.push_str(&render_sets(sets)),
            }
        }
        out
    }
}

/// `add table` and `add set` lines for `sets` (each table added once, before its first set).
pub fn render_sets(sets: &[NamedSet]) -> String {
    let mut out = String::new();
    let mut added: Vec<&str> = Vec::new();
    for s in sets {
        if !added.contains(&s.table) {
            out.push_str(&format!("add table inet {}\n", s.table));
            added.push(s.table);
        }
        out.push_str(&format!(
            "add set inet {} {} {{ type {} ; comment \"{}\" ; }}\n",
            s.table,
            s.name,
            s.kind.name(),
            s.comment
        ));
    }
    out
}

/// One nf_tables request of family `inet`, described neutrally (the transport adds the headers,
/// sequence numbers and the batch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NativeMessage {
    /// `NFT_MSG_*`.
    pub kind: u16,
    /// `NLM_F_*` on top of `NLM_F_REQUEST`.
    pub flags: u16,
    pub attrs: Vec<Attr>,
    /// For error messages: what this message does.
    pub what: String,
}

/// The messages of `tx`, in order.
pub fn encode(tx: &NftTransaction) -> Result<Vec<NativeMessage>, EncodeError> {
    let mut enc = Encoder::default();
    for step in &tx.steps {
        match step {
            NftStep::Remove(tables) => {
                for t in tables {
                    enc.table(t.name())?;
                    enc.push(
                        NFT_MSG_DELTABLE,
                        0,
                        Attrs::new().string(1, t.name()),
                        format!("delete table inet {}", t.name()),
                    )?;
                }
            }
            NftStep::Replace { set, tables } => {
                for &t in tables {
                    enc.replace_table(set, t)?;
                }
            }
            NftStep::DeclareSets(sets) => {
                for s in sets {
                    enc.table(s.table)?;
                    enc.named_set(s)?;
                }
            }
        }
    }
    Ok(enc.out)
}

#[derive(Default)]
struct Encoder {
    out: Vec<NativeMessage>,
    /// The last anonymous set id handed out (unique within the transaction).
    set_id: u32,
}

impl Encoder {
    fn push(
        &mut self,
        kind: u16,
        flags: u16,
        attrs: Attrs,
        what: String,
    ) -> Result<(), EncodeError> {
        match attrs.done() {
            Ok(attrs) => {
                self.out.push(NativeMessage {
                    kind,
                    flags,
                    attrs,
                    what,
                });
                Ok(())
            }
            Err(source) => Err(EncodeError::TooLong { what, source }),
        }
    }

    fn table(&mut self, name: &str) -> Result<(), EncodeError> {
        self.push(
            NFT_MSG_NEWTABLE,
            NLM_F_CREATE,
            Attrs::new().string(1, name),
            format!("create table inet {name}"),
        )
    }

    fn replace_table(&mut self, set: &NftRuleSet, table: NftTable) -> Result<(), EncodeError> {
        let Some(chains) = placed(set, table) else {
            return Ok(());
        };
        let t = table.name();
        self.table(t)?;
        self.push(
            NFT_MSG_DELRULE,
            0,
            Attrs::new().string(1, t),
            format!("flush table inet {t}"),
        )?;
        for chain in &chains {
            let mut attrs = Attrs::new().string(1, t).string(3, chain.name);
            if let Some(spec) = chain.base {
                let (kind, hook, priority) = parse_base(spec).ok_or_else(|| {
                    unsupported(format!("chain {t}/{}: base chain spec {spec}", chain.name))
                })?;
                attrs = attrs
                    .nested(4, Attrs::new().u32(1, hook).u32(2, priority as u32))
                    .string(7, kind);
            }
            self.push(
                NFT_MSG_NEWCHAIN,
                NLM_F_CREATE,
                attrs,
                format!("create chain inet {t} {}", chain.name),
            )?;
        }
        // The table was just flushed: appending in the order the kernel is to hold them gives
        // what `insert ... index N` gives.
        for chain in &chains {
            for rule in &chain.rules {
                self.rule(t, rule)?;
            }
        }
        Ok(())
    }

    fn named_set(&mut self, s: &NamedSet) -> Result<(), EncodeError> {
        let (key_type, key_len) = s.kind.key();
        self.set_id += 1;
        let mut udata = udata_u32(UDATA_SET_KEYBYTEORDER, BYTEORDER_BIG_ENDIAN);
        udata.extend(udata_string(UDATA_SET_COMMENT, s.comment));
        let attrs = Attrs::new()
            .string(1, s.table)
            .string(2, s.name)
            .u32(4, key_type)
            .u32(5, key_len)
            .u32(10, self.set_id)
            .bytes(13, &udata);
        self.push(
            NFT_MSG_NEWSET,
            NLM_F_CREATE,
            attrs,
            format!("create set inet {} {}", s.table, s.name),
        )
    }

    /// An anonymous constant set of ports and its elements; returns its id.
    fn port_set(&mut self, table: &str, ports: &[u16], what: &str) -> Result<u32, EncodeError> {
        self.set_id += 1;
        let id = self.set_id;
        let attrs = Attrs::new()
            .string(1, table)
            .string(2, ANON_SET)
            .u32(3, SET_ANONYMOUS | SET_CONSTANT)
            .u32(4, TYPE_INET_SERVICE)
            .u32(5, 2)
            .u32(10, id)
            .bytes(13, &udata_u32(UDATA_SET_KEYBYTEORDER, BYTEORDER_BIG_ENDIAN));
        self.push(
            NFT_MSG_NEWSET,
            NLM_F_CREATE,
            attrs,
            format!("create the port set of {what}"),
        )?;
        let mut elems = Attrs::new();
        for port in ports {
            let key = Attrs::new().bytes(1, &port.to_be_bytes());
            elems.nested_in_place(1, Attrs::new().nested(1, key));
        }
        let attrs = Attrs::new()
            .string(1, table)
            .string(2, ANON_SET)
            .nested(3, elems)
            .u32(4, id);
        self.push(
            NFT_MSG_NEWSETELEM,
            NLM_F_CREATE,
            attrs,
            format!("add the ports of {what}"),
        )?;
        Ok(id)
    }

    fn rule(&mut self, table: &str, rule: &NftRule) -> Result<(), EncodeError> {
        let what = format!("add rule inet {table} {} {}", rule.chain, rule.body());
        let mut ctx = Context::default();
        let mut exprs = Attrs::new();
        for e in &rule.exprs {
            self.statement(&mut exprs, &mut ctx, table, e, &what)?;
        }
        let attrs = Attrs::new()
            .string(1, table)
            .string(2, &rule.chain)
            .nested(4, exprs);
        self.push(NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, attrs, what)
    }

    fn statement(
        &mut self,
        x: &mut Attrs,
        ctx: &mut Context,
        table: &str,
        e: &NftExpr,
        what: &str,
    ) -> Result<(), EncodeError> {
        match e {
            NftExpr::L4Proto(p) => ctx.l4proto(x, *p),
            NftExpr::IifName { name, negate } => ifname(x, NFT_META_IIFNAME, name, *negate),
            NftExpr::OifName { name, negate } => ifname(x, NFT_META_OIFNAME, name, *negate),
            NftExpr::Addr {
                family,
                side,
                value,
                negate,
            } => {
                ctx.nfproto(x, *family);
                match value {
                    AddrValue::Prefix(p) => address(x, *family, *side, p, *negate)?,
                    AddrValue::Set(name) => {
                        let (offset, len) = addr_field(*family, *side);
                        payload(x, NFT_PAYLOAD_NETWORK_HEADER, offset, len);
                        lookup(x, Attrs::new().string(1, name), *negate);
                    }
                }
            }
            NftExpr::Port {
                proto,
                side,
                ports,
                negate,
            } => self.port_match(x, ctx, table, (*proto, *side, *negate), ports, what)?,
            NftExpr::Owner {
                key, id, negate, ..
            } => {
                let value = parse_num(id)
                    .ok_or_else(|| unsupported(format!("{what}: owner {id} is not a number")))?;
                let k = match key {
                    OwnerKind::Uid => NFT_META_SKUID,
                    OwnerKind::Gid => NFT_META_SKGID,
                };
                meta_load(x, k);
                cmp(x, *negate, &value.to_ne_bytes());
            }
            NftExpr::CtState(states) => ct_state(x, states),
            NftExpr::Mark { key, value, negate } => {
                let v =
                    parse_num(value).ok_or_else(|| unsupported(format!("{what}: mark {value}")))?;
                mark_load(x, *key);
                cmp(x, *negate, &v.to_ne_bytes());
            }
            NftExpr::MarkMasked {
                key, mark, negate, ..
            } => {
                mark_load(x, *key);
                bitwise(x, &mark.mask.to_ne_bytes(), &[0; 4]);
                cmp(x, *negate, &mark.value.to_ne_bytes());
            }
            NftExpr::Counter => counter(x),
            NftExpr::Jump(chain) => verdict(x, NFT_JUMP, Some(chain)),
            NftExpr::Return => verdict(x, NFT_RETURN, None),
            NftExpr::Accept => verdict(x, NF_ACCEPT, None),
            NftExpr::Drop => verdict(x, NF_DROP, None),
            NftExpr::RedirectTo(port) => {
                immediate(x, &port_bytes(port, what)?);
                expr(
                    x,
                    "redir",
                    Attrs::new()
                        .u32(1, NFT_REG_1)
                        .u32(3, NF_NAT_RANGE_PROTO_SPECIFIED),
                );
            }
            NftExpr::Tproxy { family, port } => {
                immediate(x, &port_bytes(port, what)?);
                let data = Attrs::new().u32(1, nfproto(*family)).u32(3, NFT_REG_1);
                expr(x, "tproxy", data);
            }
            NftExpr::SnatTo(addr) => snat(x, addr, what)?,
            NftExpr::MetaMarkSet(src) => {
                mark_source(x, src, MarkKey::Ct, what)?;
                expr(
                    x,
                    "meta",
                    Attrs::new().u32(2, NFT_META_MARK).u32(3, NFT_REG_1),
                );
            }
            NftExpr::CtMarkSet(src) => {
                mark_source(x, src, MarkKey::Meta, what)?;
                expr(x, "ct", Attrs::new().u32(2, CT_MARK).u32(4, NFT_REG_1));
            }
            NftExpr::CtZoneSet(zone) => {
                immediate(x, &zone.to_ne_bytes());
                expr(x, "ct", Attrs::new().u32(2, CT_ZONE).u32(4, NFT_REG_1));
            }
        }
        Ok(())
    }

    /// A port match: one port compared, several looked up in an anonymous set.
    fn port_match(
        &mut self,
        x: &mut Attrs,
        ctx: &mut Context,
        table: &str,
        (proto, side, negate): (Proto, Side, bool),
        ports: &[String],
        what: &str,
    ) -> Result<(), EncodeError> {
        if ctx.l4 != Some(proto) {
            ctx.l4proto(x, proto);
        }
        let ports = ports
            .iter()
            .map(|p| parse_num(p).and_then(|v| u16::try_from(v).ok()))
            .collect::<Option<Vec<u16>>>()
            .ok_or_else(|| unsupported(format!("{what}: port {}", ports.join(","))))?;
        let offset = if side == Side::Src { 0 } else { 2 };
        if let [one] = ports.as_slice() {
            payload(x, NFT_PAYLOAD_TRANSPORT_HEADER, offset, 2);
            cmp(x, negate, &one.to_be_bytes());
        } else {
            let id = self.port_set(table, &ports, what)?;
            payload(x, NFT_PAYLOAD_TRANSPORT_HEADER, offset, 2);
            lookup(x, Attrs::new().string(1, ANON_SET).u32(4, id), negate);
        }
        Ok(())
    }
}

/// `ct state`: the state bits masked, compared against zero, negated.
fn ct_state(x: &mut Attrs, states: &[NftCtState]) {
    let bits = states.iter().fold(0u32, |acc, s| {
        acc | match s {
            NftCtState::Invalid => 1,
            NftCtState::Established => 2,
            NftCtState::Related => 4,
        }
    });
    ct_load(x, CT_STATE);
    bitwise(x, &bits.to_ne_bytes(), &[0; 4]);
    cmp(x, true, &[0; 4]);
}

/// `snat to` an address.
fn snat(x: &mut Attrs, addr: &str, what: &str) -> Result<(), EncodeError> {
    let ip: IpAddr = addr
        .parse()
        .map_err(|_| unsupported(format!("{what}: address {addr}")))?;
    let (family, bytes) = match ip {
        IpAddr::V4(a) => (Family::V4, a.octets().to_vec()),
        IpAddr::V6(a) => (Family::V6, a.octets().to_vec()),
    };
    immediate(x, &bytes);
    let data = Attrs::new()
        .u32(1, NAT_SNAT)
        .u32(2, nfproto(family))
        .u32(3, NFT_REG_1)
        .u32(7, NF_NAT_RANGE_MAP_IPS);
    expr(x, "nat", data);
    Ok(())
}

/// What earlier matches of a rule established: nft adds a dependency only when it is missing.
#[derive(Default)]
struct Context {
    family: Option<Family>,
    l4: Option<Proto>,
}

impl Context {
    fn nfproto(&mut self, x: &mut Attrs, family: Family) {
        if self.family != Some(family) {
            meta_load(x, NFT_META_NFPROTO);
            cmp(x, false, &[nfproto(family) as u8]);
            self.family = Some(family);
        }
    }

    fn l4proto(&mut self, x: &mut Attrs, p: Proto) {
        meta_load(x, NFT_META_L4PROTO);
        cmp(
            x,
            false,
            &[match p {
                Proto::Tcp => 6,
                Proto::Udp => 17,
            }],
        );
        self.l4 = Some(p);
    }
}

fn unsupported(what: String) -> EncodeError {
    EncodeError::Unsupported(super::iptables_nft::Unsupported(what))
}

/// `type nat hook prerouting priority -100` -> (type, hook number, priority).
fn parse_base(spec: &str) -> Option<(&str, u32, i32)> {
    let words: Vec<&str> = spec.split_whitespace().collect();
    let [_, kind, _, hook, _, priority] = words.as_slice() else {
        return None;
    };
    let hook = match *hook {
        "prerouting" => 0,
        "input" => 1,
        "forward" => 2,
        "output" => 3,
        "postrouting" => 4,
        _ => return None,
    };
    Some((kind, hook, priority.parse().ok()?))
}

/// A decimal or `0x` number as nft reads it.
fn parse_num(text: &str) -> Option<u32> {
    match text.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

fn port_bytes(port: &str, what: &str) -> Result<[u8; 2], EncodeError> {
    parse_num(port)
        .and_then(|p| u16::try_from(p).ok())
        .map(u16::to_be_bytes)
        .ok_or_else(|| unsupported(format!("{what}: port {port}")))
}

fn nfproto(family: Family) -> u32 {
    match family {
        Family::V4 => 2,
        Family::V6 => 10,
    }
}

/// Network-header offset and length of an address.
fn addr_field(family: Family, side: Side) -> (u32, u32) {
    match (family, side) {
        (Family::V4, Side::Src) => (12, 4),
        (Family::V4, Side::Dst) => (16, 4),
        (Family::V6, Side::Src) => (8, 16),
        (Family::V6, Side::Dst) => (24, 16),
    }
}

/// An address or prefix: only the bytes the prefix covers are loaded, masked when it does not
/// end on a byte.
fn address(
    x: &mut Attrs,
    family: Family,
    side: Side,
    text: &str,
    negate: bool,
) -> Result<(), EncodeError> {
    let bad = || unsupported(format!("address {text}"));
    let (addr, prefix) = match text.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (text, None),
    };
    let octets = match (family, addr.parse::<IpAddr>().map_err(|_| bad())?) {
        (Family::V4, IpAddr::V4(a)) => a.octets().to_vec(),
        (Family::V6, IpAddr::V6(a)) => a.octets().to_vec(),
        _ => return Err(bad()),
    };
    let bits = octets.len() * 8;
    let prefix = match prefix.map(str::parse::<usize>) {
        None => bits,
        Some(Ok(p)) if p <= bits => p,
        _ => return Err(bad()),
    };
    // A /0 is compared as nft does it: the whole address, masked to nothing.
    let len = if prefix == 0 {
        bits / 8
    } else {
        prefix.div_ceil(8)
    };
    let (offset, _) = addr_field(family, side);
    payload(x, NFT_PAYLOAD_NETWORK_HEADER, offset, len as u32);
    let mask: Vec<u8> = (0..len)
        .map(|i| {
            let here = prefix.saturating_sub(i * 8).min(8);
            (0xff00u16 >> here) as u8
        })
        .collect();
    let value: Vec<u8> = octets[..len]
        .iter()
        .zip(&mask)
        .map(|(a, m)| a & m)
        .collect();
    if prefix % 8 != 0 || prefix == 0 {
        bitwise(x, &mask, &vec![0; len]);
    }
    cmp(x, negate, &value);
    Ok(())
}

fn ifname(x: &mut Attrs, key: u32, name: &str, negate: bool) {
    meta_load(x, key);
    let value = match name.strip_suffix('*') {
        Some(prefix) => prefix.as_bytes().to_vec(),
        None => {
            let mut v = name.as_bytes().to_vec();
            v.resize(IFNAMSIZ, 0);
            v
        }
    };
    cmp(x, negate, &value);
}

fn mark_load(x: &mut Attrs, key: MarkKey) {
    match key {
        MarkKey::Meta | MarkKey::MetaShort => meta_load(x, NFT_META_MARK),
        MarkKey::Ct => ct_load(x, CT_MARK),
    }
}

/// Loads what a mark set writes into register 1.
fn mark_source(
    x: &mut Attrs,
    src: &MarkSource,
    other: MarkKey,
    what: &str,
) -> Result<(), EncodeError> {
    match src {
        MarkSource::Value(v) => {
            let v = parse_num(v).ok_or_else(|| unsupported(format!("{what}: mark {v}")))?;
            immediate(x, &v.to_ne_bytes());
        }
        MarkSource::Other => mark_load(x, other),
        MarkSource::Masked(m) => {
            ct_load(x, CT_MARK);
            bitwise(x, &(!m.mask).to_ne_bytes(), &m.value.to_ne_bytes());
        }
    }
    Ok(())
}

fn ct_load(x: &mut Attrs, key: u32) {
    expr(x, "ct", Attrs::new().u32(2, key).u32(1, NFT_REG_1));
}

fn lookup(x: &mut Attrs, set: Attrs, negate: bool) {
    let mut data = set.u32(2, NFT_REG_1);
    if negate {
        data = data.u32(5, LOOKUP_F_INV);
    }
    expr(x, "lookup", data);
}

fn immediate(x: &mut Attrs, bytes: &[u8]) {
    let data = Attrs::new().u32(1, NFT_REG_1).nested(2, value(bytes));
    expr(x, "immediate", data);
}

/// A libnftnl user-data TLV: type, length, value.
fn udata(kind: u8, v: &[u8]) -> Vec<u8> {
    let mut out = vec![kind, v.len() as u8];
    out.extend_from_slice(v);
    out
}

fn udata_u32(kind: u8, v: u32) -> Vec<u8> {
    udata(kind, &v.to_ne_bytes())
}

fn udata_string(kind: u8, s: &str) -> Vec<u8> {
    // A comment longer than a TLV holds is cut, as nft refuses longer ones anyway.
    let mut v: Vec<u8> = s.as_bytes().iter().take(254).copied().collect();
    v.push(0);
    udata(kind, &v)
}

/// `IFNAMSIZ`; `NFT_CT_STATE`, `NFT_CT_MARK`, `NFT_CT_ZONE`; `NFT_LOOKUP_F_INV`; `NFT_NAT_SNAT`.
const IFNAMSIZ: usize = 16;
const CT_STATE: u32 = 0;
const CT_MARK: u32 = 3;
const CT_ZONE: u32 = 17;
const LOOKUP_F_INV: u32 = 1;
const NAT_SNAT: u32 = 0;
/// `NFT_SET_ANONYMOUS`, `NFT_SET_CONSTANT`.
const SET_ANONYMOUS: u32 = 1;
const SET_CONSTANT: u32 = 2;
/// The kernel names an anonymous set itself from this pattern; rules refer to it by id.
const ANON_SET: &str = "__set%d";
/// nft's datatypes (`enum datatypes`).
const TYPE_IPADDR: u32 = 7;
const TYPE_IP6ADDR: u32 = 8;
const TYPE_INET_SERVICE: u32 = 13;
/// libnftnl's set user data: key byte order and comment.
const UDATA_SET_KEYBYTEORDER: u8 = 0;
const UDATA_SET_COMMENT: u8 = 7;
const BYTEORDER_BIG_ENDIAN: u32 = 2;

#[cfg(test)]
#[path = "nft_encode_tests.rs"]
mod tests;
