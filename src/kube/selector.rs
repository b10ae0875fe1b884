//! Kubernetes label selectors: the one model (k8s-openapi's `LabelSelector`), its string form
//! (`a=b,c!=d,e in (x,y),!f`), validation, and matching with Kubernetes semantics; node-selector
//! matching (DaemonSet scheduling) on the same requirement evaluation.
//!
//! Who decides what an absent selector means: the caller. A present selector with no
//! requirements matches everything, as in Kubernetes.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement};
pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use serde::{Deserialize, Deserializer};

/// Why a selector cannot be used; each names the offending key, operator or text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error("unknown operator {operator:?} on key {key:?} (want In, NotIn, Exists, DoesNotExist)")]
    UnknownOperator { key: String, operator: String },
    #[error("operator {operator} on key {key:?} needs values")]
    MissingValues { key: String, operator: &'static str },
    #[error("operator {operator} on key {key:?} takes no values")]
    UnexpectedValues { key: String, operator: &'static str },
    #[error("invalid label key: {0}")]
    InvalidKey(#[source] super::names::InvalidName),
    #[error("invalid value on key {key:?}: {source}")]
    InvalidValue {
        key: String,
        #[source]
        source: super::names::InvalidName,
    },
    #[error("invalid label value set {text:?}: expected (v1,v2,...)")]
    InvalidValueSet { text: String },
}

/// A requirement operator. `Gt`/`Lt` exist only in node selectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
    Gt,
    Lt,
}

impl Operator {
    fn name(self) -> &'static str {
        match self {
            Operator::In => "In",
            Operator::NotIn => "NotIn",
            Operator::Exists => "Exists",
            Operator::DoesNotExist => "DoesNotExist",
            Operator::Gt => "Gt",
            Operator::Lt => "Lt",
        }
    }

    fn parse(key: &str, text: &str, numeric_allowed: bool) -> Result<Self, SelectorError> {
        Ok(match text {
            "In" => Operator::In,
            "NotIn" => Operator::NotIn,
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            "Gt" if numeric_allowed => Operator::Gt,
            "Lt" if numeric_allowed => Operator::Lt,
            other => {
                return Err(SelectorError::UnknownOperator {
                    key: key.to_string(),
                    operator: other.to_string(),
                });
            }
        })
    }
}

/// One checked requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Requirement {
    key: String,
    operator: Operator,
    values: Vec<String>,
}

impl Requirement {
    fn new(
        key: &str,
        operator: &str,
        values: &[String],
        numeric_allowed: bool,
    ) -> Result<Self, SelectorError> {
        let key = checked_key(key)?;
        let operator = Operator::parse(&key, operator, numeric_allowed)?;
        // Node selectors' `matchFields` values are node names (up to 253 characters), not label
        // values; only label selectors' values follow the label-value rule.
        if !numeric_allowed {
            for value in values {
                super::names::check_label_value(value).map_err(|source| {
                    SelectorError::InvalidValue {
                        key: key.clone(),
                        source,
                    }
                })?;
            }
        }
        let wants_values = !matches!(operator, Operator::Exists | Operator::DoesNotExist);
        if wants_values && values.is_empty() {
            return Err(SelectorError::MissingValues {
                key,
                operator: operator.name(),
            });
        }
        if !wants_values && !values.is_empty() {
            return Err(SelectorError::UnexpectedValues {
                key,
                operator: operator.name(),
            });
        }
        Ok(Requirement {
            key,
            operator,
            values: values.to_vec(),
        })
    }

    /// `value` is the label's value, `None` when the label is absent.
    fn matches(&self, value: Option<&str>) -> bool {
        let listed = |v: &str| self.values.iter().any(|x| x == v);
        let number = |s: &str| s.parse::<i64>().ok();
        match self.operator {
            Operator::In => value.is_some_and(listed),
            // As in Kubernetes: NotIn (and `!=`) also match objects without the label.
            Operator::NotIn => !value.is_some_and(listed),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
            Operator::Gt | Operator::Lt => {
                let (Some(v), Some(bound)) = (
                    value.and_then(number),
                    self.values.first().and_then(|b| number(b)),
                ) else {
                    return false;
                };
                if self.operator == Operator::Gt {
                    v > bound
                } else {
                    v < bound
                }
            }
        }
    }
}

/// A label key as the API server allows it (a qualified name, `kube::names`).
fn checked_key(key: &str) -> Result<String, SelectorError> {
    let key = key.trim();
    super::names::check_qualified_name(key).map_err(SelectorError::InvalidKey)?;
    Ok(key.to_string())
}

/// A checked label selector, ready to match: every requirement must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

impl Selector {
    /// Checks a `LabelSelector`: `matchLabels` are `In` with one value; operators and their values
    /// as the API server validates them.
    pub fn compile(selector: &LabelSelector) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        for (key, value) in selector.match_labels.iter().flatten() {
            requirements.push(Requirement::new(
                key,
                "In",
                std::slice::from_ref(value),
                false,
            )?);
        }
        for r in selector.match_expressions.iter().flatten() {
            let values = r.values.as_deref().unwrap_or_default();
            requirements.push(Requirement::new(&r.key, &r.operator, values, false)?);
        }
        Ok(Selector { requirements })
    }

    /// Parses and checks the string form (`labelSelector=` query parameter).
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        Self::compile(&parse(text)?)
    }

    /// Matches labels looked up by `label(key)`.
    pub fn matches_with<'a>(&self, label: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.requirements.iter().all(|r| r.matches(label(&r.key)))
    }

    /// True when the selector has no requirements (it matches everything).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Matches a label map.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.matches_with(|k| labels.get(k).map(String::as_str))
    }
}

