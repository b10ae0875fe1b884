//! What acting on a broken pod does, for real: the API calls (delete with preconditions, the
//! label through `pods/status`, events) and, in repair mode, the sidecar rules programmed in the
//! pod's netns — the plugin's derivation (`sidecar::redirect` from the pod's annotations and
//! proxy env) through the plugin's entry (`apply::pod::program`), in the netns the host /proc
//! scan finds by the pod UID and IPs (`netns::procfs`, as the ambient agent finds netns).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;

use super::{HostSettings, RepairError};
use crate::apply::ForceBinary;
use crate::apply::pod::NetnsCheck;
use crate::apply::pod::{self, Backend, PodError, PodOptions, WhichNetns};
use crate::kube::stores::pod_ips;
use crate::kube::{
    EventRecord, EventType, KubeClient, KubeError, MetadataPatch, PodPatchVia, pod_preconditions,
};
use crate::netns::Netns;
use crate::netns::reserved::Reserved;
use crate::sidecar::redirect::{
    AnnotationError, CaptureSettings, EngineEnv, Redirect, RedirectError,
};
use crate::sidecar::{PodInfo, redirect};

/// Source component of the repair room's events (Istio's).
pub const EVENT_COMPONENT: &str = "cni-repair";

/// An event about a pod from the repair room (the controller's and the drift pass's).
pub fn event(event_type: EventType, reason: &str, message: String) -> EventRecord {
    EventRecord {
        event_type,
        reason: reason.to_string(),
        message,
        component: EVENT_COMPONENT.to_string(),
    }
}

/// One act on a pod under way (what every [`Effects`] call returns).
pub type Acting<T = ()> = BoxFuture<'static, Result<T, ActError>>;

/// What acting on a pod does (the real one is [`KubeEffects`]; tests use fakes).
pub trait Effects: Send + Sync + 'static {
    /// Programs the sidecar rules in the pod's netns; `false` when the pod wants none
    /// (`interceptionMode: NONE`).
    fn repair(&self, pod: Arc<Pod>) -> Acting<bool>;
    /// Deletes the pod as it was read (a UID precondition: never a new pod of the same name).
    fn delete(&self, pod: Arc<Pod>) -> Acting;
    /// Sets a label (through `pods/status`, as Istio).
    fn label(&self, pod: Arc<Pod>, key: String, value: String) -> Acting;
    /// Records an event on the pod.
    fn event(&self, pod: Arc<Pod>, event: EventRecord) -> Acting;
    /// The drift pass's read: one /proc scan for every pod of `batch`, then each netns found
    /// verified against the pod's expected rules (nothing written).
    fn verify_pods(&self, batch: Vec<Expected>) -> BoxFuture<'static, Vec<Checked>>;
    /// Re-programs a drifted pod's netns in place: our rules replaced with the expected ones.
    fn heal(&self, netns: Arc<Netns>, expected: Expected) -> Acting;
}

/// A pod whose rules the drift pass checks, with what they should be.
#[derive(Debug, Clone)]
pub struct Expected {
    pub uid: String,
    pub ips: Vec<std::net::IpAddr>,
    pub settings: Arc<CaptureSettings>,
}

/// What [`Effects::verify_pods`] found for one pod.
#[derive(Debug)]
pub struct Checked {
    pub uid: String,
    /// The netns (kept for the heal) and the verdict; `ActError::NetnsNotFound` when the scan
    /// found no netns of the pod.
    pub result: Result<(Arc<Netns>, NetnsCheck), ActError>,
}

