//! The real `install-cni` run with a rendered DaemonSet's command, args and environment (as the
//! kubelet resolves it), each run in a netns of its own so the chart's fixed ports (probe 8000,
//! metrics 15014) are used as they are, against the real kube-apiserver (a release of the chart
//! of the run's own, `release.rs`; the server reached on the netns's loopback through a relay)
//! with a bound token of the chart's ServiceAccount. Only what
//! Kubernetes itself provides is added (the service host, the service-account mount, API access)
//! and the host mounts are redirected to temp dirs (the chart mounts them where the binary looks
//! by default: `chart_mounts_are_where_install_cni_looks_by_default`).

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use std::path::Path;

use istio_cni::kube::KubeClient;
use istio_cni_testing::controlplane::{self, Forwarder};

use crate::chart::Rendered;
use crate::install::{Agent, Dirs, bin, has_istio_entry, http_get, start_via, testdata};
use crate::release::{self, Release};
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

/// Everything one run needs: its netns (the node's network), a release of the chart on the real
/// API server and the relay that puts the server on the netns's loopback, the temp host dirs.
struct Node {
    ns: Netns,
    release: Release,
    relay: Forwarder,
    /// Before `dirs`: its mount is under their temp dir and is detached first.
    node_proc: NodeProc,
    dirs: Dirs,
    /// The primary CNI config the test put down, if the case chains.
    primary: Option<String>,
}

impl Node {
    /// A node for `r`, its release applied (`rbac_from`'s RBAC when `r` renders none).
    fn new(r: &Rendered, rbac_from: Option<&Rendered>) -> Node {
        let cp = controlplane::shared();
        let ns = Netns::new("chart");
        let relay = cp
            .forward_into(Path::new(&ns.path()))
            .expect("relay into the node");
        let release = release::install(cp, r, rbac_from, |_| {});
        let dirs = Dirs::new();
        release.write_service_account(&dirs.sa);
        let node_proc = NodeProc::start(&ns.path(), dirs.tmp.path());
        Node {
            ns,
            release,
            relay,
            node_proc,
            dirs,
            primary: None,
        }
    }

