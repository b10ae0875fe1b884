//! The drift pass: nothing else looks at an enrolled pod once its rules are in, so
//! something that rewrote them (another agent, a debugging session, a node upgrade) would leave
//! the pod un-redirected silently. Once after the startup snapshot, then every
//! `DRIFT_VERIFY_INTERVAL` (jittered, `retry::periodic`) and when install-cni's guard (re)installed
//! our CNI entry, the pass:
//!
//! - programs every cached pod with a netns again, as a run of the pod's key on the agent's
//!   engine (never beside an add or a remove of it). Programming reads the netns once (`*-save`, or `nft list`) and writes
//!   only when it differs from the plan, atomically; so an untouched pod costs one read and keeps
//!   its rule counters. A write is a heal: a warning log, a Normal event on the pod and
//!   `istio_cni_drift_repaired_total{kind="ambient_rules"}`. A pod that cannot be programmed is
//!   reported once (a Warning event and `istio_cni_drift_unhealed_total`) and tried again each
//!   pass, quietly, until it heals or leaves;
//! - verifies the host probe SNAT rules (iptables: `ISTIO_POSTRT` and its POSTROUTING jump;
//!   nftables: the host table) and that the probe sets exist, read and compared with the plan,
//!   written only where they differ (a firewalld reload flushes them). A repair
//!   counts as `kind="host_rules"` with a warning naming what was missing;
//! - reconciles the host probe set with the IPs recorded in the pod cache (read fresh from the
//!   kernel), under the probe gate so no add or remove is half done; every entry put back or
//!   pruned counts as `kind="probe_set"`, and a pod whose entry was put back gets an event.
//!
//! The pass waits for each pod's verify at most `VERIFY_WAIT`: a pod whose run does not end is
//! counted skipped (a warning naming it) and the pass goes on.
//!
//! Each pod's and the host's last result is kept in `Core::status` (`/debug/pods`).
//!
//! Which outcomes are heals and when to report a failure is decided by [`judge`] (in `findings`) and
//! [`Reported`] (pure); the effects go through the agent's ports.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::findings::{CheckResult, DriftFinding};
use super::pod;
use super::ports::{DataplaneError, DataplanePort, ProbeSynced};
use super::reconciler::{Core, PodEngine, Reconciled, Request};
use crate::kube::stores::pod_key;
use crate::kube::{EventRecord, EventType};
use crate::retry::periodic::Periodic;

/// Event reason: a pod's in-pod rules had drifted and were re-applied.
pub const REASON_RULES_REPAIRED: &str = "RedirectionDriftRepaired";
/// Event reason: a pod's probe-set entry was missing (or another pod's) and was put back.
pub const REASON_PROBE_REPAIRED: &str = "ProbeSetDriftRepaired";
/// Event reason: a pod's in-pod rules could not be verified or re-applied.
pub const REASON_UNHEALED: &str = "RedirectionDriftUnhealed";

/// The metric kinds this pass counts.
pub const KIND_RULES: &str = "ambient_rules";
pub const KIND_PROBE_SET: &str = "probe_set";
pub const KIND_HOST_RULES: &str = "host_rules";

/// How long the pass waits for one pod's verify: its run on the engine, after whatever work on
/// the pod is in flight. Generous (a verify is one read of the netns, and a write only where it
/// differs); past it the pass counts the pod skipped and moves on, so one stuck pod cannot keep
/// the node's other pods and the probe set unchecked. The run goes on and ends on its own.
pub(super) const VERIFY_WAIT: Duration = Duration::from_secs(120);

/// Which failures were already reported. A pod that cannot be healed is tried again every pass,
/// but reported (event, unhealed metric) once per failing streak: not an event per period.
#[derive(Debug, Default)]
pub struct Reported {
    failing: HashSet<String>,
    probe_set_failing: bool,
    host_failing: bool,
}

