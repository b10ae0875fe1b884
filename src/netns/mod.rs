//! The netns handle. [`Netns`] is opened once (from a path, or the calling thread's own with
//! [`Netns::current`]: the only constructors), owns its fd, and compares by the namespace's
//! (dev, inode) identity. Namespaces are per thread, so work in one runs on a dedicated worker
//! thread that `setns`es into the target and back home afterwards ([`workers`]): no shared (tokio)
//! thread is ever moved. Child processes started from that thread (iptables-restore, nft) inherit its namespace.
//!
//! A pod with `hostUsers: false` has a netns owned by its own user namespace. The kernel refuses
//! `-m owner` matches unless the writer is in that user namespace, and a multi-threaded process
//! cannot enter one; so [`Netns`] also holds the owning user namespace when it is not ours, and
//! [`UsernsEntry`] moves a child process (spawned tool or forked helper) into it before it works.
//! Also: finding a pod's netns from the host's `/proc` by the pod UID in a process's cgroup path
//! ([`procfs`]), which only runs with the namespaces no pod may claim identified ([`reserved`]).
//! May call: nothing else in this crate.

pub mod procfs;
pub mod reserved;
mod workers;

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[cfg(test)]
use nix::sched::CloneFlags;

/// Why work could not run inside a namespace.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("cannot open network namespace {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} {what}, not a network namespace")]
    NotNetns { path: PathBuf, what: String },
    #[error("{path} is not a network namespace or cannot be entered: {source}")]
    Enter { path: PathBuf, source: nix::Error },
    #[error("the worker thread for network namespace {path} failed: {reason}")]
    Thread { path: PathBuf, reason: String },
    #[error(
        "cannot enter the user namespace owning network namespace {path} \
         (a pod with hostUsers: false): {source}"
    )]
    EnterUserns {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the helper process in network namespace {path} failed: {source}")]
    Child {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A network namespace, opened once: its fd (lent out through [`AsFd`], e.g. to send it over
/// SCM_RIGHTS), its identity, and the fd of the user namespace owning it when that is not the one
/// this process runs in. Two handles are equal when they name the same namespace, however they
/// were opened. The path is only a label for messages.
#[derive(Debug)]
pub struct Netns {
    path: PathBuf,
    net: Arc<OwnedFd>,
    id: NetnsId,
    userns: Option<UsernsEntry>,
}

/// Which namespace a handle names: the (st_dev, st_ino) of its nsfs file, as `ip netns identify`
/// and ztunnel compare them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct NetnsId {
    pub dev: u64,
    pub inode: u64,
}

/// How a child process gets into a netns owned by another user namespace: enter that user
/// namespace, then the netns (see [`UsernsEntry::enter`]).
#[derive(Debug, Clone)]
pub struct UsernsEntry {
    path: PathBuf,
    userns: Arc<OwnedFd>,
    net: Arc<OwnedFd>,
}

/// `struct __user_cap_header_struct` / `__user_cap_data_struct` of capget(2)/capset(2).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// (st_dev, st_ino): the identity of a namespace file.
fn identity(meta: &std::fs::Metadata) -> (u64, u64) {
    (meta.dev(), meta.ino())
}

/// `path` opened without blocking and checked to be a network namespace (nsfs, CLONE_NEWNET),
/// with its fstat. A FIFO opened O_NONBLOCK for reading returns at once, so nothing here waits.
fn open_checked(path: &Path) -> Result<(OwnedFd, std::fs::Metadata), NetnsError> {
    use nix::fcntl::OFlag;
    let not_netns = |what: String| NetnsError::NotNetns {
        path: path.to_path_buf(),
        what,
    };
    let io_err = |source: std::io::Error| NetnsError::Open {
        path: path.to_path_buf(),
        source,
    };
    // A socket cannot be opened at all (ENXIO) and a device should not be: judge by stat first.
    let kind = std::fs::metadata(path).map_err(io_err)?.file_type();
    if !kind.is_file() {
        return Err(not_netns(format!("is {}", file_kind(&kind))));
    }
    let flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC | OFlag::O_NOCTTY;
    let fd = nix::fcntl::open(path, flags, nix::sys::stat::Mode::empty())
        .map_err(|e| io_err(e.into()))?;
    // Judged again on the fd: the path may have been swapped since the stat.
    let meta = File::from(fd.try_clone().map_err(io_err)?)
        .metadata()
        .map_err(io_err)?;
    if !meta.file_type().is_file() {
        return Err(not_netns(format!("is {}", file_kind(&meta.file_type()))));
    }
    let fs = nix::sys::statfs::fstatfs(&fd).map_err(|e| io_err(e.into()))?;
    if fs.filesystem_type() != nix::sys::statfs::NSFS_MAGIC {
        return Err(not_netns(format!(
            "is a regular file (filesystem magic {:#x}, not nsfs)",
            fs.filesystem_type().0
        )));
    }
    // SAFETY: NS_GET_NSTYPE takes no argument and returns the CLONE_NEW* type (or -1).
    let nstype = unsafe { libc::ioctl(fd.as_raw_fd(), libc::NS_GET_NSTYPE) };
    if nstype < 0 {
        return Err(io_err(std::io::Error::last_os_error()));
    }
    if nstype != libc::CLONE_NEWNET {
        return Err(not_netns(format!("is {}", namespace_kind(nstype))));
    }
    Ok((fd, meta))
}

/// "a FIFO", "a directory", ... for messages.
fn file_kind(kind: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_symlink() {
        "a symbolic link"
    } else {
        "a regular file"
    }
}

/// The namespace kind NS_GET_NSTYPE answered, for messages.
fn namespace_kind(nstype: libc::c_int) -> String {
    let name = match nstype {
        libc::CLONE_NEWNS => "a mount namespace",
        libc::CLONE_NEWUTS => "a UTS namespace",
        libc::CLONE_NEWIPC => "an IPC namespace",
        libc::CLONE_NEWUSER => "a user namespace",
        libc::CLONE_NEWPID => "a PID namespace",
        libc::CLONE_NEWCGROUP => "a cgroup namespace",
        0x80 => "a time namespace",
        other => return format!("a namespace of type {other:#x}"),
    };
    name.to_string()
}

impl Netns {
    /// Opens the netns at `path` (e.g. `/var/run/netns/x` or `/proc/<pid>/ns/net`) and finds the
    /// user namespace owning it (one ioctl and one fstat more than a plain open). The open never
    /// blocks (O_NONBLOCK: a FIFO answers at once) and leaks into no child (O_CLOEXEC); before
    /// anything else the fd must be on nsfs and name a network namespace, so a FIFO, a regular
    /// file or another kind of namespace is refused naming the path and what it is.
    pub fn open(path: &Path) -> Result<Netns, NetnsError> {
        let (fd, meta) = open_checked(path)?;
        let (dev, inode) = identity(&meta);
        let net = Arc::new(fd);
        // SAFETY: NS_GET_USERNS takes no argument and returns a new fd (or -1) that we own.
        let raw = unsafe { libc::ioctl(net.as_raw_fd(), libc::NS_GET_USERNS) };
        let userns = if raw >= 0 {
            // SAFETY: `raw` is a fresh fd owned by nobody else.
            let owner = unsafe { OwnedFd::from_raw_fd(raw) };
            let owner = File::from(owner);
            let ours = std::fs::metadata("/proc/self/ns/user").map(|m| identity(&m));
            let theirs = owner.metadata().map(|m| identity(&m));
            match (theirs, ours) {
                (Ok(theirs), Ok(ours)) if theirs != ours => Some(UsernsEntry {
                    path: path.to_path_buf(),
                    userns: Arc::new(OwnedFd::from(owner)),
                    net: net.clone(),
                }),
                _ => None,
            }
        } else {
            // EPERM: the owner is outside our view (an ancestor of our user namespace), so we
            // cannot enter it anyway; work as before.
            None
        };
        Ok(Netns {
            path: path.to_path_buf(),
            net,
            id: NetnsId { dev, inode },
            userns,
        })
    }

    /// Whether the path it was opened from still names this namespace. False once the runtime
    /// removed the sandbox's bind mount or the process behind a `/proc/<pid>/ns/net` path ended
    /// (the path is gone or names another namespace): the agent's rule for "the old netns is
    /// gone" (the fd held here keeps the namespace itself alive, so that cannot be the test).
    pub fn still_named(&self) -> bool {
        std::fs::metadata(&self.path).is_ok_and(|m| identity(&m) == (self.id.dev, self.id.inode))
    }

    /// The netns of the calling thread.
    pub fn current() -> Result<Netns, NetnsError> {
        Netns::open(Path::new("/proc/thread-self/ns/net"))
    }

    /// The path it was opened from (a label for messages; the handle never reopens it).
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn id(&self) -> NetnsId {
        self.id
    }

    /// Set when another user namespace owns this netns: child processes must enter it first.
    pub fn userns_entry(&self) -> Option<&UsernsEntry> {
        self.userns.as_ref()
    }

    /// Runs `work` inside this netns on a dedicated worker thread ([`workers`]) and returns its
    /// result. The calling thread is not moved.
    pub fn run<T, F>(&self, work: F) -> Result<T, NetnsError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        workers::run_in(self.net.clone(), &self.path, work)
    }

    /// [`Netns::run`] for async callers: the task awaits the worker's answer and its thread is
    /// free meanwhile. The future does not borrow the handle.
    pub fn run_async<T, F>(
        &self,
        work: F,
    ) -> impl std::future::Future<Output = Result<T, NetnsError>> + Send + 'static
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        workers::run_in_async(self.net.clone(), self.path.clone(), work)
    }
}

