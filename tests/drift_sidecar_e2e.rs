//! Sidecar drift self-heal end to end: the real install-cni with REPAIR_ENABLED=true and
//! DRIFT_VERIFY_INTERVAL=2s on a test node (support/ambient_node.rs: its own netns, a real CNI
//! chain) on the real kube-apiserver (`Node::start_real_on`, the agent on the chart's own RBAC). Sidecar pods are programmed by the real plugin ADD; their netns
//! is found by the /proc scan. Then, in one pod: the nat table flushed, one rule deleted, the
//! PREROUTING jump into ISTIO_INBOUND replaced — each healed within one period (+ slack), counted
//! in `istio_cni_drift_repaired_total{kind="sidecar_rules"}` and posted as an event; a second,
//! untouched pod keeps its rule counters across several passes; the heals write nothing to the
//! server but their events (the audit log). A redirect annotation edited on a running pod (a
//! user's merge patch) goes to the repair policy (label mode: the pod is labelled through
//! `pods/status`, once) and its rules are not rewritten. The nftables backend once: a flushed chain and a deleted table healed, an
//! untouched pod's rule handles kept.

#[path = "support/ambient_node.rs"]
mod ambient_node;
mod install_support;
mod support;

use std::time::{Duration, Instant};

use ambient_node::{Backend, NODE, Node, PodNs, PodProcess, in_netns, result_ip, unique_uid};
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use support::real_cluster::RealCluster;

const NS: &str = "shop";
const LABEL: &str = "cni.istio.io/uninitialized";
/// One jittered period (2 s, +25%), a pass, and scheduling slack on a loaded 2-core machine.
const HEAL_WITHIN: Duration = Duration::from_secs(8);

fn start() -> Node {
    start_on(Backend::Iptables)
}

fn start_on(backend: Backend) -> Node {
    let cluster = RealCluster::start();
    let node_name = cluster.node(NODE);
    let node = Node::start_real_on(
        cluster,
        backend,
        &[
            ("REPAIR_ENABLED", "true"),
            ("REPAIR_NODE_NAME", &node_name),
            ("REPAIR_REPAIR_PODS", "false"),
            ("REPAIR_LABEL_PODS", "true"),
            ("DRIFT_VERIFY_INTERVAL", "2s"),
            // Inside the node's own netns: no other listener there.
            ("MONITORING_PORT", "15014"),
        ],
    );
    node.namespace(NS, json!({}));
    node
}

/// A sidecar pod (CNI mode) that went through the real plugin ADD and runs.
struct SidecarPod {
    netns: PodNs,
    _process: PodProcess,
    uid: String,
}

fn sidecar_pod(node: &Node, name: &str, annotations: serde_json::Value) -> SidecarPod {
    let pod = sidecar_pod_programmed(node, name, annotations);
    assert!(pod.netns.guard.iptables_save().contains("ISTIO_OUTPUT"));
    pod
}

fn sidecar_pod_programmed(node: &Node, name: &str, annotations: serde_json::Value) -> SidecarPod {
    let mut ann = annotations;
    ann["sidecar.istio.io/status"] =
        json!(r#"{"initContainers":["istio-validation"],"containers":["istio-proxy"]}"#);
    // The stand-in keeps the UID given (unique on the machine: the /proc scan sees every
    // process); the real server assigns its own.
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "uid": unique_uid(), "annotations": ann},
        "spec": {"nodeName": NODE,
                 "initContainers": [{"name": "istio-validation", "image": "proxyv2"}],
                 "containers": [{"name": "app", "image": "app:1"},
                                {"name": "istio-proxy", "image": "proxyv2",
                                 "args": ["proxy", "sidecar"]}]}
    }))
    .expect("Pod");
    let stored = match &node.real {
        Some((cluster, _)) => {
            cluster.add_pod(pod).expect("add pod");
            cluster.pod(NS, name).expect("pod stored")
        }
        None => node.api.server.add_pod(pod).expect("add pod"),
    };
    let uid = stored.metadata.uid.expect("uid");
    let netns = PodNs::new("drift");
    let result = node.add(&netns, NS, name).expect("ADD");
    let ip = result_ip(&result);
    // The sandbox's process first: a pass may run as soon as the pod says Running.
    let process = PodProcess::start(&netns, &uid);
    node.set_running(NS, name, &ip);
    SidecarPod {
        netns,
        _process: process,
        uid,
    }
}

