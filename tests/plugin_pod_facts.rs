//! Pod facts (issue 14): the plugin reads its pod from install-cni's node pod store over the
//! root-only socket, and GETs it from the (TLS) API server only when the store cannot answer —
//! no socket, a hung agent, a pod not in the store yet, a store whose watch failed. Driven with
//! the production pieces in this process (the kube pod store watching the test API server, the
//! install-cni socket server) and the real plugin binary in dry-run mode (rules written to a file,
//! no netns needed).

mod cni_driver;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cni_driver::*;
use istio_cni::install::pod_facts;
use istio_cni::kube::stores::{PodStore, spawn_namespace_store, spawn_pod_store};
use istio_cni::kube::{KubeClient, WatchBackoff};
use istio_cni::plugin::k8s::cached_pod;
use istio_cni::sidecar::PodInfo;
use istio_cni_testing::apiserver::{Fault, TestApiServer};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const NODE: &str = "n1";
const PATIENCE: Duration = Duration::from_secs(10);

/// A node: the test API server, this node's pod store and the pod-facts socket in a run dir.
struct Node {
    server: TestApiServer,
    pods: PodStore,
    client: KubeClient,
    stop: CancellationToken,
    dir: tempfile::TempDir,
    rt: tokio::runtime::Runtime,
}

impl Node {
    fn start() -> Node {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let stop = CancellationToken::new();
        let (server, client, pods) = rt.block_on(async {
            let server = TestApiServer::start().await.expect("server");
            let kubeconfig = dir.path().join("istio-cni-kubeconfig");
            server.write_kubeconfig(&kubeconfig).expect("kubeconfig");
            let client = KubeClient::from_kubeconfig_file(&kubeconfig)
                .await
                .expect("client");
            let backoff = WatchBackoff {
                min: Duration::from_millis(20),
                max: Duration::from_millis(100),
            };
            let pods = spawn_pod_store(&client, NODE, backoff, stop.clone());
            pods.wait_synced(PATIENCE).await.expect("synced");
            // The ambient agent's namespace store (for the ambient check's labels).
            let namespaces = spawn_namespace_store(&client, backoff, stop.clone());
            namespaces.wait_synced(PATIENCE).await.expect("synced");
            let path = istio_cni::wire::pod_facts::socket_path(dir.path());
            let serving = istio_cni::telemetry::serve::Serving::default();
            pod_facts::start(
                &path,
                pods.clone(),
                Some(namespaces),
                &serving,
                stop.clone(),
            )
            .expect("socket");
            (server, client, pods)
        });
        Node {
            server,
            pods,
            client,
            stop,
            dir,
            rt,
        }
    }

    /// Adds a pod and waits until the store has it; returns its uid.
    fn add(&self, pod: Value) -> String {
        let pod: Pod = serde_json::from_value(pod).unwrap();
        let stored = self.server.add_pod(pod).expect("add pod");
        let key = format!(
            "{}/{}",
            stored.metadata.namespace.as_deref().unwrap(),
            stored.metadata.name.as_deref().unwrap()
        );
        let rv = stored.metadata.resource_version.clone();
        if stored.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(NODE) {
            self.wait("the store to have the pod", || {
                self.pods
                    .get(&key)
                    .is_some_and(|p| p.metadata.resource_version == rv)
            });
        }
        stored.metadata.uid.unwrap()
    }

