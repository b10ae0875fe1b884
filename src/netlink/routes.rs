//! rtnetlink requests over a synchronous netlink socket, opened in the calling thread's network
//! namespace: the `::6/128` address on `lo`, and TPROXY policy routing.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST, NetlinkHeader,
    NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::address::{AddressAttribute, AddressMessage, AddressScope};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

use crate::rules::capture::CaptureConfig;
use crate::rules::capture_values::{parse_route_table, parse_tproxy_mark};

/// A netlink request failed.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error("netlink socket: {0}")]
    Socket(std::io::Error),
    #[error("{what}: {source}")]
    Request {
        what: String,
        source: std::io::Error,
    },
    #[error("interface {0} not found")]
    NoInterface(String),
    #[error("invalid {what} {value:?}: not a number")]
    Number { what: &'static str, value: String },
}

fn request(msg: RouteNetlinkMessage, flags: u16, what: &str) -> Result<(), NetlinkError> {
    let mut socket = Socket::new(NETLINK_ROUTE).map_err(NetlinkError::Socket)?;
    socket.bind_auto().map_err(NetlinkError::Socket)?;
    socket
        .connect(&SocketAddr::new(0, 0))
        .map_err(NetlinkError::Socket)?;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
    let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(msg));
    packet.finalize();
    let mut buf = vec![0u8; packet.buffer_len()];
    packet.serialize(&mut buf);
    socket
        .send(&buf, 0)
        .map_err(|source| NetlinkError::Request {
            what: what.to_string(),
            source,
        })?;
    let mut reply = vec![0u8; 8192];
    loop {
        let n = socket
            .recv(&mut &mut reply[..], 0)
            .map_err(|source| NetlinkError::Request {
                what: what.to_string(),
                source,
            })?;
        let msg = <NetlinkMessage<RouteNetlinkMessage>>::deserialize(&reply[..n]).map_err(|e| {
            NetlinkError::Request {
                what: what.to_string(),
                source: std::io::Error::other(e.to_string()),
            }
        })?;
        match msg.payload {
            NetlinkPayload::Error(e) if e.code.is_some() => {
                return Err(NetlinkError::Request {
                    what: what.to_string(),
                    source: e.to_io(),
                });
            }
            NetlinkPayload::Error(_) | NetlinkPayload::Done(_) => return Ok(()),
            _ => continue,
        }
    }
}

fn ignore_exists(result: Result<(), NetlinkError>) -> Result<(), NetlinkError> {
    match result {
        Err(NetlinkError::Request { source, .. })
            if source.raw_os_error() == Some(libc::EEXIST) =>
        {
            Ok(())
        }
        other => other,
    }
}

fn interface_index(name: &str) -> Result<u32, NetlinkError> {
    nix::net::if_::if_nametoindex(name).map_err(|_| NetlinkError::NoInterface(name.to_string()))
}

/// Adds an address to an interface; an existing one is fine.
pub fn add_address(iface: &str, addr: IpAddr, prefix_len: u8) -> Result<(), NetlinkError> {
    let mut msg = AddressMessage::default();
    msg.header.family = if addr.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    msg.header.prefix_len = prefix_len;
    msg.header.scope = AddressScope::Universe;
    msg.header.index = interface_index(iface)?;
    msg.attributes = vec![
        AddressAttribute::Local(addr),
        AddressAttribute::Address(addr),
    ];
    ignore_exists(request(
        RouteNetlinkMessage::NewAddress(msg),
        NLM_F_CREATE | NLM_F_EXCL,
        &format!("add address {addr}/{prefix_len} to {iface}"),
    ))
}

