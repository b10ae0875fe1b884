//! A test ZDS peer that behaves like ztunnel as docs/zds.md describes it: connects (and
//! reconnects forever), sends the hello, answers every request in lock-step, NACKs what ztunnel
//! NACKs (an Add without an fd or with two, undecodable bytes: then it reconnects at once; an Add
//! without workload_info, a Keep after SnapshotSent, a second SnapshotSent: then it "exits"),
//! treats an empty datagram as EOF, reconciles at SnapshotSent, and for every Add opens TCP
//! listeners on 15001 (outbound) and 15006 (inbound plaintext) inside the received netns through
//! the fd (setns on a dedicated thread, with SO_REUSEPORT like ztunnel; dual-stack where the netns
//! has IPv6). Knobs: NACK the next Add, hold acks, drop the connection.
//! Blocking threads, so it is independent of the test's runtime. The in-pod listeners are
//! `proxy`'s.

use std::collections::{BTreeMap, HashSet};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use istio_cni::zds::proto::pb::{self, workload_request::Payload};
use nix::sys::socket::{self, MsgFlags};
use prost::Message;

use crate::zds_raw::{ack, connect, recv, send, wait_readable};

mod proxy;
pub use proxy::{INBOUND_PORT, OUTBOUND_PORT};
use proxy::{Proxy, start_listener};

/// One request as the peer saw it, per connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    Add {
        uid: String,
        name: String,
        namespace: String,
        service_account: String,
        fds: usize,
    },
    Keep {
        uid: String,
        fds: usize,
    },
    Del {
        uid: String,
    },
    SnapshotSent,
    Empty,
    Garbage,
}

impl Seen {
    pub fn is_add_of(&self, wanted: &str) -> bool {
        matches!(self, Seen::Add { uid, .. } if uid == wanted)
    }
    pub fn is_keep_of(&self, wanted: &str) -> bool {
        matches!(self, Seen::Keep { uid, .. } if uid == wanted)
    }
}

#[derive(Default)]
struct Inner {
    conn: u32,
    connected: bool,
    log: Vec<(u32, Seen)>,
    snapshots_done: Vec<u32>,
    proxies: BTreeMap<String, Proxy>,
    mentioned: HashSet<String>,
    snapshot_sent: bool,
    nack_next: Option<(Option<String>, String, bool)>,
    hold: bool,
    disconnect: bool,
    stop: bool,
    violations: Vec<String>,
    exited: bool,
    /// "Not running": no connection is made (a node whose ztunnel has not started or died).
    down: bool,
}

pub struct ZdsPeer {
    inner: Arc<Mutex<Inner>>,
    thread: Option<JoinHandle<()>>,
}

