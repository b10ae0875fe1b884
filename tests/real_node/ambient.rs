//! Ambient on the real node: the chart with ambient on, the test's ZDS peer in ztunnel's place
//! (connecting to the agent's socket on the node, opening its in-pod listeners through the netns
//! it is handed), pods in an ambient namespace started by kubelet.

use std::time::{Duration, Instant};

use istio_cni_testing::zds_peer::ZdsPeer;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use crate::cluster::{Cluster, T, netns_rules, serial};

/// The annotation the agent puts on an enrolled pod.
const REDIRECTION: &str = "ambient.istio.io/redirection";
/// The bridge's address: nothing listens on port 1 there, so only a captured connection (landing
/// on the peer's in-pod 15001) is accepted.
const UNCAPTURED_REFUSED: &str = "10.244.237.1:1";

/// An ambient workload: an init container that only succeeds when its outbound connection is
/// captured (so the pod was enrolled before its containers started) and an app with an HTTP
/// readiness probe (kubelet's probe must get through the probe SNAT, not to ztunnel).
pub fn ambient_pod(namespace: &str, name: &str) -> Value {
    let image = istio_cni_testing::node::WORKLOAD_IMAGE;
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "initContainers": [{"name": "captured", "image": image, "imagePullPolicy": "Never",
                "args": ["-connect", UNCAPTURED_REFUSED]}],
            "containers": [{"name": "app", "image": image, "imagePullPolicy": "Never",
                "args": ["-tcp", "8080", "-http", "8081", "-name", name],
                "readinessProbe": {"httpGet": {"port": 8081, "path": "/"},
                    "periodSeconds": 1, "failureThreshold": 1}}],
            "terminationGracePeriodSeconds": 2,
            "automountServiceAccountToken": false}})
}

pub fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().expect("pod uid")
}

fn annotated(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(REDIRECTION))
}

pub fn init_restarts(pod: &Pod) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.init_container_statuses.as_ref())
        .and_then(|s| s.first())
        .map(|s| s.restart_count)
        .unwrap_or(-1)
}

/// Polls `cond` every 200 ms; panics after `timeout` with `what` and `state()`.
fn wait_until(
    timeout: Duration,
    what: &str,
    mut cond: impl FnMut() -> bool,
    state: impl Fn() -> String,
) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "{what} not within {timeout:?}: {}",
            state()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Whether the pod's netns holds the in-pod redirection (ztunnel's inbound/outbound ports).
fn captured(c: &Cluster, pod: &Pod) -> bool {
    let pid = c.node.container_pid(pod, "app").expect("app pid");
    let rules = netns_rules(pid);
    rules.contains("15001") && rules.contains("15006")
}

