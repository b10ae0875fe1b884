//! The ONE binder of the agent's local Unix sockets (`log.sock`, `pluginevent.sock`,
//! `podfacts/pod.sock`, the ZDS socket): directory, what may be replaced, modes, ownership of the
//! socket file, peer credentials, and the process's fd budget for all listeners.
//!
//! - The socket's directory is created 0700 when missing. An existing one (the chart mounts the
//!   run dir as a hostPath, which the kubelet creates 0755) keeps its read/search bits but loses
//!   group/other write and is owned by us: nobody but root may create, rename or delete entries
//!   in it. When that cannot be done the bind fails naming the directory.
//! - At the path, only a socket (a previous run's, or the one of the agent this one replaces in a
//!   rollout) or a dangling symlink is replaced; anything else (a regular file, a directory, a
//!   symlink to something) is an error naming the path, and is left as it is.
//! - The socket is 0600 before it listens (nobody can connect through a wider mode), and the
//!   servers accept only uid-0 peers ([`peer`]); the plugin runs as root under the kubelet.
//! - [`SocketFile`] remembers the (dev, inode) it bound: it removes the file only while it is
//!   still ours, and says when it is gone or replaced (readiness, re-binding).

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::sys::socket::{
    self, AddressFamily, Backlog, SockFlag, SockType, UnixAddr, UnixCredentials, sockopt,
};

/// Mode of every socket file.
pub const SOCKET_MODE: u32 = 0o600;
/// Mode of a socket directory this binder creates.
pub const NEW_DIR_MODE: u32 = 0o700;
/// Bits an existing socket directory must not have: group/other write.
const FORBIDDEN_DIR_BITS: u32 = 0o022;
/// Listen backlog (connections wait here while the server is at its connection bound).
const BACKLOG: i32 = 1024;

/// A socket could not be bound or is in the way of something.
#[derive(Debug, thiserror::Error)]
#[error("socket {path}: {source}")]
pub struct SocketError {
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

fn err(path: &Path, kind: io::ErrorKind, msg: String) -> SocketError {
    SocketError {
        path: path.to_path_buf(),
        source: io::Error::new(kind, msg),
    }
}

/// Stream (HTTP, pod facts) or SOCK_SEQPACKET (ZDS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Stream,
    SeqPacket,
}

/// A bound, listening socket (non-blocking, close-on-exec) and its file.
pub struct BoundSocket {
    pub fd: OwnedFd,
    pub file: SocketFile,
}

impl BoundSocket {
    /// The listener for tokio (stream sockets only).
    pub fn into_tokio(self) -> Result<(tokio::net::UnixListener, SocketFile), SocketError> {
        let std = std::os::unix::net::UnixListener::from(self.fd);
        let listener = tokio::net::UnixListener::from_std(std).map_err(|source| SocketError {
            path: self.file.path.clone(),
            source,
        })?;
        Ok((listener, self.file))
    }
}

/// The socket file we bound, by (dev, inode).
#[derive(Debug)]
pub struct SocketFile {
    path: PathBuf,
    id: (u64, u64),
}

/// What is at a [`SocketFile`]'s path now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SocketState {
    /// Our socket.
    Ours,
    /// Nothing, a socket nobody listens on, or a dangling symlink: safe to bind again.
    Gone(String),
    /// Someone else's: another server's live socket, or something that is not a socket. Left
    /// alone.
    Taken(String),
}

