//! The node's own PID and mount namespaces, as a kind node has: `unshare --pid --fork --mount-proc`
//! starts the test's pause binary as their pid 1 (it reaps what the kernel hands it), with /proc
//! remounted there and the host's network namespace. Everything of the node is started inside
//! (containerd, kubelet and so every pod, the agent's hostPath `/proc` included), so the agent's
//! `/host/proc/1/ns/net` is a process of ours in the node's network namespace. On these machines
//! the real pid 1 is a sandbox process whose `/proc/1/ns/net` not even root may open.
//!
//! Children are forked from a thread of their own that joined the PID namespace (`setns` with
//! `CLONE_NEWPID` moves only the caller's future children) and join the mount namespace between
//! fork and exec. They carry PR_SET_PDEATHSIG tied to that thread, which lives as long as the
//! node; killing the namespace's pid 1 (tied to the test process through `unshare
//! --kill-child`) kills everything in it.

use std::fs::File;
use std::os::fd::AsRawFd as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::NodeError;

/// Run by the namespace's first process before it becomes pause: `$0` pause, `$1` the netns dir.
const INIT: &str = "mount --make-rshared / && mkdir -p /run/netns \
    && mount --bind \"$1\" /run/netns && exec \"$0\"";

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// The node's namespaces: their pid 1 and a spawner inside them.
pub(super) struct NodeNamespaces {
    /// `unshare`, whose child is the namespace's pid 1.
    unshare: Child,
    /// The host pid of the namespace's pid 1.
    init: u32,
    spawner: Option<mpsc::Sender<SpawnRequest>>,
}

impl NodeNamespaces {
    /// Starts pid 1 (`pause`) in new PID and mount namespaces, with `log` for its output.
    /// `/var/run/netns` there is `netns_dir` (the runtime's pod netns, at the path the chart's
    /// `cniNetnsDir` names on a node), hiding the host's.
    pub fn start(pause: &Path, netns_dir: &Path, log: &Path) -> Result<NodeNamespaces, NodeError> {
        std::fs::create_dir_all(netns_dir).map_err(|source| NodeError::Io {
            what: format!("create {}", netns_dir.display()),
            source,
        })?;
        let mut c = Command::new("unshare");
        // Private first (unshare's default: cut from the host's peer groups, such as a shared
        // /run/netns), then shared within the node only: containerd refuses a HostToContainer
        // mount of a private source, and nothing mounted here reaches the host.
        c.args(["--pid", "--fork", "--mount-proc", "--propagation=private"])
            .arg("--kill-child=SIGKILL")
            .args(["sh", "-c", INIT])
            .arg(pause)
            .arg(netns_dir);
        let unshare = super::process::spawn(c, log)?;
        let mut ns = NodeNamespaces {
            init: 0,
            unshare,
            spawner: None,
        };
        ns.init = ns.wait_init(pause)?;
        let pid_ns = open(&format!("/proc/{}/ns/pid", ns.init))?;
        let mnt_ns = open(&format!("/proc/{}/ns/mnt", ns.init))?;
        ns.spawner = Some(spawner(pid_ns, mnt_ns)?);
        Ok(ns)
    }

