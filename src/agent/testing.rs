//! Fakes of the agent's seams, for its unit tests and the `tests/agent_*` integration tests
//! (test-only: compiled with `cfg(test)` or the `test-hooks` feature). They record every call and
//! fail on request; netns handles are the test process's own namespace (nothing is programmed).

use parking_lot::{Mutex, MutexGuard};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::Notify;

use super::ports::{
    Annotator, DataplaneError, DataplanePort, KubeFuture, PodNet, PodWorkload, PortFuture,
    ProbeSynced, RuleChange, ZdsError, Ztunnel,
};
use crate::apply::ambient::AmbientError;
use crate::apply::iptables::ApplyError;
use crate::apply::probe_set::ProbeSetError;
use crate::kube::EventRecord;
use crate::netns::reserved::Reserved;
use crate::netns::{Netns, NetnsId};

/// A tool run that failed, as the data plane reports it.
fn tool_failed(stderr: &str) -> ApplyError {
    ApplyError::Failed {
        command: "iptables-restore".into(),
        code: Some(2),
        stderr: stderr.into(),
    }
}

/// The data plane's error for a pod whose in-pod rules failed (the agent does not retry it).
pub fn inpod_failure(pod: &str, stderr: &str) -> DataplaneError {
    DataplaneError::Inpod {
        pod: pod.into(),
        source: AmbientError::Apply(tool_failed(stderr)),
    }
}

/// The data plane's error for a host probe-set call that failed (the agent retries it).
pub fn probe_set_failure(what: &str) -> DataplaneError {
    DataplaneError::ProbeSet {
        what: what.into(),
        source: ProbeSetError::Netlink(crate::netlink::nft_batch::BatchError::Unanswered),
    }
}

/// The data plane's error for host probe SNAT rules that could not be checked (retried).
pub fn host_rules_failure(stderr: &str) -> DataplaneError {
    DataplaneError::HostRules(AmbientError::Apply(tool_failed(stderr)))
}

/// A data plane that only records. `open_netns` opens the path when it exists (else hands out the
/// test's own netns); `reserved` is what it calls the agent's and the node's netns (none unless
/// set), `addresses` what every netns holds (unset: exactly the IPs the pod is offered with),
/// `netns_gone` makes every cached netns count as gone. `fail_program` makes in-pod programming fail (non-retryable);
/// `probe_failures` makes that many probe-set calls fail; `find_netns` finds every wanted pod
/// unless `netns_missing`. A pod's first program writes (`Applied`), later ones find the rules in
/// place (`AlreadyApplied`) unless its UID was put in `drifted` (its rules "changed" since).
#[derive(Default)]
pub struct FakeDataplane {
    pub calls: Mutex<Vec<String>>,
    /// Probe set: IP -> owner UID.
    pub probes: Mutex<BTreeMap<IpAddr, String>>,
    pub fail_program: AtomicBool,
    pub reserved: Mutex<Vec<(String, NetnsId)>>,
    /// Set: the reserved namespaces "could not be identified" (every netns refused, this why).
    pub reserved_unidentified: Mutex<Option<String>>,
    pub addresses: Mutex<Option<Vec<IpAddr>>>,
    pub netns_gone: AtomicBool,
    pub netns_missing: AtomicBool,
    pub probe_failures: AtomicU32,
    /// UIDs programmed at least once.
    pub programmed: Mutex<BTreeSet<String>>,
    /// UIDs whose rules drifted: their next program re-applies.
    pub drifted: Mutex<BTreeSet<String>>,
    /// The host rules' drift: the next host check reports (and so repairs) it.
    pub host_drift: Mutex<Option<String>>,
    /// Host checks fail while this lasts.
    pub host_failures: AtomicU32,
}

impl FakeDataplane {
    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().clone()
    }

    pub fn count(&self, prefix: &str) -> usize {
        self.calls
            .lock()
            .iter()
            .filter(|c| c.starts_with(prefix))
            .count()
    }

    fn record(&self, call: String) {
        self.calls.lock().push(call);
    }

    /// Records a probe-set call; fails it while `probe_failures` lasts, else hands out the set.
    fn probe_call(
        &self,
        call: String,
    ) -> Result<MutexGuard<'_, BTreeMap<IpAddr, String>>, DataplaneError> {
        self.record(call);
        let left = self.probe_failures.load(Ordering::SeqCst);
        if left > 0 {
            self.probe_failures.store(left - 1, Ordering::SeqCst);
            return Err(probe_set_failure("injected probe-set failure"));
        }
        Ok(self.probes.lock())
    }
}

