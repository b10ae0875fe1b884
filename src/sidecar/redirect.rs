//! Sidecar mode, pure part: whether a pod is redirected (Istio's exact check order), and the
//! redirect settings from its annotations and proxy environment, turned into the shared rule
//! engine's [`CaptureConfig`].

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::rules::capture::{CaptureConfig, InboundPorts, InterceptionMode, IpRanges, split_list};
use crate::rules::capture_values::{Field, InvalidValue, check_interface, parse_port};

use crate::cli::Env;
use crate::cli::settings::shared::decl as shared;
use crate::cli::settings::{EmptyEnv, Lookup, Setting};

use super::pod::{ISTIO_INIT, ISTIO_PROXY, PodInfo};

pub const ANN_INJECT: &str = "sidecar.istio.io/inject";
pub const ANN_STATUS: &str = "sidecar.istio.io/status";
pub const ANN_INTERCEPTION_MODE: &str = "sidecar.istio.io/interceptionMode";
pub const ANN_INCLUDE_OUTBOUND_IP_RANGES: &str = "traffic.sidecar.istio.io/includeOutboundIPRanges";
pub const ANN_EXCLUDE_OUTBOUND_IP_RANGES: &str = "traffic.sidecar.istio.io/excludeOutboundIPRanges";
pub const ANN_INCLUDE_INBOUND_PORTS: &str = "traffic.sidecar.istio.io/includeInboundPorts";
pub const ANN_EXCLUDE_INBOUND_PORTS: &str = "traffic.sidecar.istio.io/excludeInboundPorts";
pub const ANN_INCLUDE_OUTBOUND_PORTS: &str = "traffic.sidecar.istio.io/includeOutboundPorts";
pub const ANN_EXCLUDE_OUTBOUND_PORTS: &str = "traffic.sidecar.istio.io/excludeOutboundPorts";
pub const ANN_EXCLUDE_INTERFACES: &str = "traffic.sidecar.istio.io/excludeInterfaces";
pub use crate::rules::ambient::ANN_REROUTE_VIRTUAL_INTERFACES;
pub const ANN_KUBEVIRT_INTERFACES: &str = "traffic.sidecar.istio.io/kubevirtInterfaces";

pub const ENV_DISABLE_ENVOY: &str = "DISABLE_ENVOY";
pub const ENV_DNS_CAPTURE: &str = "ISTIO_META_DNS_CAPTURE";
pub const ENV_DUAL_STACK: &str = "ISTIO_DUAL_STACK";
pub const ENV_INVALID_DROP: &str = "INVALID_DROP";

/// Inbound ports the sidecar itself serves (status, health, Prometheus): never captured.
pub const ALWAYS_EXCLUDED_INBOUND: &str = "15020,15021,15090";
/// Default outbound/inbound port exclusion (the status port).
const DEFAULT_EXCLUDE_PORT: &str = "15020";
/// Proxy UID/GID when the istio-proxy securityContext does not set one (or sets 0).
pub const DEFAULT_PROXY_ID: i64 = 1337;

pub use crate::cli::parse_go_bool;

/// Why a pod is left alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    IstioInit,
    EnvoyDisabled,
    NoProxy,
    NotSidecarProxy,
    InjectionDisabled,
    NoStatus,
}

impl Skip {
    pub fn reason(self) -> &'static str {
        match self {
            Skip::IstioInit => "pod already has an istio-init container",
            Skip::EnvoyDisabled => "istio-proxy has DISABLE_ENVOY set (proxyless)",
            Skip::NoProxy => "pod has no istio-proxy container",
            Skip::NotSidecarProxy => "istio-proxy is not a sidecar (e.g. a gateway)",
            Skip::InjectionDisabled => "sidecar injection is disabled for the pod",
            Skip::NoStatus => "pod has no sidecar.istio.io/status annotation",
        }
    }
}

