//! One setting's raw value (named for errors) and how each kind of value is read: Go booleans and
//! integers, ports, file names, lists, log levels, enablement selectors.

use std::collections::BTreeMap;

use super::sections::*;
use crate::kube::selector;

/// One setting's raw value and where it came from (for error messages).
pub(super) struct Raw {
    pub(super) name: String,
    pub(super) value: String,
}

pub(super) struct Resolver<'a> {
    pub(super) env: &'a dyn Fn(&str) -> Option<String>,
}

impl Resolver<'_> {
    /// flag > env > none. An empty env var counts as unset (viper's default). Every setting's
    /// flag is its env var's name in lower case with `-` for `_` (viper's key replacer binds them
    /// that way), so the env name names both.
    pub(super) fn raw(&self, flag: &Option<String>, env_name: &str) -> Option<Raw> {
        if let Some(v) = flag {
            return Some(Raw {
                name: format!("--{}", env_name.to_ascii_lowercase().replace('_', "-")),
                value: v.clone(),
            });
        }
        self.env_raw(env_name)
    }

    pub(super) fn env_raw(&self, env_name: &str) -> Option<Raw> {
        (self.env)(env_name)
            .filter(|v| !v.is_empty())
            .map(|value| Raw {
                name: format!("env {env_name}"),
                value,
            })
    }

    pub(super) fn string(&self, flag: &Option<String>, env_name: &str, default: &str) -> String {
        self.raw(flag, env_name)
            .map(|r| r.value)
            .unwrap_or_else(|| default.to_string())
    }

    pub(super) fn boolean(
        &self,
        flag: &Option<String>,
        env_name: &str,
        default: bool,
    ) -> Result<bool, ConfigError> {
        match self.raw(flag, env_name) {
            Some(r) => parse_bool(&r),
            None => Ok(default),
        }
    }

    pub(super) fn env_bool(&self, env_name: &str, default: bool) -> Result<bool, ConfigError> {
        match self.env_raw(env_name) {
            Some(r) => parse_bool(&r),
            None => Ok(default),
        }
    }
}

pub(super) fn invalid(raw: &Raw, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        name: raw.name.clone(),
        value: raw.value.clone(),
        reason: reason.into(),
    }
}

/// Go's strconv.ParseBool, which pflag and viper use.
pub(super) fn parse_bool(raw: &Raw) -> Result<bool, ConfigError> {
    crate::cli::parse_go_bool(raw.value.trim())
        .ok_or_else(|| invalid(raw, "expected a boolean (true/false)"))
}

/// Go's strconv.ParseInt with base 0 (viper's cast): `0600` is octal, `0x..` hex, `0o..` octal.
pub(super) fn parse_go_int(s: &str) -> Option<i64> {
    let s = s.trim();
    let (neg, digits) = match s.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let digits = digits.replace('_', "");
    let parsed = if let Some(h) = digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        i64::from_str_radix(h, 16).ok()
    } else if let Some(o) = digits
        .strip_prefix("0o")
        .or_else(|| digits.strip_prefix("0O"))
    {
        i64::from_str_radix(o, 8).ok()
    } else if let Some(b) = digits
        .strip_prefix("0b")
        .or_else(|| digits.strip_prefix("0B"))
    {
        i64::from_str_radix(b, 2).ok()
    } else if digits.len() > 1 && digits.starts_with('0') {
        i64::from_str_radix(&digits[1..], 8).ok()
    } else {
        digits.parse::<i64>().ok()
    }?;
    Some(if neg { -parsed } else { parsed })
}

pub(super) fn file_name_only(raw: &Raw) -> Result<String, ConfigError> {
    let v = raw.value.trim();
    if v.contains('/') || v == "." || v == ".." {
        return Err(invalid(raw, "must be a file name, not a path"));
    }
    Ok(v.to_string())
}

pub(super) fn split_list(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect()
}

/// Parses `--log_output_level`: `level` or `scope:level,...`. A bare level and `default:` set the
/// level of every scope not named explicitly; `all:` sets every scope.
pub fn parse_log_levels(s: &str) -> Result<(LogLevel, BTreeMap<String, LogLevel>), String> {
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
