//! Typed nftables rules: a rule is a list of typed matches and statements ([`NftExpr`]), printed
//! by one renderer ([`NftExpr`]'s `Display`) in the spelling of Istio's nftables goldens. Builders
//! ([`super::nft_capture`], [`super::ambient`]) decide; nothing else here formats rule text.

use std::fmt;

pub use super::model::OwnerKind;
use super::model::{Family, Proto};
use super::nftables::NftTable;

/// Which side of a packet an address or port match looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Src,
    Dst,
}

/// The right-hand side of an address match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddrValue {
    /// An address or CIDR, printed as given.
    Prefix(String),
    /// A named set of the same table (`@name`).
    Set(String),
}

/// Which mark a match or statement reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkKey {
    /// The packet mark, spelled `meta mark`.
    Meta,
    /// The packet mark, spelled `mark` (nft accepts both; Istio's goldens use both).
    MetaShort,
    /// The connection mark (`ct mark`).
    Ct,
}

/// How a masked mark comparison is spelled (Istio's goldens use all three).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaskSpelling {
    /// `& 0xfff ==`
    Ampersand,
    /// `and 0xfff ==`
    And,
    /// `and 0xfff  ==` (two spaces: Istio's IPv4 inbound redirect rule).
    AndWide,
}

/// A mark value with an optional mask, as compared or set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaskedMark {
    pub value: u32,
    pub mask: u32,
}

impl MaskedMark {
    /// The iptables spelling `0xVALUE/0xMASK`.
    pub fn iptables(self) -> String {
        format!("{:#x}/{:#x}", self.value, self.mask)
    }
}

/// Conntrack states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum NftCtState {
    Invalid,
    Related,
    Established,
}

/// What `meta mark set` / `ct mark set` writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MarkSource {
    /// A literal mark value, printed as given.
    Value(String),
    /// Copy the other mark (`meta mark set ct mark`, `ct mark set mark`).
    Other,
    /// Keep the bits outside `mark.mask` and set `mark.value` (`ct mark & ~mask | value`).
    Masked(MaskedMark),
}

/// One match or statement of a rule, in the order nft reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NftExpr {
    /// `meta l4proto tcp`
    L4Proto(Proto),
    /// `iifname X` / `iifname != X`
    IifName {
        name: String,
        negate: bool,
    },
    /// `oifname X` / `oifname != X`
    OifName {
        name: String,
        negate: bool,
    },
    /// `ip daddr X`, `ip6 saddr != X`, `ip daddr @set`
    Addr {
        family: Family,
        side: Side,
        value: AddrValue,
        negate: bool,
    },
    /// `tcp dport 53`, `tcp dport != { 53, 15008 }` (several ports form an anonymous set).
    Port {
        proto: Proto,
        side: Side,
        ports: Vec<String>,
        negate: bool,
    },
    /// `skuid 1337`, `skgid != 1337`; `meta skuid 1337` when `with_meta` (Istio's DNS rules).
    Owner {
        key: OwnerKind,
        id: String,
        negate: bool,
        with_meta: bool,
    },
    /// `ct state related,established`
    CtState(Vec<NftCtState>),
    /// An unmasked mark compared as given: `mark 1337`, `mark != 1338`, `ct mark 1337`.
    Mark {
        key: MarkKey,
        value: String,
        negate: bool,
    },
    /// A masked mark comparison: `meta mark & 0xfff == 0x539`, `ct mark and 0xfff == 0x111`.
    MarkMasked {
        key: MarkKey,
        mark: MaskedMark,
        negate: bool,
        spelling: MaskSpelling,
    },
    Counter,
    /// `jump CHAIN`: the one place a jump target lives (the renderer declares targets from it).
    Jump(String),
    Return,
    Accept,
    Drop,
    /// `redirect to :PORT`
    RedirectTo(String),
    /// `tproxy ip to :PORT`
    Tproxy {
        family: Family,
        port: String,
    },
    /// `meta mark set ...`
    MetaMarkSet(MarkSource),
    /// `ct mark set ...`
    CtMarkSet(MarkSource),
    /// `ct zone set N`
    CtZoneSet(u16),
    /// `snat to ADDR`
    SnatTo(String),
}

fn proto_name(proto: Proto) -> &'static str {
    match proto {
        Proto::Tcp => "tcp",
        Proto::Udp => "udp",
    }
}