/// Istio's sidecar checks, in order; `None` means the pod is redirected.
pub fn skip_reason(pod: &PodInfo) -> Option<Skip> {
    if pod.containers.contains(ISTIO_INIT) {
        return Some(Skip::IstioInit);
    }
    if pod
        .proxy_env
        .get(ENV_DISABLE_ENVOY)
        .and_then(|v| parse_go_bool(v))
        == Some(true)
    {
        return Some(Skip::EnvoyDisabled);
    }
    if !pod.containers.contains(ISTIO_PROXY) {
        return Some(Skip::NoProxy);
    }
    if pod.proxy_type.as_deref().is_some_and(|t| t != "sidecar") {
        return Some(Skip::NotSidecarProxy);
    }
    // The label wins over the annotation; unparseable values are ignored.
    let inject = pod
        .labels
        .get(ANN_INJECT)
        .or_else(|| pod.annotations.get(ANN_INJECT));
    if inject.and_then(|v| parse_go_bool(v)) == Some(false) {
        return Some(Skip::InjectionDisabled);
    }
    if !pod.annotations.contains_key(ANN_STATUS) {
        return Some(Skip::NoStatus);
    }
    None
}

/// An annotation whose value cannot be used; ADD fails with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid value {value:?} for annotation {annotation}: {reason}")]
pub struct AnnotationError {
    pub annotation: &'static str,
    pub value: String,
    pub reason: String,
}

/// Why a pod's redirect cannot be built; ADD fails with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RedirectError {
    #[error(transparent)]
    Annotation(#[from] AnnotationError),
    /// A value from elsewhere: the plugin's own environment (owner groups, loopback CIDR) or the
    /// proxy's securityContext.
    #[error("{0}")]
    Value(InvalidValue),
}

/// How the pod's traffic is to be captured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redirect {
    /// `interceptionMode: NONE`: the sidecar does not want capture; nothing is programmed.
    None,
    Capture(Box<CaptureSettings>),
}

/// Redirect settings before the pod's IPv6 state is known (that is read inside its netns).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureSettings {
    pub config: CaptureConfig,
    /// `ISTIO_DUAL_STACK`: IPv6 rules are added if the pod has any IPv6 address.
    pub dual_stack: bool,
    /// Warnings to log (unparseable booleans in the proxy env).
    pub warnings: Vec<String>,
}

impl CaptureSettings {
    /// How many rules the plugin programs for these settings (both families when the pod may
    /// have IPv6), counted from the rule model: what a drift check of the pod reads and compares.
    pub fn planned_rules(&self) -> usize {
        let config = CaptureConfig {
            enable_ipv6: self.config.enable_ipv6 || self.dual_stack,
            ..self.config.clone()
        };
        let rules = crate::rules::capture::build(&config);
        rules.v4.len() + rules.v6.len()
    }
}

type Validator = fn(&str) -> Result<(), String>;

/// The items of an annotation list, trimmed as Istio's validator trims ports (we trim every
/// list); an empty item (`80,,90`, a trailing comma) is refused, as Istio's validator refuses it.
fn list_items<'a>(list: &'a str, what: &str) -> Result<Vec<&'a str>, String> {
    let trimmed = list.trim();
    if trimmed.is_empty() {
        return Ok(Vec::new());
    }
    trimmed
        .split(',')
        .map(str::trim)
        .map(|item| match item {
            "" => Err(format!("empty {what} in the list")),
            item => Ok(item),
        })
        .collect()
}

/// Comma list of ports (1..=65535; Istio also takes 0, which captures nothing); may be empty.
fn validate_ports(list: &str) -> Result<(), String> {
    for p in list_items(list, "port")? {
        parse_port(p).map_err(|reason| format!("port {p:?}: {reason}"))?;
    }
    Ok(())
}

fn validate_ports_or_wildcard(list: &str) -> Result<(), String> {
    if list.trim() == "*" {
        Ok(())
    } else {
        validate_ports(list)
    }
}

