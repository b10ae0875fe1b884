//! The SOCK_SEQPACKET socket under tokio (AsyncFd over nix; tokio has no seqpacket type): bind
//! with tight permissions, accept, send one datagram with at most one fd, receive one datagram
//! with truncation detection, and classify readiness while idle.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{
    self, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, UnixCredentials, sockopt,
};
use tokio::io::unix::AsyncFd;

use crate::telemetry::socket::{self as binder, Kind, SocketFile};

use super::{ZdsConfig, ZdsError};

/// The listening socket. Dropping it removes the socket file, unless another server has since
/// replaced it (an upgraded agent binding the same path).
pub(crate) struct Listener {
    fd: AsyncFd<OwnedFd>,
    file: SocketFile,
}

/// One accepted connection.
pub(crate) struct Packet {
    fd: AsyncFd<OwnedFd>,
}

/// One received datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Received {
    pub len: usize,
    /// The datagram was longer than the buffer (MSG_TRUNC); only its beginning is there.
    pub truncated: bool,
}

/// What readable readiness on an idle connection means.
#[derive(Debug)]
pub(crate) enum Idle {
    /// The peer closed (or sent an empty datagram, which ztunnel never does).
    Eof,
    /// A datagram nobody asked for: a protocol error in strict lock-step.
    Data(usize),
    Error(io::Error),
}

impl Listener {
    /// Binds with the one binder (`telemetry::socket`): directory 0700 (or tightened), only a
    /// stale socket or a dangling symlink replaced (a regular file at `ZTUNNEL_UDS_ADDRESS` is an
    /// error naming it, and stays), the socket 0600 before it listens.
    pub(crate) fn bind(cfg: &ZdsConfig) -> Result<Listener, ZdsError> {
        let bound = binder::bind(&cfg.socket, Kind::SeqPacket).map_err(|e| ZdsError::Bind {
            path: e.path,
            source: e.source,
        })?;
        let fd = register(bound.fd).map_err(|source| ZdsError::Bind {
            path: cfg.socket.clone(),
            source,
        })?;
        Ok(Listener {
            fd,
            file: bound.file,
        })
    }

    pub(crate) async fn accept(&self) -> io::Result<Packet> {
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|fd| {
                socket::accept4(
                    fd.get_ref(),
                    SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
                )
                .map_err(io::Error::from)
            }) {
                Ok(result) => {
                    return Ok(Packet {
                        fd: register(result?)?,
                    });
                }
                Err(_would_block) => continue,
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.file.remove_if_ours();
    }
}

impl Packet {
    /// The connecting process (SO_PEERCRED), for the log.
    pub(crate) fn peer(&self) -> Option<UnixCredentials> {
        socket::getsockopt(self.fd.get_ref(), sockopt::PeerCredentials).ok()
    }

    /// Sends one datagram, with `fd` in an SCM_RIGHTS message when given.
    pub(crate) async fn send(&self, bytes: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
        let fds: Vec<RawFd> = fd.iter().map(|f| f.as_raw_fd()).collect();
        loop {
            let mut guard = self.fd.writable().await?;
            let sent = guard.try_io(|sock| {
                let iov = [IoSlice::new(bytes)];
                let cmsgs: &[ControlMessage] = if fds.is_empty() {
                    &[]
                } else {
                    &[ControlMessage::ScmRights(&fds)]
                };
                socket::sendmsg::<()>(
                    sock.as_raw_fd(),
                    &iov,
                    cmsgs,
                    MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
                    None,
                )
                .map_err(io::Error::from)
            });
            match sent {
                Ok(Ok(n)) if n == bytes.len() => return Ok(()),
                Ok(Ok(n)) => {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        format!("sent {n} of {} bytes", bytes.len()),
                    ));
                }
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }

