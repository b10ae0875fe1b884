//! The values of a [`CaptureConfig`] that reach the kernel, checked as one class before anything
//! is touched: ports, UIDs/GIDs, owner groups, interface names, the TPROXY mark and route table,
//! the loopback CIDR and DNS servers. Istio passes most of these verbatim and lets iptables or
//! `ip rule` fail half-way (or, for a reserved route table, succeed and break the pod); here a bad
//! value is refused with its field and value, by every role that builds a capture config.

use std::fmt;
use std::net::IpAddr;

use super::capture::{CaptureConfig, InboundPorts, OUTBOUND_MARK, OwnerGroups};

/// Which capture setting a value belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    ProxyPort,
    InboundCapturePort,
    InboundTunnelPort,
    ProxyUids,
    ProxyGids,
    InboundPorts,
    InboundPortsExclude,
    ExcludeInterfaces,
    OutboundPortsInclude,
    OutboundPortsExclude,
    RerouteVirtualInterfaces,
    TproxyMark,
    TproxyRouteTable,
    OwnerGroupsInclude,
    OwnerGroupsExclude,
    LoopbackV4,
    DnsServers,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Field::ProxyPort => "proxy port",
            Field::InboundCapturePort => "inbound capture port",
            Field::InboundTunnelPort => "inbound tunnel port",
            Field::ProxyUids => "proxy UID",
            Field::ProxyGids => "proxy GID",
            Field::InboundPorts => "inbound port",
            Field::InboundPortsExclude => "excluded inbound port",
            Field::ExcludeInterfaces => "excluded interface",
            Field::OutboundPortsInclude => "captured outbound port",
            Field::OutboundPortsExclude => "excluded outbound port",
            Field::RerouteVirtualInterfaces => "virtual interface",
            Field::TproxyMark => "TPROXY mark",
            Field::TproxyRouteTable => "TPROXY route table",
            Field::OwnerGroupsInclude => "captured owner group",
            Field::OwnerGroupsExclude => "excluded owner group",
            Field::LoopbackV4 => "IPv4 loopback CIDR",
            Field::DnsServers => "DNS server",
        })
    }
}

/// A capture value that must not reach the kernel.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field} {value:?}: {reason}")]
pub struct InvalidValue {
    pub field: Field,
    pub value: String,
    pub reason: &'static str,
}

fn digits(value: &str) -> Option<u64> {
    if value.is_empty() || value.len() > 10 || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok()
}

/// A TCP/UDP port: decimal 1..=65535.
pub fn parse_port(value: &str) -> Result<u16, &'static str> {
    match digits(value) {
        Some(p @ 1..=65535) => Ok(p as u16),
        _ => Err("not a port number between 1 and 65535"),
    }
}

/// A packet mark: decimal or `0x` hex, 32 bits, neither 0 (which every unmarked packet carries,
/// so `ip rule fwmark 0` would catch all traffic) nor the mark of the proxy's own outbound
/// loopback traffic.
pub fn parse_tproxy_mark(value: &str) -> Result<u32, &'static str> {
    let parsed = match value.strip_prefix("0x") {
        Some(hex) if !hex.is_empty() && hex.len() <= 8 => u32::from_str_radix(hex, 16).ok(),
        Some(_) => None,
        None => digits(value).and_then(|v| u32::try_from(v).ok()),
    };
    match parsed {
        None => Err("not a 32-bit mark (decimal or 0x hex)"),
        Some(0) => Err("mark 0 is carried by every unmarked packet"),
        Some(m) if m.to_string() == OUTBOUND_MARK => {
            Err("1338 is the mark of the proxy's own outbound traffic")
        }
        Some(m) => Ok(m),
    }
}

/// A policy-routing table for TPROXY: a decimal number, not one of the kernel's reserved tables
/// (a local default route there would send all of the pod's traffic to loopback).
pub fn parse_route_table(value: &str) -> Result<u32, &'static str> {
    match digits(value).and_then(|v| u32::try_from(v).ok()) {
        None => Err("not a routing table number (decimal; names such as main are not accepted)"),
        Some(0) => Err("table 0 (unspec) is reserved"),
        Some(253) => Err("table 253 (default) is reserved"),
        Some(254) => Err("table 254 (main) is the pod's main routing table"),
        Some(255) => Err("table 255 (local) is reserved"),
        Some(t) => Ok(t),
    }
}

