//! The ZDS server against the ztunnel-like test peer (tests/support/zds_peer.rs), with real
//! network namespaces (`ip netns add`, unique names, removed on drop): snapshots, the connection
//! set, lock-step and its deadlines, malformed frames, fd checks, NACK handling, rate limiting,
//! and TCP into a pod netns through the peer's in-pod listener.

mod support;

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use istio_cni::netns::Netns as NetnsHandle;
use istio_cni::zds::{self, PodWorkload, SnapshotEntry, SnapshotSource, ZdsConfig, ZdsError};
use support::zds_peer::{Seen, ZdsPeer};
use support::zds_raw::RawConn;
use support::{Netns, PodAndServer};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(10);

/// The agent's enrolled pods, editable by the test.
#[derive(Default)]
struct Pods(Mutex<Vec<SnapshotEntry>>);

impl SnapshotSource for Pods {
    fn snapshot(&self) -> Vec<SnapshotEntry> {
        self.0.lock().unwrap().clone()
    }
}

impl Pods {
    fn add(&self, uid: &str, netns: Option<Arc<NetnsHandle>>) {
        self.0.lock().unwrap().push(SnapshotEntry {
            uid: uid.into(),
            info: info(uid),
            netns,
        });
    }
}

fn info(uid: &str) -> PodWorkload {
    PodWorkload {
        name: format!("pod-{uid}"),
        namespace: "default".into(),
        service_account: "sa".into(),
    }
}

fn open(ns: &Netns) -> Arc<NetnsHandle> {
    Arc::new(NetnsHandle::open(Path::new(&ns.path())).expect("open pod netns"))
}

fn config(dir: &tempfile::TempDir) -> ZdsConfig {
    ZdsConfig {
        socket: dir.path().join("ztunnel/ztunnel.sock"),
        hello_timeout: Duration::from_secs(1),
        ack_timeout: Duration::from_secs(2),
        update_timeout: Duration::from_secs(8),
        accept_interval: Duration::from_millis(20),
        ..ZdsConfig::default()
    }
}

struct Server {
    handle: zds::ZdsHandle,
    pods: Arc<Pods>,
    socket: PathBuf,
    shutdown: CancellationToken,
    cfg: ZdsConfig,
    _dir: tempfile::TempDir,
}

