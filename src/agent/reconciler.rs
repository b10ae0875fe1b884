//! The agent's pod work over the one reconcile engine (`crate::reconcile`): a key is a pod's
//! `namespace/name`, and every trigger — a store event, a namespace that appears or changes its
//! match, a plugin's `/podadd` or `/cmdadd`, the drift pass — is "look at this pod again". The
//! reconcile reads the key's world as it is now (the store's pod, the cache's pods of that name,
//! the pod last reported deleted, the namespace's labels), lets the pure state machine
//! (`machine::decide`) say what to do, and does it through `mesh`. What a trigger brings that the
//! world does not show — a plugin's offer of a netns, the drift pass's wish to verify, the last
//! object of a deleted pod — is the trigger's [`Request`], the engine's payload: it waits in the
//! engine's state of the key and the key's next run takes it.
//!
//! The engine runs one pod's work at a time and several pods at once (`max_concurrent_pods`),
//! and a failed run is retried or not as the error's class says (`MeshError::class`).

use std::sync::Arc;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::findings::{DriftFinding, Status, judge};
use super::machine::{self, Action, EnrolmentPolicy, Held, Now};
use super::mesh::{Mesh, MeshError, MeshStep, PluginAdd, Via};
use super::pod;
use super::settings::AgentTiming;
use crate::kube::stores::{self, NamespaceStore, PodStore, StoreEvent, pod_key};
use crate::reconcile::{Engine, EngineConfig, Payload, Reconcile};
use crate::telemetry::metrics::{EventTypeLabel, Metrics};

/// The engine running the agent's pod work.
pub type PodEngine = Engine<Core>;

/// What the agent decides with and acts through.
pub struct Core {
    pub pods: PodStore,
    pub namespaces: NamespaceStore,
    pub policy: EnrolmentPolicy,
    pub mesh: Mesh,
    pub timing: AgentTiming,
    /// `istio_cni_plugin_requests_total`, `nodeagent_reconcile_events_total`.
    pub metrics: Metrics,
    /// The drift pass's last results (`/debug/pods`).
    pub status: Status,
}

/// What a trigger brings for a key's next run (the engine's payload: merged per key, so a key
/// holds at most one of each, and taken whole by the run).
#[derive(Default)]
pub struct Request {
    /// A plugin's add: enrol the pod with the netns it names (checked first).
    pub offer: Option<PluginAdd>,
    /// The drift pass: verify (and heal) the enrolled pod's rules.
    pub verify: bool,
    /// The object the store last reported deleted under the name.
    pub gone: Option<Arc<Pod>>,
}

impl Request {
    /// A plugin's add.
    pub fn offer(add: PluginAdd) -> Request {
        Request {
            offer: Some(add),
            ..Request::default()
        }
    }

    pub fn verify() -> Request {
        Request {
            verify: true,
            ..Request::default()
        }
    }

    pub fn gone(pod: Arc<Pod>) -> Request {
        Request {
            gone: Some(pod),
            ..Request::default()
        }
    }
}

/// A failed run's retry reads the world (the default): an offer is answered by the run that
/// took it, and the drift pass verifies again next pass.
impl Payload for Request {
    /// A newer offer for the same pod replaces one not yet taken; so does a newer deleted
    /// object.
    fn merge(&mut self, newer: Request) {
        if newer.offer.is_some() {
            self.offer = newer.offer;
        }
        self.verify |= newer.verify;
        if newer.gone.is_some() {
            self.gone = newer.gone;
        }
    }
}

/// What a run of a key did.
#[derive(Debug, Clone)]
pub enum Reconciled {
    /// A plugin's add enrolled the pod.
    Enrolled,
    /// A plugin's add found the pod not selected for ambient (the sidecar path is the plugin's).
    NotAmbient(Arc<Pod>),
    /// The drift pass's verification of an enrolled pod.
    Verified {
        pod: Arc<Pod>,
        verdict: DriftFinding,
    },
    /// Anything else (what, for logs and tests).
    Done(&'static str),
}

impl Reconcile for Core {
    type Key = String;
    type Done = Reconciled;
    type Error = MeshError;
    type Payload = Request;

    fn reconcile(
        &self,
        key: String,
        request: Request,
        _retry: u32,
    ) -> BoxFuture<'_, Result<Reconciled, MeshError>> {
        Box::pin(self.reconcile_pod(key, request))
    }
}

