//! The worker with fake seams: retry classes, backoff, keyed concurrency, namespace requeue.

use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::runtime::watcher::Event;
use serde_json::json;

use super::*;
use crate::agent::cache::PodCache;
use crate::agent::settings::AgentTiming;
use crate::agent::testing::{FakeAnnotator, FakeDataplane, FakeZtunnel};
use crate::kube::RetryPolicy;
use crate::kube::selector::enablement::EnablementSelector;

struct Rig {
    worker: Worker,
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
    let zt = Arc::new(FakeZtunnel::default());
    let dp = Arc::new(FakeDataplane::default());
    let ann = Arc::new(FakeAnnotator::default());
    let core = Arc::new(Core {
        pods: PodStore::new(),
        namespaces: NamespaceStore::new(),
        policy: EnrolmentPolicy::new(&selectors(), &[], "istio-system").unwrap(),
        mesh: Mesh {
            dataplane: dp.clone(),
            ztunnel: zt.clone(),
            annotator: ann.clone(),
            cache: Arc::new(PodCache::default()),
            locks: Default::default(),
            probe_gate: Default::default(),
        },
        timing: timing(),
        metrics: Default::default(),
        status: Default::default(),
    });
    let stop = CancellationToken::new();
    let worker = Worker::new(core, stop.clone());
    worker.core().pods.apply(Event::Init);
    worker.core().pods.apply(Event::InitDone);
    worker.core().namespaces.apply(Event::Init);
    worker.core().namespaces.apply(Event::InitDone);
    Rig {
        worker,
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
    fn put_pod(&self, p: Pod) -> Arc<Pod> {
        self.worker.core().pods.apply(Event::Apply(p));
        let p = self.worker.core().pods.list();
        p.into_iter().last().unwrap()
    }

    fn put_ns(&self, ns: Namespace) {
        self.worker.core().namespaces.apply(Event::Apply(ns));
    }

    fn reevaluate(&self, ns: &str, name: &str) {
        let p = self
            .worker
            .core()
            .pods
            .get(&format!("{ns}/{name}"))
            .unwrap();
        self.worker.enqueue(PodEvent::Update {
            old: p.clone(),
            new: p,
        });
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
        self.until(&format!("{n} dropped"), || {
            self.worker.stats().dropped.load(Ordering::SeqCst) == n
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
        r.worker.stats().retried.load(Ordering::SeqCst) >= 3
    })
    .await;
    // Pending: no probe-set entry yet.
    assert_eq!(r.dp.count("probe_add"), 0);
    r.zt.connected.store(true, Ordering::SeqCst);
    r.until_annotation("shop/a", Some("enabled")).await;
    r.until("idle", || r.worker.pending() == 0).await;
    assert!(r.zt.has("uid-a"));
    let attempts = r
        .worker
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
    r.until("idle", || r.worker.pending() == 0).await;
    assert_eq!(r.dp.count("program"), 1, "not retried");
    assert!(
        r.ann.patches().is_empty(),
        "no annotation on a non-retryable failure"
    );
    assert!(r.worker.core().mesh.cache.is_empty(), "placeholder removed");
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
    r.until("requeued", || {
        r.worker.stats().retried.load(Ordering::SeqCst) >= 2
    })
    .await;
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
    let cache = &r.worker.core().mesh.cache;
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
    assert_eq!(r.worker.pending(), 2, "both slow events still queued");
    gate.notify_one();
    r.until_annotation("shop/slow", Some("enabled")).await;
}

#[tokio::test]
async fn pump_enrols_existing_pods_when_their_namespace_appears_or_is_labelled() {
    let r = rig();
    r.put_pod(pod("shop", "a"));
    r.put_ns(namespace("shop", false));
    tokio::spawn(r.worker.clone().pump());
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert!(r.ann.patches().is_empty(), "unlabelled namespace: nothing");
    let mut labelled = namespace("shop", true);
    labelled.metadata.resource_version = Some("2".into());
    r.put_ns(labelled);
    r.until_annotation("shop/a", Some("enabled")).await;
    // A deleted pod is removed (deleted: no in-pod cleanup, no annotation patch).
    r.worker
        .core()
        .pods
        .apply(Event::Delete(enrolled("shop", "a")));
    r.until("removed from ztunnel", || !r.zt.has("uid-a")).await;
    assert_eq!(r.dp.count("unprogram"), 0);
    assert_eq!(r.ann.patches().len(), 1, "only the enabled patch");
}

#[tokio::test]
async fn a_watch_add_of_a_pod_enrolled_by_podadd_only_writes_its_owed_annotation() {
    let r = rig();
    r.put_ns(namespace("shop", true));
    let p = r.put_pod(pod("shop", "a"));
    let core = r.worker.core();
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
    r.until("idle", || r.worker.pending() == 0).await;
    assert_eq!(
        r.zt.adds.load(Ordering::SeqCst),
        0,
        "ztunnel got the pod again"
    );
    assert_eq!(r.dp.count("program"), 0);
    assert!(!core.mesh.cache.annotation_owed("uid-a"));
}
