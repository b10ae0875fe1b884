//! istio-cni on a real node: kube-apiserver and etcd (testing's controlplane), kube-controller-
//! manager, kube-scheduler, containerd 2 with runc and kubelet (testing's node, built by
//! scripts/build-node), Debian's bridge + host-local as the primary network. The chart is rendered
//! by real Helm and applied; the DaemonSet controller creates our pod from our locally built image
//! (scripts/image); install-cni installs the plugin and merges its entry into the node's conflist;
//! from then on containerd calls our plugin for every pod kubelet starts.
//!
//! Needs root, Go (scripts/build-node, scripts/build-controlplane), podman + runc + mmdebstrap
//! (scripts/deps-image) and the Helm venv (scripts/deps). docs/real-node.md says how to run it.

mod support;

#[path = "chart_helm/chart.rs"]
mod chart;

#[path = "image_daemonset/podman.rs"]
#[allow(dead_code)]
mod podman;

#[path = "real_node/cluster.rs"]
mod cluster;

#[path = "real_node/ambient.rs"]
mod ambient;

#[path = "real_node/repair.rs"]
mod repair;

#[path = "real_node/rollout.rs"]
mod rollout;

use serde_json::json;

use cluster::{Cluster, T, ask, netns_rules, pod_ip, serial, workload_pod};

/// What the injector leaves on a sidecar pod: the plugin acts on pods with this annotation and an
/// `istio-proxy` container.
const SIDECAR_STATUS: &str = r#"{"initContainers":["istio-validation"],"containers":["istio-proxy"],"volumes":["istio-envoy"]}"#;

