//! Repair on the real node: sidecar pods started before the chart is installed get no rules from
//! a plugin that is not there yet, so their `istio-validation` init container (our image's
//! `istio-iptables --run-validation`, as the injector adds it) fails with 126 and kubelet
//! restarts it in a back-off loop. Then the chart comes with repair on, and the agent's repair
//! controller finds them through kubelet's pod status, in each mode.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use crate::cluster::{Cluster, T, ask, pod_ip, serial};

/// A repaired pod waits out kubelet's back-off of its failed init container.
const REPAIR_T: Duration = Duration::from_secs(300);
const BROKEN_LABEL: &str = "cni.istio.io/uninitialized";

/// An injected-style pod template: the validation init container from our image, the app and
/// the "sidecar" (workload listening on the proxy ports).
fn template(image: &str, labels: Value) -> Value {
    let workload = istio_cni_testing::node::WORKLOAD_IMAGE;
    json!({
        "metadata": {"labels": labels,
            "annotations": {"sidecar.istio.io/status": crate::SIDECAR_STATUS}},
        "spec": {
            "initContainers": [{"name": "istio-validation", "image": image,
                "imagePullPolicy": "Never", "command": ["istio-iptables"],
                // As the injector runs it: the rules redirect the proxy's own loopback traffic
                // only, which is what the validation connection pretends to be.
                "securityContext": {"runAsUser": 1337, "runAsGroup": 1337},
                "args": ["-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT",
                    "-i", "*", "-x", "", "-b", "*", "-d", "15090,15021,15020",
                    "--run-validation", "--skip-rule-apply"]}],
            "containers": [
                {"name": "app", "image": workload, "imagePullPolicy": "Never",
                    "args": ["-tcp", "8080", "-name", "app"]},
                {"name": "istio-proxy", "image": workload, "imagePullPolicy": "Never",
                    "args": ["-tcp", "15001,15006", "-name", "istio-proxy"]}],
            "terminationGracePeriodSeconds": 2,
            "automountServiceAccountToken": false}})
}

/// The validation container's last exit code, if it has exited.
fn validation_exit(pod: &Pod) -> Option<i32> {
    let s = pod.status.as_ref()?.init_container_statuses.as_ref()?;
    let v = s.iter().find(|c| c.name == "istio-validation")?;
    let terminated = |st: &Option<k8s_openapi::api::core::v1::ContainerState>| {
        st.as_ref()?.terminated.as_ref().map(|t| t.exit_code)
    };
    terminated(&v.state).or_else(|| terminated(&v.last_state))
}

/// Pods of `ns` whose validation failed with 126 (the plugin was not there when they started).
fn wait_broken(c: &Cluster, ns: &str, n: usize) -> Vec<Pod> {
    let deadline = Instant::now() + T;
    loop {
        let broken: Vec<Pod> = c
            .pods(ns)
            .into_iter()
            .filter(|p| validation_exit(p) == Some(126))
            .collect();
        if broken.len() >= n {
            return broken;
        }
        assert!(
            Instant::now() < deadline,
            "{n} pods with a failed validation within {T:?}: {:?}",
            c.pods(ns)
                .iter()
                .map(|p| (p.metadata.name.clone(), p.status.clone()))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Starts the node, creates the pods before the chart, waits for their validation to fail,
/// installs the chart with `repair` as its repair values; returns the broken pods.
fn broken_then_installed(c: &Cluster, ns: &str, repair: Value, replicaset: bool) -> Vec<Pod> {
    c.create_namespace(ns, &[]);
    if replicaset {
        let mut tpl = template(&c.image, json!({"app": "repaired"}));
        tpl["metadata"]["name"] = json!(null);
        c.cp.create(&json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": "repaired", "namespace": ns},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "repaired"}},
                     "template": tpl}}));
    } else {
        let mut pod = template(&c.image, json!({"app": "repaired"}));
        pod["apiVersion"] = json!("v1");
        pod["kind"] = json!("Pod");
        pod["metadata"]["name"] = json!("repaired");
        pod["metadata"]["namespace"] = json!(ns);
        c.create_pod(pod);
    }
    let broken = wait_broken(c, ns, 1);
    assert!(
        c.conflist_types() == ["bridge"],
        "no plugin yet: {:?}",
        c.conflist_types()
    );
    c.install_chart(json!({"repair": repair}));
    c.wait_agent_ready();
    broken
}

/// The pod runs with its rules: inbound to the app's port lands on the sidecar's 15006.
fn assert_captured(pod: &Pod) {
    let ip = pod_ip(pod);
    let answer = ask(&format!("{ip}:8080")).expect("inbound answer");
    assert!(
        answer.starts_with("name=istio-proxy ") && answer.contains(":15006 "),
        "inbound to {ip}:8080 not redirected: {answer}"
    );
}

#[test]
fn repair_in_place_on_a_real_node_programs_a_pod_that_started_before_the_agent() {
    crate::support::require_root();
    let _one = serial();
    let c = Cluster::start();
    let ns = "repair-inplace";
    let broken = broken_then_installed(&c, ns, json!({"repairPods": true}), false);
    let uid = broken[0].metadata.uid.clone();
    // The same pod (nothing deleted) turns ready: its validation passes on kubelet's next try,
    // against the rules the agent programmed from the node.
    let pod = c
        .node
        .wait_pod_ready(&c.cp, ns, "repaired", REPAIR_T)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(pod.metadata.uid, uid, "repaired in place, not recreated");
    assert_captured(&pod);
}

#[test]
fn repair_by_deleting_on_a_real_node_replaces_a_pod_that_started_before_the_agent() {
    crate::support::require_root();
    let _one = serial();
    let c = Cluster::start();
    let ns = "repair-delete";
    let broken = broken_then_installed(
        &c,
        ns,
        json!({"repairPods": false, "deletePods": true}),
        true,
    );
    let old = broken[0].metadata.uid.clone();
    // The broken pod is deleted; its ReplicaSet's new pod gets the plugin at sandbox creation.
    let deadline = Instant::now() + REPAIR_T;
    let pod = loop {
        let ready = c.pods(ns).into_iter().find(|p| {
            p.metadata.uid != old
                && p.metadata.deletion_timestamp.is_none()
                && p.status.as_ref().is_some_and(|s| {
                    s.container_statuses
                        .as_ref()
                        .is_some_and(|cs| !cs.is_empty() && cs.iter().all(|c| c.ready))
                })
        });
        let old_gone = c.pods(ns).iter().all(|p| p.metadata.uid != old);
        if let Some(p) = ready.filter(|_| old_gone) {
            break p;
        }
        assert!(
            Instant::now() < deadline,
            "the broken pod not replaced by a ready one within {REPAIR_T:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(validation_exit(&pod), Some(0), "the new pod validated");
    assert_captured(&pod);
}

#[test]
fn repair_by_labelling_on_a_real_node_marks_a_pod_that_started_before_the_agent() {
    crate::support::require_root();
    let _one = serial();
    let c = Cluster::start();
    let ns = "repair-label";
    broken_then_installed(
        &c,
        ns,
        json!({"repairPods": false, "labelPods": true}),
        false,
    );
    c.node
        .wait_pod(&c.cp, ns, "repaired", "labelled broken", REPAIR_T, |p| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(BROKEN_LABEL))
                .is_some_and(|v| v == "true")
        })
        .unwrap_or_else(|e| panic!("{e}"));
}
