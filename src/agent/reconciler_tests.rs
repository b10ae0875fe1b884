//! The agent's reconcile over the engine with fake seams: error classes, backoff, one pod at a
//! time and pods side by side, the namespace wait, level-based decisions (a recreated pod, an
//! owed annotation).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::runtime::watcher::Event;
use serde_json::json;

use super::*;
use crate::agent::cache::PodCache;
use crate::agent::ports::{DataplaneError, DataplanePort};
use crate::agent::settings::AgentTiming;
use crate::agent::testing::{FakeAnnotator, FakeDataplane, FakeZtunnel};
use crate::kube::RetryPolicy;
use crate::kube::selector::enablement::EnablementSelector;
use crate::netns::Netns;

struct Rig {
    engine: PodEngine,
    dp: Arc<FakeDataplane>,
    zt: Arc<FakeZtunnel>,
    ann: Arc<FakeAnnotator>,
    _stop: tokio_util::sync::DropGuard,
}

fn selectors() -> Vec<EnablementSelector> {
    serde_json::from_value(json!([
        {"podSelector": {"matchExpressions": [{"key": "istio.io/dataplane-mode", "operator": "NotIn", "values": ["none"]}]},
         "namespaceSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}}}
    ]))
    .unwrap()
}

fn timing() -> AgentTiming {
    AgentTiming {
        retry: RetryPolicy {
            first: Duration::from_millis(2),
            max: Duration::from_millis(20),
            max_attempts: None,
        },
        ..AgentTiming::default()
    }
}

fn rig() -> Rig {
    let dp = Arc::new(FakeDataplane::default());
    rig_with(dp.clone(), dp, timing())
}

/// A rig programming through `dataplane` (`dp`: the fake it records into).
fn rig_with(dataplane: Arc<dyn DataplanePort>, dp: Arc<FakeDataplane>, timing: AgentTiming) -> Rig {
    let zt = Arc::new(FakeZtunnel::default());
    let ann = Arc::new(FakeAnnotator::default());
    let core = Arc::new(Core {
        pods: PodStore::new(),
        namespaces: NamespaceStore::new(),
        policy: EnrolmentPolicy::new(&selectors(), &[], "istio-system").unwrap(),
        mesh: Mesh {
            dataplane,
            ztunnel: zt.clone(),
            annotator: ann.clone(),
            cache: Arc::new(PodCache::default()),
            probe_gate: Default::default(),
        },
        timing,
        metrics: Default::default(),
        status: Default::default(),
    });
    let stop = CancellationToken::new();
    let engine = engine(core, stop.clone());
    engine.reconciler().pods.apply(Event::Init);
    engine.reconciler().pods.apply(Event::InitDone);
    engine.reconciler().namespaces.apply(Event::Init);
    engine.reconciler().namespaces.apply(Event::InitDone);
    Rig {
        engine,
        dp,
        zt,
        ann,
        _stop: stop.drop_guard(),
    }
}

fn pod(ns: &str, name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}"), "resourceVersion": "1"},
        "spec": {"containers": [{"name": "app"}]},
        "status": {"phase": "Running", "podIPs": [{"ip": "10.0.0.9"}]}
    }))
    .unwrap()
}

/// The pod carrying the annotation the agent writes on enrolment.
fn enrolled(ns: &str, name: &str) -> Pod {
    let mut p = pod(ns, name);
    p.metadata.annotations = Some(
        [(
            "ambient.istio.io/redirection".to_string(),
            "enabled".to_string(),
        )]
        .into(),
    );
    p
}

fn namespace(name: &str, ambient: bool) -> Namespace {
    let labels = if ambient {
        json!({"istio.io/dataplane-mode": "ambient"})
    } else {
        json!({})
    };
    serde_json::from_value(
        json!({"metadata": {"name": name, "labels": labels, "resourceVersion": "1"}}),
    )
    .unwrap()
}

impl Rig {
    fn core(&self) -> &Arc<Core> {
        self.engine.reconciler()
    }

    fn put_pod(&self, p: Pod) -> Arc<Pod> {
        self.core().pods.apply(Event::Apply(p));
        let p = self.core().pods.list();
        p.into_iter().last().unwrap()
    }

    fn put_ns(&self, ns: Namespace) {
        self.core().namespaces.apply(Event::Apply(ns));
    }