fn family_name(family: Family) -> &'static str {
    match family {
        Family::V4 => "ip",
        Family::V6 => "ip6",
    }
}

fn side_name(side: Side) -> &'static str {
    match side {
        Side::Src => "saddr",
        Side::Dst => "daddr",
    }
}

fn not(negate: bool) -> &'static str {
    if negate { "!= " } else { "" }
}

impl fmt::Display for MarkKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MarkKey::Meta => "meta mark",
            MarkKey::MetaShort => "mark",
            MarkKey::Ct => "ct mark",
        })
    }
}

impl fmt::Display for NftExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NftExpr::L4Proto(p) => write!(f, "meta l4proto {}", proto_name(*p)),
            NftExpr::IifName { name, negate } => write!(f, "iifname {}{name}", not(*negate)),
            NftExpr::OifName { name, negate } => write!(f, "oifname {}{name}", not(*negate)),
            NftExpr::Addr {
                family,
                side,
                value,
                negate,
            } => {
                write!(
                    f,
                    "{} {} {}",
                    family_name(*family),
                    side_name(*side),
                    not(*negate)
                )?;
                match value {
                    AddrValue::Prefix(p) => f.write_str(p),
                    AddrValue::Set(s) => write!(f, "@{s}"),
                }
            }
            NftExpr::Port {
                proto,
                side,
                ports,
                negate,
            } => {
                let key = match side {
                    Side::Src => "sport",
                    Side::Dst => "dport",
                };
                write!(f, "{} {key} {}", proto_name(*proto), not(*negate))?;
                match ports.as_slice() {
                    [one] => f.write_str(one),
                    many => write!(f, "{{ {} }}", many.join(", ")),
                }
            }
            NftExpr::Owner {
                key,
                id,
                negate,
                with_meta,
            } => {
                let key = match key {
                    OwnerKind::Uid => "skuid",
                    OwnerKind::Gid => "skgid",
                };
                let meta = if *with_meta { "meta " } else { "" };
                write!(f, "{meta}{key} {}{id}", not(*negate))
            }
            NftExpr::CtState(states) => {
                let names: Vec<&str> = states
                    .iter()
                    .map(|s| match s {
                        NftCtState::Invalid => "invalid",
                        NftCtState::Related => "related",
                        NftCtState::Established => "established",
                    })
                    .collect();
                write!(f, "ct state {}", names.join(","))
            }
            NftExpr::Mark { key, value, negate } => write!(f, "{key} {}{value}", not(*negate)),
            NftExpr::MarkMasked {
                key,
                mark,
                negate,
                spelling,
            } => {
                let (op, gap) = match spelling {
                    MaskSpelling::Ampersand => ("&", " "),
                    MaskSpelling::And => ("and", " "),
                    MaskSpelling::AndWide => ("and", "  "),
                };
                let cmp = if *negate { "!=" } else { "==" };
                write!(f, "{key} {op} {:#x}{gap}{cmp} {:#x}", mark.mask, mark.value)
            }
            NftExpr::Counter => f.write_str("counter"),
            NftExpr::Jump(chain) => write!(f, "jump {chain}"),
            NftExpr::Return => f.write_str("return"),
            NftExpr::Accept => f.write_str("accept"),
            NftExpr::Drop => f.write_str("drop"),
            NftExpr::RedirectTo(port) => write!(f, "redirect to :{port}"),
            NftExpr::Tproxy { family, port } => {
                write!(f, "tproxy {} to :{port}", family_name(*family))
            }
            NftExpr::MetaMarkSet(src) => write_mark_set(f, "meta mark set", MarkKey::Ct, src),
            NftExpr::CtMarkSet(src) => write_mark_set(f, "ct mark set", MarkKey::MetaShort, src),
            NftExpr::CtZoneSet(zone) => write!(f, "ct zone set {zone}"),
            NftExpr::SnatTo(addr) => write!(f, "snat to {addr}"),
        }
    }
}

fn write_mark_set(
    f: &mut fmt::Formatter<'_>,
    head: &str,
    other: MarkKey,
    src: &MarkSource,
) -> fmt::Result {
    match src {
        MarkSource::Value(v) => write!(f, "{head} {v}"),
        MarkSource::Other => write!(f, "{head} {other}"),
        // Two spaces after `|`: Istio's spelling, kept for identical output.
        MarkSource::Masked(m) => {
            write!(f, "{head} ct mark & {:#x} |  {:#x}", !m.mask, m.value)
        }
    }
}

