//! The sidecar drift pass: every running sidecar pod the plugin would have programmed
//! is checked, on a jittered period and when the CNI config guard re-installed our entry, for
//! exactly the rules its derivation gives; drift is healed in place or handed to the repair
//! policy, and reported once when it cannot be healed.
//!
//! Pure part ([`candidate`], [`DriftMemory`]): which pods count, the derivation first seen per pod
//! UID (the basis: an annotation edited on a running pod changes the derivation but not the rules
//! the plugin gave it, so such a pod is not rewritten here but handed to the controller's policy,
//! once per UID), and when a failure is reported (once until the pod is fine again). The pass only
//! reads (one /proc scan per pass, one kernel read per netns, through the controller's
//! [`Effects`]); what it finds is a trigger of the pod's key on the controller's engine with the
//! finding as payload ([`Findings`]): the heal runs there (`heal`), never beside other work on the
//! pod, and the pass waits for its answer, one pod after another.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::controller::Repairs;
use super::effects::{Effects, Expected, event};
use super::heal::{Findings, Heal, HealDone};
use super::heal::{KIND, REASON_UNHEALED};
use crate::apply::pod::NetnsCheck;
use crate::kube::stores::{PodStore, Stored, pod_ips};
use crate::kube::{EventRecord, EventType};
use crate::retry::periodic::{Kick, Periodic};
use crate::sidecar::PodInfo;
use crate::sidecar::redirect::{ANN_STATUS, EngineEnv, Redirect, redirect, skip_reason};
use crate::telemetry::metrics::Metrics;

/// The agent's annotation on pods it redirects (ambient): never ours to check.
const AMBIENT_REDIRECTION: &str = "ambient.istio.io/redirection";

/// The most rules one pod may have for the pass to verify it. Its rules are read from the kernel
/// and compared each period; a pod over this (its annotations are in its author's hands) is
/// reported once and left out, so it cannot take the pass's time from the node's other pods.
/// Istio's own rule sets are tens of rules.
pub const MAX_VERIFIED_RULES: usize = 10_000;

/// How long the pass waits for one pod's heal (the engine's run and its retries). Past it the
/// pass moves on; the run goes on and reports its own outcome.
pub(super) const HEAL_WAIT: Duration = Duration::from_secs(120);

/// How the pass is run (install-cni's settings).
#[derive(Debug, Clone)]
pub struct DriftSettings {
    /// `DRIFT_VERIFY_INTERVAL`.
    pub period: Duration,
    /// Kicked by the CNI config guard when it (re)installed our entry.
    pub kick: Kick,
    /// `EXCLUDE_NAMESPACES`: the plugin leaves their pods alone, so does the pass.
    pub exclude_namespaces: Vec<String>,
}

/// Why the pass cannot run on this host, if it cannot: pods' netns are found under
/// `HOST_PROC_DIR`, which the chart mounts only for in-place repair or ambient. Checked once at
/// start, so a missing mount is one warning, not one per pod and pass.
pub fn unusable_proc(host_proc_dir: &std::path::Path) -> Option<String> {
    (!host_proc_dir.join("self").exists()).then(|| {
        format!(
            "{} is not a procfs mount (HOST_PROC_DIR; the chart mounts the host /proc with repair.repairPods or ambient)",
            host_proc_dir.display()
        )
    })
}

/// Whether the plugin would have programmed `pod`'s netns: running, with an IP, not host-network,
/// not in an excluded namespace, not ambient, and selected by Istio's sidecar checks.
pub fn candidate(pod: &Pod, info: &PodInfo, exclude_namespaces: &[String]) -> bool {
    let running = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Running");
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    running
        && pod.metadata.uid.as_deref().is_some_and(|u| !u.is_empty())
        && !info.host_network
        && !exclude_namespaces.iter().any(|n| n == namespace)
        && !info.annotations.contains_key(AMBIENT_REDIRECTION)
        && skip_reason(info).is_none()
        && !pod_ips(pod).is_empty()
}

/// A pod's redirect derivation, as compared between passes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Derived {
    Capture(Arc<crate::sidecar::redirect::CaptureSettings>),
    /// `interceptionMode: NONE`: nothing was programmed.
    NoCapture,
    /// The annotations cannot be used (the plugin would have failed ADD).
    Invalid(String),
}

