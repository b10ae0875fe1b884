//! Command-line plumbing shared by every role: pflag-style argv normalising for argh, env-var
//! fallbacks, Go-compatible bool and duration parsing.
//! May call: nothing else in this crate.

use std::collections::HashSet;
use std::time::Duration;

/// How the flags of one command are shaped, for [`normalise_args`].
pub struct FlagShapes<'a> {
    /// Long names (without `--`) of boolean switches.
    pub switches: &'a [&'a str],
    /// Short letters of options that take a value.
    pub value_shorts: &'a [char],
    /// Long names spelled with underscores upstream (`log_output_level`); rewritten to dashes.
    pub underscore_longs: &'a [&'a str],
    /// Rewrite every underscore in long names to a dash (commands with no underscore-named flags
    /// of their own, so any `--log_x` upstream spelling maps onto `--log-x`).
    pub all_underscores: bool,
    /// Long names of booleans that argh takes as value options (`--flag true|false`), so that an
    /// explicit false stays visible to the parser: bare `--flag` becomes `--flag true`.
    pub bool_options: &'a [&'a str],
}

/// argv rewritten into the one form argh understands, plus the switches set to false explicitly.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Normalised {
    pub args: Vec<String>,
    pub explicit_false: HashSet<String>,
}

/// A pflag form argh cannot take was malformed.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid value {value:?} for flag --{flag}: {reason}")]
pub struct FlagError {
    pub flag: String,
    pub value: String,
    pub reason: String,
}

/// Rewrites pflag forms into argh's: `--k=v` → `--k v`; `-pV`/`-p=V` → `-p V`; `--switch=true` →
/// `--switch`; `--switch=false` is dropped and remembered (so an env var cannot turn it back on).
pub fn normalise_args(args: &[String], shapes: &FlagShapes) -> Result<Normalised, FlagError> {
    let mut out = Normalised::default();
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if arg == "--" {
            out.args.push(arg.clone());
            out.args.extend(iter.by_ref().cloned());
            break;
        }
        if let Some(long) = arg.strip_prefix("--") {
            let (name, value) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (long, None),
            };
            let name = if shapes.all_underscores || shapes.underscore_longs.contains(&name) {
                name.replace('_', "-")
            } else {
                name.to_string()
            };
            if shapes.switches.contains(&name.as_str()) {
                match value.map(|v| parse_go_bool(v).ok_or(v)) {
                    None | Some(Ok(true)) => out.args.push(format!("--{name}")),
                    Some(Ok(false)) => {
                        out.explicit_false.insert(name);
                    }
                    Some(Err(v)) => {
                        return Err(FlagError {
                            flag: name,
                            value: v.to_string(),
                            reason: "expected true or false".into(),
                        });
                    }
                }
            } else {
                out.args.push(format!("--{name}"));
                match value {
                    Some(v) => out.args.push(v.to_string()),
                    None if shapes.bool_options.contains(&name.as_str()) => {
                        out.args.push("true".to_string())
                    }
                    None => {}
                }
            }
            continue;
        }
        let mut chars = arg.chars();
        if let (Some('-'), Some(short), rest) = (chars.next(), chars.next(), chars.as_str())
            && shapes.value_shorts.contains(&short)
            && !rest.is_empty()
        {
            out.args.push(format!("-{short}"));
            out.args
                .push(rest.strip_prefix('=').unwrap_or(rest).to_string());
            continue;
        }
        out.args.push(arg.clone());
    }
    Ok(out)
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
        value_shorts: &['p', 'z'],
        underscore_longs: &["log_output_level"],
        all_underscores: false,
        bool_options: &["ambient-enabled"],
    };

    fn norm(args: &[&str]) -> Result<Normalised, FlagError> {
        normalise_args(
            &args.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            &SHAPES,
        )
    }

    #[test]
    fn splits_equals_and_attached_shorts() {
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
                "--proxy-uid",
                "1337",
                "-p",
                "15001",
                "-z",
                "15006",
                "--log-output-level",
                "default:info",
                "-u",
                "1"
            ]
        );
    }

    #[test]
    fn switches_take_go_bools() {
        let n = norm(&["--dry-run=true", "--redirect-dns=false"]).unwrap();
        assert_eq!(n.args, vec!["--dry-run"]);
        assert!(n.explicit_false.contains("redirect-dns"));
        assert_eq!(norm(&["--dry-run=maybe"]).unwrap_err().flag, "dry-run");
    }

    #[test]
    fn bool_options_get_an_explicit_value() {
        let n = norm(&["--ambient-enabled", "--ambient-enabled=false"]).unwrap();
        assert_eq!(
            n.args,
            vec!["--ambient-enabled", "true", "--ambient-enabled", "false"]
        );
    }

    #[test]
    fn empty_value_is_kept() {
        assert_eq!(
            norm(&["--dns-servers="]).unwrap().args,
            vec!["--dns-servers", ""]
        );
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
