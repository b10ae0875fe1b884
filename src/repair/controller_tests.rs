use std::sync::Mutex;

use futures::FutureExt;
use serde_json::json;

use super::*;
use crate::apply::pod::NetnsCheck;
use crate::kube::{EventRecord, WatchEvent};
use crate::netns::Netns;
use crate::repair::RepairConfig;
use crate::repair::drift::{DriftMemory, DriftPass};
use crate::repair::effects::{Acting, Checked, Expected};
use crate::retry::RetryPolicy;
use crate::sidecar::redirect::EngineEnv;

type RepairFn = dyn Fn(u32) -> Result<bool, ActError> + Send + Sync;

/// Records every call; repair answers with `repair(nth call)`; the drift pass's verify answers
/// per UID from `verdicts` (absent: no netns found), its heal fails for UIDs in `heal_fails`.
pub(crate) struct Fake {
    calls: Mutex<Vec<String>>,
    repair: Box<RepairFn>,
    pub(crate) verdicts: Mutex<std::collections::HashMap<String, NetnsCheck>>,
    pub(crate) heal_fails: Mutex<std::collections::HashSet<String>>,
}

impl Fake {
    pub(crate) fn new(
        repair: impl Fn(u32) -> Result<bool, ActError> + Send + Sync + 'static,
    ) -> Arc<Fake> {
        Arc::new(Fake {
            calls: Mutex::new(Vec::new()),
            repair: Box::new(repair),
            verdicts: Mutex::default(),
            heal_fails: Mutex::default(),
        })
    }

    pub(crate) fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    fn record(&self, call: String) -> u32 {
        let mut calls = self.calls.lock().unwrap();
        calls.push(call);
        calls.len() as u32
    }

    /// A write that always succeeds, recorded as `call`.
    fn noted(&self, call: String) -> Acting {
        self.record(call);
        futures::future::ready(Ok(())).boxed()
    }
}

impl Effects for Fake {
    fn repair(&self, pod: Arc<Pod>) -> Acting<bool> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let n = self.record(format!("repair {uid}"));
        futures::future::ready((self.repair)(n)).boxed()
    }
    fn delete(&self, pod: Arc<Pod>) -> Acting {
        self.noted(format!("delete {}", pod.key()))
    }
    fn label(&self, pod: Arc<Pod>, key: String, value: String) -> Acting {
        self.noted(format!("label {} {key}={value}", pod.key()))
    }
    fn event(&self, _pod: Arc<Pod>, event: EventRecord) -> Acting {
        let EventRecord {
            event_type,
            reason,
            message,
            ..
        } = event;
        self.noted(format!("event {event_type:?} {reason} {message}"))
    }
    fn verify_pods(&self, batch: Vec<Expected>) -> BoxFuture<'static, Vec<Checked>> {
        let verdicts = self.verdicts.lock().unwrap().clone();
        let checked = batch
            .into_iter()
            .map(|e| {
                self.record(format!("verify {}", e.uid));
                let result = match verdicts.get(&e.uid) {
                    Some(v) => Ok((Arc::new(Netns::current().unwrap()), v.clone())),
                    None => Err(ActError::NetnsNotFound {
                        uid: e.uid.clone(),
                        ips: String::new(),
                        proc_dir: "/proc".into(),
                    }),
                };
                Checked { uid: e.uid, result }
            })
            .collect();
        futures::future::ready(checked).boxed()
    }
    fn heal(&self, _netns: Arc<Netns>, e: Expected) -> Acting {
        self.record(format!("heal {}", e.uid));
        let result = if self.heal_fails.lock().unwrap().contains(&e.uid) {
            Err(ActError::Task("heal refused".into()))
        } else {
            self.verdicts
                .lock()
                .unwrap()
                .insert(e.uid.clone(), NetnsCheck::InPlace);
            Ok(())
        };
        futures::future::ready(result).boxed()
    }
}

fn cfg() -> RepairConfig {
    super::super::test_config()
}

fn broken_pod(name: &str, uid: &str, rv: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": rv,
                     "annotations": {"sidecar.istio.io/status": "{}"}},
        "spec": {"nodeName": "n1", "containers": [{"name": "app"}]},
        "status": {"initContainerStatuses": [{
            "name": "istio-validation", "ready": false, "restartCount": 1, "image": "i",
            "imageID": "", "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 126}}}]}
    }))
    .unwrap()
}

/// The tests' timing: kube calls time out after a second, failed runs retried after `retry`.
pub(crate) fn timing(retry: RetryPolicy) -> RepairTiming {
    RepairTiming {
        kube_call_timeout: Duration::from_secs(1),
        retry,
    }
}

