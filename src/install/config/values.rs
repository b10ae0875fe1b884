//! One setting's raw value (named for errors) and how each kind of value is read: Go booleans and
//! integers, ports, durations, file names, lists, log levels, enablement selectors, the API
//! server's address. Each `fn(&Raw) -> Result<T, ConfigError>` here is a parser named in `flags`.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::checks::{absolute_path, cni_conf_file_name, kube_name};
use super::raw::{Raw, invalid, parse_go_int, split_list};
use super::sections::*;
use crate::kube::names::NameRule;
use crate::kube::selector;

/// Go's strconv.ParseBool, which pflag and viper use; words with a plain meaning (`yes`, `off`)
/// too (reported by `lenient`).
pub(super) fn parse_bool(raw: &Raw) -> Result<bool, ConfigError> {
    crate::cli::parse_go_bool(raw.value.trim())
        .or_else(|| super::lenient::lenient_bool(&raw.value))
        .ok_or_else(|| invalid(raw, "expected a boolean (true/false)"))
}

pub(super) fn file_name_only(raw: &Raw) -> Result<String, ConfigError> {
    let v = raw.value.trim();
    if v.contains('/') || v == "." || v == ".." {
        return Err(invalid(raw, "must be a file name, not a path"));
    }
    Ok(v.to_string())
}

/// Parses `--log_output_level`: `level` or `scope:level,...`. A bare level and `default:` set the
/// level of every scope not named explicitly; `all:` sets every scope.
fn parse_log_levels(s: &str) -> Result<(LogLevel, BTreeMap<String, LogLevel>), String> {
    let mut default = LogLevel::Info;
    let mut scopes = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (scope, level) = match part.rsplit_once(':') {
            Some((sc, lv)) => (sc.trim(), lv),
            None => ("default", part),
        };
        let level = LogLevel::parse(level).ok_or_else(|| format!("unknown log level {level:?}"))?;
        match scope {
            "default" => default = level,
            "all" => {
                default = level;
                scopes.clear();
            }
            "" => return Err(format!("empty scope in {part:?}")),
            other => {
                scopes.insert(other.to_string(), level);
            }
        }
    }
    Ok((default, scopes))
}

/// Why `AMBIENT_ENABLEMENT_SELECTOR` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SelectorsError {
    #[error("bad JSON: {0}")]
    Json(#[source] serde_json::Error),
    #[error("bad YAML: {0}")]
    Yaml(#[source] serde_saphyr::Error),
    #[error(transparent)]
    Selector(#[from] selector::SelectorError),
}

/// Parses `AMBIENT_ENABLEMENT_SELECTOR` (JSON or the chart's YAML).
pub fn parse_selectors(text: &str) -> Result<Vec<EnablementSelector>, SelectorsError> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Ok(Vec::new());
    }
    // JSON first (its errors are the clearer ones for JSON input), then YAML (the chart's `toYaml`).
    let selectors: Option<Vec<EnablementSelector>> = match serde_json::from_str(trimmed) {
        Ok(v) => v,
        Err(json_err) if trimmed.starts_with('[') || trimmed.starts_with('{') => {
            serde_saphyr::from_str(trimmed).map_err(|_| SelectorsError::Json(json_err))?
        }
        Err(_) => serde_saphyr::from_str(trimmed).map_err(SelectorsError::Yaml)?,
    };
    let selectors = selectors.unwrap_or_default();
    for sel in &selectors {
        for ls in [&sel.pod_selector, &sel.namespace_selector]
            .into_iter()
            .flatten()
        {
            selector::Selector::compile(ls)?;
        }
    }
    Ok(selectors)
}

pub(super) fn port(raw: &Raw) -> Result<u16, ConfigError> {
    match parse_go_int(&raw.value) {
        Some(p) if (0..=65535).contains(&p) => Ok(p as u16),
        _ => Err(invalid(raw, "expected a port number 0-65535")),
    }
}

/// The value as given.
pub(super) fn text(raw: &Raw) -> Result<String, ConfigError> {
    Ok(raw.value.clone())
}

/// A name checked against `rule`, or empty (Istio's meaning there: no check, any, none).
pub(super) fn empty_or_name(raw: &Raw, rule: NameRule) -> Result<String, ConfigError> {
    if raw.value.trim().is_empty() {
        return Ok(String::new());
    }
    kube_name(raw, rule)
}

/// The owned conflist's name: a file name the container runtime loads.
pub(super) fn owned_file_name(raw: &Raw) -> Result<String, ConfigError> {
    let name = file_name_only(raw)?;
    cni_conf_file_name(raw, &name)?;
    Ok(name)
}

/// A comma-separated list of absolute paths, at least one.
pub(super) fn path_list(raw: &Raw) -> Result<Vec<PathBuf>, ConfigError> {
    let dirs = split_list(&raw.value)
        .into_iter()
        .map(|dir| {
            absolute_path(&Raw {
                name: raw.name.clone(),
                value: dir,
            })
        })
        .collect::<Result<Vec<PathBuf>, _>>()?;
    if dirs.is_empty() {
        return Err(invalid(raw, "needs at least one directory"));
    }
    Ok(dirs)
}

