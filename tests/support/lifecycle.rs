//! Shared by the node lifecycle tests (issue 21): the agent's endpoints read from inside the node
//! netns, pods enrolled through the real CNI chain, and the "in the mesh" check every scenario ends
//! with. Included with `#[path]` after `ambient_node` (and `mod support;`, `mod install_support;`).
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::ambient_node::{Node, PodNs, PodProcess, in_netns, result_ip};
use crate::install_support::http_get;

pub const AMBIENT: &str = "istio.io/dataplane-mode";
pub const PERIOD: Duration = Duration::from_secs(2);
/// Ports of the node netns (private to each test's node).
pub const METRICS_PORT: &str = "15014";
pub const HEALTH_PORT: &str = "15021";
/// Slack on top of one jittered period: the machine runs other tests.
pub const SLACK: Duration = Duration::from_secs(6);

/// GET on the agent's port `port` (inside the node netns).
pub fn get(node: &Node, port: &str, path: &'static str) -> (u16, String) {
    let port: u16 = port.parse().expect("port");
    in_netns(Path::new(&node.ns.path()), move || http_get(port, path)).expect("GET")
}

/// `istio_cni_drift_repaired_total{kind}`.
pub fn repaired(node: &Node, kind: &str) -> u64 {
    let (_, body) = get(node, METRICS_PORT, "/metrics");
    let prefix = format!("istio_cni_drift_repaired_total{{kind=\"{kind}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.trim().parse().expect("a count"))
        .unwrap_or(0)
}

/// `/debug/pods` as JSON.
pub fn debug_pods(node: &Node) -> Value {
    let (status, body) = get(node, HEALTH_PORT, "/debug/pods");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("/debug/pods JSON: {e}: {body}"))
}

/// An enrolled pod: name, UID, IP, sandbox.
pub struct Enrolled {
    pub name: String,
    pub uid: String,
    pub ip: String,
    pub ns: PodNs,
    /// A process of the pod (its cgroup names the UID): how a restarted agent finds the netns.
    pub _process: PodProcess,
}

/// Creates and ADDs `names` through the real CNI chain; waits until each is annotated and in the
/// probe set.
pub fn enrol(node: &Node, names: &[&str]) -> Vec<Enrolled> {
    node.namespace("amb", json!({AMBIENT: "ambient"}));
    let pods: Vec<Enrolled> = names
        .iter()
        .map(|name| {
            let uid = node.unique_pod("amb", name);
            let ns = PodNs::new("life");
            let ip = result_ip(
                &node
                    .add(&ns, "amb", name)
                    .unwrap_or_else(|e| panic!("ADD {name}: {e}\n{}", node.agent.output())),
            );
            node.set_running("amb", name, &ip);
            let _process = PodProcess::start(&ns, &uid);
            Enrolled {
                name: name.to_string(),
                uid,
                ip,
                ns,
                _process,
            }
        })
        .collect();
    for p in &pods {
        node.wait_until(Duration::from_secs(10), "enrolled", || {
            node.redirection("amb", &p.name).as_deref() == Some("enabled")
                && node
                    .probe_members()
                    .contains(&(p.ip.clone(), p.uid.clone()))
        });
    }
    pods
}

/// Every pod's outbound and inbound TCP lands on the peer's listeners inside its current netns
/// (the counts go up), and the probe set holds exactly the enrolled pods.
pub fn assert_in_mesh(node: &Node, pods: &[Enrolled]) {
    assert_outbound_lands(node, pods);
    assert_inbound_lands(node, pods);
    assert_eq!(
        node.probe_members_sorted(),
        expected_members(pods),
        "probe set"
    );
}

/// The probe set's entries the pods should have: (IP, UID), sorted.
pub fn expected_members(pods: &[Enrolled]) -> Vec<(String, String)> {
    let mut want: Vec<(String, String)> =
        pods.iter().map(|p| (p.ip.clone(), p.uid.clone())).collect();
    want.sort();
    want
}

/// Waits until the probe set holds exactly the pods' entries.
pub fn wait_probe_set_exactly(node: &Node, pods: &[Enrolled], what: &str) {
    node.wait_until(Duration::from_secs(10), what, || {
        node.probe_members_sorted() == expected_members(pods)
    });
}