impl Reported {
    /// A failure of `uid`; true when it starts a streak (report it).
    pub fn pod_failed(&mut self, uid: &str) -> bool {
        self.failing.insert(uid.to_string())
    }

    /// `uid` verified or healed: a later failure is news again.
    pub fn pod_ok(&mut self, uid: &str) {
        self.failing.remove(uid);
    }

    /// Forgets pods that left the cache.
    pub fn retain(&mut self, cached: &HashSet<String>) {
        self.failing.retain(|uid| cached.contains(uid));
    }

    /// The probe-set reconcile failed; true when that is news.
    pub fn probe_set_failed(&mut self) -> bool {
        !std::mem::replace(&mut self.probe_set_failing, true)
    }

    pub fn probe_set_ok(&mut self) {
        self.probe_set_failing = false;
    }

    /// The host-rules check failed; true when that is news.
    pub fn host_failed(&mut self) -> bool {
        !std::mem::replace(&mut self.host_failing, true)
    }

    pub fn host_ok(&mut self) {
        self.host_failing = false;
    }
}

/// What one pass did (logged; read by the tests and the bench).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PassSummary {
    /// Pods whose netns was read and compared.
    pub verified: usize,
    /// ... of which had drifted and were re-applied.
    pub healed: usize,
    /// ... of which could not be programmed.
    pub failed: usize,
    /// Cached pods not checked: no netns known, gone from the store, or removed meanwhile.
    pub skipped: usize,
    /// Probe-set entries put back / pruned.
    pub probe_added: usize,
    pub probe_removed: usize,
    pub probe_failed: bool,
    /// The host rules were found different and re-applied / could not be checked.
    pub host_repaired: bool,
    pub host_failed: bool,
    pub took: Duration,
}

/// Runs a pass now, then one per `schedule` wait, until `stop`.
pub async fn run(engine: PodEngine, schedule: Periodic, stop: CancellationToken) {
    info!(
        period_s = schedule.period().as_secs(),
        "drift verification on"
    );
    let mut reported = Reported::default();
    loop {
        let s = pass(&engine, &mut reported, &stop).await;
        if stop.is_cancelled() {
            break;
        }
        info!(
            pods = s.verified,
            healed = s.healed,
            failed = s.failed,
            skipped = s.skipped,
            probe_added = s.probe_added,
            probe_removed = s.probe_removed,
            probe_failed = s.probe_failed,
            host_repaired = s.host_repaired,
            host_failed = s.host_failed,
            duration_ms = s.took.as_millis() as u64,
            "drift pass done"
        );
        tokio::select! {
            _ = stop.cancelled() => break,
            woken = schedule.wait() => debug!(?woken, "drift pass due"),
        }
    }
}

/// One pass over the cached pods, then the probe set. Each pod is verified as a run of its key
/// on the agent's engine: never beside other work on the same pod, with the engine's bound on
/// pods at once; the run also writes an annotation a `/podadd` still owes.
pub async fn pass(
    engine: &PodEngine,
    reported: &mut Reported,
    stop: &CancellationToken,
) -> PassSummary {
    let core = engine.reconciler();
    let started = Instant::now();
    let mut summary = PassSummary::default();
    let cached = core.mesh.cache.snapshot();
    let uids: HashSet<String> = cached.iter().map(|(uid, _)| uid.clone()).collect();
    reported.retain(&uids);
    core.status.retain(&uids);
    // One pod at a time, as a background check should: it never holds more than one of the
    // engine's slots, so a plugin's add is not queued behind a whole pass (and concurrent
    // netns reads measured several times the CPU of sequential ones, docs/benchmarks.md).
    for (uid, entry) in cached {
        if stop.is_cancelled() {
            return summary;
        }
        if entry.netns.is_none() {
            summary.skipped += 1;
            continue;
        }
        let key = pod_key(&entry.info.namespace, &entry.info.name);
        let waiting = engine.trigger_with_and_wait(key.clone(), Request::verify());
        let Ok(answer) = tokio::time::timeout(VERIFY_WAIT, waiting).await else {
            warn!(pod = %key, uid, "drift verify still running after {VERIFY_WAIT:?}; skipped this pass, the pass goes on");
            summary.skipped += 1;
            continue;
        };
        match answer {
            Ok(Ok(Reconciled::Verified { pod: p, verdict })) if pod::uid(&p) == uid => {
                summary.verified += 1;
                match &verdict {
                    DriftFinding::InPlace => {}
                    DriftFinding::Healed(_) => summary.healed += 1,
                    DriftFinding::Failed(_) => summary.failed += 1,
                }
                report_pod(core, reported, &p, &uid, verdict).await;
            }
            Ok(Err(e)) => {
                warn!(pod = %key, uid, "{e} (tried again next pass)");
                summary.skipped += 1;
            }
            // Gone, removed meanwhile, or another pod of the name now.
            _ => summary.skipped += 1,
        }
    }
    verify_probe_set(core, reported, &mut summary).await;
    summary.took = started.elapsed();
    summary
}

