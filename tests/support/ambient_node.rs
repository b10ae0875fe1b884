//! An ambient "node" for the end-to-end tests: a network namespace of its own in which the real
//! `install-cni` runs with AMBIENT_ENABLED=true (so its host rules and probe sets land there, never
//! in the machine's host netns), the test API server bound inside it, the test ZDS peer on a temp
//! socket, CNI conf/bin/run dirs in temp dirs, and a real CNI chain (Debian's bridge + host-local +
//! loopback, then the `istio-cni` entry install-cni added) run from inside the node netns.
//! Pods are namespaces joined to the node's bridge; addresses are 10.244.0.0/24 inside the node.
//! Included with `#[path]` next to `mod support;` and `mod install_support;`.
//!
//! [`Node::start_real`] puts the node on the real kube-apiserver instead
//! (`support::real_cluster`, shared by the test binary): a relay on the node netns's loopback
//! (`ControlPlane::forward_into`) lets install-cni and the plugin reach it at `127.0.0.1` as
//! they reach the test API server, so both keep running in the node netns where their rules
//! belong; the test's namespaces and node get a suffix on the server ([`Node::k8s_ns`]).
#![allow(dead_code)]

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sched::{CloneFlags, setns};
use serde_json::{Value, json};

use crate::install_support::{self, Dirs, has_istio_entry};
use crate::support::Netns;
use crate::support::cni_driver::{Attachment, Chain, NetnsGuard, require_root, require_tool};
use crate::support::istio_root::IstioRoot;
use crate::support::node_proc::HostProcView;
use crate::support::real_cluster::RealCluster;
use crate::support::zds_peer::ZdsPeer;

/// The data-plane backend the agent is started with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Iptables,
    Nftables,
}

/// The node name the agent watches pods of.
pub const NODE: &str = "node-1";

/// The chart's default enablement selectors (values `ambient.enablementSelectors`).
pub const CHART_SELECTORS: &str = r#"[{"podSelector":{"matchLabels":{"istio.io/dataplane-mode":"ambient"}}},{"podSelector":{"matchExpressions":[{"key":"istio.io/dataplane-mode","operator":"NotIn","values":["none"]}]},"namespaceSelector":{"matchLabels":{"istio.io/dataplane-mode":"ambient"}}}]"#;

/// The test API server on a runtime whose threads live in the node netns (so the listener does).
pub struct NodeApi {
    pub server: istio_cni_testing::apiserver::TestApiServer,
    rt: tokio::runtime::Runtime,
}

impl NodeApi {
    pub fn new(
        server: istio_cni_testing::apiserver::TestApiServer,
        rt: tokio::runtime::Runtime,
    ) -> NodeApi {
        NodeApi { server, rt }
    }

    /// Stops the server (every watch drops), runs `while_down` (the history is compacted too, so
    /// clients must re-list), then listens again from a thread inside `netns`.
    pub fn restart(&self, netns: &Path, while_down: impl FnOnce()) {
        self.rt.block_on(self.server.stop());
        while_down();
        self.server.compact();
        let file = File::open(netns).expect("open netns");
        std::thread::scope(|s| {
            s.spawn(|| {
                setns(&file, CloneFlags::CLONE_NEWNET).expect("setns");
                self.rt
                    .block_on(self.server.restart())
                    .expect("restart the API server");
            })
            .join()
            .expect("restart thread")
        });
    }
}

/// Everything one e2e test owns. Fields drop in order: the agent first (it holds the node netns
/// alive), then the peer, the API server, the namespace and the temp dirs.
pub struct Node {
    pub agent: install_support::Agent,
    pub peer: ZdsPeer,
    pub api: NodeApi,
    pub ns: Netns,
    pub backend: Backend,
    pub dirs: Dirs,
    pub zds_socket: PathBuf,
    pub chain: Chain,
    /// install-cni's environment (a restart starts it again with the same).
    env: Vec<(String, String)>,
    _kubelet: Option<FakeKubelet>,
    _ipam: tempfile::TempDir,
    _kube: tempfile::TempDir,
    /// The node's /proc (`HOST_PROC_DIR`): every process, pid 1 in the node netns.
    pub host_proc: HostProcView,
    /// On the real API server ([`Node::start_real`]): the cluster, and the relay into the node.
    pub real: Option<(RealCluster, istio_cni_testing::controlplane::Forwarder)>,
    /// How install-cni is started (ours: `nsenter` into the node netns; Istio's: its chroot).
    launch: Vec<String>,
    /// Istio's root when the agent is Istio's own ([`Node::start_istio_on`]).
    _istio: Option<IstioRoot>,
}

