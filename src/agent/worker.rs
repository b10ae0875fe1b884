//! The work queue (§3.4, improved): pod events keyed by `namespace/name`; one pod's events are
//! handled in order, different pods concurrently (bounded), and a failed event is retried with
//! jittered exponential backoff (Istio: one global worker, L13). A failed update is dropped in
//! favour of a newer event for the same pod (the decision is re-made from the store anyway);
//! deletes are retried until they succeed. Events whose namespace is not in the store yet are
//! retried too (Istio dropped them, B9).

use parking_lot::{Mutex, MutexGuard};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};

use super::machine::{self, Action, EnrolmentPolicy, PodEvent};
use super::mesh::Mesh;
use super::pod;
use super::settings::AgentTiming;
use crate::kube::stores::{self, NamespaceStore, PodStore, StoreEvent};
use crate::telemetry::metrics::{EventTypeLabel, Metrics};

/// What the worker decides with and acts through.
pub struct Core {
    pub pods: PodStore,
    pub namespaces: NamespaceStore,
    pub policy: EnrolmentPolicy,
    pub mesh: Mesh,
    pub timing: AgentTiming,
    /// `istio_cni_plugin_requests_total`, `nodeagent_reconcile_events_total`.
    pub metrics: Metrics,
    /// The drift pass's last results (`/debug/pods`).
    pub status: super::status::Status,
}

fn count_event(metrics: &Metrics, kind: &str) {
    metrics
        .reconcile_events
        .get_or_create(&EventTypeLabel {
            r#type: kind.to_string(),
        })
        .inc();
}

/// Counters, for logs and tests.
#[derive(Debug, Default)]
pub struct Stats {
    pub handled: AtomicU64,
    pub retried: AtomicU64,
    pub dropped: AtomicU64,
    pub superseded: AtomicU64,
}

struct Shared {
    core: Arc<Core>,
    keys: Mutex<HashMap<String, VecDeque<PodEvent>>>,
    permits: Semaphore,
    shutdown: CancellationToken,
    stats: Stats,
}

/// Handle to the queue. Cheap to clone.
#[derive(Clone)]
pub struct Worker {
    shared: Arc<Shared>,
}

enum Outcome {
    Done,
    Retry(String),
    Drop(String),
}

impl Worker {
    pub fn new(core: Arc<Core>, shutdown: CancellationToken) -> Self {
        let permits = Semaphore::new(core.timing.max_concurrent_pods.max(1));
        Worker {
            shared: Arc::new(Shared {
                core,
                keys: Mutex::new(HashMap::new()),
                permits,
                shutdown,
                stats: Stats::default(),
            }),
        }
    }