/// The engine over `core`, bounded and spaced as the agent's timing says.
pub fn engine(core: Arc<Core>, shutdown: CancellationToken) -> PodEngine {
    let config = EngineConfig {
        concurrency: core.timing.max_concurrent_pods,
        retry: core.timing.retry,
        // An event is news: a pod waiting out a backoff is looked at again at once.
        trigger_cuts_backoff: true,
    };
    Engine::new(core, config, shutdown)
}

fn count_event(metrics: &Metrics, kind: &str) {
    metrics
        .reconcile_events
        .get_or_create(&EventTypeLabel {
            r#type: kind.to_string(),
        })
        .inc();
}

/// A pod object carrying only the identity the cache keeps (for removing a pod whose object is
/// no longer in the store).
fn rebuilt(namespace: &str, name: &str, uid: &str) -> Arc<Pod> {
    let mut p = Pod::default();
    p.metadata.namespace = Some(namespace.to_string());
    p.metadata.name = Some(name.to_string());
    p.metadata.uid = Some(uid.to_string());
    Arc::new(p)
}

impl Core {
    async fn reconcile_pod(&self, key: String, request: Request) -> Result<Reconciled, MeshError> {
        let (namespace, name) = key.split_once('/').unwrap_or(("", key.as_str()));
        let current = self.pods.get(&key);
        count_event(
            &self.metrics,
            if current.is_some() {
                "update"
            } else {
                "delete"
            },
        );
        let held = self.held(namespace, name, [current.as_ref(), request.gone.as_ref()]);
        let ns_labels = stores::namespace_labels(&self.namespaces, namespace);
        let now = Now {
            current: current.as_ref(),
            held: &held,
            gone: request.gone.as_ref(),
            namespace_labels: ns_labels.as_ref(),
        };
        let mut actions = machine::decide(&now, &self.policy);
        if let Some(offer) = request.offer {
            // The plugin's add replaces the decision for the current pod; other pods of the
            // name are removed first.
            if current.is_some() {
                actions.pop();
            }
            for action in actions {
                self.act(&key, action).await?;
            }
            return self.plugin_add(&key, current, ns_labels, offer).await;
        }
        // The drift pass verifies a pod that stays enrolled (also while its namespace is not
        // in the store: the pod's rules are checked all the same).
        let verify = request.verify
            && matches!(
                actions.last(),
                Some(
                    Action::Skip(_)
                        | Action::ReassertProbes { .. }
                        | Action::WriteOwedAnnotation { .. }
                        | Action::RequeueNamespaceMissing
                )
            );
        if verify && let Some(p) = current.filter(|p| self.mesh.cache.contains(pod::uid(p))) {
            let last = actions.pop();
            for action in actions {
                self.act(&key, action).await?;
            }
            let verified = self.verify(p).await;
            if let Some(action) = last.filter(|a| !matches!(a, Action::RequeueNamespaceMissing)) {
                self.act(&key, action).await?;
            }
            return Ok(verified);
        }
        for action in actions {
            self.act(&key, action).await?;
        }
        Ok(Reconciled::Done("reconciled"))
    }

    /// The pods of this name the cache holds, each with the fullest object known for it.
    fn held<const N: usize>(
        &self,
        namespace: &str,
        name: &str,
        known: [Option<&Arc<Pod>>; N],
    ) -> Vec<Held> {
        self.mesh
            .cache
            .named(namespace, name)
            .into_iter()
            .map(|(uid, entry)| Held {
                pod: known
                    .iter()
                    .flatten()
                    .find(|p| pod::uid(p) == uid)
                    .map(|p| (*p).clone())
                    .unwrap_or_else(|| rebuilt(namespace, name, &uid)),
                probe_ips: entry.probe_ips,
                annotation_owed: entry.annotation_owed,
                awaiting_ztunnel: entry.awaiting_ztunnel,
                cni_ips: entry.cni_ips,
            })
            .collect()
    }

    async fn act(&self, key: &str, action: Action) -> Result<(), MeshError> {
        debug!(pod = %key, ?action, "decided");
        match action {
            Action::Skip(_) => Ok(()),
            Action::RequeueNamespaceMissing => Err(MeshError::NamespaceMissing {
                pod: key.to_string(),
            }),
            Action::WriteOwedAnnotation { pod } => self.mesh.annotate_owed(&pod).await.map(|_| ()),
            Action::Add { pod, ips } => self.mesh.add_pod(&pod, &ips, Via::Watch).await,
            Action::Remove {
                pod,
                ips,
                deleted,
                terminal,
            } => self.mesh.remove_pod(&pod, &ips, deleted, terminal).await,
            Action::ReassertProbes { pod, ips } => self.mesh.reassert_probes(&pod, &ips).await,
        }
    }

