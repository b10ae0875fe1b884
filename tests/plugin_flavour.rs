//! One iptables flavour per node for every role: the agent records the flavour at the node's first
//! install, install-cni hands it to the plugin in our conflist entry, and the plugin honours it
//! over its own detection. The pod's netns here holds iptables-legacy rules, which make the
//! plugin's detection pick legacy while the node decided nft: the pod still ends with nft rules
//! only.

mod cni_driver;
#[path = "install_support.rs"]
mod support;

use std::time::Duration;

use serde_json::{Value, json};

const T: Duration = Duration::from_secs(30);
const PRIMARY: &str = r#"{"cniVersion":"0.3.1","name":"k8s-pod-network","plugins":[{"type":"ptp","ipam":{"type":"host-local","subnet":"10.1.0.0/16"}}]}"#;

/// Our entry as install-cni writes it on an ambient node whose agent recorded `flavour`.
fn installed_entry(flavour: &str) -> Value {
    let d = support::Dirs::new();
    d.put("10-primary.conflist", PRIMARY.as_bytes());
    std::fs::create_dir_all(&d.run).expect("run dir");
    // What the agent recorded at the node's first install.
    let record = format!("backend=iptables\nflavour={flavour}\nnative_nftables=false\n");
    std::fs::write(d.run.join("ambient-backend"), record).expect("record");
    let api = support::ApiServer::start();
    let mut env = d.base_env();
    env.extend(api.ambient_env());
    let mut agent = support::start(&env, &[]);
    agent.wait_line("istio-cni is installed; watching for changes", T);
    let merged: Value =
        serde_json::from_str(&d.read("10-primary.conflist").expect("merged")).expect("json");
    let _ = agent.terminate(T);
    merged["plugins"]
        .as_array()
        .and_then(|p| p.iter().find(|e| e["type"] == "istio-cni").cloned())
        .expect("our entry")
}

/// ADD of a sidecar pod with our entry's flavour (or none) into a netns holding legacy rules.
fn add_into_legacy_netns(flavour: Option<&Value>) -> (String, String) {
    cni_driver::require_tool("iptables-legacy", "iptables");
    cni_driver::require_tool("iptables-nft", "iptables");
    let (_api, dir) = cni_driver::api_with_sidecar_pod("ns1", "app");
    let netns = cni_driver::NetnsGuard::new("flv");
    // Something else in the pod wrote a legacy rule: Istio's detection then picks legacy.
    for args in [
        &["-t", "nat", "-N", "OTHER"][..],
        &["-t", "nat", "-A", "OTHER", "-j", "RETURN"],
    ] {
        let out = netns.exec("iptables-legacy", args);
        assert!(out.status.success(), "{out:?}");
    }
    let mut conf = cni_driver::sidecar_conf(dir.path(), "10.31.0.2/24");
    if let Some(f) = flavour {
        conf["force_iptables_binary"] = f.clone();
    }
    let run = netns.add("ns1", "app", &conf);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    (
        netns.stdout("iptables-nft-save", &["-t", "nat"]),
        netns.stdout("iptables-legacy-save", &["-t", "nat"]),
    )
}

#[test]
fn the_plugin_writes_the_flavour_the_node_decided_even_where_its_detection_differs() {
    let entry = installed_entry("nft");
    assert_eq!(entry["force_iptables_binary"], json!("nft"), "{entry}");
    let (nft, legacy) = add_into_legacy_netns(entry.get("force_iptables_binary"));
    assert!(nft.contains("-A ISTIO_OUTPUT"), "nft:\n{nft}");
    assert!(
        !legacy.contains("ISTIO"),
        "legacy holds ours too:\n{legacy}"
    );
    assert!(legacy.contains("-A OTHER -j RETURN"), "legacy:\n{legacy}");
}

#[test]
fn without_the_node_s_flavour_the_plugin_s_own_detection_would_pick_legacy() {
    // The disagreement the entry removes: detection in this netns alone says legacy.
    let (nft, legacy) = add_into_legacy_netns(None);
    assert!(legacy.contains("-A ISTIO_OUTPUT"), "legacy:\n{legacy}");
    assert!(!nft.contains("ISTIO"), "nft:\n{nft}");
}

#[test]
fn a_sidecar_only_node_hands_no_flavour_as_istio() {
    let d = support::Dirs::new();
    d.put("10-primary.conflist", PRIMARY.as_bytes());
    let mut agent = support::start(&d.base_env(), &[]);
    agent.wait_line("istio-cni is installed; watching for changes", T);
    let merged = d.read("10-primary.conflist").expect("merged");
    let _ = agent.terminate(T);
    assert!(!merged.contains("force_iptables_binary"), "{merged}");
}
