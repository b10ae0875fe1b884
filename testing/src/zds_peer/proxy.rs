//! The in-pod proxy a received netns gets: TCP listeners on ztunnel's outbound and inbound ports,
//! bound inside that netns from a thread that enters it, each answering a connection with one line
//! naming the pod's uid and counting what it accepted.

use std::io::Write;
use std::net::TcpListener;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;

use nix::sys::socket::{self, AddressFamily, SockFlag, SockType};

use super::STEP;

/// ztunnel's in-pod ports: where the pod's rules send outbound and inbound plaintext TCP.
pub const OUTBOUND_PORT: u16 = 15001;
pub const INBOUND_PORT: u16 = 15006;

/// A running in-pod proxy: the netns fd it keeps and its listeners.
pub(super) struct Proxy {
    pub(super) info: (String, String, String),
    pub(super) netns: (u64, u64),
    pub(super) _fd: OwnedFd,
    pub(super) outbound: ProxyListener,
    pub(super) inbound: ProxyListener,
}

pub(super) struct ProxyListener {
    stop: Arc<AtomicBool>,
    pub(super) accepted: Arc<AtomicUsize>,
    /// Shut down on drop, which wakes the thread's blocking accept (Linux returns EINVAL).
    socket: Arc<TcpListener>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for ProxyListener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = socket::shutdown(self.socket.as_raw_fd(), socket::Shutdown::Read);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Binds `port` on every address inside the netns `fd` names (on a thread that enters it; the
/// socket stays there) and serves it: each connection gets one line naming the uid. The socket is
/// dual-stack (`[::]`, V6ONLY off) so IPv6 traffic lands too; IPv4 only where the netns has no IPv6.
pub(super) fn start_listener(fd: &OwnedFd, uid: &str, port: u16) -> Result<ProxyListener, String> {
    let netns = fd.try_clone().map_err(|e| e.to_string())?;
    let listener = std::thread::spawn(move || -> Result<TcpListener, String> {
        nix::sched::setns(netns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| format!("failed to set netns: {e}"))?;
        let sock = bind_any(port)?;
        socket::listen(&sock, socket::Backlog::new(16).expect("backlog"))
            .map_err(|e| e.to_string())?;
        Ok(TcpListener::from(sock))
    })
    .join()
    .map_err(|_| "listener thread panicked".to_string())??;
    // A blocking accept, not a polling one: a benchmark holds a thousand of these proxies, and
    // a thousand threads waking every few ms would starve the machine being measured.
    let socket = Arc::new(listener);
    let stop = Arc::new(AtomicBool::new(false));
    let accepted = Arc::new(AtomicUsize::new(0));
    let (stop2, accepted2, listener, uid) = (
        stop.clone(),
        accepted.clone(),
        socket.clone(),
        uid.to_string(),
    );
    let thread = std::thread::spawn(move || {
        while !stop2.load(Ordering::SeqCst) {
            match listener.accept() {
                Ok((mut stream, _)) => {
                    accepted2.fetch_add(1, Ordering::SeqCst);
                    let _ = writeln!(stream, "zds-peer {uid}");
                }
                Err(_) => std::thread::sleep(STEP),
            }
        }
    });
    Ok(ProxyListener {
        stop,
        accepted,
        socket,
        thread: Some(thread),
    })
}

/// A TCP socket bound to `[::]:port` (dual-stack), or `0.0.0.0:port` where IPv6 is off.
fn bind_any(port: u16) -> Result<OwnedFd, String> {
    let stream = |family| {
        socket::socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)
            .map_err(|e| e.to_string())
    };
    let reuse = |sock: &OwnedFd| {
        socket::setsockopt(sock, socket::sockopt::ReusePort, &true).map_err(|e| e.to_string())
    };
    if let Ok(sock) = stream(AddressFamily::Inet6) {
        reuse(&sock)?;
        socket::setsockopt(&sock, socket::sockopt::Ipv6V6Only, &false)
            .map_err(|e| e.to_string())?;
        let any = std::net::SocketAddrV6::new(std::net::Ipv6Addr::UNSPECIFIED, port, 0, 0);
        if socket::bind(sock.as_raw_fd(), &socket::SockaddrIn6::from(any)).is_ok() {
            return Ok(sock);
        }
    }
    let sock = stream(AddressFamily::Inet)?;
    reuse(&sock)?;
    let any = std::net::SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, port);
    socket::bind(sock.as_raw_fd(), &socket::SockaddrIn::from(any))
        .map_err(|e| format!("Bind(0.0.0.0:{port}, {e})"))?;
    Ok(sock)
}
