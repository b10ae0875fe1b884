use serde_json::json;

use super::*;
use crate::kube::WatchEvent;
use crate::repair::Mode;
use crate::repair::controller::tests::{Fake, controller, drift_pass, five_tries, rt, timing};
use crate::repair::heal::REASON_REPAIRED;
use crate::telemetry::metrics::RepairLabels;

/// A running sidecar pod (CNI mode) on this node, with `extra` annotations.
fn pod(name: &str, uid: &str, extra: serde_json::Value) -> Pod {
    let mut annotations = json!({"sidecar.istio.io/status": "{}"});
    for (k, v) in extra.as_object().unwrap() {
        annotations[k] = v.clone();
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "shop", "uid": uid, "annotations": annotations},
        "spec": {"nodeName": "n1", "initContainers": [{"name": "istio-validation"}],
                 "containers": [{"name": "app"}, {"name": "istio-proxy", "args": ["proxy", "sidecar"]}]},
        "status": {"phase": "Running", "podIP": "10.1.0.2", "podIPs": [{"ip": "10.1.0.2"}]}
    }))
    .unwrap()
}

fn is_candidate(p: &Pod) -> bool {
    candidate(p, &PodInfo::from_pod(p), &["kube-system".to_string()])
}

#[test]
fn the_pass_needs_a_procfs_under_host_proc_dir() {
    assert_eq!(unusable_proc(std::path::Path::new("/proc")), None);
    let empty = tempfile::tempdir().unwrap();
    let why = unusable_proc(empty.path()).expect("no procfs there");
    assert!(why.contains("HOST_PROC_DIR"), "{why}");
}

#[test]
fn only_pods_the_plugin_would_have_programmed_are_checked() {
    let base = pod("p", "u", json!({}));
    assert!(is_candidate(&base));
    let with = |edit: &dyn Fn(&mut Pod)| {
        let mut p = base.clone();
        edit(&mut p);
        is_candidate(&p)
    };
    assert!(!with(
        &|p| p.status.as_mut().unwrap().phase = Some("Pending".into())
    ));
    assert!(!with(
        &|p| p.spec.as_mut().unwrap().host_network = Some(true)
    ));
    assert!(!with(&|p| p.metadata.namespace = Some("kube-system".into())));
    assert!(!with(&|p| {
        p.status.as_mut().unwrap().pod_ip = None;
        p.status.as_mut().unwrap().pod_ips = None;
    }));
    assert!(!with(&|p| {
        p.metadata.annotations.as_mut().unwrap().remove(ANN_STATUS);
    }));
    assert!(!with(&|p| {
        p.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(AMBIENT_REDIRECTION.into(), "enabled".into());
    }));
    assert!(!with(&|p| p.spec.as_mut().unwrap().containers.truncate(1)));
}

fn plan(ledger: &mut DriftMemory, p: &Pod) -> Plan {
    let info = PodInfo::from_pod(p);
    let derived = Derived::of(&info, &EngineEnv::default());
    ledger.plan(p.metadata.uid.as_deref().unwrap(), &info, derived)
}

