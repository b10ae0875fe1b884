//! Sidecar traffic capture: the typed capture config and the builder that turns it into the rule
//! model in Istio's exact order. Shared by `istio-iptables` and the CNI plugin.

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;

use super::model::{
    CtState, Family, Match, Proto, RuleSet, RuleSetBuilder, Table, Target, is_builtin_chain,
};

/// Chain names of the sidecar rule set.
pub mod chain {
    pub const INBOUND: &str = "ISTIO_INBOUND";
    pub const REDIRECT: &str = "ISTIO_REDIRECT";
    pub const IN_REDIRECT: &str = "ISTIO_IN_REDIRECT";
    pub const OUTPUT: &str = "ISTIO_OUTPUT";
    pub const OUTPUT_DNS: &str = "ISTIO_OUTPUT_DNS";
    pub const DIVERT: &str = "ISTIO_DIVERT";
    pub const TPROXY: &str = "ISTIO_TPROXY";
    pub const DROP: &str = "ISTIO_DROP";
}

/// Source address the sidecar uses for inbound passthrough connections.
pub const INBOUND_PASSTHROUGH_V4: &str = "127.0.0.6/32";
pub const INBOUND_PASSTHROUGH_V6: &str = "::6/128";
/// IPv6 loopback as printed in rules.
pub const LOOPBACK_V6: &str = "::1/128";
/// Default IPv4 loopback CIDR (`ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR`).
pub const DEFAULT_LOOPBACK_V4: &str = "127.0.0.1/32";
/// Mark used for outbound loopback traffic in TPROXY mode.
pub const OUTBOUND_MARK: &str = "1338";
/// The local DNS proxy port of the sidecar agent.
pub const DNS_PROXY_PORT: &str = "15053";

/// How inbound traffic is captured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InterceptionMode {
    #[default]
    Redirect,
    Tproxy,
}

/// Which inbound ports are captured.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum InboundPorts {
    /// No inbound capture.
    #[default]
    None,
    /// Every port (`*`), minus the exclude list.
    All,
    /// Only these ports.
    List(Vec<String>),
}

/// A parsed list of IP ranges (`*` or CIDRs), split by family, printed as Istio prints them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IpRanges {
    pub wildcard: bool,
    pub v4: Vec<String>,
    pub v6: Vec<String>,
    pub has_loopback_v4: bool,
    pub has_loopback_v6: bool,
}

/// Why a range list could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid CIDR {value:?}: {reason}")]
pub struct RangeError {
    pub value: String,
    pub reason: String,
}

impl IpRanges {
    /// Parses a comma-separated list (items trimmed, empty ones dropped); `*` means every address.
    /// A bare address is taken as a host prefix. Host bits are kept (`10.1.2.3/8` stays).
    pub fn parse(list: &str) -> Result<IpRanges, RangeError> {
        let mut ranges = IpRanges::default();
        if list.trim() == "*" {
            ranges.wildcard = true;
            return Ok(ranges);
        }
        for item in split_list(list) {
            let (addr, bits) = parse_prefix(&item)?;
            let printed = format!("{addr}/{bits}");
            match addr {
                IpAddr::V4(a) => {
                    ranges.has_loopback_v4 |= a.is_loopback();
                    ranges.v4.push(printed);
                }
                IpAddr::V6(a) => {
                    ranges.has_loopback_v6 |= a.is_loopback();
                    ranges.v6.push(printed);
                }
            }
        }
        Ok(ranges)
    }

    fn family(&self, family: Family) -> &[String] {
        match family {
            Family::V4 => &self.v4,
            Family::V6 => &self.v6,
        }
    }
}