/// Retries after `first`, backing off up to `max`, five attempts in all.
pub(crate) fn five_tries(first: Duration, max: Duration) -> RetryPolicy {
    RetryPolicy {
        first,
        max,
        max_attempts: Some(5),
    }
}

fn fast() -> RepairTiming {
    timing(five_tries(
        Duration::from_millis(2),
        Duration::from_millis(10),
    ))
}

/// The tests' one controller rig: a controller over a pod store past its initial listing,
/// detecting with `cfg()` and acting in `mode` through `effects`; the caller starts its engine.
pub(crate) fn controller<E: Effects + ?Sized>(
    effects: Arc<E>,
    mode: Mode,
    metrics: Metrics,
    timing: RepairTiming,
) -> Controller<E> {
    let pods = PodStore::new();
    pods.apply(WatchEvent::Init);
    pods.apply(WatchEvent::InitDone);
    Controller {
        pods,
        detection: Detection::new(&cfg()).unwrap(),
        mode,
        effects,
        metrics,
        timing,
    }
}

/// A drift pass handing its findings to `repairs` (every namespace checked).
pub(crate) fn drift_pass<E: Effects + ?Sized>(repairs: Repairs<E>) -> DriftPass<E> {
    DriftPass {
        env: Arc::new(EngineEnv::default()),
        exclude_namespaces: vec![],
        repairs,
        memory: DriftMemory::default(),
    }
}

/// Repair mode off, label mode on (the broken-pod label of `cfg()`).
fn label_mode() -> Mode {
    Mode::of(&RepairConfig {
        repair_pods: false,
        label_pods: true,
        ..cfg()
    })
}

struct Rig {
    store: PodStore,
    metrics: Metrics,
    stop: CancellationToken,
    repairs: Repairs<dyn Effects>,
}

impl Rig {
    fn start(effects: Arc<dyn Effects>, mode: Mode) -> Rig {
        let metrics = Metrics::default();
        let stop = CancellationToken::new();
        let c = controller(effects, mode, metrics.clone(), fast());
        let store = c.pods.clone();
        let repairs = c.engine(stop.clone());
        tokio::spawn(pump(repairs.clone(), stop.clone()));
        Rig {
            store,
            metrics,
            stop,
            repairs,
        }
    }

    fn apply(&self, pod: Pod) {
        self.store.apply(WatchEvent::Apply(pod));
    }

