//! Finding pods' network namespaces from the host's `/proc` (for pods the plugin never announced,
//! e.g. after an agent restart): each process's cgroup path names its pod UID; the oldest process
//! of a wanted pod wins; a reserved netns (the agent's own, the node's: [`Reserved::check`]) is
//! never taken, and without them identified nothing is; and a netns only counts when one of its
//! interface addresses is one of the pod's IPs (a process may be visiting another pod's netns).
//! Parsing is pure ([`pod_uid_from_cgroup`], [`start_time`]); the effects (opening a netns,
//! reading its addresses) sit behind [`NetnsProbe`] so fixture trees can drive [`scan`]; the real
//! probe is `netlink::AddressProbe` (addresses are read over netlink, inside the netns).
//!
//! Here, below both its users: the ambient agent (pods enrolled before a restart) and the repair
//! controller (a pod that started before the plugin was installed) find netns the same way.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::NetnsId;
use super::reserved::{Reserved, Unidentified};

/// What a cgroup file says about a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupIds {
    pub pod_uid: Option<String>,
    pub container_id: Option<String>,
}

/// Why a cgroup file could not be read as a pod's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CgroupError {
    #[error("cgroup line {0:?} is not hierarchy:controllers:path")]
    Malformed(String),
    #[error("multiple pod UIDs ({0}, {1})")]
    MultiplePods(String, String),
    #[error("multiple container IDs ({0}, {1})")]
    MultipleContainers(String, String),
}

fn is_hex(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A pod UID as Kubernetes prints it (8-4-4-4-12 hex), from its cgroup spelling (systemd slices
/// use `_` for `-`).
fn as_uid(s: &str) -> Option<String> {
    let uid = s.replace('_', "-");
    let parts: Vec<&str> = uid.split('-').collect();
    let shape = [8, 4, 4, 4, 12];
    (parts.len() == 5
        && parts
            .iter()
            .zip(shape)
            .all(|(p, n)| p.len() == n && is_hex(p)))
    .then(|| uid.to_ascii_lowercase())
}

/// The container ID of a path element: 64 hex chars, possibly as `<runtime>-<id>.scope`.
fn as_container_id(elem: &str) -> Option<String> {
    let elem = elem.strip_suffix(".scope").unwrap_or(elem);
    let id = elem.rsplit('-').next().unwrap_or(elem);
    let id = id.rsplit(':').next().unwrap_or(id);
    (id.len() == 64 && is_hex(id)).then(|| id.to_string())
}

/// Pod UID and container ID of one cgroup path: cgroupfs (`/kubepods/besteffort/pod<uid>/<cid>`),
/// systemd (`/kubepods.slice/kubepods-besteffort-pod<uid_with_underscores>.slice/cri-containerd-<cid>.scope`),
/// nested (kind/docker: `/docker/<id>/kubepods/...`) and cri-o (`crio-<cid>.scope`, UID maybe absent).
pub fn ids_from_path(path: &str) -> CgroupIds {
    let mut ids = CgroupIds {
        pod_uid: None,
        container_id: None,
    };
    for elem in path.split('/') {
        let trimmed = elem.strip_suffix(".slice").unwrap_or(elem);
        if let Some(at) = trimmed.rfind("pod")
            && let Some(uid) = as_uid(&trimmed[at + 3..])
        {
            ids.pod_uid = Some(uid);
            continue;
        }
        // Only IDs below the pod count (a kind node's own docker ID sits above it).
        if (ids.pod_uid.is_some() || elem.starts_with("crio-"))
            && let Some(cid) = as_container_id(elem)
        {
            ids.container_id = Some(cid);
        }
    }
    ids
}

/// The pod of a process from its `/proc/<pid>/cgroup` text: every line must be
/// `hierarchy:controllers:path`; lines must agree on one pod and one container.
pub fn pod_uid_from_cgroup(text: &str) -> Result<CgroupIds, CgroupError> {
    let mut found = CgroupIds {
        pod_uid: None,
        container_id: None,
    };
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(_), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(CgroupError::Malformed(line.to_string()));
        };
        let ids = ids_from_path(path);
        if let Some(uid) = ids.pod_uid {
            match &found.pod_uid {
                Some(prev) if *prev != uid => {
                    return Err(CgroupError::MultiplePods(prev.clone(), uid));
                }
                _ => found.pod_uid = Some(uid),
            }
        }
        if let Some(cid) = ids.container_id {
            match &found.container_id {
                Some(prev) if *prev != cid => {
                    return Err(CgroupError::MultipleContainers(prev.clone(), cid));
                }
                _ => found.container_id = Some(cid),
            }
        }
    }
    Ok(found)
}