fn require_tools() {
    require_root();
    for (tool, pkg) in [
        ("ip", "iproute2"),
        ("nsenter", "util-linux"),
        ("iptables-save", "iptables"),
        ("ipset", "ipset"),
        ("nft", "nftables"),
    ] {
        require_tool(tool, pkg);
    }
    for plugin in ["bridge", "host-local", "loopback"] {
        assert!(
            Path::new("/usr/lib/cni").join(plugin).is_file(),
            "/usr/lib/cni/{plugin} is required: apt-get install containernetworking-plugins"
        );
    }
}

std::thread_local! {
    /// Set by [`Node::start_istio_on`] while it builds the node: the agent is Istio's.
    static ISTIO_AGENT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn launch_agent(launch: &[String], env: &[(String, String)]) -> install_support::Agent {
    let wrapper: Vec<&str> = launch.iter().map(String::as_str).collect();
    install_support::start_via(&wrapper, env, &[])
}

/// Runs `work` on a thread that entered `netns` first (children it spawns inherit the netns).
pub fn in_netns<T: Send + 'static>(netns: &Path, work: impl FnOnce() -> T + Send + 'static) -> T {
    let file = File::open(netns).expect("open netns");
    std::thread::spawn(move || {
        setns(&file, CloneFlags::CLONE_NEWNET).expect("setns");
        work()
    })
    .join()
    .expect("thread in netns")
}

/// The addresses the node's chain gives each sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Addressing {
    V4,
    DualStack,
    TwoV4,
}

impl Node {
    /// Starts everything and waits until the agent installed the plugin and the peer took the
    /// first snapshot.
    pub fn start(backend: Backend) -> Node {
        Self::start_with(backend, &[])
    }

    pub fn start_with(backend: Backend, extra_env: &[(&str, &str)]) -> Node {
        Self::start_full(backend, extra_env, true, Addressing::V4)
    }

    /// Like [`start_with`](Self::start_with) on a dual-stack pod network: the chain gives every
    /// sandbox an IPv4 and an IPv6 address (`fd00:10:244::/64`).
    pub fn start_dual_stack(backend: Backend, extra_env: &[(&str, &str)]) -> Node {
        Self::start_full(backend, extra_env, true, Addressing::DualStack)
    }

    /// Like [`start_with`](Self::start_with) with ztunnel not running (a new node): the peer
    /// connects after `node.peer.start_again()`.
    pub fn start_without_peer(backend: Backend, extra_env: &[(&str, &str)]) -> Node {
        Self::start_full(backend, extra_env, false, Addressing::V4)
    }

    fn start_full(
        backend: Backend,
        extra_env: &[(&str, &str)],
        peer_up: bool,
        addressing: Addressing,
    ) -> Node {
        Self::start_on(backend, extra_env, peer_up, addressing, None)
    }

    /// [`Node::start`] on the real kube-apiserver (see the module doc).
    pub fn start_real(backend: Backend) -> Node {
        Self::start_on(
            backend,
            &[],
            true,
            Addressing::V4,
            Some(RealCluster::start()),
        )
    }

    /// [`Node::start_with`] on the real kube-apiserver, on `cluster` made by the caller first
    /// (so settings can carry its names, e.g. `REPAIR_NODE_NAME` = `cluster.node(NODE)`).
    pub fn start_real_on(
        cluster: RealCluster,
        backend: Backend,
        extra_env: &[(&str, &str)],
    ) -> Node {
        Self::start_on(backend, extra_env, true, Addressing::V4, Some(cluster))
    }

    /// [`Node::start_real_on`] with a chain that gives every sandbox two IPv4 addresses on eth0
    /// (`10.244.0.2-199` first, `10.244.0.200-250` second), both in the CNI result.
    pub fn start_real_two_v4(backend: Backend, extra_env: &[(&str, &str)]) -> Node {
        Self::start_on(
            backend,
            extra_env,
            true,
            Addressing::TwoV4,
            Some(RealCluster::start()),
        )
    }

    /// [`Node::start_dual_stack`] on the real kube-apiserver.
    pub fn start_real_dual_stack(backend: Backend, extra_env: &[(&str, &str)]) -> Node {
        Self::start_on(
            backend,
            extra_env,
            true,
            Addressing::DualStack,
            Some(RealCluster::start()),
        )
    }

    /// [`Node::start_without_peer`] on the real kube-apiserver, on `cluster` made by the caller.
    pub fn start_real_without_peer(
        cluster: RealCluster,
        backend: Backend,
        extra_env: &[(&str, &str)],
    ) -> Node {
        Self::start_on(backend, extra_env, false, Addressing::V4, Some(cluster))
    }

