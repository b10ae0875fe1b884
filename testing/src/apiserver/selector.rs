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

/// A `labelSelector` query parameter, in the one selector model (`istio_cni::kube::selector`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    selector: istio_cni::kube::selector::Selector,
}

impl LabelSelector {
    pub fn parse(text: &str) -> Result<Self, String> {
        let selector =
            istio_cni::kube::selector::Selector::parse(text).map_err(|e| e.to_string())?;
        Ok(LabelSelector { selector })
    }

    pub fn matches(&self, object: &Value) -> bool {
        let labels = object.get("metadata").and_then(|m| m.get("labels"));
        self.selector
            .matches_with(|key| labels.and_then(|l| l.get(key)).and_then(Value::as_str))
    }
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

    /// The operators are `istio_cni::kube::selector`'s (tested there); this checks that the labels are read
    /// from the JSON object, and that a missing `labels` map means no labels.
    #[test]
    fn label_selector_reads_the_objects_labels() {
        let p = pod("n1", json!({"app": "a"}));
        let holds = |text: &str, object: &Value| {
            LabelSelector::parse(text).expect("parses").matches(object)
        };
        assert!(holds("app=a", &p) && holds("!other", &p) && holds("", &p));
        assert!(!holds("app notin (a)", &p));
        let bare = json!({"metadata": {"name": "p"}});
        assert!(holds("!app", &bare) && !holds("app", &bare));
        assert!(LabelSelector::parse("a in b").is_err());
    }
}