fn fwmark_rule(
    ipv6: bool,
    mark: u32,
    mask: Option<u32>,
    priority: Option<u32>,
    table: u32,
) -> RuleMessage {
    let mut msg = RuleMessage::default();
    msg.header.family = if ipv6 {
        AddressFamily::Inet6
    } else {
        AddressFamily::Inet
    };
    msg.header.action = RuleAction::ToTable;
    msg.header.table = if table < 256 { table as u8 } else { 0 };
    msg.attributes = vec![RuleAttribute::FwMark(mark), RuleAttribute::Table(table)];
    if let Some(mask) = mask {
        msg.attributes.push(RuleAttribute::FwMask(mask));
    }
    if let Some(p) = priority {
        msg.attributes.push(RuleAttribute::Priority(p));
    }
    msg
}

/// Makes sure exactly one `ip rule fwmark MARK[/MASK] [pref PRIO] lookup TABLE` exists for one
/// family. Without a priority the kernel would add a duplicate on every run, so earlier copies are
/// deleted first.
pub fn ensure_fwmark_rule(
    ipv6: bool,
    mark: u32,
    mask: Option<u32>,
    priority: Option<u32>,
    table: u32,
) -> Result<(), NetlinkError> {
    let what = format!("ip rule fwmark {mark} lookup {table}");
    // Bounded: each successful delete removes one copy.
    for _ in 0..64 {
        let rule = fwmark_rule(ipv6, mark, mask, priority, table);
        if request(RouteNetlinkMessage::DelRule(rule), 0, &what).is_err() {
            break;
        }
    }
    let rule = fwmark_rule(ipv6, mark, mask, priority, table);
    request(
        RouteNetlinkMessage::NewRule(rule),
        NLM_F_CREATE | NLM_F_EXCL,
        &what,
    )
}

/// The `local 0.0.0.0/0 (or ::/0) dev IFACE table TABLE` route.
fn local_default_route(ipv6: bool, iface: &str, table: u32) -> Result<RouteMessage, NetlinkError> {
    let mut msg = RouteMessage::default();
    msg.header.address_family = if ipv6 {
        AddressFamily::Inet6
    } else {
        AddressFamily::Inet
    };
    msg.header.destination_prefix_length = 0;
    msg.header.table = if table < 256 { table as u8 } else { 0 };
    msg.header.protocol = RouteProtocol::Boot;
    msg.header.scope = RouteScope::Host;
    msg.header.kind = RouteType::Local;
    let dst = if ipv6 {
        RouteAddress::Inet6(Ipv6Addr::UNSPECIFIED)
    } else {
        RouteAddress::Inet(Ipv4Addr::UNSPECIFIED)
    };
    msg.attributes = vec![
        RouteAttribute::Destination(dst),
        RouteAttribute::Oif(interface_index(iface)?),
        RouteAttribute::Table(table),
    ];
    Ok(msg)
}

/// `ip route replace local 0.0.0.0/0 (or ::/0) dev IFACE table TABLE`.
pub fn replace_local_default_route(
    ipv6: bool,
    iface: &str,
    table: u32,
) -> Result<(), NetlinkError> {
    request(
        RouteNetlinkMessage::NewRoute(local_default_route(ipv6, iface, table)?),
        NLM_F_CREATE | NLM_F_REPLACE,
        &format!("replace local default route table {table}"),
    )
}

/// The mark or table as a number, by the one check every role validated it with up front (a
/// reserved table here would put a local default route into the pod's main table).
fn parse_number(
    what: &'static str,
    value: &str,
    parse: fn(&str) -> Result<u32, &'static str>,
) -> Result<u32, NetlinkError> {
    parse(value).map_err(|_| NetlinkError::Number {
        what,
        value: value.to_string(),
    })
}

/// A delete that found nothing to delete (or a family the kernel does not have) is not an error.
fn ignore_absent(result: Result<(), NetlinkError>) -> Result<(), NetlinkError> {
    match result {
        Err(NetlinkError::Request { source, .. })
            if matches!(
                source.raw_os_error(),
                Some(libc::ENOENT | libc::ESRCH | libc::EADDRNOTAVAIL | libc::EAFNOSUPPORT)
            ) =>
        {
            Ok(())
        }
        other => other,
    }
}

