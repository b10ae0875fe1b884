//! The repair controller's reconcile, on the one reconcile engine (`crate::reconcile`): the pod
//! store's subscription ([`pump`]) and the sidecar drift pass's findings trigger keys
//! (`namespace/name`); [`reconcile`] acts on the pod as the store has it now; the error policy
//! ([`error_policy`], pure) decides between a jittered retry and giving up, and the failure
//! carries that decision as its class. One pod's work never runs twice at once and a second
//! trigger while it runs looks again after (the engine's promise); a key waiting for its retry
//! absorbs events (the retry reads the newest state); a pod UID is acted on once: success, a
//! permanent failure or the last attempt records it, so a pod that stays broken (or whose
//! annotations cannot be used) is never hot-looped. A deleted pod is forgotten.
//!
//! What the drift pass found comes as the key's payload ([`Findings`]): the key's run takes the
//! controller's own look, then heals drifted rules in place (`heal`); a pod handed over
//! (its redirect annotations changed since its rules were programmed) takes the policy path,
//! once per UID, whatever `detect` says.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::detect::{Detection, cannot_restart};
use super::effects::{ActError, Effects, event};
use super::heal::{self, Findings, HandOff, Heal, HealDone};
use super::{Mode, RepairTiming};
use crate::kube::EventType;
use crate::kube::stores::{PodStore, StoreEvent, Stored};
use crate::reconcile::{Class, Classify, Engine, EngineConfig, Reconcile};
use crate::telemetry::metrics::{Metrics, RepairLabels};

/// What became of a broken pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    Done,
    /// Nothing to do (already labelled; no capture wanted; detect-only mode).
    Skipped(&'static str),
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterFailure {
    RetryAfter(Duration),
    GiveUp,
}

/// The error policy: permanent errors and the last attempt give up; transient ones are retried
/// with the jittered doubling delay of the `retry` room. `attempt` counts from 1.
pub fn error_policy(err: &ActError, attempt: u32, timing: &RepairTiming) -> AfterFailure {
    let max = timing.retry.max_attempts.unwrap_or(u32::MAX);
    if err.is_permanent() || attempt >= max {
        AfterFailure::GiveUp
    } else {
        AfterFailure::RetryAfter(timing.retry.jittered_delay(attempt - 1))
    }
}

fn pod_ref(pod: &Pod) -> String {
    pod.key()
}

/// The reason of this mode's events (Istio's for delete and label).
fn reason(mode: &Mode) -> &'static str {
    match mode {
        Mode::Delete => "DeleteBrokenPod",
        Mode::Label { .. } => "LabelBrokenPod",
        Mode::Repair { .. } | Mode::Detect => "RepairBrokenPod",
    }
}

/// Why no mode ever acts on a hostNetwork pod: its netns is the node's (the plugin is never
/// called for it, so it cannot have missed its redirection).
pub const HOST_NETWORK_SKIP: &str =
    "hostNetwork pod: it shares the node's network namespace, which is never programmed";

/// Acts on one broken pod, as the mode says, and records the event of a success. `why` says what
/// made it broken (the validation container's exit, or the drift pass's reason). A hostNetwork
/// pod is skipped in every mode, whatever its annotations and containers say.
pub async fn reconcile<E: Effects + ?Sized>(
    effects: &E,
    mode: &Mode,
    pod: Arc<Pod>,
    why: &str,
) -> Result<Handled, ActError> {
    if pod.spec.as_ref().and_then(|s| s.host_network) == Some(true) {
        return Ok(Handled::Skipped(HOST_NETWORK_SKIP));
    }
    let (outcome, message) = match mode {
        Mode::Detect => return Ok(Handled::Skipped("no repair mode set")),
        Mode::Repair { key, value } if cannot_restart(&pod) => {
            return replace_or_label(effects, pod, why, key, value).await;
        }
        Mode::Repair { .. } => {
            if !effects.repair(pod.clone()).await? {
                return Ok(Handled::Skipped(
                    "interceptionMode NONE: nothing to program",
                ));
            }
            (
                Handled::Done,
                format!(
                    "pod detected as broken ({why}), traffic redirection programmed in its network namespace"
                ),
            )
        }
        Mode::Delete => {
            effects.delete(pod.clone()).await?;
            (
                Handled::Done,
                format!("pod detected as broken ({why}), deleted"),
            )
        }
        Mode::Label { key, value } => {
            if carries_label(&pod, key) {
                return Ok(Handled::Skipped("already labelled"));
            }
            effects
                .label(pod.clone(), key.clone(), value.clone())
                .await?;
            (
                Handled::Done,
                format!("pod detected as broken ({why}), labelled {key}={value}"),
            )
        }
    };
    let kind = if matches!(mode, Mode::Repair { .. }) {
        EventType::Normal
    } else {
        EventType::Warning
    };
    if let Err(e) = effects
        .event(pod.clone(), event(kind, reason(mode), message))
        .await
    {
        warn!(pod = %pod_ref(&pod), "recording the repair event failed: {e}");
    }
    Ok(outcome)
}