/// Field 22 (`starttime`) of `/proc/<pid>/stat`, counted after the `)` closing the command name.
pub fn start_time(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After ')': field 3 (state) is the first word, so starttime (22) is the 20th.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The effects of a scan: opening a process's netns and checking whose it is.
pub trait NetnsProbe {
    type Handle;
    fn open(&self, path: &Path) -> Result<Self::Handle, super::NetnsError>;
    /// Whether an interface address in the netns equals one of `ips` (v4-mapped v6 unmapped).
    fn has_any_ip(&self, handle: &Self::Handle, ips: &[IpAddr]) -> std::io::Result<bool>;
}

/// Compares addresses as Istio does (v4-in-v6 unmapped).
pub fn same_ip(a: IpAddr, b: IpAddr) -> bool {
    a.to_canonical() == b.to_canonical()
}

/// Scans the host /proc the reserved namespaces were identified under for the netns of each
/// wanted pod (uid -> its IPs). Pods without IPs are deferred (not found); a process in a reserved
/// netns, or whose netns fails the ownership check, is ignored without claiming that netns. For a
/// pod with several processes the oldest wins. `Err` (why) when the reserved namespaces are not
/// known: then no netns is anyone's.
pub fn scan<P: NetnsProbe>(
    reserved: &Reserved,
    wanted: &HashMap<String, Vec<IpAddr>>,
    probe: &P,
) -> Result<HashMap<String, P::Handle>, Unidentified> {
    if let Some(why) = reserved.unidentified() {
        return Err(Unidentified(why.to_string()));
    }
    let proc_root = reserved.host_proc();
    let Ok(dir) = std::fs::read_dir(proc_root) else {
        tracing::warn!(proc = %proc_root.display(), "cannot read the host /proc; no netns found");
        return Ok(HashMap::new());
    };
    let mut pids: Vec<u32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    let mut claimed: HashSet<(u64, u64)> = HashSet::new();
    let mut best: HashMap<String, (u64, P::Handle)> = HashMap::new();
    for pid in pids {
        let dir = proc_root.join(pid.to_string());
        let ns_path = dir.join("ns/net");
        // Processes come and go during a scan: any unreadable file skips the process.
        let Ok(meta) = std::fs::metadata(&ns_path) else {
            continue;
        };
        let id = (meta.dev(), meta.ino());
        if claimed.contains(&id) {
            continue;
        }
        let (dev, inode) = id;
        if let Err(claim) = reserved.check(NetnsId { dev, inode }) {
            tracing::debug!(pid, ?claim, "process in a reserved netns; skipped");
            continue;
        }
        let Some(started) = std::fs::read_to_string(dir.join("stat"))
            .ok()
            .as_deref()
            .and_then(start_time)
        else {
            continue;
        };
        let uid = match std::fs::read_to_string(dir.join("cgroup"))
            .map_err(|e| e.to_string())
            .and_then(|t| pod_uid_from_cgroup(&t).map_err(|e| e.to_string()))
        {
            Ok(CgroupIds {
                pod_uid: Some(uid), ..
            }) => uid,
            Ok(_) => continue,
            Err(e) => {
                tracing::debug!(pid, error = %e, "skipping process");
                continue;
            }
        };
        let Some(ips) = wanted.get(&uid) else {
            continue;
        };
        if ips.is_empty() {
            tracing::debug!(pod = %uid, "pod has no IP yet; netns lookup deferred");
            continue;
        }
        if best.get(&uid).is_some_and(|(t, _)| *t <= started) {
            continue;
        }
        let handle = match probe.open(&ns_path) {
            Ok(h) => h,
            Err(e) => {
                tracing::debug!(pid, error = %e, "cannot open netns");
                continue;
            }
        };
        match probe.has_any_ip(&handle, ips) {
            Ok(true) => {}
            Ok(false) => {
                tracing::debug!(pid, pod = %uid, "netns holds none of the pod's IPs; not the pod's");
                continue;
            }
            Err(e) => {
                tracing::debug!(pid, pod = %uid, error = %e, "ownership check failed");
                continue;
            }
        }
        claimed.insert(id);
        // The previous candidate's handle is dropped (closed) here.
        best.insert(uid, (started, handle));
    }
    Ok(best.into_iter().map(|(uid, (_, h))| (uid, h)).collect())
}

#[cfg(test)]
#[path = "procfs_tests.rs"]
mod tests;