async fn start(tune: impl FnOnce(&mut ZdsConfig)) -> Server {
    support::require_root();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir);
    tune(&mut cfg);
    let pods = Arc::new(Pods::default());
    let shutdown = CancellationToken::new();
    let handle = zds::serve(cfg.clone(), pods.clone(), shutdown.clone())
        .await
        .expect("serve");
    Server {
        handle,
        pods,
        socket: cfg.socket.clone(),
        shutdown,
        cfg,
        _dir: dir,
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Polls an async-side condition (the peer's own `wait` covers the peer side).
async fn until(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn add(uid: &str) -> Seen {
    let i = info(uid);
    Seen::Add {
        uid: uid.into(),
        name: i.name,
        namespace: i.namespace,
        service_account: i.service_account,
        fds: 1,
    }
}

fn keep(uid: &str) -> Seen {
    Seen::Keep {
        uid: uid.into(),
        fds: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_after_a_reconnect_lists_every_pod_with_one_fd_each() {
    let s = start(|_| {}).await;
    let nets: Vec<Netns> = (0..3).map(|_| Netns::new("zdssnap")).collect();
    for (i, ns) in nets.iter().enumerate() {
        s.pods.add(&format!("u{i}"), Some(open(ns)));
    }
    s.pods.add("nofd", None);
    let peer = ZdsPeer::start(&s.socket);
    let expected = vec![
        add("u0"),
        add("u1"),
        add("u2"),
        keep("nofd"),
        Seen::SnapshotSent,
    ];
    assert_eq!(peer.wait_snapshots(1, WAIT), expected);
    assert_eq!(peer.workloads().len(), 3);
    let first_netns = peer.netns_of("u1");
    until("gauge = 1", || s.cfg.metrics.ztunnel_connected.get() == 1).await;

    peer.disconnect();
    assert_eq!(peer.wait_snapshots(2, WAIT), expected);
    assert_eq!(peer.connection(), 2);
    assert_eq!(peer.workloads().len(), 3, "reconnect keeps every proxy");
    assert_eq!(peer.netns_of("u1"), first_netns);
    until("one connection", || s.handle.connections() == 1).await;
    assert_eq!(s.cfg.metrics.ztunnel_connected.get(), 1);
    assert_eq!(peer.violations(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adds_go_to_the_newest_connection_and_deletes_to_all() {
    let s = start(|_| {}).await;
    let old = ZdsPeer::start(&s.socket);
    old.wait_snapshots(1, WAIT);
    until("first connection", || s.handle.connections() == 1).await;
    let new = ZdsPeer::start(&s.socket);
    new.wait_snapshots(1, WAIT);
    until("two connections", || s.handle.connections() == 2).await;
    assert_eq!(s.cfg.metrics.ztunnel_connected.get(), 2);

    let ns = Netns::new("zdsnewest");
    s.pods.add("a", Some(open(&ns)));
    s.handle
        .add_workload("a", &info("a"), &open(&ns))
        .await
        .expect("add");
    assert!(new.requests(1).contains(&add("a")));
    assert!(!old.requests(1).iter().any(|r| r.is_add_of("a")));
    assert!(new.workloads().contains_key("a"));

    s.handle.del_workload("a").await.expect("del");
    for peer in [&old, &new] {
        assert_eq!(
            peer.requests(1).last(),
            Some(&Seen::Del { uid: "a".into() })
        );
    }
    assert!(new.workloads().is_empty());

    // The newest leaves: adds fall back to the one before.
    drop(new);
    until("one connection", || s.handle.connections() == 1).await;
    s.handle
        .add_workload("b", &info("b"), &open(&ns))
        .await
        .expect("add to the remaining connection");
    assert!(old.requests(1).contains(&add("b")));
    assert_eq!(old.violations(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_during_a_snapshot_waits_for_snapshot_sent() {
    let s = start(|_| {}).await;
    let ns = Netns::new("zdsdelwait");
    s.pods.add("p", Some(open(&ns)));
    let peer = ZdsPeer::start(&s.socket);
    peer.hold_acks();
    peer.wait(WAIT, "the snapshot's add", |p| {
        p.requests(1).first().is_some_and(|r| r.is_add_of("p"))
    });
    until("registered", || s.handle.connections() == 1).await;
    let handle = s.handle.clone();
    let del = tokio::spawn(async move { handle.del_workload("gone").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(peer.requests(1), vec![add("p")], "the delete must wait");
    peer.release_acks();
    del.await.unwrap().expect("del");
    assert_eq!(
        peer.requests(1),
        vec![
            add("p"),
            Seen::SnapshotSent,
            Seen::Del { uid: "gone".into() }
        ]
    );
    assert_eq!(peer.violations(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_that_never_comes_closes_the_connection_and_the_next_snapshot_is_complete() {
    let s = start(|c| c.ack_timeout = Duration::from_millis(700)).await;
    let nets: Vec<Netns> = (0..3).map(|_| Netns::new("zdsacktmo")).collect();
    s.pods.add("u0", Some(open(&nets[0])));
    s.pods.add("u1", Some(open(&nets[1])));
    let peer = ZdsPeer::start(&s.socket);
    peer.wait_snapshots(1, WAIT);
    until("registered", || s.handle.connections() == 1).await;

    peer.hold_acks();
    s.pods.add("u2", Some(open(&nets[2])));
    let started = Instant::now();
    let err = s
        .handle
        .add_workload("u2", &info("u2"), &open(&nets[2]))
        .await
        .unwrap_err();
    assert!(matches!(err, ZdsError::AckTimeout { .. }), "{err}");
    assert!(retried(err));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    peer.release_acks();

    let snapshot = peer.wait_snapshots(2, WAIT);
    assert_eq!(
        snapshot,
        vec![add("u0"), add("u1"), add("u2"), Seen::SnapshotSent]
    );
    assert!(peer.connection() >= 2);
    assert_eq!(peer.workloads().len(), 3);
    assert_eq!(peer.violations(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_frames_close_only_their_own_connection() {
    let s = start(|_| {}).await;
    let peer = ZdsPeer::start(&s.socket);
    peer.wait_snapshots(1, WAIT);
    until("registered", || s.handle.connections() == 1).await;
    let eof = Some(Vec::new());

    // A hello that is not protobuf.
    let c = RawConn::connect(&s.socket);
    c.send(&[0xff, 0xff, 0xff]);
    assert_eq!(c.recv(WAIT), eof, "garbage hello closes");

    // Garbage instead of an ack (the empty snapshot is just SnapshotSent).
    let c = RawConn::connect(&s.socket);
    c.send(&[0x08, 0x01]);
    assert_eq!(c.recv(WAIT), Some(vec![0x1a, 0x00]));
    c.send(&[0xff]);
    assert_eq!(c.recv(WAIT), eof, "garbage ack closes");

    // A datagram nobody asked for.
    let c = RawConn::connect(&s.socket);
    c.send(&[0x08, 0x01]);
    assert_eq!(c.recv(WAIT), Some(vec![0x1a, 0x00]));
    c.send(&[0x0a, 0x00]);
    c.send(&[0x0a, 0x00]);
    assert_eq!(c.recv(WAIT), eof, "unsolicited datagram closes");

    // No hello at all: closed after the hello deadline (1 s here).
    let c = RawConn::connect(&s.socket);
    let started = Instant::now();
    assert_eq!(c.recv(WAIT), eof);
    assert!(started.elapsed() >= Duration::from_millis(900));

    // The well-behaved connection never noticed.
    until("only the peer left", || s.handle.connections() == 1).await;
    assert_eq!(peer.connection(), 1);
    let ns = Netns::new("zdsmalformed");
    s.handle
        .add_workload("ok", &info("ok"), &open(&ns))
        .await
        .expect("add after the bad clients");
    assert!(peer.workloads().contains_key("ok"));
    assert_eq!(peer.violations(), Vec::<String>::new());
}

/// A namespace of another kind never becomes a handle (`Netns::open` checks nsfs and
/// `NS_GET_NSTYPE` first, issue 20 §2), so it can never reach ztunnel; the ZDS server's own check
/// before sending (`ZdsError::NotANetns`) stays as a second layer, unit-tested in `zds::socket`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_that_is_not_a_netns_never_becomes_a_handle() {
    let s = start(|_| {}).await;
    let ns = Netns::new("zdsnotnet");
    let err = NetnsHandle::open(Path::new("/proc/self/ns/uts")).expect_err("a UTS namespace");
    assert!(err.to_string().contains("/proc/self/ns/uts"), "{err}");
    assert!(err.to_string().contains("UTS"), "{err}");
    s.pods.add("good", Some(open(&ns)));
    let peer = ZdsPeer::start(&s.socket);
    assert_eq!(
        peer.wait_snapshots(1, WAIT),
        vec![add("good"), Seen::SnapshotSent]
    );
    assert_eq!(peer.violations(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_error_acks_are_nacks_with_their_text_and_keep_the_connection() {
    let s = start(|_| {}).await;
    let peer = ZdsPeer::start(&s.socket);
    peer.wait_snapshots(1, WAIT);
    until("registered", || s.handle.connections() == 1).await;
    let ns = Netns::new("zdsbignack");

    // 12 KB, as ztunnel's backtrace-laden NACKs are: fits the 64 KiB buffer whole.
    let text = format!(
        "failure to start proxy : {}",
        "backtrace line\n".repeat(820)
    );
    assert!(text.len() > 12_000);
    peer.nack_next(&text, false);
    match s.handle.add_workload("a", &info("a"), &open(&ns)).await {
        Err(ZdsError::Nack { uid, message }) => {
            assert_eq!(uid, "a");
            assert_eq!(message, text);
        }
        other => panic!("expected a NACK, got {other:?}"),
    }

    // 100 KB does not fit: the beginning comes back, marked as cut.
    let text = format!("failure to start proxy : {}", "x".repeat(100_000));
    peer.nack_next(&text, false);
    match s.handle.add_workload("b", &info("b"), &open(&ns)).await {
        Err(ZdsError::Nack { message, .. }) => {
            assert!(
                message.starts_with("failure to start proxy : xxx"),
                "{message:.80}"
            );
            assert!(
                message.ends_with("(truncated)"),
                "{}",
                &message[message.len() - 40..]
            );
            assert!(message.len() < 70_000);
        }
        other => panic!("expected a NACK, got {other:?}"),
    }

    // Same connection, still in step.
    s.handle
        .add_workload("c", &info("c"), &open(&ns))
        .await
        .expect("add after the NACKs");
    assert_eq!(peer.connection(), 1);
    assert_eq!(s.handle.connections(), 1);
    assert_eq!(peer.violations(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nacked_pod_stays_out_of_snapshots_until_its_backoff_elapses() {
    let s = start(|c| {
        c.nack_backoff_first = Duration::from_secs(2);
        c.nack_backoff_max = Duration::from_secs(2);
    })
    .await;
    let peer = ZdsPeer::start(&s.socket);
    peer.wait_snapshots(1, WAIT);
    until("registered", || s.handle.connections() == 1).await;
    let (na, nb) = (Netns::new("zdsnacka"), Netns::new("zdsnackb"));

    // An add NACKed on a live connection: the error carries ztunnel's text...
    peer.nack_next("failure to start proxy : Bind(AddrInUse)", false);
    s.pods.add("a", Some(open(&na)));
    let nacked_at = Instant::now();
    let err = s
        .handle
        .add_workload("a", &info("a"), &open(&na))
        .await
        .unwrap_err();
    assert!(matches!(&err, ZdsError::Nack { message, .. } if message.contains("AddrInUse")));
    assert!(retried(err));
    // ... and the pod is held back: no resend now, only a Keep in the next snapshot.
    let err = s
        .handle
        .add_workload("a", &info("a"), &open(&na))
        .await
        .unwrap_err();
    assert!(matches!(err, ZdsError::Backoff { .. }), "{err}");
    peer.disconnect();
    assert_eq!(
        peer.wait_snapshots(2, WAIT),
        vec![keep("a"), Seen::SnapshotSent]
    );

    // Past the backoff (1-2 s), the next snapshot carries the Add again.
    tokio::time::sleep(Duration::from_secs(2).saturating_sub(nacked_at.elapsed())).await;
    peer.disconnect();
    assert_eq!(
        peer.wait_snapshots(3, WAIT),
        vec![add("a"), Seen::SnapshotSent]
    );
    assert!(peer.workloads().contains_key("a"));

    // A NACK that makes ztunnel drop the connection in the middle of a snapshot: one reconnect,
    // whose snapshot skips the bad pod, and then quiet — no reconnect loop.
    s.pods.add("b", Some(open(&nb)));
    peer.nack_next_add_of("b", "failure to read message : boom", true);
    let connection_before = peer.connection();
    peer.disconnect();
    assert_eq!(
        peer.wait_snapshots(4, WAIT),
        vec![add("a"), keep("b"), Seen::SnapshotSent]
    );
    let settled = peer.connection();
    assert_eq!(settled, connection_before + 2, "{:?}", peer.all_requests());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(peer.connection(), settled, "no reconnect loop");
    assert_eq!(peer.violations(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepts_are_rate_limited_to_five_per_second() {
    let s = start(|c| {
        c.accept_interval = ZdsConfig::default().accept_interval;
        c.ack_timeout = Duration::from_secs(5);
    })
    .await;
    let started = Instant::now();
    let clients: Vec<RawConn> = (0..6)
        .map(|_| {
            let c = RawConn::connect(&s.socket);
            c.send(&[0x08, 0x01]);
            c
        })
        .collect();
    until("six connections", || s.handle.connections() == 6).await;
    let took = started.elapsed();
    // Five gaps of 200 ms between six accepts.
    assert!(took >= Duration::from_millis(950), "{took:?}");
    drop(clients);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_from_another_netns_reaches_the_peer_listener_inside_the_pod() {
    let s = start(|_| {}).await;
    let net = PodAndServer::new("zdstcp");
    s.pods.add("pod", Some(open(&net.pod)));
    let peer = ZdsPeer::start(&s.socket);
    peer.wait_snapshots(1, WAIT);
    let target = format!("{}:15001", net.pod_ip);
    let line = net
        .server
        .spawn(move || {
            let stream = std::net::TcpStream::connect_timeout(
                &target.parse().unwrap(),
                Duration::from_secs(2),
            )
            .expect("connect into the pod netns");
            stream
                .set_read_timeout(Some(Duration::from_secs(2)))
                .unwrap();
            let mut line = String::new();
            std::io::BufReader::new(stream)
                .read_line(&mut line)
                .unwrap();
            line
        })
        .join()
        .unwrap();
    assert_eq!(line, "zds-peer pod\n");
    assert_eq!(peer.accepted("pod"), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_socket_replaces_a_stale_socket_and_goes_away_at_shutdown() {
    support::require_root();
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&dir);
    std::fs::create_dir_all(cfg.socket.parent().unwrap()).unwrap();
    // A socket a previous run left (a regular file is refused: see agent_e2e).
    drop(std::os::unix::net::UnixListener::bind(&cfg.socket).unwrap());
    let shutdown = CancellationToken::new();
    let handle = zds::serve(cfg.clone(), Arc::new(Pods::default()), shutdown.clone())
        .await
        .expect("serve over a stale socket");
    let peer = ZdsPeer::start(&cfg.socket);
    peer.wait_snapshots(1, WAIT);
    until("registered", || handle.connections() == 1).await;
    assert!(matches!(
        handle
            .add_workload("x", &info("x"), &open(&Netns::new("zdsstop")))
            .await,
        Ok(())
    ));

    shutdown.cancel();
    until("connections closed", || handle.connections() == 0).await;
    until("socket removed", || !cfg.socket.exists()).await;
    assert_eq!(cfg.metrics.ztunnel_connected.get(), 0);
    assert!(matches!(
        handle
            .add_workload("y", &info("y"), &open(&Netns::new("zdsstop")))
            .await,
        Err(ZdsError::NoConnection)
    ));
    // Deletes with no connection are done.
    handle
        .del_workload("x")
        .await
        .expect("del with no connection");
}

/// Whether the agent retries an add that failed so (its one classification of errors).
fn retried(err: ZdsError) -> bool {
    use istio_cni::agent::mesh::{MeshError, classify};
    let failed = MeshError::Ztunnel {
        pod: "ns/pod".into(),
        source: err,
    };
    classify(&failed) == istio_cni::reconcile::Class::Retry
}
