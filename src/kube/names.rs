//! Kubernetes object names, checked before they become part of a request path: a name from outside
//! (the plugin's `CNI_ARGS`, a flag) that is not a valid name must never reach the API server as
//! `/api/v1/namespaces/../../etc/pods/a/b`. The rules are the API server's own — namespaces are
//! DNS-1123 labels, pods DNS-1123 subdomains — except that ASCII upper case is let through: it
//! cannot change a request path, the API server answers such a lookup with NotFound, and Istio's
//! own plugin fixtures (`testNS`/`testPod`) use it.

use std::fmt;

/// Longest DNS-1123 label (a namespace name).
pub const LABEL_MAX: usize = 63;
/// Longest DNS-1123 subdomain (a pod name).
pub const SUBDOMAIN_MAX: usize = 253;
/// How many characters of a rejected value an error message repeats.
pub const ECHO_MAX_CHARS: usize = 64;

/// Which naming rule a value broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameRule {
    /// `[A-Za-z0-9-]`, alphanumeric at both ends, at most 63 characters (namespace lookups).
    Label,
    /// Labels joined by `.`, at most 253 characters (pod lookups).
    Subdomain,
    /// A DNS-1123 label exactly as the API server creates one: lower case only (a setting that
    /// must match a real namespace or container name; upper case could never match).
    StrictLabel,
    /// A DNS-1123 subdomain, lower case only (a node name in a setting).
    StrictSubdomain,
    /// A label key or annotation name: an optional lower-case DNS-1123 subdomain prefix and `/`,
    /// then a name of at most 63 `[A-Za-z0-9._-]`, alphanumeric at both ends.
    QualifiedName,
    /// A label value: empty, or at most 63 `[A-Za-z0-9._-]`, alphanumeric at both ends.
    LabelValue,
}

impl NameRule {
    /// The characters the rule allows, for the error message.
    fn allowed(self) -> &'static str {
        match self {
            NameRule::Label | NameRule::Subdomain => {
                "ASCII letters, digits, '-' and, in pod names, '.'"
            }
            NameRule::StrictLabel => "lower-case ASCII letters, digits and '-'",
            NameRule::StrictSubdomain => "lower-case ASCII letters, digits, '-' and '.'",
            NameRule::QualifiedName => {
                "ASCII letters, digits, '-', '_' and '.' in the name; lower-case letters, \
                 digits, '-' and '.' in the prefix before one '/'"
            }
            NameRule::LabelValue => "ASCII letters, digits, '-', '_' and '.'",
        }
    }
}

impl fmt::Display for NameRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NameRule::Label | NameRule::StrictLabel => "DNS-1123 label",
            NameRule::Subdomain | NameRule::StrictSubdomain => "DNS-1123 subdomain",
            NameRule::QualifiedName => "Kubernetes qualified name (label key or annotation name)",
            NameRule::LabelValue => "Kubernetes label value",
        })
    }
}

/// What exactly is wrong with the value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameProblem {
    Empty,
    TooLong {
        chars: usize,
        max: usize,
    },
    /// A character the rule does not allow, with its byte offset.
    BadChar {
        ch: char,
        at: usize,
    },
    /// A label (a whole label name, or one `.`-separated part) starts or ends with `-`, or a part
    /// is empty (`a..b`, `.a`, `a.`).
    BadEdge,
    /// A qualified name with more than one `/`.
    ExtraSlash,
}

impl fmt::Display for NameProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NameProblem::Empty => f.write_str("it is empty"),
            NameProblem::TooLong { chars, max } => {
                write!(f, "it is {chars} characters long (at most {max})")
            }
            NameProblem::BadChar { ch, at } => write!(
                f,
                "character '{}' at offset {at} is not allowed",
                ch.escape_debug()
            ),
            NameProblem::BadEdge => {
                f.write_str("each part must start and end with a letter or digit (no empty parts)")
            }
            NameProblem::ExtraSlash => f.write_str("it has more than one '/'"),
        }
    }
}

/// A value that is not a valid Kubernetes name. The message repeats at most
/// [`ECHO_MAX_CHARS`] characters of it, control characters escaped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct InvalidName {
    pub rule: NameRule,
    pub value: String,
    pub problem: NameProblem,
}

impl fmt::Display for InvalidName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = echo(&self.value);
        write!(
            f,
            "\"{value}\" is not a valid {}: {}",
            self.rule, self.problem
        )?;
        if let NameProblem::BadChar { .. } = self.problem {
            write!(f, " (only {})", self.rule.allowed())?;
        }
        Ok(())
    }
}

/// A namespace name (DNS-1123 label).
pub fn check_namespace(value: &str) -> Result<(), InvalidName> {
    check(value, NameRule::Label)
}

/// A pod name (DNS-1123 subdomain).
pub fn check_pod_name(value: &str) -> Result<(), InvalidName> {
    check(value, NameRule::Subdomain)
}

/// A label key or annotation name (Kubernetes' qualified name).
pub fn check_qualified_name(value: &str) -> Result<(), InvalidName> {
    check(value, NameRule::QualifiedName)
}

