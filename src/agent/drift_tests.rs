//! The drift pass with fake seams: what counts as a heal, report-once failures, a pod removed
//! before its check,
//! the probe-set reconcile and its prune rule, the schedule.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::Event;
use serde_json::json;

use super::*;
use crate::agent::cache::PodCache;
use crate::agent::findings::judge;
use crate::agent::machine::EnrolmentPolicy;
use crate::agent::mesh::Mesh;
use crate::agent::ports::RuleChange;
use crate::agent::reconciler::{self, Core};
use crate::agent::settings::AgentTiming;
use crate::agent::status::CheckResult;
use crate::agent::testing::{FakeAnnotator, FakeDataplane, FakeZtunnel, inpod_failure};
use crate::kube::stores::{NamespaceStore, PodStore};
use crate::netns::Netns;
use crate::retry::periodic::Kick;
use crate::telemetry::metrics::DriftLabel;

struct Rig {
    engine: PodEngine,
    core: Arc<Core>,
    dp: Arc<FakeDataplane>,
    ann: Arc<FakeAnnotator>,
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn pod(name: &str, ip: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                     "annotations": {"ambient.istio.io/redirection": "enabled"}},
        "spec": {"containers": [{"name": "app"}]},
        "status": {"phase": "Running", "podIPs": [{"ip": ip}]}
    }))
    .unwrap()
}

/// Pods `a` (10.0.0.1) and `b` (10.0.0.2) enrolled: in the store, cached with a netns and their
/// probe entries, programmed once, their IPs in the probe set.
fn rig() -> Rig {
    let dp = Arc::new(FakeDataplane::default());
    let ann = Arc::new(FakeAnnotator::default());
    let core = Arc::new(Core {
        pods: PodStore::new(),
        namespaces: NamespaceStore::new(),
        policy: EnrolmentPolicy::new(
            &crate::kube::selector::testing::chart_default(),
            &[],
            "istio-system",
        )
        .unwrap(),
        mesh: Mesh {
            dataplane: dp.clone(),
            ztunnel: Arc::new(FakeZtunnel::default()),
            annotator: ann.clone(),
            cache: Arc::new(PodCache::default()),
            probe_gate: Default::default(),
        },
        timing: AgentTiming::default(),
        metrics: Default::default(),
        status: Default::default(),
    });
    core.pods.apply(Event::Init);
    core.pods.apply(Event::InitDone);
    core.namespaces.apply(Event::Init);
    core.namespaces.apply(Event::InitApply(
        serde_json::from_value(json!({"metadata": {"name": "ns",
            "labels": {"istio.io/dataplane-mode": "ambient"}}}))
        .unwrap(),
    ));
    core.namespaces.apply(Event::InitDone);
    for (name, addr) in [("a", "10.0.0.1"), ("b", "10.0.0.2")] {
        let p = pod(name, addr);
        let uid = pod::uid(&p).to_string();
        core.mesh
            .cache
            .upsert(&uid, pod::workload_info(&p), Netns::current().unwrap());
        core.mesh.cache.set_probe_ips(&uid, Some(vec![ip(addr)]));
        dp.programmed.lock().insert(uid.clone());
        dp.probes.lock().insert(ip(addr), uid);
        core.pods.apply(Event::Apply(p));
    }
    let engine = reconciler::engine(core.clone(), CancellationToken::new());
    Rig {
        engine,
        core,
        dp,
        ann,
    }
}

impl Rig {
    async fn pass(&self, reported: &mut Reported) -> PassSummary {
        pass(&self.engine, reported, &CancellationToken::new()).await
    }

    fn counted(&self, healed: bool, kind: &str) -> u64 {
        let family = if healed {
            &self.core.metrics.drift_repaired
        } else {
            &self.core.metrics.drift_unhealed
        };
        family
            .get_or_create(&DriftLabel { kind: kind.into() })
            .get()
    }

    fn events(&self) -> Vec<(String, EventType, String)> {
        self.ann
            .events()
            .into_iter()
            .map(|(pod, e)| (pod, e.event_type, e.reason))
            .collect()
    }
}

#[test]
fn only_a_write_is_a_heal() {
    use RuleChange::*;
    assert_eq!(judge(&Ok(AlreadyApplied)), DriftFinding::InPlace);
    for written in [Applied, AppliedOverNetlink, Reconciled] {
        assert_eq!(judge(&Ok(written.clone())), DriftFinding::Healed(written));
    }
    let failed = judge(&Err(inpod_failure("ns/p", "line 3 failed")));
    assert_eq!(
        failed,
        DriftFinding::Failed(
            "in-pod rules of pod ns/p: iptables-restore failed (exit 2): line 3 failed".into()
        )
    );
}

