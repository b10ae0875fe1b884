//! Test support for the plugin tests: a CNI chain driver that runs a conflist the way
//! containerd/libcni does, uniquely named network namespaces removed on drop, a minimal fake
//! Kubernetes API server (pods and namespaces by name), and a runner for the real binary.
//! Only loopback and addresses inside namespaces created here are ever used.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::{Value, json};

pub mod real_api;

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// The binary under test: `$ISTIO_CNI_RS_BIN` (the benchmarks point it at the static release
/// build, the demo at the one it runs), else the one cargo built for the tests.
pub fn binary() -> PathBuf {
    std::env::var_os("ISTIO_CNI_RS_BIN")
        .map(PathBuf::from)
        .or_else(|| option_env!("CARGO_BIN_EXE_istio-cni-rs").map(PathBuf::from))
        .expect("set ISTIO_CNI_RS_BIN to the istio-cni-rs binary")
}

/// The test-only API server binary (the `istio-cni-testing` crate's): `$ISTIO_CNI_RS_TEST_APISERVER`
/// (the benchmarks point it at a release build), else the one built next to the binary under test
/// in its directory. Cargo names only this package's binaries to its tests, so it must be
/// built first; a missing one fails naming the command.
pub fn test_apiserver_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("ISTIO_CNI_RS_TEST_APISERVER") {
        return PathBuf::from(path);
    }
    let beside = binary().with_file_name("test-apiserver");
    assert!(
        beside.is_file(),
        "{} is missing: run `cargo build -p istio-cni-testing --bin test-apiserver` or set \
         ISTIO_CNI_RS_TEST_APISERVER to a test-apiserver binary",
        beside.display()
    );
    beside
}

/// Fails (never skips) when a tool is missing, naming the package to install.
pub fn require_tool(tool: &str, package: &str) {
    let dirs = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&dirs).any(|d| d.join(tool).is_file())
        || Path::new("/usr/sbin").join(tool).is_file();
    assert!(
        found,
        "`{tool}` is required by this test: apt-get install {package}"
    );
}

pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (it creates network namespaces)"
    );
}

/// A short unique tag (pid + counter) for names of namespaces, bridges and containers.
pub fn unique(tag: &str) -> String {
    format!(
        "{tag}{}x{}",
        std::process::id() % 100_000,
        COUNTER.fetch_add(1, Ordering::SeqCst)
    )
}

/// Loads `rules` with `iptables-nft-restore --noflush` inside the netns at `netns_path` and
/// returns how long that took (the bare-restore baseline of the benchmarks).
pub fn timed_restore(netns_path: &Path, rules: &str) -> std::time::Duration {
    let rules = rules.to_string();
    istio_cni::netns::Netns::open(netns_path)
        .and_then(|ns| {
            ns.run(move || {
                let start = std::time::Instant::now();
                let mut child = Command::new("iptables-nft-restore")
                    .arg("--noflush")
                    .stdin(Stdio::piped())
                    .spawn()
                    .expect("iptables-nft-restore");
                child
                    .stdin
                    .take()
                    .expect("stdin")
                    .write_all(rules.as_bytes())
                    .expect("write rules");
                assert!(child.wait().expect("wait").success());
                start.elapsed()
            })
        })
        .expect("enter netns")
}

/// Runs a command and returns its output, panicking with that output on failure.
pub fn run_checked(program: &str, args: &[&str]) -> std::process::Output {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs a command, panicking with its output on failure; returns its stdout.
pub fn sh(program: &str, args: &[&str]) -> String {
    String::from_utf8_lossy(&run_checked(program, args).stdout).into_owned()
}

/// A named network namespace (`ip netns add`), deleted on drop — also when the test fails.
pub struct NetnsGuard {
    pub name: String,
}

impl NetnsGuard {
    pub fn new(tag: &str) -> NetnsGuard {
        require_root();
        require_tool("ip", "iproute2");
        let name = unique(&format!("icp-{tag}-"));
        sh("ip", &["netns", "add", &name]);
        NetnsGuard { name }
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/var/run/netns/{}", self.name))
    }

    /// Runs a command inside the namespace.
    pub fn exec(&self, program: &str, args: &[&str]) -> std::process::Output {
        Command::new("ip")
            .args(["netns", "exec", &self.name, program])
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {program} in {}: {e}", self.name))
    }

    /// The plugin's ADD for pod `ns/pod` in this namespace.
    pub fn add(&self, ns: &str, pod: &str, conf: &Value) -> Run {
        run_plugin(
            &cni_env("ADD", &self.path().display().to_string(), ns, pod),
            &conf.to_string(),
        )
    }

    /// What a command run inside the namespace printed (stdout).
    pub fn stdout(&self, program: &str, args: &[&str]) -> String {
        String::from_utf8_lossy(&self.exec(program, args).stdout).into_owned()
    }

    /// Runs `ip` in the namespace with the words of `line`; panics with its stderr on failure.
    pub fn ip(&self, line: &str) {
        let args: Vec<&str> = line.split_whitespace().collect();
        let out = self.exec("ip", &args);
        assert!(
            out.status.success(),
            "ip {line}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `iptables-save` of the namespace (nft and legacy together).
    pub fn iptables_save(&self) -> String {
        let mut all = String::new();
        for tool in ["iptables-nft-save", "iptables-legacy-save"] {
            require_tool(tool, "iptables");
            let out = self.exec(tool, &[]);
            assert!(
                out.status.success(),
                "{tool} in {}: {}",
                self.name,
                String::from_utf8_lossy(&out.stderr)
            );
            all.push_str(&String::from_utf8_lossy(&out.stdout));
        }
        all
    }
}

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// A link deleted on drop (the test bridge).
pub struct LinkGuard(pub String);

impl Drop for LinkGuard {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.0]).output();
    }
}