/// A label value (may be empty).
pub fn check_label_value(value: &str) -> Result<(), InvalidName> {
    check(value, NameRule::LabelValue)
}

/// Checks `value` against `rule`.
pub fn check(value: &str, rule: NameRule) -> Result<(), InvalidName> {
    problem(value, rule).map_or(Ok(()), |problem| {
        Err(InvalidName {
            rule,
            value: value.to_string(),
            problem,
        })
    })
}

fn problem(value: &str, rule: NameRule) -> Option<NameProblem> {
    match rule {
        NameRule::QualifiedName => qualified_problem(value),
        NameRule::LabelValue if value.is_empty() => None,
        NameRule::LabelValue => segment_problem(value, 0, LABEL_MAX, name_char),
        _ => dns_problem(value, rule),
    }
}

/// The name part of a qualified name, and label values.
fn name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

/// `prefix/name` or `name`: the prefix a lower-case DNS-1123 subdomain, the name a 63-character
/// segment. Offsets in the problem are into the whole value.
fn qualified_problem(value: &str) -> Option<NameProblem> {
    if value.is_empty() {
        return Some(NameProblem::Empty);
    }
    match value.split_once('/') {
        None => segment_problem(value, 0, LABEL_MAX, name_char),
        Some((_, name)) if name.contains('/') => Some(NameProblem::ExtraSlash),
        Some((prefix, name)) => dns_problem(prefix, NameRule::StrictSubdomain)
            .map(|p| match p {
                NameProblem::Empty => NameProblem::BadEdge,
                p => p,
            })
            .or_else(|| segment_problem(name, prefix.len() + 1, LABEL_MAX, name_char)),
    }
}

/// A non-empty run of `allowed` characters, at most `max` long, alphanumeric at both ends.
fn segment_problem(
    value: &str,
    offset: usize,
    max: usize,
    allowed: fn(char) -> bool,
) -> Option<NameProblem> {
    if let Some(problem) = run_problem(value, offset, max, allowed) {
        return Some(problem);
    }
    (!alnum_edges(value)).then_some(NameProblem::BadEdge)
}

/// Whether `part` starts and ends with an ASCII letter or digit.
fn alnum_edges(part: &str) -> bool {
    let bytes = part.as_bytes();
    let alnum = |b: &u8| b.is_ascii_alphanumeric();
    bytes.first().is_some_and(alnum) && bytes.last().is_some_and(alnum)
}

/// A non-empty run of `allowed` characters, at most `max` long; `offset` places a bad character
/// within the whole value.
fn run_problem(
    value: &str,
    offset: usize,
    max: usize,
    allowed: impl Fn(char) -> bool,
) -> Option<NameProblem> {
    if value.is_empty() {
        return Some(NameProblem::Empty);
    }
    // Every allowed character is ASCII, so a too-long value is too long in bytes as well.
    let chars = value.chars().count();
    if chars > max {
        return Some(NameProblem::TooLong { chars, max });
    }
    let (at, ch) = value.char_indices().find(|(_, c)| !allowed(*c))?;
    Some(NameProblem::BadChar {
        ch,
        at: at + offset,
    })
}

fn dns_problem(value: &str, rule: NameRule) -> Option<NameProblem> {
    let strict = matches!(rule, NameRule::StrictLabel | NameRule::StrictSubdomain);
    let dotted = matches!(rule, NameRule::Subdomain | NameRule::StrictSubdomain);
    let max = if dotted { SUBDOMAIN_MAX } else { LABEL_MAX };
    let allowed = |c: char| {
        let letter = if strict {
            c.is_ascii_lowercase()
        } else {
            c.is_ascii_alphabetic()
        };
        letter || c.is_ascii_digit() || c == '-' || (c == '.' && dotted)
    };
    if let Some(problem) = run_problem(value, 0, max, allowed) {
        return Some(problem);
    }
    if !value.split('.').all(alnum_edges) {
        return Some(NameProblem::BadEdge);
    }
    None
}