/// One nftables rule: table, chain, optional 0-based insert index, and its expressions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftRule {
    pub table: NftTable,
    pub chain: String,
    pub index: Option<usize>,
    pub exprs: Vec<NftExpr>,
}

impl NftRule {
    /// The chain this rule jumps to, if any.
    pub fn jump_target(&self) -> Option<&str> {
        self.exprs.iter().find_map(|e| match e {
            NftExpr::Jump(chain) => Some(chain.as_str()),
            _ => None,
        })
    }

    /// The rule body as nft text.
    pub fn body(&self) -> String {
        let parts: Vec<String> = self.exprs.iter().map(ToString::to_string).collect();
        parts.join(" ")
    }
}

/// Rules in program order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NftRuleSet {
    pub rules: Vec<NftRule>,
}

/// Collects rules in program order for the nftables builders (sidecar capture, ambient); IPv6
/// twins are added only when `ipv6` is on.
pub struct NftRulesBuilder {
    pub ipv6: bool,
    rules: Vec<NftRule>,
}

impl NftRulesBuilder {
    pub fn new(ipv6: bool) -> NftRulesBuilder {
        NftRulesBuilder {
            ipv6,
            rules: Vec::new(),
        }
    }

    fn push(&mut self, table: NftTable, chain: &str, index: Option<usize>, exprs: Vec<NftExpr>) {
        self.rules.push(NftRule {
            table,
            chain: chain.to_string(),
            index,
            exprs,
        });
    }

    pub fn add(&mut self, table: NftTable, chain: &str, exprs: Vec<NftExpr>) {
        self.push(table, chain, None, exprs);
    }

    /// Adds only when IPv6 is enabled.
    pub fn add6(&mut self, table: NftTable, chain: &str, exprs: Vec<NftExpr>) {
        if self.ipv6 {
            self.add(table, chain, exprs);
        }
    }

    /// Adds the IPv4 rule `make(V4, v4)` and, with IPv6, its twin `make(V6, v6)`.
    pub fn add_both(
        &mut self,
        table: NftTable,
        chain: &str,
        (v4, v6): (&str, &str),
        make: impl Fn(Family, &str) -> Vec<NftExpr>,
    ) {
        self.add(table, chain, make(Family::V4, v4));
        self.add6(table, chain, make(Family::V6, v6));
    }

    /// Inserts at `index` of the chain (`insert rule ... index N`).
    pub fn insert(&mut self, table: NftTable, chain: &str, index: usize, exprs: Vec<NftExpr>) {
        self.push(table, chain, Some(index), exprs);
    }

    pub fn finish(self) -> NftRuleSet {
        NftRuleSet { rules: self.rules }
    }
}

/// Short constructors the builders share.
pub mod expr {
    use super::*;

    pub fn tcp() -> NftExpr {
        NftExpr::L4Proto(Proto::Tcp)
    }
    /// An interface name as nft matches it: iptables' trailing `+` (every interface whose
    /// name starts with the rest) is nft's trailing `*`; nft refuses the `+` spelling.
    pub fn nft_ifname(name: &str) -> String {
        match name.strip_suffix('+') {
            Some(prefix) => format!("{prefix}*"),
            None => name.to_string(),
        }
    }
    pub fn iif(name: &str) -> NftExpr {
        NftExpr::IifName {
            name: nft_ifname(name),
            negate: false,
        }
    }
    pub fn oif(name: &str, negate: bool) -> NftExpr {
        NftExpr::OifName {
            name: nft_ifname(name),
            negate,
        }
    }
    pub fn addr(family: Family, side: Side, prefix: &str, negate: bool) -> NftExpr {
        NftExpr::Addr {
            family,
            side,
            value: AddrValue::Prefix(prefix.into()),
            negate,
        }
    }
    pub fn daddr(family: Family, prefix: &str, negate: bool) -> NftExpr {
        addr(family, Side::Dst, prefix, negate)
    }
    pub fn saddr(family: Family, prefix: &str) -> NftExpr {
        addr(family, Side::Src, prefix, false)
    }
    pub fn ports(proto: Proto, side: Side, ports: &[&str], negate: bool) -> NftExpr {
        NftExpr::Port {
            proto,
            side,
            ports: ports.iter().map(|p| p.to_string()).collect(),
            negate,
        }
    }
    pub fn dport(proto: Proto, port: &str, negate: bool) -> NftExpr {
        ports(proto, Side::Dst, &[port], negate)
    }
    pub fn sport(proto: Proto, port: &str) -> NftExpr {
        ports(proto, Side::Src, &[port], false)
    }
    pub fn jump(chain: &str) -> NftExpr {
        NftExpr::Jump(chain.into())
    }
    pub fn redirect(port: &str) -> NftExpr {
        NftExpr::RedirectTo(port.into())
    }
}

