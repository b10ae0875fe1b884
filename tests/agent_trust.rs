//! What the ambient agent believes of `/cmdadd` (issue 20 §1-3): the real install-cni with the
//! real data plane in a node netns of its own, the real kube-apiserver (`Node::start_real`) and
//! the test ZDS peer. A
//! non-root peer is refused (403) even where the socket's modes would let it in; a netns that is
//! the node's or the agent's own, one that does not hold the event's IPs, one holding another
//! pod's IP, or a FIFO (fails in well under a second) are refused and nothing is written —
//! neither in the machine's netns nor in the node's, nothing to ztunnel, no probe entry; loopback
//! never reaches the probe set; a re-ADD of an enrolled pod with another live netns is refused and
//! the pod stays enrolled, with its rules, in ztunnel's next snapshot. The server's audit log
//! shows no write of the agent's for a refused event, and the annotation patch for a good one.

#[path = "support/ambient_node.rs"]
mod ambient_node;
mod install_support;
mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use ambient_node::{Backend, Node, PodNs, result_ip};
use istio_cni::wire::event::{EventIp, EventIpNet, PluginAddEvent};
use serde_json::json;
use support::real_cluster::RealCluster;

const AMBIENT: &str = "istio.io/dataplane-mode";

/// A `/cmdadd` body for the pod `pod` of the test's namespace `amb` (its name on the server).
fn body(node: &Node, netns: &str, pod: &str, ips: &[&str]) -> Vec<u8> {
    PluginAddEvent {
        netns: netns.to_string(),
        pod_name: pod.to_string(),
        pod_namespace: node.k8s_ns("amb"),
        ips: ips
            .iter()
            .map(|ip| EventIp {
                interface: Some(0),
                address: EventIpNet::from_cidr(&format!("{ip}/24")).expect("cidr"),
                gateway: None,
            })
            .collect(),
    }
    .to_json()
}

/// POSTs a `/cmdadd` as root (the test process); (status, body).
fn cmdadd(node: &Node, body: Vec<u8>) -> (u16, String) {
    let sock = node.dirs.run.join("pluginevent.sock");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(istio_cni::plugin::uds::post_once(
        &sock,
        "/cmdadd",
        body,
        Duration::from_secs(10),
    ))
    .unwrap_or_else(|e| panic!("POST /cmdadd: {e}\n{}", node.agent.output()))
}

/// The machine's own netns (where this test runs: the "host" outside the node): rules and
/// policy routes, without counters.
fn machine_state() -> String {
    let run = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    let rules: Vec<String> = run("iptables-save", &[])
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split(" [").next().unwrap_or(l).to_string())
        .collect();
    format!("{}\n{}", rules.join("\n"), run("ip", &["rule"]))
}

/// The node netns (the agent's own): rules and policy routes.
fn node_state(node: &Node) -> String {
    let rule = node.ns.exec("ip", &["rule"]);
    format!(
        "{}\n{}",
        node.ns.iptables_state(),
        String::from_utf8_lossy(&rule.stdout)
    )
}

/// The agent's writes on the API server, from its audit log: (verb, requestURI), reads left out.
fn writes(node: &Node) -> Vec<(String, String)> {
    let reads = ["get", "list", "watch"];
    let mut all = node.cluster().requests();
    all.retain(|(verb, _)| !reads.contains(&verb.as_str()));
    all
}

fn adds_of(node: &Node, uid: &str) -> usize {
    node.peer
        .all_requests()
        .iter()
        .filter(|(_, r)| r.is_add_of(uid))
        .count()
}

#[test]
fn a_non_root_peer_is_refused_even_where_the_modes_let_it_in() {
    support::cni_driver::require_tool("setpriv", "util-linux");
    support::cni_driver::require_tool("curl", "curl");
    let node = Node::start_real(Backend::Iptables);
    node.namespace("amb", json!({AMBIENT: "ambient"}));
    let uid = node.pod("amb", "app", json!({}));
    let app = PodNs::new("nonroot");
    // As loose as Istio's own (0666 socket, traversable dirs): only SO_PEERCRED stands between.
    let sock = node.dirs.run.join("pluginevent.sock");
    for (path, mode) in [
        (node.dirs.tmp.path(), 0o711),
        (node.dirs.run.as_path(), 0o711),
        (sock.as_path(), 0o666),
    ] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }
    let data = String::from_utf8(body(&node, &app.path_string(), "app", &["10.244.0.50"])).unwrap();
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "curl",
            "-sS",
        ])
        .args(["--unix-socket", sock.to_str().expect("utf-8")])
        .args(["-X", "POST", "--data", &data, "-w", "\n%{http_code}"])
        .arg("http://agent/cmdadd")
        .output()
        .expect("run curl as nobody");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.ends_with("\n403") && text.contains("uid 65534 is not root"),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The refusal is logged as it is answered; the agent's output reaches the harness through
    // its reader threads, which can lag the answer on a loaded machine.
    node.wait_until(
        Duration::from_secs(5),
        "the refusal in the agent's log",
        || node.agent.output().contains("uid 65534 is not root"),
    );
    assert_eq!(adds_of(&node, &uid), 0);
    assert!(!node.has_inpod_rules(&app));
    assert_eq!(node.redirection("amb", "app"), None);
    assert_eq!(writes(&node), vec![], "the agent wrote to the API server");
}

