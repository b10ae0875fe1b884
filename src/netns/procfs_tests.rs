use super::*;
use std::cell::RefCell;
use std::path::PathBuf;

const POD: &str = "863b91d4-4b68-4efa-917f-4b560e3e86aa";
const OTHER: &str = "aaaabbbb-4b68-4efa-917f-4b560e3e86aa";

fn stat(pid: u32, starttime: u64) -> String {
    // 52 fields; the command name has a space and a ')' to prove parsing starts after the last one.
    let mut fields: Vec<String> = (3..=52).map(|i| i.to_string()).collect();
    fields[19] = starttime.to_string();
    format!("{pid} (we i)rd) S {}", fields[1..].join(" "))
}

fn cgroupfs(uid: &str) -> String {
    format!(
        "12:pids:/kubepods/besteffort/pod{uid}/{cid}\n0::/kubepods/besteffort/pod{uid}/{cid}\n",
        cid = "a".repeat(64)
    )
}

/// A fixture /proc: pid -> (starttime, cgroup text); each ns/net an empty regular file of its own
/// (its own inode), pid 1 the host.
fn tree(procs: &[(u32, u64, String)]) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let host = root.path().join("1/ns");
    std::fs::create_dir_all(&host).unwrap();
    std::fs::write(host.join("net"), "").unwrap();
    std::fs::write(root.path().join("1/stat"), stat(1, 1)).unwrap();
    std::fs::write(root.path().join("1/cgroup"), "0::/init.scope\n").unwrap();
    for (pid, start, cgroup) in procs {
        let dir = root.path().join(pid.to_string());
        std::fs::create_dir_all(dir.join("ns")).unwrap();
        std::fs::write(dir.join("ns/net"), "").unwrap();
        std::fs::write(dir.join("stat"), stat(*pid, *start)).unwrap();
        std::fs::write(dir.join("cgroup"), cgroup).unwrap();
    }
    root
}

/// Opens "netns" by path; each path has the addresses given; records what was opened and dropped.
struct Fake {
    addrs: HashMap<PathBuf, Vec<IpAddr>>,
    fail: Option<PathBuf>,
    dropped: std::rc::Rc<RefCell<Vec<PathBuf>>>,
}

#[derive(Debug)]
struct Handle(PathBuf, std::rc::Rc<RefCell<Vec<PathBuf>>>);
impl Drop for Handle {
    fn drop(&mut self) {
        self.1.borrow_mut().push(self.0.clone());
    }
}

