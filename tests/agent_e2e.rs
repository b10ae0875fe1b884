//! End to end, ambient mode (issue 10): the real install-cni with the agent and the real data
//! plane, in a node netns of its own, the real kube-apiserver (through a relay on the node netns's
//! loopback: `Node::start_real`), the test ZDS peer, and the real CNI
//! chain (bridge + host-local + loopback + ours). A pod in an ambient namespace gets ADD success
//! only after the peer acked; its outbound TCP lands on the peer's 15001 listener opened inside
//! the pod netns through the fd; it is annotated `enabled`; the node's probe set holds its IP
//! with its UID; DEL + pod deletion take it all back. Run once per backend.

#[path = "support/ambient_node.rs"]
mod ambient_node;
mod install_support;
mod support;

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use ambient_node::{Backend, Node, PodNs, result_ip};
use serde_json::json;
use support::zds_peer::Seen;

const AMBIENT: &str = "istio.io/dataplane-mode";

/// Binds a listener inside `netns`.
fn listen_in(netns: &Path, port: u16) -> TcpListener {
    istio_cni::netns::Netns::open(netns)
        .and_then(|ns| ns.run(move || TcpListener::bind(("0.0.0.0", port))))
        .expect("enter netns")
        .unwrap_or_else(|e| panic!("bind {port}: {e}"))
}

/// Connects from inside `netns` and sends a line; whether the connect succeeded.
fn connect_from(netns: &Path, to: SocketAddr) -> bool {
    istio_cni::netns::Netns::open(netns)
        .and_then(|ns| {
            ns.run(move || {
                TcpStream::connect_timeout(&to, Duration::from_secs(3))
                    .and_then(|mut s| s.write_all(b"hello\n"))
                    .is_ok()
            })
        })
        .expect("enter netns")
}

fn accepted_quickly(l: &TcpListener) -> bool {
    l.set_nonblocking(true).expect("nonblocking");
    std::thread::sleep(Duration::from_millis(200));
    l.accept().is_ok()
}

fn main_e2e(backend: Backend) {
    let started = Instant::now();
    let node = Node::start_real(backend);
    node.namespace("amb", json!({AMBIENT: "ambient"}));
    node.namespace("plain", json!({}));
    let uid = node.pod("amb", "app", json!({}));
    node.pod("plain", "server", json!({}));
    let (app, srv) = (PodNs::new("app"), PodNs::new("srv"));

    // A plain pod: the chain passes it through untouched.
    let srv_result = node.add(&srv, "plain", "server").expect("ADD plain pod");
    let srv_ip = result_ip(&srv_result);
    assert!(!node.has_inpod_rules(&srv), "plain pod was programmed");

    // The ambient pod: ADD is held until the peer acks the Add.
    node.peer.hold_acks();
    let app_result = std::thread::scope(|s| {
        let add = s.spawn(|| node.add(&app, "amb", "app"));
        node.wait_until(Duration::from_secs(10), "the peer's Add", || {
            add.is_finished()
                || node
                    .peer
                    .all_requests()
                    .iter()
                    .any(|(_, r)| r.is_add_of(&uid))
        });
        if add.is_finished() {
            panic!(
                "ADD ended before the peer acked: {:?}\n{}",
                add.join(),
                node.agent.output()
            );
        }
        std::thread::sleep(Duration::from_millis(300));
        assert!(!add.is_finished(), "ADD returned before the peer acked");
        node.peer.release_acks();
        add.join().expect("ADD thread")
    })
    .unwrap_or_else(|e| panic!("ADD ambient pod: {e}\nagent log:\n{}", node.agent.output()));
    let app_ip = result_ip(&app_result);
    node.set_running("amb", "app", &app_ip);
    assert!(node.has_inpod_rules(&app), "no in-pod rules");
    assert_eq!(node.peer.violations(), Vec::<String>::new());

    // Outbound TCP to the other pod lands on the peer's 15001 inside the pod netns.
    let app_path = app.guard.path();
    let server = listen_in(&srv.guard.path(), 8080);
    let dest: SocketAddr = format!("{srv_ip}:8080").parse().expect("addr");
    assert!(connect_from(&app_path, dest), "outbound connect failed");
    node.wait_until(Duration::from_secs(5), "the peer's 15001 accept", || {
        node.peer.accepted(&uid) == Some(1)
    });
    assert!(!accepted_quickly(&server), "reached the server uncaptured");

    node.wait_until(Duration::from_secs(5), "annotation enabled", || {
        node.redirection("amb", "app").as_deref() == Some("enabled")
    });
    node.wait_until(Duration::from_secs(5), "probe set member", || {
        node.probe_members()
            .contains(&(app_ip.clone(), uid.clone()))
    });
    assert!(
        !node.probe_members().iter().any(|(ip, _)| *ip == srv_ip),
        "plain pod in the probe set"
    );

    // DEL (the agent keeps the pod: Istio's DEL is a no-op in ambient), then the pod is deleted.
    node.del(&app, "amb", "app").expect("DEL ambient pod");
    node.del(&srv, "plain", "server").expect("DEL plain pod");
    node.delete_pod("amb", "app");
    node.wait_until(Duration::from_secs(10), "peer got Del", || {
        node.peer
            .all_requests()
            .iter()
            .any(|(_, r)| *r == Seen::Del { uid: uid.clone() })
    });
    node.wait_until(Duration::from_secs(5), "probe set emptied", || {
        !node.probe_members().iter().any(|(ip, _)| *ip == app_ip)
    });
    assert!(
        node.peer.workloads().is_empty(),
        "{:?}",
        node.peer.workloads()
    );
    assert_eq!(node.peer.violations(), Vec::<String>::new());
    eprintln!("{backend:?} e2e took {:?}", started.elapsed());
}

