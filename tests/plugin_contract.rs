//! The CNI contract of the real binary: VERSION, environment checks, version gates, result
//! pass-through and conversion, CHECK/STATUS/GC/DEL, panics as CNI errors, stdout discipline.
//! Invoked both as `istio-cni-rs istio-cni` and through a link named `istio-cni`.

mod cni_driver;

use cni_driver::*;
use serde_json::{Value, json};

fn conf(version: &str, run_dir: &std::path::Path) -> Value {
    json!({
        "cniVersion": version, "name": "k8s-pod-network", "type": "istio-cni",
        "cni_agent_run_dir": run_dir.display().to_string(),
        "exclude_namespaces": ["kube-system"], "pod_namespace": "istio-system"
    })
}

/// An ADD for a pod in an excluded namespace: needs no API server and no netns.
fn excluded_add(conf: &Value) -> Run {
    run_plugin(
        &cni_env("ADD", "/var/run/netns/none", "kube-system", "p"),
        &conf.to_string(),
    )
}

/// The excluded ADD with `key` set to `value` in the config, and the plugin log it left in the run
/// dir.
fn excluded_add_logged(key: &str, value: Value) -> (Run, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut c = conf("1.0.0", dir.path());
    c[key] = value;
    let run = excluded_add(&c);
    let log = std::fs::read_to_string(dir.path().join("istio-cni.log")).expect("plugin log file");
    (run, log)
}

#[test]
fn version_lists_every_spec_version() {
    let run = run_plugin(&[("CNI_COMMAND", "VERSION".into())], "");
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        run.json(),
        json!({"cniVersion": "1.1.0", "supportedVersions": ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]})
    );
}

#[test]
fn works_through_a_link_named_istio_cni() {
    let dir = istio_cni_bin_dir();
    let run = run_cni(
        &dir.path().join("istio-cni"),
        &[],
        &[("CNI_COMMAND", "VERSION".into())],
        "",
    );
    assert_eq!(run.code, 0);
    assert_eq!(run.json()["cniVersion"], "1.1.0");
}

#[test]
fn no_command_prints_about_to_stderr() {
    let run = run_plugin(&[], "");
    assert_eq!(run.code, 0);
    assert!(
        run.stdout.is_empty(),
        "stdout must stay empty: {}",
        run.stdout
    );
    assert!(
        run.stderr
            .contains("CNI protocol versions supported: 0.1.0"),
        "{}",
        run.stderr
    );
}

#[test]
fn missing_and_invalid_environment() {
    let run = run_plugin(&[("CNI_COMMAND", "ADD".into())], "{}");
    assert_eq!(run.code, 1);
    let e = run.json();
    assert_eq!(e["code"], 4);
    assert_eq!(
        e["msg"],
        "required env variables [CNI_CONTAINERID,CNI_NETNS,CNI_IFNAME,CNI_PATH] missing"
    );
    let run = run_plugin(&[("CNI_COMMAND", "BOGUS".into())], "{}");
    assert_eq!(run.json()["code"], 4);
    let dir = tempfile::tempdir().unwrap();
    let mut env = cni_env("ADD", "/x", "kube-system", "p");
    env.retain(|(k, _)| *k != "CNI_IFNAME");
    env.push(("CNI_IFNAME", "way-too-long-ifname".into()));
    let run = run_plugin(&env, &conf("1.0.0", dir.path()).to_string());
    assert_eq!(run.json()["code"], 4, "{}", run.stdout);
}

#[test]
fn unsupported_version_and_missing_name() {
    let dir = tempfile::tempdir().unwrap();
    let run = excluded_add(&conf("2.0.0", dir.path()));
    assert_eq!(run.code, 1);
    assert_eq!(run.json()["code"], 1);
    assert_eq!(run.json()["msg"], "incompatible CNI versions");
    let mut c = conf("1.0.0", dir.path());
    c.as_object_mut().unwrap().remove("name");
    let run = excluded_add(&c);
    assert_eq!(run.json()["code"], 7);
}

#[test]
fn no_prev_result_gives_an_empty_result_in_each_version() {
    let dir = tempfile::tempdir().unwrap();
    for v in [
        "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
    ] {
        let run = excluded_add(&conf(v, dir.path()));
        assert_eq!(run.code, 0, "{v}: {}{}", run.stdout, run.stderr);
        // As libcni prints them: its 1.x types leave out an empty DNS block.
        let want = if v.starts_with("1.") {
            json!({"cniVersion": v})
        } else {
            json!({"cniVersion": v, "dns": {}})
        };
        assert_eq!(run.json(), want, "{v}");
    }
}

#[test]
fn prev_result_passes_through_in_the_config_version() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = conf("0.4.0", dir.path());
    c["prevResult"] = json!({
        "cniVersion": "0.4.0",
        "interfaces": [{"name": "eth0", "mac": "0a:58:0a:f4:00:05", "sandbox": "/var/run/netns/x"}],
        "ips": [{"version": "4", "interface": 0, "address": "10.244.0.5/24", "gateway": "10.244.0.1"}],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dns": {"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"]}
    });
    let run = excluded_add(&c);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.json(), c["prevResult"]);

    let mut c = conf("0.2.0", dir.path());
    c["prevResult"] = json!({"cniVersion": "0.2.0", "ip4": {"ip": "10.1.0.5/16", "gateway": "10.1.0.1"}, "dns": {}});
    let run = excluded_add(&c);
    assert_eq!(run.json(), c["prevResult"]);

    let mut c = conf("1.0.0", dir.path());
    c["prevResult"] = json!({"ips": [{"address": "not-an-ip"}]});
    let run = excluded_add(&c);
    assert_eq!(run.code, 1);
    assert!(run.msg().contains("prevResult"), "{}", run.stdout);
}