#[test]
fn sidecar_pods_on_a_real_node_get_their_rules_from_our_plugin_and_del_leaves_nothing() {
    support::require_root();
    let _one = serial();
    let c = Cluster::start();
    // In-place repair (the default) needs the node's netns through /host/proc/1/ns/net, which
    // these machines refuse even to root (docs/real-node.md); delete mode needs no host /proc.
    c.install_chart(json!({"repair": {"repairPods": false, "deletePods": true}}));
    let agent = c.wait_agent_ready();
    eprintln!("agent pod {:?} ready", agent.metadata.name);

    // install-cni put the plugin beside the node's plugins and its entry into the conflist.
    assert!(
        c.node.cni_bin_dir().join("istio-cni").is_file(),
        "plugin installed"
    );
    assert_eq!(
        c.conflist_types(),
        ["bridge", "istio-cni"],
        "merged conflist"
    );

    let ns = "sidecar-app";
    c.create_namespace(ns, &[]);
    c.create_pod(workload_pod(
        ns,
        "injected",
        json!({"sidecar.istio.io/status": SIDECAR_STATUS}),
        &[
            ("app", &["-tcp", "8080", "-name", "app"]),
            (
                "istio-proxy",
                &["-tcp", "15001,15006", "-name", "istio-proxy"],
            ),
        ],
    ));
    c.create_pod(workload_pod(
        ns,
        "plain",
        json!({}),
        &[("app", &["-tcp", "8080", "-name", "plain"])],
    ));
    let injected = c
        .node
        .wait_pod_ready(&c.cp, ns, "injected", T)
        .expect("injected pod");
    let plain = c
        .node
        .wait_pod_ready(&c.cp, ns, "plain", T)
        .expect("plain pod");
    let (injected_ip, plain_ip) = (pod_ip(&injected), pod_ip(&plain));
    let injected_pid = c.node.container_pid(&injected, "app").expect("app pid");
    let plain_pid = c.node.container_pid(&plain, "app").expect("plain pid");

    // The rules were there at sandbox creation: the plugin ran in containerd's ADD.
    let rules = netns_rules(injected_pid);
    assert!(
        rules.contains("ISTIO_REDIRECT") || rules.contains("ISTIO_OUTPUT"),
        "{rules}"
    );
    let plain_rules = netns_rules(plain_pid);
    assert!(
        !plain_rules.contains("ISTIO"),
        "plain pod untouched: {plain_rules}"
    );

    // Outbound from the app lands on the sidecar's 15001 with the original destination.
    let target = format!("{plain_ip}:8080");
    let out = istio_cni_testing::node::in_netns(injected_pid, move || ask(&target))
        .expect("enter the pod netns")
        .expect("outbound answer");
    assert!(out.starts_with("name=istio-proxy "), "{out}");
    assert!(out.contains(&format!("orig={plain_ip}:8080")), "{out}");
    assert!(out.contains(":15001 "), "{out}");

    // Inbound to the app's port lands on the sidecar's 15006 with the original destination.
    let inbound = ask(&format!("{injected_ip}:8080")).expect("inbound answer");
    assert!(inbound.starts_with("name=istio-proxy "), "{inbound}");
    assert!(
        inbound.contains(&format!("orig={injected_ip}:8080")),
        "{inbound}"
    );
    assert!(inbound.contains(":15006 "), "{inbound}");

    // The plain pod answers itself.
    let direct = ask(&format!("{plain_ip}:8080")).expect("plain answer");
    assert!(direct.starts_with("name=plain "), "{direct}");

    // Deleting the pods runs DEL through containerd: their netns, addresses and veths go (the
    // agent's pod keeps its own).
    let netns = |c: &Cluster| -> Vec<String> {
        std::fs::read_dir(c.node.netns_dir())
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    let before = netns(&c);
    assert_eq!(
        before.len(),
        3,
        "the agent's and both pods' netns: {before:?}"
    );
    for name in ["injected", "plain"] {
        c.node
            .delete_pod(&c.cp, ns, name, T)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let after = netns(&c);
    assert_eq!(after.len(), 1, "only the agent's netns is left: {after:?}");
    let ipam = c.node.dir().join("ipam/istio-cni-node");
    for ip in [&injected_ip, &plain_ip] {
        assert!(
            !ipam.join(ip).exists(),
            "{ip} still leased in {}",
            ipam.display()
        );
    }
    let log = std::fs::read_to_string(c.node.dir().join("containerd.log")).unwrap_or_default();
    assert!(
        !log.lines()
            .any(|l| l.contains("istio-cni") && l.contains("level=error")),
        "containerd logged a plugin error:\n{}",
        c.node.log_tail("containerd", 40)
    );
}

#[test]
fn uninstalling_the_chart_with_pods_running_then_deleting_them_leaves_none_stuck() {
    support::require_root();
    let _one = serial();
    let c = Cluster::start();
    let objects = c.install_chart(json!({"repair": {"repairPods": false, "deletePods": true}}));
    let agent = c.wait_agent_ready();
    let agent = agent.metadata.name.expect("agent pod name");
    let ns = "uninstall-app";
    c.create_namespace(ns, &[]);
    let names = ["injected-a", "injected-b", "plain-a"];
    for name in names {
        let annotations = if name.starts_with("injected") {
            json!({"sidecar.istio.io/status": SIDECAR_STATUS})
        } else {
            json!({})
        };
        c.create_pod(workload_pod(
            ns,
            name,
            annotations,
            &[
                ("app", &["-tcp", "8080", "-name", "app"]),
                (
                    "istio-proxy",
                    &["-tcp", "15001,15006", "-name", "istio-proxy"],
                ),
            ],
        ));
    }
    for name in names {
        c.node
            .wait_pod_ready(&c.cp, ns, name, T)
            .unwrap_or_else(|e| panic!("{e}"));
    }

    // Uninstall while the pods run: the agent pod goes, and install-cni takes its plugin and
    // conflist entry with it.
    c.uninstall_chart(&objects);
    let agent_log = agent_log_until_gone(&c, &agent);
    // The agent logged the uninstall and took its entry out of the node's conflist. (The
    // network itself is named `istio-cni-node`: look at the plugin types, not the text.) The
    // binary stays while cached attachments still name it, for their DEL.
    assert!(
        agent_log.contains("uninstall"),
        "the agent saw an uninstall:\n{agent_log}"
    );
    assert_eq!(
        c.conflist_types(),
        ["bridge"],
        "the istio-cni entry is gone from the conflist; agent log:\n{agent_log}"
    );

    // Deleting the pods afterwards: containerd's DEL no longer finds our plugin in the conflist;
    // no pod may be stuck in Terminating.
    for name in names {
        c.node
            .delete_pod(&c.cp, ns, name, T)
            .unwrap_or_else(|e| panic!("stuck after uninstall: {e}"));
    }
    // A pod started after the uninstall runs without us.
    c.create_pod(workload_pod(
        ns,
        "after",
        json!({"sidecar.istio.io/status": SIDECAR_STATUS}),
        &[("app", &["-tcp", "8080", "-name", "after"])],
    ));
    let after = c
        .node
        .wait_pod_ready(&c.cp, ns, "after", T)
        .expect("pod after uninstall");
    let answer = ask(&format!("{}:8080", pod_ip(&after))).expect("direct answer");
    assert!(answer.starts_with("name=after "), "{answer}");
    c.node.delete_pod(&c.cp, ns, "after", T).expect("delete");
}

/// The agent's install-cni log as kubelet keeps it (the newest container's file).
fn agent_log(c: &Cluster, agent: &str) -> String {
    let mut last = String::new();
    let dir = c.node.dir().join("pod-logs");
    for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        if !entry.file_name().to_string_lossy().contains(agent) {
            continue;
        }
        let logs = entry.path().join("install-cni");
        let mut files: Vec<_> = std::fs::read_dir(&logs)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .collect();
        files.sort();
        if let Some(text) = files.last().and_then(|f| std::fs::read_to_string(f).ok()) {
            last = text;
        }
    }
    last
}

/// Waits for the agent pod to be gone, keeping the last copy of its log (kubelet removes the file
/// with the pod).
fn agent_log_until_gone(c: &Cluster, agent: &str) -> String {
    let deadline = std::time::Instant::now() + T;
    let mut last = String::new();
    while c.node.get_pod(&c.cp, chart::NAMESPACE, agent).is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "agent pod {agent} not gone"
        );
        let now = agent_log(c, agent);
        if !now.is_empty() {
            last = now;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let lines: Vec<&str> = last.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}