    /// Receives one datagram into `buf`. Any fds that came with it are closed (ztunnel sends
    /// none).
    pub(crate) async fn recv(&self, buf: &mut [u8]) -> io::Result<Received> {
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|sock| recv_now(sock.as_raw_fd(), buf, MsgFlags::empty())) {
                Ok(result) => return result,
                Err(_would_block) => continue,
            }
        }
    }

    /// Waits until the idle connection becomes readable and says why: EOF (ztunnel left), a
    /// datagram (protocol error) or an error. The datagram is peeked, not consumed.
    pub(crate) async fn idle_event(&self) -> Idle {
        loop {
            let mut guard = match self.fd.readable().await {
                Ok(g) => g,
                Err(e) => return Idle::Error(e),
            };
            let mut byte = [0u8; 1];
            match guard.try_io(|sock| recv_now(sock.as_raw_fd(), &mut byte, MsgFlags::MSG_PEEK)) {
                Ok(Ok(r)) if r.len == 0 && !r.truncated => return Idle::Eof,
                Ok(Ok(r)) => return Idle::Data(r.len),
                Ok(Err(e)) => return Idle::Error(e),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsFd for Packet {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.get_ref().as_fd()
    }
}

/// Registers an fd this value owns with the reactor.
fn register(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: the `OwnedFd` moves into the `AsyncFd` and stays open, unchanged, until it drops.
    Ok(unsafe { AsyncFd::register(fd) }?)
}

fn recv_now(fd: RawFd, buf: &mut [u8], extra: MsgFlags) -> io::Result<Received> {
    let mut cmsg = nix::cmsg_space!([RawFd; 4]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = socket::recvmsg::<()>(
        fd,
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC | extra,
    )
    .map_err(io::Error::from)?;
    if let Ok(cmsgs) = msg.cmsgs() {
        for c in cmsgs {
            if let ControlMessageOwned::ScmRights(fds) = c {
                for raw in fds {
                    // SAFETY: the kernel just installed these fds for us; nobody else owns them.
                    drop(unsafe { OwnedFd::from_raw_fd(raw) });
                }
            }
        }
    }
    Ok(Received {
        len: msg.bytes,
        truncated: msg.flags.contains(MsgFlags::MSG_TRUNC),
    })
}

/// Why a handle is not a network namespace.
#[derive(Debug, thiserror::Error)]
pub enum NotANetns {
    /// Not a namespace at all (a regular file), or the kernel would not say.
    #[error("NS_GET_NSTYPE failed: {0}")]
    Unknown(#[source] io::Error),
    #[error("it is a namespace of type {0:#x}, not CLONE_NEWNET")]
    OtherType(i32),
}

/// Whether `fd` is a network namespace: NS_GET_NSTYPE answers CLONE_NEWNET for those only (a
/// regular file or another namespace type answers differently).
pub(super) fn check_netns(fd: BorrowedFd<'_>) -> Result<(), NotANetns> {
    // SAFETY: NS_GET_NSTYPE takes no argument and only returns a number.
    let kind = unsafe { libc::ioctl(fd.as_raw_fd(), libc::NS_GET_NSTYPE) };
    if kind < 0 {
        return Err(NotANetns::Unknown(io::Error::last_os_error()));
    }
    if kind != libc::CLONE_NEWNET {
        return Err(NotANetns::OtherType(kind));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn only_network_namespaces_pass_the_check() {
        let net = File::open("/proc/thread-self/ns/net").unwrap();
        assert!(check_netns(net.as_fd()).is_ok());
        let uts = File::open("/proc/thread-self/ns/uts").unwrap();
        let err = check_netns(uts.as_fd()).unwrap_err();
        assert!(err.to_string().contains("not CLONE_NEWNET"), "{err}");
        let null = File::open("/dev/null").unwrap();
        assert!(check_netns(null.as_fd()).is_err());
    }

    #[test]
    fn a_stale_socket_is_replaced_and_anything_else_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/ztunnel.sock");
        let cfg = ZdsConfig {
            socket: path.clone(),
            ..ZdsConfig::default()
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let first = Listener::bind(&cfg).unwrap();
            let sub = std::fs::metadata(dir.path().join("sub")).unwrap();
            assert_eq!(sub.permissions().mode() & 0o777, 0o700);
            let meta = std::fs::symlink_metadata(&path).unwrap();
            assert_eq!(meta.permissions().mode() & 0o777, 0o600);
            // A second server replaces the file; the first one's drop leaves the new one alone.
            let second = Listener::bind(&cfg).unwrap();
            drop(first);
            assert!(path.exists());
            drop(second);
            assert!(!path.exists());
            std::fs::create_dir(&path).unwrap();
            let err = Listener::bind(&cfg).err().unwrap();
            assert!(err.to_string().contains("ztunnel.sock"), "{err}");
            // A regular file is not a stale socket: refused, and left as it is.
            std::fs::remove_dir(&path).unwrap();
            std::fs::write(&path, b"keep me").unwrap();
            let err = Listener::bind(&cfg).err().unwrap().to_string();
            assert!(
                err.contains("ztunnel.sock") && err.contains("a regular file"),
                "{err}"
            );
            assert_eq!(std::fs::read(&path).unwrap(), b"keep me");
        });
    }
}
