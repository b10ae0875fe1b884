//! The product's pod watch against the real kube-apiserver speaks Kubernetes' protobuf encoding
//! (gzipped), and the pod it stores from a protobuf event is the very object it would store from
//! the same pod read as JSON: pods setting every field the store keeps, and many it does not,
//! are created and given a status, then each one fetched as JSON and trimmed is compared with
//! the pod store's copy. A refused protobuf watch still reads as the 403 it is.

use std::path::Path;
use std::time::{Duration, Instant};

use istio_cni::kube::stores::{Stored, pod_key, spawn_pod_store};
use istio_cni::kube::{Call, KubeClient, KubeError, Selectors, WatchBackoff, pod_watch_encodings};
use istio_cni_testing::controlplane::{self, ControlPlane, Forwarder, unique_name};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

// The differential tests' seeded generator; this test uses part of it.
#[allow(dead_code)]
#[path = "differential/rng.rs"]
mod rng;
use rng::Rng;

const PODS: usize = 12;
const PATIENCE: Duration = Duration::from_secs(60);

/// A container: the kept fields (name, args, env name and literal value, run-as user/group)
/// drawn present or absent, beside fields the store drops.
fn container(d: &mut Rng, name: &str) -> Value {
    let mut c = json!({
        "name": name, "image": "registry.local/app:1", "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/app"], "workingDir": "/w",
        "ports": [{"containerPort": 8080 + d.next() % 100, "protocol": "TCP", "name": "http"}],
        "resources": {"limits": {"cpu": "100m", "memory": "64Mi"}},
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 5},
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    });
    if d.chance(70) {
        c["args"] = json!(["proxy", d.word(&["sidecar", "router"]), "--x"]);
    }
    if d.chance(80) {
        c["env"] = json!([
            {"name": "LITERAL", "value": format!("v{}", d.next())},
            {"name": "EMPTY", "value": ""},
            {"name": "FROM", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ]);
    }
    let mut sc = json!({"allowPrivilegeEscalation": d.chance(30), "readOnlyRootFilesystem": true});
    if d.chance(60) {
        sc["runAsUser"] = json!(1337);
    }
    if d.chance(60) {
        sc["runAsGroup"] = json!(d.next() % 2000);
    }
    if d.chance(80) {
        c["securityContext"] = sc;
    }
    c
}

fn pod_manifest(d: &mut Rng, ns: &str, name: &str, node: &str) -> Value {
    let mut labels = json!({"app": name, "version": "v1", "empty": ""});
    if d.chance(30) {
        labels = json!({});
    }
    let mut spec = json!({
        "nodeName": node,
        "containers": [container(d, "istio-proxy"), container(d, "app")],
        "volumes": [{"name": "data", "emptyDir": {}}],
        "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}],
        "dnsPolicy": "ClusterFirst", "terminationGracePeriodSeconds": 5,
        "nodeSelector": {"kubernetes.io/os": "linux"},
    });
    if d.chance(60) {
        let mut init = container(d, "istio-validation");
        init.as_object_mut().unwrap().remove("readinessProbe");
        spec["initContainers"] = json!([init]);
    }
    if d.chance(30) {
        spec["hostNetwork"] = json!(true);
        spec["containers"][0]["ports"] = json!([]);
        spec["containers"][1]["ports"] = json!([]);
    }
    if d.chance(50) {
        spec["restartPolicy"] = json!(d.word(&["Never", "OnFailure", "Always"]));
    }
    if d.chance(50) {
        spec["serviceAccountName"] = json!("default");
    }
    if d.chance(50) {
        spec["schedulerName"] = json!("other-scheduler");
    }
    let mut metadata = json!({
        "name": name, "namespace": ns, "labels": labels,
        "annotations": {"sidecar.istio.io/status": "{\"x\":1}", "note": "n".repeat(200)},
        "finalizers": ["example.com/keep"],
    });
    if d.chance(60) {
        metadata["ownerReferences"] = json!([
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "0a0b", "controller": d.chance(50)},
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "0c0d"},
        ]);
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
}

fn terminated(d: &mut Rng) -> Value {
    let exit_code = [0, 1, 126][d.next() as usize % 3];
    json!({"terminated": {
        "exitCode": exit_code,
        "signal": 9, "reason": d.word(&["Error", "Completed"]),
        "message": if d.chance(50) { "no redirect\n" } else { "" },
        "startedAt": "2026-12-07T10:00:00Z", "finishedAt": "2026-12-07T10:00:01Z",
        "containerID": "containerd://abc"}})
}