/// Port lists where `*` means nothing to the rule engine (Istio accepts it here and then fails
/// when applying the rules); ADD fails at once, naming the annotation.
fn validate_ports_without_wildcard(list: &str) -> Result<(), String> {
    if list.split(',').any(|p| p.trim() == "*") {
        return Err("`*` is only accepted by includeInboundPorts; list the ports".into());
    }
    validate_ports(list)
}

/// Comma list of prefixes (`a.b.c.d/n`), no bare addresses.
fn validate_cidrs(list: &str) -> Result<(), String> {
    for cidr in list_items(list, "CIDR")? {
        let ok = cidr.split_once('/').is_some_and(|(addr, bits)| {
            addr.parse::<std::net::IpAddr>().is_ok_and(|a| {
                let max = if a.is_ipv4() { 32 } else { 128 };
                !bits.is_empty()
                    && bits.chars().all(|c| c.is_ascii_digit())
                    && bits.len() <= 3
                    && (bits == "0" || !bits.starts_with('0'))
                    && bits.parse::<u32>().is_ok_and(|b| b <= max)
            })
        });
        if !ok {
            return Err(format!("failed parsing cidr {cidr:?}"));
        }
    }
    Ok(())
}

fn validate_cidrs_or_wildcard(list: &str) -> Result<(), String> {
    if list.trim() == "*" {
        Ok(())
    } else {
        validate_cidrs(list)
    }
}

fn validate_interfaces(list: &str) -> Result<(), String> {
    for name in list_items(list, "interface name")? {
        check_interface(name).map_err(|reason| format!("interface {name:?}: {reason}"))?;
    }
    Ok(())
}

/// The annotation's value if present and valid, its default if absent, an error if invalid.
fn annotation(
    annotations: &BTreeMap<String, String>,
    key: &'static str,
    default: &str,
    validate: Validator,
) -> Result<(bool, String), AnnotationError> {
    match annotations.get(key) {
        Some(value) => validate(value)
            .map(|_| (true, value.clone()))
            .map_err(|reason| AnnotationError {
                annotation: key,
                value: value.clone(),
                reason,
            }),
        None => Ok((false, default.to_string())),
    }
}

/// Appends the always-excluded ports to the inbound exclusion list, dropping exact duplicates
/// (first occurrence kept; items trimmed, empty ones dropped, unparseable ones kept as they are).
pub fn exclude_inbound_ports(value: &str) -> String {
    let mut seen = std::collections::HashSet::new();
    split_list(&format!("{value},{ALWAYS_EXCLUDED_INBOUND}"))
        .into_iter()
        .filter(|p| seen.insert(p.clone()))
        .collect::<Vec<_>>()
        .join(",")
}

fn proxy_id(id: Option<i64>) -> String {
    match id {
        Some(id) if id != 0 => id.to_string(),
        _ => DEFAULT_PROXY_ID.to_string(),
    }
}

/// What ADD takes from the plugin's own environment (the runtime's, which reaches the plugin),
/// read once through the injected [`Env`] so ADD itself never reads the process environment.
#[derive(Debug, Clone, Default)]
pub struct EngineEnv {
    pub owner_groups_include: Option<String>,
    pub owner_groups_exclude: Option<String>,
    pub loopback_v4: Option<String>,
    /// `ISTIO_IPTABLES_RESTORE_ONLY=true`: always run iptables-restore, never send the nf_tables
    /// messages directly.
    pub restore_only: bool,
    /// `DRY_RUN_FILE_PATH`: write the rules there instead of programming the pod.
    pub dry_run: Option<PathBuf>,
}

impl EngineEnv {
    /// The settings `istio-iptables` shares with the plugin, under their one declaration
    /// ([`crate::cli::settings::shared`]). Empty values count as unset; a restore-only value that
    /// is not a Go boolean counts as false (ADD must not fail on it).
    pub fn from_env(env: &dyn Env) -> EngineEnv {
        let lookup = Lookup {
            env,
            empty_env: EmptyEnv::Unset,
            env_label: "",
            switched_off: None,
        };
        let get = |s: &Setting| lookup.raw(s, None).map(|raw| raw.value);
        EngineEnv {
            owner_groups_include: get(&shared::istio_outbound_owner_groups),
            owner_groups_exclude: get(&shared::istio_outbound_owner_groups_exclude),
            loopback_v4: get(&shared::istio_outbound_ipv4_loopback_cidr),
            restore_only: get(&shared::istio_iptables_restore_only)
                .and_then(|v| crate::cli::parse_go_bool(&v))
                .unwrap_or(false),
            dry_run: get(&shared::dry_run_file_path).map(PathBuf::from),
        }
    }
}

