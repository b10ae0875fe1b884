//! The ONE way the agent serves its listeners (the health and metrics ports, `log.sock`,
//! `pluginevent.sock`, `podfacts/pod.sock`): a bound on open connections per listener, timeouts
//! on slow header reads and idle keep-alives, a deadline per request, and for the Unix sockets
//! root-only peers and a supervised socket file.
//!
//! - **Connections**: each listener keeps at most `max_connections`. At the bound the oldest
//!   connection that is not inside a request is closed to make room (an idle flood cannot keep a
//!   probe or the plugin out); when all are inside requests the new one is closed at once.
//! - **Timeouts**: request headers must arrive within `idle_timeout` of the connection opening or
//!   of the previous response (hyper's header-read timer covers both), each request is answered
//!   within [`REQUEST_TIMEOUT`] (408 past it).
//! - **Unix sockets**: the peer (SO_PEERCRED) must be uid 0; others get 403 (HTTP) or an error
//!   answer and are logged, throttled, with their pid/uid. Every [`CHECK_INTERVAL`] the server
//!   checks its socket file: gone (removed, or a stale socket or dangling symlink in its place)
//!   it binds it again; replaced by another live server or by something that is not a socket it
//!   leaves it alone. Meanwhile readiness fails naming the socket. On shutdown the file is
//!   removed only if it is still ours.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::readiness::{NotReady, Readiness};
use super::socket::{self, BoundSocket, Kind, Peer, SocketFile, SocketState};

/// Deadline of one request (the slowest, `/cmdadd`, answers within 4.5 s).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a Unix server checks its socket file.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// Default of `LISTENER_IDLE_TIMEOUT`.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest buffered request head (hyper's default is ~400 KiB per connection).
const MAX_BUF: usize = 64 * 1024;
/// At most one refusal/overload warning per listener this often (a refused peer must not be
/// able to flood the log).
const WARN_EVERY: Duration = Duration::from_secs(5);

/// Connection bounds of each listener (the plugin opens one connection of each socket per
/// ADD; the ports see the kubelet's probes and one scraper).
pub const MAX_LOG_SINK_CONNECTIONS: usize = 64;
pub const MAX_PLUGIN_EVENT_CONNECTIONS: usize = 128;
pub const MAX_POD_FACTS_CONNECTIONS: usize = 128;
pub const MAX_HEALTH_CONNECTIONS: usize = 32;
pub const MAX_METRICS_CONNECTIONS: usize = 32;
/// Descriptors kept free for the agent's own work (files, netns handles, netlink, ZDS) beyond
/// every listener at its bound.
pub const FD_RESERVE: u64 = 1024;

/// The descriptors the process needs: every listener full, plus the reserve.
pub fn fds_needed() -> u64 {
    let listeners = MAX_LOG_SINK_CONNECTIONS
        + MAX_PLUGIN_EVENT_CONNECTIONS
        + MAX_POD_FACTS_CONNECTIONS
        + MAX_HEALTH_CONNECTIONS
        + MAX_METRICS_CONNECTIONS;
    listeners as u64 + FD_RESERVE
}

/// One listener's limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    /// `LISTENER_IDLE_TIMEOUT`: slow request headers and idle keep-alives are closed after it.
    pub idle_timeout: Duration,
    /// Per-connection byte budget of request content a service may consume ([`ByteBudget`]).
    pub bytes_per_sec: Option<(u64, u64)>,
}

impl Limits {
    pub fn new(max_connections: usize, idle_timeout: Duration) -> Limits {
        Limits {
            max_connections,
            idle_timeout,
            bytes_per_sec: None,
        }
    }
}

/// The open connections of one listener.
pub struct Slots {
    max: usize,
    open: Mutex<(u64, BTreeMap<u64, SlotState>)>,
    /// Most connections open at once since the listener last went idle.
    peak: AtomicUsize,
}

/// A listener that had at least this many connections open gives freed memory back to the
/// system when its last one closes.
const TRIM_AFTER_PEAK: usize = 16;

struct SlotState {
    busy: Arc<AtomicUsize>,
    evict: CancellationToken,
}

/// One admitted connection; dropping it frees the slot.
pub struct Slot {
    id: u64,
    slots: Arc<Slots>,
    busy: Arc<AtomicUsize>,
    evict: CancellationToken,
}