/// A numeric UID or GID (`-m owner`); 4294967295 is `(uid_t)-1`, never a real owner.
pub fn parse_owner_id(value: &str) -> Result<u32, &'static str> {
    match digits(value).and_then(|v| u32::try_from(v).ok()) {
        Some(id) if id != u32::MAX => Ok(id),
        _ => Err("not a numeric ID between 0 and 4294967294"),
    }
}

/// An owner group: a numeric GID or a group name (resolved by iptables/nft).
pub fn check_group(value: &str) -> Result<(), &'static str> {
    if digits(value).is_some() {
        return parse_owner_id(value).map(|_| ());
    }
    let name = value.strip_suffix('$').unwrap_or(value);
    let valid = !name.is_empty()
        && value.len() <= 32
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if valid {
        Ok(())
    } else {
        Err("not a GID or group name (letters, digits, _ . -, at most 32 characters)")
    }
}

/// An interface name as the kernel accepts it (at most 15 bytes, no `/`, `:` or whitespace, not
/// `.` or `..`), restricted further to letters, digits and `_ . -` so that no value can be read
/// as another iptables argument; iptables' trailing `+` wildcard is allowed.
pub fn check_interface(value: &str) -> Result<(), &'static str> {
    let name = value.strip_suffix('+').unwrap_or(value);
    if name.is_empty() {
        return Err("empty interface name");
    }
    if value.len() > 15 {
        return Err("interface names are at most 15 characters");
    }
    if name == "." || name == ".." || name.starts_with('-') {
        return Err("not an interface name");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
    {
        return Err("interface names may contain only letters, digits, '_', '.' and '-'");
    }
    Ok(())
}

/// `ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR`: an IPv4 loopback prefix, length 8..=32 (as Istio checks).
pub fn check_loopback_v4(value: &str) -> Result<(), &'static str> {
    let (addr, bits) = value.split_once('/').ok_or("not a CIDR")?;
    let addr: std::net::Ipv4Addr = addr.parse().map_err(|_| "not an IPv4 CIDR")?;
    let bits: u8 = bits.parse().map_err(|_| "prefix length is not a number")?;
    if !addr.is_loopback() {
        return Err("not a loopback address");
    }
    if !(8..=32).contains(&bits) {
        return Err("prefix length must be between 8 and 32");
    }
    Ok(())
}

fn each<'a>(
    field: Field,
    values: impl IntoIterator<Item = &'a String>,
    check: impl Fn(&str) -> Result<(), &'static str>,
) -> Result<(), InvalidValue> {
    for value in values {
        check(value).map_err(|reason| InvalidValue {
            field,
            value: value.clone(),
            reason,
        })?;
    }
    Ok(())
}

fn port(v: &str) -> Result<(), &'static str> {
    parse_port(v).map(|_| ())
}

fn owner_id(v: &str) -> Result<(), &'static str> {
    parse_owner_id(v).map(|_| ())
}