impl Derived {
    pub fn of(info: &PodInfo, engine: &EngineEnv) -> Derived {
        match redirect(info, engine) {
            Ok(Redirect::Capture(s)) => Derived::Capture(Arc::new(*s)),
            Ok(Redirect::None) => Derived::NoCapture,
            Err(e) => Derived::Invalid(e.to_string()),
        }
    }
}

/// The redirect-relevant annotations (for naming what changed; the status is left out: it is
/// large and set once by the injector).
fn redirect_annotations(info: &PodInfo) -> BTreeMap<String, String> {
    info.annotations
        .iter()
        .filter(|(k, _)| {
            (k.contains("sidecar.istio.io/") && k.as_str() != ANN_STATUS)
                || k.as_str() == crate::sidecar::redirect::ANN_REROUTE_VIRTUAL_INTERFACES
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// What the pass does with one candidate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Verify its netns against these settings.
    Verify(Arc<crate::sidecar::redirect::CaptureSettings>),
    /// Nothing to verify (no capture wanted, unusable annotations, or already handed over).
    Skip,
    /// Hand it to the controller's policy (first time for this UID).
    HandOff { why: String },
    /// More rules than [`MAX_VERIFIED_RULES`]: reported (first time for this UID), never
    /// verified.
    OverBudget { rules: usize },
}

/// What became of one verified pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodOutcome {
    InPlace,
    Healed {
        what: String,
    },
    /// Not healed: the netns was not found, or reading or programming it failed.
    Unhealed {
        why: String,
    },
}

/// What to report for one outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Report {
    Nothing,
    /// Log, Normal event, `drift_repaired` (done by the heal's run, `heal::heal`).
    Healed,
    /// Log, Warning event, `drift_unhealed` (once until the pod is fine again).
    Unhealed,
}

/// What the pass remembers per pod UID.
#[derive(Debug, Default)]
pub struct DriftMemory {
    /// UID -> the first derivation seen, with the annotations it came from.
    basis: HashMap<String, (Derived, BTreeMap<String, String>)>,
    /// UIDs handed to the controller's policy.
    handed: HashSet<String>,
    /// UIDs whose failure was reported and not yet cleared.
    reported: HashSet<String>,
    /// UIDs over the rule budget (their basis does not change, so neither does their count).
    over_budget: HashSet<String>,
}

impl DriftMemory {
    /// Decides for one candidate pod, recording its basis when first seen.
    pub fn plan(&mut self, uid: &str, info: &PodInfo, derived: Derived) -> Plan {
        let annotations = redirect_annotations(info);
        let (basis, seen) = self
            .basis
            .entry(uid.to_string())
            .or_insert_with(|| (derived.clone(), annotations.clone()));
        if *basis != derived {
            if !self.handed.insert(uid.to_string()) {
                return Plan::Skip;
            }
            let changed: Vec<&str> = seen
                .keys()
                .chain(annotations.keys())
                .filter(|k| seen.get(*k) != annotations.get(*k))
                .map(String::as_str)
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            let what = if changed.is_empty() {
                "the pod's redirect settings".to_string()
            } else {
                format!("annotations {}", changed.join(", "))
            };
            return Plan::HandOff {
                why: format!(
                    "{what} changed since its traffic redirection was programmed; the rules are not rewritten while the pod runs"
                ),
            };
        }
        match derived {
            _ if self.over_budget.contains(uid) => Plan::Skip,
            Derived::Capture(settings) => match settings.planned_rules() {
                rules if rules > MAX_VERIFIED_RULES => {
                    self.over_budget.insert(uid.to_string());
                    Plan::OverBudget { rules }
                }
                _ => Plan::Verify(settings),
            },
            Derived::NoCapture | Derived::Invalid(_) => Plan::Skip,
        }
    }

    /// What to report for `outcome`; a failure is reported once until the pod is fine again.
    pub fn record(&mut self, uid: &str, outcome: &PodOutcome) -> Report {
        match outcome {
            PodOutcome::InPlace => {
                self.reported.remove(uid);
                Report::Nothing
            }
            PodOutcome::Healed { .. } => {
                self.reported.remove(uid);
                Report::Healed
            }
            PodOutcome::Unhealed { .. } => {
                if self.reported.insert(uid.to_string()) {
                    Report::Unhealed
                } else {
                    Report::Nothing
                }
            }
        }
    }