    fn reevaluate(&self, ns: &str, name: &str) {
        self.engine.trigger(format!("{ns}/{name}"));
    }

    /// An ambient namespace, the pod in it, and an update event for the pod.
    fn enrol(&self, ns: &str, name: &str) {
        self.put_ns(namespace(ns, true));
        self.put_pod(pod(ns, name));
        self.reevaluate(ns, name);
    }

    async fn until_annotation(&self, key: &str, want: Option<&str>) {
        self.until(&format!("{key} annotated {want:?}"), || {
            self.ann.value(key).as_deref() == want
        })
        .await;
    }

    async fn until_dropped(&self, n: u64) {
        self.until(&format!("{n} given up"), || {
            self.engine.stats().given_up.load(Ordering::SeqCst) == n
        })
        .await;
    }

    async fn until(&self, what: &str, f: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !f() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

#[tokio::test]
async fn retryable_failure_marks_pending_and_retries_with_backoff_until_enabled() {
    let r = rig();
    r.zt.connected.store(false, Ordering::SeqCst);
    r.enrol("shop", "a");
    r.until_annotation("shop/a", Some("pending")).await;
    r.until("a few retries", || {
        r.engine.stats().retried.load(Ordering::SeqCst) >= 3
    })
    .await;
    // Pending: no probe-set entry yet.
    assert_eq!(r.dp.count("probe_add"), 0);
    r.zt.connected.store(true, Ordering::SeqCst);
    r.until_annotation("shop/a", Some("enabled")).await;
    r.until("idle", || r.engine.pending() == 0).await;
    assert!(r.zt.has("uid-a"));
    let attempts = r
        .core()
        .metrics
        .reconcile_events
        .get_or_create(&crate::telemetry::metrics::EventTypeLabel {
            r#type: "update".into(),
        })
        .get();
    assert!(attempts >= 4, "counted per attempt: {attempts}");
    assert_eq!(r.dp.count("probe_add uid-a"), 1);
}

/// A rig whose data plane has `fault`, once the enrolment of shop/a was dropped.
async fn dropped_after(fault: impl FnOnce(&FakeDataplane)) -> Rig {
    let r = rig();
    fault(&r.dp);
    r.enrol("shop", "a");
    r.until_dropped(1).await;
    r
}

#[tokio::test]
async fn non_retryable_failure_is_dropped_without_annotation() {
    let r = dropped_after(|dp| dp.fail_program.store(true, Ordering::SeqCst)).await;
    r.until("idle", || r.engine.pending() == 0).await;
    assert_eq!(r.dp.count("program"), 1, "not retried");
    assert!(
        r.ann.patches().is_empty(),
        "no annotation on a non-retryable failure"
    );
    assert!(r.core().mesh.cache.is_empty(), "placeholder removed");
    assert_eq!(r.zt.adds.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn missing_netns_is_dropped() {
    let r = dropped_after(|dp| dp.netns_missing.store(true, Ordering::SeqCst)).await;
    assert_eq!(r.dp.count("program"), 0);
}

#[tokio::test]
async fn event_whose_namespace_is_not_cached_yet_is_requeued() {
    let r = rig();
    r.put_pod(pod("late", "a"));
    r.reevaluate("late", "a");
    // Parked until the namespace comes (its add triggers its pods; here the slow safety retry).
    r.until("waiting for the namespace", || {
        r.engine.stats().parked.load(Ordering::SeqCst) >= 2
    })
    .await;
    assert_eq!(r.engine.stats().retried.load(Ordering::SeqCst), 0);
    assert!(r.ann.patches().is_empty());
    r.put_ns(namespace("late", true));
    r.until_annotation("late/a", Some("enabled")).await;
}

#[tokio::test]
async fn removal_is_retried_and_clears_the_annotation() {
    let r = rig();
    r.enrol("shop", "a");
    r.until_annotation("shop/a", Some("enabled")).await;
    // The probe entry the add wrote is what the drift pass will expect in the set.
    let ip: std::net::IpAddr = "10.0.0.9".parse().unwrap();
    let cache = &r.core().mesh.cache;
    assert_eq!(
        cache.probe_members(),
        (vec![("uid-a".into(), vec![ip])], true)
    );
    // The store now shows the annotation; then the namespace is unlabelled.
    let mut shown = enrolled("shop", "a");
    shown.metadata.resource_version = Some("2".into());
    r.put_pod(shown);
    r.put_ns(namespace("shop", false));
    r.dp.probe_failures.store(2, Ordering::SeqCst);
    r.reevaluate("shop", "a");
    r.until_annotation("shop/a", None).await;
    assert_eq!(
        r.dp.count("probe_remove uid-a"),
        3,
        "two failures, then success"
    );
    assert_eq!(r.dp.count("unprogram uid-a"), 1);
    assert!(!r.zt.has("uid-a"));
    assert!(r.dp.probes.lock().is_empty());
    assert_eq!(
        cache.probe_members(),
        (vec![], true),
        "no entry expected any more"
    );
}

#[tokio::test]
async fn one_slow_pod_does_not_hold_up_the_others() {
    let r = rig();
    let gate = r.zt.gate("slow");
    r.put_ns(namespace("shop", true));
    r.put_pod(pod("shop", "slow"));
    r.put_pod(pod("shop", "fast"));
    r.reevaluate("shop", "slow");
    // A second event for the slow pod waits behind the first (same key, in order).
    r.reevaluate("shop", "slow");
    r.reevaluate("shop", "fast");
    r.until_annotation("shop/fast", Some("enabled")).await;
    assert_eq!(r.ann.value("shop/slow"), None);
    assert_eq!(
        r.engine.pending(),
        1,
        "the slow pod's key, its second trigger folded in"
    );
    gate.notify_one();
    r.until_annotation("shop/slow", Some("enabled")).await;
}

#[tokio::test]
async fn pump_enrols_existing_pods_when_their_namespace_appears_or_is_labelled() {
    let r = rig();
    r.put_pod(pod("shop", "a"));
    r.put_ns(namespace("shop", false));
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    tokio::spawn(pump(r.engine.clone(), stop));
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert!(r.ann.patches().is_empty(), "unlabelled namespace: nothing");
    let mut labelled = namespace("shop", true);
    labelled.metadata.resource_version = Some("2".into());
    r.put_ns(labelled);
    r.until_annotation("shop/a", Some("enabled")).await;
    // A deleted pod is removed (deleted: no in-pod cleanup, no annotation patch).
    r.core().pods.apply(Event::Delete(enrolled("shop", "a")));
    r.until("removed from ztunnel", || !r.zt.has("uid-a")).await;
    assert_eq!(r.dp.count("unprogram"), 0);
    assert_eq!(r.ann.patches().len(), 1, "only the enabled patch");
}

#[tokio::test]
async fn a_watch_add_of_a_pod_enrolled_by_podadd_only_writes_its_owed_annotation() {
    let r = rig();
    r.put_ns(namespace("shop", true));
    let p = r.put_pod(pod("shop", "a"));
    let core = r.core();
    // What a `/podadd` leaves: enrolled (cached, netns, ztunnel has it), annotation owed.
    core.mesh.cache.upsert(
        "uid-a",
        pod::workload_info(&p),
        crate::netns::Netns::current().unwrap(),
    );
    core.mesh.cache.set_annotation_owed("uid-a", true);
    // The kubelet's status update arrives before the annotation: the store says not enrolled.
    r.reevaluate("shop", "a");
    r.until_annotation("shop/a", Some("enabled")).await;
    r.until("idle", || r.engine.pending() == 0).await;
    assert_eq!(
        r.zt.adds.load(Ordering::SeqCst),
        0,
        "ztunnel got the pod again"
    );
    assert_eq!(r.dp.count("program"), 0);
    assert!(!core.mesh.cache.annotation_owed("uid-a"));
}

/// The fake data plane, slow to program and counting programs in flight, per pod and in all.
#[derive(Default)]
struct Slow {
    inner: FakeDataplane,
    in_flight: HashMap<String, AtomicU32>,
    most: AtomicU32,
    overall: AtomicU32,
    most_overall: AtomicU32,
    /// A program alone in flight waits (up to a second) for a second one: two programs that can
    /// run side by side then surely overlap, however the runtime schedules them.
    rendezvous: AtomicBool,
}

impl DataplanePort for Slow {
    fn open_netns(&self, path: &str) -> Result<Netns, DataplaneError> {
        self.inner.open_netns(path)
    }
    fn reserved_netns(&self) -> crate::netns::reserved::Reserved {
        self.inner.reserved_netns()
    }
    fn netns_addresses(
        &self,
        netns: &Netns,
        pod: &crate::agent::ports::PodNet,
    ) -> Result<Vec<IpAddr>, DataplaneError> {
        self.inner.netns_addresses(netns, pod)
    }
    fn netns_alive(&self, netns: &Netns) -> bool {
        self.inner.netns_alive(netns)
    }
    fn find_netns(&self, wanted: &HashMap<String, Vec<IpAddr>>) -> HashMap<String, Netns> {
        self.inner.find_netns(wanted)
    }
    fn program_pod(
        &self,
        netns: &Netns,
        pod: &crate::agent::ports::PodNet,
    ) -> Result<crate::agent::ports::RuleChange, DataplaneError> {
        let now = self.in_flight[&pod.uid].fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        let all = self.overall.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_overall.fetch_max(all, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(30));
        let deadline = Instant::now() + Duration::from_secs(1);
        while self.rendezvous.load(Ordering::SeqCst)
            && self.most_overall.load(Ordering::SeqCst) < 2
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.overall.fetch_sub(1, Ordering::SeqCst);
        self.in_flight[&pod.uid].fetch_sub(1, Ordering::SeqCst);
        self.inner.program_pod(netns, pod)
    }
    fn unprogram_pod(
        &self,
        netns: &Netns,
        pod: &crate::agent::ports::PodNet,
    ) -> Result<(), DataplaneError> {
        self.inner.unprogram_pod(netns, pod)
    }
    fn probe_add(
        &self,
        uid: &str,
        ips: &[IpAddr],
        believed: Option<&crate::agent::ports::ProbeEntries>,
    ) -> Result<(), DataplaneError> {
        self.inner.probe_add(uid, ips, believed)
    }
    fn probe_remove(
        &self,
        uid: &str,
        ips: &[IpAddr],
        believed: Option<&crate::agent::ports::ProbeEntries>,
    ) -> Result<(), DataplaneError> {
        self.inner.probe_remove(uid, ips, believed)
    }
    fn probe_sync(
        &self,
        m: &[(String, Vec<IpAddr>)],
        prune: bool,
    ) -> Result<crate::agent::ports::ProbeSynced, DataplaneError> {
        self.inner.probe_sync(m, prune)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_pods_plugin_add_and_drift_check_never_interleave_and_different_pods_run_side_by_side()
{
    let slow = Arc::new(Slow {
        in_flight: ["uid-a", "uid-b"]
            .map(|u| (u.to_string(), AtomicU32::new(0)))
            .into(),
        ..Default::default()
    });
    let fake = Arc::new(FakeDataplane::default());
    let r = rig_with(slow.clone(), fake, timing());
    r.put_ns(namespace("shop", true));
    let mut b = pod("shop", "b");
    b.status.as_mut().unwrap().pod_ips = Some(vec![k8s_openapi::api::core::v1::PodIP {
        ip: "10.0.0.10".into(),
    }]);
    r.put_pod(pod("shop", "a"));
    r.put_pod(b);
    let offer = |name: &str| {
        let engine = r.engine.clone();
        let key = format!("shop/{name}");
        let add = Request::offer(PluginAdd {
            netns: "/proc/self/ns/net".into(),
            ..Default::default()
        });
        tokio::spawn(async move { engine.trigger_with_and_wait(key, add).await })
    };
    let verify = |name: &str| {
        let engine = r.engine.clone();
        let key = format!("shop/{name}");
        tokio::spawn(async move { engine.trigger_with_and_wait(key, Request::verify()).await })
    };
    let done = |answer: Result<Result<_, _>, _>| {
        let answer: crate::reconcile::Answer<Core> = answer.expect("engine stopped");
        answer.expect("run failed")
    };
    assert!(matches!(
        done(offer("a").await.unwrap()),
        Reconciled::Enrolled
    ));
    // The drift check of the enrolled pod and a second plugin add of it, at once.
    let (check, again) = (verify("a"), offer("a"));
    done(check.await.unwrap());
    done(again.await.unwrap());
    assert_eq!(
        slow.most.load(Ordering::SeqCst),
        1,
        "one pod programmed twice at once"
    );
    // Different pods are programmed side by side.
    slow.rendezvous.store(true, Ordering::SeqCst);
    let (a, b) = (verify("a"), offer("b"));
    assert!(matches!(
        done(a.await.unwrap()),
        Reconciled::Verified { .. }
    ));
    assert!(matches!(done(b.await.unwrap()), Reconciled::Enrolled));
    assert_eq!(
        slow.most_overall.load(Ordering::SeqCst),
        2,
        "two pods' programs never overlapped"
    );
}

#[tokio::test]
async fn a_pod_recreated_under_its_name_replaces_the_old_one() {
    let r = rig();
    r.enrol("shop", "a");
    r.until_annotation("shop/a", Some("enabled")).await;
    r.until("idle", || r.engine.pending() == 0).await;
    // A StatefulSet's pod: deleted and created again with the same name, before the agent
    // looked (one coalesced trigger sees only the new pod).
    r.core().pods.apply(Event::Delete(enrolled("shop", "a")));
    let mut again = pod("shop", "a");
    again.metadata.uid = Some("uid-a2".into());
    r.put_pod(again);
    r.reevaluate("shop", "a");
    r.until("the new pod enrolled", || r.zt.has("uid-a2")).await;
    r.until("idle", || r.engine.pending() == 0).await;
    assert!(!r.zt.has("uid-a"), "the old pod stayed in ztunnel");
    assert!(!r.core().mesh.cache.contains("uid-a"));
    assert_eq!(r.dp.count("probe_remove uid-a"), 1);
    assert_eq!(
        r.dp.count("unprogram"),
        0,
        "the old pod's netns went with it"
    );
}

#[tokio::test]
async fn an_owed_annotation_is_retried_by_the_pods_key_until_written() {
    let r = rig();
    r.put_ns(namespace("shop", true));
    let p = r.put_pod(pod("shop", "a"));
    let core = r.core();
    core.mesh
        .cache
        .upsert("uid-a", pod::workload_info(&p), Netns::current().unwrap());
    core.mesh.cache.set_annotation_owed("uid-a", true);
    r.ann.failures.store(2, Ordering::SeqCst);
    r.reevaluate("shop", "a");
    r.until_annotation("shop/a", Some("enabled")).await;
    assert_eq!(r.ann.failures.load(Ordering::SeqCst), 0);
    assert!(r.engine.stats().retried.load(Ordering::SeqCst) >= 2);
    assert!(!core.mesh.cache.annotation_owed("uid-a"));
    assert_eq!(r.zt.adds.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_plugin_add_of_a_pod_no_longer_selected_says_not_ambient() {
    let r = rig();
    r.put_ns(namespace("plain", false));
    r.put_pod(pod("plain", "a"));
    let add = Request::offer(PluginAdd {
        netns: "/proc/self/ns/net".into(),
        ..Default::default()
    });
    let answer = r
        .engine
        .trigger_with_and_wait("plain/a".into(), add)
        .await
        .unwrap();
    assert!(
        matches!(answer, Ok(Reconciled::NotAmbient(_))),
        "{answer:?}"
    );
    assert_eq!(r.dp.count("program"), 0);
}

#[tokio::test]
async fn a_ztunnel_connecting_completes_the_adds_that_waited_for_it() {
    use crate::zds::SnapshotSource;
    // Retries far apart: only the connection's trigger can finish the add in time.
    let dp = Arc::new(FakeDataplane::default());
    let slow_retries = AgentTiming {
        retry: RetryPolicy {
            first: Duration::from_secs(600),
            max: Duration::from_secs(600),
            max_attempts: None,
        },
        ..AgentTiming::default()
    };
    let r = rig_with(dp.clone(), dp, slow_retries);
    r.zt.connected.store(false, Ordering::SeqCst);
    r.enrol("shop", "a");
    r.until_annotation("shop/a", Some("pending")).await;
    r.until("resting before a retry", || {
        r.engine.stats().retried.load(Ordering::SeqCst) >= 1
    })
    .await;
    assert!(r.core().mesh.cache.snapshot()[0].1.awaiting_ztunnel);
    r.zt.connected.store(true, Ordering::SeqCst);
    let world = crate::agent::adapters::ZtunnelWorld {
        engine: r.engine.clone(),
    };
    let snapshot = world.snapshot();
    assert_eq!(
        snapshot.len(),
        1,
        "the pending pod is in ztunnel's snapshot"
    );
    r.until_annotation("shop/a", Some("enabled")).await;
    assert!(r.zt.has("uid-a"));
    assert!(!r.core().mesh.cache.snapshot()[0].1.awaiting_ztunnel);
}
