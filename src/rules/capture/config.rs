//! The typed sidecar capture config both backends read, the values it prints verbatim into rules,
//! and the parsing of its range and port lists.

use std::borrow::Cow;
use std::collections::HashSet;
use std::net::IpAddr;

use ipnet::IpNet;

use super::super::model::Family;

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

    pub(super) fn family(&self, family: Family) -> &[String] {
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

    /// This configuration with every list's repeated items dropped (the first kept, the order
    /// otherwise as written): a second copy of a port, range, interface, uid, gid or server only
    /// adds a rule that the first copy's rule already decides. Borrowed when nothing repeats.
    /// Both capture builders start here, so the rules applied, verified and printed agree.
    pub fn without_repeats(&self) -> Cow<'_, CaptureConfig> {
        let mut repeats = false;
        self.each_list(&mut |list| repeats |= has_repeats(list));
        if !repeats {
            return Cow::Borrowed(self);
        }
        let mut cfg = self.clone();
        cfg.each_list_mut(&mut drop_repeats);
        Cow::Owned(cfg)
    }

    fn each_list(&self, f: &mut dyn FnMut(&[String])) {
        for list in [
            &self.proxy_uids,
            &self.proxy_gids,
            &self.inbound_ports_exclude,
            &self.exclude_interfaces,
            &self.outbound_ranges_include.v4,
            &self.outbound_ranges_include.v6,
            &self.outbound_ranges_exclude.v4,
            &self.outbound_ranges_exclude.v6,
            &self.outbound_ports_include,
            &self.outbound_ports_exclude,
            &self.reroute_virtual_interfaces,
            &self.dns_servers_v4,
            &self.dns_servers_v6,
        ] {
            f(list);
        }
        if let InboundPorts::List(ports) = &self.inbound_ports {
            f(ports);
        }
        match &self.owner_groups {
            OwnerGroups::AllExcept(groups) | OwnerGroups::Only(groups) => f(groups),
        }
    }

    fn each_list_mut(&mut self, f: &mut dyn FnMut(&mut Vec<String>)) {
        for list in [
            &mut self.proxy_uids,
            &mut self.proxy_gids,
            &mut self.inbound_ports_exclude,
            &mut self.exclude_interfaces,
            &mut self.outbound_ranges_include.v4,
            &mut self.outbound_ranges_include.v6,
            &mut self.outbound_ranges_exclude.v4,
            &mut self.outbound_ranges_exclude.v6,
            &mut self.outbound_ports_include,
            &mut self.outbound_ports_exclude,
            &mut self.reroute_virtual_interfaces,
            &mut self.dns_servers_v4,
            &mut self.dns_servers_v6,
        ] {
            f(list);
        }
        if let InboundPorts::List(ports) = &mut self.inbound_ports {
            f(ports);
        }
        match &mut self.owner_groups {
            OwnerGroups::AllExcept(groups) | OwnerGroups::Only(groups) => f(groups),
        }
    }

    /// Whether TPROXY policy routing (ip rule + local route) is needed.
    pub fn needs_tproxy_routes(&self) -> bool {
        self.is_tproxy() && self.inbound_ports != InboundPorts::None
    }
}

fn has_repeats(list: &[String]) -> bool {
    let mut seen = HashSet::with_capacity(list.len());
    !list.iter().all(|item| seen.insert(item.as_str()))
}

fn drop_repeats(list: &mut Vec<String>) {
    let mut seen = HashSet::with_capacity(list.len());
    list.retain(|item| seen.insert(item.clone()));
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
    fn dns_without_servers_is_disabled() {
        let cfg = CaptureConfig {
            redirect_dns: true,
            ..Default::default()
        };
        assert!(!cfg.effective_redirect_dns());
    }
}

#[cfg(test)]
mod repeat_tests {
    use super::*;

    #[test]
    fn repeated_items_collapse_to_the_first_in_every_list() {
        let cfg = CaptureConfig {
            outbound_ports_exclude: vec!["80".into(), "81".into(), "80".into()],
            inbound_ports: InboundPorts::List(vec!["9".into(), "9".into()]),
            outbound_ranges_exclude: IpRanges::parse("10.0.0.1,10.0.0.1/32,10.0.0.0/8").unwrap(),
            proxy_uids: vec!["1337".into(), "1337".into()],
            owner_groups: OwnerGroups::Only(vec!["a".into(), "a".into()]),
            ..Default::default()
        };
        let unique = cfg.without_repeats();
        assert_eq!(unique.outbound_ports_exclude, ["80", "81"]);
        assert_eq!(unique.inbound_ports, InboundPorts::List(vec!["9".into()]));
        assert_eq!(
            unique.outbound_ranges_exclude.v4,
            ["10.0.0.1/32", "10.0.0.0/8"]
        );
        assert_eq!(unique.proxy_uids, ["1337"]);
        assert_eq!(unique.owner_groups, OwnerGroups::Only(vec!["a".into()]));
        assert!(matches!(
            CaptureConfig::default().without_repeats(),
            Cow::Borrowed(_)
        ));
    }

    /// A port listed 50,000 times is one rule in both backends, as a port listed once.
    #[test]
    fn a_repeated_port_builds_the_rules_of_one() {
        let ports = |n: usize| CaptureConfig {
            outbound_ports_exclude: vec!["80".to_string(); n],
            ..Default::default()
        };
        assert_eq!(
            super::super::build(&ports(50_000)),
            super::super::build(&ports(1))
        );
        assert_eq!(
            crate::rules::nft_capture::build(&ports(50_000)),
            crate::rules::nft_capture::build(&ports(1))
        );
    }
}