#[test]
fn the_node_s_and_the_agent_s_netns_and_foreign_addresses_are_refused() {
    let node = Node::start_real(Backend::Iptables);
    node.namespace("amb", json!({AMBIENT: "ambient"}));
    let uid = node.pod("amb", "victim", json!({}));
    // The node holds an address a caller could name.
    let node_ip = "10.98.0.1";
    node.ns
        .exec("ip", &["addr", "add", "10.98.0.1/32", "dev", "lo"]);
    let (machine_before, node_before) = (machine_state(), node_state(&node));
    let agent_netns = format!("/proc/{}/ns/net", node.agent.child.id());
    // The node's netns (pid 1's; on this machine also the test's own) and the agent's own, with
    // an IP the caller claims; the agent must write nothing into either.
    // (Never the machine's netns by another path: on a regressed build that would program the
    // machine this test runs on.)
    for (netns, words) in [
        ("/proc/1/ns/net", "/proc/1/ns/net"),
        (agent_netns.as_str(), "the agent's own netns"),
    ] {
        let (status, text) = cmdadd(&node, body(&node, netns, "victim", &["10.244.0.60"]));
        assert_eq!(status, 500, "{netns}: {text}");
        assert!(text.contains(words), "{netns}: {text}");
    }
    // The agent's own netns holding the address claimed: still refused by identity.
    let (status, text) = cmdadd(&node, body(&node, &agent_netns, "victim", &[node_ip]));
    assert_eq!(status, 500, "{text}");
    assert!(
        text.contains("the agent's own netns, not a pod's"),
        "{text}"
    );

    // A netns of another address than the event names.
    let other = PodNs::new("other");
    other.guard.ip("addr add 10.99.0.5/32 dev lo");
    let (status, text) = cmdadd(
        &node,
        body(&node, &other.path_string(), "victim", &["10.244.0.61"]),
    );
    assert_eq!(status, 500, "{text}");
    assert!(
        text.contains("does not hold 10.244.0.61 (named by the event)")
            && text.contains("10.99.0.5"),
        "{text}"
    );
    assert!(!node.has_inpod_rules(&other));

    // Loopback is never a pod's address (every netns holds it).
    let (status, text) = cmdadd(
        &node,
        body(&node, &other.path_string(), "victim", &["127.0.0.1"]),
    );
    assert_eq!(status, 500, "{text}");
    assert!(
        text.contains("127.0.0.1 is not a pod address (loopback)"),
        "{text}"
    );
    assert!(
        !node.probe_members().iter().any(|(ip, _)| ip == "127.0.0.1"),
        "{:?}",
        node.probe_members()
    );

    assert_eq!(
        machine_state(),
        machine_before,
        "the machine's netns was written"
    );
    assert_eq!(
        node_state(&node),
        node_before,
        "the node's netns was written"
    );
    assert_eq!(
        adds_of(&node, &uid),
        0,
        "ztunnel was told about a refused netns"
    );
    assert!(
        node.probe_members().is_empty(),
        "{:?}",
        node.probe_members()
    );
    assert_eq!(node.redirection("amb", "victim"), None);
    assert_eq!(writes(&node), vec![], "the agent wrote to the API server");
    let log = node.agent.output();
    assert!(
        log.contains("/cmdadd failed") && log.contains("caller_uid=0") && log.contains("inode="),
        "{log}"
    );
}