    /// [`Node::start_real_on`] with Istio's own install-cni as the agent
    /// (tests/support/istio_root.rs), for the differential tests.
    pub fn start_istio_on(
        cluster: RealCluster,
        backend: Backend,
        extra_env: &[(&str, &str)],
    ) -> Node {
        ISTIO_AGENT.with(|i| i.set(true));
        let node = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            Self::start_on(backend, extra_env, true, Addressing::V4, Some(cluster))
        }));
        ISTIO_AGENT.with(|i| i.set(false));
        node.unwrap_or_else(|p| std::panic::resume_unwind(p))
    }

    /// The real cluster the node is on; panics on the test API server.
    pub fn cluster(&self) -> &RealCluster {
        &self.real.as_ref().expect("a node on the real API server").0
    }

    fn start_on(
        backend: Backend,
        extra_env: &[(&str, &str)],
        peer_up: bool,
        addressing: Addressing,
        real: Option<RealCluster>,
    ) -> Node {
        require_tools();
        let ns = Netns::new("node");
        let node_path = PathBuf::from(ns.path());
        let api = in_netns(&node_path, || {
            let (server, rt) = istio_cni_testing::apiserver::TestApiServer::start_blocking();
            NodeApi { server, rt }
        });
        let kube = tempfile::tempdir().expect("tempdir");
        let kubeconfig = kube.path().join("kubeconfig");
        let dirs = Dirs::new();
        let real = real.map(|cluster| {
            let relay = cluster
                .cp
                .forward_into(&node_path)
                .expect("relay into the node");
            (cluster, relay)
        });
        let (token, ca, port) = match &real {
            Some((cluster, relay)) => {
                let token = cluster.token();
                let url = format!("https://127.0.0.1:{}", relay.port());
                cluster.write_kubeconfig_for(&kubeconfig, &url, &token);
                (token, Some(cluster.cp.ca_pem().to_string()), relay.port())
            }
            None => {
                api.server
                    .write_kubeconfig(&kubeconfig)
                    .expect("kubeconfig");
                let token = api.server.token().unwrap_or_default();
                (token, api.server.ca_pem(), api.server.addr().port())
            }
        };
        // The plugin's kubeconfig (written by install-cni) carries the SA token.
        std::fs::write(dirs.sa.join("token"), token).expect("token");
        // ...and the API server's CA (the test server speaks TLS, as a cluster does).
        let protocol = match ca {
            Some(ca) => {
                std::fs::write(dirs.sa.join("ca.crt"), ca).expect("ca.crt");
                "https"
            }
            None => "http",
        };

        let ipam = tempfile::tempdir().expect("tempdir");
        let ranges = match addressing {
            Addressing::V4 => vec![json!([{"subnet": "10.244.0.0/24"}])],
            Addressing::DualStack => vec![
                json!([{"subnet": "10.244.0.0/24"}]),
                json!([{"subnet": "fd00:10:244::/64"}]),
            ],
            // Two range sets of one family: host-local gives each sandbox an address from
            // each, and the bridge puts both on eth0 (as a multi-IP primary plugin would).
            Addressing::TwoV4 => vec![
                json!([{"subnet": "10.244.0.0/24",
                        "rangeStart": "10.244.0.2", "rangeEnd": "10.244.0.199"}]),
                json!([{"subnet": "10.244.0.0/24",
                        "rangeStart": "10.244.0.200", "rangeEnd": "10.244.0.250"}]),
            ],
        };
        let conflist = json!({
            "cniVersion": "1.0.0",
            "name": "e2e-net",
            "plugins": [
                {
                    "type": "bridge", "bridge": "cni0", "isGateway": false, "ipMasq": false,
                    "ipam": {"type": "host-local", "ranges": ranges,
                             "dataDir": ipam.path().display().to_string()}
                },
                {"type": "loopback"}
            ]
        });
        dirs.put("10-e2e.conflist", conflist.to_string().as_bytes());

        let zds_socket = dirs.tmp.path().join("ztunnel.sock");
        let host_proc = HostProcView::with_init_in(&ns.path());
        let port = port.to_string();
        let node_name = real
            .as_ref()
            .map_or(NODE.to_string(), |(cluster, _)| cluster.node(NODE));
        // The nftables probe rule matches kubelet's UID, found in /proc as Istio does.
        let kubelet = (backend == Backend::Nftables).then(|| FakeKubelet::start(dirs.tmp.path()));
        let mut env = dirs.base_env();
        env.retain(|(k, _)| k != "KUBERNETES_SERVICE_HOST" && k != "KUBERNETES_SERVICE_PORT");
        let mut add = |k: &str, v: &str| env.push((k.to_string(), v.to_string()));
        add("KUBERNETES_SERVICE_HOST", "127.0.0.1");
        add("KUBERNETES_SERVICE_PORT", &port);
        add("KUBERNETES_SERVICE_PROTOCOL", protocol);
        add("KUBECONFIG", kubeconfig.to_str().expect("utf-8"));
        add("AMBIENT_ENABLED", "true");
        add("NODE_NAME", &node_name);
        add("HOST_PROC_DIR", host_proc.dir.to_str().expect("utf-8"));
        add("AMBIENT_ENABLEMENT_SELECTOR", CHART_SELECTORS);
        add("ZTUNNEL_UDS_ADDRESS", zds_socket.to_str().expect("utf-8"));
        if backend == Backend::Nftables {
            add("NATIVE_NFTABLES", "true");
        }
        for (k, v) in extra_env {
            add(k, v);
        }
        let istio = ISTIO_AGENT.with(|i| i.get()).then(IstioRoot::new);
        let launch = match &istio {
            Some(root) => {
                std::fs::create_dir_all(&dirs.run).expect("mkdir run");
                root.wrapper(
                    &ns.path(),
                    &host_proc.dir,
                    dirs.tmp.path(),
                    (&dirs.net, &dirs.bin, &dirs.sa),
                )
            }
            None => vec!["nsenter".to_string(), format!("--net={}", ns.path())],
        };
        let agent = launch_agent(&launch, &env);
        let peer = if peer_up {
            ZdsPeer::start(&zds_socket)
        } else {
            ZdsPeer::start_down(&zds_socket)
        };
        let node = Node {
            agent,
            peer,
            api,
            ns,
            backend,
            dirs,
            zds_socket,
            env,
            chain: Chain {
                conflist: Value::Null,
                cni_path: vec![],
            },
            _kubelet: kubelet,
            _ipam: ipam,
            _kube: kube,
            host_proc,
            real,
            launch,
            _istio: istio,
        };
        node.wait_installed(Duration::from_secs(30), peer_up)
    }

    fn wait_installed(mut self, timeout: Duration, peer_up: bool) -> Node {
        let deadline = Instant::now() + timeout;
        let conf = loop {
            if let Some(c) = self
                .dirs
                .read("10-e2e.conflist")
                .filter(|c| has_istio_entry(c))
            {
                break c;
            }
            if let Ok(Some(st)) = self.agent.child.try_wait() {
                panic!("install-cni exited ({st}):\n{}", self.agent.output());
            }
            assert!(
                Instant::now() < deadline,
                "install-cni did not install the plugin within {timeout:?}:\n{}",
                self.agent.output()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        self.chain = Chain {
            conflist: serde_json::from_str(&conf).expect("conflist JSON"),
            cni_path: vec![self.dirs.bin.clone(), PathBuf::from("/usr/lib/cni")],
        };
        if peer_up {
            self.peer.wait_snapshots(1, Duration::from_secs(10));
        }
        self
    }

    /// Kills install-cni (SIGKILL: a crash, an OOM kill, a node agent restarted under it) and
    /// starts it again with the same settings; returns once the new agent served ztunnel a
    /// snapshot (the peer reconnects by itself).
    pub fn restart_agent_killed(&mut self) -> Vec<crate::support::zds_peer::Seen> {
        let snapshots = self.peer.snapshots();
        self.kill_agent();
        self.start_agent();
        self.peer
            .wait_snapshots(snapshots + 1, Duration::from_secs(30))
    }

    /// SIGKILLs install-cni and reaps it.
    pub fn kill_agent(&mut self) {
        let _ = self.agent.child.kill();
        let _ = self.agent.child.wait();
    }

    /// Starts install-cni again with the same settings; does not wait for anything.
    pub fn start_agent(&mut self) {
        self.agent = launch_agent(&self.launch, &self.env);
    }

    /// Sets (or unsets, `None`) one of install-cni's env vars for the next restart.
    pub fn set_env(&mut self, key: &str, value: Option<&str>) {
        self.env.retain(|(k, _)| k != key);
        if let Some(v) = value {
            self.env.push((key.to_string(), v.to_string()));
        }
    }

    /// Kills install-cni and starts it again with the same settings, without waiting for
    /// anything (the caller decides what the new one must do).
    pub fn relaunch_agent_killed(&mut self) {
        let _ = self.agent.child.kill();
        let _ = self.agent.child.wait();
        self.agent = launch_agent(&self.launch, &self.env);
    }

    /// Adds a namespace with `labels`.
    pub fn namespace(&self, name: &str, labels: Value) {
        let ns = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": labels}
        }))
        .expect("Namespace");
        match &self.real {
            Some((cluster, _)) => cluster.add_namespace(ns),
            None => self
                .api
                .server
                .add_namespace(ns)
                .map(|_| ())
                .map_err(|e| e.to_string()),
        }
        .expect("add namespace");
    }

    /// The name of the test's namespace `name` on the API server (suffixed on the real one).
    pub fn k8s_ns(&self, name: &str) -> String {
        match &self.real {
            Some((cluster, _)) => cluster.ns(name),
            None => name.to_string(),
        }
    }

    /// The pod as stored now.
    pub fn get_pod(&self, namespace: &str, name: &str) -> Option<k8s_openapi::api::core::v1::Pod> {
        match &self.real {
            Some((cluster, _)) => cluster.pod(namespace, name),
            None => self.api.server.pod(namespace, name),
        }
    }

    /// Deletes the pod from the API server.
    pub fn delete_pod(&self, namespace: &str, name: &str) {
        match &self.real {
            Some((cluster, _)) => cluster.delete_pod(namespace, name),
            None => {
                self.api.server.delete_pod(namespace, name);
            }
        }
    }

    /// Adds a pod scheduled on this node; returns its UID.
    pub fn pod(&self, namespace: &str, name: &str, status: Value) -> String {
        self.pod_meta(json!({"name": name, "namespace": namespace}), status)
    }

    /// Like [`pod`](Self::pod) with a UID unique on this machine (the test API server counts
    /// from 1 in every test, and the /proc scan looks at every process of the machine).
    pub fn unique_pod(&self, namespace: &str, name: &str) -> String {
        let uid = unique_uid();
        self.pod_meta(
            json!({"name": name, "namespace": namespace, "uid": uid}),
            json!({}),
        )
    }

    fn pod_meta(&self, metadata: Value, status: Value) -> String {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": metadata,
            "spec": {"nodeName": NODE, "containers": [{"name": "app", "image": "registry.invalid/app:1"}]},
            "status": status
        }))
        .expect("Pod");
        let Some((cluster, _)) = &self.real else {
            let stored = self.api.server.add_pod(pod).expect("add pod");
            return stored.metadata.uid.expect("uid");
        };
        let (ns, name) = (pod.metadata.namespace.clone(), pod.metadata.name.clone());
        cluster.add_pod(pod).expect("add pod");
        let stored = cluster.pod(&ns.unwrap_or_default(), &name.unwrap_or_default());
        stored.and_then(|p| p.metadata.uid).expect("uid")
    }

    /// The pod's status replaced by `status` (JSON of a `PodStatus`), as a kubelet writes it.
    pub fn set_status(&self, namespace: &str, name: &str, status: Value) {
        if let Some((cluster, _)) = &self.real {
            cluster
                .cp
                .set_pod_status(&cluster.ns(namespace), name, status);
            return;
        }
        let mut pod = self.api.server.pod(namespace, name).expect("pod exists");
        pod.status = Some(serde_json::from_value(status).expect("PodStatus"));
        self.api.server.update_pod(pod).expect("update pod");
    }

    /// What the kubelet does after a sandbox started: the pod's IP and phase Running in its status.
    pub fn set_running(&self, namespace: &str, name: &str, ip: &str) {
        if let Some((cluster, _)) = &self.real {
            let status = json!({"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]});
            cluster
                .cp
                .set_pod_status(&cluster.ns(namespace), name, status);
            return;
        }
        let mut pod = self.api.server.pod(namespace, name).expect("pod exists");
        pod.status = Some(
            serde_json::from_value(
                json!({"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}),
            )
            .expect("PodStatus"),
        );
        self.api.server.update_pod(pod).expect("update pod");
    }

    /// The pod's `ambient.istio.io/redirection` annotation (None: no annotation; panics when
    /// the pod is gone).
    pub fn redirection(&self, namespace: &str, name: &str) -> Option<String> {
        self.get_pod(namespace, name)
            .expect("pod exists")
            .metadata
            .annotations
            .and_then(|a| a.get("ambient.istio.io/redirection").cloned())
    }

    /// Waits until `cond` holds; panics naming `what` with the agent's log.
    pub fn wait_until(&self, timeout: Duration, what: &str, cond: impl Fn() -> bool) {
        let deadline = Instant::now() + timeout;
        while !cond() {
            assert!(
                Instant::now() < deadline,
                "{what} did not happen within {timeout:?}; agent log:\n{}",
                self.agent.output()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs the chain's ADD from inside the node netns; returns the result or the failure.
    pub fn add(&self, pod: &PodNs, k8s_ns: &str, name: &str) -> Result<Value, String> {
        self.run_chain(pod, k8s_ns, name, None, true)
            .map(|v| v.expect("result"))
    }

    /// [`add`](Self::add) with CNI_ARGS as containerd and CRI-O send them: the pod's UID too.
    pub fn add_with_uid(
        &self,
        pod: &PodNs,
        k8s_ns: &str,
        name: &str,
        uid: &str,
    ) -> Result<Value, String> {
        self.run_chain(pod, k8s_ns, name, Some(uid), true)
            .map(|v| v.expect("result"))
    }

    pub fn del(&self, pod: &PodNs, k8s_ns: &str, name: &str) -> Result<(), String> {
        self.run_chain(pod, k8s_ns, name, None, false).map(|_| ())
    }

    fn run_chain(
        &self,
        pod: &PodNs,
        k8s_ns: &str,
        name: &str,
        uid: Option<&str>,
        add: bool,
    ) -> Result<Option<Value>, String> {
        let chain = Chain {
            conflist: self.chain.conflist.clone(),
            cni_path: self.chain.cni_path.clone(),
        };
        let netns = pod.guard.path();
        let id = pod.guard.name.clone();
        let k8s_ns = self.k8s_ns(k8s_ns);
        let mut args = format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={k8s_ns};K8S_POD_NAME={name};K8S_POD_INFRA_CONTAINER_ID={id}"
        );
        if let Some(uid) = uid {
            args.push_str(&format!(";K8S_POD_UID={uid}"));
        }
        in_netns(Path::new(&self.ns.path()), move || {
            let a = Attachment {
                container_id: &id,
                netns: &netns,
                ifname: "eth0",
                args: &args,
            };
            if add {
                chain.add(&a).map(Some)
            } else {
                chain.del(&a, None).map(|_| None)
            }
        })
    }

    /// Members of the node's `istio-inpod-probes-v4` set as (ip, comment) pairs.
    /// [`probe_members`](Self::probe_members), sorted.
    pub fn probe_members_sorted(&self) -> Vec<(String, String)> {
        let mut members = self.probe_members();
        members.sort();
        members
    }

    pub fn probe_members(&self) -> Vec<(String, String)> {
        self.probe_set_members("istio-inpod-probes-v4")
    }

    /// Members of the node's probe set `set` (`istio-inpod-probes-v4` or `-v6`) as (ip, comment).
    pub fn probe_set_members(&self, set: &str) -> Vec<(String, String)> {
        match self.backend {
            Backend::Iptables => {
                let out = self.ns.try_exec("ipset", &["list", set]);
                let text = String::from_utf8_lossy(&out.stdout).into_owned();
                text.lines()
                    .skip_while(|l| !l.starts_with("Members:"))
                    .skip(1)
                    .filter_map(|l| {
                        let ip = l.split_whitespace().next()?.to_string();
                        let comment = l.split("comment \"").nth(1)?.trim_end_matches('"');
                        Some((ip, comment.to_string()))
                    })
                    .collect()
            }
            Backend::Nftables => {
                let out = self.ns.try_exec("nft", &["-j", "list", "sets"]);
                let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
                let mut members = Vec::new();
                for item in v["nftables"].as_array().into_iter().flatten() {
                    if item["set"]["name"] != set {
                        continue;
                    }
                    for e in item["set"]["elem"].as_array().into_iter().flatten() {
                        let ip = e["elem"]["val"].as_str().unwrap_or_default();
                        let comment = e["elem"]["comment"].as_str().unwrap_or_default();
                        members.push((ip.to_string(), comment.to_string()));
                    }
                }
                members
            }
        }
    }

    /// The agent's in-pod rules in `pod` for this backend, one line per rule prefixed with its
    /// table and chain (counters left out), in kernel order: a rule twice is there twice.
    pub fn owned_rules(&self, pod: &PodNs) -> Vec<String> {
        let mut rules = Vec::new();
        match self.backend {
            Backend::Iptables => {
                let mut table = String::new();
                for l in pod.guard.iptables_save().lines() {
                    if let Some(t) = l.strip_prefix('*') {
                        table = t.to_string();
                    } else if l.starts_with("-A") && l.contains("ISTIO") {
                        rules.push(format!("{table}: {l}"));
                    }
                }
            }
            Backend::Nftables => {
                let out = pod.guard.exec("nft", &["list", "ruleset"]);
                let (mut table, mut chain) = (String::new(), String::new());
                for l in String::from_utf8_lossy(&out.stdout).lines().map(str::trim) {
                    if let Some(t) = l.strip_prefix("table ") {
                        table = t.trim_end_matches(" {").to_string();
                    } else if let Some(c) = l.strip_prefix("chain ") {
                        chain = c.trim_end_matches(" {").to_string();
                    } else if l == "}" || l.is_empty() || l.starts_with("type ") {
                        continue;
                    } else if table.contains("istio") {
                        let words: Vec<&str> = l.split_whitespace().collect();
                        let mut kept = Vec::new();
                        let mut i = 0;
                        while i < words.len() {
                            if matches!(words[i], "packets" | "bytes") {
                                i += 2;
                                continue;
                            }
                            kept.push(words[i]);
                            i += 1;
                        }
                        rules.push(format!("{table} {chain}: {}", kept.join(" ")));
                    }
                }
            }
        }
        rules
    }

    /// Whether the pod netns holds the agent's in-pod rules for this backend.
    pub fn has_inpod_rules(&self, pod: &PodNs) -> bool {
        let rules = match self.backend {
            Backend::Iptables => pod.guard.iptables_save(),
            Backend::Nftables => {
                String::from_utf8_lossy(&pod.guard.exec("nft", &["list", "ruleset"]).stdout)
                    .into_owned()
            }
        };
        rules.contains("ISTIO") || rules.contains("istio")
    }
}

/// A pod UID unique on this machine (the test API server counts from 1 in every test, and the
/// /proc scan looks at every process of the machine).
pub fn unique_uid() -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_nanos() as u64;
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    format!(
        "{:08x}-e2e0-4000-8000-{:012x}",
        std::process::id(),
        (nanos + n) & 0xffff_ffff_ffff
    )
}

/// A process named `kubelet` (a copy of `sleep`) for the agent's kubelet-UID lookup under
/// /proc; killed on drop.
pub struct FakeKubelet(std::process::Child);

impl FakeKubelet {
    fn start(dir: &Path) -> FakeKubelet {
        let exe = dir.join("kubelet");
        std::fs::copy("/bin/sleep", &exe).expect("copy sleep");
        // A parallel fork may still hold the copy open for writing (ETXTBSY): retry briefly.
        for _ in 0..50 {
            match std::process::Command::new(&exe).arg("600").spawn() {
                Ok(child) => return FakeKubelet(child),
                Err(e) if e.raw_os_error() == Some(nix::libc::ETXTBSY) => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => panic!("start fake kubelet: {e}"),
            }
        }
        panic!("start fake kubelet: text file busy")
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A process inside a pod's netns placed in a cgroup whose path names the pod UID and a
/// container ID (`.../pod<uid>/<container id>`), as the kubelet's containers are: what the
/// agent's /proc scan looks for (Istio's only matches a path ending in a container ID).
/// Killed and its cgroup removed on drop.
pub struct PodProcess {
    child: std::process::Child,
    cgroup: PathBuf,
}

impl PodProcess {
    pub fn start(pod: &PodNs, uid: &str) -> PodProcess {
        Self::start_in(&pod.guard.path(), uid)
    }

    /// Like [`start`](Self::start), in the netns at `netns`.
    pub fn start_in(netns: &Path, uid: &str) -> PodProcess {
        let mut child = std::process::Command::new("nsenter")
            .arg(format!("--net={}", netns.display()))
            .args(["sleep", "600"])
            .spawn()
            .expect("start a process in the pod netns");
        // A v1 hierarchy or the v2 one, wherever this machine lets root create a cgroup.
        let container: String = uid
            .chars()
            .filter(char::is_ascii_hexdigit)
            .cycle()
            .take(64)
            .collect();
        let group = format!("icrs-e2e-{}/pod{uid}/{container}", std::process::id());
        let roots = [
            "/sys/fs/cgroup/pids",
            "/sys/fs/cgroup/unified",
            "/sys/fs/cgroup",
            "/sys/fs/cgroup/systemd",
        ];
        let mut tried = Vec::new();
        for root in roots {
            let dir = Path::new(root).join(&group);
            let placed = std::fs::create_dir_all(&dir)
                .and_then(|()| std::fs::write(dir.join("cgroup.procs"), child.id().to_string()));
            match placed {
                Ok(()) => return PodProcess { child, cgroup: dir },
                Err(e) => {
                    let _ = std::fs::remove_dir(&dir);
                    for up in dir.ancestors().skip(1).take(2) {
                        let _ = std::fs::remove_dir(up);
                    }
                    tried.push(format!("{root}: {e}"));
                }
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "cannot place a process in a pod cgroup here (needed by the /proc scan test): {tried:?}"
        );
    }
}

impl Drop for PodProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Empty once the process is reaped (retry briefly: the kernel moves it out async).
        for _ in 0..50 {
            if std::fs::remove_dir(&self.cgroup).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        for up in self.cgroup.ancestors().skip(1).take(2) {
            let _ = std::fs::remove_dir(up);
        }
    }
}

/// A pod sandbox netns (deleted on drop).
pub struct PodNs {
    pub guard: NetnsGuard,
}

impl PodNs {
    /// A few TCP connects from inside the pod to `ip:9` (its own address): refused or not, each
    /// SYN passes the pod's OUTPUT chains, so rule counters move (needs no tool such as ping).
    pub fn send_tcp_to(&self, ip: &str) {
        let to: std::net::SocketAddr = format!("{ip}:9").parse().expect("pod address");
        istio_cni::netns::Netns::open(&self.guard.path())
            .and_then(|ns| {
                ns.run(move || {
                    for _ in 0..3 {
                        let _ =
                            std::net::TcpStream::connect_timeout(&to, Duration::from_millis(300));
                    }
                })
            })
            .expect("enter the pod netns");
    }

    pub fn new(tag: &str) -> PodNs {
        PodNs {
            guard: NetnsGuard::new(tag),
        }
    }

    pub fn path_string(&self) -> String {
        self.guard.path().display().to_string()
    }
}

/// The first address of a CNI result of `family` (4 or 6).
pub fn result_ip_of(result: &Value, family: u8) -> Option<String> {
    result["ips"].as_array()?.iter().find_map(|ip| {
        let addr = ip["address"].as_str()?.split('/').next()?;
        let parsed: std::net::IpAddr = addr.parse().ok()?;
        (parsed.is_ipv6() == (family == 6)).then(|| addr.to_string())
    })
}

/// The first address of a CNI result (IPv4 comes first on the test networks).
pub fn result_ip(result: &Value) -> String {
    let addr = result["ips"][0]["address"].as_str().expect("an IP");
    addr.split('/').next().expect("addr").to_string()
}

/// The agent's resident set size in MB (install-cni was exec'd by nsenter: the same pid).
pub fn rss_mb(node: &Node) -> f64 {
    status_mb(node, "VmRSS")
}

/// The agent's RSS split: heap and stacks (`RssAnon`) / mapped binary pages (`RssFile`), in MB.
pub fn rss_split_mb(node: &Node) -> (f64, f64) {
    (status_mb(node, "RssAnon"), status_mb(node, "RssFile"))
}

fn status_mb(node: &Node, field: &str) -> f64 {
    let pid = node.agent.child.id();
    let kb = install_support::proc_status_kb(pid, field)
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"));
    kb as f64 / 1024.0
}

impl Node {
    /// Puts `n` pods of other nodes (generation 0) into the API server.
    pub fn add_other_node_pods(&self, n: usize) {
        for i in 0..n {
            self.api
                .server
                .add_pod(other_node_pod(i, 0))
                .expect("add pod");
        }
    }

    /// Other nodes' churn: the first `n` of them deleted and recreated under new names (new
    /// UIDs), then a moment for the watch to deliver it.
    pub fn churn_other_node_pods(&self, n: usize) {
        for i in 0..n {
            self.api.server.delete_pod("elsewhere", &format!("o{i}-g0"));
            self.api
                .server
                .add_pod(other_node_pod(i, 1))
                .expect("recreate pod");
        }
        std::thread::sleep(Duration::from_secs(3));
    }
}

/// A pod scheduled on another node (the agent must never cache these).
pub fn other_node_pod(i: usize, generation: usize) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": format!("o{i}-g{generation}"), "namespace": "elsewhere",
            "labels": {"app": format!("app-{}", i % 100), "istio.io/dataplane-mode": "ambient"},
            "annotations": {"note": "x".repeat(200)}
        },
        "spec": {"nodeName": format!("node-{}", 2 + i % 50), "containers": [{"name": "app", "image": "registry.example/app:1"}]},
        "status": {"phase": "Running", "podIP": format!("10.100.{}.{}", i / 250, i % 250 + 2)}
    }))
    .expect("Pod")
}