fn parse_prefix(item: &str) -> Result<(IpAddr, u8), RangeError> {
    let err = |reason: &str| RangeError {
        value: item.to_string(),
        reason: reason.to_string(),
    };
    if let Some((addr, bits)) = item.split_once('/') {
        let addr: IpAddr = addr.parse().map_err(|_| err("not an IP address"))?;
        let bits: u8 = bits
            .parse()
            .map_err(|_| err("prefix length is not a number"))?;
        // Validate the length for the family (IpNet does the bounds check).
        IpNet::new(addr, bits).map_err(|_| err("prefix length too long for the address family"))?;
        Ok((addr, bits))
    } else {
        let addr: IpAddr = item.parse().map_err(|_| err("not an IP address or CIDR"))?;
        let bits = if addr.is_ipv4() { 32 } else { 128 };
        Ok((addr, bits))
    }
}

/// Splits a comma-separated list, trimming whitespace around each item and dropping empty items
/// (`"6000, 7000,"` → `6000`, `7000`). Istio's istio-iptables drops empty items but keeps spaces,
/// so `8080, 9090` from an annotation fails there; its annotation validator trims, as we do
/// everywhere.
pub fn split_list(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// Outbound owner-group capture (`ISTIO_OUTBOUND_OWNER_GROUPS[_EXCLUDE]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerGroups {
    /// Capture every group except these (`*` include list).
    AllExcept(Vec<String>),
    /// Capture only these groups (an empty list captures nothing).
    Only(Vec<String>),
}

impl Default for OwnerGroups {
    fn default() -> Self {
        OwnerGroups::AllExcept(Vec::new())
    }
}

/// Everything the sidecar rule set is built from. Strings are printed verbatim into rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureConfig {
    pub proxy_port: String,
    pub inbound_capture_port: String,
    pub inbound_tunnel_port: String,
    pub proxy_uids: Vec<String>,
    pub proxy_gids: Vec<String>,
    pub mode: InterceptionMode,
    pub inbound_ports: InboundPorts,
    pub inbound_ports_exclude: Vec<String>,
    pub exclude_interfaces: Vec<String>,
    pub outbound_ranges_include: IpRanges,
    pub outbound_ranges_exclude: IpRanges,
    pub outbound_ports_include: Vec<String>,
    pub outbound_ports_exclude: Vec<String>,
    pub reroute_virtual_interfaces: Vec<String>,
    pub tproxy_mark: String,
    pub tproxy_route_table: String,
    pub redirect_dns: bool,
    pub capture_all_dns: bool,
    pub dns_servers_v4: Vec<String>,
    pub dns_servers_v6: Vec<String>,
    pub drop_invalid: bool,
    pub owner_groups: OwnerGroups,
    pub loopback_v4: String,
    pub enable_ipv6: bool,
}

impl Default for CaptureConfig {
    fn default() -> Self {
        CaptureConfig {
            proxy_port: "15001".into(),
            inbound_capture_port: "15006".into(),
            inbound_tunnel_port: "15008".into(),
            proxy_uids: vec!["1337".into()],
            proxy_gids: vec!["1337".into()],
            mode: InterceptionMode::Redirect,
            inbound_ports: InboundPorts::None,
            inbound_ports_exclude: Vec::new(),
            exclude_interfaces: Vec::new(),
            outbound_ranges_include: IpRanges::default(),
            outbound_ranges_exclude: IpRanges::default(),
            outbound_ports_include: Vec::new(),
            outbound_ports_exclude: Vec::new(),
            reroute_virtual_interfaces: Vec::new(),
            tproxy_mark: "1337".into(),
            tproxy_route_table: "133".into(),
            redirect_dns: false,
            capture_all_dns: false,
            dns_servers_v4: Vec::new(),
            dns_servers_v6: Vec::new(),
            drop_invalid: false,
            owner_groups: OwnerGroups::default(),
            loopback_v4: DEFAULT_LOOPBACK_V4.into(),
            enable_ipv6: false,
        }
    }
}

impl CaptureConfig {
    /// DNS capture as actually applied: requested, and either capture-all or some server known.
    pub fn effective_redirect_dns(&self) -> bool {
        self.redirect_dns
            && (self.capture_all_dns
                || !self.dns_servers_v4.is_empty()
                || !self.dns_servers_v6.is_empty())
    }

