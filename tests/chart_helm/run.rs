//! The real `install-cni` run with a rendered DaemonSet's command, args and environment (as the
//! kubelet resolves it), each run in a netns of its own so the chart's fixed ports (probe 8000,
//! metrics 15014) are used as they are, against the test API server inside that netns. Only what
//! Kubernetes itself provides is added (the service host, the service-account mount, API access)
//! and the host mounts are redirected to temp dirs (the chart mounts them where the binary looks
//! by default: `chart_mounts_are_where_install_cni_looks_by_default`).

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use istio_cni_testing::apiserver::TestApiServer;

use crate::chart::{ApiCall, NAMESPACE, NODE, Rendered};
use crate::install::{Agent, Dirs, bin, has_istio_entry, http_get, start_via, testdata};
use crate::support::Netns;
use crate::support::node_proc::NodeProc;

const T: Duration = Duration::from_secs(30);
/// Runs at once: the machine is small and shared.
const WORKERS: usize = 3;

/// `install-cni --help`: env var -> the default it states ("...; default X (env VAR").
pub fn binary_defaults() -> BTreeMap<String, String> {
    let out = Command::new(bin())
        .args(["install-cni", "--help"])
        .output()
        .expect("install-cni --help");
    let text = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let mut defaults = BTreeMap::new();
    let mut from = 0;
    while let Some(at) = text[from..].find("(env ").map(|i| from + i) {
        let var: String = text[at + 5..]
            .chars()
            .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        // Only this option's text: from the previous "(env" on.
        if let Some(d) = text[from..at].rfind("default ") {
            // `default "v" (env X)` (the declared settings' help), or a bare word.
            let value = text[from + d + 8..at].trim();
            match value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
                Some(quoted) => {
                    defaults.insert(var, quoted.to_string());
                }
                None if !value.contains(' ') => {
                    defaults.insert(var, value.to_string());
                }
                None => {}
            }
        }
        from = at + 5;
    }
    defaults
}

/// What the binary is given: its resolved environment and its args.
type Given = (BTreeMap<String, String>, Vec<String>);

/// The value sets grouped by what the binary is given (resolved environment and args): one run
/// stands for each group; the rest of a group differs only in objects or host paths.
pub fn by_environment<'a>(cases: impl Iterator<Item = &'a Rendered>) -> Vec<Vec<&'a Rendered>> {
    let mut groups: BTreeMap<Given, Vec<&Rendered>> = BTreeMap::new();
    for r in cases {
        groups
            .entry((r.container_env(), r.args()))
            .or_default()
            .push(r);
    }
    groups.into_values().collect()
}

/// Runs `check` over each group on a few threads; every failure is reported before this panics.
pub fn each_in_parallel(groups: &[Vec<&Rendered>], check: fn(&[&Rendered])) {
    let next = AtomicUsize::new(0);
    let failed = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..WORKERS {
            s.spawn(|| {
                while let Some(group) = groups.get(next.fetch_add(1, Ordering::SeqCst)) {
                    let outcome = std::panic::catch_unwind(|| check(group));
                    if outcome.is_err() {
                        failed.lock().expect("failed").push(group[0].name.clone());
                    }
                }
            });
        }
    });
    let failed = failed.into_inner().expect("failed");
    assert!(
        failed.is_empty(),
        "failed value sets (messages above): {failed:?}"
    );
}

/// The test API server, listening inside `ns`.
struct Api {
    server: TestApiServer,
    _rt: tokio::runtime::Runtime,
}

impl Api {
    fn start_in(ns: &Netns) -> Api {
        // The listening socket belongs to the netns of the thread that creates it.
        ns.spawn(|| {
            let (server, rt) = TestApiServer::start_blocking();
            Api { server, _rt: rt }
        })
        .join()
        .expect("API server thread")
    }
}

/// Everything one run needs: its netns, the API server in it, the temp host dirs.
struct Node {
    ns: Netns,
    api: Api,
    /// Before `dirs`: its mount is under their temp dir and is detached first.
    node_proc: NodeProc,
    dirs: Dirs,
    /// The primary CNI config the test put down, if the case chains.
    primary: Option<String>,
}

impl Node {
    fn new() -> Node {
        let ns = Netns::new("chart");
        let api = Api::start_in(&ns);
        let dirs = Dirs::new();
        let node_proc = NodeProc::start(&ns.path(), dirs.tmp.path());
        Node {
            ns,
            api,
            node_proc,
            dirs,
            primary: None,
        }
    }