fn lock(m: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

const STEP: Duration = Duration::from_millis(10);

impl ZdsPeer {
    /// Starts connecting to `path` (retrying while nothing listens there).
    pub fn start(path: &Path) -> ZdsPeer {
        Self::start_as(path, false)
    }

    /// A peer that is not running yet (ztunnel late on a new node): [`start_again`] starts it.
    pub fn start_down(path: &Path) -> ZdsPeer {
        Self::start_as(path, true)
    }

    fn start_as(path: &Path, down: bool) -> ZdsPeer {
        let inner = Arc::new(Mutex::new(Inner {
            down,
            ..Inner::default()
        }));
        let shared = inner.clone();
        let path = path.to_path_buf();
        let thread = std::thread::spawn(move || run(&path, &shared));
        ZdsPeer {
            inner,
            thread: Some(thread),
        }
    }

    /// Polls `cond` until it holds; panics after `timeout` naming `what`.
    pub fn wait(&self, timeout: Duration, what: &str, cond: impl Fn(&ZdsPeer) -> bool) {
        let deadline = Instant::now() + timeout;
        while !cond(self) {
            assert!(
                Instant::now() < deadline,
                "zds peer: {what} did not happen within {timeout:?}; seen {:?}",
                self.all_requests()
            );
            std::thread::sleep(STEP);
        }
    }

    /// Waits until `n` snapshots were acked in all; returns the requests of the connection that
    /// sent the n-th.
    pub fn wait_snapshots(&self, n: usize, timeout: Duration) -> Vec<Seen> {
        self.wait(timeout, &format!("snapshot #{n}"), |p| {
            lock(&p.inner).snapshots_done.len() >= n
        });
        let conn = lock(&self.inner).snapshots_done[n - 1];
        self.requests(conn)
    }

    pub fn snapshots(&self) -> usize {
        lock(&self.inner).snapshots_done.len()
    }

    /// The number of the current (or last) connection, from 1.
    pub fn connection(&self) -> u32 {
        lock(&self.inner).conn
    }

    pub fn connected(&self) -> bool {
        lock(&self.inner).connected
    }

    /// The requests seen on connection `conn`, in order.
    pub fn requests(&self, conn: u32) -> Vec<Seen> {
        lock(&self.inner)
            .log
            .iter()
            .filter(|(c, _)| *c == conn)
            .map(|(_, s)| s.clone())
            .collect()
    }

    pub fn all_requests(&self) -> Vec<(u32, Seen)> {
        lock(&self.inner).log.clone()
    }

    /// Running proxies: uid -> (name, namespace, service account).
    pub fn workloads(&self) -> BTreeMap<String, (String, String, String)> {
        lock(&self.inner)
            .proxies
            .iter()
            .map(|(uid, p)| (uid.clone(), p.info.clone()))
            .collect()
    }

    /// The netns identity (dev, inode) the proxy for `uid` runs in.
    pub fn netns_of(&self, uid: &str) -> Option<(u64, u64)> {
        lock(&self.inner).proxies.get(uid).map(|p| p.netns)
    }

    /// Connections accepted by `uid`'s outbound listener (15001) so far (None: no proxy).
    pub fn accepted(&self, uid: &str) -> Option<usize> {
        lock(&self.inner)
            .proxies
            .get(uid)
            .map(|p| p.outbound.accepted.load(Ordering::SeqCst))
    }

    /// Connections accepted by `uid`'s inbound listener (15006) so far (None: no proxy).
    pub fn accepted_inbound(&self, uid: &str) -> Option<usize> {
        lock(&self.inner)
            .proxies
            .get(uid)
            .map(|p| p.inbound.accepted.load(Ordering::SeqCst))
    }

    /// NACKs the next Add with `text`; `close` = then drop the connection, as ztunnel does after
    /// a message it could not read.
    pub fn nack_next(&self, text: &str, close: bool) {
        lock(&self.inner).nack_next = Some((None, text.to_string(), close));
    }

    /// Like [`nack_next`](Self::nack_next), for the next Add of `uid` only.
    pub fn nack_next_add_of(&self, uid: &str, text: &str, close: bool) {
        lock(&self.inner).nack_next = Some((Some(uid.to_string()), text.to_string(), close));
    }

    /// Requests are still read and logged but not answered until [`release_acks`].
    pub fn hold_acks(&self) {
        lock(&self.inner).hold = true;
    }

    pub fn release_acks(&self) {
        lock(&self.inner).hold = false;
    }

    /// Drops the current connection; the peer reconnects.
    pub fn disconnect(&self) {
        lock(&self.inner).disconnect = true;
    }

    /// ztunnel killed: the connection dropped, every proxy gone with the process, no reconnect
    /// until [`start_again`]. Waits until the connection is closed.
    pub fn kill(&self) {
        {
            let mut g = lock(&self.inner);
            g.down = true;
            g.disconnect = true;
            g.proxies.clear();
        }
        self.wait(
            Duration::from_secs(5),
            "the killed peer disconnected",
            |p| !p.connected(),
        );
    }

    /// A new ztunnel process: connects again (a fresh connection, no proxies yet).
    pub fn start_again(&self) {
        let mut g = lock(&self.inner);
        g.proxies.clear();
        g.down = false;
    }

    /// Anything the agent sent that the real ztunnel would reject or die of.
    pub fn violations(&self) -> Vec<String> {
        lock(&self.inner).violations.clone()
    }

    /// Whether the peer "exited" as ztunnel does on a protocol error.
    pub fn exited(&self) -> bool {
        lock(&self.inner).exited
    }
}

impl Drop for ZdsPeer {
    fn drop(&mut self) {
        lock(&self.inner).stop = true;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        lock(&self.inner).proxies.clear();
    }
}

/// The connect / serve / reconnect loop.
fn run(path: &Path, inner: &Arc<Mutex<Inner>>) {
    let mut backoff = Duration::from_millis(10);
    loop {
        {
            let g = lock(inner);
            if g.stop {
                return;
            }
            if g.down {
                drop(g);
                std::thread::sleep(STEP);
                continue;
            }
        }
        let Ok(fd) = connect(path) else {
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_millis(200));
            continue;
        };
        backoff = Duration::from_millis(10);
        if send(&fd, &[0x08, 0x01], None).is_err() {
            continue;
        }
        {
            let mut g = lock(inner);
            g.conn += 1;
            g.connected = true;
            g.disconnect = false;
            g.mentioned.clear();
            g.snapshot_sent = false;
        }
        serve(&fd, inner);
        drop(fd);
        let mut g = lock(inner);
        g.connected = false;
        if g.exited {
            return;
        }
    }
}

