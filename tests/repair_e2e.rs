//! The repair controller end to end (issue 12): the real install-cni with REPAIR_ENABLED=true on
//! an ambient test node (its own netns, the test API server inside it; see
//! support/ambient_node.rs), sharing the one node pod store with the agent. A sidecar pod whose
//! `istio-validation` init container last exited 126 is repaired (its netns, found by the /proc
//! scan, gets the sidecar rules: a real outbound connection lands on 15001), deleted, or
//! labelled, by mode; a pod on another node, one without the sidecar annotation, one whose init
//! container failed with another code, and a healthy one are untouched; a pod added while the API
//! server is down (history compacted) is still found after the watch reconnects; a pod with an
//! unusable redirect annotation gets one event naming it and is not retried. A hostNetwork pod
//! dressed as broken is never acted on, the node's netns is never taken as a pod's, and where
//! the node's netns cannot be identified no pod netns is entered and readiness says why.

#[path = "support/ambient_node.rs"]
mod ambient_node;
mod install_support;
#[path = "support/lifecycle.rs"]
mod lifecycle;
mod support;

use std::time::Duration;

use ambient_node::{Backend, NODE, Node, PodProcess, unique_uid};
use lifecycle::HEALTH_PORT;
use serde_json::{Value, json};
use support::node_proc::HostProcView;
use support::{PodAndServer, assert_outbound_redirected};

const NS: &str = "shop";
const LABEL: &str = "cni.istio.io/uninitialized";
const T: Duration = Duration::from_secs(20);

/// The validation container's status: crash-looping after exit `code`, or completed.
fn validation(code: Option<i32>) -> Value {
    let (state, last) = match code {
        Some(code) => (
            json!({"waiting": {"reason": "CrashLoopBackOff"}}),
            json!({"terminated": {"exitCode": code, "reason": "Error"}}),
        ),
        None => (
            json!({"terminated": {"exitCode": 0, "reason": "Completed"}}),
            json!({}),
        ),
    };
    json!([{"name": "istio-validation", "ready": code.is_none(), "restartCount": 3,
            "image": "proxyv2", "imageID": "", "state": state, "lastState": last}])
}

/// A sidecar-injected pod (CNI mode: a validation init container, no istio-init).
struct PodSpec<'a> {
    name: &'a str,
    node: &'a str,
    annotated: bool,
    exit_code: Option<i32>,
    ip: &'a str,
    extra_annotations: Value,
}

impl<'a> PodSpec<'a> {
    fn broken(name: &'a str, ip: &'a str) -> Self {
        PodSpec {
            name,
            node: NODE,
            annotated: true,
            exit_code: Some(126),
            ip,
            extra_annotations: json!({}),
        }
    }
}

fn add_pod(node: &Node, p: PodSpec<'_>) -> String {
    let uid = unique_uid();
    let mut annotations = p.extra_annotations.clone();
    if p.annotated {
        annotations["sidecar.istio.io/status"] =
            json!(r#"{"initContainers":["istio-validation"],"containers":["istio-proxy"]}"#);
    }
    let pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": p.name, "namespace": NS, "uid": uid, "annotations": annotations},
        "spec": {
            "nodeName": p.node,
            "initContainers": [{"name": "istio-validation"}],
            "containers": [{"name": "app"},
                           {"name": "istio-proxy", "args": ["proxy", "sidecar"]}]
        },
        "status": {"phase": "Pending", "podIP": p.ip, "podIPs": [{"ip": p.ip}],
                   "initContainerStatuses": validation(p.exit_code)}
    }))
    .expect("Pod");
    node.api.server.add_pod(pod).expect("add pod");
    uid
}

/// The pods no mode may touch; returns their names.
fn bystanders(node: &Node) -> Vec<&'static str> {
    let cases: [(&'static str, &str, bool, Option<i32>); 4] = [
        ("other-node", "node-2", true, Some(126)),
        ("no-sidecar", NODE, false, Some(126)),
        ("other-code", NODE, true, Some(1)),
        ("healthy", NODE, true, None),
    ];
    for (name, on, annotated, exit_code) in cases {
        add_pod(
            node,
            PodSpec {
                name,
                node: on,
                annotated,
                exit_code,
                ip: "10.250.0.9",
                extra_annotations: json!({}),
            },
        );
    }
    cases.iter().map(|c| c.0).collect()
}

fn start(mode: &str) -> Node {
    let node = Node::start_with(
        Backend::Iptables,
        &[
            ("REPAIR_ENABLED", "true"),
            ("REPAIR_NODE_NAME", NODE),
            (mode, "true"),
            (
                "REPAIR_REPAIR_PODS",
                if mode == "REPAIR_REPAIR_PODS" {
                    "true"
                } else {
                    "false"
                },
            ),
        ],
    );
    node.namespace(NS, json!({}));
    node
}