    pub fn is_tproxy(&self) -> bool {
        self.mode == InterceptionMode::Tproxy
    }

    /// Whether TPROXY policy routing (ip rule + local route) is needed.
    pub fn needs_tproxy_routes(&self) -> bool {
        self.is_tproxy() && self.inbound_ports != InboundPorts::None
    }
}

fn m_in(name: &str) -> Match {
    Match::InIface {
        name: name.into(),
        negate: false,
    }
}
fn m_out(name: &str) -> Match {
    Match::OutIface {
        name: name.into(),
        negate: false,
    }
}
fn m_dst(addr: &str, negate: bool) -> Match {
    Match::Dst {
        addr: addr.into(),
        negate,
    }
}
fn m_src(addr: &str) -> Match {
    Match::Src {
        addr: addr.into(),
        negate: false,
    }
}
fn m_dport(port: &str, negate: bool) -> Match {
    Match::DstPort {
        port: port.into(),
        negate,
        module: None,
    }
}
fn m_sport(port: &str) -> Match {
    Match::SrcPort {
        port: port.into(),
        negate: false,
        module: None,
    }
}
fn m_mark(value: &str, negate: bool) -> Match {
    Match::Mark {
        value: value.into(),
        negate,
    }
}
fn jump(chain: &str) -> Target {
    Target::Jump(chain.into())
}

const TCP: Match = Match::Proto(Proto::Tcp);
const UDP: Match = Match::Proto(Proto::Udp);

#[derive(Clone, Copy)]
enum Owner {
    Uid,
    Gid,
}

impl Owner {
    fn matcher(self, id: &str, negate: bool) -> Match {
        match self {
            Owner::Uid => Match::UidOwner {
                id: id.into(),
                negate,
            },
            Owner::Gid => Match::GidOwner {
                id: id.into(),
                negate,
            },
        }
    }
}

