//! End to end, node lifecycle with ztunnel's own life (issue 21, scenarios 1–3): the real
//! install-cni with the agent and data plane in a node netns of its own, pods through the real CNI
//! chain, the test ZDS peer as ztunnel — started late, killed and started again. Each scenario ends
//! with every pod's outbound TCP on the peer's listener inside the pod's current netns and the
//! probe set exactly the live pods (tests/support/lifecycle.rs). The node is on the real
//! kube-apiserver (`Node::start_real*`, the chart's RBAC): the agent's annotation patches are in
//! its audit log, and for an ADD refused for want of ztunnel only the `pending` annotation.

#[path = "support/ambient_node.rs"]
mod ambient_node;
mod install_support;
#[path = "support/lifecycle.rs"]
mod lifecycle;
mod support;

use std::time::{Duration, Instant};

use ambient_node::{Backend, Node, PodNs, PodProcess, result_ip};
use lifecycle::*;
use serde_json::json;
use support::real_cluster::RealCluster;

/// An ADD refused for want of ztunnel must come back well inside the kubelet's CNI timeout.
const FAILS_FAST: Duration = Duration::from_secs(3);

/// Scenario 2 (Istio's #61717, #54544): a new node whose ztunnel is not running. ADDs fail fast
/// saying ztunnel is not connected, and nothing of the pod is enrolled (no pod starts
/// un-captured); once ztunnel connects, the waiting pods are in its first snapshot and the
/// kubelet's retried ADDs succeed at once; after ztunnel restarts the agent still enrols.
#[test]
fn ztunnel_late_adds_fail_fast_then_succeed_once_it_connects_iptables() {
    ztunnel_late(Backend::Iptables);
}

#[test]
fn ztunnel_late_adds_fail_fast_then_succeed_once_it_connects_nftables() {
    ztunnel_late(Backend::Nftables);
}

fn ztunnel_late(backend: Backend) {
    let node = Node::start_real_without_peer(
        RealCluster::start(),
        backend,
        &[("HEALTH_PORT", HEALTH_PORT)],
    );
    node.namespace("amb", json!({AMBIENT: "ambient"}));
    let names = ["late-a", "late-b"];
    let sandboxes: Vec<(String, PodNs)> = names
        .iter()
        .map(|n| (node.unique_pod("amb", n), PodNs::new("late")))
        .collect();
    for (name, (_, ns)) in names.iter().zip(&sandboxes) {
        let started = Instant::now();
        let err = node
            .add(ns, "amb", name)
            .expect_err("an ADD succeeded with no ztunnel connected");
        let took = started.elapsed();
        eprintln!("ADD {name} without ztunnel failed in {took:?}: {err}");
        assert!(took < FAILS_FAST, "ADD {name} took {took:?}: {err}");
        assert!(
            err.contains("ztunnel is not connected"),
            "ADD {name}: the error does not say ztunnel is not connected: {err}"
        );
        assert_ne!(node.redirection("amb", name).as_deref(), Some("enabled"));
    }
    assert!(
        node.probe_members().is_empty(),
        "{:?}",
        node.probe_members()
    );
    // On the server: the agent's only writes are the refused pods' `pending` annotations.
    let status_of = |name: &str| {
        format!(
            "/api/v1/namespaces/{}/pods/{name}/status",
            node.k8s_ns("amb")
        )
    };
    let writes: Vec<_> = node
        .cluster()
        .requests()
        .into_iter()
        .filter(|(verb, _)| !["get", "list", "watch"].contains(&verb.as_str()))
        .collect();
    for (verb, uri) in &writes {
        assert!(
            verb == "patch" && names.iter().any(|n| uri.starts_with(&status_of(n))),
            "the agent wrote {verb} {uri} for a refused ADD: {writes:#?}"
        );
    }
    for name in names {
        assert_eq!(node.redirection("amb", name).as_deref(), Some("pending"));
    }

    // ztunnel arrives: its first snapshot holds the waiting pods.
    node.peer.start_again();
    let first = node.peer.wait_snapshots(1, Duration::from_secs(10));
    for (uid, _) in &sandboxes {
        assert!(
            first.iter().any(|s| s.is_add_of(uid)),
            "{uid} not in ztunnel's first snapshot: {first:?}"
        );
    }
    // The kubelet retries (DEL of the failed sandbox, then ADD): each succeeds at once.
    let mut pods = Vec::new();
    for (name, (uid, ns)) in names.iter().zip(sandboxes) {
        let _ = node.del(&ns, "amb", name);
        let started = Instant::now();
        let result = node
            .add(&ns, "amb", name)
            .unwrap_or_else(|e| panic!("retried ADD {name}: {e}\n{}", node.agent.output()));
        let took = started.elapsed();
        assert!(took < FAILS_FAST, "retried ADD {name} took {took:?}");
        pods.push(running(&node, name, uid, ns, &result_ip(&result)));
    }
    wait_enrolled(&node, &pods);
    assert_in_mesh(&node, &pods);

    // Never stuck in "no ztunnel connection": after ztunnel restarts, a new pod enrols.
    node.peer.kill();
    node.peer.start_again();
    node.peer.wait_snapshots(2, Duration::from_secs(10));
    pods.extend(enrol(&node, &["late-c"]));
    wait_enrolled(&node, &pods);
    assert_in_mesh(&node, &pods);
    assert_eq!(node.peer.violations(), Vec::<String>::new());
    assert_annotated_by_agent(&node, &pods);
}