#[test]
fn check_gc_status_and_del() {
    let dir = tempfile::tempdir().unwrap();
    let env = |cmd: &str| cni_env(cmd, "/var/run/netns/none", "ns", "p");
    // CHECK needs 0.4.0+.
    assert_eq!(
        run_plugin(&env("CHECK"), &conf("1.0.0", dir.path()).to_string()).code,
        0
    );
    let run = run_plugin(&env("CHECK"), &conf("0.3.1", dir.path()).to_string());
    assert_eq!(run.json()["msg"], "config version does not allow CHECK");
    // GC and STATUS need 1.1.0 and only CNI_PATH.
    let status_env = vec![
        ("CNI_COMMAND", "STATUS".to_string()),
        ("CNI_PATH", "/opt/cni/bin".to_string()),
    ];
    let gc_env = vec![
        ("CNI_COMMAND", "GC".to_string()),
        ("CNI_PATH", "/opt/cni/bin".to_string()),
    ];
    let run = run_plugin(&gc_env, &conf("1.1.0", dir.path()).to_string());
    assert_eq!((run.code, run.stdout.trim()), (0, ""), "{}", run.stderr);
    assert_eq!(
        run_plugin(&gc_env, &conf("1.0.0", dir.path()).to_string()).json()["code"],
        1
    );
    // STATUS: not ready without the kubeconfig, ready with it.
    let run = run_plugin(&status_env, &conf("1.1.0", dir.path()).to_string());
    assert_eq!(run.code, 1);
    assert_eq!(run.json()["code"], 50);
    assert!(run.msg().contains("kubeconfig"));
    write_kubeconfig(dir.path(), "http://127.0.0.1:1");
    let run = run_plugin(&status_env, &conf("1.1.0", dir.path()).to_string());
    assert_eq!((run.code, run.stdout.trim()), (0, ""), "{}", run.stdout);
    // Ambient: also needs the agent socket.
    let mut c = conf("1.1.0", dir.path());
    c["ambient_enabled"] = json!(true);
    let run = run_plugin(&status_env, &c.to_string());
    assert_eq!(run.json()["code"], 50);
    assert!(run.msg().contains("pluginevent.sock"));
    // DEL: no netns, no kubeconfig needed, nothing printed, repeatable.
    let empty = tempfile::tempdir().unwrap();
    for _ in 0..2 {
        let mut e = env("DEL");
        e.retain(|(k, _)| *k != "CNI_NETNS");
        let run = run_plugin(&e, &conf("1.0.0", empty.path()).to_string());
        assert_eq!((run.code, run.stdout.as_str()), (0, ""), "{}", run.stderr);
    }
}

// The trigger exists only in `test-hooks` builds; the shipped binary has no such string.
#[cfg(not(feature = "test-hooks"))]
compile_error!(
    "a_panic_becomes_a_cni_error needs the `test-hooks` feature (scripts/test passes it; the \
     crate's dev-dependency on itself normally turns it on)"
);

#[test]
fn a_panic_becomes_a_cni_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut env = cni_env("ADD", "/var/run/netns/none", "ns", "p");
    env.push(("ISTIO_CNI_RS_TEST_PANIC", "1".into()));
    let run = run_plugin(&env, &conf("1.0.0", dir.path()).to_string());
    assert_eq!(run.code, 1);
    let e = run.json();
    assert_eq!(e["code"], 999);
    assert!(e["msg"].as_str().unwrap().contains("panicked"), "{e}");
    assert!(
        e["msg"]
            .as_str()
            .unwrap()
            .contains("ISTIO_CNI_RS_TEST_PANIC"),
        "{e}"
    );
}

#[test]
fn logs_go_to_the_run_dir_file_and_never_to_stdout() {
    let (run, log) = excluded_add_logged("plugin_log_level", json!("debug"));
    assert_eq!(run.code, 0);
    run.json(); // stdout is exactly the result
    for line in log.lines() {
        let rec: Value = serde_json::from_str(line).expect("JSON log line");
        assert!(rec["level"].is_string() && rec["time"].is_string() && rec["msg"].is_string());
    }
    assert!(log.contains("kube-system/p"), "{log}");
    assert!(run.stderr.contains("kube-system/p"), "{}", run.stderr);
}

#[test]
fn config_errors_are_logged_in_the_run_dir_when_it_is_readable() {
    let (run, log) = excluded_add_logged("ambient_enabled", json!("yes"));
    assert_eq!(run.code, 1);
    assert_eq!(run.json()["code"], 7);
    assert!(log.contains("ambient_enabled"), "{log}");
}

#[test]
fn the_plugins_own_netns_is_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let c = conf("1.0.0", dir.path()).to_string();
    let run = run_plugin(&cni_env("ADD", "/proc/self/ns/net", "kube-system", "p"), &c);
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert_eq!(run.json()["code"], 12);
    let mut env = cni_env("ADD", "/proc/self/ns/net", "kube-system", "p");
    env.push(("CNI_NETNS_OVERRIDE", "true".into()));
    assert_eq!(run_plugin(&env, &c).code, 0);
}
