//! What the plugin's log records say: outcomes in words, never Rust debug syntax
//! (`"outcome":"Some(Applied)"`).

mod cni_driver;

use cni_driver::*;
use serde_json::json;

#[test]
fn outcomes_are_logged_in_words() {
    require_tool("iptables-restore", "iptables");
    let api = FakeApiServer::start();
    api.put_pod(sidecar_pod("ns1", "p", json!({}), json!([]), json!({})));
    let dir = tempfile::tempdir().unwrap();
    api.write_kubeconfig(dir.path());
    let netns = NetnsGuard::new("logw");
    let conf = json!({
        "cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "istio-cni",
        "cni_agent_run_dir": dir.path().display().to_string(),
        "exclude_namespaces": ["kube-system"], "pod_namespace": "istio-system",
        "plugin_log_level": "debug"
    });
    let ns_path = netns.path().display().to_string();
    let mut stderr = String::new();
    for (ns, pod) in [("ns1", "p"), ("ns1", "p"), ("kube-system", "coredns")] {
        let run = run_plugin(&cni_env("ADD", &ns_path, ns, pod), &conf.to_string());
        assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
        stderr.push_str(&run.stderr);
    }
    for want in [
        r#""outcome":"applied""#,
        r#""outcome":"already applied""#,
        r#""outcome":"excluded namespace""#,
    ] {
        assert!(stderr.contains(want), "{want} missing:\n{stderr}");
    }
    for debug_syntax in ["Some(", "None", "Applied", "Excluded"] {
        assert!(
            !stderr.contains(debug_syntax),
            "{debug_syntax} in the logs:\n{stderr}"
        );
    }
}

#[test]
fn a_missing_kubeconfig_is_named_once_without_double_quotes() {
    let dir = tempfile::tempdir().unwrap(); // no kubeconfig in it
    let netns = NetnsGuard::new("kcq");
    let conf = json!({
        "cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "istio-cni",
        "cni_agent_run_dir": dir.path().display().to_string()
    });
    let run = run_plugin(
        &cni_env("ADD", &netns.path().display().to_string(), "ns1", "p"),
        &conf.to_string(),
    );
    assert_eq!(run.code, 1, "{}", run.stdout);
    let msg = run.json()["msg"].as_str().unwrap_or_default().to_string();
    let path = dir.path().join("istio-cni-kubeconfig").display().to_string();
    assert_eq!(msg.matches(&path).count(), 1, "{msg}");
    assert!(!msg.contains('"') && !msg.contains('\''), "{msg}");
    assert!(msg.contains("No such file or directory"), "{msg}");
    assert!(run.stderr.contains(r#""command":"ADD""#), "{}", run.stderr);
}
