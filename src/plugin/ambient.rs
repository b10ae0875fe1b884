//! Ambient mode, pure part: enablement-selector matching (the one implementation in
//! `kube::selector::enablement`) and the event sent to the node agent (`wire::event`).

use std::collections::BTreeMap;

use super::config::EnablementSelector;
use super::result::CniResult;
use crate::kube::selector::enablement::{Enablement, PodFacts};
use crate::sidecar::PodInfo;
use crate::wire::event::{EventIp, EventIpNet, PluginAddEvent};

pub use crate::kube::selector::SelectorError;

/// Whether the pod is enrolled in ambient: never host-network or sidecar pods; otherwise any
/// selector pair matching pod and namespace labels.
pub fn is_ambient(
    selectors: &[EnablementSelector],
    pod: &PodInfo,
    namespace_labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    let facts = PodFacts {
        labels: &pod.labels,
        annotations: &pod.annotations,
        host_network: pod.host_network,
    };
    Ok(Enablement::compile(selectors)?.pod_matches(facts, namespace_labels))
}

/// The `/cmdadd` body: addresses from the previous plugin's result (unparsable ones skipped).
pub fn add_event(
    netns: &str,
    pod_name: &str,
    pod_namespace: &str,
    prev: Option<&CniResult>,
) -> PluginAddEvent {
    let ips = prev
        .map(|r| r.ips.as_slice())
        .unwrap_or_default()
        .iter()
        .filter_map(|ip| {
            Some(EventIp {
                interface: ip.interface,
                address: EventIpNet::from_cidr(&ip.address)?,
                gateway: ip.gateway.parse().ok(),
            })
        })
        .collect();
    PluginAddEvent {
        netns: netns.to_string(),
        pod_name: pod_name.to_string(),
        pod_namespace: pod_namespace.to_string(),
        ips,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::selector::LabelSelector;
    use crate::kube::selector::testing::{chart_default, labels};
    use serde_json::{Value, json};

    fn sel(v: Value) -> Option<LabelSelector> {
        Some(serde_json::from_value(v).expect("selector JSON"))
    }

    #[test]
    fn chart_default_selectors() {
        let s = chart_default();
        let ns_ambient = labels(&[("istio.io/dataplane-mode", "ambient")]);
        let mut pod = PodInfo::default();
        assert!(is_ambient(&s, &pod, &ns_ambient).unwrap());
        assert!(!is_ambient(&s, &pod, &labels(&[])).unwrap());
        pod.labels = labels(&[("istio.io/dataplane-mode", "none")]);
        assert!(!is_ambient(&s, &pod, &ns_ambient).unwrap());
        pod.labels = labels(&[("istio.io/dataplane-mode", "ambient")]);
        assert!(is_ambient(&s, &pod, &labels(&[])).unwrap());
        pod.annotations
            .insert(crate::sidecar::redirect::ANN_STATUS.into(), "{}".into());
        assert!(!is_ambient(&s, &pod, &ns_ambient).unwrap());
        assert!(!is_ambient(&[], &PodInfo::default(), &ns_ambient).unwrap());
    }

    #[test]
    fn operators() {
        let l = labels(&[("a", "1")]);
        let pod = PodInfo {
            labels: l,
            ..Default::default()
        };
        let sel = |e: Value| {
            let s = [EnablementSelector {
                pod_selector: sel(json!({"matchExpressions": [e]})),
                namespace_selector: None,
            }];
            is_ambient(&s, &pod, &BTreeMap::new())
        };
        assert!(sel(json!({"key": "a", "operator": "In", "values": ["1", "2"]})).unwrap());
        assert!(sel(json!({"key": "a", "operator": "Exists"})).unwrap());
        assert!(sel(json!({"key": "b", "operator": "DoesNotExist"})).unwrap());
        assert!(!sel(json!({"key": "a", "operator": "NotIn", "values": ["1"]})).unwrap());
        assert!(sel(json!({"key": "a", "operator": "Bogus"})).is_err());
    }

    #[test]
    fn event_payload() {
        let r = CniResult::parse(
            &json!({"ips": [{"interface": 0, "address": "10.0.0.2/24", "gateway": "10.0.0.1"}]}),
            "1.0.0",
        )
        .unwrap();
        let ev: Value =
            serde_json::from_slice(&add_event("/var/run/netns/x", "p", "ns", Some(&r)).to_json())
                .unwrap();
        assert_eq!(ev["IPs"][0]["Address"]["IP"], "10.0.0.2");
        assert_eq!(ev["IPs"][0]["Address"]["Mask"], "////AA==");
        assert_eq!(ev["IPs"][0]["Interface"], 0);
        assert_eq!(ev["IPs"][0]["Gateway"], "10.0.0.1");
        let empty: Value =
            serde_json::from_slice(&add_event("n", "p", "ns", None).to_json()).unwrap();
        assert_eq!(empty["IPs"], json!([]));
    }
}
