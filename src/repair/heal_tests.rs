//! The drift heal as a run of the pod's key on the controller's engine: never beside the
//! controller's own work on the pod, and retried with the engine's backoff when it fails.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::apply::pod::NetnsCheck;
use crate::kube::{EventRecord, WatchEvent};
use crate::repair::controller::pump;
use crate::repair::controller::tests::{Fake, controller, drift_pass, five_tries, rt, timing};
use crate::repair::effects::{Acting, Checked};
use crate::repair::{Mode, RepairTiming, test_config};
use crate::telemetry::metrics::DriftLabel;

/// A running sidecar pod whose validation container last exited 126: broken for the controller
/// and a candidate for the drift pass at once.
fn running_and_broken(rv: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "shop", "uid": "u1", "resourceVersion": rv,
                     "annotations": {"sidecar.istio.io/status": "{}"}},
        "spec": {"nodeName": "n1", "initContainers": [{"name": "istio-validation"}],
                 "containers": [{"name": "app"}, {"name": "istio-proxy", "args": ["proxy", "sidecar"]}]},
        "status": {"phase": "Running", "podIP": "10.1.0.2", "podIPs": [{"ip": "10.1.0.2"}],
                   "initContainerStatuses": [{
                       "name": "istio-validation", "ready": false, "restartCount": 1, "image": "i",
                       "imageID": "", "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                       "lastState": {"terminated": {"exitCode": 126}}}]}
    }))
    .unwrap()
}

/// Effects whose writes to a pod (repair, heal) take `takes` each, counting how many are in
/// flight per pod at once; every pod's rules are found drifted.
#[derive(Default)]
struct Slow {
    takes: Duration,
    calls: Mutex<Vec<String>>,
    in_flight: Mutex<HashMap<String, usize>>,
    most_at_once: Mutex<usize>,
}

impl Slow {
    fn write(self: &Arc<Self>, what: &str, uid: String) -> BoxFuture<'static, ()> {
        self.calls.lock().unwrap().push(format!("{what} {uid}"));
        let me = self.clone();
        async move {
            {
                let mut in_flight = me.in_flight.lock().unwrap();
                let now = in_flight.entry(uid.clone()).or_default();
                *now += 1;
                let mut most = me.most_at_once.lock().unwrap();
                *most = (*most).max(*now);
            }
            tokio::time::sleep(me.takes).await;
            *me.in_flight.lock().unwrap().get_mut(&uid).unwrap() -= 1;
        }
        .boxed()
    }
}

/// `Effects` for `Arc<Slow>` (the writes need the shared counters after the call returns).
struct SlowEffects(Arc<Slow>);

impl Effects for SlowEffects {
    fn repair(&self, pod: Arc<Pod>) -> Acting<bool> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.0.write("repair", uid).map(|()| Ok(true)).boxed()
    }
    fn delete(&self, _pod: Arc<Pod>) -> Acting {
        futures::future::ready(Ok(())).boxed()
    }
    fn label(&self, _: Arc<Pod>, _: String, _: String) -> Acting {
        futures::future::ready(Ok(())).boxed()
    }
    fn event(&self, _: Arc<Pod>, _: EventRecord) -> Acting {
        futures::future::ready(Ok(())).boxed()
    }
    fn verify_pods(&self, batch: Vec<Expected>) -> BoxFuture<'static, Vec<Checked>> {
        let checked = batch
            .into_iter()
            .map(|e| Checked {
                uid: e.uid,
                result: Ok((
                    Arc::new(Netns::current().unwrap()),
                    NetnsCheck::Drifted {
                        what: "nat chain ISTIO_OUTPUT flushed".into(),
                    },
                )),
            })
            .collect();
        futures::future::ready(checked).boxed()
    }
    fn heal(&self, _: Arc<Netns>, e: Expected) -> Acting {
        self.0.write("heal", e.uid).map(|()| Ok(())).boxed()
    }
}

