//! The demo: one Kubernetes node's worth of istio-cni, no cluster needed. Everything runs inside a
//! throw-away "node" network namespace with temp dirs standing in for the host's CNI directories:
//!
//! 1. a test API server (the test-only `test-apiserver` binary) serves two pods from an embedded
//!    default: `productpage` (sidecar-injected) and `plain-app` (no sidecar);
//! 2. `install-cni` installs itself as the `istio-cni` plugin and merges its entry into the node's
//!    bridge conflist;
//! 3. the merged conflist is run the way containerd runs it (Debian's real `bridge` + `host-local`,
//!    then ours) for both pods: the sidecar pod's outbound connection lands on its 15001 listener
//!    with the original destination intact; the plain pod is untouched;
//! 4. ambient (install-cni runs its node agent too): a pod in an `istio.io/dataplane-mode=ambient`
//!    namespace is ADDed through the same chain, the ADD returns only after the ztunnel-like ZDS
//!    peer acked, the pod's outbound connection lands on the peer's listener inside the pod netns,
//!    and relabelling the namespace `none` takes it out again;
//! 5. SIGTERM: install-cni removes its entry and binary again.
//!
//! Run as root: `scripts/demo`. Only addresses inside the demo's namespaces are used.

#[path = "../tests/cni_driver/mod.rs"]
mod cni_driver;

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cni_driver::{Attachment, Chain};
use nix::sched::{CloneFlags, setns};
use nix::sys::socket::{getsockopt, sockopt};
use serde_json::{Value, json};

#[path = "support/mod.rs"]
mod support;

#[path = "demo_parts/ambient.rs"]
mod ambient;
// The node's /proc as the agent must see it: a pid 1 whose netns it can read (a node gives the
// agent that; a machine may not let even root read its own pid 1's netns).
#[allow(dead_code)]
#[path = "../tests/support/node_proc.rs"]
mod node_proc;
use istio_cni_testing::zds_peer;
use support::run;

const SUBNET: &str = "10.254.88.0/24";
const GATEWAY: &str = "10.254.88.1";
const TOKEN: &str = "demo-service-account-token";

