//! Command-line plumbing shared by every role: pflag-style argv normalising for argh, env-var
//! fallbacks, Go-compatible bool and duration parsing; `settings`: settings declared once (flag,
//! env, default, parser, doc) and the engine resolving them.
//! May call: nothing else in this crate.

use std::collections::HashSet;
use std::time::Duration;

pub mod settings;

/// How the flags of one command are shaped, for [`normalise_args`].
pub struct FlagShapes<'a> {
    /// Long names (without `--`) of boolean switches.
    pub switches: &'a [&'a str],
    /// Short letters and the long name (dash form) each stands for.
    pub shorts: &'a [(char, &'a str)],
    /// Long names spelled with underscores upstream (`log_output_level`); rewritten to dashes.
    pub underscore_longs: &'a [&'a str],
    /// Rewrite every underscore in long names to a dash (commands with no underscore-named flags
    /// of their own, so any `--log_x` upstream spelling maps onto `--log-x`).
    pub all_underscores: bool,
    /// Long names of booleans that argh takes as value options (`--flag true|false`), so that an
    /// explicit false stays visible to the parser: bare `--flag` becomes `--flag true`.
    pub bool_options: &'a [&'a str],
    /// Long names of options whose every occurrence adds a value (pflag string arrays). Any other
    /// option given twice keeps its last value, as pflag does.
    pub repeatable: &'a [&'a str],
    /// Whether the command takes positional arguments at all.
    pub positionals: bool,
}

impl<'a> FlagShapes<'a> {
    /// A command of our own whose only special flags are `switches`: no shorts, no positionals,
    /// every underscore in a long name read as a dash.
    pub const fn switches_only(switches: &'a [&'a str]) -> FlagShapes<'a> {
        FlagShapes {
            switches,
            shorts: &[],
            underscore_longs: &[],
            all_underscores: true,
            bool_options: &[],
            repeatable: &[],
            positionals: false,
        }
    }
}

/// argv rewritten into the one form argh understands, plus the switches set to false explicitly.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Normalised {
    pub args: Vec<String>,
    pub explicit_false: HashSet<String>,
}

/// A command line pflag would refuse (or that would be silently misread).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum FlagError {
    #[error("invalid value {value:?} for flag --{flag}: {reason}")]
    BadValue {
        flag: String,
        value: String,
        reason: String,
    },
    #[error("unexpected argument {arg:?}: {hint}")]
    Positional { arg: String, hint: String },
}

/// One parsed command-line element, named by its long form.
enum Item {
    Switch(String, bool),
    Option(String, String),
    /// A flag only argh knows (or rejects), passed on as it is.
    Unknown(String),
    Positional(String),
}

/// Rewrites pflag forms into argh's and applies pflag's rules argh lacks. Every flag comes out in
/// its long form: `--k=v`, `-pV`, `-p=V` → `--k v`; `-h` → `--help`; `--switch=true` →
/// `--switch`; `--switch=false` is dropped and remembered (so an env var cannot turn it back on).
/// A repeated option keeps its last value and a repeated switch its last setting. A positional
/// argument is an error unless the command takes some.
pub fn normalise_args(args: &[String], shapes: &FlagShapes) -> Result<Normalised, FlagError> {
    let mut items = Vec::new();
    let mut help = false;
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if arg == "--" {
            let rest: Vec<String> = iter.by_ref().cloned().collect();
            if let (false, Some(first)) = (shapes.positionals, rest.first()) {
                return Err(positional_error(first, None));
            }
            items.extend(rest.into_iter().map(Item::Positional));
            break;
        }
        let (name, value) = if let Some(long) = arg.strip_prefix("--") {
            let (name, value) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (long, None),
            };
            let name = if shapes.all_underscores || shapes.underscore_longs.contains(&name) {
                name.replace('_', "-")
            } else {
                name.to_string()
            };
            (name, value)
        } else if let Some((name, value)) = short_flag(arg, shapes) {
            (name, value)
        } else if arg == "-h" {
            ("help".to_string(), None)
        } else if arg.starts_with('-') && arg.len() > 1 {
            items.push(Item::Unknown(arg.clone()));
            continue;
        } else {
            if !shapes.positionals {
                return Err(positional_error(arg, items.last()));
            }
            items.push(Item::Positional(arg.clone()));
            continue;
        };
        if name == "help" {
            help = true;
        } else if shapes.switches.contains(&name.as_str()) {
            let on = match value.map(|v| parse_go_bool(v).ok_or(v)) {
                None => true,
                Some(Ok(b)) => b,
                Some(Err(v)) => {
                    return Err(FlagError::BadValue {
                        flag: name,
                        value: v.to_string(),
                        reason: "expected true or false".into(),
                    });
                }
            };
            items.push(Item::Switch(name, on));
        } else {
            let value = match value {
                Some(v) => v.to_string(),
                None if shapes.bool_options.contains(&name.as_str()) => "true".to_string(),
                None => match iter.next() {
                    Some(v) => v.clone(),
                    // Last on the line: argh says whether it is unknown or lacks its value.
                    None => {
                        items.push(Item::Unknown(format!("--{name}")));
                        continue;
                    }
                },
            };
            items.push(Item::Option(name, value));
        }
    }
    Ok(assemble(items, help, shapes))
}

