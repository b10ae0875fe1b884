//! Field and label selectors as the API server parses and applies them, on objects held as JSON.

use serde_json::Value;

/// Which object kind a selector is for: the API server accepts only some field labels per kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Pod,
    Namespace,
}

impl Kind {
    fn supports_field(self, field: &str) -> bool {
        match self {
            Kind::Pod => matches!(
                field,
                "metadata.name"
                    | "metadata.namespace"
                    | "spec.nodeName"
                    | "spec.restartPolicy"
                    | "spec.schedulerName"
                    | "spec.serviceAccountName"
                    | "spec.hostNetwork"
                    | "status.phase"
                    | "status.podIP"
                    | "status.nominatedNodeName"
            ),
            Kind::Namespace => matches!(field, "metadata.name" | "status.phase"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct FieldTerm {
    field: String,
    value: String,
    negated: bool,
}

/// `a=b,c!=d` over a fixed set of field paths; every term must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    terms: Vec<FieldTerm>,
}

impl FieldSelector {
    pub fn parse(kind: Kind, text: &str) -> Result<Self, String> {
        let mut terms = Vec::new();
        // Empty terms are skipped: the repair controller prepends a possibly empty user selector.
        for raw in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, value, negated) = if let Some((f, v)) = raw.split_once("!=") {
                (f, v, true)
            } else if let Some((f, v)) = raw.split_once("==") {
                (f, v, false)
            } else if let Some((f, v)) = raw.split_once('=') {
                (f, v, false)
            } else {
                return Err(format!("invalid field selector term {raw:?}"));
            };
            let field = field.trim();
            if !kind.supports_field(field) {
                return Err(format!("field label not supported: {field}"));
            }
            terms.push(FieldTerm {
                field: field.to_string(),
                value: value.trim().to_string(),
                negated,
            });
        }
        Ok(FieldSelector { terms })
    }

    pub fn matches(&self, object: &Value) -> bool {
        self.terms.iter().all(|term| {
            let actual = field_value(object, &term.field);
            (actual == term.value) != term.negated
        })
    }
}

/// The string form the API server compares: absent fields are "" (booleans "false").
fn field_value(object: &Value, path: &str) -> String {
    let found = path.split('.').try_fold(object, |node, key| node.get(key));
    match found {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => n.to_string(),
        _ if path == "spec.hostNetwork" => "false".to_string(),
        _ => String::new(),
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelRequirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// Equality (`=`, `==`, `!=`), set (`in`, `notin`) and existence (`k`, `!k`) requirements.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<LabelRequirement>,
}

impl LabelSelector {
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        for raw in split_top_level(text) {
            let raw = raw.trim();
            if raw.is_empty() {
                continue;
            }
            requirements.push(parse_requirement(raw)?);
        }
        Ok(LabelSelector { requirements })
    }

    pub fn matches(&self, object: &Value) -> bool {
        let labels = object.get("metadata").and_then(|m| m.get("labels"));
        let label = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
        self.requirements.iter().all(|req| match req {
            LabelRequirement::Equals(k, v) => label(k) == Some(v.as_str()),
            // As in Kubernetes: `k!=v` also matches objects without the label.
            LabelRequirement::NotEquals(k, v) => label(k) != Some(v.as_str()),
            LabelRequirement::In(k, vs) => label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            LabelRequirement::NotIn(k, vs) => !label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            LabelRequirement::Exists(k) => label(k).is_some(),
            LabelRequirement::DoesNotExist(k) => label(k).is_none(),
        })
    }
}

/// Splits on commas outside parentheses (`a in (x,y),b` is two requirements).
fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn parse_requirement(raw: &str) -> Result<LabelRequirement, String> {
    if let Some(key) = raw.strip_prefix('!') {
        return Ok(LabelRequirement::DoesNotExist(checked_key(key)?));
    }
    if let Some((key, value)) = raw.split_once("!=") {
        return Ok(LabelRequirement::NotEquals(
            checked_key(key)?,
            value.trim().into(),
        ));
    }
    if let Some((key, value)) = raw.split_once("==").or_else(|| raw.split_once('=')) {
        return Ok(LabelRequirement::Equals(
            checked_key(key)?,
            value.trim().into(),
        ));
    }
    for (op, negated) in [(" notin ", true), (" in ", false)] {
        if let Some((key, set)) = raw.split_once(op) {
            let values = parse_set(set)?;
            let key = checked_key(key)?;
            return Ok(if negated {
                LabelRequirement::NotIn(key, values)
            } else {
                LabelRequirement::In(key, values)
            });
        }
    }
    Ok(LabelRequirement::Exists(checked_key(raw)?))
}

fn checked_key(key: &str) -> Result<String, String> {
    let key = key.trim();
    let valid = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if valid {
        Ok(key.to_string())
    } else {
        Err(format!("invalid label key {key:?}"))
    }
}

fn parse_set(set: &str) -> Result<Vec<String>, String> {
    let inner = set
        .trim()
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| format!("invalid label value set {set:?}"))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(node: &str, labels: Value) -> Value {
        json!({"metadata": {"name": "p", "namespace": "ns", "labels": labels},
               "spec": {"nodeName": node}, "status": {"phase": "Running"}})
    }

    #[test]
    fn field_selector_equality_inequality_and_empty_terms() {
        let p = pod("n1", json!({}));
        let on_n1 = FieldSelector::parse(Kind::Pod, ",spec.nodeName=n1").expect("parses");
        assert!(on_n1.matches(&p));
        assert!(!on_n1.matches(&pod("n2", json!({}))));
        let not_n1 = FieldSelector::parse(Kind::Pod, "spec.nodeName!=n1,metadata.namespace==ns")
            .expect("parses");
        assert!(!not_n1.matches(&p));
        assert!(
            FieldSelector::parse(Kind::Pod, "spec.hostNetwork=false")
                .expect("parses")
                .matches(&p)
        );
    }

    #[test]
    fn field_selector_rejects_unsupported_fields() {
        let err = FieldSelector::parse(Kind::Namespace, "spec.nodeName=n1").expect_err("rejected");
        assert_eq!(err, "field label not supported: spec.nodeName");
        assert!(FieldSelector::parse(Kind::Pod, "novalue").is_err());
    }

    #[test]
    fn label_selector_all_operators() {
        let p = pod(
            "n1",
            json!({"app": "a", "istio.io/dataplane-mode": "ambient"}),
        );
        let cases = [
            ("app=a", true),
            ("app==a", true),
            ("app!=a", false),
            ("other!=x", true),
            ("app", true),
            ("!app", false),
            ("!other", true),
            ("app in (a, b),istio.io/dataplane-mode", true),
            ("app notin (a)", false),
            ("app notin (x,y)", true),
            ("missing in (a)", false),
            ("", true),
        ];
        for (selector, expected) in cases {
            let parsed = LabelSelector::parse(selector).expect("parses");
            assert_eq!(parsed.matches(&p), expected, "{selector}");
        }
        assert!(LabelSelector::parse("a in b").is_err());
        assert!(LabelSelector::parse("bad key=1").is_err());
    }
}
