//! Istio's plugin goldens through the real binary: a fake API server serves the case's pod, the
//! plugin runs ADD with `$DRY_RUN_FILE_PATH`, and the recorded iptables-restore input is compared
//! per table with Istio's golden (as Istio's `TestIPTablesRuleGeneration` does).

mod cni_driver;

use std::collections::BTreeMap;

use cni_driver::*;
use serde_json::{Value, json};

/// Splits restore text at COMMIT into table name -> lines (Istio's `getRules`).
fn tables(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for part in text.split("COMMIT") {
        let mut lines: Vec<&str> = part.trim_matches('\n').split('\n').collect();
        if let Some(name) = lines.first().and_then(|l| l.strip_prefix("* ")) {
            let name = name.to_string();
            lines.push("COMMIT");
            out.insert(name, lines.join("\n"));
        }
    }
    out
}

fn golden(name: &str) -> String {
    let path = format!(
        "{}/tests/testdata/plugin/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"))
}

/// Runs one case in a fresh namespace and compares it with `golden_file`.
fn check(annotations: Value, proxy_env: Value, security: Value, golden_file: &str) {
    let netns = NetnsGuard::new("gold");
    let path = netns.path().display().to_string();
    check_in(&path, annotations, proxy_env, security, golden_file);
    // A dry run never touches the namespace.
    assert!(
        !netns.iptables_save().contains("ISTIO"),
        "dry run changed the netns"
    );
}

/// Runs one case with `CNI_NETNS` = `netns` (which need not exist: a dry run only reads it).
fn check_in(netns: &str, annotations: Value, proxy_env: Value, security: Value, golden_file: &str) {
    let api = FakeApiServer::start();
    // Istio's own fixture names: upper case cannot change a request path, so they pass the check.
    api.put_pod(sidecar_pod(
        "testNS",
        "testPod",
        annotations,
        proxy_env,
        security,
    ));
    let run_dir = tempfile::tempdir().unwrap();
    api.write_kubeconfig(run_dir.path());
    let out = run_dir.path().join("dry-run.txt");
    let mut env = cni_env("ADD", netns, "testNS", "testPod");
    env.push(("DRY_RUN_FILE_PATH", out.display().to_string()));
    let conf = plugin_conf("1.0.0", run_dir.path(), true);
    let run = run_plugin(&env, &conf.to_string());
    assert_eq!(run.code, 0, "ADD failed: {}\n{}", run.stdout, run.stderr);
    // The previous result is passed through unchanged.
    assert_eq!(run.json()["ips"][0]["address"], "10.0.0.2/24");
    let got = std::fs::read_to_string(&out).expect("dry-run output written");
    let got = tables(&got);
    assert!(!got.is_empty(), "no rules generated");
    pretty_assertions::assert_eq!(got, tables(&golden(golden_file)));
}

fn status() -> Value {
    json!({"sidecar.istio.io/status": "true"})
}

#[test]
fn basic() {
    check(status(), json!([]), json!({}), "basic.txt.golden");
}

#[test]
fn include_exclude_ip() {
    check(
        json!({
            "sidecar.istio.io/status": "true",
            "traffic.sidecar.istio.io/includeOutboundIPRanges": "127.0.0.0/8",
            "traffic.sidecar.istio.io/excludeOutboundIPRanges": "10.0.0.0/8"
        }),
        json!([]),
        json!({}),
        "include-exclude-ip.txt.golden",
    );
}

#[test]
fn include_exclude_ports() {
    check(
        json!({
            "sidecar.istio.io/status": "true",
            "traffic.sidecar.istio.io/includeInboundPorts": "1111,2222",
            "traffic.sidecar.istio.io/excludeInboundPorts": "3333,4444",
            "traffic.sidecar.istio.io/excludeOutboundPorts": "5555,6666"
        }),
        json!([]),
        json!({}),
        "include-exclude-ports.txt.golden",
    );
}

#[test]
fn dns() {
    check(
        status(),
        json!([{"name": "ISTIO_META_DNS_CAPTURE", "value": "true"}]),
        json!({}),
        "dns.txt.golden",
    );
}

#[test]
fn custom_uid() {
    check(
        status(),
        json!([]),
        json!({"runAsUser": 1000670000, "runAsGroup": 1000670001}),
        "custom-uid.txt.golden",
    );
}

#[test]
fn custom_uid_zero() {
    check(
        status(),
        json!([]),
        json!({"runAsUser": 0}),
        "basic.txt.golden",
    );
}

#[test]
fn basic_with_a_placeholder_netns() {
    // Istio's own harness passes a fake namespace; a dry run may even name the host's.
    for netns in ["/var/run/netns/does-not-exist", "/proc/self/ns/net"] {
        check_in(netns, status(), json!([]), json!({}), "basic.txt.golden");
    }
}

#[test]
fn table_split_matches_istio() {
    let t = tables("* nat\n-A X\nCOMMIT\n* raw\n-A Y\nCOMMIT\n");
    assert_eq!(t["nat"], "* nat\n-A X\nCOMMIT");
    assert_eq!(t.len(), 2);
}
