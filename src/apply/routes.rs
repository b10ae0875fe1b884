//! The routes a sidecar capture needs besides its rules, decided from the capture configuration
//! and carried out by the plain rtnetlink calls of [`crate::netlink::routes`]: `::6/128` on `lo`
//! when IPv6 is on, and, for TPROXY with inbound capture, `ip rule fwmark MARK lookup TABLE` plus a
//! local default route in TABLE. One rtnetlink socket per call here, opened only when there is
//! something to do.

use std::net::{IpAddr, Ipv6Addr};

use ipnet::IpNet;

use crate::netlink::routes::{MarkRule, NetlinkError, RouteSession};
use crate::rules::capture::CaptureConfig;
use crate::rules::capture_values::{parse_route_table, parse_tproxy_mark};

/// Istio's passthrough address for IPv6, on `lo`.
const PASSTHROUGH_V6: IpNet =
    IpNet::new_assert(IpAddr::V6(Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 6)), 128);

/// Why the routes of a sidecar capture could not be set or removed.
#[derive(Debug, thiserror::Error)]
pub enum RoutesError {
    #[error("invalid {what} {value:?}: not a number")]
    Number { what: &'static str, value: String },
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
}

/// The TPROXY mark and route table of `cfg` as numbers, by the one check every role validated them
/// with up front (a reserved table here would put a local default route into the pod's main
/// table).
fn tproxy_mark_and_table(cfg: &CaptureConfig) -> Result<(u32, u32), RoutesError> {
    let number = |what, value: &str, parse: fn(&str) -> Result<u32, &'static str>| {
        parse(value).map_err(|_| RoutesError::Number {
            what,
            value: value.to_string(),
        })
    };
    Ok((
        number("TPROXY mark", &cfg.tproxy_mark, parse_tproxy_mark)?,
        number(
            "TPROXY route table",
            &cfg.tproxy_route_table,
            parse_route_table,
        )?,
    ))
}

fn families(ipv6: bool) -> &'static [bool] {
    if ipv6 { &[false, true] } else { &[false] }
}

/// What a sidecar rule set needs besides the rules: `::6/128` on `lo` when IPv6 is on, and, for
/// TPROXY with inbound capture, `ip rule fwmark MARK lookup TABLE` plus a local default route.
fn apply_with(session: &mut RouteSession, cfg: &CaptureConfig) -> Result<(), RoutesError> {
    if cfg.enable_ipv6 {
        session.add_address("lo", PASSTHROUGH_V6)?;
    }
    if cfg.needs_tproxy_routes() {
        let (mark, table) = tproxy_mark_and_table(cfg)?;
        for &ipv6 in families(cfg.enable_ipv6) {
            // Unlike Istio, a re-run neither fails nor stacks duplicate rules.
            session.ensure_fwmark_rule(ipv6, mark, table)?;
            session.replace_local_default_route(ipv6, "lo", table)?;
        }
    }
    Ok(())
}

/// Removes every `ip rule fwmark MARK lookup TABLE` and the `local default dev lo` route of TABLE
/// of this configuration, in both families, when present (after a cleanup, or a reconcile to a
/// configuration without TPROXY inbound capture).
fn remove_tproxy_with(session: &mut RouteSession, cfg: &CaptureConfig) -> Result<(), RoutesError> {
    let (mark, table) = tproxy_mark_and_table(cfg)?;
    for &ipv6 in families(true) {
        session.delete_fwmark_rules(ipv6, mark, table)?;
        session.delete_local_default_route(ipv6, "lo", table)?;
    }
    Ok(())
}

/// Undoes [`converge_sidecar_routes`] for this configuration, whatever its interception mode and
/// IPv6 setting, and only what is there: the TPROXY policy routing ([`remove_tproxy_with`]) and
/// `::6/128` on `lo`. Other rules, routes, tables and addresses are left alone.
pub fn remove_sidecar_routes(cfg: &CaptureConfig) -> Result<(), RoutesError> {
    let mut session = RouteSession::new();
    remove_tproxy_with(&mut session, cfg)?;
    Ok(session.delete_address("lo", PASSTHROUGH_V6)?)
}

/// The routes after an apply ([`apply_with`]); after a reconcile (`reconciled`) to a
/// configuration without TPROXY inbound capture, the old TPROXY policy routing goes first.
pub fn converge_sidecar_routes(cfg: &CaptureConfig, reconciled: bool) -> Result<(), RoutesError> {
    let mut session = RouteSession::new();
    if reconciled && !cfg.needs_tproxy_routes() {
        remove_tproxy_with(&mut session, cfg)?;
    }
    apply_with(&mut session, cfg)
}

/// Ambient's policy routing inside a pod: connections ztunnel accepted (conn mark 0x111/0xfff,
/// restored to the packet) are routed locally, table 100, rule priority 32764.
const AMBIENT_MARK: u32 = 0x111;
const AMBIENT_MASK: u32 = 0xfff;
const AMBIENT_TABLE: u32 = 100;
const AMBIENT_PRIORITY: u32 = 32764;

fn ambient_rule(ipv6: bool) -> MarkRule {
    MarkRule {
        ipv6,
        mark: AMBIENT_MARK,
        mask: AMBIENT_MASK,
        table: AMBIENT_TABLE,
        priority: AMBIENT_PRIORITY,
    }
}

/// Whether `lo` has IPv6 turned off in the calling thread's netns (then no `::/0` route).
fn lo_ipv6_disabled() -> bool {
    std::fs::read_to_string("/proc/sys/net/ipv6/conf/lo/disable_ipv6")
        .map(|s| s.trim() == "1")
        .unwrap_or(true)
}

/// `ip rule add fwmark 0x111/0xfff lookup 100 pref 32764` and `ip route replace local 0.0.0.0/0
/// dev lo table 100` (and the IPv6 twins when `ipv6`, the route only when `lo` has IPv6), in the
/// calling thread's netns. Idempotent; nothing is removed first.
pub fn ensure_ambient_routes(ipv6: bool) -> Result<(), RoutesError> {
    let mut session = RouteSession::new();
    for &v6 in families(ipv6) {
        session.add_mark_rule(&ambient_rule(v6))?;
        if !v6 || !lo_ipv6_disabled() {
            session.replace_local_default_route(v6, "lo", AMBIENT_TABLE)?;
        }
    }
    Ok(())
}

/// Removes ambient's policy rule and local route in both families (absent ones are fine).
pub fn remove_ambient_routes() -> Result<(), RoutesError> {
    let mut session = RouteSession::new();
    for &v6 in families(true) {
        session.delete_mark_rule(&ambient_rule(v6))?;
        session.delete_local_default_route(v6, "lo", AMBIENT_TABLE)?;
    }
    Ok(())
}