/// What the kubelet does once the sandbox is up: the pod Running with its IP, a process of it.
fn running(node: &Node, name: &str, uid: String, ns: PodNs, ip: &str) -> Enrolled {
    node.set_running("amb", name, ip);
    let _process = PodProcess::start(&ns, &uid);
    Enrolled {
        name: name.to_string(),
        uid,
        ip: ip.to_string(),
        ns,
        _process,
    }
}

/// Waits until each pod is annotated and in the probe set.
fn wait_enrolled(node: &Node, pods: &[Enrolled]) {
    for p in pods {
        node.wait_until(
            Duration::from_secs(10),
            &format!("{} enrolled", p.name),
            || {
                node.redirection("amb", &p.name).as_deref() == Some("enabled")
                    && node
                        .probe_members()
                        .contains(&(p.ip.clone(), p.uid.clone()))
            },
        );
    }
}

/// Scenario 1 (Istio's #60882, #57285): a node rebooted without drain. Enrolled pods; agent and
/// ztunnel stopped; every pod netns and its processes gone; new sandboxes for the same pods (same
/// UIDs, new netns and container IDs); agent and ztunnel started (in the order given), and the
/// kubelet's ADDs arrive as it retries them. The new netns are enrolled, ztunnel is never handed a
/// netns that no longer exists, and the probe set and ztunnel hold exactly the live pods.
fn reboot_without_drain(backend: Backend, agent_first: bool) {
    let mut node = Node::start_real_on(
        RealCluster::start(),
        backend,
        &[("HEALTH_PORT", HEALTH_PORT)],
    );
    let names = ["boot-a", "boot-b", "boot-c"];
    let before = enrol(&node, &names);
    assert_in_mesh(&node, &before);
    let old_inodes: Vec<u64> = before.iter().map(|p| inode(&p.ns)).collect();
    let uids: Vec<String> = before.iter().map(|p| p.uid.clone()).collect();

    // The reboot: agent and ztunnel gone, then every sandbox with its processes.
    // ztunnel first: an agent killed under a connected peer reads as an empty datagram to it.
    node.peer.kill();
    node.kill_agent();
    drop(before);
    let sandboxes: Vec<PodNs> = names.iter().map(|_| PodNs::new("boot")).collect();
    let snapshots = node.peer.snapshots();
    if agent_first {
        node.start_agent();
        std::thread::sleep(Duration::from_millis(500));
        node.peer.start_again();
    } else {
        node.peer.start_again();
        std::thread::sleep(Duration::from_millis(200));
        node.start_agent();
    }
    node.peer
        .wait_snapshots(snapshots + 1, Duration::from_secs(30));
    // The kubelet's retried ADDs (the first may race the agent's start: retried like the kubelet).
    let mut pods = Vec::new();
    for ((name, uid), ns) in names.iter().zip(uids).zip(sandboxes) {
        let deadline = Instant::now() + Duration::from_secs(15);
        let result = loop {
            match node.add(&ns, "amb", name) {
                Ok(r) => break r,
                Err(e) => {
                    assert!(
                        Instant::now() < deadline,
                        "ADD {name} after the reboot: {e}\n{}",
                        node.agent.output()
                    );
                    let _ = node.del(&ns, "amb", name);
                    std::thread::sleep(Duration::from_millis(300));
                }
            }
        };
        pods.push(running(&node, name, uid, ns, &result_ip(&result)));
    }
    wait_enrolled(&node, &pods);
    wait_probe_set_exactly(&node, &pods, "the probe set exactly the live pods");
    assert_in_mesh(&node, &pods);
    // ztunnel holds exactly the live pods, each in its new netns, never an old one.
    let live: Vec<String> = pods.iter().map(|p| p.uid.clone()).collect();
    assert_eq!(node.peer.workloads().keys().cloned().collect::<Vec<_>>(), {
        let mut l = live.clone();
        l.sort();
        l
    });
    // An inode names one live netns, but the kernel reuses the numbers of deleted ones: a new
    // sandbox may carry an old inode, so "not an old inode" is no test. The proxy's netns being
    // the pod's current (live) one is.
    for p in &pods {
        let ino = node.peer.netns_of(&p.uid).expect("proxy").1;
        assert_eq!(
            ino,
            inode(&p.ns),
            "{}: ztunnel holds a netns other than the pod's current one (old ones: {old_inodes:?})",
            p.name
        );
    }
    assert_eq!(node.peer.violations(), Vec::<String>::new());
    assert_annotated_by_agent(&node, &pods);
}