/// What one plugin invocation printed.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    /// From spawn to exit.
    pub took: std::time::Duration,
}

impl Run {
    /// The `msg` of the error JSON; empty when there is none.
    pub fn msg(&self) -> String {
        self.json()["msg"].as_str().unwrap_or_default().to_string()
    }

    /// Asserts the call failed (exit 1) with a message holding every one of `parts`.
    pub fn assert_failed_saying(&self, parts: &[&str]) {
        assert_eq!(self.code, 1, "{}{}", self.stdout, self.stderr);
        let msg = self.msg();
        for part in parts {
            assert!(msg.contains(part), "{part:?} missing from: {msg}");
        }
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}): {:?}\nstderr: {}",
                self.stdout, self.stderr
            )
        })
    }
}

/// Runs `executable` as a CNI plugin with a clean environment (PATH kept) plus `env`.
pub fn run_cni(executable: &Path, args0: &[&str], env: &[(&str, String)], stdin: &str) -> Run {
    let mut cmd = Command::new(executable);
    cmd.args(args0)
        .env_clear()
        .env(
            "PATH",
            std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into()),
        )
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = std::time::Instant::now();
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", executable.display()));
    if let Some(mut pipe) = child.stdin.take() {
        let _ = pipe.write_all(stdin.as_bytes());
    }
    let out = child.wait_with_output().expect("wait for plugin");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        took: started.elapsed(),
    }
}

/// A file the test expects to exist (a dry-run output, a log), as text.
pub fn file_text(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Runs our plugin (`istio-rs istio-cni`).
pub fn run_plugin(env: &[(&str, String)], stdin: &str) -> Run {
    run_cni(&binary(), &["istio-cni"], env, stdin)
}

/// The standard CNI env for one call.
pub fn cni_env(command: &str, netns: &str, pod_ns: &str, pod: &str) -> Vec<(&'static str, String)> {
    vec![
        ("CNI_COMMAND", command.to_string()),
        ("CNI_CONTAINERID", "c0ffee".to_string()),
        ("CNI_NETNS", netns.to_string()),
        ("CNI_IFNAME", "eth0".to_string()),
        ("CNI_PATH", "/opt/cni/bin".to_string()),
        (
            "CNI_ARGS",
            format!(
                "IgnoreUnknown=1;K8S_POD_NAMESPACE={pod_ns};K8S_POD_NAME={pod};K8S_POD_INFRA_CONTAINER_ID=c0ffee"
            ),
        ),
    ]
}

// ---------------------------------------------------------------------------------------------
// Test API server

/// The crate's test API server ([`istio_cni_testing::apiserver::TestApiServer`]) on its own
/// runtime, with the helpers the plugin tests need. Stops with the value.
pub struct FakeApiServer {
    pub server: istio_cni_testing::apiserver::TestApiServer,
    rt: tokio::runtime::Runtime,
}

impl FakeApiServer {
    pub fn start() -> FakeApiServer {
        let (server, rt) = istio_cni_testing::apiserver::TestApiServer::start_blocking();
        FakeApiServer { server, rt }
    }

    /// Adds the pod, or replaces it when it exists.
    pub fn put_pod(&self, pod: Value) {
        let pod: k8s_openapi::api::core::v1::Pod =
            serde_json::from_value(pod).expect("a valid Pod");
        if self.server.add_pod(pod.clone()).is_err() {
            self.server.update_pod(pod).expect("update pod");
        }
    }

    pub fn put_namespace(&self, name: &str, labels: Value) {
        let ns = serde_json::from_value(
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}),
        )
        .expect("a valid Namespace");
        self.server.add_namespace(ns).expect("add namespace");
    }

    /// Writes `istio-cni-kubeconfig` pointing at this server into `run_dir`.
    pub fn write_kubeconfig(&self, run_dir: &Path) {
        self.server
            .write_kubeconfig(&run_dir.join("istio-cni-kubeconfig"))
            .expect("write kubeconfig");
    }

    /// Requests the server has seen (method and path).
    pub fn request_count(&self) -> usize {
        self.server.requests().len()
    }

    /// Injects a fault.
    pub fn fault(&self, fault: istio_cni_testing::apiserver::Fault) {
        self.rt.block_on(self.server.set_fault(fault));
    }
}