/// Builds the sidecar capture rules, in Istio's order.
pub fn build(cfg: &CaptureConfig) -> RuleSet {
    use Table::{Mangle, Nat};
    use chain::*;
    let mut b = RuleSetBuilder::new(cfg.enable_ipv6);
    let tproxy = cfg.is_tproxy();
    let redirect_dns = cfg.effective_redirect_dns();
    let lo4 = cfg.loopback_v4.as_str();

    // 1. Interfaces excluded from capture in both directions.
    for iface in &cfg.exclude_interfaces {
        b.append(Nat, "PREROUTING", vec![m_in(iface)], Target::Return);
        b.append(Nat, "OUTPUT", vec![m_out(iface)], Target::Return);
    }
    if tproxy {
        for iface in &cfg.exclude_interfaces {
            b.append(Mangle, "PREROUTING", vec![m_in(iface)], Target::Return);
            b.append(Mangle, "OUTPUT", vec![m_out(iface)], Target::Return);
        }
    }
    // 2. Virtual interfaces: inbound treated as outbound, so no inbound capture on them.
    for iface in &cfg.reroute_virtual_interfaces {
        b.insert(Nat, "PREROUTING", 1, vec![m_in(iface)], Target::Return);
    }
    // 3. Conntrack-invalid packets.
    if cfg.drop_invalid {
        b.append(
            Mangle,
            "PREROUTING",
            vec![Match::CtState(vec![CtState::Invalid])],
            jump(DROP),
        );
        b.append(Mangle, DROP, vec![], Target::Drop);
    }
    // 4-6. Fixed chains.
    b.append(
        Nat,
        INBOUND,
        vec![TCP, m_dport(&cfg.inbound_tunnel_port, false)],
        Target::Return,
    );
    b.append(
        Nat,
        REDIRECT,
        vec![TCP],
        Target::Redirect {
            port: cfg.proxy_port.clone(),
            plural: true,
        },
    );
    b.append(
        Nat,
        IN_REDIRECT,
        vec![TCP],
        Target::Redirect {
            port: cfg.inbound_capture_port.clone(),
            plural: true,
        },
    );

    // 7. Inbound.
    let inbound_table = if tproxy { Mangle } else { Nat };
    if cfg.inbound_ports != InboundPorts::None {
        if tproxy {
            b.append(
                Mangle,
                DIVERT,
                vec![],
                Target::SetMark(cfg.tproxy_mark.clone()),
            );
            b.append(Mangle, DIVERT, vec![], Target::Accept);
            let tproxy_target = Target::Tproxy {
                mark: format!("{}/0xffffffff", cfg.tproxy_mark),
                port: cfg.inbound_capture_port.clone(),
            };
            b.append_versioned(Mangle, TPROXY, lo4, LOOPBACK_V6, |lo| {
                (vec![m_dst(lo, true), TCP], tproxy_target.clone())
            });
        }
        b.append(inbound_table, "PREROUTING", vec![TCP], jump(INBOUND));
        let established = || Match::CtState(vec![CtState::Related, CtState::Established]);
        match &cfg.inbound_ports {
            InboundPorts::All => {
                for port in &cfg.inbound_ports_exclude {
                    b.append(
                        inbound_table,
                        INBOUND,
                        vec![TCP, m_dport(port, false)],
                        Target::Return,
                    );
                }
                if tproxy {
                    b.append(Mangle, INBOUND, vec![TCP, established()], jump(DIVERT));
                    b.append(Mangle, INBOUND, vec![TCP], jump(TPROXY));
                } else {
                    b.append(Nat, INBOUND, vec![TCP], jump(IN_REDIRECT));
                }
            }
            InboundPorts::List(ports) => {
                for port in ports {
                    if tproxy {
                        b.append(
                            Mangle,
                            INBOUND,
                            vec![TCP, m_dport(port, false), established()],
                            jump(DIVERT),
                        );
                        b.append(
                            Mangle,
                            INBOUND,
                            vec![TCP, m_dport(port, false)],
                            jump(TPROXY),
                        );
                    } else {
                        b.append(
                            Nat,
                            INBOUND,
                            vec![TCP, m_dport(port, false)],
                            jump(IN_REDIRECT),
                        );
                    }
                }
            }
            InboundPorts::None => {}
        }
    }

    // 8-9. Outbound dispatch and excluded outbound ports.
    b.append(Nat, "OUTPUT", vec![], jump(OUTPUT));
    for port in &cfg.outbound_ports_exclude {
        b.append(Nat, OUTPUT, vec![TCP, m_dport(port, false)], Target::Return);
        b.append(Nat, OUTPUT, vec![UDP, m_dport(port, false)], Target::Return);
    }
    // 10. Inbound passthrough traffic from the sidecar itself.
    b.append_versioned(
        Nat,
        OUTPUT,
        INBOUND_PASSTHROUGH_V4,
        INBOUND_PASSTHROUGH_V6,
        |src| (vec![m_out("lo"), m_src(src)], Target::Return),
    );
    // 11-12. Proxy-owned traffic.
    let include = &cfg.outbound_ranges_include;
    let loopback_included = include.has_loopback_v4 || include.has_loopback_v6;
    for (owner, ids) in [(Owner::Uid, &cfg.proxy_uids), (Owner::Gid, &cfg.proxy_gids)] {
        for id in ids {
            let dns_form = redirect_dns && matches!(owner, Owner::Uid);
            b.append_versioned(Nat, OUTPUT, lo4, LOOPBACK_V6, |lo| {
                let port_match = if dns_form {
                    Match::DstPorts {
                        ports: vec!["53".into(), cfg.inbound_tunnel_port.clone()],
                        negate: true,
                    }
                } else {
                    m_dport(&cfg.inbound_tunnel_port, true)
                };
                (
                    vec![
                        m_out("lo"),
                        m_dst(lo, true),
                        TCP,
                        port_match,
                        owner.matcher(id, false),
                    ],
                    jump(IN_REDIRECT),
                )
            });
            if !loopback_included {
                let mut matches = vec![m_out("lo")];
                if redirect_dns {
                    matches.extend([TCP, m_dport("53", true)]);
                }
                matches.push(owner.matcher(id, true));
                b.append(Nat, OUTPUT, matches, Target::Return);
            }
            b.append(Nat, OUTPUT, vec![owner.matcher(id, false)], Target::Return);
        }
    }
    // 13. Owner groups.
    match &cfg.owner_groups {
        OwnerGroups::AllExcept(groups) => {
            for g in groups {
                b.append(
                    Nat,
                    OUTPUT,
                    vec![Owner::Gid.matcher(g, false)],
                    Target::Return,
                );
            }
        }
        OwnerGroups::Only(groups) => {
            let matches = groups.iter().map(|g| Owner::Gid.matcher(g, true)).collect();
            b.append(Nat, OUTPUT, matches, Target::Return);
        }
    }
    // 14. DNS.
    if redirect_dns {
        build_dns(&mut b, cfg);
    }
    // 15. Loopback destinations are never captured.
    b.append_versioned(Nat, OUTPUT, lo4, LOOPBACK_V6, |lo| {
        (vec![m_dst(lo, false)], Target::Return)
    });
    // 16. Excluded destinations.
    for family in Family::ALL {
        for cidr in cfg.outbound_ranges_exclude.family(family) {
            b.append_to(
                family,
                Nat,
                OUTPUT,
                vec![m_dst(cidr, false)],
                Target::Return,
            );
        }
    }
    // 17. Outbound ports always captured.
    for port in &cfg.outbound_ports_include {
        b.append(Nat, OUTPUT, vec![TCP, m_dport(port, false)], jump(REDIRECT));
    }
    // 18. Captured destinations.
    for family in Family::ALL {
        if include.wildcard {
            b.append_to(family, Nat, OUTPUT, vec![], jump(REDIRECT));
            for iface in &cfg.reroute_virtual_interfaces {
                b.insert_to(
                    family,
                    Nat,
                    "PREROUTING",
                    1,
                    vec![m_in(iface)],
                    jump(REDIRECT),
                );
            }
        } else {
            for cidr in include.family(family) {
                for iface in &cfg.reroute_virtual_interfaces {
                    b.insert_to(
                        family,
                        Nat,
                        "PREROUTING",
                        1,
                        vec![m_in(iface), m_dst(cidr, false)],
                        jump(REDIRECT),
                    );
                }
                b.append_to(
                    family,
                    Nat,
                    OUTPUT,
                    vec![m_dst(cidr, false)],
                    jump(REDIRECT),
                );
            }
        }
    }
    // 19. TPROXY marks and loop prevention.
    if tproxy {
        let mark = cfg.tproxy_mark.as_str();
        b.append(
            Mangle,
            "PREROUTING",
            vec![TCP, m_mark(mark, false)],
            Target::ConnmarkSave,
        );
        b.append(
            Mangle,
            "OUTPUT",
            vec![TCP, m_out("lo"), m_mark(mark, false)],
            Target::Return,
        );
        for (owner, ids) in [(Owner::Uid, &cfg.proxy_uids), (Owner::Gid, &cfg.proxy_gids)] {
            for id in ids {
                b.append_versioned(Mangle, "OUTPUT", lo4, LOOPBACK_V6, |lo| {
                    (
                        vec![m_dst(lo, true), TCP, m_out("lo"), owner.matcher(id, false)],
                        Target::SetMark(OUTBOUND_MARK.into()),
                    )
                });
            }
        }
        b.append(
            Mangle,
            "OUTPUT",
            vec![TCP, Match::ConnMark { value: mark.into() }],
            Target::ConnmarkRestore { masks: false },
        );
        b.insert(
            Mangle,
            INBOUND,
            1,
            vec![TCP, m_mark(mark, false)],
            Target::Return,
        );
        b.insert_to(
            Family::V4,
            Mangle,
            INBOUND,
            2,
            vec![TCP, m_src(INBOUND_PASSTHROUGH_V4), m_in("lo")],
            Target::Return,
        );
        b.insert_to(
            Family::V6,
            Mangle,
            INBOUND,
            2,
            vec![TCP, m_src(INBOUND_PASSTHROUGH_V6), m_in("lo")],
            Target::Return,
        );
        b.insert(
            Mangle,
            INBOUND,
            3,
            vec![TCP, m_in("lo"), m_mark(OUTBOUND_MARK, true)],
            Target::Return,
        );
    }
    b.build()
}

