//! What the plugin's messages say: outcomes in words, never Rust debug syntax
//! (`"outcome":"Some(Applied)"`); paths once and without Debug quotes; a `*` in a port
//! annotation that cannot take it fails naming the annotation, before the netns is touched.

mod cni_driver;

use cni_driver::*;
use serde_json::json;

#[test]
fn outcomes_are_logged_in_words() {
    require_tool("iptables-restore", "iptables");
    let (_api, dir) = api_with_sidecar_pod("ns1", "p");
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
    let path = dir
        .path()
        .join("istio-cni-kubeconfig")
        .display()
        .to_string();
    assert_eq!(msg.matches(&path).count(), 1, "{msg}");
    assert!(!msg.contains('"') && !msg.contains('\''), "{msg}");
    assert!(msg.contains("No such file or directory"), "{msg}");
    assert!(run.stderr.contains(r#""command":"ADD""#), "{}", run.stderr);
}

#[test]
fn a_wildcard_port_annotation_fails_naming_the_annotation() {
    let (api, dir) = api_and_run_dir();
    let netns = NetnsGuard::new("star");
    let conf = json!({
        "cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "istio-cni",
        "cni_agent_run_dir": dir.path().display().to_string()
    });
    let annotations = [
        "traffic.sidecar.istio.io/excludeInboundPorts",
        "traffic.sidecar.istio.io/includeOutboundPorts",
        "traffic.sidecar.istio.io/excludeOutboundPorts",
    ];
    for (i, annotation) in annotations.iter().enumerate() {
        let name = format!("star{i}");
        api.put_pod(annotated_pod("ns1", &name, json!({*annotation: "*"})));
        let run = run_plugin(
            &cni_env("ADD", &netns.path().display().to_string(), "ns1", &name),
            &conf.to_string(),
        );
        assert_eq!(run.code, 1, "{annotation}: {}", run.stdout);
        let msg = run.json()["msg"].as_str().unwrap_or_default().to_string();
        assert!(msg.contains(annotation), "{msg}");
        assert!(
            !msg.contains("iptables"),
            "failed late, in the rules: {msg}"
        );
    }
    let save = netns.iptables_save();
    assert!(!save.contains("ISTIO"), "netns was changed:\n{save}");
}