#[test]
fn ambient_pod_end_to_end_iptables() {
    main_e2e(Backend::Iptables);
}

#[test]
fn ambient_pod_end_to_end_nftables() {
    main_e2e(Backend::Nftables);
}

/// The plugin's budget for the /cmdadd exchange (src/plugin/add.rs AMBIENT_EVENT_TIMEOUT) plus
/// the lookups before it and process start: the ADD must have failed by then.
const ADD_FAILS_WITHIN: Duration = Duration::from_secs(8);

/// Issue 20 class 7: only a stale socket or a dangling symlink at `ZTUNNEL_UDS_ADDRESS` is
/// replaced; a regular file there stops startup naming the path, and is left as it was.
#[test]
fn only_a_stale_ztunnel_socket_is_replaced_and_a_regular_file_stops_startup_untouched() {
    let mut node = Node::start_real(Backend::Iptables);
    // Killed: its socket file stays behind, stale.
    let snapshots = node.peer.snapshots();
    node.relaunch_agent_killed();
    node.peer
        .wait_snapshots(snapshots + 1, Duration::from_secs(30));
    let _ = node.agent.child.kill();
    let _ = node.agent.child.wait();
    std::fs::remove_file(&node.zds_socket).expect("rm");
    std::os::unix::fs::symlink(node.dirs.tmp.path().join("nowhere"), &node.zds_socket)
        .expect("dangling symlink");
    let snapshots = node.peer.snapshots();
    node.relaunch_agent_killed();
    node.peer
        .wait_snapshots(snapshots + 1, Duration::from_secs(30));

    let _ = node.agent.child.kill();
    let _ = node.agent.child.wait();
    std::fs::remove_file(&node.zds_socket).expect("rm");
    std::fs::write(&node.zds_socket, b"not a socket").expect("regular file");
    // As on a node's first start: the backend record this start writes goes if the start fails.
    let record = node.dirs.run.join("ambient-backend");
    std::fs::remove_file(&record).expect("rm backend record");
    node.relaunch_agent_killed();
    let status = node.agent.wait(Duration::from_secs(30));
    assert!(!status.success(), "started with a file at the ZDS path");
    let out = node.agent.output();
    let path = node.zds_socket.display().to_string();
    assert!(
        out.lines()
            .any(|l| l.contains(&path) && l.contains("a regular file")),
        "no error naming {path}:\n{out}"
    );
    assert_eq!(
        std::fs::read(&node.zds_socket).expect("file kept"),
        b"not a socket"
    );
    // A failed start leaves none of what it made: its sockets and its fresh backend record.
    for left in ["log.sock", "pluginevent.sock", "ambient-backend"] {
        assert!(
            std::fs::symlink_metadata(node.dirs.run.join(left)).is_err(),
            "{left} left behind by a failed start:\n{out}"
        );
    }
}