impl SocketFile {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What is at the path now (a foreign stream socket is probed: live or stale).
    pub fn state(&self) -> SocketState {
        let meta = match std::fs::symlink_metadata(&self.path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return SocketState::Gone("removed".to_string());
            }
            Err(e) => return SocketState::Taken(format!("cannot be read: {e}")),
        };
        if (meta.dev(), meta.ino()) == self.id {
            return SocketState::Ours;
        }
        let ft = meta.file_type();
        if ft.is_socket() {
            return match std::os::unix::net::UnixStream::connect(&self.path) {
                Ok(s) => SocketState::Taken(match peer(&s) {
                    Ok(p) => format!("replaced by the socket of another server ({p})"),
                    Err(_) => "replaced by the socket of another server".to_string(),
                }),
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    SocketState::Gone("replaced by a socket nobody listens on".to_string())
                }
                Err(e) => SocketState::Taken(format!("replaced by another socket ({e})")),
            };
        }
        if ft.is_symlink() && std::fs::metadata(&self.path).is_err() {
            return SocketState::Gone("replaced by a dangling symlink".to_string());
        }
        SocketState::Taken(format!("replaced by {}", describe(&ft)))
    }

    /// Removes the file if it is still ours (another agent may have bound the path since).
    /// Returns whether it did.
    pub fn remove_if_ours(&self) -> bool {
        // Ours is the (dev, inode) we bound; nothing else at the path is probed or touched.
        let ours =
            std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.id);
        ours && std::fs::remove_file(&self.path).is_ok()
    }
}

/// A socket file goes with the listener it belongs to, however the server ends: also when its
/// task is dropped unfinished (a failed start shuts the runtime down under it).
impl Drop for SocketFile {
    fn drop(&mut self) {
        self.remove_if_ours();
    }
}

fn describe(ft: &std::fs::FileType) -> &'static str {
    if ft.is_file() {
        "a regular file"
    } else if ft.is_dir() {
        "a directory"
    } else if ft.is_symlink() {
        "a symlink"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_socket() {
        "a socket"
    } else {
        "a device"
    }
}

/// Binds `path` as described in the module doc.
pub fn bind(path: &Path, kind: Kind) -> Result<BoundSocket, SocketError> {
    let fail = |source: io::Error| SocketError {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        prepare_dir(dir)?;
    }
    clear_path(path)?;
    let ty = match kind {
        Kind::Stream => SockType::Stream,
        Kind::SeqPacket => SockType::SeqPacket,
    };
    let fd = socket::socket(
        AddressFamily::Unix,
        ty,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| fail(e.into()))?;
    let addr = UnixAddr::new(path).map_err(|e| fail(e.into()))?;
    socket::bind(fd.as_raw_fd(), &addr).map_err(|e| fail(e.into()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE)).map_err(fail)?;
    let meta = std::fs::symlink_metadata(path).map_err(fail)?;
    socket::listen(&fd, Backlog::new(BACKLOG).unwrap_or(Backlog::MAXCONN))
        .map_err(|e| fail(e.into()))?;
    Ok(BoundSocket {
        fd,
        file: SocketFile {
            path: path.to_path_buf(),
            id: (meta.dev(), meta.ino()),
        },
    })
}

/// Creates `dir` 0700 when missing; an existing one loses group/other write and becomes ours.
fn prepare_dir(dir: &Path) -> Result<(), SocketError> {
    let fail = |what: &str, source: io::Error| {
        err(
            dir,
            source.kind(),
            format!("socket directory: {what}: {source}"),
        )
    };
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir).map_err(|e| fail("cannot create it", e))?;
            // State the mode: the umask may have widened or narrowed it.
            return std::fs::set_permissions(dir, std::fs::Permissions::from_mode(NEW_DIR_MODE))
                .map_err(|e| fail("cannot set mode 0700", e));
        }
        Err(e) => return Err(fail("cannot read it", e)),
        Ok(_) => {}
    }
    // Follows a symlinked run dir: the directory the socket lands in is what must be safe.
    let meta = std::fs::metadata(dir).map_err(|e| fail("cannot read it", e))?;
    if !meta.is_dir() {
        return Err(err(
            dir,
            io::ErrorKind::NotADirectory,
            "socket directory: not a directory".to_string(),
        ));
    }
    let me = nix::unistd::geteuid();
    if meta.uid() != me.as_raw() {
        nix::unistd::chown(dir, Some(me), None).map_err(|e| {
            fail(
                &format!("owned by uid {}, cannot take it", meta.uid()),
                e.into(),
            )
        })?;
        tracing::info!(dir = %dir.display(), from_uid = meta.uid(), "took ownership of the socket directory");
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & FORBIDDEN_DIR_BITS != 0 {
        let tightened = mode & !FORBIDDEN_DIR_BITS;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(tightened)).map_err(|e| {
            fail(
                &format!("mode {mode:04o} lets others replace sockets, cannot tighten it"),
                e,
            )
        })?;
        tracing::info!(
            dir = %dir.display(),
            from = format!("{mode:04o}"),
            to = format!("{tightened:04o}"),
            "tightened the socket directory (no group/other write)"
        );
    }
    Ok(())
}