/// A value as error messages and logs repeat it: at most [`ECHO_MAX_CHARS`] characters, control
/// characters and quotes escaped (so it cannot break a log line or the quoting around it), and
/// `…` when it was cut.
pub fn echo(value: &str) -> String {
    let mut out = String::new();
    let mut chars = value.chars();
    for c in chars.by_ref().take(ECHO_MAX_CHARS) {
        if c.is_control() || c == '"' || c == '\\' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    if chars.next().is_some() {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_are_labels() {
        // Upper case cannot change a path; Istio's fixtures use it (testNS).
        for ok in [
            "a",
            "default",
            "istio-system",
            "a1",
            "0",
            "testNS",
            &"a".repeat(63),
        ] {
            assert_eq!(check_namespace(ok), Ok(()), "{ok}");
        }
        let bad = [
            ("", NameProblem::Empty),
            ("../../etc", NameProblem::BadChar { ch: '.', at: 0 }),
            ("a.b", NameProblem::BadChar { ch: '.', at: 1 }),
            ("a/b", NameProblem::BadChar { ch: '/', at: 1 }),
            ("a b", NameProblem::BadChar { ch: ' ', at: 1 }),
            ("a%2F", NameProblem::BadChar { ch: '%', at: 1 }),
            ("ns\n", NameProblem::BadChar { ch: '\n', at: 2 }),
            ("é", NameProblem::BadChar { ch: 'é', at: 0 }),
            ("-a", NameProblem::BadEdge),
            ("a-", NameProblem::BadEdge),
            (&"a".repeat(64), NameProblem::TooLong { chars: 64, max: 63 }),
        ];
        for (value, problem) in bad {
            let err = check_namespace(value).unwrap_err();
            assert_eq!(err.problem, problem, "{value:?}");
            assert_eq!(err.rule, NameRule::Label);
        }
    }

    #[test]
    fn pod_names_are_subdomains() {
        for ok in [
            "p",
            "web-0",
            "a.b.c",
            "my-pod-7d9f8.x1",
            "testPod",
            &"a".repeat(253),
        ] {
            assert_eq!(check_pod_name(ok), Ok(()), "{ok}");
        }
        for bad in [
            "", "a/b", "..", ".", "a..b", ".a", "a.", "-a.b", "a.b-", "a.-b", "a_b", "a?x=1",
        ] {
            assert!(check_pod_name(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(
            check_pod_name(&"a".repeat(254)).unwrap_err().problem,
            NameProblem::TooLong {
                chars: 254,
                max: 253
            }
        );
    }

    #[test]
    fn label_keys_and_annotation_names_are_qualified_names() {
        for ok in [
            "app",
            "cni.istio.io/uninitialized",
            "sidecar.istio.io/status",
            "a_b.C-9",
            "x/Y",
            &format!("{}/{}", "a".repeat(253), "b".repeat(63)),
        ] {
            assert_eq!(check_qualified_name(ok), Ok(()), "{ok}");
        }
        let long_name = format!("p/{}", "b".repeat(64));
        let long_prefix = format!("{}/b", "a".repeat(254));
        let bad = [
            ("", NameProblem::Empty),
            ("/a", NameProblem::BadEdge),
            ("a/", NameProblem::Empty),
            ("a/b/c", NameProblem::ExtraSlash),
            ("Cni.io/a", NameProblem::BadChar { ch: 'C', at: 0 }),
            ("cni_io/a", NameProblem::BadChar { ch: '_', at: 3 }),
            ("x/a b", NameProblem::BadChar { ch: ' ', at: 3 }),
            ("a=b", NameProblem::BadChar { ch: '=', at: 1 }),
            ("-a", NameProblem::BadEdge),
            ("a.", NameProblem::BadEdge),
            ("x/_a", NameProblem::BadEdge),
            ("a..b/c", NameProblem::BadEdge),
            (&long_name, NameProblem::TooLong { chars: 64, max: 63 }),
            (
                &long_prefix,
                NameProblem::TooLong {
                    chars: 254,
                    max: 253,
                },
            ),
        ];
        for (value, problem) in bad {
            let err = check_qualified_name(value).unwrap_err();
            assert_eq!(err.problem, problem, "{value:?}");
            assert!(err.to_string().contains("qualified name"), "{err}");
        }
    }

    #[test]
    fn label_values_may_be_empty_and_are_otherwise_names() {
        for ok in ["", "true", "a.b_c-D", &"v".repeat(63)] {
            assert_eq!(check_label_value(ok), Ok(()), "{ok}");
        }
        for bad in ["a/b", "-x", "x-", "a b", "é", &"v".repeat(64)] {
            assert!(check_label_value(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn strict_rules_refuse_upper_case() {
        assert!(check("istio-system", NameRule::StrictLabel).is_ok());
        assert!(check("node-1.example.com", NameRule::StrictSubdomain).is_ok());
        let err = check("Istio-System", NameRule::StrictLabel).unwrap_err();
        assert_eq!(err.problem, NameProblem::BadChar { ch: 'I', at: 0 });
        assert!(err.to_string().contains("lower-case"), "{err}");
        assert!(check("a.b", NameRule::StrictLabel).is_err());
        assert!(check("Node-1", NameRule::StrictSubdomain).is_err());
    }

    #[test]
    fn messages_are_bounded_and_escaped() {
        let err = check_namespace("../../etc").unwrap_err();
        assert_eq!(
            err.to_string(),
            "\"../../etc\" is not a valid DNS-1123 label: character '.' at offset 0 is not \
             allowed (only ASCII letters, digits, '-' and, in pod names, '.')"
        );
        let long = format!("x\n\u{1b}[31m\"{}", "A".repeat(10_000));
        let text = check_pod_name(&long).unwrap_err().to_string();
        assert!(text.len() < 400, "{text}");
        assert!(!text.contains('\n') && !text.contains('\u{1b}'), "{text}");
        assert!(text.starts_with(r#""x\n\u{1b}[31m\"AAA"#), "{text}");
        assert!(text.contains("…\""), "{text}");
        assert_eq!(echo("short"), "short");
        assert_eq!(echo(&"é".repeat(64)), "é".repeat(64));
        assert_eq!(echo(&"é".repeat(65)), format!("{}…", "é".repeat(64)));
    }
}
