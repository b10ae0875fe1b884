//! The ambient agent in-process against the real kube-apiserver (`support/real_cluster.rs`:
//! each test's namespaces and node apart by a suffix, the agent's requests read from the
//! server's audit log), with the fake data plane and ztunnel (`agent::testing`): enrolment
//! through `/cmdadd`, by labelling a namespace, removal by unlabelling, the node-scoped pod
//! store, and `/cmdadd` refusals that change nothing.

#[path = "support/real_cluster.rs"]
mod real_cluster;
#[path = "install_support.rs"]
mod support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use istio_cni::agent::pod::ANN_REDIRECTION;
use istio_cni::agent::ports::KubeAnnotator;
use istio_cni::agent::settings::{AgentConfig, AgentTiming, Settings};
use istio_cni::agent::testing::{FakeDataplane, FakeZtunnel};
use istio_cni::agent::{Agent, Deps};
use istio_cni::kube::KubeClient;
use istio_cni::wire::event::{EventIp, EventIpNet, PluginAddEvent};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use real_cluster::RealCluster;
use serde_json::json;
use tokio_util::sync::CancellationToken;

const NODE: &str = "node-1";
const T: Duration = Duration::from_secs(10);

struct Rig {
    api: RealCluster,
    agent: Option<Agent>,
    dp: Arc<FakeDataplane>,
    zt: Arc<FakeZtunnel>,
    socket: PathBuf,
    _dir: tempfile::TempDir,
    stop: CancellationToken,
}

fn namespace(name: &str, ambient: bool) -> Namespace {
    let labels = if ambient {
        json!({"istio.io/dataplane-mode": "ambient"})
    } else {
        json!({"team": "a"})
    };
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
}

fn pod(ns: &str, name: &str, node: &str, ip: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {"nodeName": node, "serviceAccountName": "sa", "containers": [{"name": "app", "image": "x"}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}
    }))
    .unwrap()
}