/// Whether the pod already carries the broken-pod label (its value aside): labelling is done.
fn carries_label(pod: &Pod, key: &str) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(key))
}

/// The controller that owns the pod (`kind name`), if any: it makes a replacement when the pod
/// is deleted.
fn controller_of(pod: &Pod) -> Option<String> {
    let owners = pod.metadata.owner_references.as_deref().unwrap_or_default();
    owners
        .iter()
        .find(|o| o.controller == Some(true))
        .map(|o| format!("{} {}", o.kind, o.name))
}

/// Repair mode for a pod that cannot restart: deleted when a controller (a Job's, a
/// ReplicaSet's) will make a new one, which starts with the plugin in place; a bare pod would be
/// gone for good, so it gets the broken-pod label for its owner to act on. A Warning event says
/// which and why either way.
async fn replace_or_label<E: Effects + ?Sized>(
    effects: &E,
    pod: Arc<Pod>,
    why: &str,
    key: &str,
    value: &str,
) -> Result<Handled, ActError> {
    let (reason, message) = match controller_of(&pod) {
        Some(owner) => {
            effects.delete(pod.clone()).await?;
            (
                "DeleteBrokenPod",
                format!(
                    "pod detected as broken ({why}); with restartPolicy Never it cannot run its \
                     init containers again, so it was deleted for its controller ({owner}) to \
                     recreate it"
                ),
            )
        }
        None => {
            if carries_label(&pod, key) {
                return Ok(Handled::Skipped("already labelled"));
            }
            effects
                .label(pod.clone(), key.to_string(), value.to_string())
                .await?;
            (
                "LabelBrokenPod",
                format!(
                    "pod detected as broken ({why}); with restartPolicy Never it cannot run its \
                     init containers again and no controller recreates it: labelled \
                     {key}={value}, delete and recreate it"
                ),
            )
        }
    };
    let record = event(EventType::Warning, reason, message);
    if let Err(e) = effects.event(pod.clone(), record).await {
        warn!(pod = %pod_ref(&pod), "recording the repair event failed: {e}");
    }
    Ok(Handled::Done)
}

/// The controller: the store, what counts as broken, what to do, and through what.
pub struct Controller<E: ?Sized> {
    pub pods: PodStore,
    pub detection: Detection,
    pub mode: Mode,
    pub effects: Arc<E>,
    pub metrics: Metrics,
    pub timing: RepairTiming,
}

/// What the controller remembers per key (the engine keeps what is queued, running or waiting).
#[derive(Default)]
struct Keys {
    /// key -> the UID acted on (once per UID).
    done: HashMap<String, String>,
    /// key -> (UID, failed attempts so far).
    attempts: HashMap<String, (String, u32)>,
}

impl Keys {
    /// A deleted pod is forgotten.
    fn forget(&mut self, key: &str) {
        self.done.remove(key);
        self.attempts.remove(key);
    }
}

/// A failed attempt, and whether the policy says it was the last.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct Failed {
    #[source]
    pub error: ActError,
    pub last: bool,
    /// The failure is the drift heal's (else the controller's own, the heal not tried).
    pub healing: bool,
}

impl Classify for Failed {
    fn class(&self) -> Class {
        if self.last {
            Class::GiveUp
        } else {
            Class::Retry
        }
    }
}