/// Events the controller recorded about `pod`, as "reason: message".
fn events_of(node: &Node, pod: &str) -> Vec<String> {
    node.api
        .server
        .events()
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(pod))
        .map(|e| {
            assert_eq!(
                e.source.and_then(|s| s.component).as_deref(),
                Some("cni-repair")
            );
            format!(
                "{}: {}",
                e.reason.unwrap_or_default(),
                e.message.unwrap_or_default()
            )
        })
        .collect()
}

fn label_of(node: &Node, pod: &str) -> Option<String> {
    node.api
        .server
        .pod(NS, pod)?
        .metadata
        .labels?
        .get(LABEL)
        .cloned()
}

/// Nothing happened to the bystanders: no event, no label, still there, and the controller never
/// called them broken.
fn assert_untouched(node: &Node, names: &[&str]) {
    let log = node.agent.output();
    for name in names {
        assert!(
            events_of(node, name).is_empty(),
            "{name}: {:?}",
            events_of(node, name)
        );
        assert_eq!(label_of(node, name), None, "{name} labelled");
        assert!(
            log.lines()
                .filter(|l| l.contains("broken pod detected"))
                .all(|l| !l.contains(&format!("{NS}/{name}"))),
            "{name} was called broken:\n{log}"
        );
    }
    for name in names.iter().filter(|n| **n != "other-node") {
        assert!(node.api.server.pod(NS, name).is_some(), "{name} deleted");
    }
}

#[test]
fn repair_mode_programs_the_broken_pods_netns_and_leaves_the_rest_alone() {
    let node = start("REPAIR_REPAIR_PODS");
    let names = bystanders(&node);
    // The broken pod's sandbox: a netns with its IP and a process in a cgroup naming its UID.
    let env = PodAndServer::new("rep");
    let uid = add_pod(&node, PodSpec::broken("web", &env.pod_ip));
    let _process = PodProcess::start_in(std::path::Path::new(&env.pod.path()), &uid);
    node.wait_until(T, "the pod's repair event", || {
        !events_of(&node, "web").is_empty()
    });
    let events = events_of(&node, "web");
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(events[0].starts_with("RepairBrokenPod: "), "{events:?}");
    assert!(env.pod.iptables_state().contains("ISTIO_OUTPUT"));
    assert_outbound_redirected(&env);
    let log = node.agent.output();
    assert!(
        log.lines().any(|l| l.contains("broken pod handled")
            && l.contains("shop/web")
            && l.contains("repair")),
        "{log}"
    );

    // An unusable annotation: one event naming it, no retries (the pod stays broken and keeps
    // changing, as a crash-looping pod does).
    let bad = add_pod(
        &node,
        PodSpec {
            extra_annotations: json!({"traffic.sidecar.istio.io/excludeOutboundPorts": "http"}),
            ..PodSpec::broken("bad", "10.250.0.7")
        },
    );
    node.wait_until(T, "the invalid annotation event", || {
        !events_of(&node, "bad").is_empty()
    });
    for restarts in 4..8 {
        let mut pod = node.api.server.pod(NS, "bad").expect("bad");
        let status = pod.status.as_mut().expect("status");
        status.init_container_statuses.as_mut().expect("statuses")[0].restart_count = restarts;
        node.api.server.update_pod(pod).expect("update");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(1));
    let events = events_of(&node, "bad");
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(
        events[0].contains("traffic.sidecar.istio.io/excludeOutboundPorts"),
        "{events:?}"
    );
    let log = node.agent.output();
    let attempts = log
        .lines()
        .filter(|l| l.contains("broken pod detected") && l.contains("shop/bad"))
        .count();
    assert_eq!(attempts, 1, "retried {bad}:\n{log}");
    assert_untouched(&node, &names);
}

#[test]
fn delete_mode_deletes_the_broken_pod_only() {
    let node = start("REPAIR_DELETE_PODS");
    let names = bystanders(&node);
    add_pod(&node, PodSpec::broken("web", "10.250.0.5"));
    node.wait_until(T, "the broken pod's deletion", || {
        node.api.server.pod(NS, "web").is_none()
    });
    node.wait_until(T, "the delete event", || {
        !events_of(&node, "web").is_empty()
    });
    let events = events_of(&node, "web");
    assert!(events[0].starts_with("DeleteBrokenPod: "), "{events:?}");
    assert_untouched(&node, &names);
}

