//! Hostile pod specs next to ordinary pods in the sidecar drift pass, end to end: the real
//! install-cni (repair on, a short `DRIFT_VERIFY_INTERVAL`) on a test node (support/ambient_node.rs:
//! its own netns, the test API server, a real CNI chain), 50 ordinary sidecar pods, one whose
//! `excludeOutboundPorts` is `80` written 50,000 times and one with 12,000 distinct
//! `excludeOutboundIPRanges` — every pod a real netns programmed by the real plugin ADD, with a
//! process in its pod cgroup so the /proc scan finds it.
//!
//! What must hold: every pass ends within its period and verifies every ordinary pod (and the
//! repeated-port pod, whose 50,000 items collapse to the rules of one); the 12,000-CIDR pod is over
//! the per-pod rule budget and is reported once (one warning, one event, `drift_unhealed` +1), never
//! read again; a rule deleted in an ordinary pod is healed within a pass.
//!
//! Checked against binaries built without the fix (`ISTIO_CNI_RS_BIN` runs any binary): with no
//! budget the 12,000-rule pod is read and compared every pass and never reported, so the per-pass
//! count fails; with no budget and the comparisons that rescanned every found rule per planned
//! rule, the pass holding that pod does not end within the wait and no ordinary pod is verified.

#[path = "support/ambient_node.rs"]
mod ambient_node;
mod install_support;
mod support;

use std::time::{Duration, Instant};

use ambient_node::{Backend, NODE, Node, PodNs, PodProcess, in_netns, result_ip, unique_uid};
use serde_json::json;

const NS: &str = "shop";
const ORDINARY: usize = 50;
/// The drift period; a pass must end within it (a debug build on a loaded 2-core machine reads
/// 51 pods in well under it).
const PERIOD: Duration = Duration::from_secs(5);
/// One jittered period (+25%), a pass, and scheduling slack.
const HEAL_WITHIN: Duration = Duration::from_secs(12);
/// Plugin ADDs run at once (the runtime starts sandboxes in parallel too).
const ADD_WORKERS: usize = 4;

struct SidecarPod {
    name: String,
    netns: PodNs,
    _process: PodProcess,
}

fn start() -> Node {
    let period = format!("{}s", PERIOD.as_secs());
    let node = Node::start_with(
        Backend::Iptables,
        &[
            ("REPAIR_ENABLED", "true"),
            ("REPAIR_NODE_NAME", NODE),
            ("REPAIR_REPAIR_PODS", "false"),
            ("REPAIR_LABEL_PODS", "true"),
            ("DRIFT_VERIFY_INTERVAL", period.as_str()),
            // Inside the node's own netns: no other listener there.
            ("MONITORING_PORT", "15014"),
        ],
    );
    node.namespace(NS, json!({}));
    node
}

/// A sidecar pod (CNI mode) that went through the real plugin ADD and runs.
fn sidecar_pod(node: &Node, name: &str, annotations: serde_json::Value) -> SidecarPod {
    let uid = unique_uid();
    let mut ann = annotations;
    ann["sidecar.istio.io/status"] =
        json!(r#"{"initContainers":["istio-validation"],"containers":["istio-proxy"]}"#);
    let pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "uid": uid, "annotations": ann},
        "spec": {"nodeName": NODE, "initContainers": [{"name": "istio-validation"}],
                 "containers": [{"name": "app"}, {"name": "istio-proxy", "args": ["proxy", "sidecar"]}]}
    }))
    .expect("Pod");
    node.api.server.add_pod(pod).expect("add pod");
    let netns = PodNs::new("hostile");
    let result = node
        .add(&netns, NS, name)
        .unwrap_or_else(|e| panic!("ADD of {name}: {e}"));
    let ip = result_ip(&result);
    // The sandbox's process first: a pass may run as soon as the pod says Running.
    let process = PodProcess::start(&netns, &uid);
    node.set_running(NS, name, &ip);
    SidecarPod {
        name: name.to_string(),
        netns,
        _process: process,
    }
}

/// The ordinary pods, ADDed by a few workers at once.
fn ordinary_pods(node: &Node) -> Vec<SidecarPod> {
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..ADD_WORKERS)
            .map(|w| {
                s.spawn(move || {
                    (w..ORDINARY)
                        .step_by(ADD_WORKERS)
                        .map(|i| sidecar_pod(node, &format!("web-{i:02}"), json!({})))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("ADD worker"))
            .collect()
    })
}

/// `iptables-save` of the pod's nat rules, without comments and chain counters.
fn rules(pod: &SidecarPod) -> String {
    pod.netns
        .guard
        .iptables_save()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split(" [").next().unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
}

fn metric(node: &Node, name: &str) -> u64 {
    let body = in_netns(std::path::Path::new(&node.ns.path()), move || {
        install_support::http_get(15014, "/metrics")
    })
    .expect("metrics")
    .1;
    let sample = format!("{name}{{kind=\"sidecar_rules\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&sample))
        .map_or(0, |v| v.trim().parse::<f64>().expect("a number") as u64)
}

fn events(node: &Node, pod: &str, reason: &str) -> Vec<String> {
    node.api
        .server
        .events()
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(pod))
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| e.message.unwrap_or_default())
        .collect()
}

/// One `sidecar drift pass` line's counts.
#[derive(Debug, Clone, Copy)]
struct Pass {
    verified: u64,
    healed: u64,
    failed: u64,
    over_budget: u64,
    duration_ms: u64,
}

fn field(line: &str, name: &str) -> u64 {
    let key = format!("{name}=");
    line.split_whitespace()
        .find_map(|word| word.strip_prefix(key.as_str()))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {line}"))
}

