//! The API server inside a test's own network namespace: a listener on that namespace's
//! loopback whose connections are relayed to the API server on the host's loopback. Processes
//! run in the namespace (install-cni in a node netns) see the server at `127.0.0.1:<port>`, a
//! name its serving certificate holds, with no address or route added to either namespace.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use super::ControlPlaneError;

/// The relay; stops accepting when dropped (relayed connections end with either side).
pub struct Forwarder {
    port: u16,
    stop: Arc<AtomicBool>,
    /// Bytes relayed from the API server to the namespace's clients so far.
    received: Arc<AtomicU64>,
}

impl Forwarder {
    /// Listens on 127.0.0.1 inside the netns at `netns`, relaying to 127.0.0.1:`upstream` of the
    /// caller's netns (the host's).
    pub(super) fn start(netns: &Path, upstream: u16) -> Result<Forwarder, ControlPlaneError> {
        Self::start_at(netns, upstream, 0)
    }

    /// [`Forwarder::start`] listening on `port` inside the namespace (0: any free one). Giving
    /// the API server's own port makes one kubeconfig valid inside the namespace and outside.
    pub fn start_at(
        netns: &Path,
        upstream: u16,
        port: u16,
    ) -> Result<Forwarder, ControlPlaneError> {
        let io = |what: &str, e: std::io::Error| {
            ControlPlaneError::Client(format!("relay into {}: {what}: {e}", netns.display()))
        };
        let file = File::open(netns).map_err(|e| io("open netns", e))?;
        // The socket belongs to the namespace it was made in; the thread that makes it enters
        // the namespace and ends, the listener stays usable from any thread.
        let listener = std::thread::spawn(move || {
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(std::io::Error::from)?;
            TcpListener::bind(("127.0.0.1", port))
        })
        .join()
        .map_err(|_| io("bind", std::io::Error::other("thread panicked")))?
        .map_err(|e| io("bind", e))?;
        let port = listener.local_addr().map_err(|e| io("address", e))?.port();
        listener
            .set_nonblocking(true)
            .map_err(|e| io("nonblocking", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let received = Arc::new(AtomicU64::new(0));
        let (stopped, counted) = (stop.clone(), received.clone());
        std::thread::spawn(move || accept_loop(listener, upstream, &stopped, &counted));
        Ok(Forwarder {
            port,
            stop,
            received,
        })
    }

    /// Bytes the API server sent through this relay so far (TLS records: what the clients in the
    /// namespace received on the wire).
    pub fn bytes_received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// The port on the namespace's 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn accept_loop(listener: TcpListener, upstream: u16, stop: &AtomicBool, received: &Arc<AtomicU64>) {
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((inside, _)) => {
                let _ = inside.set_nonblocking(false);
                // Connected from this thread: the host's netns, where the API server listens.
                if let Ok(outside) = TcpStream::connect(("127.0.0.1", upstream)) {
                    relay(inside, outside, received);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Copies both ways on two threads until either side closes; counts what the server (`b`) sent.
fn relay(a: TcpStream, b: TcpStream, received: &Arc<AtomicU64>) {
    let none = Arc::new(AtomicU64::new(0));
    for ((mut from, mut to), count) in [
        (a.try_clone(), b.try_clone()),
        (b.try_clone(), a.try_clone()),
    ]
    .into_iter()
    .zip([none, received.clone()])
    .filter_map(|((x, y), c)| Some(((x.ok()?, y.ok()?), c)))
    {
        std::thread::spawn(move || {
            let mut buf = [0u8; 16 * 1024];
            loop {
                match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        count.fetch_add(n as u64, Ordering::Relaxed);
                        if to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                }
            }
            let _ = to.shutdown(Shutdown::Write);
            let _ = from.shutdown(Shutdown::Read);
        });
    }
}