/// `-X`, `-XV` or `-X=V` for a known short letter: its long name and the attached value. As in
/// pflag, a lone `=` is the value itself (`-x=` is `-x '='`), not an empty one.
fn short_flag<'a>(arg: &'a str, shapes: &FlagShapes) -> Option<(String, Option<&'a str>)> {
    let rest = arg.strip_prefix('-')?;
    let letter = rest.chars().next()?;
    let long = shapes.shorts.iter().find(|(c, _)| *c == letter)?.1;
    let attached = &rest[letter.len_utf8()..];
    let value = match attached {
        "" => None,
        "=" => Some("="),
        v => Some(v.strip_prefix('=').unwrap_or(v)),
    };
    Some((long.to_string(), value))
}

fn positional_error(arg: &str, previous: Option<&Item>) -> FlagError {
    let hint = match previous {
        Some(Item::Switch(name, _)) if parse_go_bool(arg).is_some() => {
            format!("a boolean flag takes its value after '=' (--{name}={arg})")
        }
        _ => "this command takes no positional arguments (quote list values that contain spaces)"
            .to_string(),
    };
    FlagError::Positional {
        arg: arg.to_string(),
        hint,
    }
}

/// Builds argh's argv: the last setting of each switch and option (every value of a repeatable
/// option), then the positionals.
fn assemble(items: Vec<Item>, help: bool, shapes: &FlagShapes) -> Normalised {
    let mut out = Normalised::default();
    let mut seen = HashSet::new();
    let mut kept = Vec::new();
    for item in items.into_iter().rev() {
        match &item {
            Item::Switch(name, _) | Item::Option(name, _)
                if !shapes.repeatable.contains(&name.as_str()) && !seen.insert(name.clone()) => {}
            _ => kept.push(item),
        }
    }
    let mut positionals = Vec::new();
    for item in kept.into_iter().rev() {
        match item {
            Item::Switch(name, true) => out.args.push(format!("--{name}")),
            Item::Switch(name, false) => {
                out.explicit_false.insert(name);
            }
            Item::Option(name, value) => out.args.extend([format!("--{name}"), value]),
            Item::Unknown(arg) => out.args.push(arg),
            Item::Positional(arg) => positionals.push(arg),
        }
    }
    if help {
        out.args.push("--help".to_string());
    }
    // `--` only when needed: argh would not see a positional `help` after it.
    if positionals.iter().any(|p| p.starts_with('-')) {
        out.args.push("--".to_string());
    }
    out.args.extend(positionals);
    out
}

/// Go's `strconv.ParseBool`.
pub fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Go's `time.ParseDuration` for the units operators use (`ns us µs ms s m h`, decimals, sums).
pub fn parse_go_duration(s: &str) -> Option<Duration> {
    if s == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = s;
    let mut total = 0f64;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return None;
        }
        let value: f64 = rest[..num_len].parse().ok()?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += value * scale;
    }
    Some(Duration::from_secs_f64(total))
}

/// Why `ip` can never be the source address of a packet sent to a pod (the probe SNAT
/// address of install-cni and `istio-iptables ambient`): unspecified, loopback (dropped as
/// martian once routed off `lo`), multicast, broadcast, or IPv4-mapped IPv6 (an IPv4 address in
/// IPv6 clothes, never on an IPv6 wire). `None`: usable.
pub fn unusable_source_ip(ip: std::net::IpAddr) -> Option<&'static str> {
    use std::net::IpAddr;
    match ip {
        IpAddr::V4(a) if a.is_unspecified() => Some("the unspecified address"),
        IpAddr::V4(a) if a.is_loopback() => Some("a loopback address"),
        IpAddr::V4(a) if a.is_multicast() => Some("a multicast address"),
        IpAddr::V4(a) if a.is_broadcast() => Some("the broadcast address"),
        IpAddr::V6(a) if a.is_unspecified() => Some("the unspecified address"),
        IpAddr::V6(a) if a.is_loopback() => Some("a loopback address"),
        IpAddr::V6(a) if a.is_multicast() => Some("a multicast address"),
        IpAddr::V6(a) if a.to_ipv4_mapped().is_some() => Some("an IPv4-mapped address"),
        _ => None,
    }
}

/// Reads environment variables; a seam so config parsing is testable without touching the process
/// environment.
pub trait Env {
    fn get(&self, name: &str) -> Option<String>;
}