/// Marks a connection as inside a request (not evictable) while it lives.
pub struct Busy(Arc<AtomicUsize>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Slots {
    pub fn new(max: usize) -> Arc<Slots> {
        Arc::new(Slots {
            max: max.max(1),
            open: Mutex::new((0, BTreeMap::new())),
            peak: AtomicUsize::new(0),
        })
    }

    /// Admits a connection, closing the oldest idle one at the bound; `None` when every slot is
    /// inside a request.
    pub fn admit(self: &Arc<Self>) -> Option<Slot> {
        let mut open = self.open.lock();
        if open.1.len() >= self.max {
            let idle = open
                .1
                .iter()
                .find(|(_, s)| s.busy.load(Ordering::SeqCst) == 0)
                .map(|(id, _)| *id);
            let victim = idle.and_then(|id| open.1.remove(&id))?;
            victim.evict.cancel();
        }
        open.0 += 1;
        let id = open.0;
        let busy = Arc::new(AtomicUsize::new(0));
        let evict = CancellationToken::new();
        open.1.insert(
            id,
            SlotState {
                busy: busy.clone(),
                evict: evict.clone(),
            },
        );
        self.peak.fetch_max(open.1.len(), Ordering::SeqCst);
        Some(Slot {
            id,
            slots: self.clone(),
            busy,
            evict,
        })
    }

    /// Connections open now.
    #[cfg(test)]
    pub(crate) fn open(&self) -> usize {
        self.open.lock().1.len()
    }
}

impl Slot {
    pub fn busy(&self) -> Busy {
        self.busy.fetch_add(1, Ordering::SeqCst);
        Busy(self.busy.clone())
    }

    /// Resolves when the listener closed this connection to make room.
    pub fn evicted(&self) -> tokio_util::sync::WaitForCancellationFutureOwned {
        self.evict.clone().cancelled_owned()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let idle = {
            let mut open = self.slots.open.lock();
            open.1.remove(&self.id);
            open.1.is_empty()
        };
        if idle && self.slots.peak.swap(0, Ordering::SeqCst) >= TRIM_AFTER_PEAK {
            release_memory();
        }
    }
}

/// After a burst of connections the allocator keeps the freed memory of thousands of closed
/// connections resident: hand it back now. mimalloc (the node agent's allocator, see
/// src/role_alloc.rs) purges a thread's free pages only when that thread allocates again, which an
/// idle listener does not; glibc (a test build's system allocator) keeps them in its arenas.
fn release_memory() {
    // SAFETY: mi_collect takes no pointers and only returns free memory to the OS (this thread's
    // empty pages, the arenas' free ones); in a process whose allocator is not mimalloc it finds
    // nothing to do.
    unsafe { libmimalloc_sys::mi_collect(true) };
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free heap pages; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A token bucket of bytes: `rate` per second, at most `burst` saved up.
#[derive(Debug)]
pub struct ByteBudget {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
    /// Whether the one warning of this connection has been logged.
    pub warned: bool,
}

impl ByteBudget {
    pub fn new(rate: u64, burst: u64) -> ByteBudget {
        ByteBudget {
            rate: rate as f64,
            burst: burst as f64,
            tokens: burst as f64,
            last: Instant::now(),
            warned: false,
        }
    }

    /// Takes `n` bytes at `now`; false (and nothing taken) when the budget has not got them.
    pub fn take(&mut self, n: usize, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        if self.tokens >= n as f64 {
            self.tokens -= n as f64;
            true
        } else {
            false
        }
    }
}

/// What a handler learns about its connection (a request extension on every request).
#[derive(Clone)]
pub struct ConnInfo {
    /// The Unix peer (none on TCP).
    pub peer: Option<Peer>,
    /// The TCP peer's address (none on a Unix socket).
    pub remote: Option<std::net::SocketAddr>,
    /// `Limits::bytes_per_sec`'s budget of this connection.
    pub budget: Option<Arc<Mutex<ByteBudget>>>,
}

/// A warning at most once per [`WARN_EVERY`], counting what it held back.
struct Throttled {
    last: Mutex<(Option<Instant>, u64)>,
}

impl Throttled {
    fn new() -> Throttled {
        Throttled {
            last: Mutex::new((None, 0)),
        }
    }

    /// `Some(held back since the last one)` when a warning may go out now.
    fn allow(&self) -> Option<u64> {
        let mut last = self.last.lock();
        let now = Instant::now();
        if last.0.is_some_and(|t| now.duration_since(t) < WARN_EVERY) {
            last.1 += 1;
            return None;
        }
        let held = last.1;
        *last = (Some(now), 0);
        Some(held)
    }
}

/// Who is on the other end of a connection.
#[derive(Clone, Default)]
struct Remote {
    peer: Option<Peer>,
    addr: Option<std::net::SocketAddr>,
}

/// Serves one HTTP/1 connection with the limits; `refusal` answers every request 403.
async fn serve_http<I>(
    io: I,
    router: Router,
    slot: Arc<Slot>,
    limits: Limits,
    remote: Remote,
    refusal: Option<String>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let info = ConnInfo {
        peer: remote.peer,
        remote: remote.addr,
        budget: limits
            .bytes_per_sec
            .map(|(rate, burst)| Arc::new(Mutex::new(ByteBudget::new(rate, burst)))),
    };
    let evicted = slot.evicted();
    let svc = TowerToHyperService::new(router);
    let keep_alive = refusal.is_none();
    let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        let busy = slot.busy();
        let refusal = refusal.clone();
        req.extensions_mut().insert(info.clone());
        let answer = match refusal {
            None => Ok(hyper::service::Service::call(&svc, req.map(Body::new))),
            Some(reason) => Err((reason, req.into_body())),
        };
        async move {
            let _busy = busy;
            let response = match answer {
                Ok(fut) => match tokio::time::timeout(REQUEST_TIMEOUT, fut).await {
                    Ok(Ok(r)) => r,
                    Ok(Err(never)) => match never {},
                    Err(_) => text(
                        StatusCode::REQUEST_TIMEOUT,
                        format!("request not done within {REQUEST_TIMEOUT:?}\n"),
                    ),
                },
                Err((reason, body)) => {
                    // Read (a bounded part of) the body first: closing with it unread would
                    // reset the connection before the peer sees why it was refused.
                    let drain = http_body_util::BodyExt::collect(http_body_util::Limited::new(
                        body, MAX_BUF,
                    ));
                    let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
                    text(StatusCode::FORBIDDEN, format!("{reason}\n"))
                }
            };
            Ok::<_, Infallible>(response)
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.idle_timeout)
        .max_buf_size(MAX_BUF)
        .keep_alive(keep_alive)
        // A plugin writes its last log batch and exits without waiting for the answer: a request
        // followed by end-of-file is still served (the answer then goes nowhere).
        .half_close(true)
        .serve_connection(TokioIo::new(io), service);
    tokio::select! {
        _ = conn => {}
        _ = evicted => {}
    }
}

fn text(status: StatusCode, body: String) -> Response<Body> {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Serves `router` on a TCP listener until `stop`.
pub async fn serve_tcp(
    listener: TcpListener,
    name: String,
    router: Router,
    limits: Limits,
    stop: CancellationToken,
) {
    let slots = Slots::new(limits.max_connections);
    let warn_gate = Throttled::new();
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            a = listener.accept() => a,
        };
        let (stream, addr) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                accept_failed(&name, &e, &warn_gate).await;
                continue;
            }
        };
        let Some(slot) = slots.admit() else {
            if let Some(held) = warn_gate.allow() {
                warn!(listener = %name, limit = limits.max_connections, held_back = held, "connection refused: every connection is inside a request");
            }
            continue;
        };
        tokio::spawn(serve_http(
            stream,
            router.clone(),
            Arc::new(slot),
            limits,
            Remote {
                peer: None,
                addr: Some(addr),
            },
            None,
        ));
    }
}