#[test]
fn failures_are_reported_once_per_streak() {
    let mut r = Reported::default();
    assert!(r.pod_failed("u"));
    assert!(!r.pod_failed("u"), "the same streak again");
    r.pod_ok("u");
    assert!(r.pod_failed("u"), "a new streak after a heal");
    r.retain(&HashSet::new());
    assert!(r.pod_failed("u"), "a pod that left and came back");
    assert!(r.probe_set_failed());
    assert!(!r.probe_set_failed());
    r.probe_set_ok();
    assert!(r.probe_set_failed());
}

#[tokio::test]
async fn untouched_pods_are_verified_and_a_drifted_one_is_healed_with_an_event_and_a_count() {
    let r = rig();
    let mut reported = Reported::default();
    let s = r.pass(&mut reported).await;
    assert_eq!((s.verified, s.healed, s.failed, s.skipped), (2, 0, 0, 0));
    assert_eq!((s.probe_added, s.probe_removed), (0, 0));
    assert!(
        r.ann.events().is_empty(),
        "nothing drifted, nothing reported"
    );
    assert_eq!(r.counted(true, KIND_RULES), 0);
    assert_eq!(r.dp.count("probe_sync 2 prune=true"), 1);

    r.dp.drifted.lock().insert("uid-a".into());
    let s = r.pass(&mut reported).await;
    assert_eq!((s.verified, s.healed), (2, 1));
    assert_eq!(r.counted(true, KIND_RULES), 1);
    assert_eq!(
        r.events(),
        [(
            "ns/a".to_string(),
            EventType::Normal,
            REASON_RULES_REPAIRED.to_string()
        )]
    );
    let (_, event) = &r.ann.events()[0];
    assert!(event.message.contains("re-applied (applied)"), "{event:?}");
    assert_eq!(event.component, "istio-cni-node");
    let s = r.pass(&mut reported).await;
    assert_eq!(s.healed, 0, "healed stays healed");
}

#[tokio::test]
async fn a_pod_that_cannot_be_healed_is_retried_every_pass_but_reported_once() {
    let r = rig();
    let mut reported = Reported::default();
    r.dp.fail_program.store(true, Ordering::SeqCst);
    for _ in 0..3 {
        let s = r.pass(&mut reported).await;
        assert_eq!((s.verified, s.failed), (2, 2));
    }
    assert_eq!(r.dp.count("program uid-a"), 3, "tried each pass");
    assert_eq!(r.counted(false, KIND_RULES), 2, "one per pod, not per pass");
    let warnings = r
        .events()
        .into_iter()
        .filter(|(_, t, reason)| *t == EventType::Warning && reason == REASON_UNHEALED)
        .count();
    assert_eq!(warnings, 2);
    // Healed, then failing again: news again.
    r.dp.fail_program.store(false, Ordering::SeqCst);
    assert_eq!(r.pass(&mut reported).await.failed, 0);
    r.dp.fail_program.store(true, Ordering::SeqCst);
    r.pass(&mut reported).await;
    assert_eq!(r.counted(false, KIND_RULES), 4);
}

/// A pod whose run never ends does not hold the pass: the pass waits for its verify as long as
/// `VERIFY_WAIT`, counts it skipped and checks the other pod and the probe set.
#[tokio::test(start_paused = true)]
async fn a_verify_that_never_ends_holds_the_pass_no_longer_than_its_wait() {
    let r = rig();
    // a's run verifies, then writes the annotation it owes: a patch that never returns.
    r.core.mesh.cache.set_annotation_owed("uid-a", true);
    r.ann.hang.store(true, Ordering::SeqCst);
    let started = tokio::time::Instant::now();
    let mut reported = Reported::default();
    let s = tokio::time::timeout(10 * VERIFY_WAIT, r.pass(&mut reported))
        .await
        .expect("the pass waited for the stuck pod without end");
    let took = started.elapsed();
    assert_eq!((s.verified, s.skipped), (1, 1), "{s:?}");
    assert!(took >= VERIFY_WAIT && took < 2 * VERIFY_WAIT, "{took:?}");
    assert_eq!(r.dp.count("program uid-b"), 1, "the other pod was checked");
    assert_eq!(r.dp.count("probe_sync"), 1, "the probe set was checked");
}