/// Builds the redirect for a selected pod.
pub fn redirect(pod: &PodInfo, engine: &EngineEnv) -> Result<Redirect, RedirectError> {
    let an = &pod.annotations;
    let (_, mode) = annotation(an, ANN_INTERCEPTION_MODE, "REDIRECT", |m| match m {
        "REDIRECT" | "TPROXY" | "NONE" => Ok(()),
        other => Err(format!(
            "interceptionMode invalid: {other} (want REDIRECT, TPROXY or NONE)"
        )),
    })?;
    if mode == "NONE" {
        return Ok(Redirect::None);
    }
    let (_, include_cidrs) = annotation(
        an,
        ANN_INCLUDE_OUTBOUND_IP_RANGES,
        "*",
        validate_cidrs_or_wildcard,
    )?;
    let (_, exclude_cidrs) = annotation(an, ANN_EXCLUDE_OUTBOUND_IP_RANGES, "", validate_cidrs)?;
    let (_, exclude_in) = annotation(
        an,
        ANN_EXCLUDE_INBOUND_PORTS,
        DEFAULT_EXCLUDE_PORT,
        validate_ports_without_wildcard,
    )?;
    let (_, include_in) = annotation(
        an,
        ANN_INCLUDE_INBOUND_PORTS,
        "*",
        validate_ports_or_wildcard,
    )?;
    let (_, exclude_out) = annotation(
        an,
        ANN_EXCLUDE_OUTBOUND_PORTS,
        DEFAULT_EXCLUDE_PORT,
        validate_ports_without_wildcard,
    )?;
    let (_, include_out) = annotation(
        an,
        ANN_INCLUDE_OUTBOUND_PORTS,
        "",
        validate_ports_without_wildcard,
    )?;
    let exclude_in = exclude_inbound_ports(&exclude_in);
    let (_, exclude_ifaces) = annotation(an, ANN_EXCLUDE_INTERFACES, "", validate_interfaces)?;
    let (reroute_key, reroute) = reroute_interfaces(an)?;
    let (dns, dual_stack, drop_invalid, warnings) = proxy_env_flags(pod);

    let range_err = |key: &'static str, value: &str| {
        let value = value.to_string();
        move |e: crate::rules::capture::RangeError| AnnotationError {
            annotation: key,
            value,
            reason: e.to_string(),
        }
    };
    let mut config = CaptureConfig {
        proxy_uids: vec![proxy_id(pod.proxy_uid)],
        proxy_gids: vec![proxy_id(pod.proxy_gid)],
        mode: if mode == "TPROXY" {
            InterceptionMode::Tproxy
        } else {
            InterceptionMode::Redirect
        },
        inbound_ports: match include_in.trim() {
            "" => InboundPorts::None,
            "*" => InboundPorts::All,
            list => InboundPorts::List(split_list(list)),
        },
        inbound_ports_exclude: split_list(&exclude_in),
        exclude_interfaces: split_list(&exclude_ifaces),
        outbound_ranges_include: IpRanges::parse(&include_cidrs)
            .map_err(range_err(ANN_INCLUDE_OUTBOUND_IP_RANGES, &include_cidrs))?,
        outbound_ranges_exclude: IpRanges::parse(&exclude_cidrs)
            .map_err(range_err(ANN_EXCLUDE_OUTBOUND_IP_RANGES, &exclude_cidrs))?,
        outbound_ports_include: split_list(&include_out),
        outbound_ports_exclude: split_list(&exclude_out),
        reroute_virtual_interfaces: split_list(&reroute),
        redirect_dns: dns,
        capture_all_dns: dns,
        drop_invalid,
        ..CaptureConfig::default()
    };
    config.owner_groups = owner_groups(engine);
    if let Some(lo) = &engine.loopback_v4 {
        config.loopback_v4 = lo.clone();
    }
    // Values the annotation validators let through (e.g. `*` where only a port can go) and the
    // plugin's own environment: refused here, before the pod's netns is touched.
    config
        .validate()
        .map_err(|e| validation_error(e, reroute_key, an))?;
    Ok(Redirect::Capture(Box::new(CaptureSettings {
        config,
        dual_stack,
        warnings,
    })))
}