/// Runs `work` on a fresh thread inside a new, empty network namespace that exists only as long
/// as `work` runs (children it spawns inherit it). For learning how the kernel stores something
/// without touching any real namespace (tests only).
#[cfg(test)]
pub(crate) fn run_in_scratch<T, F>(work: F) -> Result<T, NetnsError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let path = PathBuf::from("(scratch netns)");
    let handle = std::thread::Builder::new()
        .name("netns-scratch".into())
        .spawn(move || -> Result<T, NetnsError> {
            nix::sched::unshare(CloneFlags::CLONE_NEWNET).map_err(|source| NetnsError::Enter {
                path: PathBuf::from("(scratch netns)"),
                source,
            })?;
            Ok(work())
        })
        .map_err(|e| NetnsError::Thread {
            path: path.clone(),
            reason: e.to_string(),
        })?;
    handle.join().map_err(|panic| NetnsError::Thread {
        path,
        reason: panic_text(panic.as_ref()).unwrap_or("panic").to_string(),
    })?
}

impl AsFd for Netns {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.net.as_fd()
    }
}

impl PartialEq for Netns {
    fn eq(&self, other: &Netns) -> bool {
        self.id == other.id
    }
}

impl Eq for Netns {}

impl std::hash::Hash for Netns {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.id.hash(state);
    }
}