/// Every `(table, chain)` user chain the sidecar builder can create, in either family: derived
/// from the builder itself run with every feature on, so cleanup and drift checks only ever touch
/// chains this rule model owns (a user's `ISTIO_FW` in filter is not one of them).
pub fn owned_chains() -> BTreeSet<(Table, String)> {
    let mut owned = BTreeSet::new();
    for mode in [InterceptionMode::Redirect, InterceptionMode::Tproxy] {
        let everything = CaptureConfig {
            mode,
            inbound_ports: InboundPorts::All,
            redirect_dns: true,
            capture_all_dns: true,
            drop_invalid: true,
            enable_ipv6: true,
            ..Default::default()
        };
        let rules = build(&everything);
        for rule in rules.v4.iter().chain(&rules.v6) {
            let targets = std::iter::once(rule.chain.as_str()).chain(rule.target.jump_chain());
            for chain in targets.filter(|c| !is_builtin_chain(c)) {
                owned.insert((rule.table, chain.to_string()));
            }
        }
    }
    owned
}

/// The same configuration in the other interception mode (REDIRECT ↔ TPROXY): what a reconcile
/// after a mode change must also take out of the built-in chains.
pub fn other_mode(cfg: &CaptureConfig) -> RuleSet {
    let mode = match cfg.mode {
        InterceptionMode::Redirect => InterceptionMode::Tproxy,
        InterceptionMode::Tproxy => InterceptionMode::Redirect,
    };
    build(&CaptureConfig {
        mode,
        ..cfg.clone()
    })
}