/// What to do after a request.
enum Next {
    Reply(String),
    ReplyAndClose(String),
    ReplyAndExit(String),
    Close,
}

fn serve(fd: &OwnedFd, inner: &Arc<Mutex<Inner>>) {
    loop {
        {
            let g = lock(inner);
            if g.stop || g.disconnect {
                return;
            }
        }
        let (bytes, fds) = match recv(fd, 1024) {
            Ok(got) => got,
            Err(nix::errno::Errno::EAGAIN) => {
                wait_readable(fd, STEP);
                continue;
            }
            Err(_) => return,
        };
        let next = handle(&bytes, fds, inner);
        let text = match &next {
            Next::Close => return,
            Next::Reply(t) | Next::ReplyAndClose(t) | Next::ReplyAndExit(t) => t.clone(),
        };
        // Held acks: wait for the release, or for the server to give up on us.
        loop {
            let g = lock(inner);
            if g.stop || g.disconnect {
                return;
            }
            if !g.hold {
                break;
            }
            drop(g);
            if peer_gone(fd) {
                return;
            }
            std::thread::sleep(STEP);
        }
        if send(fd, &ack(&text), None).is_err() {
            return;
        }
        match next {
            Next::Reply(_) => {}
            Next::ReplyAndClose(_) => return,
            Next::ReplyAndExit(_) => {
                lock(inner).exited = true;
                return;
            }
            Next::Close => unreachable!(),
        }
    }
}

/// Whether the server closed its end (a peek reads EOF).
fn peer_gone(fd: &OwnedFd) -> bool {
    let mut b = [0u8; 1];
    matches!(
        socket::recv(
            fd.as_raw_fd(),
            &mut b,
            MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT
        ),
        Ok(0)
    )
}