    fn count(&self, kind: &str, result: &str) -> u64 {
        self.metrics
            .pods_repaired
            .get_or_create(&RepairLabels {
                r#type: kind.into(),
                result: result.into(),
            })
            .get()
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn settle() {
    tokio::time::sleep(Duration::from_millis(150)).await;
}

pub(crate) fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn a_pod_uid_is_acted_on_once_and_a_new_uid_again() {
    rt().block_on(async {
        let fake = Fake::new(|_| Ok(true));
        let rig = Rig::start(fake.clone(), Mode::of(&cfg()));
        rig.apply(broken_pod("p", "u1", "1"));
        settle().await;
        // Still broken a moment later (the container has not restarted yet): no second repair.
        rig.apply(broken_pod("p", "u1", "2"));
        settle().await;
        let repairs = |f: &Fake| f.calls().iter().filter(|c| c.starts_with("repair")).count();
        assert_eq!(repairs(&fake), 1, "{:?}", fake.calls());
        assert!(
            fake.calls()
                .iter()
                .any(|c| c.starts_with("event Normal RepairBrokenPod")),
            "{:?}",
            fake.calls()
        );
        assert_eq!(rig.count("repair", "success"), 1);
        // Deleted and recreated under the same name: a new pod.
        rig.store
            .apply(WatchEvent::Delete(broken_pod("p", "u1", "3")));
        rig.apply(broken_pod("p", "u2", "4"));
        settle().await;
        assert_eq!(repairs(&fake), 2, "{:?}", fake.calls());
        assert!(fake.calls().contains(&"repair u2".to_string()));
    });
}

#[test]
fn transient_failures_back_off_then_give_up_with_one_event() {
    rt().block_on(async {
        let fake = Fake::new(|_| Err(ActError::NoIp));
        let rig = Rig::start(fake.clone(), Mode::of(&cfg()));
        rig.apply(broken_pod("p", "u1", "1"));
        // Events while waiting for the retry do not jump the queue.
        for rv in 2..20 {
            rig.apply(broken_pod("p", "u1", &rv.to_string()));
        }
        settle().await;
        let calls = fake.calls();
        let repairs = calls.iter().filter(|c| c.starts_with("repair")).count();
        assert_eq!(repairs, 5, "max attempts: {calls:?}");
        let events: Vec<_> = calls.iter().filter(|c| c.starts_with("event")).collect();
        assert_eq!(events.len(), 1, "{calls:?}");
        assert!(events[0].contains("Warning") && events[0].contains("no IP"));
        assert_eq!(rig.count("repair", "fail"), 1);
    });
}

#[test]
fn invalid_annotations_get_one_event_naming_the_annotation_and_no_retry() {
    rt().block_on(async {
        let fake = Fake::new(|_| {
            Err(ActError::Annotation(
                crate::sidecar::redirect::AnnotationError {
                    annotation: "traffic.sidecar.istio.io/excludeOutboundPorts",
                    value: "x".into(),
                    reason: "not a port".into(),
                },
            ))
        });
        let rig = Rig::start(fake.clone(), Mode::of(&cfg()));
        for rv in 1..10 {
            rig.apply(broken_pod("p", "u1", &rv.to_string()));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        settle().await;
        let calls = fake.calls();
        assert_eq!(calls.len(), 2, "one attempt, one event: {calls:?}");
        assert!(calls[1].contains("excludeOutboundPorts"), "{calls:?}");
        assert_eq!(rig.count("repair", "fail"), 1);
    });
}

#[test]
fn label_mode_labels_once_and_skips_a_labelled_pod() {
    rt().block_on(async {
        let fake = Fake::new(|_| Ok(true));
        let rig = Rig::start(fake.clone(), label_mode());
        rig.apply(broken_pod("a", "u1", "1"));
        let mut labelled = broken_pod("b", "u2", "1");
        labelled.metadata.labels =
            Some([("cni.istio.io/uninitialized".to_string(), "true".to_string())].into());
        rig.apply(labelled);
        settle().await;
        let calls = fake.calls();
        assert!(calls.contains(&"label ns/a cni.istio.io/uninitialized=true".to_string()));
        assert!(
            !calls.iter().any(|c| c.starts_with("label ns/b")),
            "{calls:?}"
        );
        assert!(
            calls
                .iter()
                .any(|c| c.starts_with("event Warning LabelBrokenPod"))
        );
        assert_eq!(rig.count("label", "success"), 1);
        assert_eq!(rig.count("label", "skip"), 1);
    });
}

#[test]
fn modes_follow_istio_precedence_and_the_policy_gives_up_on_permanent_errors() {
    let all = RepairConfig {
        delete_pods: true,
        label_pods: true,
        ..cfg()
    };
    assert!(matches!(Mode::of(&all), Mode::Repair { .. }));
    let delete = RepairConfig {
        repair_pods: false,
        ..all.clone()
    };
    assert_eq!(Mode::of(&delete), Mode::Delete);
    let none = RepairConfig {
        repair_pods: false,
        delete_pods: false,
        label_pods: false,
        ..cfg()
    };
    assert_eq!(Mode::of(&none), Mode::Detect);
    let t = fast();
    assert!(matches!(
        error_policy(&ActError::NoIp, 1, &t),
        AfterFailure::RetryAfter(d) if d <= Duration::from_millis(2)
    ));
    assert_eq!(error_policy(&ActError::NoIp, 5, &t), AfterFailure::GiveUp);
    assert_eq!(
        error_policy(&ActError::Task("x".into()), 1, &t),
        AfterFailure::GiveUp
    );
}

#[test]
fn a_host_network_pod_is_never_acted_on_in_any_mode() {
    let mut pod = broken_pod("h", "u-host", "1");
    pod.spec.as_mut().unwrap().host_network = Some(true);
    let pod = Arc::new(pod);
    let modes = [
        Mode::of(&cfg()),
        Mode::Delete,
        Mode::Label {
            key: "k".into(),
            value: "v".into(),
        },
    ];
    for mode in modes {
        let fake = Fake::new(|_| Ok(true));
        let done = rt().block_on(reconcile(&*fake, &mode, pod.clone(), "handed over"));
        assert_eq!(
            done.unwrap(),
            Handled::Skipped(HOST_NETWORK_SKIP),
            "{mode:?}"
        );
        assert!(fake.calls().is_empty(), "{mode:?}: {:?}", fake.calls());
    }
}

#[test]
fn a_pod_handed_over_by_the_drift_pass_takes_the_policy_path_though_not_broken() {
    rt().block_on(async {
        let fake = Fake::new(|_| Ok(true));
        let rig = Rig::start(fake.clone(), label_mode());
        let mut healthy = broken_pod("h", "u1", "1");
        healthy.status = None;
        rig.apply(healthy);
        settle().await;
        assert!(fake.calls().is_empty(), "not broken: {:?}", fake.calls());
        let handoff = |uid: &str| {
            let why = "annotations traffic.sidecar.istio.io/excludeOutboundPorts changed";
            Findings::hand_off(uid.into(), why.into())
        };
        // A hand-off for another UID (a re-created pod) is not this pod's.
        rig.repairs.trigger_with("ns/h".into(), handoff("u0"));
        settle().await;
        assert!(fake.calls().is_empty(), "{:?}", fake.calls());
        rig.repairs.trigger_with("ns/h".into(), handoff("u1"));
        settle().await;
        let calls = fake.calls();
        assert_eq!(
            calls[0], "label ns/h cni.istio.io/uninitialized=true",
            "{calls:?}"
        );
        assert!(
            calls[1].starts_with("event Warning LabelBrokenPod")
                && calls[1].contains("excludeOutboundPorts"),
            "{calls:?}"
        );
        assert_eq!(calls.len(), 2, "{calls:?}");
        assert_eq!(rig.count("label", "success"), 1);
    });
}

#[test]
fn a_handed_over_pod_outside_the_repair_selectors_is_left_alone() {
    rt().block_on(async {
        let fake = Fake::new(|_| Ok(true));
        let mut c = controller(fake.clone(), Mode::Delete, Metrics::default(), fast());
        c.detection = Detection::new(&RepairConfig {
            label_selectors: "team=payments".into(),
            ..cfg()
        })
        .unwrap();
        let store = c.pods.clone();
        let stop = CancellationToken::new();
        let repairs = c.engine(stop.clone());
        tokio::spawn(pump(repairs.clone(), stop.clone()));
        let mut healthy = broken_pod("h", "u1", "1");
        healthy.status = None;
        store.apply(WatchEvent::Apply(healthy));
        repairs.trigger_with(
            "ns/h".into(),
            Findings::hand_off("u1".into(), "annotations changed".into()),
        );
        settle().await;
        assert!(fake.calls().is_empty(), "{:?}", fake.calls());
        stop.cancel();
    });
}

/// A pod under `restartPolicy: Never` whose validation container failed: it never runs again,
/// so its status has the failure as the current state and no last state (Istio's detection,
/// which reads only the last state, never sees it).
fn never_restarting_pod(name: &str, uid: &str, owner: Option<&str>) -> Pod {
    let owners = match owner {
        Some(kind) => {
            json!([{"apiVersion": "batch/v1", "kind": kind, "name": format!("{name}-owner"),
                              "uid": "o-1", "controller": true}])
        }
        None => json!([]),
    };
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": "1",
                     "ownerReferences": owners,
                     "annotations": {"sidecar.istio.io/status": "{}"}},
        "spec": {"nodeName": "n1", "restartPolicy": "Never", "containers": [{"name": "app"}]},
        "status": {"phase": "Failed", "initContainerStatuses": [{
            "name": "istio-validation", "ready": false, "restartCount": 0, "image": "i",
            "imageID": "", "state": {"terminated": {"exitCode": 126, "reason": "Error"}}}]}
    }))
    .unwrap()
}