    fn keys(&self) -> MutexGuard<'_, HashMap<String, VecDeque<PodEvent>>> {
        self.shared.keys.lock()
    }

    pub fn core(&self) -> &Arc<Core> {
        &self.shared.core
    }

    pub fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    /// Events waiting or in progress.
    pub fn pending(&self) -> usize {
        self.keys().values().map(VecDeque::len).sum()
    }

    /// Queues an event; starts a task for its pod unless one is running.
    pub fn enqueue(&self, event: PodEvent) {
        let key = event.key();
        let mut keys = self.keys();
        if let Some(queue) = keys.get_mut(&key) {
            queue.push_back(event);
            return;
        }
        keys.insert(key.clone(), VecDeque::from([event]));
        drop(keys);
        let worker = self.clone();
        tokio::spawn(async move { worker.run_key(key).await });
    }

    async fn run_key(self, key: String) {
        loop {
            let event = {
                let mut keys = self.keys();
                match keys.get(&key).and_then(|q| q.front().cloned()) {
                    Some(ev) => ev,
                    None => {
                        keys.remove(&key);
                        return;
                    }
                }
            };
            let mut retry = 0u32;
            loop {
                if self.shared.shutdown.is_cancelled() {
                    return;
                }
                let outcome = {
                    let Ok(_permit) = self.shared.permits.acquire().await else {
                        return;
                    };
                    self.handle(&event).await
                };
                self.shared.stats.handled.fetch_add(1, Ordering::Relaxed);
                match outcome {
                    Outcome::Done => break,
                    Outcome::Drop(why) => {
                        self.shared.stats.dropped.fetch_add(1, Ordering::Relaxed);
                        error!(pod = %key, "giving up on this event: {why}");
                        break;
                    }
                    Outcome::Retry(why) => {
                        let newer = self.keys().get(&key).is_some_and(|q| q.len() > 1);
                        if newer && matches!(event, PodEvent::Update { .. }) {
                            self.shared.stats.superseded.fetch_add(1, Ordering::Relaxed);
                            debug!(pod = %key, "failed update superseded by a newer event: {why}");
                            break;
                        }
                        let delay = self.shared.core.timing.retry.jittered_delay(retry);
                        self.shared.stats.retried.fetch_add(1, Ordering::Relaxed);
                        warn!(pod = %key, retry, delay_ms = delay.as_millis() as u64, "will retry: {why}");
                        retry = retry.saturating_add(1);
                        tokio::select! {
                            _ = self.shared.shutdown.cancelled() => return,
                            _ = tokio::time::sleep(delay) => {}
                        }
                    }
                }
            }
            if let Some(q) = self.keys().get_mut(&key) {
                q.pop_front();
            }
        }
    }

    async fn handle(&self, event: &PodEvent) -> Outcome {
        let core = &self.shared.core;
        let kind = match event {
            PodEvent::Update { .. } => "update",
            PodEvent::Delete(_) => "delete",
        };
        count_event(&core.metrics, kind);
        let (namespace, current) = match event {
            PodEvent::Update { new, .. } => {
                (pod::namespace(new).to_string(), core.pods.get(&event.key()))
            }
            PodEvent::Delete(p) => (pod::namespace(p).to_string(), None),
        };
        let ns_labels = stores::namespace_labels(&core.namespaces, &namespace);
        let action = machine::decide(event, current.as_ref(), ns_labels.as_ref(), &core.policy);
        debug!(pod = %event.key(), ?action, "decided");
        let result = match action {
            Action::Skip(_) => return Outcome::Done,
            Action::RequeueNamespaceMissing => {
                return Outcome::Retry(format!("namespace {namespace} not in the store yet"));
            }
            // Enrolled by a `/podadd` whose annotation is not written yet (so the store says
            // "not enrolled"): the annotation is all that is missing; a second add would send
            // ztunnel the pod again.
            Action::Add { pod, .. } if core.mesh.cache.annotation_owed(pod::uid(&pod)) => {
                core.mesh.annotate_owed(&pod).await.map(|_| ())
            }
            Action::Add { pod, ips } => {
                core.mesh.add_pod(&pod, &ips, super::mesh::Via::Watch).await
            }
            Action::Remove { pod, deleted } => {
                let terminal = deleted && matches!(event, PodEvent::Update { .. });
                core.mesh.remove_pod(&pod, deleted, terminal).await
            }
            Action::ReassertProbes { pod, ips } => core.mesh.reassert_probes(&pod, &ips).await,
        };
        match result {
            Ok(()) => Outcome::Done,
            Err(e) if e.is_retryable() => Outcome::Retry(e.to_string()),
            Err(e) => Outcome::Drop(e.to_string()),
        }
    }

    /// Feeds the queue from the stores until `shutdown`: pod updates and deletes; a namespace
    /// that appears, or whose own match changes, re-evaluates its pods. Pod adds do nothing (new
    /// pods come from the plugin; existing ones through their namespace's add). Subscribe after
    /// both stores synced, so every namespace's replayed add sees its pods.
    pub async fn pump(self) {
        let mut pods = self.core().pods.subscribe();
        let mut namespaces = self.core().namespaces.subscribe();
        let shutdown = self.shared.shutdown.clone();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                ev = pods.recv() => match ev {
                    Some(StoreEvent::Updated { old, new }) => self.enqueue(PodEvent::Update { old, new }),
                    Some(StoreEvent::Deleted(p)) => self.enqueue(PodEvent::Delete(p)),
                    Some(StoreEvent::Added(_)) => {}
                    None => return,
                },
                ev = namespaces.recv() => {
                    let kind = match &ev {
                        Some(StoreEvent::Added(_)) => "add",
                        Some(StoreEvent::Updated { .. }) => "update",
                        _ => "delete",
                    };
                    count_event(&self.core().metrics, kind);
                    let (name, old, new) = match ev {
                        Some(StoreEvent::Added(ns)) => (ns.metadata.name.clone(), None, ns),
                        Some(StoreEvent::Updated { old, new }) => (new.metadata.name.clone(), Some(old), new),
                        Some(StoreEvent::Deleted(_)) => continue,
                        None => return,
                    };
                    let labels = |ns: &k8s_openapi::api::core::v1::Namespace| ns.metadata.labels.clone().unwrap_or_default();
                    let policy = &self.core().policy;
                    if machine::namespace_reevaluates(old.as_deref().map(labels).as_ref(), &labels(&new), policy) {
                        let name = name.unwrap_or_default();
                        let pods = self.core().pods.pods_in_namespace(&name);
                        debug!(namespace = %name, pods = pods.len(), "re-evaluating the namespace's pods");
                        for ev in machine::reevaluation_events(&pods, policy) {
                            self.enqueue(ev);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "worker_tests.rs"]
mod tests;