impl DataplanePort for FakeDataplane {
    fn open_netns(&self, path: &str) -> Result<Netns, DataplaneError> {
        self.record(format!("open {path}"));
        let opened = match std::path::Path::new(path) {
            named if named.exists() => Netns::open(named),
            _ => Netns::current(),
        };
        opened.map_err(|source| DataplaneError::OpenNetns {
            path: path.into(),
            source,
        })
    }

    fn reserved_netns(&self) -> Reserved {
        let unidentified = self.reserved_unidentified.lock().clone();
        Reserved::new(
            std::path::Path::new("/proc"),
            self.reserved.lock().clone(),
            unidentified,
        )
    }

    fn netns_addresses(&self, _netns: &Netns, pod: &PodNet) -> Result<Vec<IpAddr>, DataplaneError> {
        self.record(format!("addresses {}", pod.uid));
        let mut held = vec!["127.0.0.1".parse().expect("loopback")];
        held.extend(
            self.addresses
                .lock()
                .clone()
                .unwrap_or_else(|| pod.ips.clone()),
        );
        Ok(held)
    }

    fn netns_alive(&self, _netns: &Netns) -> bool {
        !self.netns_gone.load(Ordering::SeqCst)
    }

    fn find_netns(&self, wanted: &HashMap<String, Vec<IpAddr>>) -> HashMap<String, Netns> {
        let mut uids: Vec<&String> = wanted.keys().collect();
        uids.sort();
        self.record(format!("find {uids:?}"));
        if self.netns_missing.load(Ordering::SeqCst) {
            return HashMap::new();
        }
        wanted
            .keys()
            .filter_map(|uid| Some((uid.clone(), Netns::current().ok()?)))
            .collect()
    }

    fn program_pod(&self, _netns: &Netns, pod: &PodNet) -> Result<RuleChange, DataplaneError> {
        self.record(format!("program {}", pod.uid));
        if self.fail_program.load(Ordering::SeqCst) {
            return Err(inpod_failure(
                &pod.uid,
                "injected in-pod programming failure",
            ));
        }
        let first = self.programmed.lock().insert(pod.uid.clone());
        let drifted = self.drifted.lock().remove(&pod.uid);
        Ok(if first || drifted {
            RuleChange::Applied
        } else {
            RuleChange::AlreadyApplied
        })
    }

    fn unprogram_pod(&self, _netns: &Netns, pod: &PodNet) -> Result<(), DataplaneError> {
        self.record(format!("unprogram {}", pod.uid));
        Ok(())
    }

    fn probe_add(
        &self,
        uid: &str,
        ips: &[IpAddr],
        _believed: Option<&super::ports::ProbeEntries>,
    ) -> Result<(), DataplaneError> {
        let mut probes = self.probe_call(format!("probe_add {uid}"))?;
        for ip in ips {
            probes.insert(*ip, uid.to_string());
        }
        Ok(())
    }

    fn probe_remove(
        &self,
        uid: &str,
        ips: &[IpAddr],
        _believed: Option<&super::ports::ProbeEntries>,
    ) -> Result<(), DataplaneError> {
        let mut probes = self.probe_call(format!("probe_remove {uid}"))?;
        for ip in ips {
            if probes.get(ip).is_some_and(|owner| owner == uid) {
                probes.remove(ip);
            }
        }
        Ok(())
    }

    fn probe_sync(
        &self,
        members: &[(String, Vec<IpAddr>)],
        prune: bool,
    ) -> Result<ProbeSynced, DataplaneError> {
        let mut probes = self.probe_call(format!("probe_sync {} prune={prune}", members.len()))?;
        let mut report = ProbeSynced::default();
        let wanted: BTreeMap<IpAddr, &String> = members
            .iter()
            .flat_map(|(uid, ips)| ips.iter().map(move |ip| (*ip, uid)))
            .collect();
        if prune {
            probes.retain(|ip, _| {
                let keep = wanted.contains_key(ip);
                if !keep {
                    report.removed.push(*ip);
                }
                keep
            });
        }
        for (ip, uid) in wanted {
            if probes.get(&ip) != Some(uid) {
                probes.insert(ip, uid.clone());
                report.added.push((uid.clone(), ip));
            }
        }
        Ok(report)
    }

    fn verify_host(&self) -> Result<Option<String>, DataplaneError> {
        self.record("verify_host".to_string());
        let left = self.host_failures.load(Ordering::SeqCst);
        if left > 0 {
            self.host_failures.store(left - 1, Ordering::SeqCst);
            return Err(host_rules_failure("injected host-rules failure"));
        }
        Ok(self.host_drift.lock().take())
    }
}