    /// The rendered container environment plus what Kubernetes itself provides, host mounts
    /// redirected to temp dirs.
    fn environment(&self, r: &Rendered) -> BTreeMap<String, String> {
        let d = &self.dirs;
        let kubeconfig = d.tmp.path().join("agent-kubeconfig");
        self.api
            .server
            .write_kubeconfig(&kubeconfig)
            .expect("kubeconfig");
        let (netns_dir, zds_dir) = (d.tmp.path().join("netns"), d.tmp.path().join("ztunnel"));
        for dir in [&netns_dir, &zds_dir] {
            std::fs::create_dir_all(dir).expect("mkdir");
        }
        let host_proc = self.node_proc.dir.clone();
        let path = |p: &std::path::Path| p.display().to_string();
        let provided = [
            // Set by the kubelet for every pod.
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1".to_string()),
            ("KUBERNETES_SERVICE_PORT", "443".to_string()),
            // The service-account token mount.
            ("SERVICE_ACCOUNT_DIR", path(&d.sa)),
            // In a pod the agent reaches the API in-cluster (https); here the plain-HTTP server.
            ("KUBECONFIG", path(&kubeconfig)),
            // The chart's host mounts, redirected.
            ("MOUNTED_CNI_NET_DIR", path(&d.net)),
            ("CNI_BIN_DIRS", path(&d.bin)),
            ("CNI_AGENT_RUN_DIR", path(&d.run)),
            // The host's /proc as the ambient agent uses it, redirected: see `NodeProc`.
            ("HOST_PROC_DIR", path(&host_proc)),
            ("HOST_NETNS_DIR", path(&netns_dir)),
            ("ZTUNNEL_UDS_ADDRESS", path(&zds_dir.join("ztunnel.sock"))),
        ];
        let mut env = r.container_env();
        for (k, v) in provided {
            assert!(
                !env.contains_key(k),
                "{}: the chart sets {k}, which this test provides",
                r.name
            );
            env.insert(k.to_string(), v);
        }
        env
    }

    /// Starts install-cni inside the netns as the container would: its command is the role.
    fn start(&mut self, r: &Rendered) -> Agent {
        let env = self.environment(r);
        assert_eq!(r.container()["command"], serde_json::json!(["install-cni"]));
        if env["CHAINED_CNI_PLUGIN"] != "false" {
            let name = env
                .get("CNI_CONF_NAME")
                .cloned()
                .unwrap_or_else(|| "10-list.conflist".into());
            self.dirs.put(&name, &testdata("list.conflist"));
            self.primary = Some(name);
        }
        let args = r.args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let env: Vec<(String, String)> = env.into_iter().collect();
        start_via(&["ip", "netns", "exec", &self.ns.name], &env, &args)
    }

    fn get(&self, port: u16, path: &str) -> Option<(u16, String)> {
        let path = path.to_string();
        self.ns
            .spawn(move || http_get(port, &path))
            .join()
            .expect("http thread")
    }
}

fn port_of(v: &serde_json::Value) -> u16 {
    match v {
        serde_json::Value::Number(n) => n.as_u64().and_then(|n| u16::try_from(n).ok()),
        serde_json::Value::String(s) => s.parse().ok(),
        _ => None,
    }
    .unwrap_or_else(|| panic!("not a port: {v}"))
}

/// Starts the rendered `install-cni` in a node netns of its own, waits for its readiness probe,
/// hands the node netns to `check`, then stops the agent (SIGTERM) and expects a clean exit.
pub fn while_ready(r: &Rendered, check: impl FnOnce(&Netns)) {
    let mut node = Node::new();
    let mut agent = node.start(r);
    wait_ready(&node, &mut agent, r);
    check(&node.ns);
    let st = agent.terminate(T);
    assert!(st.success(), "{}: exit {st}:\n{}", r.name, agent.output());
}