    /// Waits until unshare's child has exec'd pause (so /proc is remounted); its host pid.
    fn wait_init(&mut self, pause: &Path) -> Result<u32, NodeError> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let children = format!("/proc/{0}/task/{0}/children", self.unshare.id());
        // /proc/<pid>/exe is the canonical path.
        let pause = std::fs::canonicalize(pause).unwrap_or_else(|_| pause.to_path_buf());
        loop {
            let child = std::fs::read_to_string(&children)
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok());
            if let Some(pid) = child
                && std::fs::read_link(format!("/proc/{pid}/exe"))
                    .ok()
                    .as_deref()
                    == Some(pause.as_path())
            {
                return Ok(pid);
            }
            if let Ok(Some(status)) = self.unshare.try_wait() {
                return Err(NodeError::Io {
                    what: "start the node's PID namespace (unshare --pid --fork --mount-proc)"
                        .into(),
                    source: std::io::Error::other(format!("unshare exited: {status}")),
                });
            }
            if Instant::now() > deadline {
                return Err(NodeError::Io {
                    what: "start the node's PID namespace".into(),
                    source: std::io::Error::other("its pid 1 did not exec pause within 20 s"),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The host pid of the namespace's pid 1.
    pub fn init_pid(&self) -> u32 {
        self.init
    }

    /// Spawns `command` inside the namespaces (stdout and stderr to `log`).
    pub fn spawn(&self, mut command: Command, log: &Path) -> Result<Child, NodeError> {
        let program = command.get_program().to_string_lossy().into_owned();
        let io = |what: String| move |source| NodeError::Io { what, source };
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(io(format!("open {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(io(format!("open {}", log.display())))?;
        command.stdin(Stdio::null()).stdout(out).stderr(err);
        let gone = || std::io::Error::other("the node's spawner thread is gone");
        let (tx, rx) = mpsc::channel();
        let sent = self.spawner.as_ref().map(|s| s.send((command, tx)).is_ok());
        if sent != Some(true) {
            return Err(io(format!("start {program} in the node"))(gone()));
        }
        rx.recv()
            .map_err(|_| gone())
            .and_then(|r| r)
            .map_err(io(format!("start {program} in the node")))
    }

    /// The host pid of the process the node's namespace knows as `ns_pid`: the process whose
    /// second NSpid entry is `ns_pid` and whose ancestors include the namespace's pid 1.
    pub fn host_pid(&self, ns_pid: u32) -> Option<u32> {
        let entries = std::fs::read_dir("/proc").ok()?;
        entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| nspid(*pid).get(1) == Some(&ns_pid))
            .find(|pid| self.descends_from_init(*pid))
    }

    fn descends_from_init(&self, mut pid: u32) -> bool {
        for _ in 0..64 {
            if pid == self.init {
                return true;
            }
            match ppid(pid) {
                Some(p) if p > 1 => pid = p,
                _ => return false,
            }
        }
        false
    }
}

impl Drop for NodeNamespaces {
    fn drop(&mut self) {
        // pid 1 gone: the kernel kills every process in the namespace. (0 = never found; kill(0)
        // would signal our own process group.)
        if self.init > 0 {
            // SAFETY: signalling the process this node started, by its pid.
            unsafe { libc::kill(self.init as i32, libc::SIGKILL) };
        }
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
        self.spawner = None;
        let deadline = Instant::now() + Duration::from_secs(10);
        while Path::new(&format!("/proc/{}", self.init)).exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn open(path: &str) -> Result<File, NodeError> {
    File::open(path).map_err(|source| NodeError::Io {
        what: format!("open {path}"),
        source,
    })
}

/// A thread in the node's PID namespace that forks the node's processes.
fn spawner(pid_ns: File, mnt_ns: File) -> Result<mpsc::Sender<SpawnRequest>, NodeError> {
    let (tx, rx) = mpsc::channel::<SpawnRequest>();
    let (ready_tx, ready_rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("node-spawner".into())
        .spawn(move || {
            let joined = nix::sched::setns(&pid_ns, nix::sched::CloneFlags::CLONE_NEWPID);
            let _ = ready_tx.send(joined.map_err(std::io::Error::from));
            let mnt = mnt_ns.as_raw_fd();
            for (mut command, reply) in rx {
                use std::os::unix::process::CommandExt as _;
                // SAFETY: the closure calls only prctl, getppid, setns and _exit between fork and
                // exec; `mnt` stays open as long as this thread holds `mnt_ns`.
                unsafe {
                    command.pre_exec(move || {
                        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        // Our parent is outside the namespace (getppid is 0); 1 means it died
                        // before the prctl and pid 1 adopted us.
                        if libc::getppid() != 0 {
                            libc::_exit(1);
                        }
                        if libc::setns(mnt, libc::CLONE_NEWNS) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
                let _ = reply.send(command.spawn());
            }
            drop(mnt_ns);
        })
        .map_err(|source| NodeError::Io {
            what: "start the node's spawner thread".into(),
            source,
        })?;
    ready_rx
        .recv()
        .map_err(|_| std::io::Error::other("the spawner thread ended"))
        .and_then(|r| r)
        .map_err(|source| NodeError::Io {
            what: "join the node's PID namespace (setns CLONE_NEWPID)".into(),
            source,
        })?;
    Ok(tx)
}

/// The NSpid line of `/proc/<pid>/status`: the pid in each namespace from the host's down.
fn nspid(pid: u32) -> Vec<u32> {
    status_field(pid, "NSpid:")
        .map(|v| {
            v.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn ppid(pid: u32) -> Option<u32> {
    status_field(pid, "PPid:")?.trim().parse().ok()
}

fn status_field(pid: u32, key: &str) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(key).map(str::to_string))
}