impl UsernsEntry {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Moves the calling process into the user namespace, then the netns. It keeps its uid (so
    /// host-owned files stay readable as their owner) and makes its capabilities in that user
    /// namespace ambient, so a tool it execs keeps them even though it is not that namespace's
    /// root. Only raw system calls: safe between fork and exec.
    ///
    /// # Safety
    /// The process must be single-threaded (a fresh child), as `setns(CLONE_NEWUSER)` requires.
    unsafe fn enter(&self) -> std::io::Result<()> {
        let check = |rc: libc::c_long| {
            if rc == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        };
        // SAFETY: plain system calls on fds this value keeps open and on local structs.
        unsafe {
            check(libc::setns(self.userns.as_raw_fd(), libc::CLONE_NEWUSER).into())?;
            check(libc::setns(self.net.as_raw_fd(), libc::CLONE_NEWNET).into())?;
            // Entering gave us every capability there (permitted); ambient ones need them
            // inheritable too.
            let header = CapHeader {
                version: LINUX_CAPABILITY_VERSION_3,
                pid: 0,
            };
            let mut data = [CapData::default(); 2];
            check(libc::syscall(
                libc::SYS_capget,
                &raw const header,
                data.as_mut_ptr(),
            ))?;
            for word in &mut data {
                word.inheritable = word.permitted;
            }
            check(libc::syscall(
                libc::SYS_capset,
                &raw const header,
                data.as_ptr(),
            ))?;
            for cap in 0..64u32 {
                if data[(cap / 32) as usize].permitted & (1 << (cap % 32)) != 0 {
                    // Fails only for capabilities this kernel does not know.
                    libc::prctl(
                        libc::PR_CAP_AMBIENT,
                        libc::PR_CAP_AMBIENT_RAISE,
                        cap as libc::c_ulong,
                        0 as libc::c_ulong,
                        0 as libc::c_ulong,
                    );
                }
            }
        }
        Ok(())
    }

    /// Makes `cmd` enter the namespaces in the child before it execs.
    pub fn prepare(&self, cmd: &mut std::process::Command) {
        use std::os::unix::process::CommandExt;
        let entry = self.clone();
        // SAFETY: the hook runs in the fresh single-threaded child and only makes system calls.
        unsafe {
            cmd.pre_exec(move || entry.enter());
        }
    }

    /// Runs `work` in a forked child that entered the namespaces, and returns its answer. No exec:
    /// the cost is one fork.
    ///
    /// # Safety
    /// The parent is multi-threaded, so `work` must be async-signal-safe: raw system calls on
    /// memory allocated before the call, no allocation, no locks, no panics.
    pub unsafe fn run_forked(&self, work: impl FnOnce() -> u64) -> Result<u64, NetnsError> {
        let child_err = |source: std::io::Error| NetnsError::Child {
            path: self.path.clone(),
            source,
        };
        let (read, write) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| child_err(e.into()))?;
        // Reply: [0, answer] after the work, or [1, errno] when entering failed.
        let mut reply = [0u64; 2];
        // SAFETY: the child only runs `enter` and `work` (both async-signal-safe per the
        // contracts), writes the reply and exits without unwinding or running destructors.
        match unsafe { nix::unistd::fork() }.map_err(|e| child_err(e.into()))? {
            nix::unistd::ForkResult::Child => unsafe {
                reply = match self.enter() {
                    // A panic must never unwind into the parent's code running on in this copy.
                    Ok(()) => match std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)) {
                        Ok(answer) => [0, answer],
                        Err(_) => libc::_exit(1),
                    },
                    Err(e) => [1, e.raw_os_error().unwrap_or(0) as u64],
                };
                libc::write(
                    write.as_raw_fd(),
                    reply.as_ptr().cast(),
                    size_of_val(&reply),
                );
                libc::_exit(0)
            },
            nix::unistd::ForkResult::Parent { child } => {
                drop(write);
                let got = read_full(&read, &mut reply);
                let status = nix::sys::wait::waitpid(child, None);
                match (got, status) {
                    (Ok(n), _) if n == size_of_val(&reply) => {}
                    (Err(e), _) => return Err(child_err(e)),
                    (Ok(_), status) => {
                        return Err(child_err(std::io::Error::other(format!(
                            "it ended without an answer ({status:?})"
                        ))));
                    }
                }
                match reply {
                    [0, answer] => Ok(answer),
                    [_, errno] => Err(NetnsError::EnterUserns {
                        path: self.path.clone(),
                        source: std::io::Error::from_raw_os_error(errno as i32),
                    }),
                }
            }
        }
    }
}