#[test]
fn ambient_pods_on_a_real_node_are_enrolled_before_they_start_probed_released_and_back_after_reboot()
 {
    crate::support::require_root();
    let _one = serial();
    let c = Cluster::start();
    // The ZDS peer runs before the agent: ztunnel is there on a started node.
    let peer = ZdsPeer::start(std::path::Path::new("/var/run/ztunnel/ztunnel.sock"));
    // Ambient with the chart's default repair (in place), both of which need the node's netns
    // through the host /proc: the node's own PID namespace gives them a pid 1 to open.
    let objects = c.install_chart(json!({"ambient": {"enabled": true}}));
    let agent = c.wait_agent_ready();
    peer.wait_snapshots(1, T);
    eprintln!("agent {:?} ready, ZDS snapshot acked", agent.metadata.name);

    let ns = "ambient-app";
    c.create_namespace(ns, &[("istio.io/dataplane-mode", "ambient")]);
    let names = ["amb-a", "amb-b"];
    for name in names {
        c.create_pod(ambient_pod(ns, name));
    }
    let mut pods = Vec::new();
    for name in names {
        let pod = c
            .node
            .wait_pod_ready(&c.cp, ns, name, T)
            .unwrap_or_else(|e| {
                panic!(
                    "{e}\nagent log:\n{}",
                    crate::agent_log(&c, agent.metadata.name.as_deref().unwrap_or_default())
                )
            });
        // Enrolled before its containers started: the init container's first and only run was
        // captured, by the peer's in-pod listener.
        assert_eq!(init_restarts(&pod), 0, "{name}: init container restarted");
        assert!(
            peer.accepted(&uid(&pod)).unwrap_or(0) >= 1,
            "{name}: the init container's connection did not land on the peer; workloads {:?}",
            peer.workloads()
        );
        assert!(annotated(&pod), "{name}: not annotated as enrolled");
        assert!(captured(&c, &pod), "{name}: no in-pod rules");
        pods.push(pod);
    }
    // Ready means kubelet's HTTP probe reached the app's 8081 (through the probe SNAT), not the
    // peer's inbound listener, which answers no HTTP.

    // Relabelling the namespace takes its pods out: the peer is told, the rules go.
    c.label_namespace(ns, "istio.io/dataplane-mode", None);
    for pod in &pods {
        let (u, name) = (uid(pod), pod.metadata.name.clone().unwrap_or_default());
        wait_until(
            T,
            &format!("{name} out of the mesh"),
            || {
                let now = c.node.get_pod(&c.cp, ns, &name).expect("pod");
                !peer.workloads().contains_key(&u) && !annotated(&now) && !captured(&c, &now)
            },
            || format!("workloads {:?}", peer.workloads()),
        );
    }
    // And labelling it again brings them back.
    c.label_namespace(ns, "istio.io/dataplane-mode", Some("ambient"));
    wait_enrolled(&c, &peer, ns, &pods);

    // Node reboot: kubelet, containerd, the agent and ztunnel stop; all start again. Every pod
    // still running is back in the mesh, on ztunnel's new connection.
    let agent_pod = c
        .node
        .get_pod(
            &c.cp,
            crate::chart::NAMESPACE,
            agent.metadata.name.as_deref().unwrap(),
        )
        .expect("agent pod");
    let agent_pid = c
        .node
        .container_pid(&agent_pod, "install-cni")
        .expect("agent pid");
    c.node.stop_runtime();
    peer.kill();
    // SAFETY: the agent's process on this node, by its host pid.
    unsafe { libc::kill(agent_pid as i32, libc::SIGKILL) };
    let snapshots = peer.snapshots();
    c.node
        .start_runtime(&c.cp)
        .unwrap_or_else(|e| panic!("restart: {e}"));
    peer.start_again();
    c.wait_agent_ready();
    peer.wait_snapshots(snapshots + 1, T);
    wait_enrolled(&c, &peer, ns, &pods);
    for pod in &pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        c.node
            .wait_pod_ready(&c.cp, ns, &name, T)
            .unwrap_or_else(|e| panic!("after reboot: {e}"));
    }
    assert!(peer.violations().is_empty(), "{:?}", peer.violations());

    // Uninstall before the node goes, so the agent takes its host rules out of this machine's
    // network namespace.
    for name in names {
        c.node
            .delete_pod(&c.cp, ns, name, T)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    c.uninstall_chart(&objects);
    let log = crate::agent_log_until_gone(&c, agent.metadata.name.as_deref().unwrap());
    // An uninstall takes the agent's host rules and probe sets out of the node's network
    // namespace (this machine's); anything left is removed here too, so a failure leaves none.
    let left = remove_host_rules();
    assert!(
        left.is_empty(),
        "host rules left after uninstall:\n{left}\nagent log tail:\n{log}"
    );
}

/// Removes the ambient host rules (the SNAT chain and its jump) and probe sets from this
/// machine's network namespace; returns what was found (empty after an uninstall).
pub fn remove_host_rules() -> String {
    let run = |prog: &str, args: &[&str]| {
        std::process::Command::new(prog)
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    let mut found = String::new();
    for tool in [
        "iptables-nft",
        "ip6tables-nft",
        "iptables-legacy",
        "ip6tables-legacy",
    ] {
        let rules = run(&format!("{tool}-save"), &["-t", "nat"]);
        for l in rules.lines().filter(|l| l.contains("ISTIO_POSTRT")) {
            found.push_str(&format!("{tool}: {l}\n"));
        }
        if rules.contains("ISTIO_POSTRT") {
            run(
                tool,
                &["-t", "nat", "-D", "POSTROUTING", "-j", "ISTIO_POSTRT"],
            );
            run(tool, &["-t", "nat", "-F", "ISTIO_POSTRT"]);
            run(tool, &["-t", "nat", "-X", "ISTIO_POSTRT"]);
        }
    }
    for set in ["istio-inpod-probes-v4", "istio-inpod-probes-v6"] {
        if std::process::Command::new("ipset")
            .args(["destroy", set])
            .output()
            .is_ok_and(|o| o.status.success())
        {
            found.push_str(&format!("ipset {set}\n"));
        }
    }
    found
}

/// Waits until every pod has a proxy at the peer and its in-pod rules.
fn wait_enrolled(c: &Cluster, peer: &ZdsPeer, ns: &str, pods: &[Pod]) {
    for pod in pods {
        let (u, name) = (uid(pod), pod.metadata.name.clone().unwrap_or_default());
        wait_until(
            T,
            &format!("{name} in the mesh"),
            || {
                let now = c.node.get_pod(&c.cp, ns, &name).expect("pod");
                peer.workloads().contains_key(&u) && annotated(&now) && captured(c, &now)
            },
            || format!("workloads {:?}", peer.workloads()),
        );
    }
}