/// The process environment.
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn get(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

impl Env for std::collections::HashMap<String, String> {
    fn get(&self, name: &str) -> Option<String> {
        self.get(name).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHAPES: FlagShapes = FlagShapes {
        switches: &["dry-run", "redirect-dns"],
        shorts: &[
            ('p', "envoy-port"),
            ('z', "capture-port"),
            ('u', "proxy-uid"),
            ('n', "dry-run"),
        ],
        underscore_longs: &["log_output_level", "log_target"],
        all_underscores: false,
        bool_options: &["ambient-enabled"],
        repeatable: &["log-target"],
        positionals: false,
    };

    fn norm(args: &[&str]) -> Result<Normalised, FlagError> {
        normalise_args(
            &args.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            &SHAPES,
        )
    }

    #[test]
    fn splits_equals_and_attached_shorts_into_long_forms() {
        let n = norm(&[
            "--proxy-uid=1337",
            "-p15001",
            "-z=15006",
            "--log_output_level=default:info",
            "-u",
            "1",
        ])
        .unwrap();
        assert_eq!(
            n.args,
            vec![
                "--envoy-port",
                "15001",
                "--capture-port",
                "15006",
                "--log-output-level",
                "default:info",
                "--proxy-uid",
                "1"
            ]
        );
    }

    #[test]
    fn a_lone_equals_after_a_short_letter_is_the_value() {
        let n = norm(&["-p=", "-z="]).unwrap();
        assert_eq!(n.args, vec!["--envoy-port", "=", "--capture-port", "="]);
        assert!(norm(&["-n="]).is_err());
    }

    #[test]
    fn switches_take_go_bools() {
        let n = norm(&["--dry-run=true", "--redirect-dns=false"]).unwrap();
        assert_eq!(n.args, vec!["--dry-run"]);
        assert!(n.explicit_false.contains("redirect-dns"));
        let e = norm(&["--dry-run=maybe"]).unwrap_err();
        assert!(
            matches!(e, FlagError::BadValue { ref flag, .. } if flag == "dry-run"),
            "{e}"
        );
    }

    #[test]
    fn bool_options_get_an_explicit_value() {
        let n = norm(&["--ambient-enabled"]).unwrap();
        assert_eq!(n.args, vec!["--ambient-enabled", "true"]);
        let n = norm(&["--ambient-enabled", "--ambient-enabled=false"]).unwrap();
        assert_eq!(n.args, vec!["--ambient-enabled", "false"]);
    }

    #[test]
    fn empty_value_is_kept() {
        assert_eq!(
            norm(&["--dns-servers="]).unwrap().args,
            vec!["--dns-servers", ""]
        );
        assert_eq!(norm(&["-p", ""]).unwrap().args, vec!["--envoy-port", ""]);
    }

    #[test]
    fn a_repeated_option_keeps_its_last_value_whatever_the_spelling() {
        let n = norm(&["-p", "15001", "--envoy-port=15002", "-p16000"]).unwrap();
        assert_eq!(n.args, vec!["--envoy-port", "16000"]);
        let n = norm(&["--log_target", "stdout", "--log-target=/tmp/x"]).unwrap();
        assert_eq!(
            n.args,
            vec!["--log-target", "stdout", "--log-target", "/tmp/x"],
            "string arrays keep every value"
        );
    }

    #[test]
    fn a_repeated_switch_keeps_its_last_setting() {
        let n = norm(&["-n", "--dry-run=false"]).unwrap();
        assert!(n.args.is_empty() && n.explicit_false.contains("dry-run"));
        let n = norm(&["--dry-run=false", "-n"]).unwrap();
        assert_eq!(n.args, vec!["--dry-run"]);
        assert!(n.explicit_false.is_empty());
    }

    #[test]
    fn dash_h_is_help() {
        assert_eq!(norm(&["-h"]).unwrap().args, vec!["--help"]);
    }

    #[test]
    fn a_value_that_looks_like_a_flag_is_still_the_value() {
        let n = norm(&["-p", "-z", "--redirect-dns", "-X"]).unwrap();
        assert_eq!(n.args, vec!["--envoy-port", "-z", "--redirect-dns", "-X"]);
    }

    #[test]
    fn stray_positionals_are_errors() {
        assert_eq!(norm(&["-p"]).unwrap().args, vec!["--envoy-port"]);
        let e = norm(&["-p", "1", "stray"]).unwrap_err();
        assert!(
            matches!(e, FlagError::Positional { ref arg, .. } if arg == "stray"),
            "{e}"
        );
        let e = norm(&["--redirect-dns", "false"]).unwrap_err().to_string();
        assert!(e.contains("--redirect-dns=false"), "{e}");
        assert!(norm(&["--", "x"]).is_err());
        let with_positionals = FlagShapes {
            positionals: true,
            ..SHAPES
        };
        let n = normalise_args(&["version".to_string()], &with_positionals).unwrap();
        assert_eq!(n.args, vec!["version"]);
        let n = normalise_args(&["--".into(), "-x".into()], &with_positionals).unwrap();
        assert_eq!(n.args, vec!["--", "-x"]);
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("5s"), Some(Duration::from_secs(5)));
        assert_eq!(parse_go_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_go_duration("5"), None);
        assert_eq!(parse_go_duration("abc"), None);
    }
}
