//! A real Kubernetes node for tests, beside the real control plane ([`crate::controlplane`]):
//! kube-controller-manager and kube-scheduler, containerd 2 (its own root, state, sockets and CRI
//! config under the node's directory) with runc, and kubelet (its own root dir, cgroupfs under a
//! cgroup root of its own, the node's CNI conf and bin dirs); Debian's bridge and host-local
//! plugins as the primary network. Built by `scripts/build-node` into `target/node/`; images are
//! made locally ([`images`]) and imported into containerd.
//!
//! Everything listens on loopback or a unix socket under the node's directory; the pods' network is
//! a bridge of the node's own. No kube-proxy runs: the `kubernetes` Service alone is served, by
//! DNAT rules of the node's ([`service`]), so in-cluster clients (our agent pod, the plugin's
//! kubeconfig) reach the API server as on a real cluster. Dropping the node stops every process it started (and the pods'),
//! unmounts what kubelet and containerd mounted, removes its cgroups, bridge and directory. The
//! children also die with the test process (PR_SET_PDEATHSIG); a shim or pod left by a killed test
//! is found by the node directory in its command line or its cgroup root on the next drop.
//!
//! The node's processes use the admin kubeconfig: the Node authorizer is not what these tests
//! look at.

mod config;
pub mod images;
mod pidns;
mod pods;
mod process;
mod service;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node as NodeObject;
use kube::api::Api;
use parking_lot::Mutex;

use crate::controlplane::ControlPlane;

pub use images::{PAUSE_IMAGE, WORKLOAD_IMAGE};
pub use pods::in_netns;
pub use service::KUBERNETES_SERVICE_IP;

/// Where the node's processes see the pods' network namespaces (the chart's `cniNetnsDir`):
/// [`Node::netns_dir`] bound there in the node's mount namespace.
pub const NETNS_DIR_ON_NODE: &str = "/var/run/netns";
/// The pods' subnet on the node's bridge.
pub const POD_SUBNET: &str = "10.244.237.0/24";
/// How long the node may take to register and turn Ready.
const READY_TIMEOUT: Duration = Duration::from_secs(180);
/// Debian's CNI plugins (containernetworking-plugins).
const DEBIAN_CNI: &str = "/usr/lib/cni";

/// Failures starting or driving the node.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("{binary} is missing: {hint}")]
    Missing { binary: PathBuf, hint: &'static str },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} failed ({status}): {stderr}")]
    Command {
        what: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("{what} exited ({status}) during start-up; its log:\n{log}")]
    Exited {
        what: &'static str,
        status: std::process::ExitStatus,
        log: String,
    },
    #[error("{what} within {timeout:?}: {last}; kubelet's log:\n{log}")]
    Timeout {
        what: String,
        timeout: Duration,
        last: String,
        log: String,
    },
}

/// Where `scripts/build-node` puts the binaries.
pub fn binary_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("target")
        .join("node")
}