async fn accept_failed(name: &str, e: &std::io::Error, gate: &Throttled) {
    if let Some(held) = gate.allow() {
        warn!(listener = %name, held_back = held, "accept failed: {e}");
    }
    // EMFILE and friends: the pending connection stays queued; do not spin on it.
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// What the accept loop found out about a Unix peer.
#[derive(Debug, Clone)]
pub enum Access {
    Root(Peer),
    Refused(String),
}

/// Handles one accepted Unix connection (its slot is held until the handler's future ends).
pub type UnixHandler = Arc<
    dyn Fn(UnixStream, Access, Arc<Slot>) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync,
>;

/// An HTTP handler for [`serve_unix`].
pub fn http(router: Router, limits: Limits) -> UnixHandler {
    Arc::new(move |stream, access, slot| {
        let router = router.clone();
        Box::pin(async move {
            let (peer, refusal) = match access {
                Access::Root(p) => (Some(p), None),
                Access::Refused(r) => (socket::peer(&stream).ok(), Some(r)),
            };
            let remote = Remote { peer, addr: None };
            serve_http(stream, router, slot, limits, remote, refusal).await;
        })
    })
}

/// What every server of install-cni shares: the readiness its sockets report to, and
/// `LISTENER_IDLE_TIMEOUT`.
#[derive(Clone)]
pub struct Serving {
    pub readiness: Readiness,
    pub idle_timeout: Duration,
}

impl Default for Serving {
    fn default() -> Self {
        Serving {
            readiness: Readiness::default(),
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
        }
    }
}

/// A supervised Unix socket server.
pub struct UnixServer {
    /// Readiness component and log name (the file name, e.g. `log.sock`).
    pub name: String,
    pub limits: Limits,
    pub readiness: Option<Readiness>,
}

/// Binds `path` (see [`socket::bind`]) for a [`UnixServer`].
pub fn bind_unix(
    path: &std::path::Path,
) -> Result<(UnixListener, SocketFile), socket::SocketError> {
    socket::bind(path, Kind::Stream).and_then(BoundSocket::into_tokio)
}

impl UnixServer {
    /// Serves until `stop`: accepts, checks the socket file every [`CHECK_INTERVAL`], and removes
    /// the file on the way out if it is still ours.
    pub async fn run(
        self,
        bound: (UnixListener, SocketFile),
        handler: UnixHandler,
        stop: CancellationToken,
    ) {
        let (mut listener, mut file) = bound;
        let slots = Slots::new(self.limits.max_connections);
        let warn_gate = Throttled::new();
        let mut healthy = true;
        self.ready(Ok(()));
        let mut tick = tokio::time::interval(CHECK_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let accepted = tokio::select! {
                _ = stop.cancelled() => break,
                _ = tick.tick() => {
                    if let Some(rebound) = self.check(&file, &mut healthy) {
                        (listener, file) = rebound;
                    }
                    continue;
                }
                a = listener.accept() => a,
            };
            let stream = match accepted {
                Ok((s, _)) => s,
                Err(e) => {
                    accept_failed(&self.name, &e, &warn_gate).await;
                    continue;
                }
            };
            let access = match socket::root_only(socket::peer(&stream)) {
                Ok(p) => Access::Root(p),
                Err(reason) => {
                    if let Some(held) = warn_gate.allow() {
                        warn!(socket = %file.path().display(), held_back = held, "{reason}");
                    }
                    Access::Refused(reason.to_string())
                }
            };
            let Some(slot) = slots.admit() else {
                if let Some(held) = warn_gate.allow() {
                    warn!(socket = %file.path().display(), limit = self.limits.max_connections, held_back = held, "connection refused: every connection is inside a request");
                }
                continue;
            };
            let slot = Arc::new(slot);
            let evicted = slot.evicted();
            let work = handler(stream, access, slot.clone());
            tokio::spawn(async move {
                let _slot = slot;
                tokio::select! {
                    _ = work => {}
                    _ = evicted => {}
                }
            });
        }
        file.remove_if_ours();
    }

    fn ready(&self, state: Result<(), NotReady>) {
        if let Some(r) = &self.readiness {
            r.set_state(&self.name, state);
        }
    }

    /// One check of the socket file; a new listener when it had to be bound again.
    fn check(&self, file: &SocketFile, healthy: &mut bool) -> Option<(UnixListener, SocketFile)> {
        let path = file.path();
        let why = match file.state() {
            SocketState::Ours => {
                if !*healthy {
                    *healthy = true;
                    self.ready(Ok(()));
                    info!(socket = %path.display(), "socket is back");
                }
                return None;
            }
            SocketState::Taken(why) => {
                let reason = NotReady::Socket {
                    path: path.to_path_buf(),
                    why: why.to_string(),
                    rebinding: false,
                };
                if *healthy {
                    warn!("socket {reason}");
                }
                *healthy = false;
                self.ready(Err(reason));
                return None;
            }
            SocketState::Gone(why) => why,
        };
        let first = std::mem::replace(healthy, false);
        self.ready(Err(NotReady::Socket {
            path: path.to_path_buf(),
            why: why.to_string(),
            rebinding: true,
        }));
        if first {
            warn!(socket = %path.display(), "socket {why}; binding it again");
        }
        match bind_unix(path) {
            // Readiness comes back at the next check, once the new file is seen to be ours.
            Ok(bound) => Some(bound),
            Err(e) => {
                if first {
                    warn!("{e}");
                }
                self.ready(Err(NotReady::Bind(e)));
                None
            }
        }
    }
}

#[cfg(test)]
mod tests;