#[tokio::test]
async fn pods_without_a_netns_or_gone_from_the_store_are_skipped() {
    let r = rig();
    let c = pod("c", "10.0.0.3");
    r.core.mesh.cache.ensure("uid-c", pod::workload_info(&c));
    // In the store under b's name but another UID: b was deleted and recreated.
    let mut b2 = pod("b", "10.0.0.2");
    b2.metadata.uid = Some("uid-b2".into());
    r.core.pods.apply(Event::Apply(b2));
    let s = r.pass(&mut Reported::default()).await;
    assert_eq!((s.verified, s.skipped), (1, 2));
    assert_eq!(r.dp.count("program"), 1);
}

#[tokio::test]
async fn a_pod_deleted_before_its_check_is_removed_not_programmed() {
    let r = rig();
    // The store's delete of a, not yet looked at: the pass's run of a's key sees it gone.
    let gone = r.core.pods.get("ns/a").unwrap();
    r.core.pods.apply(Event::Delete((*gone).clone()));
    r.engine.trigger_with("ns/a".into(), Request::gone(gone));
    let s = r.pass(&mut Reported::default()).await;
    assert_eq!(
        r.dp.count("program uid-a"),
        0,
        "a removed pod was programmed"
    );
    assert!(!r.core.mesh.cache.contains("uid-a"));
    assert_eq!((s.verified, s.skipped), (1, 1));
}

#[tokio::test]
async fn a_missing_probe_entry_is_put_back_and_a_stranger_pruned() {
    let r = rig();
    {
        let mut probes = r.dp.probes.lock();
        probes.remove(&ip("10.0.0.1"));
        probes.insert(ip("10.0.0.99"), "uid-gone".into());
    }
    let s = r.pass(&mut Reported::default()).await;
    assert_eq!((s.probe_added, s.probe_removed), (1, 1));
    assert_eq!(r.counted(true, KIND_PROBE_SET), 2);
    assert_eq!(
        r.events(),
        [(
            "ns/a".to_string(),
            EventType::Normal,
            REASON_PROBE_REPAIRED.to_string()
        )]
    );
    let probes = r.dp.probes.lock().clone();
    assert_eq!(
        probes.get(&ip("10.0.0.1")).map(String::as_str),
        Some("uid-a")
    );
    assert!(!probes.contains_key(&ip("10.0.0.99")));
}

#[tokio::test]
async fn no_pruning_while_a_pods_entries_are_unknown() {
    let r = rig();
    r.core.mesh.cache.ensure("uid-c", Default::default());
    r.core.mesh.cache.set_probe_ips("uid-c", None);
    r.dp.probes.lock().insert(ip("10.0.0.3"), "uid-c".into());
    let s = r.pass(&mut Reported::default()).await;
    assert_eq!(s.probe_removed, 0);
    assert_eq!(r.dp.count("probe_sync 2 prune=false"), 1);
    assert!(r.dp.probes.lock().contains_key(&ip("10.0.0.3")));
}

#[tokio::test]
async fn a_failing_probe_set_is_reported_once() {
    let r = rig();
    let mut reported = Reported::default();
    r.dp.probe_failures.store(2, Ordering::SeqCst);
    assert!(r.pass(&mut reported).await.probe_failed);
    assert!(r.pass(&mut reported).await.probe_failed);
    assert_eq!(r.counted(false, KIND_PROBE_SET), 1);
    assert!(!r.pass(&mut reported).await.probe_failed);
}