#[test]
fn an_enrolled_pod_keeps_its_netns_and_a_fifo_fails_fast() {
    let node = Node::start_real(Backend::Iptables);
    node.namespace("amb", json!({AMBIENT: "ambient"}));
    let uid = node.pod("amb", "app", json!({}));
    let app = PodNs::new("app");
    let ip = result_ip(&node.add(&app, "amb", "app").expect("ADD app"));
    node.set_running("amb", "app", &ip);
    node.wait_until(Duration::from_secs(5), "probe entry", || {
        node.probe_members().contains(&(ip.clone(), uid.clone()))
    });
    let old_netns = node.peer.netns_of(&uid).expect("the peer runs app's proxy");

    // Another live netns, even one holding the pod's IP, does not take the pod over.
    let thief = PodNs::new("thief");
    thief.guard.ip(&format!("addr add {ip}/32 dev lo"));
    let adds = adds_of(&node, &uid);
    let (status, text) = cmdadd(&node, body(&node, &thief.path_string(), "app", &[&ip]));
    assert_eq!(status, 500, "{text}");
    assert!(
        text.contains("enrolled with netns") && text.contains("which still exists"),
        "{text}"
    );
    // And a new pod claiming app's IP is refused too.
    let thief_uid = node.pod("amb", "thief", json!({}));
    let (status, text) = cmdadd(&node, body(&node, &thief.path_string(), "thief", &[&ip]));
    assert_eq!(status, 500, "{text}");
    assert!(text.contains("the IP of another pod"), "{text}");
    assert_eq!(adds_of(&node, &thief_uid), 0);

    // A FIFO as the netns of the enrolled pod: refused at once, and nothing of app changes.
    let fifo = node.dirs.tmp.path().join("netns-fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    let started = Instant::now();
    let (status, text) = cmdadd(&node, body(&node, fifo.to_str().unwrap(), "app", &[&ip]));
    let took = started.elapsed();
    assert!(took < Duration::from_secs(1), "the FIFO took {took:?}");
    assert_eq!(status, 500, "{text}");
    assert!(
        text.contains(&format!(
            "{} is a FIFO, not a network namespace",
            fifo.display()
        )),
        "{text}"
    );

    // app is still enrolled as it was: rules, probe entry, annotation, and ztunnel's next
    // snapshot holds it with its old netns.
    assert_eq!(adds_of(&node, &uid), adds, "ztunnel got another Add");
    assert!(node.has_inpod_rules(&app), "app's rules were removed");
    assert!(
        !node.has_inpod_rules(&thief),
        "the thief netns was programmed"
    );
    assert!(node.probe_members().contains(&(ip.clone(), uid.clone())));
    assert_eq!(node.redirection("amb", "app").as_deref(), Some("enabled"));
    let snapshots = node.peer.snapshots();
    node.peer.disconnect();
    let seen = node
        .peer
        .wait_snapshots(snapshots + 1, Duration::from_secs(10));
    assert!(
        seen.iter().any(|r| r.is_add_of(&uid)),
        "app missing from the snapshot: {seen:?}"
    );
    assert_eq!(node.peer.netns_of(&uid), Some(old_netns));

    // A FIFO for a new pod fails fast too, and its later good ADD succeeds.
    let late_uid = node.pod("amb", "late", json!({}));
    let started = Instant::now();
    let (status, text) = cmdadd(
        &node,
        body(&node, fifo.to_str().unwrap(), "late", &["10.244.0.70"]),
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(status, 500, "{text}");
    let late = PodNs::new("late");
    let late_ip = result_ip(
        &node
            .add(&late, "amb", "late")
            .unwrap_or_else(|e| panic!("good ADD after the FIFO: {e}\n{}", node.agent.output())),
    );
    node.wait_until(Duration::from_secs(5), "late enrolled", || {
        node.probe_members()
            .contains(&(late_ip.clone(), late_uid.clone()))
    });
    assert_eq!(node.peer.violations(), Vec::<String>::new());
    node.wait_until(Duration::from_secs(10), "late annotated", || {
        node.redirection("amb", "late").as_deref() == Some("enabled")
    });
    // On the server: the annotation patches of the enrolled pods, none of the refused thief.
    let status_of = |pod: &str| {
        format!(
            "/api/v1/namespaces/{}/pods/{pod}/status",
            node.k8s_ns("amb")
        )
    };
    let writes = writes(&node);
    for (pod, patched) in [("app", true), ("late", true), ("thief", false)] {
        let found = writes
            .iter()
            .any(|(verb, uri)| verb == "patch" && uri.starts_with(&status_of(pod)));
        assert_eq!(found, patched, "{pod}: {writes:#?}");
    }
    let _ = Path::new(&fifo);
}

/// The agent's account on the real server holds the chart's ClusterRoles as Helm renders them and
/// nothing more: what the agent and the repair controller call is allowed, anything else is not
/// (asked of the server's authorizer with SubjectAccessReviews).
#[test]
fn the_agent_account_may_do_what_the_chart_grants_and_nothing_more() {
    let cluster = RealCluster::start();
    let allowed = |verb: &str, resource: &str, subresource: &str| {
        let review = cluster.cp.create(&json!({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": cluster.user(), "resourceAttributes": {
                "verb": verb, "resource": resource, "subresource": subresource,
                "namespace": cluster.ns("amb"), "group": ""}}
        }));
        review["status"]["allowed"] == true
    };
    // RBAC's authorizer reads the bindings from its informer: give it a moment.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !allowed("watch", "pods", "") {
        assert!(
            Instant::now() < deadline,
            "the chart's roles never took effect"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    for (verb, resource, sub) in [
        ("get", "pods", ""),
        ("list", "namespaces", ""),
        ("patch", "pods", "status"),
        ("delete", "pods", ""),
        ("create", "events", ""),
    ] {
        assert!(
            allowed(verb, resource, sub),
            "{verb} {resource}/{sub} refused"
        );
    }
    for (verb, resource, sub) in [
        ("patch", "pods", ""),
        ("create", "pods", ""),
        ("list", "secrets", ""),
        ("create", "namespaces", ""),
        ("delete", "nodes", ""),
    ] {
        assert!(
            !allowed(verb, resource, sub),
            "{verb} {resource}/{sub} allowed"
        );
    }
}