/// How most plugin tests start: a test API server and a run dir holding its kubeconfig.
pub fn api_and_run_dir() -> (FakeApiServer, tempfile::TempDir) {
    let api = FakeApiServer::start();
    let dir = tempfile::tempdir().unwrap();
    api.write_kubeconfig(dir.path());
    (api, dir)
}

/// [`api_and_run_dir`] with one pod as the injector leaves it (no extra annotations or env).
pub fn api_with_sidecar_pod(ns: &str, name: &str) -> (FakeApiServer, tempfile::TempDir) {
    let (api, dir) = api_and_run_dir();
    api.put_pod(annotated_pod(ns, name, json!({})));
    (api, dir)
}

/// The istio-cni config of the plugin fault tests: kube-system excluded, a prevResult holding
/// `prev_address`.
pub fn sidecar_conf(run_dir: &Path, prev_address: &str) -> Value {
    json!({
        "cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "istio-cni",
        "cni_agent_run_dir": run_dir.display().to_string(),
        "exclude_namespaces": ["kube-system"], "pod_namespace": "istio-system",
        "prevResult": {"cniVersion": "1.0.0", "ips": [{"address": prev_address}], "dns": {}}
    })
}

/// A kubeconfig for `server` (plain HTTP, token auth) in `run_dir`.
pub fn write_kubeconfig(run_dir: &Path, server: &str) {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {server}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: test\ncurrent-context: test\nusers:\n- name: test\n  user:\n    token: test-token\n"
    );
    std::fs::write(run_dir.join("istio-cni-kubeconfig"), text).expect("write kubeconfig");
}

/// A pod as Istio's injector leaves it (app + istio-proxy + istio-validation).
pub fn sidecar_pod(
    ns: &str,
    name: &str,
    annotations: Value,
    proxy_env: Value,
    security: Value,
) -> Value {
    let mut ann = annotations;
    if ann.get("sidecar.istio.io/status").is_none() {
        ann["sidecar.istio.io/status"] = json!("true");
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "annotations": ann},
        "spec": {"containers": [
            {"name": "test"},
            {"name": "istio-proxy", "env": proxy_env, "securityContext": security},
            {"name": "istio-validate"}
        ]}
    })
}

/// A sidecar pod whose only difference from the injector's is `annotations`.
pub fn annotated_pod(ns: &str, name: &str, annotations: Value) -> Value {
    sidecar_pod(ns, name, annotations, json!([]), json!({}))
}