    fn wait(&self, what: &str, condition: impl Fn() -> bool) {
        let deadline = Instant::now() + PATIENCE;
        while !condition() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn ask(&self, ns: &str, name: &str, uid: &str, budget: Duration) -> Option<Pod> {
        self.rt
            .block_on(cached_pod(self.dir.path(), ns, name, uid, false, budget))
            .map(|c| c.pod)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn on_node(mut pod: Value, node: &str) -> Value {
    pod["spec"]["nodeName"] = json!(node);
    pod
}

/// A sidecar pod carrying every annotation and proxy env var the plugin reads.
fn everything_pod(name: &str) -> Value {
    let annotations = json!({
        "sidecar.istio.io/inject": "true",
        "sidecar.istio.io/interceptionMode": "REDIRECT",
        "traffic.sidecar.istio.io/includeOutboundIPRanges": "10.0.0.0/8,172.16.0.0/12",
        "traffic.sidecar.istio.io/excludeOutboundIPRanges": "10.96.0.1/32",
        "traffic.sidecar.istio.io/includeInboundPorts": "8080,9090",
        "traffic.sidecar.istio.io/excludeInboundPorts": "9091",
        "traffic.sidecar.istio.io/includeOutboundPorts": "5432",
        "traffic.sidecar.istio.io/excludeOutboundPorts": "6379",
        "traffic.sidecar.istio.io/excludeInterfaces": "eth9",
        "istio.io/reroute-virtual-interfaces": "net1",
        "traffic.sidecar.istio.io/kubevirtInterfaces": "net2"
    });
    let env = json!([
        {"name": "ISTIO_META_DNS_CAPTURE", "value": "true"},
        {"name": "INVALID_DROP", "value": "true"},
        {"name": "DISABLE_ENVOY", "value": "false"},
        {"name": "FROM_FIELD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    ]);
    let mut pod = sidecar_pod(
        "ns1",
        name,
        annotations,
        env,
        json!({"runAsUser": 1337, "runAsGroup": 1338}),
    );
    pod["metadata"]["labels"] = json!({"app": "shop", "istio.io/dataplane-mode": "none"});
    pod["spec"]["containers"][1]["args"] = json!(["proxy", "sidecar"]);
    pod["spec"]["initContainers"] = json!([{"name": "istio-validation", "args": ["x"]}]);
    on_node(pod, NODE)
}

fn cni_args(ns: &str, name: &str, uid: &str) -> String {
    format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name};K8S_POD_INFRA_CONTAINER_ID=c0ffee;K8S_POD_UID={uid}"
    )
}

/// A dry-run sidecar ADD with `run_dir` as the agent's run dir; returns the rules it wrote.
fn dry_add(run_dir: &Path, ns: &str, name: &str, uid: &str, facts_budget: f64) -> (String, Run) {
    let rules = run_dir.join(format!("rules-{name}-{}", unique("r")));
    let conf = json!({
        "cniVersion": "1.0.0", "name": "facts", "type": "istio-cni",
        "cni_agent_run_dir": run_dir.display().to_string(),
        "pod_facts_timeout_seconds": facts_budget,
        "prevResult": {"cniVersion": "1.0.0", "ips": [{"address": "10.29.0.2/24"}], "dns": {}}
    })
    .to_string();
    let mut env = cni_env("ADD", "/var/run/netns/not-opened", ns, name);
    env.retain(|(k, _)| *k != "CNI_ARGS");
    env.push(("CNI_ARGS", cni_args(ns, name, uid)));
    env.push(("DRY_RUN_FILE_PATH", rules.display().to_string()));
    let run = run_plugin(&env, &conf);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let text = std::fs::read_to_string(&rules).unwrap_or_default();
    (text, run)
}

/// A run dir with only the kubeconfig: no agent socket (agent down).
fn agentless_dir(node: &Node) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        node.dir.path().join("istio-cni-kubeconfig"),
        dir.path().join("istio-cni-kubeconfig"),
    )
    .unwrap();
    dir
}

#[test]
fn cached_pods_equal_the_get_and_the_agent_up_means_no_pod_gets() {
    let node = Node::start();
    let mut pods = vec![everything_pod("all")];
    pods.push(on_node(annotated_pod("ns1", "plain", json!({})), NODE));
    // Not injected: skipped on both paths.
    pods.push(on_node(
        json!({"metadata": {"name": "app", "namespace": "ns1"},
               "spec": {"containers": [{"name": "app"}]}}),
        NODE,
    ));
    let down = agentless_dir(&node);
    for pod in pods {
        let name = pod["metadata"]["name"].as_str().unwrap().to_string();
        let uid = node.add(pod);
        let got = node
            .rt
            .block_on(node.client.get_pod("ns1", &name, PATIENCE))
            .expect("GET");
        let cached = node
            .ask("ns1", &name, &uid, Duration::from_secs(2))
            .expect("the store answers");
        assert_eq!(
            PodInfo::from_pod(&cached),
            PodInfo::from_pod(&got),
            "{name}"
        );
        assert_eq!(
            cached.metadata.resource_version,
            got.metadata.resource_version
        );

        let gets = node.server.pod_gets_on_node(NODE);
        let (rules_up, _) = dry_add(node.dir.path(), "ns1", &name, &uid, 2.0);
        assert_eq!(
            node.server.pod_gets_on_node(NODE),
            gets,
            "{name}: GET with the agent up"
        );
        let (rules_down, _) = dry_add(down.path(), "ns1", &name, &uid, 2.0);
        assert_eq!(
            node.server.pod_gets_on_node(NODE),
            gets + 1,
            "{name}: no GET with the agent down"
        );
        assert_eq!(rules_up, rules_down, "{name}");
        assert_eq!(
            rules_up.contains("ISTIO_OUTPUT"),
            name != "app",
            "{name}: {rules_up}"
        );
    }
    let (rules, _) = dry_add(node.dir.path(), "ns1", "all", "", 2.0);
    assert!(rules.contains("ISTIO_OUTPUT"), "{rules}");
    assert!(
        node.server.pod_gets_on_node(NODE) > 0,
        "without K8S_POD_UID the plugin must GET"
    );
}

#[test]
fn pods_the_store_does_not_have_are_read_from_the_api_server() {
    let node = Node::start();
    // Not on this node (the store never sees it): "not yet", then a GET.
    let uid = node.add(on_node(annotated_pod("ns1", "elsewhere", json!({})), "n2"));
    assert_eq!(
        node.ask("ns1", "elsewhere", &uid, Duration::from_secs(2)),
        None
    );
    let (rules, _) = dry_add(node.dir.path(), "ns1", "elsewhere", &uid, 2.0);
    assert!(rules.contains("ISTIO_OUTPUT"), "{rules}");
    assert_eq!(node.server.pod_gets_on_node("n2"), 1);
    // A pod re-created under the same name: the store's copy has another uid.
    let uid = node.add(on_node(annotated_pod("ns1", "again", json!({})), NODE));
    assert!(
        node.ask("ns1", "again", &uid, Duration::from_secs(2))
            .is_some()
    );
    assert_eq!(
        node.ask("ns1", "again", "another-uid", Duration::from_secs(2)),
        None
    );
}

#[test]
fn a_hung_agent_costs_the_budget_then_a_get() {
    let node = Node::start();
    let uid = node.add(on_node(annotated_pod("ns1", "p", json!({})), NODE));
    let hung = tempfile::tempdir().unwrap();
    std::fs::copy(
        node.dir.path().join("istio-cni-kubeconfig"),
        hung.path().join("istio-cni-kubeconfig"),
    )
    .unwrap();
    let path: PathBuf = istio_cni::wire::pod_facts::socket_path(hung.path());
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    // Bound, never accepted: connect and write succeed, no answer ever comes.
    let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let started = Instant::now();
    let none = node.rt.block_on(cached_pod(
        hung.path(),
        "ns1",
        "p",
        &uid,
        false,
        Duration::from_millis(20),
    ));
    assert_eq!(none, None);
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
    let (rules, run) = dry_add(hung.path(), "ns1", "p", &uid, 0.005);
    assert!(rules.contains("ISTIO_OUTPUT"), "{rules}");
    assert_eq!(node.server.pod_gets_on_node(NODE), 1);
    assert!(run.took < Duration::from_secs(5), "{:?}", run.took);
}

#[test]
fn a_store_whose_watch_failed_is_not_used_until_it_has_caught_up() {
    let node = Node::start();
    let uid = node.add(everything_pod("p"));
    assert!(node.ask("ns1", "p", &uid, Duration::from_secs(2)).is_some());
    // The API server goes away: the watch fails, and the pod changes meanwhile.
    node.rt.block_on(node.server.set_fault(Fault::down()));
    node.wait("the watch to fail", || !node.pods.is_live());
    let mut changed = everything_pod("p");
    changed["metadata"]["annotations"]["traffic.sidecar.istio.io/excludeOutboundPorts"] =
        json!("7000");
    let changed: Pod = serde_json::from_value(changed).unwrap();
    let changed = node.server.update_pod(changed).expect("update");
    assert_eq!(
        node.ask("ns1", "p", &uid, Duration::from_secs(2)),
        None,
        "a store that may have missed the update answered"
    );
    // History gone too: the watch must re-list to catch up.
    node.server.compact();
    node.rt.block_on(node.server.clear_faults());
    node.wait("the store to catch up", || {
        node.pods.is_live()
            && node
                .pods
                .get("ns1/p")
                .is_some_and(|p| p.metadata.resource_version == changed.metadata.resource_version)
    });
    let cached = node
        .ask("ns1", "p", &uid, Duration::from_secs(2))
        .expect("answered again");
    assert_eq!(
        PodInfo::from_pod(&cached).annotations["traffic.sidecar.istio.io/excludeOutboundPorts"],
        "7000"
    );
}

/// With ambient on, the enablement check takes the pod and its namespace's labels from the
/// agent's stores: an ambient pod is handed to the agent and a sidecar pod programmed, neither
/// with an API request.
#[test]
fn the_ambient_check_uses_the_agents_stores() {
    let node = Node::start();
    let ns =
        json!({"metadata": {"name": "mesh", "labels": {"istio.io/dataplane-mode": "ambient"}}});
    node.server
        .add_namespace(serde_json::from_value(ns).unwrap())
        .expect("namespace");
    // The agent's plugin-event socket: counts the ambient events it is sent.
    let events = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let sock = node.dir.path().join("pluginevent.sock");
    {
        let _entered = node.rt.enter();
        let listener = tokio::net::UnixListener::bind(&sock).unwrap();
        let seen = events.clone();
        let app = axum::Router::new().route(
            "/cmdadd",
            axum::routing::post(move || {
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async { "" }
            }),
        );
        node.rt
            .spawn(async move { axum::serve(listener, app).await });
    }
    let ambient_uid = node.add(on_node(
        json!({"metadata": {"name": "amb", "namespace": "mesh"},
               "spec": {"containers": [{"name": "app"}]}}),
        NODE,
    ));
    let sidecar_uid = node.add(on_node(annotated_pod("mesh", "side", json!({})), NODE));
    node.wait("the namespace store", || {
        node.rt
            .block_on(istio_cni::plugin::k8s::cached_pod(
                node.dir.path(),
                "mesh",
                "amb",
                &ambient_uid,
                true,
                Duration::from_secs(1),
            ))
            .is_some_and(|c| c.namespace_labels.is_some())
    });
    let conf = || {
        json!({
            "cniVersion": "1.0.0", "name": "facts", "type": "istio-cni",
            "cni_agent_run_dir": node.dir.path().display().to_string(),
            "pod_facts_timeout_seconds": 2.0,
            "ambient_enabled": true,
            "enablement_selectors": enablement_selectors(),
            "prevResult": {"cniVersion": "1.0.0", "ips": [{"address": "10.29.0.2/24"}], "dns": {}}
        })
        .to_string()
    };
    let requests = node.server.requests().len();
    for (name, uid) in [("amb", &ambient_uid), ("side", &sidecar_uid)] {
        let rules = node.dir.path().join(format!("rules-{name}"));
        let mut env = cni_env("ADD", "/var/run/netns/not-opened", "mesh", name);
        env.retain(|(k, _)| *k != "CNI_ARGS");
        env.push(("CNI_ARGS", cni_args("mesh", name, uid)));
        env.push(("DRY_RUN_FILE_PATH", rules.display().to_string()));
        let run = run_plugin(&env, &conf());
        assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
        let text = std::fs::read_to_string(&rules).unwrap_or_default();
        assert_eq!(
            text.contains("ISTIO_OUTPUT"),
            name == "side",
            "{name}: {text}"
        );
    }
    assert_eq!(
        events.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "one ambient event"
    );
    let api: Vec<_> = node.server.requests()[requests..]
        .iter()
        .filter(|r| !r.is_watch())
        .cloned()
        .collect();
    assert!(api.is_empty(), "API requests with the agent up: {api:?}");
}
