//! One node agent of either build for the side-by-side benchmarks: Istio's `install-cni`
//! (target/istio, scripts/build-istio) or ours (`$ISTIO_CNI_RS_BIN`), each in a network namespace
//! of its own (so Istio's fixed readiness and monitoring ports never meet another agent's) with
//! the real API server on that namespace's loopback at the server's own port (a relay that counts
//! the bytes the server sends), its own ServiceAccount token, and its own conf, bin and run dirs.
//!
//! Istio's binary reads fixed paths (conf and bin dirs under `/host`, its plugin at
//! `/opt/cni/bin/istio-cni`, the service account under `/var/run/secrets`), so it runs chrooted
//! into a root of its own (it is static; in sidecar mode it needs nothing else of the machine).
//! Ours gets the same places through its path settings. Both run with the same settings
//! otherwise; CPU and memory are read from the agent's own `/proc/<pid>` (nsenter and chroot
//! exec it, so the pid spawned is the agent's).
#![allow(dead_code)]

use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use istio_cni_testing::controlplane::{ControlPlane, Forwarder};
use istio_cni_testing::istio::istio_bin;

pub use crate::cluster::{apiserver_pid, proc_cpu};
use serde_json::json;

use crate::cni_driver::NetnsGuard;

/// Which build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Istio,
    Ours,
}

impl Side {
    pub fn name(self) -> &'static str {
        match self {
            Side::Istio => "Istio",
            Side::Ours => "ours",
        }
    }
}

/// The readiness port inside every agent's own netns (Istio's is fixed there).
pub const READY_PORT: u16 = 8000;

/// The binary under test for our side.
pub fn our_bin() -> PathBuf {
    crate::cni_driver::binary()
}

/// Files shared by many agents of one run: the binaries copied once into the run's temp dir, so
/// each agent's root takes a hard link instead of a copy.
pub struct Shared {
    pub tmp: tempfile::TempDir,
    pub istio_install: PathBuf,
    /// The file Istio's install-cni installs as its plugin (the real one, or a stand-in when
    /// `real_plugin` is false: many agents copying 80 MB each would measure the disk).
    pub istio_plugin: PathBuf,
    pub namespace: String,
}

impl Shared {
    pub fn new(cp: &ControlPlane, real_plugin: bool) -> Shared {
        let tmp = tempfile::tempdir().expect("tempdir");
        let istio_install = tmp.path().join("istio-install-cni");
        std::fs::copy(istio_bin("install-cni"), &istio_install).expect("copy install-cni");
        let istio_plugin = tmp.path().join("istio-plugin");
        if real_plugin {
            std::fs::copy(istio_bin("istio-cni"), &istio_plugin).expect("copy istio-cni");
        } else {
            std::fs::write(&istio_plugin, b"#!/bin/false\n").expect("stand-in plugin");
        }
        let namespace = istio_cni_testing::controlplane::unique_name("bench-agents");
        cp.create_namespace(&namespace, &[]);
        Shared {
            tmp,
            istio_install,
            istio_plugin,
            namespace,
        }
    }
}

/// One running agent.
pub struct BenchAgent {
    pub side: Side,
    pub user: String,
    pub netns: NetnsGuard,
    pub relay: Forwarder,
    pub root: PathBuf,
    pub net_dir: PathBuf,
    pub run_dir: PathBuf,
    pub bin_dir: PathBuf,
    pub child: Child,
    pub lines: Arc<Mutex<Vec<String>>>,
    pub spawned: Instant,
}

