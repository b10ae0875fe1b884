//! Validation mode (`--run-validation`, the istio-validation init container): prove that outbound
//! traffic is redirected by connecting to a fake original destination (127.0.0.6:<probe port>) and
//! checking that one of our listeners on the proxy ports sees it with that original destination.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, SockaddrStorage, sockopt};

use super::values::Settings;

/// Why validation failed.
#[derive(Debug, thiserror::Error)]
pub enum ValidationError {
    #[error("no listener available: {0}")]
    NoListener(String),
    #[error("validation timeout after {0:?}: no redirected connection arrived")]
    Timeout(Duration),
}

fn listen_reuse(addr: SocketAddr) -> nix::Result<TcpListener> {
    let family = if addr.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    let fd = socket::socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)?;
    socket::setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    socket::setsockopt(&fd, sockopt::ReusePort, &true)?;
    socket::bind(fd.as_raw_fd(), &SockaddrStorage::from(addr))?;
    socket::listen(
        &fd,
        socket::Backlog::new(16).unwrap_or(socket::Backlog::MAXCONN),
    )?;
    Ok(TcpListener::from(fd))
}

/// The original destination port of a redirected connection.
pub fn original_dst_port(stream: &TcpStream, ipv6: bool) -> nix::Result<u16> {
    if ipv6 {
        let sa = socket::getsockopt(stream, sockopt::Ip6tOriginalDst)?;
        Ok(u16::from_be(sa.sin6_port))
    } else {
        let sa = socket::getsockopt(stream, sockopt::OriginalDst)?;
        Ok(u16::from_be(sa.sin_port))
    }
}

/// Runs the probe until success or the timeout.
pub fn run(settings: &Settings, ipv6: bool) -> Result<(), ValidationError> {
    let (local, probe_target): (IpAddr, IpAddr) = if ipv6 {
        (
            IpAddr::V6(Ipv6Addr::LOCALHOST),
            IpAddr::V6(Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 6)),
        )
    } else {
        (
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V4(Ipv4Addr::new(127, 0, 0, 6)),
        )
    };
    let ports = [
        &settings.capture.proxy_port,
        &settings.capture.inbound_capture_port,
    ];
    let (found_tx, found_rx) = mpsc::channel::<()>();
    let mut bound = 0;
    let mut addrs = Vec::new();
    for port in ports {
        let Ok(port) = port.parse::<u16>() else {
            continue;
        };
        let addr = SocketAddr::new(local, port);
        addrs.push(addr.to_string());
        let Ok(listener) = listen_reuse(addr) else {
            continue;
        };
        bound += 1;
        let tx = found_tx.clone();
        let probe_port = settings.probe_port;
        std::thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                if let Ok(port) = original_dst_port(&stream, ipv6) {
                    let _ = write!(stream, "{port}");
                    if port == probe_port {
                        let _ = tx.send(());
                    }
                }
            }
        });
    }
    if bound == 0 {
        return Err(ValidationError::NoListener(addrs.join(", ")));
    }
    let deadline = Instant::now() + settings.probe_timeout;
    let target = SocketAddr::new(probe_target, settings.probe_port);
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(ValidationError::Timeout(settings.probe_timeout));
        }
        let _ = TcpStream::connect_timeout(&target, (deadline - now).min(Duration::from_secs(1)));
        let wait = (deadline - Instant::now().min(deadline)).min(Duration::from_secs(1));
        if found_rx.recv_timeout(wait).is_ok() {
            return Ok(());
        }
    }
}