#[test]
fn a_changed_derivation_is_handed_over_once_and_never_verified() {
    let mut ledger = DriftMemory::default();
    let p = pod(
        "p",
        "u1",
        json!({"traffic.sidecar.istio.io/excludeOutboundPorts": "9000"}),
    );
    assert!(matches!(plan(&mut ledger, &p), Plan::Verify(_)));
    // An unrelated annotation does not change the derivation.
    let noted = pod(
        "p",
        "u1",
        json!({"traffic.sidecar.istio.io/excludeOutboundPorts": "9000", "note": "x"}),
    );
    assert!(matches!(plan(&mut ledger, &noted), Plan::Verify(_)));
    let edited = pod(
        "p",
        "u1",
        json!({"traffic.sidecar.istio.io/excludeOutboundPorts": "9001"}),
    );
    match plan(&mut ledger, &edited) {
        Plan::HandOff { why } => assert!(
            why.contains("traffic.sidecar.istio.io/excludeOutboundPorts")
                && !why.contains(ANN_STATUS),
            "{why}"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(plan(&mut ledger, &edited), Plan::Skip, "once per UID");
    // Edited back: the rules it has are the ones it should have again.
    assert!(matches!(plan(&mut ledger, &p), Plan::Verify(_)));
    // A new pod under the same name is judged on its own derivation.
    let recreated = pod(
        "p",
        "u2",
        json!({"traffic.sidecar.istio.io/excludeOutboundPorts": "9001"}),
    );
    assert!(matches!(plan(&mut ledger, &recreated), Plan::Verify(_)));
    ledger.retain(&HashSet::from(["u2".to_string()]));
    assert_eq!(ledger.len(), 1);
    let none = pod(
        "n",
        "u3",
        json!({"sidecar.istio.io/interceptionMode": "NONE"}),
    );
    assert_eq!(plan(&mut ledger, &none), Plan::Skip);
}

#[test]
fn a_failure_is_reported_once_until_the_pod_is_fine_again() {
    let mut ledger = DriftMemory::default();
    let failed = PodOutcome::Unhealed { why: "x".into() };
    assert_eq!(ledger.record("u", &failed), Report::Unhealed);
    assert_eq!(ledger.record("u", &failed), Report::Nothing);
    assert_eq!(ledger.record("u", &PodOutcome::InPlace), Report::Nothing);
    assert_eq!(ledger.record("u", &failed), Report::Unhealed);
    let healed = PodOutcome::Healed { what: "y".into() };
    assert_eq!(ledger.record("u", &healed), Report::Healed);
    assert_eq!(
        ledger.record("u", &healed),
        Report::Healed,
        "every heal counts"
    );
}

struct Rig {
    pass: DriftPass<Fake>,
    fake: Arc<Fake>,
    metrics: Metrics,
    stop: CancellationToken,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Rig {
    fn new() -> Rig {
        let fake = Fake::new(|_| Ok(true));
        let metrics = Metrics::default();
        let stop = CancellationToken::new();
        // Failed heals are retried only by the next pass here, so each pass's calls are its own.
        let slow = five_tries(Duration::from_secs(600), Duration::from_secs(600));
        // Detect-only mode: a hand-off is only counted as skipped.
        let controller = controller(fake.clone(), Mode::Detect, metrics.clone(), timing(slow));
        let pass = drift_pass(controller.engine(stop.clone()));
        Rig {
            pass,
            fake,
            metrics,
            stop,
        }
    }

    fn add(&self, p: Pod, verdict: Option<NetnsCheck>) {
        let uid = p.metadata.uid.clone().unwrap();
        if let Some(v) = verdict {
            self.fake.verdicts.lock().unwrap().insert(uid, v);
        }
        self.pass.pods().apply(WatchEvent::Apply(p));
    }

    fn counts(&self) -> (u64, u64) {
        let label = crate::telemetry::metrics::DriftLabel { kind: KIND.into() };
        let m = &self.metrics;
        (
            m.drift_repaired.get_or_create(&label).get(),
            m.drift_unhealed.get_or_create(&label).get(),
        )
    }

    /// Pods the controller's policy was handed (detect-only: each counted as skipped).
    fn handed(&self) -> u64 {
        let label = RepairLabels {
            r#type: "detect".into(),
            result: "skip".into(),
        };
        self.metrics.pods_repaired.get_or_create(&label).get()
    }

    fn take_calls(&self, from: usize) -> Vec<String> {
        self.fake.calls()[from..].to_vec()
    }
}

#[test]
fn a_pass_heals_drift_reports_failures_once_and_leaves_pods_in_place_alone() {
    rt().block_on(async {
        let mut rig = Rig::new();
        let drifted = NetnsCheck::Drifted {
            what: "iptables: nat chain ISTIO_OUTPUT holds 0 rules, 9 expected".into(),
        };
        rig.add(pod("fine", "u-fine", json!({})), Some(NetnsCheck::InPlace));
        rig.add(
            pod("flushed", "u-flushed", json!({})),
            Some(drifted.clone()),
        );
        rig.add(pod("gone", "u-gone", json!({})), None);
        rig.add(pod("stuck", "u-stuck", json!({})), Some(NetnsCheck::Absent));
        rig.fake.heal_fails.lock().unwrap().insert("u-stuck".into());

        let stats = rig.pass.pass().await;
        assert_eq!(
            stats,
            PassStats {
                verified: 4,
                healed: 1,
                failed: 2,
                handed_over: 0,
                over_budget: 0,
            }
        );
        let calls = rig.take_calls(0);
        let heals: Vec<_> = calls.iter().filter(|c| c.starts_with("heal")).collect();
        assert_eq!(heals, ["heal u-flushed", "heal u-stuck"], "{calls:?}");
        let events: Vec<_> = calls.iter().filter(|c| c.starts_with("event")).collect();
        assert_eq!(events.len(), 3, "{calls:?}");
        assert!(events.iter().any(
            |e| e.starts_with(&format!("event Normal {REASON_REPAIRED}"))
                && e.contains("ISTIO_OUTPUT holds 0 rules")
        ));
        assert!(events.iter().any(
            |e| e.starts_with(&format!("event Warning {REASON_UNHEALED}")) && e.contains("u-gone")
        ));
        assert!(events.iter().any(
            |e| e.starts_with(&format!("event Warning {REASON_UNHEALED}"))
                && e.contains("heal refused")
        ));
        assert_eq!(rig.counts(), (1, 2));

        // Next pass: the healed pod is in place, the failures are retried without new reports.
        let seen = rig.fake.calls().len();
        let stats = rig.pass.pass().await;
        assert_eq!((stats.verified, stats.healed, stats.failed), (4, 0, 2));
        let calls = rig.take_calls(seen);
        assert_eq!(
            calls
                .iter()
                .filter(|c| c.starts_with("heal"))
                .collect::<Vec<_>>(),
            ["heal u-stuck"],
            "{calls:?}"
        );
        assert!(!calls.iter().any(|c| c.starts_with("event")), "{calls:?}");
        assert_eq!(rig.counts(), (1, 2));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(rig.handed(), 0);
    });
}

#[test]
fn an_annotation_edited_on_a_running_pod_goes_to_the_policy_once_and_is_not_rewritten() {
    rt().block_on(async {
        let mut rig = Rig::new();
        rig.add(pod("web", "u1", json!({})), Some(NetnsCheck::InPlace));
        rig.pass.pass().await;
        rig.add(
            pod(
                "web",
                "u1",
                json!({"traffic.sidecar.istio.io/includeInboundPorts": "8080"}),
            ),
            Some(NetnsCheck::Drifted { what: "x".into() }),
        );
        let seen = rig.fake.calls().len();
        let stats = rig.pass.pass().await;
        assert_eq!((stats.verified, stats.handed_over), (0, 1));
        // The hand-off is a trigger of shop/web carrying u1 (a hand-off of another UID is
        // dropped), taken by the controller's policy.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(rig.handed(), 1, "handed over");
        let calls = rig.take_calls(seen);
        assert_eq!(calls.len(), 1, "one event, no verify, no heal: {calls:?}");
        assert!(calls[0].starts_with(&format!("event Warning {REASON_UNHEALED}")));
        assert!(calls[0].contains("includeInboundPorts"), "{calls:?}");
        assert_eq!(rig.counts(), (0, 1));
        for _ in 0..3 {
            rig.pass.pass().await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(rig.handed(), 1, "once per UID");
        assert_eq!(rig.fake.calls().len(), seen + 1, "{:?}", rig.fake.calls());
        assert_eq!(rig.counts(), (0, 1));
    });
}

/// A pod author's lists cannot make the pass slow for everyone: a port listed 50,000 times is
/// one rule (verified like any pod); 12,000 distinct ranges are over the budget, reported once
/// and then left out, while an ordinary pod is verified every pass.
#[test]
fn a_pod_over_the_rule_budget_is_reported_once_and_left_out() {
    let mut ledger = DriftMemory::default();
    let repeated = pod(
        "repeated",
        "u-rep",
        json!({"traffic.sidecar.istio.io/excludeOutboundPorts": vec!["80"; 50_000].join(",")}),
    );
    let ranges: Vec<String> = (0..12_000u32)
        .map(|i| format!("10.{}.{}.0/24", i / 256, i % 256))
        .collect();
    let wide = pod(
        "wide",
        "u-wide",
        json!({"traffic.sidecar.istio.io/excludeOutboundIPRanges": ranges.join(",")}),
    );
    let plain = pod("plain", "u-plain", json!({}));
    for pass in 0..3 {
        match plan(&mut ledger, &repeated) {
            Plan::Verify(settings) => assert!(settings.planned_rules() < 100),
            other => panic!("{other:?}"),
        }
        match (pass, plan(&mut ledger, &wide)) {
            (0, Plan::OverBudget { rules }) => assert!(rules > MAX_VERIFIED_RULES, "{rules}"),
            (0, other) => panic!("{other:?}"),
            (_, later) => assert_eq!(later, Plan::Skip, "reported once, then left out"),
        }
        assert!(matches!(plan(&mut ledger, &plain), Plan::Verify(_)));
    }
}

/// Next to 50 ordinary pods, a pod whose annotation repeats one port 50,000 times and one with
/// 12,000 ranges: every pass verifies the ordinary pods (and the repeated one, one rule); the
/// wide pod is reported once (log, event, `drift_unhealed`) and never read.
#[test]
fn hostile_pods_never_keep_a_pass_from_the_ordinary_ones() {
    rt().block_on(async {
        let mut rig = Rig::new();
        for i in 0..50 {
            rig.add(
                pod(&format!("p{i}"), &format!("u{i}"), json!({})),
                Some(NetnsCheck::InPlace),
            );
        }
        let repeated = vec!["80"; 50_000].join(",");
        rig.add(
            pod(
                "repeated",
                "u-rep",
                json!({"traffic.sidecar.istio.io/excludeOutboundPorts": repeated}),
            ),
            Some(NetnsCheck::InPlace),
        );
        let ranges: Vec<String> = (0..12_000u32)
            .map(|i| format!("10.{}.{}.0/24", i / 256, i % 256))
            .collect();
        rig.add(
            pod(
                "wide",
                "u-wide",
                json!({"traffic.sidecar.istio.io/excludeOutboundIPRanges": ranges.join(",")}),
            ),
            None,
        );
        for pass in 0..3 {
            let from = rig.fake.calls().len();
            let started = std::time::Instant::now();
            let stats = rig.pass.pass().await;
            assert!(started.elapsed() < Duration::from_secs(10));
            assert_eq!(
                (stats.verified, stats.over_budget),
                (51, usize::from(pass == 0))
            );
            let calls = rig.take_calls(from);
            assert!(
                !calls
                    .iter()
                    .any(|c| c.contains("u-wide") && !c.starts_with("event")),
                "{calls:?}"
            );
        }
        assert_eq!(rig.counts(), (0, 1), "the wide pod reported once");
    });
}