/// Parses the string form into the model. `k=v`/`k==v` become `In (v)`, `k!=v` becomes
/// `NotIn (v)` (the same semantics, including "matches when absent"), `k` is `Exists`, `!k` is
/// `DoesNotExist`; `k in (..)`/`k notin (..)` as written. Empty terms are skipped.
pub fn parse(text: &str) -> Result<LabelSelector, SelectorError> {
    let mut expressions = Vec::new();
    for term in split_top_level(text) {
        let term = term.trim();
        if term.is_empty() {
            continue;
        }
        let r = parse_term(term)?;
        // Checked here so string-form errors name the term's key and operator.
        Requirement::new(
            &r.key,
            &r.operator,
            r.values.as_deref().unwrap_or_default(),
            false,
        )?;
        expressions.push(r);
    }
    Ok(LabelSelector {
        match_labels: None,
        match_expressions: Some(expressions),
    })
}

fn requirement(key: &str, operator: &str, values: Option<Vec<String>>) -> LabelSelectorRequirement {
    LabelSelectorRequirement {
        key: key.trim().to_string(),
        operator: operator.to_string(),
        values,
    }
}

fn parse_term(term: &str) -> Result<LabelSelectorRequirement, SelectorError> {
    if let Some(key) = term.strip_prefix('!') {
        return Ok(requirement(key, "DoesNotExist", None));
    }
    if let Some((key, value)) = term.split_once("!=") {
        return Ok(requirement(key, "NotIn", Some(vec![value.trim().into()])));
    }
    if let Some((key, value)) = term.split_once("==").or_else(|| term.split_once('=')) {
        return Ok(requirement(key, "In", Some(vec![value.trim().into()])));
    }
    for (word, operator) in [(" notin ", "NotIn"), (" in ", "In")] {
        if let Some((key, set)) = term.split_once(word) {
            return Ok(requirement(key, operator, Some(parse_set(set)?)));
        }
    }
    Ok(requirement(term, "Exists", None))
}

/// Splits on commas outside parentheses (`a in (x,y),b` is two terms).
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

fn parse_set(set: &str) -> Result<Vec<String>, SelectorError> {
    let inner = set
        .trim()
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| SelectorError::InvalidValueSet {
            text: set.trim().to_string(),
        })?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

/// The selector's fields, refusing unknown ones: a config typo (`matchLabel`) would otherwise
/// silently select everything.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StrictSelector {
    #[serde(rename = "matchLabels", default)]
    match_labels: Option<BTreeMap<String, String>>,
    #[serde(rename = "matchExpressions", default)]
    match_expressions: Option<Vec<StrictRequirement>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StrictRequirement {
    key: String,
    operator: String,
    #[serde(default)]
    values: Option<Vec<String>>,
}

/// `deserialize_with` for an optional selector in a config file: unknown fields are errors, and
/// empty lists read as absent (so re-serializing writes what was meant).
pub fn deserialize_strict<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<LabelSelector>, D::Error> {
    let Some(s) = Option::<StrictSelector>::deserialize(d)? else {
        return Ok(None);
    };
    let non_empty = |v: Vec<String>| (!v.is_empty()).then_some(v);
    Ok(Some(LabelSelector {
        match_labels: s.match_labels.filter(|m| !m.is_empty()),
        match_expressions: s.match_expressions.filter(|e| !e.is_empty()).map(|exprs| {
            exprs
                .into_iter()
                .map(|r| LabelSelectorRequirement {
                    key: r.key,
                    operator: r.operator,
                    values: r.values.and_then(non_empty),
                })
                .collect()
        }),
    }))
}

/// A plain map selector (a pod's `nodeSelector`): every pair must be present with that value.
pub fn map_selector_matches(
    selector: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// Kubernetes node-selector semantics: terms are ORed, requirements within a term ANDed; an empty
/// term, or one with a requirement that is not valid, matches nothing; `matchFields` supports
/// `metadata.name`.
pub fn node_selector_matches(
    selector: &NodeSelector,
    labels: &BTreeMap<String, String>,
    node_name: &str,
) -> bool {
    let holds = |r: &NodeSelectorRequirement, value: Option<&str>| {
        let values = r.values.as_deref().unwrap_or_default();
        Requirement::new(&r.key, &r.operator, values, true).is_ok_and(|req| req.matches(value))
    };
    selector.node_selector_terms.iter().any(|term| {
        let exprs = term.match_expressions.as_deref().unwrap_or_default();
        let fields = term.match_fields.as_deref().unwrap_or_default();
        if exprs.is_empty() && fields.is_empty() {
            return false;
        }
        exprs
            .iter()
            .all(|r| holds(r, labels.get(&r.key).map(String::as_str)))
            && fields.iter().all(|r| {
                let value = (r.key == "metadata.name").then_some(node_name);
                holds(r, value)
            })
    })
}

pub mod enablement;

#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;