fn inode(ns: &PodNs) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(ns.guard.path()).expect("netns").ino()
}

#[test]
fn a_reboot_without_drain_enrols_the_new_netns_agent_first_iptables() {
    reboot_without_drain(Backend::Iptables, true);
}

#[test]
fn a_reboot_without_drain_enrols_the_new_netns_ztunnel_first_iptables() {
    reboot_without_drain(Backend::Iptables, false);
}

#[test]
fn a_reboot_without_drain_enrols_the_new_netns_agent_first_nftables() {
    reboot_without_drain(Backend::Nftables, true);
}

#[test]
fn a_reboot_without_drain_enrols_the_new_netns_ztunnel_first_nftables() {
    reboot_without_drain(Backend::Nftables, false);
}

/// The agent's open fds.
fn fds(node: &Node) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", node.agent.child.id()))
        .expect("agent fds")
        .count()
}

/// Scenario 3: 20 concurrent ADDs while ztunnel is killed and started again three times; failed
/// ADDs are retried as the kubelet does. Every pod ends enrolled and in ztunnel, no connection
/// got two Adds of one uid, and the agent's fds and memory come back near where they were.
#[test]
fn ztunnel_restarting_during_a_burst_loses_no_pod_iptables() {
    ztunnel_restarting_during_a_burst(Backend::Iptables);
}

#[test]
fn ztunnel_restarting_during_a_burst_loses_no_pod_nftables() {
    ztunnel_restarting_during_a_burst(Backend::Nftables);
}

fn ztunnel_restarting_during_a_burst(backend: Backend) {
    const N: usize = 20;
    let node = Node::start_real_on(
        RealCluster::start(),
        backend,
        &[("HEALTH_PORT", HEALTH_PORT)],
    );
    node.namespace("amb", json!({AMBIENT: "ambient"}));
    let (fds_before, rss_before) = (fds(&node), ambient_node::rss_mb(&node));
    let names: Vec<String> = (0..N).map(|i| format!("storm-{i}")).collect();
    let sandboxes: Vec<(String, PodNs)> = names
        .iter()
        .map(|n| (node.unique_pod("amb", n), PodNs::new("storm")))
        .collect();
    let retry_add = |ns: &PodNs, name: &str| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match node.add(ns, "amb", name) {
                Ok(r) => return r,
                Err(e) => {
                    assert!(Instant::now() < deadline, "ADD {name}: {e}");
                    let _ = node.del(ns, "amb", name);
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    };
    let results: Vec<serde_json::Value> = std::thread::scope(|s| {
        let adds: Vec<_> = names
            .iter()
            .zip(&sandboxes)
            .map(|(name, (_, ns))| s.spawn(|| retry_add(ns, name)))
            .collect();
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(150));
            node.peer.kill();
            std::thread::sleep(Duration::from_millis(100));
            node.peer.start_again();
        }
        adds.into_iter()
            .map(|a| a.join().expect("ADD thread"))
            .collect()
    });
    let mut pods = Vec::new();
    for ((name, (uid, ns)), r) in names.iter().zip(sandboxes).zip(results) {
        pods.push(running(&node, name, uid, ns, &result_ip(&r)));
    }
    wait_enrolled(&node, &pods);
    node.wait_until(Duration::from_secs(10), "every pod in ztunnel", || {
        let w = node.peer.workloads();
        pods.iter().all(|p| w.contains_key(&p.uid))
    });
    assert_in_mesh(&node, &pods);
    let mut seen = std::collections::BTreeMap::new();
    for (conn, s) in node.peer.all_requests() {
        if let support::zds_peer::Seen::Add { uid, .. } = s {
            *seen.entry((conn, uid)).or_insert(0) += 1;
        }
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "two Adds of one uid on one connection: {twice:?}"
    );
    assert_eq!(node.peer.violations(), Vec::<String>::new());
    // Leaks show as growth per ztunnel restart: measure with every pod enrolled, restart
    // ztunnel three more times, measure again.
    let (fds_enrolled, rss_enrolled) = (fds(&node), ambient_node::rss_mb(&node));
    for _ in 0..3 {
        let n = node.peer.snapshots();
        node.peer.kill();
        node.peer.start_again();
        node.peer.wait_snapshots(n + 1, Duration::from_secs(10));
    }
    assert_in_mesh(&node, &pods);
    let (fds_after, rss_after) = (fds(&node), ambient_node::rss_mb(&node));
    eprintln!(
        "agent fds {fds_before} idle, {fds_enrolled} with {N} pods, {fds_after} after 3 more \
         ztunnel restarts; RSS {rss_before:.1} / {rss_enrolled:.1} / {rss_after:.1} MB"
    );
    assert!(
        fds_after <= fds_enrolled + 2,
        "fds {fds_enrolled} -> {fds_after}"
    );
    assert!(
        rss_after < rss_enrolled + 10.0,
        "RSS {rss_enrolled} -> {rss_after} MB"
    );
    assert_annotated_by_agent(&node, &pods);
}