fn wait_ready(node: &Node, agent: &mut Agent, r: &Rendered) {
    let name = &r.name;
    let probe = &r.container()["readinessProbe"]["httpGet"];
    let (port, path) = (
        port_of(&probe["port"]),
        probe["path"].as_str().expect("path"),
    );
    let deadline = Instant::now() + T;
    while node.get(port, path).map(|(s, _)| s) != Some(200) {
        if let Some(st) = agent.child.try_wait().expect("try_wait") {
            std::thread::sleep(Duration::from_millis(50));
            panic!("{name}: install-cni exited ({st}):\n{}", agent.output());
        }
        assert!(
            Instant::now() < deadline,
            "{name}: not ready on :{port}{path} within {T:?}:\n{}",
            agent.output()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The rendered environment must be accepted: ready on the probe, metrics on the scrape target,
/// everything installed, a clean exit on SIGTERM, and every API call made allowed by the RBAC of
/// every value set in the group.
pub fn expect_ready(group: &[&Rendered]) {
    let r = group[0];
    let name = &r.name;
    let mut node = Node::new();
    // A sidecar pod on this node that started before the plugin (its validation init container
    // exited 126): the repair controller acts on it, so its API calls are checked below too.
    let repair = r.config_data().get("REPAIR_ENABLED").map(String::as_str) == Some("true");
    node.api
        .server
        .add_pod(broken_sidecar_pod())
        .expect("add pod");
    let mut agent = node.start(r);
    wait_ready(&node, &mut agent, r);
    let annotations = &r.daemonset()["spec"]["template"]["metadata"]["annotations"];
    let metrics_port = port_of(&annotations["prometheus.io/port"]);
    let metrics_path = annotations["prometheus.io/path"].as_str().expect("path");
    let (code, body) = node.get(metrics_port, metrics_path).expect("metrics");
    assert_eq!(code, 200, "{name}");
    assert!(body.contains("istio_cni_install_ready 1"), "{name}: {body}");

    let d = &node.dirs;
    assert!(
        d.bin.join("istio-cni").is_file(),
        "{name}: no plugin binary"
    );
    assert!(
        d.run.join("istio-cni-kubeconfig").is_file(),
        "{name}: no kubeconfig"
    );
    let env = r.container_env();
    let owned = env.get("ISTIO_OWNED_CNI_CONFIG").map(String::as_str) == Some("true");
    match &node.primary {
        // Istio-owned (ambient only): our own file with the primary's plugins plus ours; the
        // primary stays as it was.
        Some(primary) if owned => {
            let own = env
                .get("ISTIO_OWNED_CNI_CONFIG_FILENAME")
                .cloned()
                .unwrap_or_else(|| "02-istio-cni.conflist".into());
            let conf = d.read(&own).unwrap_or_default();
            assert!(has_istio_entry(&conf), "{name}: {own} not written:\n{conf}");
            assert_eq!(
                d.read(primary),
                Some(String::from_utf8(testdata("list.conflist")).expect("utf8")),
                "{name}: the primary config changed"
            );
        }
        Some(primary) => {
            let conf = d.read(primary).unwrap_or_default();
            assert!(
                has_istio_entry(&conf),
                "{name}: {primary} not chained:\n{conf}"
            );
        }
        None => {
            // Standalone: our own config, named by CNI_CONF_NAME.
            let own = r.container_env()["CNI_CONF_NAME"].clone();
            let conf = d.read(&own).unwrap_or_default();
            assert!(conf.contains("\"istio-cni\""), "{name}: {own}: {conf}");
        }
    }
    if repair {
        // Every mode ends in an event (repair mode gives up after its retries: this run's
        // stand-in /proc holds no pod).
        let deadline = Instant::now() + T;
        while node.api.server.events().is_empty() {
            assert!(
                Instant::now() < deadline,
                "{name}: the repair controller recorded no event within {T:?}:\n{}",
                agent.output()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let st = agent.terminate(T);
    assert!(st.success(), "{name}: exit {st}:\n{}", agent.output());

    let calls: Vec<(ApiCall, String)> = node
        .api
        .server
        .requests()
        .iter()
        .map(|q| {
            (
                ApiCall::from_http(&q.method, &q.path, q.is_watch()),
                q.path.clone(),
            )
        })
        .collect();
    // The shutdown check looks up the DaemonSet in the pod's namespace (from the fieldRef).
    let ds = format!("/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/istio-cni-node");
    assert!(calls.iter().any(|(_, p)| *p == ds), "{name}: {calls:?}");
    // With resourceScope=namespace the RBAC comes from another release (scope cluster).
    for r in group.iter().filter(|r| !r.all("ClusterRole").is_empty()) {
        for (call, path) in &calls {
            assert!(
                r.allows(call),
                "{}: RBAC does not allow {call:?} ({path})",
                r.name
            );
        }
    }
}

/// A sidecar pod on [`NODE`] whose `istio-validation` init container last exited 126.
fn broken_sidecar_pod() -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "broken", "namespace": "shop",
                     "uid": "00000000-0000-4000-8000-0000000000b0",
                     "annotations": {"sidecar.istio.io/status": "{}"}},
        "spec": {"nodeName": NODE, "initContainers": [{"name": "istio-validation"}],
                 "containers": [{"name": "app"}, {"name": "istio-proxy"}]},
        "status": {"phase": "Pending", "podIP": "10.250.0.3", "initContainerStatuses": [{
            "name": "istio-validation", "ready": false, "restartCount": 2, "image": "proxyv2",
            "imageID": "", "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 126, "reason": "Error"}}}]}
    }))
    .expect("Pod")
}