async fn report_pod(
    core: &Core,
    reported: &mut Reported,
    p: &Pod,
    uid: &str,
    verdict: DriftFinding,
) {
    let name = pod_key(pod::namespace(p), pod::name(p));
    core.status.pod_checked(uid, check_result(&verdict));
    match verdict {
        DriftFinding::InPlace => reported.pod_ok(uid),
        DriftFinding::Healed(outcome) => {
            reported.pod_ok(uid);
            warn!(pod = %name, uid, %outcome, "in-pod redirection rules had drifted from the expected ones; re-applied");
            core.metrics.drift(KIND_RULES, true);
            let message = format!(
                "in-pod traffic redirection rules differed from the expected ones and were re-applied ({outcome})"
            );
            post(core, p, EventType::Normal, REASON_RULES_REPAIRED, message).await;
        }
        DriftFinding::Failed(cause) => {
            if !reported.pod_failed(uid) {
                debug!(pod = %name, uid, "in-pod rules still cannot be verified: {cause}");
                return;
            }
            warn!(pod = %name, uid, "in-pod redirection rules could not be verified or re-applied (tried again every pass): {cause}");
            core.metrics.drift(KIND_RULES, false);
            let message = format!(
                "in-pod traffic redirection rules could not be verified or re-applied: {cause}"
            );
            post(core, p, EventType::Warning, REASON_UNHEALED, message).await;
        }
    }
}

/// What `/debug/pods` shows for a pod's verdict.
fn check_result(verdict: &DriftFinding) -> CheckResult {
    match verdict {
        DriftFinding::InPlace => CheckResult::InPlace,
        DriftFinding::Healed(outcome) => CheckResult::Repaired {
            what: format!("in-pod rules re-applied ({outcome})"),
        },
        DriftFinding::Failed(error) => CheckResult::Failed {
            error: error.clone(),
        },
    }
}