    /// Forgets pods no longer in the store (memory follows the node's pods).
    pub fn retain(&mut self, live: &HashSet<String>) {
        self.basis.retain(|uid, _| live.contains(uid));
        self.handed.retain(|uid| live.contains(uid));
        self.reported.retain(|uid| live.contains(uid));
        self.over_budget.retain(|uid| live.contains(uid));
    }

    pub fn len(&self) -> usize {
        self.basis.len()
    }

    pub fn is_empty(&self) -> bool {
        self.basis.is_empty()
    }
}

/// Counts of one pass, logged on one line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassStats {
    pub verified: usize,
    pub healed: usize,
    pub failed: usize,
    pub handed_over: usize,
    /// Pods first found over the rule budget in this pass (each reported once, then left out).
    pub over_budget: usize,
}

/// The pass over the node pod store (the controller's), with its memory.
pub struct DriftPass<E: Effects + ?Sized> {
    /// What the plugin reads from the runtime's environment (the derivation's input).
    pub env: Arc<EngineEnv>,
    pub exclude_namespaces: Vec<String>,
    /// The repair controller's engine: each finding is a trigger of the pod's key there.
    pub repairs: Repairs<E>,
    pub memory: DriftMemory,
}

impl<E: Effects + ?Sized> DriftPass<E> {
    fn pods(&self) -> &PodStore {
        self.repairs.reconciler().pods()
    }

    fn effects(&self) -> &Arc<E> {
        self.repairs.reconciler().effects()
    }

    fn metrics(&self) -> &Metrics {
        self.repairs.reconciler().metrics()
    }

    /// One pass over the store's pods as they are now.
    pub async fn pass(&mut self) -> PassStats {
        let mut stats = PassStats::default();
        let mut pods = self.pods().list();
        // In name order: logs and events come out the same way every pass.
        pods.sort_by_key(|p| p.key());
        let live: HashSet<String> = pods.iter().filter_map(|p| p.metadata.uid.clone()).collect();
        self.memory.retain(&live);
        let mut batch = Vec::new();
        let mut by_uid: HashMap<String, Arc<Pod>> = HashMap::new();
        for pod in pods {
            let info = PodInfo::from_pod(&pod);
            if !candidate(&pod, &info, &self.exclude_namespaces) {
                continue;
            }
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let derived = Derived::of(&info, &self.env);
            match self.memory.plan(&uid, &info, derived) {
                Plan::Skip => {}
                Plan::Verify(settings) => {
                    batch.push(Expected {
                        uid: uid.clone(),
                        ips: pod_ips(&pod),
                        settings,
                    });
                    by_uid.insert(uid, pod);
                }
                Plan::HandOff { why } => {
                    stats.handed_over += 1;
                    self.hand_off(pod, uid, why).await;
                }
                Plan::OverBudget { rules } => {
                    stats.over_budget += 1;
                    self.over_budget(pod, rules).await;
                }
            }
        }
        stats.verified = batch.len();
        let expected: HashMap<String, Expected> =
            batch.iter().map(|e| (e.uid.clone(), e.clone())).collect();
        let results = self.effects().verify_pods(batch).await;
        for checked in results {
            let (Some(pod), Some(exp)) = (by_uid.get(&checked.uid), expected.get(&checked.uid))
            else {
                continue;
            };
            let outcome = match checked.result {
                Ok((_, NetnsCheck::InPlace)) => PodOutcome::InPlace,
                Ok((netns, verdict)) => {
                    let what = match verdict {
                        NetnsCheck::Drifted { what } => what,
                        _ => "no rules of ours at all".to_string(),
                    };
                    let heal = Heal {
                        netns,
                        expected: exp.clone(),
                        what,
                    };
                    match self.heal(pod.key(), heal).await {
                        Some(outcome) => outcome,
                        None => continue,
                    }
                }
                Err(e) => PodOutcome::Unhealed { why: e.to_string() },
            };
            match &outcome {
                PodOutcome::Healed { .. } => stats.healed += 1,
                PodOutcome::Unhealed { .. } => stats.failed += 1,
                PodOutcome::InPlace => {}
            }
            let report = self.memory.record(&checked.uid, &outcome);
            self.report(pod.clone(), &outcome, report).await;
        }
        stats
    }