#[test]
fn add_fails_fast_and_clean_when_the_agent_is_down() {
    let mut node = Node::start_real(Backend::Iptables);
    node.namespace("amb", json!({AMBIENT: "ambient"}));
    let uid = node.pod("amb", "app", json!({}));
    // The agent dies (no graceful shutdown, so the installed config stays as on a crash) and
    // its socket is gone.
    node.agent.child.kill().expect("kill install-cni");
    node.agent.child.wait().expect("wait install-cni");
    let _ = std::fs::remove_file(node.dirs.run.join("pluginevent.sock"));
    let app = PodNs::new("down");
    let started = Instant::now();
    let err = node
        .add(&app, "amb", "app")
        .expect_err("ADD must fail without the agent");
    let took = started.elapsed();
    assert!(took < ADD_FAILS_WITHIN, "ADD took {took:?}");
    assert!(
        err.contains("failed to contact node Istio CNI agent") && err.contains("pluginevent.sock"),
        "unclear error: {err}"
    );
    // Nothing half-enrolled: no rules, nothing sent to ztunnel, no annotation, no probe entry.
    assert!(!node.has_inpod_rules(&app), "rules left in the pod netns");
    assert!(
        !node
            .peer
            .all_requests()
            .iter()
            .any(|(_, r)| r.is_add_of(&uid))
    );
    assert_eq!(node.redirection("amb", "app"), None);
    assert!(node.probe_members().is_empty());
}

/// ztunnel does not ack in time. The agent's ZDS ack budget ends before the plugin's, so the
/// plugin gets the agent's answer (not its own timeout). Cleanup that runs: the pod is marked
/// `pending`, kept out of the probe set, and stays in the agent's cache with its netns (its
/// in-pod rules stay, failing closed as in Istio) so ztunnel gets it in the snapshot when it
/// reconnects; the kubelet's retried ADD then completes the enrolment.
#[test]
fn add_fails_within_the_deadline_when_ztunnel_is_slow_and_the_retry_completes() {
    let node = Node::start_real(Backend::Iptables);
    node.namespace("amb", json!({AMBIENT: "ambient"}));
    let uid = node.pod("amb", "app", json!({}));
    let app = PodNs::new("slow");
    node.peer.hold_acks();
    let started = Instant::now();
    let err = node
        .add(&app, "amb", "app")
        .expect_err("ADD must fail while ztunnel holds its ack");
    let took = started.elapsed();
    assert!(took < ADD_FAILS_WITHIN, "ADD took {took:?}");
    // The agent's reason, not the plugin's own timeout.
    assert!(
        err.contains("status 504")
            && err.contains(&format!(
                "pod {}/app not enrolled within",
                node.k8s_ns("amb")
            )),
        "{err}"
    );
    eprintln!("slow ADD failed after {took:?}: {err}");
    node.wait_until(Duration::from_secs(5), "annotation pending", || {
        node.redirection("amb", "app").as_deref() == Some("pending")
    });
    assert!(
        node.probe_members().is_empty(),
        "{:?}",
        node.probe_members()
    );

    // ztunnel catches up; the kubelet tears the failed sandbox down (DEL) and retries it (same
    // netns here).
    node.peer.release_acks();
    node.del(&app, "amb", "app")
        .expect("DEL after the failed ADD");
    let result = node
        .add(&app, "amb", "app")
        .unwrap_or_else(|e| panic!("retried ADD: {e}\n{}", node.agent.output()));
    let ip = result_ip(&result);
    node.wait_until(Duration::from_secs(5), "annotation enabled", || {
        node.redirection("amb", "app").as_deref() == Some("enabled")
    });
    assert!(node.probe_members().contains(&(ip, uid.clone())));
    assert!(node.peer.workloads().contains_key(&uid));
    assert!(node.has_inpod_rules(&app));

    // Deleted before the kubelet ever reported its IP (the pod object has none): its probe
    // entry still goes, found by its UID.
    node.delete_pod("amb", "app");
    node.wait_until(Duration::from_secs(10), "probe entry removed", || {
        node.probe_members().is_empty()
    });
    assert_eq!(node.peer.violations(), Vec::<String>::new());
}
