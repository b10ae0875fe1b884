//! The node's child processes and what they leave on the machine: children tied to the test
//! process (`crate::tied`), stopped with SIGTERM then SIGKILL; the runtime's shims and pod
//! processes (which outlive containerd by design) found and killed by the node's directory in
//! their command line; the mounts kubelet and containerd made under the node's directory; the
//! node's cgroups.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use super::NodeError;

/// Spawns `command` (stdout and stderr appended to `log`) so that it dies with the test process.
pub(super) fn spawn(command: Command, log: &Path) -> Result<Child, NodeError> {
    let program = command.get_program().to_string_lossy().into_owned();
    let (out, err) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .and_then(|f| Ok((f.try_clone()?, f)))
        .map_err(|source| NodeError::Io {
            what: format!("open {}", log.display()),
            source,
        })?;
    crate::tied::spawn(command, out, err).map_err(|source| NodeError::Io {
        what: format!("start {program}"),
        source,
    })
}

/// SIGTERM, then SIGKILL after `grace`; reaps the child.
pub(super) fn stop(child: &mut Child, grace: Duration) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    // SAFETY: signalling our own child by pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Kills every process whose command line names `dir` (containerd's shims, started with the
/// node's socket address, and their runc children), then the pods' processes, which the shims
/// parent: every process in a cgroup under the node's cgroup root.
pub(super) fn kill_leftovers(dir: &Path, cgroup_root: &str) {
    let needle = dir.to_string_lossy().into_owned();
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cgroup = std::fs::read_to_string(entry.path().join("cgroup")).unwrap_or_default();
        let ours = String::from_utf8_lossy(&cmdline).contains(&needle)
            || cgroup.lines().any(|l| l.contains(cgroup_root));
        if ours {
            // SAFETY: signalling a process this node started.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    }
}

/// Unmounts everything mounted at or under `dir`, deepest first (kubelet's volume tmpfs and
/// its own rshared bind, containerd's rootfs overlays and pod netns binds).
pub(super) fn unmount_under(dir: &Path) {
    let prefix = dir.to_string_lossy().into_owned();
    for _ in 0..4 {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut points: Vec<String> = info
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .map(unescape_mount_path)
            .filter(|p| p == &prefix || p.starts_with(&format!("{prefix}/")))
            .collect();
        if points.is_empty() {
            return;
        }
        points.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for p in points {
            if let Ok(c) = std::ffi::CString::new(p) {
                // SAFETY: a NUL-terminated path; MNT_DETACH never blocks.
                unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            }
        }
    }
}

fn unescape_mount_path(p: &str) -> String {
    p.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// The cgroup v1 hierarchies (or the single v2 one) the node's cgroup root is made in.
pub(super) fn cgroup_mounts() -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let fstype = right.split(' ').next()?;
            let point = left.split(' ').nth(4)?;
            (fstype == "cgroup" || fstype == "cgroup2").then(|| PathBuf::from(point))
        })
        .collect()
}

/// Creates `root` (a path like `/istio-cni-node-1`) in every hierarchy: kubelet requires its
/// `cgroupRoot` to exist.
pub(super) fn make_cgroup_root(root: &str) -> Result<(), NodeError> {
    for mount in cgroup_mounts() {
        let path = mount.join(root.trim_start_matches('/'));
        std::fs::create_dir_all(&path).map_err(|source| NodeError::Io {
            what: format!("create cgroup {}", path.display()),
            source,
        })?;
    }
    Ok(())
}

/// Removes `root` and every cgroup under it, leaves first (their processes must be gone).
pub(super) fn remove_cgroup_root(root: &str) {
    for mount in cgroup_mounts() {
        let top = mount.join(root.trim_start_matches('/'));
        let mut dirs = Vec::new();
        collect_dirs(&top, &mut dirs, 0);
        dirs.sort_by_key(|d| std::cmp::Reverse(d.as_os_str().len()));
        for d in dirs {
            for _ in 0..20 {
                if std::fs::remove_dir(&d).is_ok() || !d.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>, depth: usize) {
    if depth > 16 || !dir.is_dir() {
        return;
    }
    out.push(dir.to_path_buf());
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                collect_dirs(&e.path(), out, depth + 1);
            }
        }
    }
}

/// A loopback port that was free a moment ago.
pub(super) fn free_port() -> Result<u16, NodeError> {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|source| NodeError::Io {
            what: "find a free loopback port".into(),
            source,
        })
}

/// A log's error lines (klog `E`/`F`, logrus `level=error|fatal`) and its last `lines` lines.
pub(super) fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    let errors: Vec<&str> = all
        .iter()
        .copied()
        .filter(|l| {
            l.starts_with('E')
                || l.starts_with('F')
                || l.contains("level=error")
                || l.contains("level=fatal")
        })
        .collect();
    let errors = &errors[errors.len().saturating_sub(10)..];
    let last = &all[all.len().saturating_sub(lines)..];
    format!("{}\n...\n{}", errors.join("\n"), last.join("\n"))
}

/// Removes libcni's cached results (the runtime's `/var/lib/cni/results`, a fixed path) of the
/// sandboxes this node set up and never tore down: those naming a netns under `dir`.
pub(super) fn remove_cni_cache_entries(dir: &Path) {
    let needle = dir.to_string_lossy().into_owned();
    let Ok(entries) = std::fs::read_dir("/var/lib/cni/results") else {
        return;
    };
    for entry in entries.flatten().take(10_000) {
        let small = entry.metadata().map(|m| m.is_file() && m.len() < 1 << 20);
        if !small.unwrap_or(false) {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        if text.contains(&needle) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}
