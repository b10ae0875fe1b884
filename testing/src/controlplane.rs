//! A real Kubernetes control plane for tests: etcd and kube-apiserver, built from their Go modules
//! by `scripts/build-controlplane` into `target/controlplane/`, started on loopback ports picked
//! here, serving TLS only with a CA generated at start, `--authorization-mode=Node,RBAC`, the
//! default admission plugins and service-account tokens signed by a key generated at start.
//!
//! No kubelet, scheduler or controller-manager runs: tests create nodes, set pods' `nodeName`
//! themselves and write pod status through the `status` subresource as a kubelet would; a
//! namespace made by [`ControlPlane::create_namespace`] gets its `default` ServiceAccount (the
//! controller-manager's job) so pods can be admitted.
//!
//! One instance per test binary ([`shared`], started on first use; tests keep apart by namespace
//! and node name), or one of a test's own ([`ControlPlane::start`], stopped on drop). The children
//! die with the test process in any case. Missing binaries are a panic naming the build script:
//! no test skips silently.

mod forward;
mod objects;
mod pki;
mod process;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

pub use forward::Forwarder;
pub use objects::{pod_on_node, unique_name};

/// The service-account issuer and the audience of the tokens the API server accepts.
pub const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
/// The cluster IP range services get (its first address is the `kubernetes` service).
pub const SERVICE_CIDR: &str = "10.96.0.0/16";
/// The API server's audit log in the control plane's directory.
const AUDIT_LOG: &str = "audit.log";
/// How long start-up may take before it counts as failed (a loaded 2-core machine is slow).
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Failures starting or using the control plane.
#[derive(Debug, thiserror::Error)]
pub enum ControlPlaneError {
    #[error(
        "{binary} is missing: build the test control plane with scripts/build-controlplane \
         (needs Go >= 1.26)"
    )]
    Missing { binary: PathBuf },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot generate keys and certificates: {0}")]
    Pki(String),
    #[error("{what} exited ({status}) during start-up; its log ends:\n{log}")]
    Exited {
        what: &'static str,
        status: std::process::ExitStatus,
        log: String,
    },
    #[error("kube-apiserver not ready within {timeout:?} ({last}); its log ends:\n{log}")]
    NotReady {
        timeout: Duration,
        last: String,
        log: String,
    },
    #[error("admin client: {0}")]
    Client(String),
    #[error("{call}: {source}")]
    Api {
        call: String,
        #[source]
        source: kube::Error,
    },
}

/// A running etcd + kube-apiserver; dropping it stops both and removes their data.
pub struct ControlPlane {
    url: String,
    port: u16,
    dir: PathBuf,
    ca_pem: String,
    admin_kubeconfig: PathBuf,
    client: kube::Client,
    rt: tokio::runtime::Runtime,
    children: Mutex<Vec<(&'static str, Child)>>,
    start_to_ready: Duration,
    /// Kept for an instance of a test's own; the shared one's dir goes at exit.
    _tmp: Option<tempfile::TempDir>,
}

/// Where `scripts/build-controlplane` puts the binaries.
pub fn binary_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("target")
        .join("controlplane")
}

/// The control plane shared by every test of this test binary, started on first use. Panics (with
/// the cause) when it cannot start, e.g. naming scripts/build-controlplane when Go binaries are
/// missing.
pub fn shared() -> &'static ControlPlane {
    static SHARED: OnceLock<ControlPlane> = OnceLock::new();
    static STARTING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    if let Some(cp) = SHARED.get() {
        return cp;
    }
    // One start at a time, so a failed start is not repeated by every waiting test at once.
    let _one = STARTING.lock().unwrap_or_else(|e| e.into_inner());
    SHARED.get_or_init(|| match ControlPlane::start_inner(false) {
        Ok(cp) => {
            eprintln!(
                "test control plane (etcd + kube-apiserver) ready at {} in {:?}",
                cp.url, cp.start_to_ready
            );
            cp
        }
        Err(e) => panic!("test control plane: {e}"),
    })
}

impl ControlPlane {
    /// A control plane of the caller's own, stopped when dropped.
    pub fn start() -> Result<ControlPlane, ControlPlaneError> {
        Self::start_inner(true)
    }

