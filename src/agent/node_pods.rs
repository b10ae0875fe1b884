//! The node's pods the agent has not enrolled, for `/debug/pods` (`not_enrolled`): each one's
//! mode and why it is not in the agent's cache. The reason is the worker's own decision
//! ([`machine::not_enrolled`]); a sidecar pod's "is it redirected" is the plugin's derivation
//! ([`crate::sidecar::skip_reason`]).

use std::collections::HashSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

use super::machine::{self, EnrolmentPolicy, Exclusion, NotEnrolled};
use super::pod;
use crate::kube::selector::enablement::NotSelected;
use crate::sidecar::{
    EngineEnv, PodInfo, RedirectError, pod::ISTIO_PROXY, redirect, redirect::ANN_STATUS,
    skip_reason,
};

/// How the pod's traffic is meant to be captured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Selected for ambient (enrolled when in `pods[]`).
    Ambient,
    /// Has an istio-proxy sidecar (or its injection annotation); redirected by the plugin at ADD.
    Sidecar,
    /// Neither.
    None,
}

/// One pod of the node's store that is not in the agent's cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodePod {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub mode: Mode,
    pub ips: Vec<String>,
    /// Why it is not enrolled: a stable code (`not_selected`, `sidecar`, `no_ip`, ...).
    pub reason_code: String,
    /// The same for operators.
    pub reason: String,
    /// Sidecar pods: the plugin's derivation (null: no istio-proxy container).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sidecar: Option<SidecarState>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SidecarState {
    /// Whether its traffic is known to be redirected to its sidecar: the plugin's ADD gave the
    /// pod a network (it has an IP) from annotations the plugin accepts, and its validation init
    /// container is not failing. False whenever that is not known.
    pub redirected: bool,
    /// Why not, when the plugin's own checks leave it alone (a gateway, interception NONE, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    /// Why its redirection failed or is not there: the annotation the plugin's ADD refuses, or
    /// the validation init container's failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
    /// What is known, in one word: `redirected`, `skipped`, `failed`, or `pending` (no network
    /// from its ADD yet).
    #[serde(default)]
    pub state: String,
}

/// The validation init container (Istio's, in CNI mode) failing now: its last exit, when it is
/// not running to completion. Its failure is the pod's own report that capture is missing.
fn validation_failure(p: &Pod) -> Option<String> {
    let statuses = p.status.as_ref()?.init_container_statuses.as_ref()?;
    let st = statuses.iter().find(|s| s.name == "istio-validation")?;
    let now = st.state.as_ref().and_then(|s| s.terminated.as_ref());
    if now.is_some_and(|t| t.exit_code == 0) {
        return None;
    }
    let last = now.or(st.last_state.as_ref().and_then(|s| s.terminated.as_ref()))?;
    (last.exit_code != 0).then(|| {
        format!(
            "init container istio-validation last exited {}: its traffic is not redirected",
            last.exit_code
        )
    })
}

/// The sidecar derivation of a pod with an istio-proxy container or the injector's annotation,
/// and what is known of its redirection.
pub fn sidecar_state(p: &Pod) -> Option<SidecarState> {
    let info = PodInfo::from_pod(p);
    if !info.containers.contains(ISTIO_PROXY) && !info.annotations.contains_key(ANN_STATUS) {
        return None;
    }
    let state = |state: &str, skipped: Option<String>, failed: Option<String>| SidecarState {
        redirected: state == "redirected",
        skipped,
        failed,
        state: state.to_string(),
    };
    if let Some(skip) = skip_reason(&info) {
        return Some(state("skipped", Some(skip.reason().to_string()), None));
    }
    // The annotations alone decide whether the plugin's ADD refuses the pod.
    if let Err(RedirectError::Annotation(e)) = redirect(&info, &EngineEnv::default()) {
        return Some(state(
            "failed",
            None,
            Some(format!("the plugin's ADD refuses it: {e}")),
        ));
    }
    if let Some(why) = validation_failure(p) {
        return Some(state("failed", None, Some(why)));
    }
    if pod::ips(p).is_empty() {
        return Some(state("pending", None, None));
    }
    Some(state("redirected", None, None))
}