/// One running node. Dropping it stops and removes everything.
pub struct Node {
    name: String,
    dir: PathBuf,
    socket: PathBuf,
    cni_bin: PathBuf,
    cni_conf: PathBuf,
    bridge: String,
    cgroup_root: String,
    admin_kubeconfig: PathBuf,
    client: kube::Client,
    /// ("kubelet" | "containerd" | "kube-controller-manager" | "kube-scheduler", child)
    children: Mutex<Vec<(&'static str, Child)>>,
    host_dirs_made: Vec<PathBuf>,
    started: Duration,
    service: Option<service::ServiceProxy>,
    /// The PID and mount namespaces containerd and kubelet (and so the pods) run in.
    namespaces: Option<pidns::NodeNamespaces>,
}

/// Host directories at fixed paths: the chart's DaemonSet mounts two, containerd puts its shims'
/// sockets under the third whatever its state dir. Removed at drop when the node made them.
const CHART_HOST_DIRS: [&str; 3] = ["/var/run/istio-cni", "/var/run/ztunnel", "/run/containerd"];

/// Debian's runc, or `NODE_RUNC` (a wrapper that logs, when debugging by hand).
fn runc() -> Result<PathBuf, NodeError> {
    if let Some(p) = std::env::var_os("NODE_RUNC") {
        return Ok(p.into());
    }
    ["/usr/sbin/runc", "/usr/bin/runc", "/sbin/runc"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or(NodeError::Missing {
            binary: "runc".into(),
            hint: "install Debian's runc (scripts/deps-image)",
        })
}

impl Node {
    /// Starts a node registered with `cp` and waits for it to be Ready; `images` are podman
    /// references imported into containerd besides the pause and workload images.
    pub fn start(cp: &ControlPlane, images: &[&str]) -> Result<Node, NodeError> {
        let t0 = Instant::now();
        let bins = binary_dir();
        for b in [
            "kubelet",
            "kube-controller-manager",
            "kube-scheduler",
            "containerd",
        ]
        .into_iter()
        .chain(["containerd-shim-runc-v2", "ctr", "pause", "workload"])
        {
            if !bins.join(b).is_file() {
                return Err(NodeError::Missing {
                    binary: bins.join(b),
                    hint: "build the node with scripts/build-node (needs Go)",
                });
            }
        }
        for plugin in ["bridge", "host-local", "loopback"] {
            let p = Path::new(DEBIAN_CNI).join(plugin);
            if !p.is_file() {
                return Err(NodeError::Missing {
                    binary: p,
                    hint: "install Debian's containernetworking-plugins (scripts/deps)",
                });
            }
        }
        let runc = runc()?;
        let io = |what: String| move |source| NodeError::Io { what, source };
        // Short: containerd's socket path must fit a sockaddr_un.
        let dir = tempfile::Builder::new()
            .prefix("icn-node-")
            .tempdir_in("/tmp")
            .map_err(io("create the node dir".into()))?
            .keep();
        let id = std::process::id();
        let mut node = Node {
            name: format!("node-{id}"),
            socket: dir.join("c.sock"),
            cni_bin: dir.join("cni-bin"),
            cni_conf: dir.join("cni-conf"),
            bridge: format!("icn{}", id % 100_000),
            cgroup_root: format!("/istio-cni-node-{id}"),
            admin_kubeconfig: cp.admin_kubeconfig().to_path_buf(),
            client: cp.client(),
            children: Mutex::new(Vec::new()),
            host_dirs_made: CHART_HOST_DIRS
                .iter()
                .map(PathBuf::from)
                .filter(|p| !p.exists())
                .collect(),
            started: Duration::ZERO,
            service: None,
            namespaces: None,
            dir,
        };
        // From here on a failure drops `node`, which cleans up what was made.
        for d in [&node.cni_bin, &node.cni_conf] {
            std::fs::create_dir_all(d).map_err(io(format!("create {}", d.display())))?;
        }
        for plugin in ["bridge", "host-local", "loopback"] {
            let to = node.cni_bin.join(plugin);
            std::fs::copy(Path::new(DEBIAN_CNI).join(plugin), &to)
                .map_err(io(format!("copy {}", to.display())))?;
        }
        let conflist = config::bridge_conflist(
            "istio-cni-node",
            &node.bridge,
            POD_SUBNET,
            &node.dir.join("ipam"),
        );
        let conf = node.cni_conf.join("10-bridge.conflist");
        std::fs::write(&conf, conflist.to_string())
            .map_err(io(format!("write {}", conf.display())))?;
        process::make_cgroup_root(&node.cgroup_root)?;
        node.service = Some(service::ServiceProxy::start(
            &node.bridge,
            cp.port(),
            &format!("istio-cni-node-{id}"),
        )?);

        node.namespaces = Some(pidns::NodeNamespaces::start(
            &bins.join("pause"),
            &node.netns_dir(),
            &node.dir.join("init.log"),
        )?);
        node.start_containerd(&runc)?;
        let work = node.dir.join("images");
        std::fs::create_dir_all(&work).map_err(io(format!("create {}", work.display())))?;
        images::build_test_images(&bins, &work)?;
        let mut all = vec![PAUSE_IMAGE, WORKLOAD_IMAGE];
        all.extend_from_slice(images);
        images::import(&bins.join("ctr"), &node.socket, &all, &work)?;
        node.start_controllers(cp)?;
        node.start_kubelet()?;
        node.wait_ready(cp)?;
        node.started = t0.elapsed();
        Ok(node)
    }

    /// Starts a node process: containerd and kubelet inside the node's namespaces, the
    /// controllers beside the control plane.
    fn spawn(&self, what: &'static str, command: Command) -> Result<(), NodeError> {
        let log = self.dir.join(format!("{what}.log"));
        let child = match (&self.namespaces, what) {
            (Some(ns), "containerd" | "kubelet") => ns.spawn(command, &log)?,
            _ => process::spawn(command, &log)?,
        };
        self.children.lock().push((what, child));
        Ok(())
    }

    fn start_containerd(&self, runc: &Path) -> Result<(), NodeError> {
        let path = self.dir.join("containerd.toml");
        let layout = config::Layout {
            dir: &self.dir,
            socket: &self.socket,
            cni_bin: &self.cni_bin,
            cni_conf: &self.cni_conf,
            runc,
            sandbox_image: PAUSE_IMAGE,
        };
        std::fs::write(&path, layout.containerd_toml()).map_err(|source| NodeError::Io {
            what: format!("write {}", path.display()),
            source,
        })?;
        let mut c = Command::new(binary_dir().join("containerd"));
        c.arg("--config").arg(&path);
        // Its shim is found on PATH, and the CNI plugins' own tools (ip, iptables) too.
        c.env(
            "PATH",
            format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", binary_dir().display()),
        );
        self.spawn("containerd", c)?;
        self.wait_for("containerd's socket", Duration::from_secs(60), || {
            let ok = Command::new(binary_dir().join("ctr"))
                .arg("--address")
                .arg(&self.socket)
                .arg("version")
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false);
            if ok {
                Ok(())
            } else {
                Err("ctr version fails".into())
            }
        })
    }

    fn start_controllers(&self, cp: &ControlPlane) -> Result<(), NodeError> {
        let kubeconfig = self.admin_kubeconfig.display().to_string();
        let mut kcm = Command::new(binary_dir().join("kube-controller-manager"));
        kcm.arg(format!("--kubeconfig={kubeconfig}"))
            .arg("--leader-elect=false")
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={}", process::free_port()?))
            .arg(format!(
                "--root-ca-file={}",
                cp.dir().join("ca.crt").display()
            ))
            .arg(format!(
                "--service-account-private-key-file={}",
                cp.dir().join("sa.key").display()
            ))
            .arg("--use-service-account-credentials=false")
            .arg("--controllers=*")
            .arg("--v=1");
        self.spawn("kube-controller-manager", kcm)?;
        let mut scheduler = Command::new(binary_dir().join("kube-scheduler"));
        scheduler
            .arg(format!("--kubeconfig={kubeconfig}"))
            .arg(format!("--authentication-kubeconfig={kubeconfig}"))
            .arg(format!("--authorization-kubeconfig={kubeconfig}"))
            .arg("--leader-elect=false")
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={}", process::free_port()?))
            .arg("--v=1");
        self.spawn("kube-scheduler", scheduler)
    }

    fn start_kubelet(&self) -> Result<(), NodeError> {
        let root = self.dir.join("kubelet");
        let path = self.dir.join("kubelet.json");
        let cfg = config::Kubelet {
            socket: &self.socket,
            dir: &self.dir,
            port: process::free_port()?,
            healthz_port: process::free_port()?,
            cgroup_root: &self.cgroup_root,
        };
        std::fs::create_dir_all(&root)
            .and_then(|_| std::fs::write(&path, cfg.config().to_string()))
            .map_err(|source| NodeError::Io {
                what: format!("write {}", path.display()),
                source,
            })?;
        let mut k = Command::new(binary_dir().join("kubelet"));
        k.arg(format!("--config={}", path.display()))
            .arg(format!("--kubeconfig={}", self.admin_kubeconfig.display()))
            .arg(format!("--root-dir={}", root.display()))
            .arg(format!(
                "--cert-dir={}",
                self.dir.join("kubelet-pki").display()
            ))
            .arg(format!("--hostname-override={}", self.name))
            .arg("--v=2");
        k.env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
        self.spawn("kubelet", k)
    }

    fn wait_ready(&self, cp: &ControlPlane) -> Result<(), NodeError> {
        let (client, name) = (self.client.clone(), self.name.clone());
        self.wait_for("the node Ready", READY_TIMEOUT, || {
            let (client, name) = (client.clone(), name.clone());
            let node =
                cp.block_on(async move { Api::<NodeObject>::all(client).get_opt(&name).await });
            match node {
                Ok(Some(n)) => {
                    let ready = n.status.and_then(|s| s.conditions).unwrap_or_default();
                    let ready = ready.iter().find(|c| c.type_ == "Ready");
                    match ready {
                        Some(c) if c.status == "True" => Ok(()),
                        Some(c) => Err(format!(
                            "Ready={} {}",
                            c.status,
                            c.message.clone().unwrap_or_default()
                        )),
                        None => Err("no Ready condition".into()),
                    }
                }
                Ok(None) => Err("not registered".into()),
                Err(e) => Err(e.to_string()),
            }
        })
    }

    /// Polls `check` every 200 ms; a node process exiting fails at once.
    pub(crate) fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut() -> Result<(), String>,
    ) -> Result<(), NodeError> {
        let deadline = Instant::now() + timeout;
        loop {
            for (name, child) in self.children.lock().iter_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(NodeError::Exited {
                        what: name,
                        status,
                        log: process::tail(&self.dir.join(format!("{name}.log")), 30),
                    });
                }
            }
            let last = match check() {
                Ok(()) => return Ok(()),
                Err(last) => last,
            };
            if Instant::now() > deadline {
                return Err(NodeError::Timeout {
                    what: what.to_string(),
                    timeout,
                    last,
                    log: self.log_tail("kubelet", 30),
                });
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The node's name (kubelet's `--hostname-override`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node's directory (logs: `kubelet.log`, `containerd.log`, ...).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CNI conf dir containerd reads (the chart's `cniConfDir`).
    pub fn cni_conf_dir(&self) -> &Path {
        &self.cni_conf
    }

