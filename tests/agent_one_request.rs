//! One request per ambient ADD (issue 22), end to end: the real install-cni with the agent, the
//! real kube-apiserver (`Node::start_real`; the API requests are the agent's account's in the
//! server's audit log, the plugin's GETs included: it uses the agent's token) and the test ZDS
//! peer, the real CNI chain with CNI_ARGS as containerd sends them (the pod's UID included). An
//! ambient pod's ADD is one `/podadd` to the agent and no API request; a pod the agent says is not
//! ambient takes the sidecar path with no API request either; the `enabled` annotation is written
//! after the ADD's answer and retried when its patch fails (on the test API server: it fails the
//! patch on demand).

#[path = "support/ambient_node.rs"]
mod ambient_node;
mod install_support;
mod support;

use std::time::Duration;

use ambient_node::{Backend, Node, PodNs};
use istio_cni_testing::apiserver::Fault;
use serde_json::json;

const AMBIENT: &str = "istio.io/dataplane-mode";

/// The agent's reads (by name or list; watches left out) since the last `clear_requests`.
fn reads(node: &Node) -> Vec<String> {
    node.cluster()
        .requests()
        .into_iter()
        .filter(|(verb, _)| verb == "get" || verb == "list")
        .map(|(_, uri)| uri)
        .collect()
}

/// The agent's log lines naming the pod `ns/name` (the test's namespace) and containing `what`.
fn agent_lines(node: &Node, what: &str, ns: &str, name: &str) -> usize {
    let pod = format!("pod={}/{name}", node.k8s_ns(ns));
    node.agent
        .lines
        .lock()
        .expect("lines")
        .iter()
        .filter(|l| l.contains(what) && l.contains(&pod))
        .count()
}

#[test]
fn an_ambient_add_is_one_request_to_the_agent_and_none_to_the_api_server() {
    let node = Node::start_real(Backend::Iptables);
    node.namespace("amb", json!({AMBIENT: "ambient"}));
    node.namespace("plain", json!({}));
    let uid = node.pod("amb", "app", json!({}));
    let plain_uid = node.pod("plain", "web", json!({}));
    let (app, web) = (PodNs::new("one"), PodNs::new("onep"));
    // Time for the watch to bring both pods to the agent's store, as it has when the kubelet
    // runs a sandbox (a slower watch is waited for by the agent, up to 100 ms).
    std::thread::sleep(Duration::from_millis(300));

    node.cluster().clear_requests();
    node.add_with_uid(&app, "amb", "app", &uid)
        .expect("ADD of the ambient pod");
    assert!(
        node.peer.workloads().contains_key(&uid),
        "the peer holds the pod"
    );
    assert!(node.has_inpod_rules(&app), "the in-pod rules are in");
    assert_eq!(reads(&node), Vec::<String>::new(), "API reads");
    node.wait_until(Duration::from_secs(10), "the /podadd log line", || {
        agent_lines(&node, "/podadd done", "amb", "app") == 1
    });
    assert_eq!(agent_lines(&node, "/podadd received", "amb", "app"), 1);
    assert_eq!(agent_lines(&node, "/cmdadd received", "amb", "app"), 0);
    node.wait_until(Duration::from_secs(10), "the enabled annotation", || {
        node.redirection("amb", "app").as_deref() == Some("enabled")
    });
    // The audit log does show the agent's requests: its one write for the ADD.
    let status = format!("/api/v1/namespaces/{}/pods/app/status", node.k8s_ns("amb"));
    let requests = node.cluster().requests();
    assert!(
        requests
            .iter()
            .any(|(verb, uri)| verb == "patch" && uri.starts_with(&status)),
        "{requests:#?}"
    );

    // Not ambient: the agent's answer carries the pod; the sidecar path needs no GET.
    node.cluster().clear_requests();
    node.add_with_uid(&web, "plain", "web", &plain_uid)
        .expect("ADD of the plain pod");
    assert_eq!(reads(&node), Vec::<String>::new(), "API reads");
    assert_eq!(agent_lines(&node, "/podadd received", "plain", "web"), 1);
    assert!(!node.peer.workloads().contains_key(&plain_uid));
    assert!(!node.has_inpod_rules(&web), "a plain pod is not programmed");
    assert_eq!(node.redirection("plain", "web"), None);
}

#[test]
fn the_annotation_is_written_after_the_answer_and_retried_when_its_patch_fails() {
    let node = Node::start(Backend::Iptables);
    node.namespace("amb", json!({AMBIENT: "ambient"}));
    let uid = node.pod("amb", "app", json!({}));
    let app = PodNs::new("onea");
    let status = "/api/v1/namespaces/amb/pods/app/status";
    futures::executor::block_on(
        node.api
            .server
            .add_fault(Fault::fail(503).on_path(status).times(3)),
    );
    std::thread::sleep(Duration::from_millis(300));

    node.add_with_uid(&app, "amb", "app", &uid)
        .expect("ADD succeeds while the annotation patch fails");
    assert!(
        node.peer.workloads().contains_key(&uid),
        "the peer holds the pod"
    );
    assert_eq!(
        node.redirection("amb", "app"),
        None,
        "the ADD was answered before its annotation"
    );
    node.wait_until(Duration::from_secs(15), "the enabled annotation", || {
        node.redirection("amb", "app").as_deref() == Some("enabled")
    });
    let patches = node
        .api
        .server
        .requests()
        .iter()
        .filter(|r| r.method == "PATCH" && r.path == status)
        .count();
    assert!(
        patches >= 4,
        "3 failed patches and the one that worked: {patches}"
    );
}

#[test]
fn no_add_of_a_burst_falls_back_to_the_api_server() {
    const PODS: usize = 40;
    let node = Node::start_real(Backend::Iptables);
    node.namespace("amb", json!({AMBIENT: "ambient"}));
    let pods: Vec<(String, String, PodNs)> = (0..PODS)
        .map(|i| {
            let name = format!("b{i}");
            let uid = node.pod("amb", &name, json!({}));
            (name, uid, PodNs::new("oneb"))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    node.cluster().clear_requests();
    // All at once: the agent is as busy as it gets here.
    let failed: Vec<String> = std::thread::scope(|s| {
        let adds: Vec<_> = pods
            .iter()
            .map(|(name, uid, ns)| s.spawn(|| node.add_with_uid(ns, "amb", name, uid).err()))
            .collect();
        adds.into_iter()
            .filter_map(|a| a.join().expect("ADD thread"))
            .collect()
    });
    assert_eq!(failed, Vec::<String>::new(), "failed ADDs");
    assert_eq!(reads(&node), Vec::<String>::new(), "API reads");
    assert_eq!(node.peer.workloads().len(), PODS);
}