    /// A plugin's add of the pod the store has now (checked against the policy once more: it
    /// may have changed since the request was read).
    async fn plugin_add(
        &self,
        key: &str,
        current: Option<Arc<Pod>>,
        ns_labels: Option<std::collections::BTreeMap<String, String>>,
        offer: PluginAdd,
    ) -> Result<Reconciled, MeshError> {
        let Some(p) = current else {
            return Err(MeshError::NotInStore {
                pod: key.to_string(),
            });
        };
        let Some(labels) = ns_labels else {
            return Err(MeshError::NamespaceMissing {
                pod: key.to_string(),
            });
        };
        if !self.policy.matches(&p, &labels) {
            return Ok(Reconciled::NotAmbient(p));
        }
        self.mesh
            .add_pod(&p, &pod::ips(&p), Via::Plugin(&offer))
            .await?;
        Ok(Reconciled::Enrolled)
    }

    /// Programs an enrolled pod again: the netns is read, and written only where it differs.
    async fn verify(&self, p: Arc<Pod>) -> Reconciled {
        let Some(netns) = self.mesh.cache.netns(pod::uid(&p)) else {
            return Reconciled::Done("no netns known");
        };
        let pod_net = pod::pod_net(&p, &pod::ips(&p));
        let dp = self.mesh.dataplane.clone();
        let verdict =
            match tokio::task::spawn_blocking(move || dp.program_pod(&netns, &pod_net)).await {
                Ok(result) => judge(&result),
                Err(source) => {
                    let failed = MeshError::Task {
                        pod: pod_key(pod::namespace(&p), pod::name(&p)),
                        step: MeshStep::ProgramPod,
                        source,
                    };
                    DriftFinding::Failed(failed.to_string())
                }
            };
        Reconciled::Verified { pod: p, verdict }
    }
}

/// Feeds the engine from the stores until `shutdown`: a pod update or delete triggers its key
/// (a delete first leaves the deleted object for the run); a namespace that appears, or whose
/// own match changes, triggers its pods. Pod adds do nothing (new pods come from the plugin;
/// existing ones through their namespace's add). Subscribe after both stores synced, so every
/// namespace's replayed add sees its pods.
pub async fn pump(engine: PodEngine, shutdown: CancellationToken) {
    let core = engine.reconciler().clone();
    let mut pods = core.pods.subscribe();
    let mut namespaces = core.namespaces.subscribe();
    let key_of = |p: &Pod| pod_key(pod::namespace(p), pod::name(p));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            ev = pods.recv() => match ev {
                Some(StoreEvent::Updated { new, .. }) => engine.trigger(key_of(&new)),
                Some(StoreEvent::Deleted(p)) => engine.trigger_with(key_of(&p), Request::gone(p)),
                Some(StoreEvent::Added(_)) => {}
                None => return,
            },
            ev = namespaces.recv() => {
                let kind = match &ev {
                    Some(StoreEvent::Added(_)) => "add",
                    Some(StoreEvent::Updated { .. }) => "update",
                    _ => "delete",
                };
                count_event(&core.metrics, kind);
                let (name, old, new) = match ev {
                    Some(StoreEvent::Added(ns)) => (ns.metadata.name.clone(), None, ns),
                    Some(StoreEvent::Updated { old, new }) => (new.metadata.name.clone(), Some(old), new),
                    Some(StoreEvent::Deleted(_)) => continue,
                    None => return,
                };
                let labels = |ns: &k8s_openapi::api::core::v1::Namespace| ns.metadata.labels.clone().unwrap_or_default();
                if machine::namespace_reevaluates(old.as_deref().map(labels).as_ref(), &labels(&new), &core.policy) {
                    let name = name.unwrap_or_default();
                    let pods = core.pods.pods_in_namespace(&name);
                    debug!(namespace = %name, pods = pods.len(), "re-evaluating the namespace's pods");
                    for key in machine::reevaluated_keys(&pods, &core.policy) {
                        engine.trigger(key);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "reconciler_tests.rs"]
mod tests;