/// A ztunnel that acks, or (with `connected` false) has no connection (retryable). Adds of a pod
/// named in `gates` wait until its `Notify` is notified (a slow ztunnel for that pod).
pub struct FakeZtunnel {
    pub connected: AtomicBool,
    pub workloads: Mutex<BTreeMap<String, PodWorkload>>,
    pub adds: AtomicU32,
    pub dels: AtomicU32,
    pub gates: Mutex<BTreeMap<String, Arc<Notify>>>,
}

impl Default for FakeZtunnel {
    fn default() -> Self {
        FakeZtunnel {
            connected: AtomicBool::new(true),
            workloads: Mutex::new(BTreeMap::new()),
            adds: AtomicU32::new(0),
            dels: AtomicU32::new(0),
            gates: Mutex::new(BTreeMap::new()),
        }
    }
}

impl FakeZtunnel {
    pub fn has(&self, uid: &str) -> bool {
        self.workloads.lock().contains_key(uid)
    }

    /// Holds adds of the pod named `name` until the returned gate is notified.
    pub fn gate(&self, name: &str) -> Arc<Notify> {
        let gate = Arc::new(Notify::new());
        self.gates.lock().insert(name.to_string(), gate.clone());
        gate
    }
}

impl Ztunnel for FakeZtunnel {
    fn add_workload(&self, uid: String, info: PodWorkload, _netns: Arc<Netns>) -> PortFuture<'_> {
        Box::pin(async move {
            let gate = self.gates.lock().get(&info.name).cloned();
            if let Some(gate) = gate {
                gate.notified().await;
            }
            self.adds.fetch_add(1, Ordering::SeqCst);
            if !self.connected.load(Ordering::SeqCst) {
                return Err(ZdsError::NoConnection);
            }
            self.workloads.lock().insert(uid, info);
            Ok(())
        })
    }

    fn del_workload<'a>(&'a self, uid: &'a str) -> PortFuture<'a> {
        Box::pin(async move {
            self.dels.fetch_add(1, Ordering::SeqCst);
            self.workloads.lock().remove(uid);
            Ok(())
        })
    }
}

/// Records the redirection annotation per `namespace/name`, and events as
/// (`namespace/name`, event).
#[derive(Default)]
pub struct FakeAnnotator {
    /// This many annotation patches fail (503) before they succeed again.
    pub failures: AtomicU32,
    /// Set: annotation patches never return (a run writing one never ends).
    pub hang: AtomicBool,
    pub values: Mutex<BTreeMap<String, String>>,
    pub patches: Mutex<Vec<(String, Option<String>)>>,
    pub events: Mutex<Vec<(String, EventRecord)>>,
}

impl FakeAnnotator {
    pub fn value(&self, key: &str) -> Option<String> {
        self.values.lock().get(key).cloned()
    }

    pub fn patches(&self) -> Vec<(String, Option<String>)> {
        self.patches.lock().clone()
    }

    pub fn events(&self) -> Vec<(String, EventRecord)> {
        self.events.lock().clone()
    }
}

impl Annotator for FakeAnnotator {
    fn set_redirection<'a>(&'a self, pod: &'a Pod, value: Option<&'a str>) -> KubeFuture<'a> {
        Box::pin(async move {
            if self.hang.load(Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            let key = format!("{}/{}", super::pod::namespace(pod), super::pod::name(pod));
            let left = self.failures.load(Ordering::SeqCst);
            if left > 0 {
                self.failures.store(left - 1, Ordering::SeqCst);
                return Err(crate::kube::KubeError::Api {
                    call: crate::kube::Call::PatchPodStatus,
                    object: key,
                    code: 503,
                    reason: "ServiceUnavailable".into(),
                    message: "injected annotation failure".into(),
                });
            }
            self.patches
                .lock()
                .push((key.clone(), value.map(str::to_string)));
            let mut values = self.values.lock();
            match value {
                Some(v) => values.insert(key, v.to_string()),
                None => values.remove(&key),
            };
            Ok(())
        })
    }

    fn event<'a>(&'a self, pod: &'a Pod, event: EventRecord) -> KubeFuture<'a> {
        Box::pin(async move {
            let key = format!("{}/{}", super::pod::namespace(pod), super::pod::name(pod));
            self.events.lock().push((key, event));
            Ok(())
        })
    }
}
