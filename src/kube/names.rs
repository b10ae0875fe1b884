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
    /// `[A-Za-z0-9-]`, alphanumeric at both ends, at most 63 characters (namespaces).
    Label,
    /// Labels joined by `.`, at most 253 characters (pods).
    Subdomain,
}

impl fmt::Display for NameRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NameRule::Label => "DNS-1123 label",
            NameRule::Subdomain => "DNS-1123 subdomain",
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
    /// A character outside `[A-Za-z0-9-]` (and `.` for subdomains), with its byte offset.
    BadChar {
        ch: char,
        at: usize,
    },
    /// A label (a whole label name, or one `.`-separated part) starts or ends with `-`, or a part
    /// is empty (`a..b`, `.a`, `a.`).
    BadEdge,
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
                "character '{}' at offset {at} is not allowed (only ASCII letters, digits, '-' and, in pod names, '.')",
                ch.escape_debug()
            ),
            NameProblem::BadEdge => {
                f.write_str("each part must start and end with a letter or digit (no empty parts)")
            }
        }
    }
}

/// A value that is not a valid Kubernetes name. The message repeats at most
/// [`ECHO_MAX_CHARS`] characters of it, control characters escaped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("\"{}\" is not a valid {rule}: {problem}", echo(value))]
pub struct InvalidName {
    pub rule: NameRule,
    pub value: String,
    pub problem: NameProblem,
}

/// A namespace name (DNS-1123 label).
pub fn check_namespace(value: &str) -> Result<(), InvalidName> {
    check(value, NameRule::Label)
}

/// A pod name (DNS-1123 subdomain).
pub fn check_pod_name(value: &str) -> Result<(), InvalidName> {
    check(value, NameRule::Subdomain)
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
    if value.is_empty() {
        return Some(NameProblem::Empty);
    }
    let max = match rule {
        NameRule::Label => LABEL_MAX,
        NameRule::Subdomain => SUBDOMAIN_MAX,
    };
    // Every allowed character is ASCII, so a too-long value is too long in bytes as well.
    let chars = value.chars().count();
    if chars > max {
        return Some(NameProblem::TooLong { chars, max });
    }
    let allowed = |c: char| {
        c.is_ascii_alphanumeric() || c == '-' || (c == '.' && rule == NameRule::Subdomain)
    };
    if let Some((at, ch)) = value.char_indices().find(|(_, c)| !allowed(*c)) {
        return Some(NameProblem::BadChar { ch, at });
    }
    let edges_ok = |part: &str| {
        let alnum = |b: u8| b.is_ascii_alphanumeric();
        let bytes = part.as_bytes();
        bytes.first().copied().is_some_and(alnum) && bytes.last().copied().is_some_and(alnum)
    };
    if !value.split('.').all(edges_ok) {
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