/// The ServiceAccount `name` in the shared namespace, bound to cluster-admin (both builds get
/// the same rights, so neither pays for a refusal), and a bound token of it.
pub fn account(cp: &ControlPlane, shared: &Shared, name: &str) -> (String, String) {
    let ns = &shared.namespace;
    cp.create(&json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": name, "namespace": ns}}));
    cp.create(&json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": format!("{ns}-{name}")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]}));
    let token = cp.token(ns, name, Duration::from_secs(24 * 3600));
    (format!("system:serviceaccount:{ns}:{name}"), token)
}

fn write(path: &Path, content: &[u8]) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, content).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

impl BenchAgent {
    /// Starts one agent of `side` named `name` (its account too) with `settings` on top of the
    /// common ones, after `conf_files` are put into its conf dir.
    pub fn start(
        cp: &ControlPlane,
        shared: &Shared,
        side: Side,
        name: &str,
        settings: &[(&str, &str)],
        conf_files: &[(&str, String)],
    ) -> BenchAgent {
        let (user, token) = account(cp, shared, name);
        let netns = NetnsGuard::new("ag");
        netns.ip("link set lo up");
        let relay = Forwarder::start_at(&netns.path(), cp.port(), cp.port()).expect("relay");
        let root = shared.tmp.path().join(name);
        let (net_dir, run_dir, bin_dir, sa) = match side {
            Side::Istio => (
                root.join("host/etc/cni/net.d"),
                root.join("var/run/istio-cni"),
                root.join("host/opt/cni/bin"),
                root.join("var/run/secrets/kubernetes.io/serviceaccount"),
            ),
            Side::Ours => (
                root.join("net"),
                root.join("run"),
                root.join("bin"),
                root.join("sa"),
            ),
        };
        for d in [&net_dir, &run_dir, &bin_dir, &sa, &root.join("tmp")] {
            std::fs::create_dir_all(d).expect("mkdir");
        }
        write(&sa.join("token"), token.as_bytes());
        write(&sa.join("ca.crt"), cp.ca_pem().as_bytes());
        write(&sa.join("namespace"), shared.namespace.as_bytes());
        for (file, text) in conf_files {
            write(&net_dir.join(file), text.as_bytes());
        }
        let port = cp.port().to_string();
        let mut env: Vec<(String, String)> = [
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1"),
            ("KUBERNETES_SERVICE_PORT", port.as_str()),
            ("POD_NAMESPACE", shared.namespace.as_str()),
            ("MONITORING_PORT", "15014"),
        ]
        .into_iter()
        .chain(settings.iter().copied())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", netns.path().display()));
        match side {
            Side::Istio => {
                write(&root.join("opt/cni/bin/istio-cni"), b"");
                std::fs::remove_file(root.join("opt/cni/bin/istio-cni")).expect("rm");
                std::fs::hard_link(&shared.istio_plugin, root.join("opt/cni/bin/istio-cni"))
                    .expect("link istio's plugin");
                std::fs::hard_link(&shared.istio_install, root.join("install-cni"))
                    .expect("link istio's install-cni");
                cmd.arg("chroot").arg(&root).arg("/install-cni");
            }
            Side::Ours => {
                // kube-rs's in-cluster config reads the fixed service-account path; a kubeconfig
                // with the same token, CA and server is what our tests give it instead.
                let kubeconfig = root.join("kubeconfig");
                cp.write_kubeconfig(&kubeconfig, &token);
                env.push(("KUBECONFIG".into(), kubeconfig.display().to_string()));
                let path = |p: &Path| p.display().to_string();
                env.extend([
                    ("MOUNTED_CNI_NET_DIR".to_string(), path(&net_dir)),
                    ("CNI_BIN_DIRS".into(), path(&bin_dir)),
                    ("CNI_AGENT_RUN_DIR".into(), path(&run_dir)),
                    ("SERVICE_ACCOUNT_DIR".into(), path(&sa)),
                    ("HEALTH_PORT".into(), READY_PORT.to_string()),
                ]);
                cmd.arg(our_bin()).arg("install-cni");
            }
        }
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let spawned = Instant::now();
        let mut child = cmd.spawn().expect("spawn the agent");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let streams: [Option<Box<dyn Read + Send>>; 2] = [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        ];
        for stream in streams.into_iter().flatten() {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for l in std::io::BufReader::new(stream)
                    .lines()
                    .map_while(Result::ok)
                {
                    lines.lock().expect("lines").push(l);
                }
            });
        }
        BenchAgent {
            side,
            user,
            netns,
            relay,
            root,
            net_dir,
            run_dir,
            bin_dir,
            child,
            lines,
            spawned,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn output(&self) -> String {
        self.lines.lock().expect("lines").join("\n")
    }

    /// Whether `/readyz` answers 200 inside the agent's netns.
    pub fn ready(&self) -> bool {
        let file = std::fs::File::open(self.netns.path()).expect("open netns");
        std::thread::spawn(move || {
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).ok()?;
            let mut s = std::net::TcpStream::connect(("127.0.0.1", READY_PORT)).ok()?;
            s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
            s.write_all(b"GET /readyz HTTP/1.0\r\nHost: localhost\r\n\r\n")
                .ok()?;
            let mut text = String::new();
            s.read_to_string(&mut text).ok()?;
            Some(text.starts_with("HTTP/1.1 200") || text.starts_with("HTTP/1.0 200"))
        })
        .join()
        .ok()
        .flatten()
        .unwrap_or(false)
    }

    /// Waits for readiness; the time from spawn to the first 200. Panics with the log on a
    /// timeout or an early exit.
    pub fn wait_ready(&mut self, timeout: Duration) -> Duration {
        let deadline = Instant::now() + timeout;
        loop {
            if self.ready() {
                return self.spawned.elapsed();
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!(
                    "{} agent exited ({st}) before ready:\n{}",
                    self.side.name(),
                    self.output()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{} agent not ready within {timeout:?}:\n{}",
                self.side.name(),
                self.output()
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// CPU (user + system) of the agent and its reaped children so far.
    pub fn cpu(&self) -> Duration {
        proc_cpu(self.pid())
    }

    /// Resident memory now, MB.
    pub fn rss_mb(&self) -> f64 {
        crate::install_support::proc_status_kb(self.pid(), "VmRSS").unwrap_or(0) as f64 / 1024.0
    }

    pub fn stop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for BenchAgent {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