    fn start_inner(owned: bool) -> Result<ControlPlane, ControlPlaneError> {
        let t0 = Instant::now();
        let bins = binary_dir();
        let (etcd_bin, apiserver_bin) = (bins.join("etcd"), bins.join("kube-apiserver"));
        for binary in [&etcd_bin, &apiserver_bin] {
            if !binary.is_file() {
                return Err(ControlPlaneError::Missing {
                    binary: binary.clone(),
                });
            }
        }
        let tmp = tempfile::Builder::new()
            .prefix("istio-cni-controlplane-")
            .tempdir()
            .map_err(|source| ControlPlaneError::Write {
                path: std::env::temp_dir(),
                source,
            })?;
        let dir = tmp.path().to_path_buf();
        let (tmp, dir) = if owned {
            (Some(tmp), dir)
        } else {
            process::remove_at_exit(&dir);
            (None, tmp.keep())
        };
        let pki = pki::Pki::generate(&dir)?;
        let mut children = Vec::new();
        let started = start_processes(&dir, &pki, &etcd_bin, &apiserver_bin, &mut children);
        let ready = started.and_then(|port| {
            let admin_kubeconfig = dir.join("admin.kubeconfig");
            let url = format!("https://127.0.0.1:{port}");
            objects::write_admin_kubeconfig(&admin_kubeconfig, &url, &pki)?;
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("controlplane-client")
                .enable_all()
                .build()
                .map_err(|e| ControlPlaneError::Client(format!("runtime: {e}")))?;
            let client = rt.block_on(objects::admin_client(&admin_kubeconfig))?;
            wait_ready(&rt, &client, &dir, &mut children)?;
            Ok((port, url, admin_kubeconfig, rt, client))
        });
        let (port, url, admin_kubeconfig, rt, client) = match ready {
            Ok(ready) => ready,
            Err(e) => {
                for (_, child) in &mut children {
                    process::kill(child);
                }
                return Err(e);
            }
        };
        Ok(ControlPlane {
            url,
            port,
            dir,
            ca_pem: pki.ca_pem,
            admin_kubeconfig,
            client,
            rt,
            children: Mutex::new(children),
            start_to_ready: t0.elapsed(),
            _tmp: tmp,
        })
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The API server's loopback port (what `KUBERNETES_SERVICE_PORT` is set to for a client).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The CA that signed the serving certificate (PEM), a pod's `ca.crt`.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A kubeconfig with the admin client certificate (`system:masters`).
    pub fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// The admin kubeconfig as a client config whose server is `https://127.0.0.1:<port>`: a
    /// relay in front of this server (the certificate still names the server).
    pub async fn admin_config_via(&self, port: u16) -> kube::Config {
        let kubeconfig =
            kube::config::Kubeconfig::read_from(&self.admin_kubeconfig).expect("admin kubeconfig");
        let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .expect("admin client config");
        config.cluster_url = format!("https://127.0.0.1:{port}")
            .parse()
            .expect("relay url");
        config
    }

    /// The data and log dir (etcd's data, `etcd.log`, `kube-apiserver.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// How long the start took, from spawning etcd to kube-apiserver's `/readyz` answering 200.
    pub fn start_to_ready(&self) -> Duration {
        self.start_to_ready
    }

    /// The admin client; use it inside [`ControlPlane::block_on`] or a runtime of the caller's.
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// Runs `future` on the control plane's own runtime and waits for it, from sync or async
    /// code alike.
    pub fn block_on<F>(&self, future: F) -> F::Output
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let task = self.rt.spawn(future);
        futures::executor::block_on(task).expect("control plane task panicked")
    }

    /// The requests of `user` the server has answered (from its audit log: one per request,
    /// a watch counted when it starts), in order: (verb, requestURI). `from` skips the first
    /// entries of the whole log (take [`ControlPlane::audit_mark`] before the calls of interest).
    pub fn requests_of(&self, user: &str, from: usize) -> Vec<(String, String)> {
        self.audit_of(user, from)
            .into_iter()
            .map(|e| {
                let field = |k: &str| e[k].as_str().unwrap_or_default().to_string();
                (field("verb"), field("requestURI"))
            })
            .collect()
    }

    /// The audit entries behind [`ControlPlane::requests_of`], as the server wrote them: the
    /// request as its request-info resolver saw it (`verb`, `objectRef`), `responseStatus`, and
    /// the authorizer's `authorization.k8s.io/decision` and `reason` among the `annotations`.
    pub fn audit_of(&self, user: &str, from: usize) -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(self.dir.join(AUDIT_LOG)).unwrap_or_default();
        let mut seen = std::collections::HashSet::new();
        text.lines()
            .skip(from)
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|e| e["user"]["username"] == user)
            .filter(|e| seen.insert(e["auditID"].as_str().unwrap_or_default().to_string()))
            .collect()
    }

    /// The API server on the loopback of the network namespace at `netns` too (for processes
    /// run there, e.g. install-cni in a node netns): see [`Forwarder`]. Call it from a thread in
    /// the host's netns.
    pub fn forward_into(&self, netns: &Path) -> Result<Forwarder, ControlPlaneError> {
        Forwarder::start(netns, self.port)
    }

    /// How many audit entries there are now (see [`ControlPlane::requests_of`]).
    pub fn audit_mark(&self) -> usize {
        std::fs::read_to_string(self.dir.join(AUDIT_LOG))
            .map(|t| t.lines().count())
            .unwrap_or(0)
    }

    /// The end of kube-apiserver's log, for failure messages.
    pub fn apiserver_log_tail(&self, lines: usize) -> String {
        process::tail(&self.dir.join("kube-apiserver.log"), lines)
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        for (_, child) in self.children.lock().iter_mut().rev() {
            process::kill(child);
        }
    }
}