#[test]
fn label_mode_labels_the_broken_pod_and_a_watch_restart_misses_nothing() {
    let node = start("REPAIR_LABEL_PODS");
    let names = bystanders(&node);
    add_pod(&node, PodSpec::broken("web", "10.250.0.5"));
    node.wait_until(T, "the broken pod's label", || {
        label_of(&node, "web").as_deref() == Some("true")
    });
    node.wait_until(T, "the label event", || !events_of(&node, "web").is_empty());
    assert!(events_of(&node, "web")[0].starts_with("LabelBrokenPod: "));

    // The API server goes away; a pod breaks meanwhile; the watch comes back (re-list).
    node.api.restart(std::path::Path::new(&node.ns.path()), || {
        add_pod(&node, PodSpec::broken("late", "10.250.0.6"));
    });
    node.wait_until(Duration::from_secs(60), "the late pod's label", || {
        label_of(&node, "late").as_deref() == Some("true")
    });
    node.wait_until(T, "the late pod's event", || {
        !events_of(&node, "late").is_empty()
    });
    assert_untouched(&node, &names);
    // Labelled once each.
    assert_eq!(events_of(&node, "web").len(), 1);
    assert_eq!(events_of(&node, "late").len(), 1);
}

/// A pod author's hostNetwork pod made to look broken: the sidecar annotation, an istio-proxy
/// container, the validation container's last exit 126, the node's IP, and a process in its pod
/// cgroup inside the node's netns (where a hostNetwork pod's processes run).
fn add_host_network_pod(node: &Node, name: &str, ip: &str) -> (String, PodProcess) {
    let uid = unique_uid();
    let pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "uid": uid, "annotations": {
            "sidecar.istio.io/status":
                r#"{"initContainers":["istio-validation"],"containers":["istio-proxy"]}"#}},
        "spec": {
            "nodeName": NODE, "hostNetwork": true,
            "initContainers": [{"name": "istio-validation"}],
            "containers": [{"name": "app"}, {"name": "istio-proxy", "args": ["proxy", "sidecar"]}]
        },
        "status": {"phase": "Pending", "podIP": ip, "podIPs": [{"ip": ip}],
                   "initContainerStatuses": validation(Some(126))}
    }))
    .expect("Pod");
    node.api.server.add_pod(pod).expect("add pod");
    let process = PodProcess::start_in(std::path::Path::new(&node.ns.path()), &uid);
    (uid, process)
}

/// The node netns holds `ip` (a hostNetwork pod's IP is the node's).
fn give_node_ip(node: &Node, ip: &str) {
    node.ns
        .exec("ip", &["addr", "add", &format!("{ip}/32"), "dev", "lo"]);
}

/// The sidecar chains in the node netns' nat table (none may ever be there).
fn node_sidecar_chains(node: &Node) -> Vec<String> {
    node.ns
        .iptables_state()
        .lines()
        .filter(|l| l.contains("ISTIO_INBOUND") || l.contains("ISTIO_OUTPUT"))
        .map(String::from)
        .collect()
}

#[test]
fn a_host_network_pod_is_never_repaired_and_the_node_s_netns_is_never_taken_as_a_pod_s() {
    let node = start("REPAIR_REPAIR_PODS");
    give_node_ip(&node, "10.250.9.9");
    let (_, _host_process) = add_host_network_pod(&node, "hostnet", "10.250.9.9");
    node.wait_until(T, "the hostNetwork pod skipped", || {
        node.agent.output().lines().any(|l| {
            l.contains("broken pod skipped")
                && l.contains("shop/hostnet")
                && l.contains("hostNetwork pod")
        })
    });
    // The same pod without `hostNetwork` (its process still in the node's netns, holding its IP):
    // the /proc scan never takes the node's (and the agent's) netns as the pod's.
    let uid = add_pod(&node, PodSpec::broken("disguised", "10.250.9.9"));
    let _process = PodProcess::start_in(std::path::Path::new(&node.ns.path()), &uid);
    node.wait_until(T, "the disguised pod given up on", || {
        !events_of(&node, "disguised").is_empty()
    });
    let events = events_of(&node, "disguised");
    assert!(
        events[0].contains("repair failed: no process of pod"),
        "{events:?}"
    );
    assert!(events_of(&node, "hostnet").is_empty());
    assert_eq!(node_sidecar_chains(&node), Vec::<String>::new());
}