/// Every pod's outbound TCP lands on the peer's listener inside its current netns (the count
/// goes up).
pub fn assert_outbound_lands(node: &Node, pods: &[Enrolled]) {
    for p in pods {
        // Any address will do: the pod's rules send it to 15001 in the pod netns.
        assert_outbound_lands_to(node, p, "10.244.0.250:8080".parse().expect("addr"));
    }
}

/// A connection from inside `pod` to `to` lands on the peer's outbound listener in the pod's
/// current netns (the proxy's netns inode checked against the pod's).
pub fn assert_outbound_lands_to(node: &Node, p: &Enrolled, to: SocketAddr) {
    let before = node.peer.accepted(&p.uid).unwrap_or_else(|| {
        panic!("{}: the peer runs no proxy for it", p.name);
    });
    istio_cni::netns::Netns::open(&p.ns.guard.path())
        .and_then(|ns| {
            ns.run(move || {
                let _ = std::net::TcpStream::connect_timeout(&to, Duration::from_secs(2));
            })
        })
        .expect("enter the pod netns");
    node.wait_until(
        Duration::from_secs(5),
        &format!("{}: outbound to {to} on the peer", p.name),
        || node.peer.accepted(&p.uid).is_some_and(|n| n > before),
    );
    let path = p.ns.guard.path();
    let inode = std::fs::metadata(&path).map(|m| {
        use std::os::unix::fs::MetadataExt;
        m.ino()
    });
    assert_eq!(
        node.peer.netns_of(&p.uid).map(|(_, ino)| ino),
        inode.ok(),
        "{}: the peer's proxy is not in the pod's current netns",
        p.name
    );
}

/// A sandbox outside the mesh on the node's pod network (a pod of a namespace without the
/// ambient label, ADDed through the same chain): where inbound traffic comes from.
pub fn client(node: &Node) -> PodNs {
    node.namespace("plain", json!({}));
    let uid = crate::ambient_node::unique_uid();
    let name = format!("client-{}", &uid[uid.len() - 12..]);
    node.unique_pod("plain", &name);
    let ns = PodNs::new("client");
    node.add(&ns, "plain", &name)
        .unwrap_or_else(|e| panic!("ADD of the client {name}: {e}\n{}", node.agent.output()));
    ns
}

/// Every pod's inbound TCP (from a sandbox outside the mesh, to the pod's IP) lands on the peer's
/// inbound listener inside the pod's current netns.
pub fn assert_inbound_lands(node: &Node, pods: &[Enrolled]) {
    let from = client(node);
    for p in pods {
        assert_inbound_lands_at(node, &from, p, &p.ip);
    }
}

/// A connection from `from` to `ip:8080` lands on `pod`'s inbound listener (15006): the pod's
/// rules redirected it there, whatever the port.
pub fn assert_inbound_lands_at(node: &Node, from: &PodNs, pod: &Enrolled, ip: &str) {
    let before = node.peer.accepted_inbound(&pod.uid).unwrap_or_else(|| {
        panic!("{}: the peer runs no proxy for it", pod.name);
    });
    let to = SocketAddr::new(ip.parse().expect("pod IP"), 8080);
    istio_cni::netns::Netns::open(&from.guard.path())
        .and_then(|ns| {
            ns.run(move || {
                let _ = std::net::TcpStream::connect_timeout(&to, Duration::from_secs(2));
            })
        })
        .expect("enter the client netns");
    node.wait_until(
        Duration::from_secs(5),
        &format!("{}: inbound to {to} on the peer", pod.name),
        || {
            node.peer
                .accepted_inbound(&pod.uid)
                .is_some_and(|n| n > before)
        },
    );
}

/// On the real kube-apiserver: the audit log holds the agent's own patch of each pod's status
/// (the `ambient.istio.io/redirection` annotation), made with the chart's RBAC.
pub fn assert_annotated_by_agent(node: &Node, pods: &[Enrolled]) {
    let requests = node.cluster().requests();
    for p in pods {
        let status = format!(
            "/api/v1/namespaces/{}/pods/{}/status",
            node.k8s_ns("amb"),
            p.name
        );
        assert!(
            requests
                .iter()
                .any(|(verb, uri)| verb == "patch" && uri.starts_with(&status)),
            "{}: no patch of its status by the agent: {requests:#?}",
            p.name
        );
    }
}
