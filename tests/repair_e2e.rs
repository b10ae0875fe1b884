//! The repair controller end to end: the real install-cni with REPAIR_ENABLED=true on an ambient
//! test node (its own netns; see support/ambient_node.rs) on the real kube-apiserver
//! (`Node::start_real_on`, the agent on the chart's own RBAC), sharing the one node pod store
//! with the agent. A sidecar pod whose `istio-validation` init container last exited 126 is
//! repaired (its netns, found by the /proc scan, gets the sidecar rules: a real outbound
//! connection lands on 15001), deleted (the server marks it for deletion with its grace period,
//! as no kubelet confirms it, and the controller deletes it once), or labelled (through
//! `pods/status`), by mode; what the agent asked of the server is read from its audit log. A pod
//! on another node, one without the sidecar annotation, one whose init container failed with
//! another code, and a healthy one are untouched; a pod with an unusable redirect annotation
//! gets one event naming it and is not retried. A hostNetwork pod dressed as broken is never
//! acted on, the node's netns is never taken as a pod's, and where the node's netns cannot be
//! identified no pod netns is entered and readiness says why.
//!
//! On the in-repo test API server still: a pod added while the API server is down (its history
//! compacted) is found after the watch reconnects (a real server is not stopped on demand), and
//! the RSS benchmark.

#[path = "support/ambient_node.rs"]
mod ambient_node;
mod install_support;
#[path = "support/lifecycle.rs"]
mod lifecycle;
mod support;

use std::time::Duration;

use ambient_node::{Backend, NODE, Node, PodProcess, unique_uid};
use k8s_openapi::api::core::v1::{Event, Pod};
use lifecycle::HEALTH_PORT;
use serde_json::{Value, json};
use support::node_proc::HostProcView;
use support::real_cluster::RealCluster;
use support::{PodAndServer, assert_outbound_redirected};

const NS: &str = "shop";
const LABEL: &str = "cni.istio.io/uninitialized";
const T: Duration = Duration::from_secs(20);

/// The validation container's status: crash-looping after exit `code` (restarted `restarts`
/// times), or completed.
fn validation_after(code: Option<i32>, restarts: i32) -> Value {
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
    json!([{"name": "istio-validation", "ready": code.is_none(), "restartCount": restarts,
            "image": "proxyv2", "imageID": "", "state": state, "lastState": last}])
}

fn validation(code: Option<i32>) -> Value {
    validation_after(code, 3)
}

/// A sidecar-injected pod (CNI mode: a validation init container, no istio-init).
struct PodSpec<'a> {
    name: &'a str,
    node: &'a str,
    annotated: bool,
    exit_code: Option<i32>,
    ip: &'a str,
    extra_annotations: Value,
    host_network: bool,
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
            host_network: false,
        }
    }
}

/// Adds the pod (scheduled, its status written as a kubelet does); returns the UID it got.
fn add_pod(node: &Node, p: PodSpec<'_>) -> String {
    let mut annotations = p.extra_annotations.clone();
    if p.annotated {
        annotations["sidecar.istio.io/status"] =
            json!(r#"{"initContainers":["istio-validation"],"containers":["istio-proxy"]}"#);
    }
    // The stand-in keeps the UID given (unique on the machine: the /proc scan sees every
    // process); the real server assigns its own.
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": p.name, "namespace": NS, "uid": unique_uid(),
                     "annotations": annotations},
        "spec": {
            "nodeName": p.node, "hostNetwork": p.host_network,
            "initContainers": [{"name": "istio-validation", "image": "proxyv2"}],
            "containers": [{"name": "app", "image": "app:1"},
                           {"name": "istio-proxy", "image": "proxyv2",
                            "args": ["proxy", "sidecar"]}]
        },
        "status": {"phase": "Pending", "podIP": p.ip, "podIPs": [{"ip": p.ip}],
                   "initContainerStatuses": validation(p.exit_code)}
    }))
    .expect("Pod");
    let stored = match &node.real {
        Some((cluster, _)) => {
            cluster.add_pod(pod).expect("add pod");
            cluster.pod(NS, p.name).expect("pod stored")
        }
        None => node.api.server.add_pod(pod).expect("add pod"),
    };
    stored.metadata.uid.expect("uid")
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
                ..PodSpec::broken(name, "10.250.0.9")
            },
        );
    }
    cases.iter().map(|c| c.0).collect()
}

/// install-cni's repair settings for `mode` on the node the server knows as `node_name`.
fn repair_env<'a>(mode: &'a str, node_name: &'a str) -> Vec<(&'a str, &'a str)> {
    let repair = if mode == "REPAIR_REPAIR_PODS" {
        "true"
    } else {
        "false"
    };
    vec![
        ("REPAIR_ENABLED", "true"),
        ("REPAIR_NODE_NAME", node_name),
        (mode, "true"),
        ("REPAIR_REPAIR_PODS", repair),
    ]
}