/// Removes a socket or a dangling symlink at `path`; anything else is an error naming it.
fn clear_path(path: &Path) -> Result<(), SocketError> {
    let meta = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(SocketError {
                path: path.to_path_buf(),
                source,
            });
        }
        Ok(m) => m,
    };
    let ft = meta.file_type();
    let replaceable = ft.is_socket() || (ft.is_symlink() && std::fs::metadata(path).is_err());
    if !replaceable {
        let what = match (ft.is_symlink(), std::fs::read_link(path)) {
            (true, Ok(target)) => format!("a symlink to {}", target.display()),
            _ => describe(&ft).to_string(),
        };
        return Err(err(
            path,
            io::ErrorKind::AlreadyExists,
            format!(
                "{what} is in the way of the socket; not removing it (only a stale socket or a \
                 dangling symlink is replaced)"
            ),
        ));
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(SocketError {
            path: path.to_path_buf(),
            source: e,
        }),
        _ => Ok(()),
    }
}

/// The connecting process of a Unix connection (SO_PEERCRED).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {} uid {}", self.pid, self.uid)
    }
}

impl From<UnixCredentials> for Peer {
    fn from(c: UnixCredentials) -> Self {
        Peer {
            pid: c.pid(),
            uid: c.uid(),
            gid: c.gid(),
        }
    }
}

/// The peer of a connected Unix socket.
pub fn peer(stream: &impl AsFd) -> io::Result<Peer> {
    socket::getsockopt(stream, sockopt::PeerCredentials)
        .map(Peer::from)
        .map_err(io::Error::from)
}

/// Whether `peer` may use a root-only socket; the refusal names the peer.
pub fn root_only(peer: io::Result<Peer>) -> Result<Peer, PeerRefused> {
    match peer {
        Ok(p) if p.uid == 0 => Ok(p),
        Ok(p) => Err(PeerRefused::NotRoot(p)),
        Err(e) => Err(PeerRefused::Unknown(e)),
    }
}

/// Why a peer may not use a root-only socket.
#[derive(Debug, thiserror::Error)]
pub enum PeerRefused {
    #[error("refused: peer {0} is not root")]
    NotRoot(Peer),
    #[error("refused: cannot read peer credentials: {0}")]
    Unknown(#[source] io::Error),
}

/// Raises RLIMIT_NOFILE's soft limit to its hard limit; returns the resulting soft limit and
/// whether it leaves `needed` descriptors (the listeners' bounds plus a reserve for the agent's
/// own files, netns handles and netlink sockets).
pub fn raise_fd_limit(needed: u64) -> Result<FdLimit, FdLimitError> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(FdLimitError::Read)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).map_err(|source| FdLimitError::Raise {
            soft,
            hard,
            source,
        })?;
    }
    let now = soft.max(hard);
    Ok(FdLimit {
        before: soft,
        now,
        enough: now >= needed,
    })
}

/// Why the open-file limit could not be read or raised.
#[derive(Debug, thiserror::Error)]
pub enum FdLimitError {
    #[error("getrlimit(RLIMIT_NOFILE): {0}")]
    Read(#[source] nix::Error),
    #[error("raising RLIMIT_NOFILE from {soft} to {hard}: {source}")]
    Raise {
        soft: u64,
        hard: u64,
        #[source]
        source: nix::Error,
    },
}

/// The outcome of [`raise_fd_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdLimit {
    pub before: u64,
    pub now: u64,
    pub enough: bool,
}

#[cfg(test)]
mod tests;
