//! What the agent reads from a pod object: its enrolment state, addresses, phase, identity and
//! the in-pod overrides (annotations).

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;
use tracing::warn;

use super::dataplane::PodNet;
use crate::rules::ambient::{PodDns, PodOverrides};
use crate::zds::PodWorkload;

/// The redirection annotation.
pub const ANN_REDIRECTION: &str = "ambient.istio.io/redirection";
pub const ANN_BYPASS_INBOUND: &str = "ambient.istio.io/bypass-inbound-capture";
pub const ANN_DNS_CAPTURE: &str = "ambient.istio.io/dns-capture";
pub use crate::rules::ambient::ANN_REROUTE_VIRTUAL_INTERFACES;

/// The value of the redirection annotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redirection {
    None,
    Pending,
    Enabled,
}

impl Redirection {
    pub fn as_str(self) -> Option<&'static str> {
        match self {
            Redirection::None => None,
            Redirection::Pending => Some("pending"),
            Redirection::Enabled => Some("enabled"),
        }
    }
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

pub fn redirection(pod: &Pod) -> Redirection {
    match annotation(pod, ANN_REDIRECTION) {
        Some("enabled") => Redirection::Enabled,
        Some("pending") => Redirection::Pending,
        _ => Redirection::None,
    }
}

pub fn name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or_default()
}

pub fn namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or_default()
}

pub fn uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or_default()
}

/// `status.podIPs`, else `status.podIP` (the one reading, shared with the repair controller).
pub use crate::kube::stores::pod_ips as ips;

/// `spec.hostNetwork`: the pod shares the node's netns.
pub fn is_host_network(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
}

/// Phase Succeeded or Failed.
pub fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// A ztunnel pod: labelled `app=ztunnel` in the system namespace. Never enrolled.
pub fn is_ztunnel(pod: &Pod, system_namespace: &str) -> bool {
    namespace(pod) == system_namespace
        && pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app"))
            .is_some_and(|v| v == "ztunnel")
}

pub fn workload_info(pod: &Pod) -> PodWorkload {
    PodWorkload {
        name: name(pod).to_string(),
        namespace: namespace(pod).to_string(),
        service_account: pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
    }
}

fn bool_annotation(pod: &Pod, key: &str) -> Option<bool> {
    let value = annotation(pod, key)?;
    let parsed = crate::cli::parse_go_bool(value);
    if parsed.is_none() {
        warn!(pod = %format!("{}/{}", namespace(pod), name(pod)), annotation = key, value, "not a boolean; ignored");
    }
    parsed
}

/// The pod's overrides of the node-wide in-pod settings.
pub fn overrides(pod: &Pod) -> PodOverrides {
    PodOverrides {
        ingress: bool_annotation(pod, ANN_BYPASS_INBOUND).unwrap_or(false),
        // Checked where the rules are applied (apply::ambient), so a bad name fails the pod's
        // enrolment naming the annotation before anything is programmed.
        virtual_interfaces: annotation(pod, ANN_REROUTE_VIRTUAL_INTERFACES)
            .map(crate::rules::ambient::split_interfaces)
            .unwrap_or_default(),
        dns: match bool_annotation(pod, ANN_DNS_CAPTURE) {
            Some(true) => PodDns::Enabled,
            Some(false) => PodDns::Disabled,
            None => PodDns::Unset,
        },
    }
}

pub fn pod_net(pod: &Pod, ips: &[IpAddr]) -> PodNet {
    PodNet {
        uid: uid(pod).to_string(),
        name: name(pod).to_string(),
        namespace: namespace(pod).to_string(),
        ips: ips.to_vec(),
        overrides: overrides(pod),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn facts() {
        let p = pod(json!({
            "metadata": {"name": "a", "namespace": "n", "uid": "u1", "annotations": {
                ANN_REDIRECTION: "pending", ANN_BYPASS_INBOUND: "true", ANN_DNS_CAPTURE: "maybe",
                ANN_REROUTE_VIRTUAL_INTERFACES: " eth1, ,eth2 "}},
            "spec": {"containers": [], "serviceAccountName": "sa"},
            "status": {"phase": "Failed", "podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}]}
        }));
        assert_eq!(redirection(&p), Redirection::Pending);
        assert_eq!(ips(&p).len(), 2);
        assert!(is_terminal(&p));
        assert_eq!(workload_info(&p).service_account, "sa");
        let o = overrides(&p);
        assert!(o.ingress);
        assert_eq!(o.dns, PodDns::Unset);
        assert_eq!(o.virtual_interfaces, ["eth1", "eth2"]);
        let only_ip = pod(json!({"metadata": {}, "status": {"podIP": "::ffff:10.1.1.1"}}));
        assert_eq!(ips(&only_ip), ["10.1.1.1".parse::<IpAddr>().unwrap()]);
        let zt =
            pod(json!({"metadata": {"namespace": "istio-system", "labels": {"app": "ztunnel"}}}));
        assert!(is_ztunnel(&zt, "istio-system") && !is_ztunnel(&zt, "other"));
    }
}
