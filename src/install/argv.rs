//! pflag-style argv normalising in front of argh.
//!
//! argh matches options by exact string and always takes the value from the next argument, while
//! Istio's command lines (and the chart) use pflag forms: `--flag=value`, bare `--bool-flag`,
//! `--bool-flag=false` and underscore names such as `--log_output_level`. This rewrites those forms
//! into what argh understands. Every boolean is declared to argh as a value option so that an
//! explicit `--flag=false` still beats the env var (flag > env > default).

/// Rewrites `args` (without the program name) for argh.
///
/// `is_bool` says whether a (dash-form, without `--`) long flag name is a boolean flag.
pub fn normalise(args: &[String], is_bool: &dyn Fn(&str) -> bool) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len() + 4);
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if arg == "--" {
            out.push(arg.clone());
            out.extend(iter.by_ref().cloned());
            break;
        }
        let Some(body) = arg.strip_prefix("--") else {
            out.push(arg.clone());
            continue;
        };
        let (name, value) = match body.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (body, None),
        };
        // pflag names here use underscores for the istio logging flags; argh only allows dashes.
        let name = name.replace('_', "-");
        if name == "help" {
            out.push("--help".to_string());
            continue;
        }
        out.push(format!("--{name}"));
        match value {
            Some(v) => out.push(v.to_string()),
            None if is_bool(&name) => out.push("true".to_string()),
            None => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(args: &[&str]) -> Vec<String> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        normalise(&args, &|n| n == "ambient-enabled" || n == "log-as-json")
    }

    #[test]
    fn splits_equals_and_maps_underscores() {
        assert_eq!(
            norm(&[
                "--log_output_level=default:info",
                "--cni-conf-name",
                "x.conf"
            ]),
            [
                "--log-output-level",
                "default:info",
                "--cni-conf-name",
                "x.conf"
            ]
        );
    }

    #[test]
    fn bare_bool_becomes_true_and_explicit_false_is_kept() {
        assert_eq!(
            norm(&["--log_as_json", "--ambient-enabled=false"]),
            ["--log-as-json", "true", "--ambient-enabled", "false"]
        );
    }

    #[test]
    fn value_with_equals_sign_is_kept_whole() {
        assert_eq!(
            norm(&["--repair-field-selectors=a=b"]),
            ["--repair-field-selectors", "a=b"]
        );
    }

    #[test]
    fn double_dash_stops_rewriting() {
        assert_eq!(norm(&["--", "--x=y"]), ["--", "--x=y"]);
    }
}
