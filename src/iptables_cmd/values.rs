//! What `istio-iptables`'s settings resolve to ([`Settings`] and its choices), the error naming a
//! bad value ([`SettingError`]) and the parsers the declarations in `flags` name: one raw value
//! (named by its flag or variable) in, the typed value or a [`SettingError`] naming it out. The
//! leaf of this room's settings: `flags` declares with it, `resolve` fills it.

use std::net::IpAddr;
use std::time::Duration;

use crate::apply::ForceBinary;
use crate::cli::settings::Raw;
use crate::cli::{parse_go_bool, parse_go_duration};
use crate::rules::capture::{CaptureConfig, InboundPorts, InterceptionMode, IpRanges, split_list};
use crate::rules::capture_values::parse_port;

/// Whether IPv6 rules are wanted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ipv6Choice {
    Auto,
    On,
    Off,
}

/// Where DNS servers come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DnsSource {
    ResolvConf,
    Given(Vec<String>),
}

/// Everything `istio-iptables` needs, resolved and validated, before any host fact is read.
#[derive(Debug, Clone)]
pub struct Settings {
    pub capture: CaptureConfig,
    /// UIDs were not given: look up $ENVOY_USER.
    pub proxy_uid_from_user: Option<String>,
    pub proxy_gid_given: bool,
    pub ipv6: Ipv6Choice,
    pub dual_stack: bool,
    pub dns: DnsSource,
    pub dry_run: bool,
    pub dry_run_file: Option<String>,
    pub skip_rule_apply: bool,
    pub run_validation: bool,
    pub probe_port: u16,
    pub probe_timeout: Duration,
    pub network_namespace: Option<String>,
    pub cni_mode: bool,
    pub reconcile: bool,
    pub cleanup_only: bool,
    pub force_apply: bool,
    pub native_nftables: bool,
    pub force_binary: Option<crate::apply::ForceBinary>,
    /// Always apply through iptables-restore, never by sending its nf_tables messages directly
    /// [ISTIO_IPTABLES_RESTORE_ONLY].
    pub restore_only: bool,
}

/// A flag or variable with a bad value. The message names both.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid value {value:?} for {name}: {reason}")]
pub struct SettingError {
    pub name: String,
    pub value: String,
    pub reason: String,
}

pub(super) fn bad(name: &str, value: &str, reason: impl Into<String>) -> SettingError {
    SettingError {
        name: name.to_string(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

pub(super) fn text(raw: &Raw) -> Result<String, SettingError> {
    Ok(raw.value.clone())
}

pub(super) fn list(raw: &Raw) -> Result<Vec<String>, SettingError> {
    Ok(split_list(&raw.value))
}

/// Unlike Istio, which ignores a value it cannot parse, a variable that is set but is not a Go
/// boolean (`yes`, `on`, empty) is an error: these switches guard real changes, and a typo must
/// not turn a dry run into an apply.
pub(super) fn switch_value(raw: &Raw) -> Result<bool, SettingError> {
    parse_go_bool(&raw.value).ok_or_else(|| {
        bad(
            &raw.name,
            &raw.value,
            "not a boolean (use true/false, 1/0, t/f); refusing to guess",
        )
    })
}

pub(super) fn interception_mode(raw: &Raw) -> Result<InterceptionMode, SettingError> {
    match raw.value.as_str() {
        "TPROXY" => Ok(InterceptionMode::Tproxy),
        "" | "REDIRECT" | "NONE" => Ok(InterceptionMode::Redirect),
        other => Err(bad(&raw.name, other, "expected REDIRECT or TPROXY")),
    }
}

pub(super) fn inbound_ports(raw: &Raw) -> Result<InboundPorts, SettingError> {
    Ok(match raw.value.trim() {
        "" => InboundPorts::None,
        "*" => InboundPorts::All,
        list => InboundPorts::List(split_list(list)),
    })
}

pub(super) fn ip_ranges(raw: &Raw) -> Result<IpRanges, SettingError> {
    IpRanges::parse(&raw.value).map_err(|e| bad(&raw.name, &e.value, e.reason))
}

pub(super) fn excluded_ip_ranges(raw: &Raw) -> Result<IpRanges, SettingError> {
    if raw.value.trim() == "*" {
        return Err(bad(
            &raw.name,
            &raw.value,
            "'*' would exclude everything; list CIDRs",
        ));
    }
    ip_ranges(raw)
}

pub(super) fn probe_port(raw: &Raw) -> Result<u16, SettingError> {
    parse_port(&raw.value).map_err(|reason| bad(&raw.name, &raw.value, reason))
}

pub(super) fn duration(raw: &Raw) -> Result<Duration, SettingError> {
    parse_go_duration(&raw.value)
        .ok_or_else(|| bad(&raw.name, &raw.value, "not a duration like 5s"))
}

pub(super) fn force_binary(raw: &Raw) -> Result<Option<ForceBinary>, SettingError> {
    match raw.value.as_str() {
        "" => Ok(None),
        "legacy" => Ok(Some(ForceBinary::Legacy)),
        "nft" => Ok(Some(ForceBinary::Nft)),
        other => Err(bad(&raw.name, other, "expected legacy or nft")),
    }
}

pub(super) fn ipv6(raw: &Raw) -> Result<Ipv6Choice, SettingError> {
    match raw.value.as_str() {
        "auto" => Ok(Ipv6Choice::Auto),
        v => match parse_go_bool(v) {
            Some(true) => Ok(Ipv6Choice::On),
            Some(false) => Ok(Ipv6Choice::Off),
            None => Err(bad(&raw.name, v, "expected auto, true or false")),
        },
    }
}

pub(super) fn dns_servers(raw: &Raw) -> Result<Vec<String>, SettingError> {
    let servers = split_list(&raw.value);
    if let Some(s) = servers.iter().find(|s| s.parse::<IpAddr>().is_err()) {
        return Err(bad(&raw.name, s, "not an IP address"));
    }
    Ok(servers)
}