/// The rerouted interfaces and the key they came from. The deprecated kubevirt key counts only
/// when the new one is absent. Istio takes any value here and lets iptables fail on a bad name;
/// we check names as for excludeInterfaces.
fn reroute_interfaces(
    an: &BTreeMap<String, String>,
) -> Result<(&'static str, String), AnnotationError> {
    let (found, mut reroute) =
        annotation(an, ANN_REROUTE_VIRTUAL_INTERFACES, "", validate_interfaces)?;
    let reroute_key = if found {
        ANN_REROUTE_VIRTUAL_INTERFACES
    } else {
        reroute = annotation(an, ANN_KUBEVIRT_INTERFACES, "", validate_interfaces)?.1;
        ANN_KUBEVIRT_INTERFACES
    };
    Ok((reroute_key, reroute))
}

/// The istio-proxy environment's DNS capture, dual stack and invalid-drop switches; a value that
/// is no boolean counts as false, with a warning.
fn proxy_env_flags(pod: &PodInfo) -> (bool, bool, bool, Vec<String>) {
    let mut warnings = Vec::new();
    let mut env_bool = |name: &str| {
        match pod.proxy_env.get(name) {
        None => false,
        Some(v) => parse_go_bool(v).unwrap_or_else(|| {
            warnings.push(format!(
                "cannot parse istio-proxy environment variable {name}={v:?} as a boolean; using false"
            ));
            false
        }),
    }
    };
    let dns = env_bool(ENV_DNS_CAPTURE);
    let dual_stack = env_bool(ENV_DUAL_STACK);
    let drop_invalid = env_bool(ENV_INVALID_DROP);
    (dns, dual_stack, drop_invalid, warnings)
}

/// The owner groups the engine's environment includes or excludes.
fn owner_groups(engine: &EngineEnv) -> crate::rules::capture::OwnerGroups {
    use crate::rules::capture::OwnerGroups;
    let include_groups = engine.owner_groups_include.as_deref().unwrap_or("*");
    if include_groups == "*" {
        OwnerGroups::AllExcept(split_list(
            engine.owner_groups_exclude.as_deref().unwrap_or(""),
        ))
    } else {
        OwnerGroups::Only(split_list(include_groups))
    }
}

/// The capture config's refusal, named by its annotation when the value came from one.
fn validation_error(
    e: InvalidValue,
    reroute_key: &'static str,
    an: &BTreeMap<String, String>,
) -> RedirectError {
    let key = match e.field {
        Field::InboundPorts => ANN_INCLUDE_INBOUND_PORTS,
        Field::InboundPortsExclude => ANN_EXCLUDE_INBOUND_PORTS,
        Field::OutboundPortsInclude => ANN_INCLUDE_OUTBOUND_PORTS,
        Field::OutboundPortsExclude => ANN_EXCLUDE_OUTBOUND_PORTS,
        Field::ExcludeInterfaces => ANN_EXCLUDE_INTERFACES,
        Field::RerouteVirtualInterfaces => reroute_key,
        _ => return RedirectError::Value(e),
    };
    RedirectError::Annotation(AnnotationError {
        annotation: key,
        value: an.get(key).cloned().unwrap_or_default(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
#[path = "redirect_tests.rs"]
mod tests;
