//! Bare SOCK_SEQPACKET plumbing for the ZDS tests: a raw client for feeding the server malformed
//! frames, and the connect / send-with-fds / receive-with-fds helpers the test peer is built on.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::{Duration, Instant};

use istio_cni::zds::proto::pb;
use nix::sys::socket::{
    self, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType,
    UnixAddr,
};
use prost::Message;

const STEP: Duration = Duration::from_millis(10);

/// A bare SEQPACKET client for feeding the server malformed frames.
pub struct RawConn {
    fd: OwnedFd,
}

impl RawConn {
    pub fn connect(path: &Path) -> RawConn {
        RawConn {
            fd: connect(path).expect("connect to the ZDS socket"),
        }
    }

    pub fn send(&self, bytes: &[u8]) {
        send(&self.fd, bytes, None).expect("send");
    }

    /// One datagram; `None` when nothing came within `timeout`; an empty one is EOF.
    pub fn recv(&self, timeout: Duration) -> Option<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        loop {
            match recv(&self.fd, 1024) {
                Ok((bytes, fds)) => {
                    drop(fds);
                    return Some(bytes);
                }
                Err(nix::errno::Errno::EAGAIN) if Instant::now() < deadline => {
                    wait_readable(&self.fd, STEP)
                }
                Err(nix::errno::Errno::EAGAIN) => return None,
                Err(_) => return Some(Vec::new()),
            }
        }
    }
}

pub fn connect(path: &Path) -> nix::Result<OwnedFd> {
    let fd = socket::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?;
    socket::connect(fd.as_raw_fd(), &UnixAddr::new(path)?)?;
    Ok(fd)
}

pub fn send(fd: &OwnedFd, bytes: &[u8], fds: Option<&[RawFd]>) -> nix::Result<usize> {
    let iov = [IoSlice::new(bytes)];
    let cmsg: Vec<ControlMessage> = fds.map(ControlMessage::ScmRights).into_iter().collect();
    socket::sendmsg::<()>(fd.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None)
}

/// One datagram and the fds that came with it (non-blocking: EAGAIN when none is there).
pub fn recv(fd: &OwnedFd, size: usize) -> nix::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut buf = vec![0u8; size];
    let mut cmsg = nix::cmsg_space!([RawFd; 8]);
    let mut iov = [IoSliceMut::new(&mut buf)];
    let msg = socket::recvmsg::<()>(
        fd.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT,
    )?;
    let mut fds = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            // SAFETY: freshly received fds, owned by nobody else.
            fds.extend(raw.into_iter().map(|r| unsafe { OwnedFd::from_raw_fd(r) }));
        }
    }
    let n = msg.bytes;
    buf.truncate(n);
    Ok((buf, fds))
}

/// Blocks until `fd` has something to read (or EOF/error), at most `timeout`. The peer wakes on
/// the datagram as ztunnel's event loop does: a sleep-and-retry here put up to 10 ms of the
/// peer's own polling into every measured ZDS round trip.
pub fn wait_readable(fd: &OwnedFd, timeout: Duration) {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    // EINTR or a timeout: the caller's loop re-checks its own conditions either way.
    let _ = poll(&mut fds, PollTimeout::from(ms));
}

pub fn ack(error: &str) -> Vec<u8> {
    pb::WorkloadResponse {
        payload: Some(pb::workload_response::Payload::Ack(pb::Ack {
            error: error.to_string(),
        })),
    }
    .encode_to_vec()
}