/// The controller's reconcile of one key over the engine.
pub struct Repairer<E: ?Sized> {
    controller: Controller<E>,
    keys: Mutex<Keys>,
}

/// The repair controller's engine: every trigger of a pod's work goes through it.
pub type Repairs<E> = Engine<Repairer<E>>;

impl<E: Effects + ?Sized> Reconcile for Repairer<E> {
    type Key = String;
    /// What the run did about a heal (the drift pass waits for it).
    type Done = HealDone;
    type Error = Failed;
    type Payload = Findings;

    fn reconcile(
        &self,
        key: String,
        found: Findings,
        retry: u32,
    ) -> BoxFuture<'_, Result<HealDone, Failed>> {
        Box::pin(async move {
            // The controller's own look first: when it fails, the heal is not tried and both
            // come back with the retry; a heal that fails leaves nothing else undone.
            self.reconcile_key(key.clone(), found.hand_off).await?;
            match found.heal {
                Some(h) => self.heal(&key, h, retry).await,
                None => Ok(HealDone::NotBrought),
            }
        })
    }
}

impl<E: ?Sized> Repairer<E> {
    /// Through what the controller acts.
    pub fn effects(&self) -> &Arc<E> {
        &self.controller.effects
    }

    pub fn metrics(&self) -> &Metrics {
        &self.controller.metrics
    }

    pub fn pods(&self) -> &PodStore {
        &self.controller.pods
    }
}

impl<E: Effects + ?Sized> Controller<E> {
    fn count(&self, result: &str) {
        self.metrics
            .pods_repaired
            .get_or_create(&RepairLabels {
                r#type: self.mode.as_str().to_string(),
                result: result.to_string(),
            })
            .inc();
    }

    /// The controller on its engine. A key waiting for its retry absorbs triggers (the retry
    /// reads the newest state, and events must not shorten its backoff); a caller waiting for a
    /// run's answer (the drift pass's heal) is never made to wait out a backoff.
    pub fn engine(self, shutdown: CancellationToken) -> Repairs<E> {
        let config = EngineConfig {
            concurrency: REPAIRS_AT_ONCE,
            retry: self.timing.retry,
            trigger_cuts_backoff: false,
        };
        let repairer = Arc::new(Repairer {
            controller: self,
            keys: Mutex::default(),
        });
        Engine::new(repairer, config, shutdown)
    }
}

/// Feeds the engine from the pod store until `shutdown` (or the store goes away): every added or
/// updated pod is a trigger of its key; a deleted pod is forgotten.
pub async fn pump<E: Effects + ?Sized>(engine: Repairs<E>, shutdown: CancellationToken) {
    let repairer = engine.reconciler().clone();
    let mut events = repairer.controller.pods.subscribe();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            ev = events.recv() => match ev {
                None => break,
                Some(StoreEvent::Deleted(pod)) => repairer.keys.lock().forget(&pod.key()),
                Some(StoreEvent::Added(pod) | StoreEvent::Updated { new: pod, .. }) => {
                    engine.trigger(pod.key());
                }
            },
        }
    }
    debug!("repair controller stopped");
}

/// Broken pods acted on at once (each is a few API calls or one netns programming).
const REPAIRS_AT_ONCE: usize = 8;

impl<E: Effects + ?Sized> Repairer<E> {
    /// Heals the drifted rules of the pod the finding was about, if it is still the pod under
    /// the name. A failure is retried by the engine (spaced as the controller's retries are,
    /// given up after as many attempts until the next finding).
    async fn heal(&self, key: &str, found: Heal, retry: u32) -> Result<HealDone, Failed> {
        let c = &self.controller;
        let uid = found.expected.uid.as_str();
        let Some(pod) = c
            .pods
            .get(key)
            .filter(|p| p.metadata.uid.as_deref() == Some(uid))
        else {
            debug!(pod = %key, uid, "drift finding for a pod that is gone: dropped");
            return Ok(HealDone::NotBrought);
        };
        match heal::heal(&*c.effects, &c.metrics, pod, found).await {
            Ok(()) => Ok(HealDone::Healed),
            Err(error) => {
                let max = c.timing.retry.max_attempts.unwrap_or(u32::MAX);
                Err(Failed {
                    error,
                    last: retry.saturating_add(1) >= max,
                    healing: true,
                })
            }
        }
    }