/// Why acting on a pod failed. [`ActError::is_permanent`] tells the error policy whether waiting
/// can help.
#[derive(Debug, thiserror::Error)]
pub enum ActError {
    /// The pod's redirect annotations cannot be used: nothing to retry until the pod changes
    /// (and a changed pod is a new pod: annotations are immutable once running).
    #[error("{0}")]
    Annotation(#[source] AnnotationError),
    /// A redirect value from install-cni's own environment.
    #[error("redirect settings: {0}")]
    Redirect(#[source] RedirectError),
    #[error("pod has no IP in its status yet")]
    NoIp,
    #[error("no process of pod {uid} with a netns holding {ips} found under {proc_dir}")]
    NetnsNotFound {
        uid: String,
        ips: String,
        proc_dir: PathBuf,
    },
    /// The node's netns (or the agent's own) could not be identified: no netns is taken as a
    /// pod's (fail closed).
    #[error("not looking for the pod's network namespace: {0}")]
    NodeNetnsUnknown(String),
    #[error("programming the pod's network namespace: {0}")]
    Program(#[source] PodError),
    #[error("reading the pod's rules: {0}")]
    Verify(#[source] PodError),
    #[error(transparent)]
    Kube(#[from] KubeError),
    #[error("the repair task failed: {0}")]
    Task(String),
}

impl ActError {
    /// Waiting will not fix it: bad annotations or settings, an API refusal (403, 404, a 409 from
    /// the UID precondition: the name is a new pod's now, and that pod comes as its own event).
    pub fn is_permanent(&self) -> bool {
        match self {
            ActError::Annotation(_)
            | ActError::Redirect(_)
            | ActError::Task(_)
            | ActError::NodeNetnsUnknown(_) => true,
            ActError::Kube(e) => !e.is_transient(),
            ActError::NoIp
            | ActError::NetnsNotFound { .. }
            | ActError::Program(_)
            | ActError::Verify(_) => false,
        }
    }
}

/// The real effects.
pub struct KubeEffects {
    client: KubeClient,
    /// The netns no pod may claim, identified once under `HOST_PROC_DIR` (the scan reads there).
    reserved: Arc<Reserved>,
    backend: Backend,
    force_binary: Option<ForceBinary>,
    /// The node's backend record, consulted when `force_binary` is unset.
    flavour_record: Option<std::path::PathBuf>,
    engine: Arc<EngineEnv>,
    timeout: Duration,
}

impl KubeEffects {
    pub fn new(
        client: KubeClient,
        host: HostSettings,
        timeout: Duration,
    ) -> Result<Self, RepairError> {
        let force_binary = match host.force_iptables_binary.as_deref() {
            None | Some("") => None,
            Some("legacy") => Some(ForceBinary::Legacy),
            Some("nft") => Some(ForceBinary::Nft),
            Some(other) => return Err(RepairError::ForceBinary(other.to_string())),
        };
        // What the plugin reads from the runtime's environment, read once from ours.
        let engine = EngineEnv::from_env(&crate::cli::ProcessEnv);
        let backend = crate::apply::backend::decide(&crate::apply::backend::BackendRequest {
            native_nftables: host.native_nftables,
            restore_only: engine.restore_only,
            force_binary: None,
        })
        .backend;
        let reserved = Arc::new(Reserved::identify(&host.host_proc_dir));
        Ok(KubeEffects {
            client,
            reserved,
            backend,
            force_binary,
            flavour_record: host.flavour_record,
            engine: Arc::new(engine),
            timeout,
        })
    }
}

/// Repair mode's blocking part: derive, find the netns, program. `Ok(false)`: no capture wanted.
fn program_pod(
    pod: &Pod,
    engine: &EngineEnv,
    reserved: &Reserved,
    backend: Backend,
    force_binary: Option<ForceBinary>,
) -> Result<bool, ActError> {
    let settings = match redirect(&PodInfo::from_pod(pod), engine) {
        Ok(Redirect::None) => return Ok(false),
        Ok(Redirect::Capture(s)) => s,
        Err(RedirectError::Annotation(e)) => return Err(ActError::Annotation(e)),
        Err(e) => return Err(ActError::Redirect(e)),
    };
    for w in &settings.warnings {
        tracing::warn!(pod = %crate::kube::stores::Stored::key(pod), "{w}");
    }
    let ips = pod_ips(pod);
    if ips.is_empty() {
        return Err(ActError::NoIp);
    }
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let wanted = HashMap::from([(uid.clone(), ips.clone())]);
    let found = crate::netlink::find_pod_netns(reserved, &wanted);
    let Some(netns) = found
        .map_err(|why| ActError::NodeNetnsUnknown(why.0))?
        .remove(&uid)
    else {
        return Err(not_found(uid, &ips, reserved.host_proc()));
    };
    let opts = PodOptions {
        backend,
        force_binary,
        // The pod runs: our chains, if any are there, are replaced with what it should have.
        reconcile_on_drift: true,
        detect_ipv6: Some(settings.dual_stack),
        ..PodOptions::default()
    };
    pod::program(WhichNetns::Pod(&netns), &settings.config, &opts).map_err(ActError::Program)?;
    Ok(true)
}

fn not_found(uid: String, ips: &[std::net::IpAddr], proc_dir: &std::path::Path) -> ActError {
    ActError::NetnsNotFound {
        uid,
        ips: ips
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(","),
        proc_dir: proc_dir.to_path_buf(),
    }
}

/// The drift pass's read, blocking: one /proc scan for the whole batch, then one kernel read per
/// netns found, one pod after another (a pass is background work: it keeps to one core).
fn verify_batch(batch: Vec<Expected>, reserved: &Reserved, opts: &PodOptions) -> Vec<Checked> {
    let wanted: HashMap<String, Vec<std::net::IpAddr>> = batch
        .iter()
        .map(|e| (e.uid.clone(), e.ips.clone()))
        .collect();
    let mut found = match crate::netlink::find_pod_netns(reserved, &wanted) {
        Ok(found) => found,
        Err(why) => {
            return batch
                .into_iter()
                .map(|e| Checked {
                    uid: e.uid,
                    result: Err(ActError::NodeNetnsUnknown(why.0.clone())),
                })
                .collect();
        }
    };
    batch
        .into_iter()
        .map(|e| {
            let result = match found.remove(&e.uid) {
                None => Err(not_found(e.uid.clone(), &e.ips, reserved.host_proc())),
                Some(netns) => {
                    let opts = PodOptions {
                        detect_ipv6: Some(e.settings.dual_stack),
                        ..opts.clone()
                    };
                    pod::verify(WhichNetns::Pod(&netns), &e.settings.config, &opts)
                        .map(|verdict| (Arc::new(netns), verdict))
                        .map_err(ActError::Verify)
                }
            };
            Checked { uid: e.uid, result }
        })
        .collect()
}

impl KubeEffects {
    /// Why no pod's netns is looked up, when the reserved namespaces were not identified.
    pub fn netns_refused(&self) -> Option<String> {
        self.reserved.unidentified().map(str::to_string)
    }

    /// What the plugin reads from the runtime's environment (read once, from ours).
    pub fn engine(&self) -> Arc<EngineEnv> {
        self.engine.clone()
    }

    /// The node's flavour: forced, else the agent's record, else each netns's own detection.
    fn flavour(&self) -> Option<ForceBinary> {
        self.force_binary.or_else(|| {
            let record = self.flavour_record.as_deref()?;
            crate::apply::backend::read_record(record).ok()??.pinned()
        })
    }

    fn pod_options(&self) -> PodOptions {
        PodOptions {
            backend: self.backend,
            force_binary: self.flavour(),
            ..PodOptions::default()
        }
    }
}

impl Effects for KubeEffects {
    fn verify_pods(&self, batch: Vec<Expected>) -> BoxFuture<'static, Vec<Checked>> {
        let reserved = self.reserved.clone();
        let opts = self.pod_options();
        async move {
            tokio::task::spawn_blocking(move || verify_batch(batch, &reserved, &opts))
                .await
                .unwrap_or_default()
        }
        .boxed()
    }

    fn heal(&self, netns: Arc<Netns>, expected: Expected) -> Acting {
        let opts = PodOptions {
            // Ours are replaced with the expected rules, under the guardrails (no window
            // without capture); a netns holding nothing of ours gets a plain apply.
            reconcile: true,
            detect_ipv6: Some(expected.settings.dual_stack),
            ..self.pod_options()
        };
        async move {
            tokio::task::spawn_blocking(move || {
                pod::program(WhichNetns::Pod(&netns), &expected.settings.config, &opts)
                    .map(|_| ())
                    .map_err(ActError::Program)
            })
            .await
            .map_err(|e| ActError::Task(e.to_string()))?
        }
        .boxed()
    }

    fn repair(&self, pod: Arc<Pod>) -> Acting<bool> {
        let engine = self.engine.clone();
        let reserved = self.reserved.clone();
        let (backend, force) = (self.backend, self.flavour());
        async move {
            tokio::task::spawn_blocking(move || {
                program_pod(&pod, &engine, &reserved, backend, force)
            })
            .await
            .map_err(|e| ActError::Task(e.to_string()))?
        }
        .boxed()
    }

    fn delete(&self, pod: Arc<Pod>) -> Acting {
        let client = self.client.clone();
        let timeout = self.timeout;
        async move {
            let (ns, name) = names(&pod);
            client
                .delete_pod(&ns, &name, Some(pod_preconditions(&pod)), timeout)
                .await?;
            Ok(())
        }
        .boxed()
    }

    fn label(&self, pod: Arc<Pod>, key: String, value: String) -> Acting {
        let client = self.client.clone();
        let timeout = self.timeout;
        async move {
            let (ns, name) = names(&pod);
            let patch = MetadataPatch::default().set_label(&key, &value);
            client
                .patch_pod_metadata(PodPatchVia::Status, &ns, &name, &patch, timeout)
                .await?;
            Ok(())
        }
        .boxed()
    }

    fn event(&self, pod: Arc<Pod>, event: EventRecord) -> Acting {
        let client = self.client.clone();
        let timeout = self.timeout;
        async move {
            client.create_pod_event(&pod, &event, timeout).await?;
            Ok(())
        }
        .boxed()
    }
}

fn names(pod: &Pod) -> (String, String) {
    (
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_waiting_can_fix_is_retried() {
        let ann = ActError::Annotation(AnnotationError {
            annotation: "traffic.sidecar.istio.io/includeInboundPorts",
            value: "abc".into(),
            reason: "bad".into(),
        });
        assert!(ann.is_permanent());
        assert!(ann.to_string().contains("includeInboundPorts"));
        assert!(!ActError::NoIp.is_permanent());
        let missing = ActError::NetnsNotFound {
            uid: "u".into(),
            ips: "10.0.0.1".into(),
            proc_dir: "/host/proc".into(),
        };
        assert!(!missing.is_permanent());
        assert!(missing.to_string().contains("/host/proc"));
    }

    #[test]
    fn a_pod_without_ip_or_netns_is_not_programmed() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "863b91d4-4b68-4efa-917f-4b560e3e86aa",
                         "annotations": {"sidecar.istio.io/status": "{}"}},
            "spec": {"containers": [{"name": "app"}, {"name": "istio-proxy"}]}
        }))
        .unwrap();
        let engine = EngineEnv::default();
        let dir = tempfile::tempdir().unwrap();
        let reserved = Reserved::new(dir.path(), vec![], None);
        let run = |pod: &Pod| program_pod(pod, &engine, &reserved, Backend::Iptables, None);
        assert!(matches!(run(&pod), Err(ActError::NoIp)));
        pod.status =
            Some(serde_json::from_value(serde_json::json!({"podIP": "10.9.9.9"})).unwrap());
        assert!(matches!(run(&pod), Err(ActError::NetnsNotFound { .. })));
        // The node's netns unidentified: refused before any lookup, for good.
        let closed = Reserved::new(
            dir.path(),
            vec![],
            Some("cannot identify the node's".into()),
        );
        match program_pod(&pod, &engine, &closed, Backend::Iptables, None) {
            Err(e @ ActError::NodeNetnsUnknown(_)) => {
                assert!(e.is_permanent());
                assert_eq!(
                    e.to_string(),
                    "not looking for the pod's network namespace: cannot identify the node's"
                );
            }
            other => panic!("{other:?}"),
        }
        // Bad annotations are refused before anything is looked up.
        pod.metadata.annotations.as_mut().unwrap().insert(
            "traffic.sidecar.istio.io/includeInboundPorts".into(),
            "abc".into(),
        );
        match run(&pod) {
            Err(ActError::Annotation(e)) => {
                assert_eq!(e.annotation, "traffic.sidecar.istio.io/includeInboundPorts")
            }
            other => panic!("{other:?}"),
        }
        pod.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert("sidecar.istio.io/interceptionMode".into(), "NONE".into());
        assert!(matches!(run(&pod), Ok(false)));
    }
}
