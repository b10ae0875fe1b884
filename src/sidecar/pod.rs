//! What the plugin reads from a pod, extracted once from the API object.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;

pub const ISTIO_PROXY: &str = "istio-proxy";
pub const ISTIO_INIT: &str = "istio-init";

/// The facts selection and redirect construction need.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodInfo {
    /// Names of init and regular containers.
    pub containers: BTreeSet<String>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// `args[1]` of the istio-proxy container when `args[0]` is `proxy` (e.g. `sidecar`, `router`).
    pub proxy_type: Option<String>,
    /// Literal `env[].value`s of istio-proxy (`valueFrom` is not resolved; it reads as empty).
    pub proxy_env: BTreeMap<String, String>,
    pub proxy_uid: Option<i64>,
    pub proxy_gid: Option<i64>,
    pub host_network: bool,
}

impl PodInfo {
    /// Init containers are read first, then regular ones, so a regular `istio-proxy` wins for
    /// args and securityContext; env maps merge.
    pub fn from_pod(pod: &Pod) -> PodInfo {
        let mut info = PodInfo {
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            annotations: pod.metadata.annotations.clone().unwrap_or_default(),
            ..Default::default()
        };
        let Some(spec) = &pod.spec else {
            return info;
        };
        info.host_network = spec.host_network.unwrap_or(false);
        let all = spec
            .init_containers
            .iter()
            .flatten()
            .chain(spec.containers.iter());
        for c in all {
            info.containers.insert(c.name.clone());
            if c.name != ISTIO_PROXY {
                continue;
            }
            for e in c.env.iter().flatten() {
                info.proxy_env
                    .insert(e.name.clone(), e.value.clone().unwrap_or_default());
            }
            if let Some(args) = &c.args
                && args.len() >= 2
                && args[0] == "proxy"
            {
                info.proxy_type = Some(args[1].clone());
            }
            if let Some(sc) = &c.security_context {
                info.proxy_uid = sc.run_as_user;
                info.proxy_gid = sc.run_as_group;
            }
        }
        info
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A pod from JSON, as the API server would return it.
    pub(crate) fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn regular_proxy_container_wins_and_env_merges() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "annotations": {"a": "b"}},
            "spec": {
                "initContainers": [{"name": "istio-proxy", "args": ["proxy", "router"],
                    "env": [{"name": "A", "value": "1"}],
                    "securityContext": {"runAsUser": 5, "runAsGroup": 6}}],
                "containers": [
                    {"name": "app"},
                    {"name": "istio-proxy", "args": ["proxy", "sidecar"],
                     "env": [{"name": "B", "value": "2"}, {"name": "C", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}],
                     "securityContext": {"runAsUser": 7}}
                ]
            }
        }));
        let info = PodInfo::from_pod(&p);
        assert_eq!(info.proxy_type.as_deref(), Some("sidecar"));
        assert_eq!(info.proxy_uid, Some(7));
        assert_eq!(info.proxy_gid, None);
        assert_eq!(info.proxy_env.get("A").map(String::as_str), Some("1"));
        assert_eq!(info.proxy_env.get("C").map(String::as_str), Some(""));
        assert!(info.containers.contains("app"));
        assert_eq!(info.annotations.get("a").map(String::as_str), Some("b"));
    }

    #[test]
    fn short_args_leave_the_type_unset() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "istio-proxy", "args": ["proxy"]}]}
        }));
        assert_eq!(PodInfo::from_pod(&p).proxy_type, None);
    }
}