/// A named network namespace, removed on drop.
struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Result<Netns, String> {
        let name = format!("istio-demo-{tag}-{}", std::process::id());
        run("ip", &["netns", "add", &name])?;
        let ns = Netns(name);
        run("ip", &["-n", &ns.0, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    fn path(&self) -> PathBuf {
        PathBuf::from(format!("/var/run/netns/{}", self.0))
    }

    /// Runs `work` on a thread inside this namespace.
    fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, String> {
        let file = File::open(self.path()).map_err(|e| e.to_string())?;
        std::thread::spawn(move || {
            setns(&file, CloneFlags::CLONE_NEWNET).map_err(|e| e.to_string())?;
            Ok(work())
        })
        .join()
        .map_err(|_| "netns thread panicked".to_string())?
    }

    /// A process started inside this namespace.
    fn spawn(
        &self,
        program: &str,
        args: &[&str],
        env: &[(&str, String)],
        stdout: Stdio,
        stderr: Stdio,
    ) -> Result<Child, String> {
        Command::new("ip")
            .args(["netns", "exec", &self.0, program])
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(env.iter().map(|(k, v)| (*k, v)))
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("cannot start {program}: {e}"))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

/// A child process stopped with SIGTERM on drop.
struct Process(Child);

impl Process {
    fn terminate(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.0.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.terminate();
    }
}

fn wait_until(what: &str, timeout: Duration, cond: impl Fn() -> bool) -> Result<(), String> {
    let start = Instant::now();
    while !cond() {
        if start.elapsed() > timeout {
            return Err(format!("timed out waiting for {what}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// The embedded default: a namespace, a sidecar-injected pod and a plain pod.
fn fixtures() -> Value {
    let status = r#"{"initContainers":["istio-validation"],"containers":["istio-proxy"],"volumes":["istio-envoy"]}"#;
    let [ambient_ns, ambient_pod] = ambient::fixtures();
    json!([
        ambient_ns, ambient_pod,
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bookinfo", "labels": {"istio-injection": "enabled"}}},
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": "productpage", "namespace": "bookinfo", "uid": "5c1f1c9e-0d3e-4a6b-9c1f-00000000d001",
                      "annotations": {"sidecar.istio.io/status": status}},
         "spec": {"nodeName": "demo-node", "containers": [
             {"name": "productpage", "ports": [{"containerPort": 9080}]},
             {"name": "istio-proxy", "args": ["proxy", "sidecar"]}]}},
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": "plain-app", "namespace": "bookinfo", "uid": "5c1f1c9e-0d3e-4a6b-9c1f-00000000d002"},
         "spec": {"nodeName": "demo-node", "containers": [{"name": "app"}]}}
    ])
}

fn primary_conflist(ipam_dir: &Path) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "demo-pod-network",
        "plugins": [{
            "type": "bridge", "bridge": format!("demo-br{}", std::process::id() % 1000), "isGateway": true,
            "ipam": {"type": "host-local", "subnet": SUBNET, "dataDir": ipam_dir.display().to_string(),
                     "routes": [{"dst": "0.0.0.0/0"}]}
        }]
    })
}

fn our_entry(conflist: &Path) -> Option<Value> {
    let text = std::fs::read_to_string(conflist).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    v["plugins"]
        .as_array()?
        .iter()
        .find(|p| p["type"] == "istio-cni")
        .cloned()
}

fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let binary = args
        .next()
        .ok_or("usage: demo <path to istio-cni-rs> [<path to test-apiserver>]")?;
    // The test API server is its own (test-only) binary, by default next to istio-cni-rs.
    let apiserver = args.next().unwrap_or_else(|| {
        Path::new(&binary)
            .with_file_name("test-apiserver")
            .display()
            .to_string()
    });
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let root = tmp.path();
    let (net, bin, run_dir, sa) = (
        root.join("net.d"),
        root.join("bin"),
        root.join("run"),
        root.join("sa"),
    );
    for d in [&net, &bin, &run_dir, &sa] {
        std::fs::create_dir_all(d).map_err(|e| e.to_string())?;
    }
    std::fs::write(sa.join("token"), TOKEN).map_err(|e| e.to_string())?;
    std::fs::write(sa.join("ca.crt"), "").map_err(|e| e.to_string())?;
    let conflist = net.join("10-demo-bridge.conflist");
    let primary = serde_json::to_string_pretty(&primary_conflist(&root.join("ipam")))
        .map_err(|e| e.to_string())?;
    std::fs::write(&conflist, primary + "\n").map_err(|e| e.to_string())?;
    let kubeconfig = root.join("demo-kubeconfig");
    let zds_socket = root.join("ztunnel.sock");
    let fixtures_file = root.join("fixtures.json");
    std::fs::write(&fixtures_file, fixtures().to_string()).map_err(|e| e.to_string())?;

    let node = Netns::new("node")?;
    println!(
        "== node network namespace {}; host dirs under {}",
        node.0,
        root.display()
    );

    // 1. The API server, inside the node namespace.
    let mut api = Process(node.spawn(
        &apiserver,
        &[
            "--fixtures",
            &fixtures_file.display().to_string(),
            "--token",
            TOKEN,
            // TLS as in a cluster: install-cni embeds this CA in the plugin's kubeconfig.
            "--ca-out",
            &sa.join("ca.crt").display().to_string(),
            // The demo's own client for the control endpoint (the ambient part relabels).
            "--kubeconfig-out",
            &kubeconfig.display().to_string(),
        ],
        &[],
        Stdio::piped(),
        Stdio::null(),
    )?);
    let mut url = String::new();
    BufReader::new(api.0.stdout.take().ok_or("no stdout")?)
        .read_line(&mut url)
        .map_err(|e| e.to_string())?;
    let url = url.trim().to_string();
    let port = url.rsplit(':').next().unwrap_or_default().to_string();
    println!(
        "== test API server at {url} with pods bookinfo/productpage (sidecar), bookinfo/plain-app and {}/{} (ambient)",
        ambient::NAMESPACE,
        ambient::POD
    );

    // 2. install-cni, as the DaemonSet would run it.
    let mut env = vec![
        ("MOUNTED_CNI_NET_DIR", net.display().to_string()),
        ("CNI_BIN_DIRS", bin.display().to_string()),
        ("CNI_AGENT_RUN_DIR", run_dir.display().to_string()),
        ("SERVICE_ACCOUNT_DIR", sa.display().to_string()),
        ("KUBERNETES_SERVICE_HOST", "127.0.0.1".to_string()),
        ("KUBERNETES_SERVICE_PORT", port),
        ("KUBERNETES_SERVICE_PROTOCOL", "https".to_string()),
        // The node netns is the demo's own, so the default port is free there (`install-cni status`
        // reads it).
        ("HEALTH_PORT", ambient::HEALTH_PORT.to_string()),
        ("MONITORING_PORT", "0".to_string()),
        ("REPAIR_ENABLED", "false".to_string()),
        ("POD_NAMESPACE", "istio-system".to_string()),
        ("NODE_NAME", "demo-node".to_string()),
    ];
    // Ambient on as well (the sidecar pods work the same): its agent serves ZDS on zds_socket,
    // where a ztunnel-like peer connects.
    let host_proc = node_proc::HostProcView::with_init_in(&node.path().display().to_string());
    env.extend(ambient::env(&zds_socket, &host_proc.dir));
    // The agent's own API client (the plugin's kubeconfig is still made from the service
    // account): outside a pod there is no in-cluster config.
    env.push(("KUBECONFIG", kubeconfig.display().to_string()));
    let peer = zds_peer::ZdsPeer::start(&zds_socket);
    let started = Instant::now();
    // Its log goes to a file, shown when something fails.
    let log = root.join("install-cni.log");
    let log_file = File::create(&log).map_err(|e| e.to_string())?;
    let log_err = log_file.try_clone().map_err(|e| e.to_string())?;
    let mut installer = Process(node.spawn(
        &binary,
        &["install-cni"],
        &env,
        log_file.into(),
        log_err.into(),
    )?);
    let show_log = |e: String| {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        format!("{e}; install-cni's log:\n{text}")
    };
    wait_until(
        "install-cni to merge its entry",
        Duration::from_secs(30),
        || our_entry(&conflist).is_some(),
    )
    .map_err(show_log)?;
    println!(
        "== install-cni merged its entry in {:?}; {} now reads:",
        started.elapsed(),
        conflist.display()
    );
    for line in std::fs::read_to_string(&conflist)
        .map_err(|e| e.to_string())?
        .lines()
    {
        println!("   {line}");
    }
    println!("   and installed {}", bin.join("istio-cni").display());

    // 3. The runtime's view: run the merged conflist for both pods.
    let merged: Value =
        serde_json::from_str(&std::fs::read_to_string(&conflist).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    for (pod, sidecar) in [("productpage", true), ("plain-app", false)] {
        let pod_ns = Netns::new(pod)?;
        let netns_path = pod_ns.path();
        let bin_for_del = bin.clone();
        let args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=bookinfo;K8S_POD_NAME={pod}");
        let container = format!("demo-{pod}");
        let result = {
            let (netns_path, args, container) =
                (netns_path.clone(), args.clone(), container.clone());
            let chain = Chain {
                conflist: merged.clone(),
                cni_path: vec![bin.clone(), PathBuf::from("/usr/lib/cni")],
            };
            node.run(move || {
                chain.add(&Attachment {
                    container_id: &container,
                    netns: &netns_path,
                    ifname: "eth0",
                    args: &args,
                })
            })??
        };
        let ip = result["ips"][0]["address"]
            .as_str()
            .unwrap_or("?")
            .to_string();
        println!("== CNI ADD bridge -> istio-cni for bookinfo/{pod}: pod IP {ip}");

        let listener = pod_ns
            .run(|| TcpListener::bind("0.0.0.0:15001"))?
            .map_err(|e| e.to_string())?;
        listener.set_nonblocking(true).map_err(|e| e.to_string())?;
        let target: SocketAddr = format!("{GATEWAY}:9080")
            .parse()
            .map_err(|e| format!("{e}"))?;
        let connected = pod_ns
            .run(move || TcpStream::connect_timeout(&target, Duration::from_secs(1)).is_ok())?;
        let landed = listener
            .accept()
            .ok()
            .and_then(|(s, _)| getsockopt(&s, sockopt::OriginalDst).ok())
            .map(|o| {
                SocketAddr::from((
                    std::net::Ipv4Addr::from(u32::from_be(o.sin_addr.s_addr)),
                    u16::from_be(o.sin_port),
                ))
            });
        match (sidecar, connected, landed) {
            (true, true, Some(orig)) => println!(
                "   the app dialed {target}: it landed on the sidecar's :15001 listener, SO_ORIGINAL_DST = {orig}"
            ),
            (false, false, None) => {
                println!(
                    "   the app dialed {target}: not redirected (refused by the node, nothing listens there)"
                )
            }
            other => return Err(format!("unexpected outcome for {pod}: {other:?}")),
        }
        let conflist_for_del = merged.clone();
        node.run(move || {
            let chain = Chain {
                conflist: conflist_for_del,
                cni_path: vec![bin_for_del, PathBuf::from("/usr/lib/cni")],
            };
            chain.del(
                &Attachment {
                    container_id: &container,
                    netns: &netns_path,
                    ifname: "eth0",
                    args: &args,
                },
                Some(&result),
            )
        })??;
        println!("   CNI DEL done");
    }

    // 4. Ambient: a pod enrolled through ztunnel (the peer) and taken out again.
    wait_until(
        "the ZDS peer's first snapshot",
        Duration::from_secs(30),
        || peer.snapshots() >= 1,
    )
    .map_err(show_log)?;
    ambient::run(&node, &merged, &bin, &binary, &peer, &kubeconfig).map_err(show_log)?;

    // 5. Shutdown: the entry and the binary go away again.
    installer.terminate();
    println!(
        "== SIGTERM to install-cni: our entry present = {}, plugin binary present = {}",
        our_entry(&conflist).is_some(),
        bin.join("istio-cni").exists()
    );
    api.terminate();
    println!("== done; namespaces and temp dirs removed");
    Ok(())
}