/// Undoes [`apply_sidecar_routes`] for this configuration, whatever its interception mode and
/// IPv6 setting, and only what is there: the TPROXY policy routing ([`remove_tproxy_routes`]) and
/// `::6/128` on `lo`. Other rules, routes, tables and addresses are left alone.
pub fn remove_sidecar_routes(cfg: &CaptureConfig) -> Result<(), NetlinkError> {
    remove_tproxy_routes(cfg)?;
    let passthrough = IpAddr::V6(Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 6));
    let mut msg = AddressMessage::default();
    msg.header.family = AddressFamily::Inet6;
    msg.header.prefix_len = 128;
    msg.header.index = interface_index("lo")?;
    msg.attributes = vec![
        AddressAttribute::Local(passthrough),
        AddressAttribute::Address(passthrough),
    ];
    ignore_absent(request(
        RouteNetlinkMessage::DelAddress(msg),
        0,
        "delete address ::6/128 from lo",
    ))
}

/// Removes every `ip rule fwmark MARK lookup TABLE` and the `local default dev lo` route of TABLE
/// of this configuration, in both families, when present (after a cleanup, or a reconcile to a
/// configuration without TPROXY inbound capture).
pub fn remove_tproxy_routes(cfg: &CaptureConfig) -> Result<(), NetlinkError> {
    let mark = parse_number("TPROXY mark", &cfg.tproxy_mark, parse_tproxy_mark)?;
    let table = parse_number(
        "TPROXY route table",
        &cfg.tproxy_route_table,
        parse_route_table,
    )?;
    for ipv6 in [false, true] {
        let what = format!("ip rule del fwmark {mark} lookup {table}");
        // Bounded: each successful delete removes one copy.
        for _ in 0..64 {
            let rule = fwmark_rule(ipv6, mark, None, None, table);
            if request(RouteNetlinkMessage::DelRule(rule), 0, &what).is_err() {
                break;
            }
        }
        ignore_absent(request(
            RouteNetlinkMessage::DelRoute(local_default_route(ipv6, "lo", table)?),
            0,
            &format!("delete local default route table {table}"),
        ))?;
    }
    Ok(())
}

/// What a sidecar rule set needs besides the rules: `::6/128` on `lo` when IPv6 is on, and, for
/// TPROXY with inbound capture, `ip rule fwmark MARK lookup TABLE` plus a local default route.
pub fn apply_sidecar_routes(cfg: &CaptureConfig) -> Result<(), NetlinkError> {
    if cfg.enable_ipv6 {
        add_address("lo", IpAddr::V6(Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 6)), 128)?;
    }
    if cfg.needs_tproxy_routes() {
        let mark = parse_number("TPROXY mark", &cfg.tproxy_mark, parse_tproxy_mark)?;
        let table = parse_number(
            "TPROXY route table",
            &cfg.tproxy_route_table,
            parse_route_table,
        )?;
        let families: &[bool] = if cfg.enable_ipv6 {
            &[false, true]
        } else {
            &[false]
        };
        for &ipv6 in families {
            // Unlike Istio, a re-run neither fails nor stacks duplicate rules.
            ensure_fwmark_rule(ipv6, mark, None, None, table)?;
            replace_local_default_route(ipv6, "lo", table)?;
        }
    }
    Ok(())
}

/// The routes after an apply: [`apply_sidecar_routes`]; after a reconcile (`reconciled`) to a
/// configuration without TPROXY inbound capture, the old TPROXY policy routing goes first.
pub fn converge_sidecar_routes(cfg: &CaptureConfig, reconciled: bool) -> Result<(), NetlinkError> {
    if reconciled && !cfg.needs_tproxy_routes() {
        remove_tproxy_routes(cfg)?;
    }
    apply_sidecar_routes(cfg)
}