/// One stored pod's row (pure).
pub fn node_pod(
    p: &Arc<Pod>,
    namespace_labels: Option<&std::collections::BTreeMap<String, String>>,
    policy: &EnrolmentPolicy,
) -> NodePod {
    let why = machine::not_enrolled(p, namespace_labels, policy);
    let sidecar = sidecar_state(p);
    let mode = match why {
        NotEnrolled::Excluded(Exclusion::NotSelected(NotSelected::SidecarInjected)) => {
            Mode::Sidecar
        }
        NotEnrolled::Excluded(_) | NotEnrolled::Leaving if sidecar.is_some() => Mode::Sidecar,
        NotEnrolled::Excluded(_) | NotEnrolled::Leaving => Mode::None,
        _ => Mode::Ambient,
    };
    NodePod {
        uid: pod::uid(p).to_string(),
        namespace: pod::namespace(p).to_string(),
        name: pod::name(p).to_string(),
        mode,
        ips: pod::ips(p).iter().map(ToString::to_string).collect(),
        reason_code: why.code().to_string(),
        reason: why.text().to_string(),
        sidecar,
    }
}

/// Every pod of the node's store when the ambient agent is off (sidecar-only installs): each
/// pod's sidecar state, none enrolled. Sorted by namespace and name.
pub fn without_agent(pods: &[Arc<Pod>]) -> Vec<NodePod> {
    let mut out: Vec<NodePod> = pods
        .iter()
        .map(|p| {
            let sidecar = sidecar_state(p);
            NodePod {
                uid: pod::uid(p).to_string(),
                namespace: pod::namespace(p).to_string(),
                name: pod::name(p).to_string(),
                mode: if sidecar.is_some() {
                    Mode::Sidecar
                } else {
                    Mode::None
                },
                ips: pod::ips(p).iter().map(ToString::to_string).collect(),
                reason_code: "ambient_off".to_string(),
                reason: "the ambient node agent is off (AMBIENT_ENABLED=false)".to_string(),
                sidecar,
            }
        })
        .collect();
    out.sort_by(|a, b| (&a.namespace, &a.name, &a.uid).cmp(&(&b.namespace, &b.name, &b.uid)));
    out
}