/// `MONITORING_PORT`: a port, `<= 0` disables metrics (`None`).
pub(super) fn monitoring_port(raw: &Raw) -> Result<Option<u16>, ConfigError> {
    match parse_go_int(&raw.value) {
        Some(p) if p <= 0 => Ok(None),
        Some(p) if p <= 65535 => Ok(Some(p as u16)),
        _ => Err(invalid(
            raw,
            "expected a port number (<= 0 disables metrics)",
        )),
    }
}

/// `DRIFT_VERIFY_INTERVAL`: a Go duration of at least 1s, `0` = off (`None`).
pub(super) fn drift_interval(raw: &Raw) -> Result<Option<Duration>, ConfigError> {
    match crate::cli::parse_go_duration(raw.value.trim()) {
        Some(d) if d.is_zero() => Ok(None),
        Some(d) if d < Duration::from_secs(1) => {
            Err(invalid(raw, "expected at least 1s (or 0 to disable)"))
        }
        Some(d) => Ok(Some(d)),
        None => Err(invalid(raw, "expected a Go duration such as 60s or 5m")),
    }
}

/// `LISTENER_IDLE_TIMEOUT`: a Go duration of at least 100ms.
pub(super) fn idle_timeout(raw: &Raw) -> Result<Duration, ConfigError> {
    match crate::cli::parse_go_duration(raw.value.trim()) {
        Some(d) if d >= Duration::from_millis(100) => Ok(d),
        Some(_) => Err(invalid(raw, "expected at least 100ms")),
        None => Err(invalid(raw, "expected a Go duration such as 10s")),
    }
}

/// `API_RETRY_MAX_DELAY`: a Go duration from 1s to 5m.
pub(super) fn retry_max_delay(raw: &Raw) -> Result<Duration, ConfigError> {
    match crate::cli::parse_go_duration(raw.value.trim()) {
        Some(d) if (Duration::from_secs(1)..=Duration::from_secs(300)).contains(&d) => Ok(d),
        Some(_) => Err(invalid(raw, "expected from 1s to 5m")),
        None => Err(invalid(raw, "expected a Go duration such as 30s")),
    }
}

/// `--log_output_level`, as [`parse_log_levels`].
pub(super) fn log_levels(raw: &Raw) -> Result<(LogLevel, BTreeMap<String, LogLevel>), ConfigError> {
    parse_log_levels(&raw.value).map_err(|e| invalid(raw, e))
}

/// An integer as Go's flag and viper read it.
pub(super) fn go_int(raw: &Raw) -> Result<i64, ConfigError> {
    parse_go_int(&raw.value).ok_or_else(|| invalid(raw, "expected an integer"))
}

/// `--log_rotate`: a file path; empty = none (left to the caller).
pub(super) fn log_rotate_path(raw: &Raw) -> Result<PathBuf, ConfigError> {
    let path = raw.value.trim();
    if path.ends_with('/') {
        return Err(invalid(raw, "names a directory, not a log file"));
    }
    Ok(PathBuf::from(path))
}

/// `--log_target`: `stderr`, `stdout` or a file path.
pub(super) fn log_target(raw: &Raw) -> Result<LogTarget, ConfigError> {
    Ok(match raw.value.as_str() {
        "stderr" => LogTarget::Stderr,
        "stdout" => LogTarget::Stdout,
        path => LogTarget::File(PathBuf::from(path)),
    })
}

/// `AMBIENT_ENABLEMENT_SELECTOR`, as [`parse_selectors`].
pub(super) fn selectors(raw: &Raw) -> Result<Vec<EnablementSelector>, ConfigError> {
    parse_selectors(&raw.value).map_err(|e| invalid(raw, e.to_string()))
}

/// `FORCE_IPTABLES_BINARY`: `legacy` or `nft`.
pub(super) fn iptables_flavour(raw: &Raw) -> Result<String, ConfigError> {
    match raw.value.as_str() {
        "legacy" | "nft" => Ok(raw.value.clone()),
        _ => Err(invalid(raw, "expected `legacy` or `nft`")),
    }
}

/// `KUBERNETES_SERVICE_HOST`: an IP (bracketed or not) or a host name; anything else makes a
/// server URL no client can use.
pub(super) fn service_host(raw: &Raw) -> Result<String, ConfigError> {
    let v = raw.value.trim();
    let bare = v
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(v);
    if bare.parse::<IpAddr>().is_err()
        && crate::kube::names::check(bare, NameRule::Subdomain).is_err()
    {
        return Err(invalid(raw, "expected an IP address or a host name"));
    }
    Ok(v.to_string())
}

/// `KUBERNETES_SERVICE_PORT`: 1-65535.
pub(super) fn service_port(raw: &Raw) -> Result<String, ConfigError> {
    match raw.value.trim().parse::<u16>() {
        Ok(p) if p > 0 => Ok(p.to_string()),
        _ => Err(invalid(raw, "expected a port number 1-65535")),
    }
}

/// `KUBERNETES_SERVICE_PROTOCOL`: `http` or `https`.
pub(super) fn service_protocol(raw: &Raw) -> Result<String, ConfigError> {
    match raw.value.trim() {
        v @ ("http" | "https") => Ok(v.to_string()),
        _ => Err(invalid(raw, "expected `https` or `http`")),
    }
}