    /// The rendered container environment plus what Kubernetes itself provides, host mounts
    /// redirected to temp dirs, the fieldRefs resolved for the release.
    fn environment(&self, r: &Rendered) -> BTreeMap<String, String> {
        let d = &self.dirs;
        let kubeconfig = d.tmp.path().join("agent-kubeconfig");
        let url = format!("https://127.0.0.1:{}", self.relay.port());
        self.release.write_kubeconfig(&kubeconfig, &url);
        let (netns_dir, zds_dir) = (d.tmp.path().join("netns"), d.tmp.path().join("ztunnel"));
        for dir in [&netns_dir, &zds_dir] {
            std::fs::create_dir_all(dir).expect("mkdir");
        }
        let host_proc = self.node_proc.dir.clone();
        let path = |p: &std::path::Path| p.display().to_string();
        let provided = [
            // Set by the kubelet for every pod: here the API server on the node's loopback.
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1".to_string()),
            ("KUBERNETES_SERVICE_PORT", self.relay.port().to_string()),
            // The service-account token mount.
            ("SERVICE_ACCOUNT_DIR", path(&d.sa)),
            // In a pod the agent reaches the API in-cluster, which reads the fixed mount path;
            // here the same server, CA and token through a kubeconfig.
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
        self.release.resolve(&mut env);
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

    /// The plugin's own GETs (the pod being added, its namespace) with the kubeconfig
    /// install-cni wrote for it, made from the node's network as the runtime runs the plugin.
    fn plugin_gets(&self, namespace: &str, pod: &str) -> Result<(), String> {
        let kubeconfig = self.dirs.run.join("istio-cni-kubeconfig");
        let (namespace, pod) = (namespace.to_string(), pod.to_string());
        self.ns
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(async {
                    let client = KubeClient::from_kubeconfig_file(&kubeconfig).await?;
                    client.get_namespace(&namespace, T).await?;
                    client.get_pod(&namespace, &pod, T).await.map(|_| ())
                })
                .map_err(|e| e.to_string())
            })
            .join()
            .expect("plugin thread")
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
    let mut node = Node::new(r, None);
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
/// everything installed, the plugin's kubeconfig good for its GETs, a clean exit on SIGTERM that
/// keeps the installation (the DaemonSet still targets the node: an upgrade or restart), and
/// every API call made allowed by the release's own RBAC on the real API server (which also
/// validated the release's objects) and by the rendered RBAC of every value set in the group.
pub fn expect_ready(group: &[&Rendered]) {
    let r = group[0];
    let name = &r.name;
    let with_rbac: Vec<&Rendered> = group
        .iter()
        .copied()
        .filter(|r| !r.all("ClusterRole").is_empty())
        .collect();
    // With resourceScope=namespace the RBAC comes from another release (scope cluster).
    let mut node = Node::new(r, with_rbac.first().copied());
    assert!(
        !node.release.bindings.is_empty(),
        "{name}: no value set of the group renders the RBAC"
    );
    // A sidecar pod on this node that started before the plugin (its validation init container
    // exited 126): the repair controller acts on it, so its API calls are checked below too.
    let repair = r.config_data().get("REPAIR_ENABLED").map(String::as_str) == Some("true");
    let cp = node.release.cp;
    let shop = controlplane::unique_name("shop");
    cp.create_namespace(&shop, &[]);
    release::create_broken_sidecar_pod(cp, &shop, &node.release.node);
    let mut agent = node.start(r);
    wait_ready(&node, &mut agent, r);
    let annotations = &r.daemonset()["spec"]["template"]["metadata"]["annotations"];
    let metrics_port = port_of(&annotations["prometheus.io/port"]);
    let metrics_path = annotations["prometheus.io/path"].as_str().expect("path");
    let (code, body) = node.get(metrics_port, metrics_path).expect("metrics");
    assert_eq!(code, 200, "{name}");
    assert!(body.contains("istio_cni_install_ready 1"), "{name}: {body}");
    check_installed(&node, r);
    node.plugin_gets(&shop, "broken")
        .unwrap_or_else(|e| panic!("{name}: the plugin's kubeconfig: {e}"));
    if repair {
        // Every mode ends in an event (repair mode gives up after its retries: this run's
        // stand-in /proc holds no pod).
        let deadline = Instant::now() + T;
        while release::events_about(cp, &shop, "broken").is_empty() {
            assert!(
                Instant::now() < deadline,
                "{name}: the repair controller recorded no event within {T:?}:\n{}",
                agent.output()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let st = agent.terminate(T);
    assert!(st.success(), "{name}: exit {st}:\n{}", agent.output());
    // The DaemonSet as the server stores it still targets the node (labelled as a kubelet
    // labels it): an upgrade or a restart, so the installation stays for the next agent.
    check_installed(&node, r);

    let calls = node.release.requests();
    // The shutdown check looks up the DaemonSet in the pod's namespace (from the fieldRef).
    let ds = format!(
        "/apis/apps/v1/namespaces/{}/daemonsets/istio-cni-node",
        node.release.namespace
    );
    assert!(calls.iter().any(|a| a.uri == ds), "{name}: {calls:?}");
    node.release.assert_all_allowed_by_its_rbac(name, &calls);
    // The test's reading of the rendered RBAC agrees with the server's, request by request.
    for r in &with_rbac {
        for a in &calls {
            assert!(
                r.allows(&a.call),
                "{}: the rendered RBAC does not allow {:?} ({}), which the API server allowed",
                r.name,
                a.call,
                a.uri
            );
        }
    }
}

/// The plugin, its kubeconfig and the config entry (chained, owned or standalone) are installed.
fn check_installed(node: &Node, r: &Rendered) {
    let name = &r.name;
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
            let own = env["CNI_CONF_NAME"].clone();
            let conf = d.read(&own).unwrap_or_default();
            assert!(conf.contains("\"istio-cni\""), "{name}: {own}: {conf}");
        }
    }
}
