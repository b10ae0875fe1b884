//! End to end, ambient mode (issue 10), the informer path: a pod already running in a namespace
//! that is not ambient is enrolled when its namespace gets labelled `istio.io/dataplane-mode=
//! ambient`. The plugin never announced it, so the agent finds its netns by scanning /proc for a
//! process whose cgroup path names the pod UID and whose netns holds the pod IP. Unlabelling
//! takes it out again: in-pod rules gone, ztunnel told Del, annotation removed, probe entry gone.
//! On the real kube-apiserver (`Node::start_real`).

#[path = "support/ambient_node.rs"]
mod ambient_node;
mod install_support;
mod support;

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use ambient_node::{Backend, Node, PodNs, PodProcess, result_ip};
use serde_json::json;
use support::zds_peer::Seen;

#[test]
fn labelling_the_namespace_enrols_a_running_pod_found_by_the_proc_scan_and_unlabelling_removes_it()
{
    let node = Node::start_real(Backend::Iptables);
    node.namespace("late", json!({}));
    let uid = node.unique_pod("late", "app");
    let app = PodNs::new("late");
    let ip = result_ip(
        &node
            .add(&app, "late", "app")
            .expect("ADD (not ambient yet)"),
    );
    node.set_running("late", "app", &ip);
    assert!(!node.has_inpod_rules(&app));
    let _process = PodProcess::start(&app, &uid);

    node.namespace("late", json!({"istio.io/dataplane-mode": "ambient"}));
    node.wait_until(Duration::from_secs(10), "annotation enabled", || {
        node.redirection("late", "app").as_deref() == Some("enabled")
    });
    // ztunnel got the pod's own netns (found by the scan, not announced by the plugin).
    let meta = std::fs::metadata(app.guard.path()).expect("stat pod netns");
    assert_eq!(node.peer.netns_of(&uid), Some((meta.dev(), meta.ino())));
    assert!(node.has_inpod_rules(&app), "no in-pod rules");
    assert!(node.probe_members().contains(&(ip.clone(), uid.clone())));

    node.namespace("late", json!({}));
    node.wait_until(Duration::from_secs(10), "annotation removed", || {
        node.redirection("late", "app").is_none()
    });
    assert!(
        node.peer
            .all_requests()
            .iter()
            .any(|(_, r)| *r == Seen::Del { uid: uid.clone() })
    );
    assert!(!node.peer.workloads().contains_key(&uid));
    assert!(!node.has_inpod_rules(&app), "in-pod rules left behind");
    assert!(
        node.probe_members().is_empty(),
        "{:?}",
        node.probe_members()
    );
    assert_eq!(node.peer.violations(), Vec::<String>::new());
}
