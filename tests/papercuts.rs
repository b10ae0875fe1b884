//! Small things a new user trips over, one test each, against the real binary: exit codes and
//! messages that must agree with themselves, log scopes, what an uninstall leaves behind (the
//! test peer's `--help` is in testing/tests/zds_peer_cli.rs).

#[path = "install_support.rs"]
mod support;

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use support::*;

const T: Duration = Duration::from_secs(30);

fn run(args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .stdin(Stdio::null())
        .output()
        .expect("run the binary")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn no_role_is_a_usage_error_and_help_is_not() {
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("usage:"));
    for help in ["--help", "-h"] {
        let out = run(&[help]);
        assert_eq!(out.status.code(), Some(0), "{help}");
        assert!(text(&out.stdout).contains("usage:"), "{help}");
    }
}

#[test]
fn status_health_port_check_and_message_agree() {
    for port in ["99999", "0", "-1"] {
        let out = run(&["install-cni", "status", "--health-port", port]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{port}: {err}");
        assert!(
            err.contains("1-65535") && !err.contains("0-65535"),
            "{port}: {err}"
        );
    }
}

#[test]
fn istio_iptables_logs_under_its_own_scope() {
    let out = run(&["istio-iptables", "--dry-run", "-p", "99999"]);
    let err = text(&out.stderr);
    assert!(err.contains("\terror\tiptables\t"), "{err}");
    assert!(!err.contains("cni-agent"), "{err}");
}

/// A netns with nothing but `lo` (down): there is no address to pick a family from, and cleanup
/// needs none.
#[test]
fn cleanup_only_needs_no_address() {
    let name = format!("papercut-lo-{}", std::process::id());
    let ok = Command::new("ip")
        .args(["netns", "add", &name])
        .status()
        .expect("ip netns add");
    assert!(ok.success());
    struct Del(String);
    impl Drop for Del {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
        }
    }
    let _del = Del(name.clone());
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &name,
            bin(),
            "istio-iptables",
            "--cleanup-only",
        ])
        .output()
        .expect("cleanup");
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("no valid local IP address"), "{err}");
    // Applying still needs one.
    let out = Command::new("ip")
        .args(["netns", "exec", &name, bin(), "istio-iptables", "--dry-run"])
        .output()
        .expect("dry run");
    assert!(text(&out.stderr).contains("no valid local IP address"));
}

#[test]
fn status_cuts_a_long_pod_name_with_an_ellipsis() {
    let long = "n".repeat(253);
    let answer: istio_cni::agent::status::DebugPods = serde_json::from_value(serde_json::json!({
        "version": 1, "host_rules": null, "pods": [],
        "not_enrolled": [
            {"uid": "u1", "namespace": "default", "name": long, "mode": "none", "ips": [],
             "reason_code": "not_selected", "reason": "not selected"},
            {"uid": "u2", "namespace": "default", "name": "short", "mode": "none", "ips": [],
             "reason_code": "not_selected", "reason": "not selected"}
        ]
    }))
    .expect("answer");
    let table = istio_cni::install::status::render(&answer, 0);
    let widest = table.lines().map(|l| l.chars().count()).max().unwrap_or(0);
    assert!(widest < 120, "{widest} columns:\n{table}");
    assert!(
        table.contains("default/nnnn") && table.contains('…'),
        "{table}"
    );
    let short = table
        .lines()
        .find(|l| l.starts_with("default/short "))
        .expect("short row");
    assert!(short.chars().count() < 120, "{short}");
}

/// An uninstall takes the plugin's log (it holds annotation values) and the empty pod-facts
/// directory with it; while installed, the log is root-only.
#[test]
fn uninstall_leaves_no_plugin_log_and_no_empty_podfacts_dir() {
    let api = ApiServer::start();
    let d = Dirs::new();
    d.put("10-list.conflist", &testdata("list.conflist"));
    let mut env = d.base_env();
    env.extend(api.ambient_env());
    let mut agent = start(&env, &[]);
    agent.wait_line("istio-cni is installed; watching for changes", T);
    assert!(d.run.join("podfacts").is_dir(), "{}", agent.output());
    // Left by an older plugin, world-readable.
    let log = d.run.join("istio-cni.log");
    std::fs::write(&log, "{\"msg\":\"annotation value\"}\n").expect("log");
    std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    std::fs::write(d.run.join("istio-cni.log.1"), "old\n").expect("backup");
    assert!(agent.terminate(T).success(), "{}", agent.output());
    for left in ["istio-cni.log", "istio-cni.log.1", "podfacts"] {
        assert!(
            std::fs::symlink_metadata(d.run.join(left)).is_err(),
            "{left} left after uninstall:\n{}",
            agent.output()
        );
    }
}