fn state(d: &mut Rng) -> Value {
    match d.next() % 3 {
        0 => json!({"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}}),
        1 => json!({"running": {"startedAt": "2026-12-07T10:00:02Z"}}),
        _ => terminated(d),
    }
}

fn status(d: &mut Rng, i: usize, init: bool) -> Value {
    let v4 = format!("10.7.{}.{}", i / 250, i % 250 + 1);
    let mut status = json!({
        "phase": d.word(&["Pending", "Running", "Succeeded", "Failed"]),
        "hostIP": "192.0.2.1", "hostIPs": [{"ip": "192.0.2.1"}],
        "startTime": "2026-12-07T10:00:00Z",
        "conditions": [{"type": "Ready", "status": "False", "reason": "ContainersNotReady",
                        "lastTransitionTime": "2026-12-07T10:00:00Z"}],
        "containerStatuses": [{"name": "app", "ready": false, "restartCount": 3,
            "image": "registry.local/app:1", "imageID": "sha256:1", "state": state(d),
            "lastState": terminated(d)}],
    });
    if d.chance(80) {
        status["podIP"] = json!(v4);
        status["podIPs"] = if d.chance(50) {
            json!([{"ip": v4}, {"ip": format!("fd00::7:{}", i + 1)}])
        } else {
            json!([{"ip": v4}])
        };
    }
    // No nominatedNodeName: the server refuses it on a pod bound to a node (the unit tests
    // decode it).
    if init {
        let mut st = json!({"name": "istio-validation", "ready": false, "restartCount": 2,
            "image": "registry.local/proxy:1", "imageID": "sha256:2", "state": state(d)});
        if d.chance(70) {
            st["lastState"] = terminated(d);
        }
        status["initContainerStatuses"] = json!([st]);
    }
    status
}

/// A client of `cp` whose traffic goes through a byte-counting relay.
fn client_via_relay(cp: &ControlPlane, rt: &tokio::runtime::Runtime) -> (KubeClient, Forwarder) {
    let relay = Forwarder::start_at(Path::new("/proc/self/ns/net"), cp.port(), 0).expect("relay");
    let config = rt.block_on(cp.admin_config_via(relay.port()));
    let _in_runtime = rt.enter();
    (KubeClient::from_config(config).expect("client"), relay)
}

#[test]
fn a_pod_stored_from_the_protobuf_watch_equals_the_same_pod_read_as_json_and_trimmed() {
    let cp = controlplane::shared();
    let node = unique_name("pb-node");
    let ns = unique_name("pb");
    cp.create_namespace(&ns, &[]);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (client, relay) = client_via_relay(cp, &rt);
    let before = pod_watch_encodings();
    let shutdown = CancellationToken::new();
    let backoff = WatchBackoff {
        min: Duration::from_millis(100),
        max: Duration::from_secs(1),
    };
    let store = {
        let _in_runtime = rt.enter();
        spawn_pod_store(&client, &node, backoff, shutdown.clone())
    };
    rt.block_on(store.wait_synced(PATIENCE)).expect("synced");
    let on_wire_before = relay.bytes_received();

    let mut draw = Rng::new(0x5eed_0001);
    let mut json_bytes = 0;
    let mut names = Vec::new();
    for i in 0..PODS {
        let name = format!("p{i}");
        let manifest = pod_manifest(&mut draw, &ns, &name, &node);
        let init = manifest["spec"]["initContainers"].is_array();
        let pod: Pod = serde_json::from_value(manifest).expect("pod");
        cp.create_pod(&pod);
        let stored = cp.set_pod_status(&ns, &name, status(&mut draw, i, init));
        json_bytes += serde_json::to_vec(&stored).expect("json").len();
        names.push(name);
    }

    // The store holds each pod at the resourceVersion a GET now returns.
    let deadline = Instant::now() + PATIENCE;
    let mut pending: Vec<(String, Pod, Option<std::sync::Arc<Pod>>)> = Vec::new();
    loop {
        pending.clear();
        for name in &names {
            let json = cp.pod(&ns, name).expect("pod exists");
            let held = store.get(&pod_key(&ns, name));
            let same_version = held.as_ref().map(|p| &p.metadata.resource_version)
                == Some(&json.metadata.resource_version);
            if !same_version {
                pending.push((name.clone(), json, held));
            } else {
                let held = held.expect("held");
                let trimmed = json.trim();
                assert_eq!(
                    *held,
                    trimmed,
                    "pod {name}: stored from the watch {} vs trimmed JSON {}",
                    serde_json::to_string(&*held).unwrap(),
                    serde_json::to_string(&trimmed).unwrap()
                );
            }
        }
        if pending.is_empty() || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    shutdown.cancel();
    assert!(
        pending.is_empty(),
        "pods never stored at their version: {pending:?}"
    );
    assert_covers_the_kept_fields(&store.list());

    // Every pod watch response came protobuf and gzipped; none as JSON.
    let after = pod_watch_encodings();
    assert!(
        after.protobuf_gzipped > before.protobuf_gzipped,
        "{before:?} -> {after:?}"
    );
    assert_eq!(
        (after.protobuf_plain, after.not_protobuf),
        (before.protobuf_plain, before.not_protobuf),
        "{before:?} -> {after:?}"
    );
    // And small on the wire: two events per pod (create, status), a fraction of their JSON.
    let on_wire = relay.bytes_received() - on_wire_before;
    assert!(
        (on_wire as usize) < json_bytes,
        "{on_wire} bytes on the wire for {PODS} pods of {json_bytes} bytes of JSON"
    );
}

/// The drawn pods set each kept field somewhere (and leave the optional ones out elsewhere).
fn assert_covers_the_kept_fields(pods: &[std::sync::Arc<Pod>]) {
    let any = |what: &str, f: &dyn Fn(&Pod) -> bool| {
        assert!(pods.iter().any(|p| f(p)), "no drawn pod has {what}");
    };
    let spec = |p: &Pod| p.spec.clone().unwrap_or_default();
    let status = |p: &Pod| p.status.clone().unwrap_or_default();
    let containers = |p: &Pod| {
        let s = spec(p);
        s.containers
            .into_iter()
            .chain(s.init_containers.unwrap_or_default())
            .collect::<Vec<_>>()
    };
    any("hostNetwork", &|p| spec(p).host_network == Some(true));
    any("no hostNetwork", &|p| spec(p).host_network.is_none());
    any("restartPolicy", &|p| spec(p).restart_policy.is_some());
    any("schedulerName", &|p| spec(p).scheduler_name.is_some());
    any("serviceAccountName", &|p| {
        spec(p).service_account_name.is_some()
    });
    any("labels", &|p| p.metadata.labels.is_some());
    any("no labels", &|p| p.metadata.labels.is_none());
    any("a controller owner", &|p| {
        let owners = p.metadata.owner_references.clone().unwrap_or_default();
        owners.iter().any(|o| o.controller == Some(true))
    });
    any("args", &|p| containers(p).iter().any(|c| c.args.is_some()));
    any("an env value", &|p| {
        containers(p)
            .iter()
            .flat_map(|c| c.env.clone().unwrap_or_default())
            .any(|e| e.value.is_some())
    });
    any("runAsUser and runAsGroup", &|p| {
        containers(p).iter().any(|c| {
            c.security_context
                .as_ref()
                .is_some_and(|sc| sc.run_as_user.is_some() && sc.run_as_group.is_some())
        })
    });
    any("two pod IPs", &|p| {
        status(p).pod_ips.is_some_and(|ips| ips.len() == 2)
    });
    any("no pod IP", &|p| status(p).pod_ip.is_none());
    any("an init container's last termination", &|p| {
        let sts = status(p).init_container_statuses.unwrap_or_default();
        sts.iter().any(|s| {
            s.last_state
                .as_ref()
                .and_then(|l| l.terminated.as_ref())
                .is_some_and(|t| t.message.is_some() && t.reason.is_some())
        })
    });
}

#[test]
fn a_refused_protobuf_pod_watch_reads_as_forbidden() {
    let cp = controlplane::shared();
    let ns = unique_name("pb-denied");
    cp.create_namespace(&ns, &[]);
    // The namespace's default ServiceAccount: no role grants it pods.
    let token = cp.token(&ns, "default", Duration::from_secs(600));
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    cp.write_kubeconfig(&kubeconfig, &token);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let before = pod_watch_encodings();
    let err = rt.block_on(async {
        let client = KubeClient::from_kubeconfig_file(&kubeconfig)
            .await
            .expect("client");
        client
            .watch_allowed::<Pod>(Call::WatchPods, &Selectors::on_node("any"))
            .await
            .expect_err("no RBAC for pods")
    });
    assert!(matches!(err, KubeError::Forbidden(_)), "{err:?}");
    assert!(err.to_string().contains("forbidden"), "{err}");
    // A refusal is no watch response.
    assert_eq!(pod_watch_encodings().not_protobuf, before.not_protobuf);
}
