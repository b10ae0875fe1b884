//! Who is on the other end of a local socket: the peer credentials (SO_PEERCRED) the kernel
//! recorded at connect, which the caller cannot forge. Root-only sockets (pod facts, plugin
//! events) judge each connection by them; for axum servers, [`Peer`] is the connect info.

use tokio::net::{UnixListener, UnixStream};

/// The peer's pid, uid and gid at connect time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    pub pid: Option<i32>,
    pub uid: u32,
    pub gid: u32,
}

impl PeerCred {
    pub fn of(stream: &UnixStream) -> std::io::Result<PeerCred> {
        let cred = stream.peer_cred()?;
        Ok(PeerCred {
            pid: cred.pid(),
            uid: cred.uid(),
            gid: cred.gid(),
        })
    }

    /// Only uid 0 passes; the refusal names the peer.
    pub fn require_root(&self) -> Result<(), String> {
        if self.uid == 0 {
            return Ok(());
        }
        Err(format!(
            "refused: peer uid {} (pid {}) is not root",
            self.uid,
            self.pid.map_or("unknown".to_string(), |p| p.to_string())
        ))
    }
}

/// The connect info of an axum server on a Unix socket: the peer's credentials, or why they
/// could not be read (such a peer is refused like a stranger).
#[derive(Debug, Clone)]
pub struct Peer(pub Result<PeerCred, String>);

impl Peer {
    /// Ok for a root peer; else the refusal text.
    pub fn require_root(&self) -> Result<PeerCred, String> {
        match &self.0 {
            Ok(cred) => cred.require_root().map(|()| *cred),
            Err(e) => Err(format!("refused: cannot read peer credentials: {e}")),
        }
    }
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, UnixListener>>
    for Peer
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, UnixListener>) -> Self {
        Peer(PeerCred::of(stream.io()).map_err(|e| e.to_string()))
    }
}