    /// The heal as a run of the pod's key on the controller's engine (after any work on the pod
    /// in flight); its outcome, or `None` when it did not come to the heal this time.
    async fn heal(&self, key: String, heal: Heal) -> Option<PodOutcome> {
        let what = heal.what.clone();
        let waiting = self
            .repairs
            .trigger_with_and_wait(key.clone(), Findings::heal(heal));
        let Ok(answer) = tokio::time::timeout(HEAL_WAIT, waiting).await else {
            warn!(pod = %key, "sidecar drift heal still running after {HEAL_WAIT:?}; the pass goes on");
            return None;
        };
        let answer = answer.ok()?;
        match answer {
            Ok(HealDone::Healed) => Some(PodOutcome::Healed { what }),
            Err(failed) if failed.healing => Some(PodOutcome::Unhealed {
                why: format!("{what}; re-programming failed: {}", failed.error),
            }),
            // Gone meanwhile, or the controller's own work failed first (the heal comes with
            // its retry).
            _ => None,
        }
    }

    async fn hand_off(&mut self, pod: Arc<Pod>, uid: String, why: String) {
        let key = pod.key();
        warn!(pod = %key, uid = %uid, "sidecar drift not healed, handed to the repair policy: {why}");
        self.metrics().drift(KIND, false);
        let message = format!("{why}; handed to the repair controller's policy");
        self.post(pod, event(EventType::Warning, REASON_UNHEALED, message))
            .await;
        self.repairs.trigger_with(key, Findings::hand_off(uid, why));
    }

    async fn over_budget(&self, pod: Arc<Pod>, rules: usize) {
        let key = pod.key();
        let why = format!(
            "its redirection is {rules} rules, more than the {MAX_VERIFIED_RULES} a drift check reads; it is not verified or healed while it runs"
        );
        warn!(pod = %key, "sidecar drift check skips the pod: {why}");
        self.metrics().drift(KIND, false);
        self.post(pod, event(EventType::Warning, REASON_UNHEALED, why))
            .await;
    }

    async fn report(&self, pod: Arc<Pod>, outcome: &PodOutcome, report: Report) {
        let key = pod.key();
        // A heal was reported by the run that healed (`heal::heal`).
        match (outcome, report) {
            (PodOutcome::Unhealed { why }, Report::Unhealed) => {
                warn!(pod = %key, "sidecar redirection cannot be verified or healed (retried next pass): {why}");
                self.metrics().drift(KIND, false);
                let message = format!("traffic redirection cannot be verified or healed: {why}");
                self.post(pod, event(EventType::Warning, REASON_UNHEALED, message))
                    .await;
            }
            (PodOutcome::Unhealed { why }, _) => {
                debug!(pod = %key, "sidecar redirection still not healed: {why}")
            }
            _ => {}
        }
    }

    async fn post(&self, pod: Arc<Pod>, ev: EventRecord) {
        let key = pod.key();
        if let Err(e) = self.effects().event(pod, ev).await {
            warn!(pod = %key, "recording the drift event failed: {e}");
        }
    }

    /// A pass once the store has synced, then one per jittered period or kick, until `stop`.
    pub async fn run(mut self, schedule: Periodic, stop: CancellationToken) {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                synced = self.pods().wait_synced(Duration::from_secs(60)) => if synced.is_ok() { break },
            }
        }
        info!(period = ?schedule.period(), "sidecar drift check started");
        loop {
            let started = Instant::now();
            let stats = self.pass().await;
            info!(
                verified = stats.verified,
                healed = stats.healed,
                failed = stats.failed,
                handed_over = stats.handed_over,
                over_budget = stats.over_budget,
                duration_ms = started.elapsed().as_millis() as u64,
                "sidecar drift pass"
            );
            tokio::select! {
                _ = stop.cancelled() => return,
                woken = schedule.wait() => debug!(?woken, "sidecar drift pass due"),
            }
        }
    }
}

#[cfg(test)]
#[path = "drift_tests.rs"]
mod tests;