impl CaptureConfig {
    /// Checks every value that reaches the kernel; the first bad one is returned.
    pub fn validate(&self) -> Result<(), InvalidValue> {
        use std::iter::once;
        each(Field::ProxyPort, once(&self.proxy_port), port)?;
        each(
            Field::InboundCapturePort,
            once(&self.inbound_capture_port),
            port,
        )?;
        each(
            Field::InboundTunnelPort,
            once(&self.inbound_tunnel_port),
            port,
        )?;
        each(Field::ProxyUids, &self.proxy_uids, owner_id)?;
        each(Field::ProxyGids, &self.proxy_gids, owner_id)?;
        if let InboundPorts::List(ports) = &self.inbound_ports {
            each(Field::InboundPorts, ports, port)?;
        }
        each(
            Field::InboundPortsExclude,
            &self.inbound_ports_exclude,
            port,
        )?;
        each(
            Field::OutboundPortsInclude,
            &self.outbound_ports_include,
            port,
        )?;
        each(
            Field::OutboundPortsExclude,
            &self.outbound_ports_exclude,
            port,
        )?;
        each(
            Field::ExcludeInterfaces,
            &self.exclude_interfaces,
            check_interface,
        )?;
        each(
            Field::RerouteVirtualInterfaces,
            &self.reroute_virtual_interfaces,
            check_interface,
        )?;
        each(Field::TproxyMark, once(&self.tproxy_mark), |v| {
            parse_tproxy_mark(v).map(|_| ())
        })?;
        each(
            Field::TproxyRouteTable,
            once(&self.tproxy_route_table),
            |v| parse_route_table(v).map(|_| ()),
        )?;
        match &self.owner_groups {
            OwnerGroups::AllExcept(groups) => each(Field::OwnerGroupsExclude, groups, check_group)?,
            OwnerGroups::Only(groups) => each(Field::OwnerGroupsInclude, groups, check_group)?,
        }
        each(
            Field::LoopbackV4,
            once(&self.loopback_v4),
            check_loopback_v4,
        )?;
        each(Field::DnsServers, &self.dns_servers_v4, |v| {
            match v.parse::<IpAddr>() {
                Ok(IpAddr::V4(_)) => Ok(()),
                _ => Err("not an IPv4 address"),
            }
        })?;
        each(Field::DnsServers, &self.dns_servers_v6, |v| {
            match v.parse::<IpAddr>() {
                Ok(IpAddr::V6(_)) => Ok(()),
                _ => Err("not an IPv6 address"),
            }
        })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_decimal_1_to_65535() {
        assert_eq!(parse_port("15001"), Ok(15001));
        for bad in ["0", "65536", "", "+80", " 80", "0x50", "99999999999", "-1"] {
            assert!(parse_port(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn reserved_and_named_route_tables_are_refused() {
        assert_eq!(parse_route_table("133"), Ok(133));
        assert_eq!(parse_route_table("252"), Ok(252));
        assert_eq!(parse_route_table("256"), Ok(256));
        for bad in [
            "0",
            "253",
            "254",
            "255",
            "main",
            "local",
            "",
            "-1",
            "4294967296",
        ] {
            assert!(parse_route_table(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn marks_are_nonzero_and_not_the_outbound_mark() {
        assert_eq!(parse_tproxy_mark("1337"), Ok(1337));
        assert_eq!(parse_tproxy_mark("0x539"), Ok(1337));
        for bad in [
            "0",
            "0x0",
            "1338",
            "0x",
            "x",
            "",
            "4294967296",
            "0x123456789",
        ] {
            assert!(parse_tproxy_mark(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn owners_interfaces_and_groups() {
        assert!(parse_owner_id("1337").is_ok() && parse_owner_id("0").is_ok());
        for bad in ["istio-proxy", "", "-1", "4294967295", "1 2"] {
            assert!(parse_owner_id(bad).is_err(), "{bad:?}");
        }
        for good in ["eth0", "veth_a.1", "eth+", "abcdefghijklmno"] {
            assert!(check_interface(good).is_ok(), "{good:?}");
        }
        for bad in [
            "",
            "+",
            "abcdefghijklmnop",
            "a/b",
            "a b",
            "..",
            "-i",
            "a:1",
            "a\"b",
        ] {
            assert!(check_interface(bad).is_err(), "{bad:?}");
        }
        for good in ["java", "202", "ftp-users", "svc$"] {
            assert!(check_group(good).is_ok(), "{good:?}");
        }
        for bad in ["", "a b", "-x", "a/b", "4294967295"] {
            assert!(check_group(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn validate_names_the_field_and_the_value() {
        assert_eq!(CaptureConfig::default().validate(), Ok(()));
        let cfg = CaptureConfig {
            tproxy_route_table: "254".into(),
            ..Default::default()
        };
        let e = cfg.validate().unwrap_err();
        assert_eq!(
            (e.field, e.value.as_str()),
            (Field::TproxyRouteTable, "254")
        );
        assert!(e.to_string().contains("TPROXY route table \"254\""), "{e}");
        let cfg = CaptureConfig {
            outbound_ports_exclude: vec!["80".into(), "0".into()],
            ..Default::default()
        };
        assert_eq!(cfg.validate().unwrap_err().value, "0");
        let cfg = CaptureConfig {
            proxy_gids: vec!["root".into()],
            ..Default::default()
        };
        assert_eq!(cfg.validate().unwrap_err().field, Field::ProxyGids);
        let cfg = CaptureConfig {
            dns_servers_v4: vec!["::1".into()],
            ..Default::default()
        };
        assert_eq!(cfg.validate().unwrap_err().field, Field::DnsServers);
    }
}