/// Whether `chain` in `table` (by name, as `iptables-save` prints it) is one [`owned_chains`] lists.
pub fn is_owned_chain(owned: &BTreeSet<(Table, String)>, table: &str, chain: &str) -> bool {
    owned.iter().any(|(t, c)| t.name() == table && c == chain)
}

fn build_dns(b: &mut RuleSetBuilder, cfg: &CaptureConfig) {
    use Table::{Nat, Raw};
    use chain::*;
    let all = cfg.capture_all_dns;
    let servers = |family: Family| match family {
        Family::V4 => &cfg.dns_servers_v4,
        Family::V6 => &cfg.dns_servers_v6,
    };
    let host = |family: Family, server: &str| match family {
        Family::V4 => format!("{server}/32"),
        Family::V6 => format!("{server}/128"),
    };
    let redirect = |plural| Target::Redirect {
        port: DNS_PROXY_PORT.into(),
        plural,
    };

    b.append(Raw, "OUTPUT", vec![], jump(OUTPUT_DNS));
    for family in Family::ALL {
        if all || !servers(family).is_empty() {
            b.append_to(family, Nat, OUTPUT, vec![], jump(OUTPUT_DNS));
        }
    }
    for (proto, plural) in [(TCP, true), (UDP, false)] {
        if all {
            b.append(
                Nat,
                OUTPUT_DNS,
                vec![proto.clone(), m_dport("53", false)],
                redirect(plural),
            );
        } else {
            for family in Family::ALL {
                for s in servers(family) {
                    b.append_to(
                        family,
                        Nat,
                        OUTPUT_DNS,
                        vec![
                            proto.clone(),
                            m_dport("53", false),
                            m_dst(&host(family, s), false),
                        ],
                        redirect(plural),
                    );
                }
            }
        }
    }
    for (owner, ids) in [(Owner::Uid, &cfg.proxy_uids), (Owner::Gid, &cfg.proxy_gids)] {
        for id in ids {
            b.append(
                Raw,
                OUTPUT_DNS,
                vec![UDP, m_dport("53", false), owner.matcher(id, false)],
                Target::CtZone(1),
            );
            b.append(
                Raw,
                OUTPUT_DNS,
                vec![UDP, m_sport(DNS_PROXY_PORT), owner.matcher(id, false)],
                Target::CtZone(2),
            );
        }
    }
    if all {
        b.append(Raw, "PREROUTING", vec![], jump(INBOUND));
        b.append(
            Raw,
            OUTPUT_DNS,
            vec![UDP, m_dport("53", false)],
            Target::CtZone(2),
        );
        b.append(Raw, INBOUND, vec![UDP, m_sport("53")], Target::CtZone(1));
    } else {
        for family in Family::ALL {
            if servers(family).is_empty() {
                continue;
            }
            b.append_to(family, Raw, "PREROUTING", vec![], jump(INBOUND));
            for s in servers(family) {
                let h = host(family, s);
                b.append_to(
                    family,
                    Raw,
                    OUTPUT_DNS,
                    vec![UDP, m_dport("53", false), m_dst(&h, false)],
                    Target::CtZone(2),
                );
                b.append_to(
                    family,
                    Raw,
                    INBOUND,
                    vec![UDP, m_sport("53"), m_src(&h)],
                    Target::CtZone(1),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_keep_host_bits_and_split_families() {
        let r = IpRanges::parse("10.1.2.3/8,,2001:DB8::/32,127.0.0.2").unwrap();
        assert_eq!(r.v4, vec!["10.1.2.3/8", "127.0.0.2/32"]);
        assert_eq!(r.v6, vec!["2001:db8::/32"]);
        assert!(r.has_loopback_v4 && !r.has_loopback_v6);
    }

    #[test]
    fn lists_are_trimmed_and_empty_items_dropped() {
        assert_eq!(
            split_list(" 15090,15021 ,\t8080, 9090,, ,"),
            vec!["15090", "15021", "8080", "9090"]
        );
        assert!(split_list(" ").is_empty());
        let r = IpRanges::parse("10.0.0.0/8, fd00::/8").unwrap();
        assert_eq!(
            (r.v4, r.v6),
            (vec!["10.0.0.0/8".into()], vec!["fd00::/8".into()])
        );
    }

    #[test]
    fn ranges_reject_garbage_naming_the_value() {
        let e = IpRanges::parse("10.0.0.0/8,nope/3").unwrap_err();
        assert_eq!(e.value, "nope/3");
        assert!(IpRanges::parse("10.0.0.0/33").is_err());
    }

    #[test]
    fn owned_chains_are_exactly_the_ones_the_builder_creates() {
        let owned = owned_chains();
        let names: Vec<String> = owned.iter().map(|(t, c)| format!("{t}/{c}")).collect();
        assert_eq!(
            names,
            [
                "mangle/ISTIO_DIVERT",
                "mangle/ISTIO_DROP",
                "mangle/ISTIO_INBOUND",
                "mangle/ISTIO_TPROXY",
                "nat/ISTIO_INBOUND",
                "nat/ISTIO_IN_REDIRECT",
                "nat/ISTIO_OUTPUT",
                "nat/ISTIO_OUTPUT_DNS",
                "nat/ISTIO_REDIRECT",
                "raw/ISTIO_INBOUND",
                "raw/ISTIO_OUTPUT_DNS",
            ]
        );
        assert!(!is_owned_chain(&owned, "filter", "ISTIO_FW"));
        assert!(!is_owned_chain(&owned, "filter", "ISTIO_OUTPUT"));
        assert!(is_owned_chain(&owned, "nat", "ISTIO_OUTPUT"));
    }

    #[test]
    fn dns_without_servers_is_disabled() {
        let cfg = CaptureConfig {
            redirect_dns: true,
            ..Default::default()
        };
        assert!(!cfg.effective_redirect_dns());
    }
}