/// A node on the real API server with repair in `mode` (and `extra` settings).
fn start_real(mode: &str, extra: &[(&str, &str)]) -> Node {
    let cluster = RealCluster::start();
    let node_name = cluster.node(NODE);
    let mut env = repair_env(mode, &node_name);
    env.extend_from_slice(extra);
    let node = Node::start_real_on(cluster, Backend::Iptables, &env);
    node.namespace(NS, json!({}));
    node
}

fn start(mode: &str) -> Node {
    start_real(mode, &[])
}

/// A node on the in-repo test API server (what a real server cannot do on demand).
fn start_standin(mode: &str) -> Node {
    let node = Node::start_with(Backend::Iptables, &repair_env(mode, NODE));
    node.namespace(NS, json!({}));
    node
}

/// The Events about `pod` as the API server stores them.
fn stored_events(node: &Node, pod: &str) -> Vec<Event> {
    let events = match &node.real {
        Some((cluster, _)) => cluster.events(NS),
        None => node.api.server.events(),
    };
    events
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(pod))
        .collect()
}

/// Events the controller recorded about `pod`, as "reason: message".
fn events_of(node: &Node, pod: &str) -> Vec<String> {
    stored_events(node, pod)
        .into_iter()
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
    node.get_pod(NS, pod)?.metadata.labels?.get(LABEL).cloned()
}

/// The agent's requests naming pod `name` of the test's namespace on the real server (its
/// subresources included), as (verb, path after the pod's name).
fn pod_writes(node: &Node, name: &str) -> Vec<(String, String)> {
    let cluster = node.cluster();
    let prefix = format!("/api/v1/namespaces/{}/pods/{name}", cluster.ns(NS));
    cluster
        .requests()
        .into_iter()
        .filter(|(verb, _)| !matches!(verb.as_str(), "get" | "list" | "watch"))
        .filter_map(|(verb, uri)| {
            let rest = uri.split('?').next()?.strip_prefix(&prefix)?;
            (rest.is_empty() || rest.starts_with('/')).then(|| (verb, rest.to_string()))
        })
        .collect()
}

/// Nothing happened to the bystanders: no event, no label, no write by the agent, still there
/// (not marked for deletion), and the controller never called them broken.
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
                .all(|l| !l.contains(&format!("{}/{name}", node.k8s_ns(NS)))),
            "{name} was called broken:\n{log}"
        );
        if node.real.is_some() {
            assert_eq!(pod_writes(node, name), vec![], "{name} written");
        }
        let pod = node.get_pod(NS, name);
        assert!(pod.is_some(), "{name} deleted");
        assert_eq!(pod.and_then(|p| p.metadata.deletion_timestamp), None);
    }
}

