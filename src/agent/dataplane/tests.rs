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