/// Istio's default enablement selectors: the pod label, or the namespace label unless the pod
/// opts out.
pub fn enablement_selectors() -> Value {
    json!([
        {"podSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}}},
        {"podSelector": {"matchExpressions": [{"key": "istio.io/dataplane-mode", "operator": "NotIn", "values": ["none"]}]},
         "namespaceSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}}}
    ])
}

/// A sidecar pod whose only difference from the injector's is one proxy env var.
pub fn pod_with_proxy_env(ns: &str, name: &str, var: &str, value: &str) -> Value {
    let env = json!([{"name": var, "value": value}]);
    sidecar_pod(ns, name, json!({}), env, json!({}))
}

/// The plugin config Istio's plugin tests use (its mock template: standard keys, a prevResult
/// spelled `cniversion`, legacy keys), for a run dir.
pub fn plugin_conf(cni_version: &str, run_dir: &Path, with_prev: bool) -> Value {
    let mut conf = json!({
        "cniVersion": cni_version,
        "name": "istio-plugin-sample-test",
        "type": "sample",
        "capabilities": {"testCapability": false},
        "ipam": {"type": "testIPAM"},
        "dns": {"nameservers": ["testNameServer"], "domain": "testDomain", "search": ["testSearch"], "options": ["testOption"]},
        "plugin_log_level": "debug",
        "cni_agent_run_dir": run_dir.display().to_string(),
        "ambient_enabled": false,
        "enablement_selectors": enablement_selectors(),
        "exclude_namespaces": ["testExcludeNS"],
        "pod_namespace": "istio-system",
        "native_nftables": false,
        "runtimeconfig": {"sampleconfig": []},
        "loglevel": "debug",
        "kubernetes": {"k8sapiroot": "APIRoot", "kubeconfig": "testK8sConfig", "nodename": "testNodeName",
                       "excludenamespaces": "testNS", "cnibindir": "/testDirectory"}
    });
    if with_prev {
        conf["prevResult"] = json!({
            "cniversion": cni_version,
            "interfaces": [{"name": "eth0", "sandbox": "/tmp"}],
            "ips": [{"version": "4", "address": "10.0.0.2/24", "gateway": "10.0.0.1", "interface": 0}],
            "routes": []
        });
    }
    conf
}

// ---------------------------------------------------------------------------------------------
// CNI chain driver

/// A network configuration list, run plugin by plugin as libcni does.
pub struct Chain {
    pub conflist: Value,
    /// Directories searched for plugin executables (CNI_PATH), in order.
    pub cni_path: Vec<PathBuf>,
}

/// One container attachment.
pub struct Attachment<'a> {
    pub container_id: &'a str,
    pub netns: &'a Path,
    pub ifname: &'a str,
    pub args: &'a str,
}

impl Chain {
    fn find(&self, plugin_type: &str) -> PathBuf {
        self.cni_path
            .iter()
            .map(|d| d.join(plugin_type))
            .find(|p| p.is_file())
            .unwrap_or_else(|| {
                panic!(
                    "CNI plugin `{plugin_type}` not found in {:?}: apt-get install containernetworking-plugins",
                    self.cni_path
                )
            })
    }

    /// The stdin of one plugin: its own config plus the list's name and version, and prevResult.
    fn plugin_stdin(&self, plugin: &Value, prev: Option<&Value>) -> String {
        let mut conf = plugin.clone();
        conf["name"] = self.conflist["name"].clone();
        conf["cniVersion"] = self.conflist["cniVersion"].clone();
        if let Some(p) = prev {
            conf["prevResult"] = p.clone();
        }
        conf.to_string()
    }

    fn env(&self, command: &str, a: &Attachment) -> Vec<(&'static str, String)> {
        let path = std::env::join_paths(&self.cni_path).expect("CNI_PATH");
        vec![
            ("CNI_COMMAND", command.to_string()),
            ("CNI_CONTAINERID", a.container_id.to_string()),
            ("CNI_NETNS", a.netns.display().to_string()),
            ("CNI_IFNAME", a.ifname.to_string()),
            ("CNI_ARGS", a.args.to_string()),
            ("CNI_PATH", path.to_string_lossy().into_owned()),
        ]
    }

    fn plugins(&self) -> Vec<Value> {
        self.conflist["plugins"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// ADD through every plugin in order; each gets the previous result. Returns the final result
    /// or the first failure (plugin type and its output).
    pub fn add(&self, a: &Attachment) -> Result<Value, String> {
        let mut prev: Option<Value> = None;
        for plugin in self.plugins() {
            let ty = plugin["type"].as_str().unwrap_or_default().to_string();
            let run = run_cni(
                &self.find(&ty),
                &[],
                &self.env("ADD", a),
                &self.plugin_stdin(&plugin, prev.as_ref()),
            );
            if run.code != 0 {
                return Err(format!(
                    "{ty} ADD failed ({}): {}{}",
                    run.code, run.stdout, run.stderr
                ));
            }
            prev = Some(run.json());
        }
        Ok(prev.unwrap_or(Value::Null))
    }

    /// DEL through every plugin in reverse order, with the cached ADD result as prevResult.
    pub fn del(&self, a: &Attachment, cached: Option<&Value>) -> Result<(), String> {
        for plugin in self.plugins().iter().rev() {
            let ty = plugin["type"].as_str().unwrap_or_default().to_string();
            let run = run_cni(
                &self.find(&ty),
                &[],
                &self.env("DEL", a),
                &self.plugin_stdin(plugin, cached),
            );
            if run.code != 0 {
                return Err(format!(
                    "{ty} DEL failed ({}): {}{}",
                    run.code, run.stdout, run.stderr
                ));
            }
        }
        Ok(())
    }
}

/// A temp dir holding a link named `istio-cni` to the binary under test (as the installer lays
/// it out in the CNI bin dir).
pub fn istio_cni_bin_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::symlink(binary(), dir.path().join("istio-cni")).expect("symlink");
    dir
}
