//! Ambient enablement selectors: pairs of pod and namespace label selectors. One
//! implementation for the plugin (is this new pod ambient?), the installer (the setting it parses
//! and hands to the plugin) and the node agent (enrolment, namespace re-evaluation).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{LabelSelector, Selector, SelectorError};

/// The annotation a sidecar injector leaves on a pod; such pods are never ambient.
pub const SIDECAR_STATUS_ANNOTATION: &str = "sidecar.istio.io/status";

/// One selector pair as written in `AMBIENT_ENABLEMENT_SELECTOR` / the plugin config. An absent
/// selector selects everything.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct EnablementSelector {
    #[serde(
        deserialize_with = "super::deserialize_strict",
        skip_serializing_if = "Option::is_none"
    )]
    pub pod_selector: Option<LabelSelector>,
    #[serde(
        deserialize_with = "super::deserialize_strict",
        skip_serializing_if = "Option::is_none"
    )]
    pub namespace_selector: Option<LabelSelector>,
}

/// The facts of a pod the decision needs.
#[derive(Debug, Clone, Copy)]
pub struct PodFacts<'a> {
    pub labels: &'a BTreeMap<String, String>,
    pub annotations: &'a BTreeMap<String, String>,
    pub host_network: bool,
}

/// Why a pod is not ambient.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotSelected {
    HostNetwork,
    SidecarInjected,
    /// No selector pair matches the pod's and its namespace's labels.
    NoSelectorMatches,
}

/// Selector pairs compiled once (operators and keys checked).
#[derive(Debug, Clone, Default)]
pub struct Enablement {
    pairs: Vec<(Option<Selector>, Option<Selector>)>,
}

impl Enablement {
    pub fn compile(selectors: &[EnablementSelector]) -> Result<Self, SelectorError> {
        let one = |s: &Option<LabelSelector>| s.as_ref().map(Selector::compile).transpose();
        let pairs = selectors
            .iter()
            .map(|s| Ok((one(&s.pod_selector)?, one(&s.namespace_selector)?)))
            .collect::<Result<_, SelectorError>>()?;
        Ok(Enablement { pairs })
    }

    /// Whether the pod is ambient: never host-network or sidecar-injected pods; otherwise any pair
    /// whose pod selector matches the pod's labels and namespace selector the namespace's.
    pub fn pod_matches(
        &self,
        pod: PodFacts<'_>,
        namespace_labels: &BTreeMap<String, String>,
    ) -> bool {
        self.pod_verdict(pod, namespace_labels).is_ok()
    }

    /// [`Self::pod_matches`] with the reason a pod is not ambient.
    pub fn pod_verdict(
        &self,
        pod: PodFacts<'_>,
        namespace_labels: &BTreeMap<String, String>,
    ) -> Result<(), NotSelected> {
        if pod.host_network {
            return Err(NotSelected::HostNetwork);
        }
        if pod.annotations.contains_key(SIDECAR_STATUS_ANNOTATION) {
            return Err(NotSelected::SidecarInjected);
        }
        let holds = |s: &Option<Selector>, labels| s.as_ref().is_none_or(|s| s.matches(labels));
        if self
            .pairs
            .iter()
            .any(|(p, n)| holds(p, pod.labels) && holds(n, namespace_labels))
        {
            Ok(())
        } else {
            Err(NotSelected::NoSelectorMatches)
        }
    }

    /// Whether the namespace itself is selected: any pair with a namespace selector that has at
    /// least one requirement matches (pairs without one say nothing about namespaces).
    pub fn namespace_matches(&self, namespace_labels: &BTreeMap<String, String>) -> bool {
        self.pairs.iter().any(|(_, n)| {
            n.as_ref()
                .is_some_and(|n| !n.is_empty() && n.matches(namespace_labels))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{chart_default, labels};
    use super::*;
    use serde_json::json;

    #[test]
    fn namespace_match_ignores_pairs_without_namespace_requirements() {
        let e = Enablement::compile(&chart_default()).unwrap();
        assert!(e.namespace_matches(&labels(&[("istio.io/dataplane-mode", "ambient")])));
        assert!(!e.namespace_matches(&labels(&[])));
        let empty_ns: Vec<EnablementSelector> =
            serde_json::from_value(json!([{"namespaceSelector": {}}])).unwrap();
        assert!(
            !Enablement::compile(&empty_ns)
                .unwrap()
                .namespace_matches(&labels(&[]))
        );
    }

    #[test]
    fn pod_exclusions() {
        let e = Enablement::compile(&chart_default()).unwrap();
        let ns = labels(&[("istio.io/dataplane-mode", "ambient")]);
        let none = BTreeMap::new();
        let facts = |host_network, annotations| PodFacts {
            labels: &none,
            annotations,
            host_network,
        };
        assert!(e.pod_matches(facts(false, &none), &ns));
        assert!(!e.pod_matches(facts(true, &none), &ns));
        let sidecar = labels(&[(SIDECAR_STATUS_ANNOTATION, "{}")]);
        assert!(!e.pod_matches(facts(false, &sidecar), &ns));
        assert!(!Enablement::default().pod_matches(facts(false, &none), &ns));
    }
}