    /// Looks at the pod as the store has it now; acts if it is broken (or handed over) and its
    /// UID was not acted on.
    async fn reconcile_key(&self, key: String, handed: Option<HandOff>) -> Result<(), Failed> {
        let c = &self.controller;
        let Some(pod) = c.pods.get(&key) else {
            return Ok(());
        };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let why = {
            let keys = self.keys.lock();
            let handed = handed.filter(|h| h.uid == uid);
            if handed.is_some() && !c.detection.selected(&pod) {
                // The operator's selectors bound every action of the controller, hand-offs too.
                info!(pod = %key, "pod handed over by the sidecar drift check is outside REPAIR_LABEL_SELECTORS/REPAIR_FIELD_SELECTORS; not acted on");
                return Ok(());
            }
            if let Some(HandOff { why, .. }) = handed {
                info!(pod = %key, action = c.mode.as_str(), "pod handed over by the sidecar drift check: {why}");
                why
            } else {
                if keys.done.get(&key) == Some(&uid) {
                    return Ok(());
                }
                let Some(broken) = c.detection.broken(&pod) else {
                    return Ok(());
                };
                info!(
                    pod = %key,
                    container = %broken.container,
                    exit_code = broken.exit_code,
                    action = c.mode.as_str(),
                    "broken pod detected"
                );
                format!(
                    "init container {} last exited {}",
                    broken.container, broken.exit_code
                )
            }
        };
        let result = reconcile(&*c.effects, &c.mode, pod.clone(), &why).await;
        self.finish(key, uid, pod, result)
    }

    /// Records that `uid` was acted on, unless the pod went away meanwhile (its delete event
    /// already came, so nothing would ever forget the record).
    fn remember(&self, key: String, uid: String) {
        let present = self
            .controller
            .pods
            .get(&key)
            .is_some_and(|p| p.metadata.uid.as_deref() == Some(uid.as_str()));
        let mut keys = self.keys.lock();
        keys.attempts.remove(&key);
        if present {
            keys.done.insert(key, uid);
        }
    }

    fn finish(
        &self,
        key: String,
        uid: String,
        pod: Arc<Pod>,
        result: Result<Handled, ActError>,
    ) -> Result<(), Failed> {
        let c = &self.controller;
        let action = c.mode.as_str();
        let err = match result {
            Ok(Handled::Done) => {
                info!(pod = %key, uid = %uid, action, "broken pod handled");
                c.count("success");
                self.remember(key, uid);
                return Ok(());
            }
            Ok(Handled::Skipped(why)) => {
                info!(pod = %key, uid = %uid, action, "broken pod skipped: {why}");
                c.count("skip");
                self.remember(key, uid);
                return Ok(());
            }
            Err(e) => e,
        };
        let attempt = {
            let mut keys = self.keys.lock();
            let entry = keys
                .attempts
                .entry(key.clone())
                .or_insert_with(|| (uid.clone(), 0));
            if entry.0 != uid {
                *entry = (uid.clone(), 0);
            }
            entry.1 += 1;
            entry.1
        };
        match error_policy(&err, attempt, &c.timing) {
            AfterFailure::RetryAfter(_) => {
                warn!(pod = %key, action, attempt, "acting on broken pod failed, retrying: {err}");
                Err(Failed {
                    error: err,
                    last: false,
                    healing: false,
                })
            }
            AfterFailure::GiveUp => {
                error!(pod = %key, action, attempt, "acting on broken pod failed, giving up on this pod: {err}");
                c.count("fail");
                self.remember(key.clone(), uid);
                let message = format!("pod detected as broken, but {action} failed: {err}");
                let ev = event(EventType::Warning, reason(&c.mode), message);
                let effects = c.effects.clone();
                tokio::spawn(async move {
                    if let Err(e) = effects.event(pod, ev).await {
                        warn!(pod = %key, "recording the repair event failed: {e}");
                    }
                });
                Err(Failed {
                    error: err,
                    last: true,
                    healing: false,
                })
            }
        }
    }
}

#[cfg(test)]
#[path = "controller_tests.rs"]
pub(crate) mod tests;
