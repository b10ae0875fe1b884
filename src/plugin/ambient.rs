//! Ambient mode, pure part: enablement-selector matching and the event sent to the node agent.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::config::EnablementSelector;
use super::pod::PodInfo;
use super::result::CniResult;
use crate::kube::selector::{LabelSelector, Selector};

pub use crate::kube::selector::SelectorError;

/// Evaluates an enablement label selector; absent selects everything (Istio's enablement
/// semantics), present-but-empty too (Kubernetes').
pub fn selector_matches(
    selector: Option<&LabelSelector>,
    labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    match selector {
        None => Ok(true),
        Some(sel) => Ok(Selector::compile(sel)?.matches(labels)),
    }
}

/// Whether the pod is enrolled in ambient: never host-network or sidecar pods; otherwise any
/// selector pair matching pod and namespace labels.
pub fn is_ambient(
    selectors: &[EnablementSelector],
    pod: &PodInfo,
    namespace_labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    if pod.host_network || pod.annotations.contains_key(super::sidecar::ANN_STATUS) {
        return Ok(false);
    }
    for s in selectors {
        if selector_matches(s.pod_selector.as_ref(), &pod.labels)?
            && selector_matches(s.namespace_selector.as_ref(), namespace_labels)?
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Standard base64 with padding.
fn base64(data: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// The `/cmdadd` body (Go field names, the agent's decoder expects them).
pub fn add_event(
    netns: &str,
    pod_name: &str,
    pod_namespace: &str,
    prev: Option<&CniResult>,
) -> Value {
    let ips: Vec<Value> = prev
        .map(|r| r.ips.as_slice())
        .unwrap_or_default()
        .iter()
        .filter_map(|ip| {
            let net: ipnet::IpNet = ip.address.parse().ok()?;
            let addr = ip.address.split('/').next().unwrap_or_default();
            let mask = match net.netmask() {
                std::net::IpAddr::V4(m) => m.octets().to_vec(),
                std::net::IpAddr::V6(m) => m.octets().to_vec(),
            };
            Some(json!({
                "Interface": ip.interface,
                "Address": {"IP": addr, "Mask": base64(&mask)},
                "Gateway": ip.gateway,
            }))
        })
        .collect();
    json!({
        "Netns": netns,
        "PodName": pod_name,
        "PodNamespace": pod_namespace,
        "IPs": ips,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn sel(v: Value) -> Option<LabelSelector> {
        Some(serde_json::from_value(v).expect("selector JSON"))
    }

    fn chart_default() -> Vec<EnablementSelector> {
        vec![
            EnablementSelector {
                pod_selector: sel(json!({"matchLabels": {"istio.io/dataplane-mode": "ambient"}})),
                namespace_selector: None,
            },
            EnablementSelector {
                pod_selector: sel(
                    json!({"matchExpressions": [{"key": "istio.io/dataplane-mode", "operator": "NotIn", "values": ["none"]}]}),
                ),
                namespace_selector: sel(
                    json!({"matchLabels": {"istio.io/dataplane-mode": "ambient"}}),
                ),
            },
        ]
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
            .insert(super::super::sidecar::ANN_STATUS.into(), "{}".into());
        assert!(!is_ambient(&s, &pod, &ns_ambient).unwrap());
        assert!(!is_ambient(&[], &PodInfo::default(), &ns_ambient).unwrap());
    }

    #[test]
    fn operators() {
        let l = labels(&[("a", "1")]);
        let sel = |e: Value| selector_matches(sel(json!({"matchExpressions": [e]})).as_ref(), &l);
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
        let ev = add_event("/var/run/netns/x", "p", "ns", Some(&r));
        assert_eq!(ev["IPs"][0]["Address"]["IP"], "10.0.0.2");
        assert_eq!(ev["IPs"][0]["Address"]["Mask"], "////AA==");
        assert_eq!(ev["IPs"][0]["Interface"], 0);
        assert_eq!(add_event("n", "p", "ns", None)["IPs"], json!([]));
    }
}