/// Every stored pod whose UID is not cached, sorted by namespace and name.
pub fn not_enrolled(core: &super::reconciler::Core, cached: &HashSet<String>) -> Vec<NodePod> {
    let mut out: Vec<NodePod> = core
        .pods
        .list()
        .iter()
        .filter(|p| !cached.contains(pod::uid(p)))
        .map(|p| {
            let labels = crate::kube::stores::namespace_labels(&core.namespaces, pod::namespace(p));
            node_pod(p, labels.as_ref(), &core.policy)
        })
        .collect();
    out.sort_by(|a, b| (&a.namespace, &a.name, &a.uid).cmp(&(&b.namespace, &b.name, &b.uid)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::BTreeMap;

    fn policy() -> EnrolmentPolicy {
        let sel: Vec<crate::kube::selector::enablement::EnablementSelector> =
            serde_json::from_value(json!([
                {"namespaceSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}}}
            ]))
            .unwrap();
        EnrolmentPolicy::new(&sel, &["kube-system".to_string()], "istio-system").unwrap()
    }

    fn pod(ns: &str, extra: serde_json::Value) -> Arc<Pod> {
        let mut v = json!({
            "metadata": {"name": "p", "namespace": ns, "uid": "u"},
            "spec": {"containers": [{"name": "app"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.5"}
        });
        json_merge(&mut v, extra);
        Arc::new(serde_json::from_value(v).unwrap())
    }

    fn json_merge(a: &mut serde_json::Value, b: serde_json::Value) {
        match (a, b) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    json_merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    fn ambient_ns() -> BTreeMap<String, String> {
        BTreeMap::from([("istio.io/dataplane-mode".into(), "ambient".into())])
    }

    fn row(p: &Arc<Pod>, ns: Option<&BTreeMap<String, String>>) -> (Mode, String) {
        let r = node_pod(p, ns, &policy());
        (r.mode, r.reason_code)
    }

    #[test]
    fn reasons_come_from_the_decision() {
        let plain = BTreeMap::new();
        let ambient = ambient_ns();
        let m = |mode, code: &str| (mode, code.to_string());
        assert_eq!(
            row(&pod("a", json!({})), Some(&plain)),
            m(Mode::None, "not_selected")
        );
        assert_eq!(
            row(&pod("a", json!({})), Some(&ambient)),
            m(Mode::Ambient, "pending")
        );
        assert_eq!(
            row(&pod("a", json!({})), None),
            m(Mode::Ambient, "namespace_missing")
        );
        let no_ip = pod("a", json!({"status": {"podIP": null}}));
        assert_eq!(row(&no_ip, Some(&ambient)), m(Mode::Ambient, "no_ip"));
        let done = pod("a", json!({"status": {"phase": "Succeeded"}}));
        assert_eq!(row(&done, Some(&ambient)), m(Mode::Ambient, "terminated"));
        let host = pod("a", json!({"spec": {"hostNetwork": true}}));
        assert_eq!(row(&host, Some(&ambient)), m(Mode::None, "host_network"));
        assert_eq!(
            row(&pod("kube-system", json!({})), Some(&ambient)),
            m(Mode::None, "excluded_namespace")
        );
        let zt = pod(
            "istio-system",
            json!({"metadata": {"labels": {"app": "ztunnel"}}}),
        );
        assert_eq!(row(&zt, Some(&ambient)), m(Mode::None, "ztunnel"));
        let leaving = pod(
            "a",
            json!({"metadata": {"annotations": {"ambient.istio.io/redirection": "enabled"}}}),
        );
        assert_eq!(row(&leaving, Some(&plain)), m(Mode::None, "leaving"));
        assert_eq!(
            row(&leaving, Some(&ambient)),
            m(Mode::Ambient, "not_cached")
        );
    }

    #[test]
    fn sidecar_pods_carry_the_plugins_derivation() {
        let injected = pod(
            "a",
            json!({"metadata": {"annotations": {"sidecar.istio.io/status": "{}"}},
                   "spec": {"containers": [{"name": "app"}, {"name": "istio-proxy", "args": ["proxy", "sidecar"]}]}}),
        );
        let r = node_pod(&injected, Some(&ambient_ns()), &policy());
        assert_eq!((r.mode, r.reason_code.as_str()), (Mode::Sidecar, "sidecar"));
        assert_eq!(
            r.sidecar,
            Some(SidecarState {
                redirected: true,
                skipped: None,
                failed: None,
                state: "redirected".into(),
            })
        );
        // A gateway: istio-proxy without injection; not redirected, and why.
        let gateway = pod(
            "a",
            json!({"spec": {"containers": [{"name": "istio-proxy", "args": ["proxy", "router"]}]}}),
        );
        let r = node_pod(&gateway, Some(&BTreeMap::new()), &policy());
        assert_eq!(r.mode, Mode::Sidecar);
        assert_eq!(
            r.sidecar.unwrap().skipped.as_deref(),
            Some("istio-proxy is not a sidecar (e.g. a gateway)")
        );
        assert_eq!(
            node_pod(&pod("a", json!({})), None, &policy()).sidecar,
            None
        );
    }

    #[test]
    fn a_sidecar_pod_is_redirected_only_when_that_is_known() {
        let side = |extra: serde_json::Value| {
            let base = json!({"metadata": {"annotations": {"sidecar.istio.io/status": "{}"}},
                "spec": {"containers": [{"name": "app"}, {"name": "istio-proxy", "args": ["proxy", "sidecar"]}]}});
            let p = pod("a", base);
            let mut v = serde_json::to_value(&*p).unwrap();
            json_merge(&mut v, extra);
            sidecar_state(&serde_json::from_value(v).unwrap()).unwrap()
        };
        // An annotation the plugin's ADD refuses: failed, naming it, never redirected.
        let bad = side(json!({"metadata": {"annotations": {
            "traffic.sidecar.istio.io/excludeOutboundPorts": "http"}}}));
        assert_eq!((bad.redirected, bad.state.as_str()), (false, "failed"));
        let why = bad.failed.unwrap();
        assert!(
            why.contains("the plugin's ADD refuses it") && why.contains("excludeOutboundPorts"),
            "{why}"
        );
        // The validation container failing: the pod's own report that capture is missing.
        let broken = side(json!({"status": {"initContainerStatuses": [{
            "name": "istio-validation", "ready": false, "restartCount": 2, "image": "i", "imageID": "",
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 126}}}]}}));
        assert_eq!(
            (broken.redirected, broken.state.as_str()),
            (false, "failed")
        );
        assert!(broken.failed.unwrap().contains("last exited 126"));
        // No network from its ADD yet.
        let pending = side(json!({"status": {"podIP": null}}));
        assert_eq!(
            (pending.redirected, pending.state.as_str()),
            (false, "pending")
        );
        let good = side(json!({}));
        assert_eq!((good.redirected, good.state.as_str()), (true, "redirected"));
    }

    #[test]
    fn without_the_agent_every_stored_pod_is_listed_with_its_sidecar_state() {
        let injected = pod(
            "b",
            json!({"metadata": {"annotations": {"sidecar.istio.io/status": "{}"}},
                   "spec": {"containers": [{"name": "istio-proxy", "args": ["proxy", "sidecar"]}]}}),
        );
        let rows = without_agent(&[injected, pod("a", json!({}))]);
        let got: Vec<(&str, Mode, &str)> = rows
            .iter()
            .map(|r| (r.namespace.as_str(), r.mode, r.reason_code.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("a", Mode::None, "ambient_off"),
                ("b", Mode::Sidecar, "ambient_off")
            ]
        );
        assert!(rows[1].sidecar.as_ref().unwrap().redirected);
    }
}
