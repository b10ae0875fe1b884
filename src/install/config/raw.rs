//! One setting's raw value, named for errors, and the readings every parser shares: the error
//! that names the value ([`invalid`]), Go's integers and comma lists. The leaf of this folder: it
//! names only the error type of `sections`.

use super::sections::ConfigError;

/// One setting's raw value and where it came from (for error messages).
pub(super) use crate::cli::settings::Raw;

pub(super) fn invalid(raw: &Raw, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        name: raw.name.clone(),
        value: raw.value.clone(),
        reason: reason.into(),
    }
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

pub(super) fn split_list(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect()
}
