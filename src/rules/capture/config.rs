//! The typed sidecar capture config both backends read, the values it prints verbatim into rules,
//! and the parsing of its range and port lists.

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

    /// Whether TPROXY policy routing (ip rule + local route) is needed.
    pub fn needs_tproxy_routes(&self) -> bool {
        self.is_tproxy() && self.inbound_ports != InboundPorts::None
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
    fn dns_without_servers_is_disabled() {
        let cfg = CaptureConfig {
            redirect_dns: true,
            ..Default::default()
        };
        assert!(!cfg.effective_redirect_dns());
    }
}