#[cfg(test)]
mod tests {
    use super::expr::*;
    use super::*;

    fn text(exprs: Vec<NftExpr>) -> String {
        NftRule {
            table: NftTable::SidecarNat,
            chain: "x".into(),
            index: None,
            exprs,
        }
        .body()
    }

    #[test]
    fn matches_render_in_nft_spelling() {
        assert_eq!(
            text(vec![
                oif("lo", false),
                tcp(),
                daddr(Family::V6, "::1/128", true),
                ports(Proto::Tcp, Side::Dst, &["53", "15008"], true),
                NftExpr::Owner {
                    key: OwnerKind::Uid,
                    id: "1337".into(),
                    negate: false,
                    with_meta: false
                },
                NftExpr::Counter,
                jump("istio-in-redirect"),
            ]),
            "oifname lo meta l4proto tcp ip6 daddr != ::1/128 tcp dport != { 53, 15008 } \
             skuid 1337 counter jump istio-in-redirect"
        );
        assert_eq!(
            text(vec![
                NftExpr::CtState(vec![NftCtState::Related, NftCtState::Established]),
                NftExpr::Addr {
                    family: Family::V4,
                    side: Side::Dst,
                    value: AddrValue::Set("probes".into()),
                    negate: false
                },
                NftExpr::SnatTo("169.254.7.127".into()),
            ]),
            "ct state related,established ip daddr @probes snat to 169.254.7.127"
        );
    }

    #[test]
    fn marks_render_every_spelling_from_numbers() {
        let m = MaskedMark {
            value: 0x539,
            mask: 0xfff,
        };
        let masked = |key, negate, spelling| NftExpr::MarkMasked {
            key,
            mark: m,
            negate,
            spelling,
        };
        assert_eq!(
            text(vec![masked(MarkKey::Meta, false, MaskSpelling::Ampersand)]),
            "meta mark & 0xfff == 0x539"
        );
        assert_eq!(
            text(vec![masked(
                MarkKey::MetaShort,
                true,
                MaskSpelling::AndWide
            )]),
            "mark and 0xfff  != 0x539"
        );
        assert_eq!(
            text(vec![NftExpr::CtMarkSet(MarkSource::Masked(MaskedMark {
                value: 0x111,
                mask: 0xfff
            }))]),
            "ct mark set ct mark & 0xfffff000 |  0x111"
        );
        assert_eq!(
            text(vec![
                NftExpr::MetaMarkSet(MarkSource::Other),
                NftExpr::CtMarkSet(MarkSource::Other)
            ]),
            "meta mark set ct mark ct mark set mark"
        );
        assert_eq!(m.iptables(), "0x539/0xfff");
    }

    #[test]
    fn jump_target_is_read_from_the_typed_statement() {
        let rule = NftRule {
            table: NftTable::AmbientNat,
            chain: "prerouting".into(),
            index: None,
            exprs: vec![NftExpr::Counter, jump("istio-prerouting")],
        };
        assert_eq!(rule.jump_target(), Some("istio-prerouting"));
        let redirect_rule = NftRule {
            exprs: vec![redirect("15001")],
            ..rule
        };
        assert_eq!(redirect_rule.jump_target(), None);
    }

    #[test]
    fn an_iptables_interface_wildcard_is_spelt_as_nft_reads_it() {
        assert_eq!(
            text(vec![iif("tun+"), NftExpr::Counter]),
            "iifname tun* counter"
        );
        assert_eq!(text(vec![oif("eth+", true)]), "oifname != eth*");
        assert_eq!(text(vec![iif("eth0")]), "iifname eth0");
    }
}