#[tokio::test]
async fn the_first_pass_runs_at_once_then_on_a_kick_until_stopped() {
    let r = rig();
    let kick = Kick::new();
    let stop = CancellationToken::new();
    let schedule = Periodic::new(Duration::from_secs(3600), kick.clone());
    let task = tokio::spawn(run(r.engine.clone(), schedule, stop.clone()));
    let passes = || r.dp.count("probe_sync");
    let wait_for = |n: usize| async move {
        for _ in 0..200 {
            if passes() >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("{n} passes did not run ({} ran)", passes());
    };
    wait_for(1).await;
    kick.kick();
    wait_for(2).await;
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("stopped")
        .unwrap();
    assert_eq!(passes(), 2, "only the timer (an hour) could start another");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_reconcile_waits_for_an_add_half_done_and_keeps_its_entry() {
    let r = rig();
    // An add between its probe-set write and its record in the cache (holding the gate).
    let gate = r.core.mesh.probe_gate.lock().await;
    r.core.mesh.cache.ensure("uid-c", Default::default());
    r.dp.probes.lock().insert(ip("10.0.0.3"), "uid-c".into());
    let engine = r.engine.clone();
    let running = tokio::spawn(async move {
        pass(&engine, &mut Reported::default(), &CancellationToken::new()).await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        r.dp.count("probe_sync"),
        0,
        "reconciled under a half-done add"
    );
    r.core
        .mesh
        .cache
        .set_probe_ips("uid-c", Some(vec![ip("10.0.0.3")]));
    drop(gate);
    let s = running.await.unwrap();
    assert_eq!((s.probe_added, s.probe_removed), (0, 0));
    assert!(r.dp.probes.lock().contains_key(&ip("10.0.0.3")));
}

#[tokio::test]
async fn drifted_host_rules_are_repaired_counted_and_shown_before_the_probe_sync() {
    let r = rig();
    let mut reported = Reported::default();
    let s = r.pass(&mut reported).await;
    assert!(!s.host_repaired && !s.host_failed);
    assert_eq!(r.counted(true, KIND_HOST_RULES), 0);
    assert_eq!(
        r.core.status.host().map(|c| c.result),
        Some(CheckResult::InPlace)
    );
    *r.dp.host_drift.lock() = Some("ipset istio-inpod-probes-v4 missing".into());
    let s = r.pass(&mut reported).await;
    assert!(s.host_repaired);
    assert_eq!(r.counted(true, KIND_HOST_RULES), 1);
    assert_eq!(
        r.core.status.host().map(|c| c.result),
        Some(CheckResult::Repaired {
            what: "ipset istio-inpod-probes-v4 missing".into()
        })
    );
    // The host check comes before the sync that refills a recreated set.
    let calls = r.dp.calls();
    let host = calls.iter().rposition(|c| c == "verify_host").unwrap();
    let sync = calls
        .iter()
        .rposition(|c| c.starts_with("probe_sync"))
        .unwrap();
    assert!(host < sync, "{calls:?}");
    assert!(!r.pass(&mut reported).await.host_repaired, "healed once");
    assert_eq!(r.counted(true, KIND_HOST_RULES), 1);
}

#[tokio::test]
async fn a_failing_host_check_is_reported_once_and_each_pods_check_is_recorded() {
    let r = rig();
    let mut reported = Reported::default();
    r.dp.host_failures.store(2, Ordering::SeqCst);
    assert!(r.pass(&mut reported).await.host_failed);
    assert!(r.pass(&mut reported).await.host_failed);
    assert_eq!(r.counted(false, KIND_HOST_RULES), 1);
    assert!(matches!(
        r.core.status.host().map(|c| c.result),
        Some(CheckResult::Failed { .. })
    ));
    r.dp.drifted.lock().insert("uid-a".into());
    assert!(!r.pass(&mut reported).await.host_failed);
    assert!(matches!(
        r.core.status.pod("uid-a").map(|c| c.result),
        Some(CheckResult::Repaired { .. })
    ));
    assert_eq!(
        r.core.status.pod("uid-b").map(|c| c.result),
        Some(CheckResult::InPlace)
    );
    let answer = crate::agent::status::debug_pods(&r.core);
    let json = serde_json::to_value(&answer).unwrap();
    assert_eq!(json["version"], 1);
    assert_eq!(json["host_rules"]["result"], "in_place");
    let pods = json["pods"].as_array().unwrap();
    assert_eq!(pods.len(), 2);
    assert_eq!(pods[0]["name"], "a");
    assert_eq!(pods[0]["uid"], "uid-a");
    assert_eq!(pods[0]["ips"], json!(["10.0.0.1"]));
    assert_eq!(pods[0]["last_verified"]["result"], "repaired");
    assert_eq!(pods[1]["last_verified"]["result"], "in_place");
    assert!(pods[0]["netns"]["inode"].as_u64().unwrap() > 0);
    assert!(pods[0]["zds"].is_null());
}

#[tokio::test]
async fn an_owed_annotation_is_written_by_the_pass_and_only_once() {
    let r = rig();
    r.core.mesh.cache.set_annotation_owed("uid-a", true);
    // Its background retries failed for good: the pass writes it.
    let mut reported = Reported::default();
    r.pass(&mut reported).await;
    assert_eq!(
        r.ann.patches(),
        vec![("ns/a".to_string(), Some("enabled".to_string()))]
    );
    assert!(!r.core.mesh.cache.annotation_owed("uid-a"));
    r.pass(&mut reported).await;
    assert_eq!(r.ann.patches().len(), 1, "nothing owed any more");

    // A patch that fails stays owed for the next pass.
    r.core.mesh.cache.set_annotation_owed("uid-b", true);
    r.ann.failures.store(1, Ordering::SeqCst);
    r.pass(&mut reported).await;
    assert!(r.core.mesh.cache.annotation_owed("uid-b"));
    r.pass(&mut reported).await;
    assert!(!r.core.mesh.cache.annotation_owed("uid-b"));
    assert_eq!(r.ann.value("ns/b").as_deref(), Some("enabled"));
}