#[test]
fn a_pod_that_cannot_restart_is_deleted_for_its_controller_or_labelled_when_bare() {
    rt().block_on(async {
        let fake = Fake::new(|_| Ok(true));
        let rig = Rig::start(fake.clone(), Mode::of(&cfg()));
        rig.apply(never_restarting_pod("job-pod", "u-job", Some("Job")));
        rig.apply(never_restarting_pod("bare", "u-bare", None));
        rig.apply(broken_pod("restarts", "u-ok", "1"));
        settle().await;
        let calls = fake.calls();
        let has = |prefix: &str| calls.iter().filter(|c| c.starts_with(prefix)).count();
        // Never programmed in place: the kubelet will not run their init containers again.
        assert_eq!(has("repair u-job") + has("repair u-bare"), 0, "{calls:?}");
        assert_eq!(has("delete ns/job-pod"), 1, "{calls:?}");
        let (key, value) = (&cfg().broken_pod_label_key, &cfg().broken_pod_label_value);
        assert_eq!(has(&format!("label ns/bare {key}={value}")), 1, "{calls:?}");
        assert_eq!(has("delete ns/bare"), 0, "{calls:?}");
        assert!(
            calls
                .iter()
                .any(|c| c.starts_with("event Warning DeleteBrokenPod")
                    && c.contains("restartPolicy Never")
                    && c.contains("Job job-pod-owner")),
            "{calls:?}"
        );
        assert!(
            calls
                .iter()
                .any(|c| c.starts_with("event Warning LabelBrokenPod")
                    && c.contains("no controller recreates it")),
            "{calls:?}"
        );
        // A pod that restarts is still repaired in place.
        assert_eq!(has("repair u-ok"), 1, "{calls:?}");
    });
}