fn settings(run_dir: PathBuf) -> Settings {
    Settings {
        config: AgentConfig {
            ztunnel_uds_address: run_dir.join("ztunnel.sock"),
            dns_capture: false,
            ipv6: false,
            reconcile_pod_rules_on_startup: false,
            system_namespace: "istio-system".into(),
            pod_name: String::new(),
            node_name: NODE.into(),
            host_probe_snat_ip: "169.254.7.127".parse().unwrap(),
            host_probe_snat_ipv6: "fd16:9254:7127:1337:ffff:ffff:ffff:ffff".parse().unwrap(),
            scoped_xtables_locking: true,
            aws_branch_eni_probe: false,
            force_iptables_binary: None,
            allow_switch_to_host_ns: false,
        },
        run_dir,
        exclude_namespaces: vec!["kube-system".into()],
        enablement_selectors: serde_json::from_value(json!([
            {"podSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}}},
            {"podSelector": {"matchExpressions": [{"key": "istio.io/dataplane-mode", "operator": "NotIn", "values": ["none"]}]},
             "namespaceSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}}}
        ]))
        .unwrap(),
        native_nftables: false,
        host_proc_dir: "/proc".into(),
        pod_namespace: "istio-system".into(),
        timing: AgentTiming {
            sync_timeout: T,
            ..AgentTiming::default()
        },
        drift: None,
    }
}

/// Starts the server with `setup` applied first, then the agent.
async fn rig(setup: impl FnOnce(&RealCluster)) -> Rig {
    rig_with(setup, false).await
}

async fn rig_with(setup: impl FnOnce(&RealCluster), reconcile: bool) -> Rig {
    let api = RealCluster::start();
    setup(&api);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let client = KubeClient::from_kubeconfig_file(&kubeconfig).await.unwrap();
    let dp = Arc::new(FakeDataplane::default());
    let zt = Arc::new(FakeZtunnel::default());
    let mut s = settings(dir.path().join("run"));
    s.config.reconcile_pod_rules_on_startup = reconcile;
    s.config.node_name = api.node(NODE);
    let deps = Deps {
        dataplane: dp.clone(),
        ztunnel: zt.clone(),
        annotator: Arc::new(KubeAnnotator {
            client: client.clone(),
            timeout: Duration::from_secs(5),
        }),
        metrics: Default::default(),
        serving: Default::default(),
    };
    let stop = CancellationToken::new();
    let pods = istio_cni::kube::stores::spawn_pod_store(
        &client,
        &s.config.node_name,
        istio_cni::kube::WatchBackoff::default(),
        stop.clone(),
    );
    let agent = Agent::start(&s, &client, pods, deps, &stop).await.unwrap();
    Rig {
        api,
        agent: Some(agent),
        dp,
        zt,
        socket: s.plugin_event_socket(),
        _dir: dir,
        stop,
    }
}

impl Rig {
    fn annotation(&self, ns: &str, name: &str) -> Option<String> {
        self.api
            .pod(ns, name)?
            .metadata
            .annotations?
            .get(ANN_REDIRECTION)
            .cloned()
    }

    fn uid(&self, ns: &str, name: &str) -> String {
        self.api.pod(ns, name).unwrap().metadata.uid.unwrap()
    }

    async fn post(&self, body: String) -> (u16, String) {
        let sock = self.socket.clone();
        tokio::task::spawn_blocking(move || support::uds_post(&sock, "/cmdadd", &body))
            .await
            .unwrap()
            .expect("no answer from the plugin-event socket")
    }

    /// Polls `f` (the conditions are on the agent's side, which the server's own wait cannot see).
    async fn wait(&self, what: &str, f: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + T;
        while !f() {
            assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn shutdown(mut self) {
        if let Some(agent) = self.agent.take() {
            agent.stop(Duration::from_secs(5)).await;
        }
        self.stop.cancel();
        assert!(!self.socket.exists(), "socket removed on stop");
    }
}

fn event(ns: &str, name: &str, ip: &str) -> String {
    let ev = PluginAddEvent {
        netns: "/var/run/netns/cni-test".into(),
        pod_name: name.into(),
        pod_namespace: ns.into(),
        ips: vec![EventIp {
            interface: Some(2),
            address: EventIpNet::from_cidr(&format!("{ip}/24")).unwrap(),
            gateway: None,
        }],
    };
    String::from_utf8(ev.to_json()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cmdadd_enrols_a_pod_of_an_ambient_namespace_and_answers_after_the_annotation() {
    let r = rig(|api| {
        api.add_namespace(namespace("shop", true)).unwrap();
    })
    .await;
    // Created after the start, as the runtime runs the plugin for a new pod (pods already there
    // when the agent starts are enrolled through their namespace, not through /cmdadd).
    r.api.add_pod(pod("shop", "web", NODE, "10.1.0.5")).unwrap();
    // The plugin may be faster than the watch; the agent retries its store for 100 ms (as
    // Istio), which a loaded test machine can exceed, so wait for the store here.
    let core = r.agent.as_ref().unwrap().core().clone();
    r.wait("pod in the store", || core.pods.len() == 1).await;
    let (status, body) = r.post(event(&r.api.ns("shop"), "web", "10.1.0.5")).await;
    assert_eq!(status, 200, "{body}");
    // 200 only once everything is done: no waiting needed for any of these.
    assert_eq!(r.annotation("shop", "web").as_deref(), Some("enabled"));
    let uid = r.uid("shop", "web");
    assert!(r.zt.has(&uid));
    assert!(
        r.dp.calls()
            .contains(&"open /var/run/netns/cni-test".to_string())
    );
    // Programmed once by /cmdadd in the netns it named. On a loaded machine the watch's own
    // reconcile of the new pod (netns found by its scan, as Istio's informer does) can come
    // first; that is the only other programming allowed.
    let calls = r.dp.calls();
    let program = format!("program {uid}");
    let after_open = calls
        .iter()
        .skip_while(|c| *c != "open /var/run/netns/cni-test")
        .filter(|c| **c == program)
        .count();
    let found_by_watch = calls
        .iter()
        .any(|c| c.starts_with("find ") && c.contains(&uid));
    assert_eq!(after_open, 1, "{calls:?}");
    assert_eq!(
        r.dp.count(&program),
        1 + usize::from(found_by_watch),
        "{calls:?}"
    );
    assert_eq!(
        r.dp.probes.lock().get(&"10.1.0.5".parse().unwrap()),
        Some(&uid)
    );
    let patches: Vec<_> = r
        .api
        .requests()
        .into_iter()
        .filter(|(verb, _)| verb == "patch")
        .collect();
    let status = format!("/api/v1/namespaces/{}/pods/web/status", r.api.ns("shop"));
    assert!(!patches.is_empty(), "a patch");
    let path = patches[0].1.split('?').next().unwrap_or_default();
    assert_eq!(path, status, "{patches:?}");
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labelling_a_namespace_enrols_its_running_pod_and_unlabelling_removes_it() {
    let r = rig(|api| {
        api.add_namespace(namespace("shop", false)).unwrap();
        api.add_pod(pod("shop", "web", NODE, "10.1.0.6")).unwrap();
    })
    .await;
    let uid = r.uid("shop", "web");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(r.annotation("shop", "web"), None, "not selected yet");

    r.api.add_namespace(namespace("shop", true)).unwrap();
    r.wait("enabled", || {
        r.annotation("shop", "web").as_deref() == Some("enabled")
    })
    .await;
    assert!(r.zt.has(&uid));
    assert!(
        r.dp.calls().iter().any(|c| c.starts_with("find ")),
        "netns found by the /proc scan"
    );

    r.api.add_namespace(namespace("shop", false)).unwrap();
    r.wait("annotation cleared", || {
        r.annotation("shop", "web").is_none()
    })
    .await;
    assert!(!r.zt.has(&uid));
    assert_eq!(r.dp.count(&format!("unprogram {uid}")), 1);
    assert!(r.dp.probes.lock().is_empty());
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_of_other_nodes_never_reach_the_store() {
    let r = rig(|api| {
        api.add_namespace(namespace("shop", true)).unwrap();
        for i in 0..40 {
            api.add_pod(pod("shop", &format!("far-{i}"), "node-2", "10.2.0.1"))
                .unwrap();
        }
        api.add_pod(pod("shop", "near", NODE, "10.1.0.7")).unwrap();
    })
    .await;
    // Churn on the other node after the start, too.
    for i in 0..20 {
        r.api
            .add_pod(pod("shop", &format!("later-{i}"), "node-2", "10.2.0.2"))
            .unwrap();
    }
    r.api
        .add_pod(pod("shop", "near-2", NODE, "10.1.0.8"))
        .unwrap();
    let core = r.agent.as_ref().unwrap().core().clone();
    r.wait("second pod of this node seen", || core.pods.len() == 2)
        .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut keys: Vec<String> = core
        .pods
        .list()
        .iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    keys.sort();
    assert_eq!(keys, ["near", "near-2"]);
    // Every pod list and watch asked the server for this node's pods only.
    let selector = format!("fieldSelector=spec.nodeName%3D{}", r.api.node(NODE));
    let pod_requests: Vec<_> = r
        .api
        .requests()
        .into_iter()
        .filter(|(verb, uri)| {
            matches!(verb.as_str(), "list" | "watch") && uri.starts_with("/api/v1/pods?")
        })
        .collect();
    assert!(!pod_requests.is_empty());
    for (verb, uri) in pod_requests {
        assert!(uri.contains(&selector), "{verb} {uri}");
    }
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_cmdadds_change_nothing() {
    let r = rig(|api| {
        api.add_namespace(namespace("shop", true)).unwrap();
        api.add_namespace(namespace("plain", false)).unwrap();
    })
    .await;
    // Not running yet (no IP): the namespace's replayed add, which may come after the pod is in
    // the store, must not enrol it through the watch meanwhile.
    let mut web = pod("shop", "web", NODE, "10.1.0.9");
    web.status = None;
    r.api.add_pod(web).unwrap();
    r.api
        .add_pod(pod("plain", "other", NODE, "10.1.0.10"))
        .unwrap();
    let core = r.agent.as_ref().unwrap().core().clone();
    r.wait("pods in the store", || core.pods.len() == 2).await;
    r.api.clear_requests();
    let startup_calls = r.dp.calls();
    assert_eq!(startup_calls, ["probe_sync 0 prune=true"]);

    let mut bad: serde_json::Value =
        serde_json::from_str(&event(&r.api.ns("shop"), "web", "10.1.0.9")).unwrap();
    bad["IPs"][0]["Address"]["IP"] = json!("not-an-ip");
    let (status, body) = r.post(bad.to_string()).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("IPs[0].Address.IP"), "{body}");
    let (status, body) = r
        .post(json!({"PodNamespace": r.api.ns("shop")}).to_string())
        .await;
    assert_eq!((status, body.contains("PodName")), (400, true), "{body}");

    let (status, body) = r.post(event(&r.api.ns("shop"), "ghost", "10.1.0.11")).await;
    assert_eq!(status, 500);
    let ghost = format!("failed to get pod {}/ghost", r.api.ns("shop"));
    assert!(body.contains(&ghost), "{body}");

    let (status, body) = r
        .post(event(&r.api.ns("plain"), "other", "10.1.0.10"))
        .await;
    assert_eq!(status, 500);
    assert!(
        body.contains("not eligible for ambient enrollment"),
        "{body}"
    );

    assert_eq!(r.dp.calls(), startup_calls, "no data-plane work");
    assert_eq!(r.zt.adds.load(std::sync::atomic::Ordering::SeqCst), 0);
    let requests = r.api.requests();
    assert!(
        requests
            .iter()
            .all(|(verb, _)| matches!(verb.as_str(), "get" | "list" | "watch")),
        "no writes: {requests:?}"
    );
    assert_eq!(r.annotation("shop", "web"), None);
    let core = r.agent.as_ref().unwrap().core().clone();
    let count = |code: &str| {
        core.metrics
            .plugin_requests
            .get_or_create(&istio_cni::telemetry::metrics::ResponseCodeLabel {
                response_code: code.into(),
            })
            .get()
    };
    assert_eq!((count("400"), count("500"), count("200")), (2, 2, 0));
    r.shutdown().await;
}

fn enrolled(ns: &str, name: &str, ip: &str) -> Pod {
    let mut p = pod(ns, name, NODE, ip);
    p.metadata.annotations = Some([(ANN_REDIRECTION.to_string(), "enabled".to_string())].into());
    p
}

/// A restart with enrolled pods: they are ztunnel's state of the world again (cache with their
/// netns from one /proc scan), the probe set is synced to them (not flushed), and only with
/// AMBIENT_RECONCILE_POD_RULES_ON_STARTUP are their in-pod rules re-applied. Pending, terminal
/// and ztunnel pods are not in the snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_restores_enrolled_pods_without_flushing() {
    for reconcile in [false, true] {
        let r = rig_with(
            |api| {
                api.add_namespace(namespace("shop", true)).unwrap();
                for i in 0..20 {
                    api.add_pod(enrolled(
                        "shop",
                        &format!("web-{i}"),
                        &format!("10.1.1.{i}"),
                    ))
                    .unwrap();
                }
                let mut pending = enrolled("shop", "half", "10.1.2.1");
                pending.metadata.annotations =
                    Some([(ANN_REDIRECTION.to_string(), "pending".to_string())].into());
                api.add_pod(pending).unwrap();
                let mut done = enrolled("shop", "job", "10.1.2.2");
                done.status.as_mut().unwrap().phase = Some("Succeeded".into());
                api.add_pod(done).unwrap();
            },
            reconcile,
        )
        .await;
        let agent = r.agent.as_ref().unwrap();
        let snapshot = agent.core().mesh.cache.snapshot();
        assert!(snapshot.len() >= 20, "{}", snapshot.len());
        let web: Vec<_> = snapshot
            .iter()
            .filter(|(_, c)| c.info.name.starts_with("web-"))
            .collect();
        assert_eq!(web.len(), 20);
        assert!(web.iter().all(|(_, c)| c.netns.is_some()), "netns attached");
        let calls = r.dp.calls();
        // The startup /proc scan only reads; the first change the restart makes is the probe
        // set's sync (no flush, nothing programmed before it).
        let first_change = calls.iter().find(|c| !c.starts_with("find "));
        assert_eq!(
            first_change.map(String::as_str),
            Some("probe_sync 20 prune=true"),
            "{calls:?}"
        );
        assert!(calls.iter().all(|c| !c.contains("flush")));
        // (The pending pod is re-added by the queue meanwhile; count the enrolled ones only.)
        let reprogrammed = web
            .iter()
            .filter(|(uid, _)| calls.contains(&format!("program {uid}")))
            .count();
        assert_eq!(
            reprogrammed,
            if reconcile { 20 } else { 0 },
            "reconcile={reconcile}: {calls:?}"
        );
        let probes = r.dp.probes.lock().clone();
        assert!(
            web.iter()
                .all(|(uid, _)| probes.values().any(|owner| owner == uid))
        );
        // The pending pod is retried through the queue (namespace replay) and completes.
        r.wait("pending pod enrolled", || {
            r.annotation("shop", "half").as_deref() == Some("enabled")
        })
        .await;
        r.shutdown().await;
    }
}