fn passes(node: &Node) -> Vec<Pass> {
    node.agent
        .output()
        .lines()
        .filter(|l| l.contains("sidecar drift pass") && l.contains("duration_ms="))
        .map(|l| Pass {
            verified: field(l, "verified"),
            healed: field(l, "healed"),
            failed: field(l, "failed"),
            over_budget: field(l, "over_budget"),
            duration_ms: field(l, "duration_ms"),
        })
        .collect()
}

#[test]
fn hostile_annotations_never_keep_a_pass_from_the_ordinary_pods() {
    let started = Instant::now();
    let node = start();
    let pods = ordinary_pods(&node);
    let adds = started.elapsed();
    let ports = vec!["80"; 50_000].join(",");
    let repeated = sidecar_pod(
        &node,
        "repeated-port",
        json!({"traffic.sidecar.istio.io/excludeOutboundPorts": ports}),
    );
    let cidrs: Vec<String> = (0..12_000)
        .map(|i| format!("10.{}.{}.0/24", 1 + i / 256, i % 256))
        .collect();
    let wide_started = Instant::now();
    let wide = sidecar_pod(
        &node,
        "wide",
        json!({"traffic.sidecar.istio.io/excludeOutboundIPRanges": cidrs.join(",")}),
    );
    let wide_add = wide_started.elapsed();
    // Both hostile pods were programmed for real: the repeats as one rule, every CIDR as its own.
    let repeated_rules = rules(&repeated);
    // One item's rules: a RETURN for TCP and one for UDP.
    let port_rules: Vec<&str> = repeated_rules
        .lines()
        .filter(|l| l.contains("--dport 80 -j RETURN"))
        .collect();
    assert_eq!(
        port_rules,
        [
            "-A ISTIO_OUTPUT -p tcp -m tcp --dport 80 -j RETURN",
            "-A ISTIO_OUTPUT -p udp -m udp --dport 80 -j RETURN"
        ],
        "{repeated_rules}"
    );
    let wide_returns = rules(&wide)
        .lines()
        .filter(|l| l.starts_with("-A ISTIO_OUTPUT -d 10.") && l.ends_with("-j RETURN"))
        .count();
    assert_eq!(wide_returns, 12_000);
    eprintln!(
        "{ORDINARY} ordinary ADDs in {} ms ({ADD_WORKERS} at once), the 12,000-CIDR ADD in {} ms",
        adds.as_millis(),
        wide_add.as_millis()
    );

    // A pass that saw every pod, then three more: each within its period, each verifying every
    // ordinary pod and the repeated-port one, never the pod over the budget.
    let ordinary = ORDINARY as u64 + 1;
    node.wait_until(
        HEAL_WITHIN * 2,
        "a pass over every ordinary pod (a pass stuck on a hostile pod never logs its line)",
        || passes(&node).iter().any(|p| p.verified >= ordinary),
    );
    let first = passes(&node)
        .iter()
        .position(|p| p.verified >= ordinary)
        .expect("a full pass");
    node.wait_until(HEAL_WITHIN * 3, "three more passes", || {
        passes(&node).len() > first + 3
    });
    let seen = passes(&node);
    for pass in &seen[first..] {
        assert!(
            pass.verified == ordinary && pass.failed == 0 && pass.healed == 0,
            "a pass did not verify exactly the {ordinary} pods under the budget: {pass:?}\n{seen:?}"
        );
        assert!(
            pass.duration_ms < PERIOD.as_millis() as u64,
            "a pass took longer than its period ({PERIOD:?}): {pass:?}\n{seen:?}"
        );
    }
    eprintln!("passes: {seen:?}");

    // The wide pod: reported once over the budget, never read again.
    let reported: u64 = seen.iter().map(|p| p.over_budget).sum();
    assert_eq!(reported, 1, "{seen:?}");
    let log = node.agent.output();
    let skips: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("sidecar drift check skips the pod"))
        .collect();
    assert_eq!(skips.len(), 1, "{skips:?}");
    assert!(
        skips[0].contains(&format!("{NS}/wide")) && skips[0].contains("10000"),
        "{skips:?}"
    );
    node.wait_until(Duration::from_secs(5), "the over-budget event", || {
        !events(&node, "wide", "RedirectionDriftUnhealed").is_empty()
    });
    let unhealed = events(&node, "wide", "RedirectionDriftUnhealed");
    assert_eq!(unhealed.len(), 1, "{unhealed:?}");
    assert!(unhealed[0].contains("more than the 10000"), "{unhealed:?}");
    assert_eq!(metric(&node, "istio_cni_drift_unhealed_total"), 1);

    // A rule deleted in an ordinary pod is healed within a pass, the hostile pods still there.
    let victim = &pods[ORDINARY / 2];
    let programmed = rules(victim);
    let out = victim
        .netns
        .guard
        .exec("iptables", &["-t", "nat", "-D", "ISTIO_OUTPUT", "1"]);
    assert!(out.status.success(), "{out:?}");
    assert_ne!(rules(victim), programmed, "no drift made");
    let broken = Instant::now();
    node.wait_until(HEAL_WITHIN, "the deleted rule healed", || {
        rules(victim) == programmed
    });
    eprintln!(
        "{}: healed in {} ms",
        victim.name,
        broken.elapsed().as_millis()
    );
    node.wait_until(Duration::from_secs(5), "the repaired count", || {
        metric(&node, "istio_cni_drift_repaired_total") == 1
    });
    let healed = events(&node, &victim.name, "RedirectionDriftRepaired");
    assert!(!healed.is_empty());
    assert_eq!(metric(&node, "istio_cni_drift_unhealed_total"), 1);
    assert_eq!(
        events(&node, "wide", "RedirectionDriftUnhealed").len(),
        1,
        "reported again"
    );
    eprintln!("whole test: {} ms", started.elapsed().as_millis());
}