/// Starts etcd, then kube-apiserver against it; returns the API server's port.
fn start_processes(
    dir: &Path,
    pki: &pki::Pki,
    etcd_bin: &Path,
    apiserver_bin: &Path,
    children: &mut Vec<(&'static str, Child)>,
) -> Result<u16, ControlPlaneError> {
    let (client_port, peer_port) = (process::free_port()?, process::free_port()?);
    let client_url = format!("http://127.0.0.1:{client_port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let mut etcd = Command::new(etcd_bin);
    etcd.arg("--name=controlplane")
        .arg(format!("--data-dir={}", dir.join("etcd").display()))
        .arg(format!("--listen-client-urls={client_url}"))
        .arg(format!("--advertise-client-urls={client_url}"))
        .arg(format!("--listen-peer-urls={peer_url}"))
        .arg(format!("--initial-advertise-peer-urls={peer_url}"))
        .arg(format!("--initial-cluster=controlplane={peer_url}"))
        // Its data dies with the test anyway; fsync only slows a loaded machine down.
        .arg("--unsafe-no-fsync")
        .arg("--log-level=warn");
    children.push(("etcd", process::spawn(etcd, &dir.join("etcd.log"))?));

    let port = process::free_port()?;
    let path = |p: &Path| p.display().to_string();
    let audit_policy = dir.join("audit-policy.yaml");
    objects::write(
        &audit_policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\n\
         rules:\n- level: Metadata\n",
    )?;
    let mut apiserver = Command::new(apiserver_bin);
    apiserver
        .arg(format!("--etcd-servers={client_url}"))
        .arg("--bind-address=127.0.0.1")
        .arg("--advertise-address=127.0.0.1")
        .arg(format!("--secure-port={port}"))
        .arg(format!("--cert-dir={}", path(&dir.join("certs"))))
        .arg(format!("--tls-cert-file={}", path(&pki.serving_cert)))
        .arg(format!("--tls-private-key-file={}", path(&pki.serving_key)))
        .arg(format!("--client-ca-file={}", path(&pki.ca_file)))
        .arg("--authorization-mode=Node,RBAC")
        .arg(format!(
            "--service-account-key-file={}",
            path(&pki.service_account_public_key)
        ))
        .arg(format!(
            "--service-account-signing-key-file={}",
            path(&pki.service_account_key)
        ))
        .arg(format!("--service-account-issuer={ISSUER}"))
        .arg(format!("--service-cluster-ip-range={SERVICE_CIDR}"))
        // The endpoint reconciler refuses a loopback address for the `kubernetes` service.
        .arg("--endpoint-reconciler-type=none")
        .arg("--profiling=false")
        // Every request's verb, URI and user, for tests that count or inspect the calls of one
        // user (the test API server's request log, on the real server).
        .arg(format!("--audit-policy-file={}", path(&audit_policy)))
        .arg(format!("--audit-log-path={}", path(&dir.join(AUDIT_LOG))))
        .arg("--audit-log-mode=blocking")
        .arg("--audit-log-format=json")
        .arg("--v=0");
    children.push((
        "kube-apiserver",
        process::spawn(apiserver, &dir.join("kube-apiserver.log"))?,
    ));
    Ok(port)
}

/// Polls `/readyz` with the admin client until it answers 200; a child exiting fails at once.
fn wait_ready(
    rt: &tokio::runtime::Runtime,
    client: &kube::Client,
    dir: &Path,
    children: &mut [(&'static str, Child)],
) -> Result<(), ControlPlaneError> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        for (what, child) in children.iter_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                process::forget(child.id());
                return Err(ControlPlaneError::Exited {
                    what,
                    status,
                    log: process::tail(&dir.join(format!("{what}.log")), 40),
                });
            }
        }
        let request = http::Request::get("/readyz").body(Vec::new());
        let answer = match request {
            Ok(request) => rt.block_on(async {
                tokio::time::timeout(Duration::from_secs(5), client.request_text(request)).await
            }),
            Err(e) => return Err(ControlPlaneError::Client(e.to_string())),
        };
        let last = match answer {
            Ok(Ok(text)) if text.trim() == "ok" => return Ok(()),
            Ok(Ok(text)) => text,
            Ok(Err(e)) => e.to_string(),
            Err(_) => "/readyz timed out".into(),
        };
        if Instant::now() > deadline {
            return Err(ControlPlaneError::NotReady {
                timeout: READY_TIMEOUT,
                last,
                log: process::tail(&dir.join("kube-apiserver.log"), 40),
            });
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