/// The broken `pod` keeps changing after the controller acted (its kubelet writes each restart
/// to its status): the controller does not act again. Its one write to the pod, per the audit
/// log, is `write` (verb, subresource); one event; the bystanders untouched.
fn assert_acted_once(node: &Node, pod: &str, write: (&str, &str), names: &[&str]) {
    let cluster = node.cluster();
    let status = json!({"initContainerStatuses": validation_after(Some(126), 4)});
    cluster.cp.set_pod_status(&cluster.ns(NS), pod, status);
    std::thread::sleep(Duration::from_secs(2));
    let (verb, subresource) = write;
    assert_eq!(
        pod_writes(node, pod),
        vec![(verb.to_string(), subresource.to_string())]
    );
    assert_eq!(events_of(node, pod).len(), 1);
    assert_untouched(node, names);
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
    // The event refers to the pod as the server knows it (its UID).
    let event = &stored_events(&node, "web")[0];
    assert_eq!(event.involved_object.uid.as_deref(), Some(uid.as_str()));
    assert!(env.pod.iptables_state().contains("ISTIO_OUTPUT"));
    assert_outbound_redirected(&env);
    let web = format!("{}/web", node.k8s_ns(NS));
    node.wait_until(T, "the handled line", || {
        node.agent
            .output()
            .lines()
            .any(|l| l.contains("broken pod handled") && l.contains(&web) && l.contains("repair"))
    });
    // Repaired in place: the pod itself was neither patched nor deleted.
    assert_eq!(pod_writes(&node, "web"), vec![]);

    // An unusable annotation: one event naming it, no retries (the pod stays broken and keeps
    // changing, as a crash-looping pod does: its kubelet writes each restart to its status).
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
    let cluster = node.cluster();
    for restarts in 4..8 {
        let status = json!({"initContainerStatuses": validation_after(Some(126), restarts)});
        cluster.cp.set_pod_status(&cluster.ns(NS), "bad", status);
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
        .filter(|l| l.contains("broken pod detected") && l.contains("/bad"))
        .count();
    assert_eq!(attempts, 1, "retried {bad}:\n{log}");
    assert_eq!(pod_writes(&node, "bad"), vec![]);
    assert_untouched(&node, &names);
}

#[test]
fn delete_mode_deletes_the_broken_pod_only() {
    let node = start("REPAIR_DELETE_PODS");
    let names = bystanders(&node);
    add_pod(&node, PodSpec::broken("web", "10.250.0.5"));
    // No kubelet confirms the deletion: the server keeps the pod, marked for deletion with its
    // grace period (the controller's delete is graceful, as a user's `kubectl delete`).
    node.wait_until(T, "the broken pod marked for deletion", || {
        node.get_pod(NS, "web")
            .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
    });
    let web = node
        .get_pod(NS, "web")
        .expect("kept until its kubelet confirms");
    assert_eq!(web.metadata.deletion_grace_period_seconds, Some(30));
    node.wait_until(T, "the delete event", || {
        !events_of(&node, "web").is_empty()
    });
    let events = events_of(&node, "web");
    assert!(events[0].starts_with("DeleteBrokenPod: "), "{events:?}");
    // The terminating pod keeps changing (its kubelet stops the containers and writes that):
    // the controller does not delete it again.
    assert_acted_once(&node, "web", ("delete", ""), &names);
}

/// A crash-looping pod's kubelet keeps writing its status, so the copy the controller acted on
/// is often stale by the time its delete arrives: a resourceVersion precondition would make the
/// server refuse the delete (409) and the pod would stay broken. The UID is the precondition
/// that matters (never delete a new pod of the same name).
#[test]
fn delete_mode_deletes_a_broken_pod_whose_status_keeps_changing() {
    let node = start("REPAIR_DELETE_PODS");
    let cluster = node.cluster();
    add_pod(&node, PodSpec::broken("busy", "10.250.0.5"));
    let ns = cluster.ns(NS);
    let marked = || {
        node.get_pod(NS, "busy")
            .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
    };
    // The kubelet: a status write every few milliseconds until the pod is marked for deletion.
    let deadline = std::time::Instant::now() + T;
    let mut restarts = 4;
    while !marked() && std::time::Instant::now() < deadline {
        restarts += 1;
        let status = json!({"initContainerStatuses": validation_after(Some(126), restarts)});
        cluster.cp.set_pod_status(&ns, "busy", status);
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        marked(),
        "not deleted after {restarts} status writes; events {:?}; agent log:\n{}",
        events_of(&node, "busy"),
        node.agent.output()
    );
    node.wait_until(T, "the delete event", || {
        !events_of(&node, "busy").is_empty()
    });
    let events = events_of(&node, "busy");
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(events[0].starts_with("DeleteBrokenPod: "), "{events:?}");
    let deletes = pod_writes(&node, "busy");
    assert_eq!(deletes, vec![("delete".into(), String::new())]);
}

#[test]
fn label_mode_labels_the_broken_pod_through_its_status() {
    let node = start("REPAIR_LABEL_PODS");
    let names = bystanders(&node);
    add_pod(&node, PodSpec::broken("web", "10.250.0.5"));
    node.wait_until(T, "the broken pod's label", || {
        label_of(&node, "web").as_deref() == Some("true")
    });
    node.wait_until(T, "the label event", || !events_of(&node, "web").is_empty());
    assert!(events_of(&node, "web")[0].starts_with("LabelBrokenPod: "));
    // Through `pods/status` (what the chart grants for labelling), once, the pod not deleted.
    assert_acted_once(&node, "web", ("patch", "/status"), &names);
}

/// On the test API server: it is stopped and its history compacted, which a real one is not on
/// demand.
#[test]
fn label_mode_a_pod_broken_while_the_api_server_was_down_is_labelled_after_the_watch_restart() {
    let node = start_standin("REPAIR_LABEL_PODS");
    let names = bystanders(&node);
    add_pod(&node, PodSpec::broken("web", "10.250.0.5"));
    node.wait_until(T, "the broken pod's label", || {
        label_of(&node, "web").as_deref() == Some("true")
    });
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
    let uid = add_pod(
        node,
        PodSpec {
            host_network: true,
            ..PodSpec::broken(name, ip)
        },
    );
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
    let hostnet = format!("{}/hostnet", node.k8s_ns(NS));
    node.wait_until(T, "the hostNetwork pod skipped", || {
        node.agent.output().lines().any(|l| {
            l.contains("broken pod skipped")
                && l.contains(&hostnet)
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
    for pod in ["hostnet", "disguised"] {
        assert_eq!(pod_writes(&node, pod), vec![], "{pod} written");
    }
}

#[test]
fn where_the_node_s_netns_cannot_be_identified_no_pod_netns_is_entered_and_readiness_says_why() {
    let unreadable = HostProcView::pid1_unreadable();
    let dir = unreadable.dir.to_str().expect("utf-8").to_string();
    let node = start_real(
        "REPAIR_REPAIR_PODS",
        &[
            ("DRIFT_VERIFY_INTERVAL", "1s"),
            ("HEALTH_PORT", HEALTH_PORT),
            ("HOST_PROC_DIR", &dir),
        ],
    );
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
    let node = start_standin("REPAIR_LABEL_PODS");
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