/// A pod event (the controller repairs the broken pod) and a drift finding (the pass heals its
/// rules) for one pod at once, in either order: its two writes never overlap, and both are done.
#[test]
fn a_drift_heal_and_a_pod_event_for_one_pod_are_never_worked_at_once() {
    for drift_first in [false, true] {
        rt().block_on(async {
            let slow = Arc::new(Slow {
                takes: Duration::from_millis(200),
                ..Slow::default()
            });
            let stop = CancellationToken::new();
            let controller = controller(
                Arc::new(SlowEffects(slow.clone())),
                Mode::of(&test_config()),
                Metrics::default(),
                timing(RepairTiming::default().retry),
            );
            let pods = controller.pods.clone();
            let repairs = controller.engine(stop.clone());
            let mut pass = drift_pass(repairs.clone());
            if drift_first {
                // In the store, not yet seen by the controller: the pass's heal starts first,
                // then the pod's event arrives while it runs.
                pods.apply(WatchEvent::Apply(running_and_broken("1")));
                let healing = tokio::spawn(async move { pass.pass().await });
                tokio::time::sleep(Duration::from_millis(50)).await;
                tokio::spawn(pump(repairs.clone(), stop.clone()));
                let stats = healing.await.unwrap();
                assert_eq!(stats.healed, 1);
            } else {
                tokio::spawn(pump(repairs.clone(), stop.clone()));
                pods.apply(WatchEvent::Apply(running_and_broken("1")));
                tokio::time::sleep(Duration::from_millis(50)).await;
                let stats = pass.pass().await;
                assert_eq!(stats.healed, 1);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            let calls = slow.calls.lock().unwrap().clone();
            assert!(calls.contains(&"repair u1".to_string()), "{calls:?}");
            assert!(calls.contains(&"heal u1".to_string()), "{calls:?}");
            assert_eq!(
                *slow.most_at_once.lock().unwrap(),
                1,
                "drift_first={drift_first}: two writes to one pod at once: {calls:?}"
            );
            stop.cancel();
        });
    }
}

/// A heal that never ends does not hold the pass: it waits for it as long as `HEAL_WAIT`, then
/// goes on (the run goes on too, and would report its own outcome).
#[test]
fn a_heal_that_never_ends_holds_the_pass_no_longer_than_its_wait() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let slow = Arc::new(Slow {
            takes: Duration::from_secs(24 * 3600),
            ..Slow::default()
        });
        let stop = CancellationToken::new();
        let controller = controller(
            Arc::new(SlowEffects(slow.clone())),
            Mode::Detect,
            Metrics::default(),
            timing(RepairTiming::default().retry),
        );
        controller
            .pods
            .apply(WatchEvent::Apply(running_and_broken("1")));
        let mut pass = drift_pass(controller.engine(stop.clone()));
        let started = tokio::time::Instant::now();
        let stats = pass.pass().await;
        let took = started.elapsed();
        assert_eq!((stats.healed, stats.failed), (0, 0));
        assert!(
            took >= crate::repair::drift::HEAL_WAIT && took < 2 * crate::repair::drift::HEAL_WAIT,
            "{took:?}"
        );
        assert_eq!(*slow.calls.lock().unwrap(), ["heal u1"]);
        stop.cancel();
    });
}

/// A heal that fails is a failed run of the pod's key: the engine retries it after its backoff
/// without waiting for the next pass, and gives up after the policy's attempts (until the next
/// finding); the failure is reported once, the later success counted as a repair.
#[test]
fn a_failed_heal_is_retried_by_the_engine_with_its_backoff_then_given_up() {
    rt().block_on(async {
        let fake = Fake::new(|_| Ok(true));
        let metrics = Metrics::default();
        let stop = CancellationToken::new();
        let fast = five_tries(Duration::from_millis(20), Duration::from_millis(40));
        let controller = controller(fake.clone(), Mode::Detect, metrics.clone(), timing(fast));
        let pods = controller.pods.clone();
        let repairs = controller.engine(stop.clone());
        let mut pass = drift_pass(repairs.clone());
        for (name, uid) in [("flaky", "u-flaky"), ("stuck", "u-stuck")] {
            let mut p = running_and_broken("1");
            p.metadata.name = Some(name.into());
            p.metadata.uid = Some(uid.into());
            let drifted = NetnsCheck::Drifted { what: "x".into() };
            fake.verdicts.lock().unwrap().insert(uid.into(), drifted);
            fake.heal_fails.lock().unwrap().insert(uid.into());
            pods.apply(WatchEvent::Apply(p));
        }
        let stats = pass.pass().await;
        assert_eq!((stats.healed, stats.failed), (0, 2));
        fake.heal_fails.lock().unwrap().remove("u-flaky");
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let heals = |uid: &str| {
            let call = format!("heal {uid}");
            fake.calls().iter().filter(|c| **c == call).count()
        };
        assert_eq!(
            heals("u-flaky"),
            2,
            "retried once, then healed: {:?}",
            fake.calls()
        );
        assert_eq!(
            heals("u-stuck"),
            5,
            "the policy's attempts: {:?}",
            fake.calls()
        );
        let label = DriftLabel { kind: KIND.into() };
        assert_eq!(metrics.drift_repaired.get_or_create(&label).get(), 1);
        assert_eq!(metrics.drift_unhealed.get_or_create(&label).get(), 2);
        assert_eq!(repairs.stats().given_up.load(Ordering::Relaxed), 1);
        assert!(repairs.stats().retried.load(Ordering::Relaxed) >= 5);
        stop.cancel();
    });
}