#[test]
fn where_the_node_s_netns_cannot_be_identified_no_pod_netns_is_entered_and_readiness_says_why() {
    let unreadable = HostProcView::pid1_unreadable();
    let dir = unreadable.dir.to_str().expect("utf-8").to_string();
    let node = Node::start_with(
        Backend::Iptables,
        &[
            ("REPAIR_ENABLED", "true"),
            ("REPAIR_NODE_NAME", NODE),
            ("REPAIR_REPAIR_PODS", "true"),
            ("DRIFT_VERIFY_INTERVAL", "1s"),
            ("HEALTH_PORT", HEALTH_PORT),
            ("HOST_PROC_DIR", &dir),
        ],
    );
    node.namespace(NS, json!({}));
    give_node_ip(&node, "10.250.9.9");
    // A hostNetwork pod dressed as broken whose `hostNetwork` the author left out: only its
    // process and IP say where it runs (the node's netns, which is the agent's own here).
    let uid = add_pod(&node, PodSpec::broken("disguised", "10.250.9.9"));
    let _host_process = PodProcess::start_in(std::path::Path::new(&node.ns.path()), &uid);
    // And an ordinary broken pod: refused too (no netns is anyone's while the node's is unknown).
    let env = PodAndServer::new("unk");
    let uid = add_pod(&node, PodSpec::broken("web", &env.pod_ip));
    let _process = PodProcess::start_in(std::path::Path::new(&env.pod.path()), &uid);
    for pod in ["disguised", "web"] {
        node.wait_until(T, "the refusal event", || !events_of(&node, pod).is_empty());
        let events = events_of(&node, pod);
        assert_eq!(events.len(), 1, "{events:?}");
        assert!(
            events[0].contains("not looking for the pod's network namespace: cannot identify the node's network namespace"),
            "{events:?}"
        );
    }
    assert_eq!(node_sidecar_chains(&node), Vec::<String>::new());
    assert!(!env.pod.iptables_state().contains("ISTIO_OUTPUT"));
    let (code, body) = lifecycle::get(&node, HEALTH_PORT, "/readyz");
    assert_eq!(code, 503, "{body}");
    for component in [
        "agent (refusing to enter pod network namespaces: cannot identify the node's network namespace",
        "repair (refusing",
    ] {
        assert!(body.contains(component), "{component} missing: {body}");
    }
    assert!(body.contains(&format!("{dir}/1/ns/net")), "{body}");
    let log = node.agent.output();
    assert!(
        log.contains("sidecar drift check off (fail closed)"),
        "{log}"
    );
}

/// Benchmark (ignored; `scripts/bench` runs it against the release binary): install-cni's RSS
/// with repair on (label mode, so broken pods need no netns) — idle, then with 110 sidecar pods
/// on this node (10 of them broken and labelled) and 10,000 pods of other nodes in the API
/// server, then after 3,000 of those were deleted and recreated. Prints Markdown table rows.
#[test]
#[ignore]
fn install_cni_rss_with_repair_flat_under_churn() {
    use ambient_node::rss_mb;
    let env_usize = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let here = env_usize("BENCH_REPAIR_NODE_PODS", 110);
    let others = env_usize("BENCH_REPAIR_OTHER_PODS", 10_000);
    let churn = env_usize("BENCH_REPAIR_CHURN", 3000).min(others);
    let broken = 10.min(here);
    let node = start("REPAIR_LABEL_PODS");
    node.namespace("elsewhere", json!({}));
    std::thread::sleep(Duration::from_secs(2));
    let idle = rss_mb(&node);
    node.add_other_node_pods(others);
    let names: Vec<String> = (0..here).map(|i| format!("s{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        let ip = format!("10.251.{}.{}", i / 250, i % 250 + 2);
        let exit_code = if i < broken { Some(126) } else { None };
        add_pod(
            &node,
            PodSpec {
                exit_code,
                ..PodSpec::broken(name, &ip)
            },
        );
    }
    node.wait_until(Duration::from_secs(60), "the broken pods labelled", || {
        names[..broken].iter().all(|n| label_of(&node, n).is_some())
    });
    std::thread::sleep(Duration::from_secs(2));
    let loaded = rss_mb(&node);
    node.churn_other_node_pods(churn);
    let churned = rss_mb(&node);
    assert!(names[broken..].iter().all(|n| label_of(&node, n).is_none()));

    println!("| measurement | value | target |");
    println!("| --- | --- | --- |");
    println!("| install-cni RSS, repair (label mode) + ambient agent, no pods | {idle:.1} MB | |");
    println!(
        "| RSS with {here} sidecar pods on this node ({broken} broken, labelled) and {others} pods of other nodes | {loaded:.1} MB ({:+.1} MB) | within 5 MB of idle |",
        loaded - idle
    );
    println!(
        "| RSS after {churn} of the other nodes' pods were deleted and recreated | {churned:.1} MB ({:+.1} MB) | flat |",
        churned - loaded
    );
}