fn handle(bytes: &[u8], fds: Vec<OwnedFd>, inner: &Arc<Mutex<Inner>>) -> Next {
    let mut g = lock(inner);
    let conn = g.conn;
    if g.down {
        // Killed between the read and the answer: a dead process answers nothing.
        return Next::Close;
    }
    if bytes.is_empty() {
        g.log.push((conn, Seen::Empty));
        g.violations
            .push("an empty datagram (ztunnel reads it as EOF)".into());
        return Next::Close;
    }
    let request = match pb::WorkloadRequest::decode(bytes) {
        Ok(r) => r,
        Err(e) => {
            g.log.push((conn, Seen::Garbage));
            return Next::ReplyAndClose(format!(
                "failure to read message : failed to decode Protobuf message: {e}"
            ));
        }
    };
    let nfds = fds.len();
    match request.payload {
        Some(Payload::Add(add)) => {
            let info = add.workload_info.clone().unwrap_or_default();
            g.log.push((
                conn,
                Seen::Add {
                    uid: add.uid.clone(),
                    name: info.name.clone(),
                    namespace: info.namespace.clone(),
                    service_account: info.service_account.clone(),
                    fds: nfds,
                },
            ));
            if nfds == 0 {
                g.violations.push(format!("add {} without an fd", add.uid));
                return Next::ReplyAndClose("failure to read message : No control message".into());
            }
            if nfds > 1 {
                g.violations
                    .push(format!("add {} with {nfds} fds", add.uid));
                return Next::ReplyAndClose(format!(
                    "failure to read message : Expected 1 FD, got {nfds}"
                ));
            }
            if add.workload_info.is_none() {
                g.violations
                    .push(format!("add {} without workload_info", add.uid));
                return Next::ReplyAndExit(
                    "failure to process message : ProtocolError(\"workload_info is required but \
                     not present\")"
                        .into(),
                );
            }
            let wanted =
                |n: &(Option<String>, String, bool)| n.0.as_ref().is_none_or(|u| *u == add.uid);
            if let Some((_, text, close)) = g.nack_next.take_if(|n| wanted(n)) {
                return if close {
                    Next::ReplyAndClose(text)
                } else {
                    Next::Reply(text)
                };
            }
            let fd = fds.into_iter().next().expect("one fd");
            g.mentioned.insert(add.uid.clone());
            let id = match std::fs::File::from(fd.try_clone().expect("dup")).metadata() {
                Ok(m) => (m.dev(), m.ino()),
                Err(e) => return Next::Reply(format!("failure to start proxy : fstat: {e}")),
            };
            if g.proxies.get(&add.uid).is_some_and(|p| p.netns == id) {
                return Next::Reply(String::new());
            }
            g.proxies.remove(&add.uid);
            let listeners = start_listener(&fd, &add.uid, OUTBOUND_PORT)
                .and_then(|out| Ok((out, start_listener(&fd, &add.uid, INBOUND_PORT)?)));
            match listeners {
                Ok((outbound, inbound)) => {
                    let info = (info.name, info.namespace, info.service_account);
                    g.proxies.insert(
                        add.uid,
                        Proxy {
                            info,
                            netns: id,
                            _fd: fd,
                            outbound,
                            inbound,
                        },
                    );
                    Next::Reply(String::new())
                }
                Err(e) => Next::Reply(format!("failure to start proxy : {e}")),
            }
        }
        Some(Payload::Keep(keep)) => {
            g.log.push((
                conn,
                Seen::Keep {
                    uid: keep.uid.clone(),
                    fds: nfds,
                },
            ));
            if nfds > 0 {
                g.violations.push(format!("keep {} with an fd", keep.uid));
            }
            if g.snapshot_sent {
                g.violations
                    .push(format!("keep {} after SnapshotSent", keep.uid));
                return Next::ReplyAndExit(
                    "failure to process message : ProtocolError(\"keep after snapshot\")".into(),
                );
            }
            g.mentioned.insert(keep.uid);
            Next::Reply(String::new())
        }
        Some(Payload::Del(del)) => {
            g.log.push((
                conn,
                Seen::Del {
                    uid: del.uid.clone(),
                },
            ));
            if nfds > 0 {
                g.violations.push(format!("del {} with an fd", del.uid));
            }
            if g.snapshot_sent {
                g.proxies.remove(&del.uid);
            } else {
                g.mentioned.remove(&del.uid);
            }
            Next::Reply(String::new())
        }
        Some(Payload::SnapshotSent(_)) => {
            g.log.push((conn, Seen::SnapshotSent));
            if nfds > 0 {
                g.violations.push("snapshot_sent with an fd".into());
            }
            if g.snapshot_sent {
                g.violations.push("a second SnapshotSent".into());
                return Next::ReplyAndExit(
                    "failure to process message : ProtocolError(\"snapshot already sent\")".into(),
                );
            }
            g.snapshot_sent = true;
            let mentioned = std::mem::take(&mut g.mentioned);
            g.proxies.retain(|uid, _| mentioned.contains(uid));
            g.mentioned = mentioned;
            g.snapshots_done.push(conn);
            Next::Reply(String::new())
        }
        None => {
            g.log.push((conn, Seen::Garbage));
            Next::ReplyAndClose("failure to read message : empty payload".into())
        }
    }
}