    /// The CNI bin dir containerd runs plugins from (the chart's `cniBinDir`).
    pub fn cni_bin_dir(&self) -> &Path {
        &self.cni_bin
    }

    /// The directory of pod network namespaces, as the test sees it: the node's
    /// `/var/run/netns` ([`NETNS_DIR_ON_NODE`]), where containerd puts them.
    pub fn netns_dir(&self) -> PathBuf {
        self.dir.join("netns")
    }

    /// How long [`Node::start`] took.
    pub fn start_took(&self) -> Duration {
        self.started
    }

    /// The end of one process's log (`kubelet`, `containerd`, ...), for failure messages.
    pub fn log_tail(&self, what: &str, lines: usize) -> String {
        process::tail(&self.dir.join(format!("{what}.log")), lines)
    }

    /// Stops kubelet and containerd (SIGTERM), as a node going down does; the pods' processes
    /// and shims keep running, as they do when only the services stop.
    pub fn stop_runtime(&self) {
        let mut children = self.children.lock();
        for what in ["kubelet", "containerd"] {
            if let Some(i) = children.iter().position(|(w, _)| *w == what) {
                let (_, mut child) = children.remove(i);
                process::stop(&mut child, Duration::from_secs(20));
            }
        }
    }

    /// Starts containerd and kubelet again after [`Node::stop_runtime`] and waits for Ready.
    pub fn start_runtime(&self, cp: &ControlPlane) -> Result<(), NodeError> {
        self.start_containerd(&runc()?)?;
        self.start_kubelet()?;
        self.wait_ready(cp)
    }