/// The host rules first (the SNAT rule names the sets, so a recreated set is filled by the sync
/// right after), then the probe set reconciled with the cache's recorded entries under the probe
/// gate, so no add or remove is half done. The gate covers only the sync (netlink reads and
/// writes, no process); the host check runs its tools outside it.
async fn verify_probe_set(core: &Core, reported: &mut Reported, summary: &mut PassSummary) {
    let host = on_pool(core, |dp| dp.verify_host()).await;
    report_host(core, reported, summary, host);
    let result = {
        let _exclusive = core.mesh.probe_gate.lock().await;
        let (members, prune) = core.mesh.cache.probe_members();
        let synced = on_pool(core, move |dp| dp.probe_sync(&members, prune)).await;
        if synced.is_ok() {
            core.mesh.cache.probe_set_synced(prune);
        }
        synced
    };
    let synced = match result {
        Ok(synced) => synced,
        Err(e) => {
            summary.probe_failed = true;
            if reported.probe_set_failed() {
                warn!("verifying the host probe set failed (tried again next pass): {e}");
                core.metrics.drift(KIND_PROBE_SET, false);
            }
            return;
        }
    };
    reported.probe_set_ok();
    summary.probe_added = synced.added.len();
    summary.probe_removed = synced.removed.len();
    if synced.is_empty() {
        return;
    }
    for _ in 0..synced.added.len() + synced.removed.len() {
        core.metrics.drift(KIND_PROBE_SET, true);
    }
    for ip in &synced.removed {
        warn!(%ip, "host probe set held an entry of no enrolled pod; removed");
    }
    let cached: HashMap<String, _> = core.mesh.cache.snapshot().into_iter().collect();
    for (uid, ips) in by_pod(&synced) {
        let p = cached
            .get(&uid)
            .and_then(|c| core.pods.get(&pod_key(&c.info.namespace, &c.info.name)))
            .filter(|p| pod::uid(p) == uid);
        let ips = ips.join(", ");
        warn!(
            uid,
            ips, "host probe set lacked the pod's entries; put back"
        );
        if let Some(p) = p {
            let message = format!(
                "the host probe set lacked this pod's entries ({ips}): kubelet probes would not reach it; put back"
            );
            post(core, &p, EventType::Normal, REASON_PROBE_REPAIRED, message).await;
        }
    }
}

/// A host check that failed: the data plane's own error, or the blocking task running it died.
#[derive(Debug, thiserror::Error)]
enum HostCheckError {
    #[error(transparent)]
    Dataplane(#[from] DataplaneError),
    #[error("data-plane task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Runs a host check on the blocking pool.
async fn on_pool<T: Send + 'static>(
    core: &Core,
    work: impl FnOnce(&dyn DataplanePort) -> Result<T, DataplaneError> + Send + 'static,
) -> Result<T, HostCheckError> {
    let dp = core.mesh.dataplane.clone();
    Ok(tokio::task::spawn_blocking(move || work(dp.as_ref())).await??)
}

fn report_host(
    core: &Core,
    reported: &mut Reported,
    summary: &mut PassSummary,
    result: Result<Option<String>, HostCheckError>,
) {
    match result {
        Ok(None) => {
            reported.host_ok();
            core.status.host_checked(CheckResult::InPlace);
        }
        Ok(Some(what)) => {
            reported.host_ok();
            summary.host_repaired = true;
            warn!(repaired = %what, "host probe SNAT rules had drifted from the expected ones (kubelet probes would not reach ambient pods); re-applied");
            core.metrics.drift(KIND_HOST_RULES, true);
            core.status.host_checked(CheckResult::Repaired { what });
        }
        Err(e) => {
            summary.host_failed = true;
            if reported.host_failed() {
                warn!("verifying the host probe SNAT rules failed (tried again next pass): {e}");
                core.metrics.drift(KIND_HOST_RULES, false);
            }
            core.status.host_checked(CheckResult::Failed {
                error: e.to_string(),
            });
        }
    }
}

/// The entries put back, grouped by pod.
fn by_pod(synced: &ProbeSynced) -> BTreeMap<String, Vec<String>> {
    let mut pods: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (uid, ip) in &synced.added {
        pods.entry(uid.clone()).or_default().push(ip.to_string());
    }
    pods
}

/// Records an event on the pod; a failure is logged only (the log line and metric stand).
async fn post(core: &Core, p: &Pod, event_type: EventType, reason: &str, message: String) {
    let event = EventRecord {
        event_type,
        reason: reason.to_string(),
        message,
        component: super::ports::EVENT_COMPONENT.to_string(),
    };
    if let Err(e) = core.mesh.annotator.event(p, event).await {
        warn!(pod = %pod_key(pod::namespace(p), pod::name(p)), reason, "recording the event failed: {e}");
    }
}

#[cfg(test)]
#[path = "drift_tests.rs"]
mod tests;