/// Reads until `reply` is full or the writer is gone; returns the byte count.
fn read_full(fd: &OwnedFd, reply: &mut [u64; 2]) -> std::io::Result<usize> {
    let len = size_of_val(reply);
    let base = reply.as_mut_ptr().cast::<u8>();
    let mut done = 0;
    while done < len {
        // SAFETY: writes stay inside `reply`.
        let n = unsafe { libc::read(fd.as_raw_fd(), base.add(done).cast(), len - done) };
        match n {
            0 => break,
            n if n > 0 => done += n as usize,
            _ => {
                let err = std::io::Error::last_os_error();
                if err.kind() != std::io::ErrorKind::Interrupted {
                    return Err(err);
                }
            }
        }
    }
    Ok(done)
}

/// The text of a panic payload (`panic!` with a literal or a formatted message), if it has one.
pub fn panic_text(payload: &(dyn std::any::Any + Send)) -> Option<&str> {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_namespace_names_the_path() {
        let err = Netns::open(Path::new("/nonexistent/netns")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/netns"), "{err}");
    }

    #[test]
    fn regular_file_is_not_a_namespace() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let err = Netns::open(file.path()).unwrap_err();
        assert!(matches!(err, NetnsError::NotNetns { .. }), "{err}");
        let text = err.to_string();
        assert!(text.contains(&file.path().display().to_string()), "{text}");
        assert!(text.contains("is a regular file"), "{text}");
    }

    #[test]
    fn a_fifo_is_refused_at_once_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("netns-fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let started = std::time::Instant::now();
        let err = Netns::open(&fifo).unwrap_err();
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        assert_eq!(
            err.to_string(),
            format!("{} is a FIFO, not a network namespace", fifo.display())
        );
    }

    #[test]
    fn other_namespaces_and_directories_are_not_network_namespaces() {
        let err = Netns::open(Path::new("/proc/self/ns/mnt")).unwrap_err();
        assert!(err.to_string().contains("is a mount namespace"), "{err}");
        let err = Netns::open(Path::new("/proc/self/ns/user")).unwrap_err();
        assert!(err.to_string().contains("is a user namespace"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let err = Netns::open(dir.path()).unwrap_err();
        assert!(err.to_string().contains("is a directory"), "{err}");
        let err = Netns::open(Path::new("/dev/null")).unwrap_err();
        assert!(err.to_string().contains("is a character device"), "{err}");
    }

    #[test]
    fn a_handle_knows_whether_its_path_still_names_it() {
        // A process's ns/net path names its netns only while the process lives.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let ns = Netns::open(&PathBuf::from(format!("/proc/{}/ns/net", child.id()))).unwrap();
        assert!(ns.still_named());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!ns.still_named(), "the path no longer names the namespace");
    }

    #[test]
    fn handles_to_one_namespace_are_equal_however_opened() {
        use std::collections::HashSet;
        let here = Netns::current().unwrap();
        let again = Netns::open(Path::new("/proc/self/ns/net")).unwrap();
        assert_eq!(here, again);
        assert_eq!(HashSet::from([here, again]).len(), 1);
    }

    #[test]
    fn identity_is_the_fd_s_own_and_survives_entering() {
        let here = Netns::current().unwrap();
        let fd = here.as_fd().try_clone_to_owned().unwrap();
        let (dev, inode) = identity(&File::from(fd).metadata().unwrap());
        assert_eq!(here.id(), NetnsId { dev, inode });
        // Entered on a fresh thread, the netns it sees is the one the handle names.
        let seen = here.run(|| Netns::current().unwrap().id()).unwrap();
        assert_eq!(seen, here.id());
    }

    #[test]
    fn another_namespace_has_another_identity() {
        // A thread that unshares gets a netns of its own (we run as root).
        let other = std::thread::spawn(|| {
            nix::sched::unshare(CloneFlags::CLONE_NEWNET)
                .expect("unshare(CLONE_NEWNET): run as root");
            Netns::current().unwrap()
        })
        .join()
        .unwrap();
        assert_ne!(other, Netns::current().unwrap());
    }

    #[test]
    fn own_netns_needs_no_user_namespace_entry() {
        let ns = Netns::current().unwrap();
        assert!(ns.userns_entry().is_none());
    }
}