fn exec(pod: &SidecarPod, args: &[&str]) {
    let out = pod.netns.guard.exec(args[0], &args[1..]);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `iptables-save` without comments and chain counters (rules, in order).
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

/// `iptables-save -c` without the timestamp comments: rule counters included.
fn counters(pod: &SidecarPod) -> String {
    let out = pod.netns.guard.exec("iptables-save", &["-c"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
}

fn metric(node: &Node, port: u16, name: &str) -> u64 {
    let body = in_netns(std::path::Path::new(&node.ns.path()), move || {
        install_support::http_get(port, "/metrics")
    })
    .expect("metrics")
    .1;
    let sample = format!("{name}{{kind=\"sidecar_rules\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&sample))
        .map_or(0, |v| v.trim().parse::<f64>().expect("a number") as u64)
}

/// Events about `pod` with `reason`, as the server stores them.
fn events(node: &Node, pod: &str, reason: &str) -> Vec<String> {
    node.cluster()
        .events(NS)
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(pod))
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| e.message.unwrap_or_default())
        .collect()
}

/// The agent's writes since the last `clear_requests`, as (verb, path).
fn writes(node: &Node) -> Vec<(String, String)> {
    node.cluster()
        .requests()
        .into_iter()
        .filter(|(verb, _)| !matches!(verb.as_str(), "get" | "list" | "watch"))
        .map(|(verb, uri)| (verb, uri.split('?').next().unwrap_or_default().to_string()))
        .collect()
}

fn events_path(node: &Node) -> String {
    format!("/api/v1/namespaces/{}/events", node.k8s_ns(NS))
}

fn passes(node: &Node) -> usize {
    node.agent
        .output()
        .lines()
        .filter(|l| l.contains("sidecar drift pass"))
        .count()
}

fn wait_passes(node: &Node, n: usize) {
    let target = passes(node) + n;
    node.wait_until(HEAL_WITHIN * n as u32, "drift passes", || {
        passes(node) >= target
    });
}

#[test]
fn drift_in_a_sidecar_pod_is_healed_and_an_untouched_pod_is_never_rewritten() {
    let node = start();
    let metrics = 15014;
    let web = sidecar_pod(&node, "web", json!({}));
    let quiet = sidecar_pod(&node, "quiet", json!({}));
    node.cluster().clear_requests();
    let programmed = rules(&web);
    node.wait_until(HEAL_WITHIN, "a pass verifying both pods", || {
        node.agent
            .output()
            .lines()
            .any(|l| l.contains("sidecar drift pass") && l.contains("verified=2"))
    });

    // A little traffic in the quiet pod (loopback, its own addresses): its counters move.
    let listener = quiet.netns.guard.path();
    let server = in_netns(&listener, || {
        std::net::TcpListener::bind("127.0.0.1:9000").expect("bind")
    });
    let connected = in_netns(&quiet.netns.guard.path(), || {
        std::net::TcpStream::connect_timeout(
            &"127.0.0.1:9000".parse().expect("addr"),
            Duration::from_secs(2),
        )
        .is_ok()
    });
    assert!(connected);
    drop(server);
    let quiet_before = counters(&quiet);
    assert!(
        quiet_before
            .lines()
            .any(|l| l.contains("ISTIO_OUTPUT") && !l.starts_with("[0:0]") && l.starts_with('[')),
        "{quiet_before}"
    );

    let cases: [(&str, &[&str]); 3] = [
        ("nat table flushed", &["iptables", "-t", "nat", "-F"]),
        (
            "one rule deleted",
            &["iptables", "-t", "nat", "-D", "ISTIO_OUTPUT", "1"],
        ),
        // Pointed at the wrong chain of ours (someone else's rule would stay: not ours to judge).
        (
            "PREROUTING jump replaced",
            &[
                "iptables",
                "-t",
                "nat",
                "-R",
                "PREROUTING",
                "1",
                "-p",
                "tcp",
                "-j",
                "ISTIO_REDIRECT",
            ],
        ),
    ];
    for (i, (what, cmd)) in cases.iter().enumerate() {
        exec(&web, cmd);
        assert_ne!(rules(&web), programmed, "{what}: no drift made");
        let started = Instant::now();
        while rules(&web) != programmed && started.elapsed() < HEAL_WITHIN {
            std::thread::sleep(Duration::from_millis(20));
        }
        let took = started.elapsed();
        assert_eq!(
            rules(&web),
            programmed,
            "{what}: not healed within {HEAL_WITHIN:?}"
        );
        node.wait_until(Duration::from_secs(5), "the repaired count", || {
            metric(&node, metrics, "istio_cni_drift_repaired_total") == i as u64 + 1
        });
        eprintln!("{what}: healed in {} ms", took.as_millis());
    }
    // Events reach the API server after the heal: wait for them, not race them.
    node.wait_until(Duration::from_secs(5), "the heal events", || {
        events(&node, "web", "RedirectionDriftRepaired").len() >= 3
    });
    let healed = events(&node, "web", "RedirectionDriftRepaired");
    assert_eq!(healed.len(), 3, "{healed:?}");
    assert!(
        healed.iter().all(|m| m.contains("re-programmed")),
        "{healed:?}"
    );
    assert_eq!(metric(&node, metrics, "istio_cni_drift_unhealed_total"), 0);

    // The untouched pod: several more passes, counters exactly as they were (never rewritten).
    wait_passes(&node, 3);
    assert_eq!(counters(&quiet), quiet_before);
    assert!(events(&node, "quiet", "RedirectionDriftRepaired").is_empty());
    let log = node.agent.output();
    assert!(
        !log.lines()
            .any(|l| l.contains("drift repaired")
                && l.contains(&format!("{}/quiet", node.k8s_ns(NS)))),
        "{log}"
    );
    // The heals wrote nothing to the server but their events.
    assert_eq!(
        writes(&node),
        vec![("create".to_string(), events_path(&node)); 3]
    );
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains("sidecar drift pass"))
        .expect("a pass line");
    assert!(
        line.contains("verified=2") && line.contains("duration_ms="),
        "{line}"
    );
    eprintln!("last pass: {line}");
    let _ = web.uid;
}

#[test]
fn an_annotation_edited_on_a_running_pod_goes_to_the_repair_policy_once() {
    let node = start();
    let metrics = 15014;
    let web = sidecar_pod(&node, "web", json!({}));
    node.wait_until(HEAL_WITHIN, "a pass verifying the pod", || {
        node.agent
            .output()
            .lines()
            .any(|l| l.contains("sidecar drift pass") && l.contains("verified=1"))
    });
    let programmed = counters(&web);

    node.cluster().clear_requests();
    node.cluster().merge_patch_pod(
        NS,
        "web",
        json!({"metadata": {"annotations": {
            "traffic.sidecar.istio.io/excludeOutboundPorts": "9000"}}}),
    );
    node.wait_until(HEAL_WITHIN, "the label", || {
        node.get_pod(NS, "web")
            .and_then(|p| p.metadata.labels)
            .is_some_and(|l| l.get(LABEL).map(String::as_str) == Some("true"))
    });
    node.wait_until(Duration::from_secs(5), "the unhealed event", || {
        !events(&node, "web", "RedirectionDriftUnhealed").is_empty()
    });
    let unhealed = events(&node, "web", "RedirectionDriftUnhealed");
    assert_eq!(unhealed.len(), 1, "{unhealed:?}");
    assert!(unhealed[0].contains("excludeOutboundPorts"), "{unhealed:?}");
    node.wait_until(Duration::from_secs(5), "the label event", || {
        events(&node, "web", "LabelBrokenPod").len() == 1
    });
    // And once only: a drift in its netns is not healed to either derivation meanwhile.
    exec(&web, &["iptables", "-t", "nat", "-D", "ISTIO_OUTPUT", "1"]);
    let drifted = counters(&web);
    assert_ne!(drifted, programmed);
    wait_passes(&node, 3);
    assert_eq!(counters(&web), drifted, "rewritten");
    assert_eq!(events(&node, "web", "RedirectionDriftUnhealed").len(), 1);
    assert_eq!(events(&node, "web", "LabelBrokenPod").len(), 1);
    assert_eq!(metric(&node, metrics, "istio_cni_drift_unhealed_total"), 1);
    assert_eq!(metric(&node, metrics, "istio_cni_drift_repaired_total"), 0);
    // The label through `pods/status` (what the chart grants), once; the two events.
    let mut seen = writes(&node);
    seen.sort();
    let status = format!("/api/v1/namespaces/{}/pods/web/status", node.k8s_ns(NS));
    let created = ("create".to_string(), events_path(&node));
    assert_eq!(
        seen,
        vec![created.clone(), created, ("patch".to_string(), status)]
    );
    let _ = web.uid;
}

/// `nft list ruleset` of the pod (`-a`: with rule handles, which a rewrite changes).
fn nft(pod: &SidecarPod, handles: bool) -> String {
    let args: &[&str] = if handles {
        &["-a", "list", "ruleset"]
    } else {
        &["list", "ruleset"]
    };
    let out = pod.netns.guard.exec("nft", args);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn nftables_drift_is_healed_and_an_untouched_pod_keeps_its_rule_handles() {
    let node = start_on(Backend::Nftables);
    let web = sidecar_pod_nft(&node, "web");
    let quiet = sidecar_pod_nft(&node, "quiet");
    let programmed = nft(&web, false);
    node.wait_until(HEAL_WITHIN, "a pass verifying both pods", || {
        node.agent
            .output()
            .lines()
            .any(|l| l.contains("sidecar drift pass") && l.contains("verified=2"))
    });
    let quiet_before = nft(&quiet, true);

    let cases: [(&str, &[&str]); 2] = [
        (
            "a chain flushed",
            &[
                "nft",
                "flush",
                "chain",
                "inet",
                "istio-proxy-nat",
                "istio-output",
            ],
        ),
        (
            "the table deleted",
            &["nft", "delete", "table", "inet", "istio-proxy-nat"],
        ),
    ];
    for (i, (what, cmd)) in cases.iter().enumerate() {
        exec(&web, cmd);
        assert_ne!(nft(&web, false), programmed, "{what}: no drift made");
        let started = Instant::now();
        while nft(&web, false) != programmed && started.elapsed() < HEAL_WITHIN {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(nft(&web, false), programmed, "{what}: not healed");
        eprintln!("{what}: healed in {} ms", started.elapsed().as_millis());
        node.wait_until(Duration::from_secs(5), "the repaired count", || {
            metric(&node, 15014, "istio_cni_drift_repaired_total") == i as u64 + 1
        });
    }
    wait_passes(&node, 3);
    assert_eq!(
        nft(&quiet, true),
        quiet_before,
        "the untouched pod was rewritten"
    );
    let healed = events(&node, "web", "RedirectionDriftRepaired");
    assert_eq!(healed.len(), 2, "{healed:?}");
    // The event names what drifted: the flushed chain, then the deleted (only) table.
    assert!(
        healed.iter().any(|m| m.contains("istio-output")),
        "{healed:?}"
    );
    assert!(
        healed.iter().any(|m| m.contains("no rules of ours at all")),
        "{healed:?}"
    );
    assert_eq!(metric(&node, 15014, "istio_cni_drift_unhealed_total"), 0);
}

/// [`sidecar_pod`] on the nftables backend: the plugin created our `istio-proxy-*` tables.
fn sidecar_pod_nft(node: &Node, name: &str) -> SidecarPod {
    let pod = sidecar_pod_programmed(node, name, json!({}));
    assert!(
        nft(&pod, false).contains("istio-proxy-nat"),
        "{}",
        nft(&pod, false)
    );
    pod
}

/// install-cni's CPU seconds so far, its reaped children's (the `*-save` processes) included.
fn cpu_seconds(node: &Node) -> f64 {
    let pid = node.agent.child.id();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    // Fields after the `(comm)`: utime, stime, cutime, cstime are the 14th-17th of the line.
    let rest = stat.rsplit_once(')').expect("comm").1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11..15]
        .iter()
        .map(|f| f.parse::<u64>().expect("ticks"))
        .sum();
    ticks as f64
        / nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .unwrap_or(100) as f64
}

/// The `duration_ms` of every `sidecar drift pass` line verifying `n` pods.
fn pass_durations(node: &Node, n: usize) -> Vec<u64> {
    node.agent
        .output()
        .lines()
        .filter(|l| l.contains("sidecar drift pass") && l.contains(&format!("verified={n} ")))
        .filter_map(|l| l.split("duration_ms=").nth(1)?.trim().parse().ok())
        .collect()
}

/// Benchmark (ignored; `scripts/bench` runs it against the release binary): one drift pass over
/// `BENCH_DRIFT_PODS` (250) sidecar pods programmed by the real plugin, every one in place — the
/// pass's wall time, install-cni's CPU per pass (its `*-save` children included) and its RSS.
/// Prints Markdown table rows. On the test API server (a benchmark needs no Go).
#[test]
#[ignore]
fn sidecar_drift_pass_cost() {
    let n: usize = std::env::var("BENCH_DRIFT_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(250)
        .min(250);
    let node = Node::start_with(
        Backend::Iptables,
        &[
            ("REPAIR_ENABLED", "true"),
            ("REPAIR_NODE_NAME", NODE),
            ("REPAIR_REPAIR_PODS", "false"),
            ("REPAIR_LABEL_PODS", "true"),
            ("DRIFT_VERIFY_INTERVAL", "15s"),
        ],
    );
    node.namespace(NS, json!({}));
    let idle = ambient_node::rss_mb(&node);
    let pods: Vec<SidecarPod> = (0..n)
        .map(|i| sidecar_pod(&node, &format!("s{i}"), json!({})))
        .collect();
    node.wait_until(Duration::from_secs(120), "a pass over every pod", || {
        !pass_durations(&node, n).is_empty()
    });
    // Two whole periods measured from the end of a pass: exactly two passes in them.
    let seen = pass_durations(&node, n).len();
    let cpu_before = cpu_seconds(&node);
    node.wait_until(Duration::from_secs(120), "two more passes", || {
        pass_durations(&node, n).len() >= seen + 2
    });
    let cpu = (cpu_seconds(&node) - cpu_before) / 2.0;
    let rss = ambient_node::rss_mb(&node);
    let mut durations = pass_durations(&node, n)[seen..seen + 2].to_vec();
    durations.sort_unstable();
    let label = format!("{}", node.agent.output().matches("drift repaired").count());
    assert_eq!(label, "0", "nothing drifted, nothing may be rewritten");
    println!("| measurement | value | target |");
    println!("| --- | --- | --- |");
    println!(
        "| sidecar drift pass over {n} pods in place (one /proc scan, one iptables-save each) | {} ms wall, {cpu:.2} s CPU (install-cni + its iptables-save processes) | within one period (60 s default) |",
        durations[1]
    );
    println!(
        "| install-cni RSS (repair, label mode, + ambient agent) idle / with {n} sidecar pods verified | {idle:.1} MB / {rss:.1} MB ({:+.1} MB) | |",
        rss - idle
    );
    drop(pods);
}
