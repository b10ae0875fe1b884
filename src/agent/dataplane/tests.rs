//! Unit tests of the data plane's pure parts.

use super::*;

#[test]
fn a_sync_report_counts_owner_changes_as_adds_and_strangers_as_removals() {
    let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
    let ops = [
        SetOp::Del { ip: ip("10.0.0.1") },
        SetOp::Add {
            ip: ip("10.0.0.1"),
            uid: "a".into(),
        },
        SetOp::Del { ip: ip("10.0.0.9") },
        SetOp::Add {
            ip: ip("10.0.0.2"),
            uid: "b".into(),
        },
    ];
    let report = ProbeSynced::of(&ops);
    assert_eq!(
        report.added,
        [
            ("a".to_string(), ip("10.0.0.1")),
            ("b".into(), ip("10.0.0.2"))
        ]
    );
    assert_eq!(report.removed, [ip("10.0.0.9")]);
    assert!(ProbeSynced::of(&[]).is_empty());
}

#[test]
fn the_agent_s_and_the_node_s_netns_are_reserved_by_identity() {
    let here = Netns::current().unwrap().id();
    let proc = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(proc.path().join("1/ns")).unwrap();
    // A node whose pid 1 runs in another netns (a fresh one, kept by a sleeping process).
    let mut child = std::process::Command::new("unshare")
        .args(["--net", "sleep", "30"])
        .spawn()
        .unwrap();
    let child_ns = PathBuf::from(format!("/proc/{}/ns/net", child.id()));
    let node = loop {
        // unshare execs sleep after entering the new netns.
        let id = Netns::open(&child_ns).unwrap().id();
        if id != here {
            break id;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    std::os::unix::fs::symlink(&child_ns, proc.path().join("1/ns/net")).unwrap();
    let reserved = reserved_netns(proc.path());
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(reserved.len(), 2, "{reserved:?}");
    assert_eq!(reserved[0], ("the agent's own netns".to_string(), here));
    assert!(
        reserved[1].0.starts_with("the node's netns ("),
        "{reserved:?}"
    );
    assert_eq!(reserved[1].1, node);
    // Unreadable: left out.
    let empty = tempfile::tempdir().unwrap();
    assert_eq!(reserved_netns(empty.path()).len(), 1);
}

#[test]
fn plugin_paths_are_opened_under_the_host_prefix() {
    assert_eq!(
        host_path(Path::new("/host"), "/var/run/netns/cni-1"),
        PathBuf::from("/host/var/run/netns/cni-1")
    );
    assert_eq!(
        host_path(Path::new("/"), "/proc/7/ns/net"),
        PathBuf::from("/proc/7/ns/net")
    );
}