impl NetnsProbe for Fake {
    type Handle = Handle;
    fn open(&self, path: &Path) -> Result<Handle, crate::netns::NetnsError> {
        Ok(Handle(path.to_path_buf(), self.dropped.clone()))
    }
    fn has_any_ip(&self, h: &Handle, ips: &[IpAddr]) -> std::io::Result<bool> {
        if self.fail.as_deref() == Some(h.0.as_path()) {
            return Err(std::io::Error::other("boom"));
        }
        let have = self.addrs.get(&h.0).cloned().unwrap_or_default();
        Ok(have.iter().any(|a| ips.iter().any(|b| same_ip(*a, *b))))
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn fake(root: &Path, addrs: &[(u32, &str)]) -> Fake {
    let mut map: HashMap<PathBuf, Vec<IpAddr>> = HashMap::new();
    for (pid, a) in addrs {
        map.entry(root.join(format!("{pid}/ns/net")))
            .or_default()
            .push(ip(a));
    }
    Fake {
        addrs: map,
        fail: None,
        dropped: Default::default(),
    }
}

/// The fixture's reserved namespaces: its pid 1's `ns/net` file (by its inode) is the node's.
fn node(root: &Path) -> Reserved {
    let meta = std::fs::metadata(root.join("1/ns/net")).unwrap();
    let id = NetnsId {
        dev: meta.dev(),
        inode: meta.ino(),
    };
    Reserved::new(root, vec![("the node's netns".into(), id)], None)
}

fn wanted(list: &[(&str, &[&str])]) -> HashMap<String, Vec<IpAddr>> {
    list.iter()
        .map(|(u, ips)| (u.to_string(), ips.iter().map(|s| ip(s)).collect()))
        .collect()
}

#[test]
fn the_oldest_process_wins_and_losers_are_closed() {
    let root = tree(&[
        (10, 70298999, cgroupfs(POD)),
        (11, 70298968, cgroupfs(POD)),
        (12, 70298977, cgroupfs(POD)),
        (13, 5, cgroupfs(OTHER)),
    ]);
    let p = root.path();
    let probe = fake(
        p,
        &[
            (10, "10.0.0.5"),
            (11, "10.0.0.5"),
            (12, "10.0.0.5"),
            (13, "10.0.0.6"),
        ],
    );
    let found = scan(&node(p), &wanted(&[(POD, &["10.0.0.5"])]), &probe).unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[POD].0, p.join("11/ns/net"));
    // 10 was opened first and replaced by 11 (closed); 12 is younger and never opened.
    assert_eq!(*probe.dropped.borrow(), vec![p.join("10/ns/net")]);
}

#[test]
fn a_foreign_netns_is_rejected_without_poisoning_the_rightful_pod() {
    // Pod OTHER's process (oldest) sits in a netns without OTHER's IP (it visits POD's netns).
    let root = tree(&[(20, 1, cgroupfs(OTHER)), (21, 2, cgroupfs(POD))]);
    let p = root.path();
    let probe = fake(p, &[(20, "10.0.0.5"), (21, "10.0.0.5")]);
    let found = scan(
        &node(p),
        &wanted(&[(POD, &["10.0.0.5"]), (OTHER, &["10.0.0.6"])]),
        &probe,
    )
    .unwrap();
    assert!(!found.contains_key(OTHER));
    assert_eq!(found[POD].0, p.join("21/ns/net"));
}

#[test]
fn pods_without_ips_are_deferred_and_dual_stack_matches_any_ip() {
    let root = tree(&[(30, 1, cgroupfs(POD)), (31, 1, cgroupfs(OTHER))]);
    let p = root.path();
    let probe = fake(p, &[(30, "fd00::5"), (31, "10.0.0.6")]);
    let found = scan(
        &node(p),
        &wanted(&[(POD, &["10.0.0.5", "fd00::5"]), (OTHER, &[])]),
        &probe,
    )
    .unwrap();
    assert!(found.contains_key(POD) && !found.contains_key(OTHER));
}

#[test]
fn an_ownership_check_error_rejects_and_the_host_netns_is_ignored() {
    let root = tree(&[(40, 1, cgroupfs(POD))]);
    let p = root.path();
    let mut probe = fake(p, &[(40, "10.0.0.5")]);
    probe.fail = Some(p.join("40/ns/net"));
    assert!(
        scan(&node(p), &wanted(&[(POD, &["10.0.0.5"])]), &probe)
            .unwrap()
            .is_empty()
    );
    // The host netns: pid 1's inode, shared by a process of the pod (hostNetwork-like).
    let root = tree(&[(41, 1, cgroupfs(POD))]);
    let p = root.path();
    std::fs::remove_file(p.join("41/ns/net")).unwrap();
    std::fs::hard_link(p.join("1/ns/net"), p.join("41/ns/net")).unwrap();
    let probe = fake(p, &[(41, "10.0.0.5"), (1, "10.0.0.5")]);
    assert!(
        scan(&node(p), &wanted(&[(POD, &["10.0.0.5"])]), &probe)
            .unwrap()
            .is_empty()
    );
}

#[test]
fn cgroup_paths_of_every_runtime_layout() {
    let cid = "b".repeat(64);
    let uid_ = POD.replace('-', "_");
    for (text, uid, container) in [
        (
            format!("0::/kubepods/burstable/pod{POD}/{cid}\n"),
            Some(POD),
            Some(cid.as_str()),
        ),
        (
            format!(
                "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/cri-containerd-{cid}.scope\n"
            ),
            Some(POD),
            Some(cid.as_str()),
        ),
        (
            format!("0::/kubepods.slice/kubepods-pod{uid_}.slice/crio-{cid}.scope\n"),
            Some(POD),
            Some(cid.as_str()),
        ),
        (format!("0::/crio-{cid}.scope\n"), None, Some(cid.as_str())),
        (
            format!(
                "1:name=systemd:/docker/{}/kubepods/besteffort/pod{POD}/{cid}\n",
                "c".repeat(64)
            ),
            Some(POD),
            Some(cid.as_str()),
        ),
        (
            "0::/user.slice/user-0.slice/session-1.scope\n".to_string(),
            None,
            None,
        ),
    ] {
        let ids = pod_uid_from_cgroup(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(ids.pod_uid.as_deref(), uid, "{text}");
        assert_eq!(ids.container_id.as_deref(), container, "{text}");
    }
    assert!(matches!(
        pod_uid_from_cgroup("garbage\n"),
        Err(CgroupError::Malformed(_))
    ));
    let two = format!("1:a:/kubepods/pod{POD}/{cid}\n2:b:/kubepods/pod{OTHER}/{cid}\n");
    assert!(matches!(
        pod_uid_from_cgroup(&two),
        Err(CgroupError::MultiplePods(..))
    ));
    let two = format!(
        "1:a:/kubepods/pod{POD}/{cid}\n2:b:/kubepods/pod{POD}/{}\n",
        "d".repeat(64)
    );
    let err = pod_uid_from_cgroup(&two).unwrap_err();
    assert!(err.to_string().contains("multiple container IDs"), "{err}");
}

#[test]
fn start_time_is_field_22() {
    assert_eq!(start_time(&stat(7, 123456)), Some(123456));
    assert_eq!(start_time("garbage"), None);
}

#[test]
fn a_process_in_a_reserved_netns_is_never_taken_even_holding_the_pod_s_ip() {
    // A hostNetwork-like pod: its process sits in the agent's own netns (another fixture file
    // than pid 1's), which holds the pod's IP (the node's).
    let root = tree(&[(50, 1, cgroupfs(POD))]);
    let p = root.path();
    let probe = fake(p, &[(50, "10.0.0.5")]);
    let meta = std::fs::metadata(p.join("50/ns/net")).unwrap();
    let agent = NetnsId {
        dev: meta.dev(),
        inode: meta.ino(),
    };
    let mut reserved = node(p).known().to_vec();
    reserved.push(("the agent's own netns".into(), agent));
    let reserved = Reserved::new(p, reserved, None);
    let want = wanted(&[(POD, &["10.0.0.5"])]);
    assert!(scan(&reserved, &want, &probe).unwrap().is_empty());
    // Without it reserved, the same process is found: the check is what refused it.
    assert_eq!(scan(&node(p), &want, &probe).unwrap().len(), 1);
}

#[test]
fn with_the_node_s_netns_unidentified_nothing_is_scanned_or_opened() {
    let root = tree(&[(60, 1, cgroupfs(POD))]);
    let p = root.path();
    let probe = fake(p, &[(60, "10.0.0.5")]);
    let closed = Reserved::new(p, vec![], Some("cannot identify the node's netns".into()));
    let err = scan(&closed, &wanted(&[(POD, &["10.0.0.5"])]), &probe).unwrap_err();
    assert_eq!(err.to_string(), "cannot identify the node's netns");
    assert!(probe.dropped.borrow().is_empty(), "nothing was opened");
}