    /// `ctr` against this node's containerd in the `k8s.io` namespace.
    pub fn ctr(&self, args: &[&str]) -> Result<String, NodeError> {
        images::run(
            Command::new(binary_dir().join("ctr"))
                .arg("--address")
                .arg(&self.socket)
                .args(["-n", "k8s.io"])
                .args(args),
            &format!("ctr {}", args.join(" ")),
        )
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let mut children = std::mem::take(&mut *self.children.lock());
        if let Some(i) = children.iter().position(|(w, _)| *w == "kubelet") {
            process::stop(&mut children[i].1, Duration::from_secs(10));
        }
        process::kill_leftovers(&self.dir, &self.cgroup_root);
        for (_, child) in children.iter_mut().rev() {
            process::stop(child, Duration::from_secs(10));
        }
        // Shims a stopping containerd had still been starting.
        process::kill_leftovers(&self.dir, &self.cgroup_root);
        // Its pid 1 gone, whatever else runs in the node's namespaces dies.
        self.namespaces = None;
        std::thread::sleep(Duration::from_millis(200));
        process::unmount_under(&self.dir);
        process::remove_cgroup_root(&self.cgroup_root);
        process::remove_cni_cache_entries(&self.dir);
        self.service = None;
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .output();
        if std::env::var_os("NODE_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
            for d in &self.host_dirs_made {
                let _ = std::fs::remove_dir_all(d);
            }
        }
    }
}
