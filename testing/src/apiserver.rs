//! A small Kubernetes API server for tests and the demo: pods and namespaces over HTTPS (a CA
//! generated at start, handed out in kubeconfigs; plain HTTP as an option) on loopback, speaking the real wire format (k8s-openapi objects, `List`s with a resourceVersion,
//! newline-delimited watch events, `Status` errors), with fault injection at run time.
//!
//! Behaviour copied from a real API server because clients depend on it: a global resourceVersion
//! bumped by every change; watches that replay from a resourceVersion and answer an `ERROR` event
//! with `410 Expired` once it is compacted away; selector-aware watch events (an object that
//! starts or stops matching arrives as ADDED/DELETED); `pods/status` patches keep `spec` and main
//! resource patches keep `status`; no-op patches change nothing; delete preconditions.
//!
//! Control endpoints under `/testserver/` (used when it runs as the `test-apiserver` process) are
//! exempt from faults, auth and the request log; see `docs/architecture-kube.md`.
//!
//! This file holds the handle and its start/stop; the object store is `store`'s, faults `fault`'s,
//! the kubeconfig `kubeconfig`'s and the HTTP side `http`'s.

mod fault;
mod http;
mod kubeconfig;
mod role;
mod selector;
mod store;
mod tls;
mod uid;

pub use role::main;

use parking_lot::Mutex;
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Namespace, Pod};
use serde_json::Value;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

pub use fault::{Fault, FaultKind};
use http::{is_true, parse_query, router};
use kubeconfig::write_kubeconfig;
use selector::Kind;
use store::{Change, Store, validate};

/// The bearer token the server expects unless told otherwise.
pub const DEFAULT_TOKEN: &str = "istio-cni-test-token";

/// How many requests the log keeps (oldest dropped first).
const REQUEST_LOG_LIMIT: usize = 10_000;

/// Failures of the test server itself (not of the API calls it serves).
#[derive(Debug, thiserror::Error)]
pub enum TestServerError {
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write kubeconfig {path}: {source}")]
    WriteKubeconfig {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read fixtures {path}: {source}")]
    ReadFixtures {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid object: {0}")]
    InvalidObject(String),
    #[error("cannot write the CA to {path}: {source}")]
    WriteCa {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot set up TLS: {0}")]
    Tls(String),
    #[error("{kind} {key} not found")]
    NotFound { kind: &'static str, key: String },
}

/// One request as the server saw it, for assertions.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RequestRecord {
    pub method: String,
    pub path: String,
    /// The raw (still percent-encoded) query string, "" when absent.
    pub query: String,
    /// The bearer token sent, if any.
    pub token: Option<String>,
    /// The `Accept-Encoding` header sent, if any (the server itself never compresses).
    pub accept_encoding: Option<String>,
}

impl RequestRecord {
    /// True for list/watch requests carrying `watch=true`/`watch=1`.
    pub fn is_watch(&self) -> bool {
        parse_query(&self.query)
            .get("watch")
            .is_some_and(|v| is_true(v))
    }

    /// The decoded value of one query parameter.
    pub fn query_param(&self, name: &str) -> Option<String> {
        parse_query(&self.query).remove(name)
    }
}

/// Start-up settings; `Default` = any free port, token required, bookmarks every 2 s.
#[derive(Debug, Clone)]
pub struct TestServerOptions {
    /// 0 picks a free port.
    pub port: u16,
    /// The bearer token clients must send; `None` accepts anonymous requests.
    pub token: Option<String>,
    /// How often watches that asked for bookmarks get one.
    pub bookmark_interval: Duration,
    /// How many changes are kept for watch replay before older resourceVersions expire (410).
    pub history_limit: usize,
    /// Serve HTTPS with a CA generated at start (the default, as every cluster does); `false`
    /// serves plain HTTP.
    pub tls: bool,
    /// With `tls`: the serving certificate expired long ago (its CA is still handed out), so
    /// clients must refuse it.
    pub expired_certificate: bool,
    /// Streams a watch's initial state when asked (`sendInitialEvents`), as a server with the
    /// WatchList feature does; `false` refuses such a watch with 422, as one without it does.
    pub streaming_lists: bool,
}

impl Default for TestServerOptions {
    fn default() -> Self {
        TestServerOptions {
            port: 0,
            token: Some(DEFAULT_TOKEN.to_string()),
            bookmark_interval: Duration::from_secs(2),
            history_limit: 1000,
            tls: true,
            expired_certificate: false,
            streaming_lists: true,
        }
    }
}

/// The serving loop of one generation (stopped by `Down`, restarted on the same port).
struct Running {
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

struct Shared {
    addr: SocketAddr,
    tls: Option<tls::TestTls>,
    /// GETs of single pods, by the pod's `spec.nodeName` ("" when unscheduled or not found).
    pod_gets: Mutex<BTreeMap<String, u64>>,
    options: TestServerOptions,
    store: Mutex<Store>,
    token: Mutex<Option<String>>,
    faults: Mutex<Vec<Fault>>,
    requests: Mutex<Vec<RequestRecord>>,
    /// core/v1 Events created by clients (kept apart: nothing lists or watches them here).
    events: Mutex<Vec<Value>>,
    /// Bumped on every request and every change, so tests can wait for a condition.
    activity: tokio::sync::watch::Sender<u64>,
    /// Cancelled when the current generation stops; watches and delays end with it.
    generation: Mutex<CancellationToken>,
    running: tokio::sync::Mutex<Option<Running>>,
}

/// Handle to a running test API server. Dropping it stops the server.
pub struct TestApiServer {
    shared: Arc<Shared>,
}

impl TestApiServer {
    /// Starts on 127.0.0.1 with a free port and the default token.
    pub async fn start() -> Result<Self, TestServerError> {
        Self::start_with(TestServerOptions::default()).await
    }

    /// For synchronous tests: a server on a one-worker runtime of its own. The runtime must
    /// live as long as the server (it runs the connections); the listener belongs to the netns
    /// of the calling thread.
    pub fn start_blocking() -> (Self, tokio::runtime::Runtime) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("test API server runtime");
        let server = rt.block_on(Self::start()).expect("test API server");
        (server, rt)
    }

    pub async fn start_with(options: TestServerOptions) -> Result<Self, TestServerError> {
        let requested = SocketAddr::from(([127, 0, 0, 1], options.port));
        let listener = bind(requested)?;
        let addr = listener
            .local_addr()
            .map_err(|source| TestServerError::Listen {
                addr: requested,
                source,
            })?;
        let tls = if options.tls {
            Some(tls::TestTls::generate(options.expired_certificate)?)
        } else {
            None
        };
        let (events, _) = broadcast::channel(1024);
        let (activity, _) = tokio::sync::watch::channel(0u64);
        let shared = Arc::new(Shared {
            addr,
            tls,
            pod_gets: Mutex::new(BTreeMap::new()),
            store: Mutex::new(Store {
                resource_version: 1,
                objects: BTreeMap::new(),
                history: VecDeque::new(),
                compacted_through: 0,
                history_limit: options.history_limit.max(1),
                events,
                activity: activity.clone(),
            }),
            activity,
            token: Mutex::new(options.token.clone()),
            options,
            faults: Mutex::new(Vec::new()),
            requests: Mutex::new(Vec::new()),
            events: Mutex::new(Vec::new()),
            generation: Mutex::new(CancellationToken::new()),
            running: tokio::sync::Mutex::new(None),
        });
        let running = shared.serve(listener);
        *shared.running.lock().await = Some(running);
        Ok(TestApiServer { shared })
    }

    /// `https://127.0.0.1:<port>` (`http://` when started without TLS).
    pub fn url(&self) -> String {
        let scheme = if self.shared.tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.shared.addr)
    }

    /// The CA clients must trust, PEM (`None` for plain HTTP).
    pub fn ca_pem(&self) -> Option<String> {
        self.shared.tls.as_ref().map(|t| t.ca_pem.clone())
    }

    /// How many single-pod GETs (`/api/v1/namespaces/{ns}/pods/{name}`, any subresource) asked
    /// for pods scheduled on `node`.
    pub fn pod_gets_on_node(&self, node: &str) -> u64 {
        self.shared.pod_gets.lock().get(node).copied().unwrap_or(0)
    }

    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// The token clients must send (`None`: anonymous is accepted).
    pub fn token(&self) -> Option<String> {
        self.shared.token.lock().clone()
    }

    /// Changes the accepted token, e.g. to test a rotated service-account token.
    pub fn set_token(&self, token: Option<&str>) {
        *self.shared.token.lock() = token.map(str::to_string);
    }

    /// Creates or replaces a pod (ADDED or MODIFIED for watchers); returns it as stored.
    pub fn add_pod(&self, pod: Pod) -> Result<Pod, TestServerError> {
        self.shared.upsert(Kind::Pod, to_value(&pod)?)
    }

    pub fn add_namespace(&self, namespace: Namespace) -> Result<Namespace, TestServerError> {
        self.shared.upsert(Kind::Namespace, to_value(&namespace)?)
    }

    /// Replaces an existing pod (MODIFIED); `NotFound` if there is none.
    pub fn update_pod(&self, pod: Pod) -> Result<Pod, TestServerError> {
        let namespace = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let name = pod.metadata.name.clone().unwrap_or_default();
        if self.pod(&namespace, &name).is_none() {
            return Err(TestServerError::NotFound {
                kind: "pod",
                key: format!("{namespace}/{name}"),
            });
        }
        self.add_pod(pod)
    }

    /// Deletes a pod (DELETED for watchers); returns its final state.
    pub fn delete_pod(&self, namespace: &str, name: &str) -> Option<Pod> {
        let key = (Kind::Pod, namespace.to_string(), name.to_string());
        let deleted = self.shared.delete(key)?;
        serde_json::from_value(deleted).ok()
    }

    pub fn delete_namespace(&self, name: &str) -> Option<Namespace> {
        let key = (Kind::Namespace, String::new(), name.to_string());
        let deleted = self.shared.delete(key)?;
        serde_json::from_value(deleted).ok()
    }

    pub fn pod(&self, namespace: &str, name: &str) -> Option<Pod> {
        let key = (Kind::Pod, namespace.to_string(), name.to_string());
        let object = self.shared.store.lock().objects.get(&key).cloned()?;
        serde_json::from_value(object).ok()
    }

    pub fn namespace(&self, name: &str) -> Option<Namespace> {
        let key = (Kind::Namespace, String::new(), name.to_string());
        let object = self.shared.store.lock().objects.get(&key).cloned()?;
        serde_json::from_value(object).ok()
    }

    /// The current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.store.lock().resource_version
    }

    /// Forgets the change history: watches from any earlier resourceVersion get `410 Expired`
    /// (what etcd compaction does). Open watches go on; to force a client to resume from an old
    /// version, take the server down, change something, compact, and bring it back.
    pub fn compact(&self) {
        self.shared.compact();
    }

    /// Replaces all faults with this one (`Down` stops the listener).
    pub async fn set_fault(&self, fault: Fault) {
        self.shared.faults.lock().clear();
        self.add_fault(fault).await;
    }

    /// Adds a fault next to the ones already active.
    pub async fn add_fault(&self, fault: Fault) {
        if fault.kind == FaultKind::Down {
            self.stop().await;
        } else {
            self.shared.faults.lock().push(fault);
        }
    }

    /// Removes every fault and listens again if the server was down.
    pub async fn clear_faults(&self) {
        self.shared.faults.lock().clear();
        // A failed re-bind leaves it down; the next request then shows connection refused.
        let _ = self.restart().await;
    }

    /// Stops listening and closes every connection (clients then see connection refused).
    pub async fn stop(&self) {
        self.shared.stop().await;
    }

    /// Listens again on the same port (no-op when running).
    pub async fn restart(&self) -> Result<(), TestServerError> {
        self.shared.restart().await
    }

    /// Every API request so far (control endpoints excluded), oldest first.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared.requests.lock().clone()
    }

    /// Events clients created (`POST /api/v1/namespaces/{ns}/events`), oldest first.
    pub fn events(&self) -> Vec<Event> {
        self.shared
            .events
            .lock()
            .iter()
            .filter_map(|e| serde_json::from_value(e.clone()).ok())
            .collect()
    }

    /// Waits until `condition` holds, re-checking after every request and every change; false
    /// after `timeout`. E.g. `server.wait_until(t, || server.pod("ns", "p").is_some_and(..))`.
    pub async fn wait_until(&self, timeout: Duration, condition: impl Fn() -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        // Subscribing before checking means no change between the two is missed.
        let mut activity = self.shared.activity.subscribe();
        loop {
            if condition() {
                return true;
            }
            match tokio::time::timeout_at(deadline, activity.changed()).await {
                Ok(Ok(())) => {}
                // Timed out, or the server is gone: one last look.
                Ok(Err(_)) | Err(_) => return condition(),
            }
        }
    }

    /// Waits for the first logged request matching `matches` (including earlier ones).
    pub async fn wait_for_request(
        &self,
        timeout: Duration,
        matches: impl Fn(&RequestRecord) -> bool,
    ) -> Option<RequestRecord> {
        let found = || {
            self.shared
                .requests
                .lock()
                .iter()
                .find(|r| matches(r))
                .cloned()
        };
        if self.wait_until(timeout, || found().is_some()).await {
            found()
        } else {
            None
        }
    }

    pub fn clear_requests(&self) {
        self.shared.requests.lock().clear();
    }

    /// Writes a kubeconfig pointing here, in the layout install-cni writes (cluster `local`,
    /// user `istio-cni`, context `istio-cni-context`, embedded token).
    /// With TLS the CA is embedded as `certificate-authority-data`.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<(), TestServerError> {
        write_kubeconfig(
            path,
            &self.url(),
            self.token().as_deref(),
            self.ca_pem().as_deref(),
        )
    }

    /// Loads a fixtures file: a JSON array of Pods/Namespaces, or a Kubernetes List of them.
    pub fn load_fixtures(&self, path: &Path) -> Result<usize, TestServerError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| TestServerError::ReadFixtures {
                path: path.to_path_buf(),
                source,
            })?;
        let value: Value = serde_json::from_str(&text)
            .map_err(|e| TestServerError::InvalidObject(format!("{}: {e}", path.display())))?;
        self.shared.load_objects(value)
    }

    /// Stops the server and waits for it to finish.
    pub async fn shutdown(self) {
        self.shared.stop().await;
    }
}

impl Drop for TestApiServer {
    fn drop(&mut self) {
        self.shared.generation.lock().cancel();
    }
}

fn to_value<T: serde::Serialize>(object: &T) -> Result<Value, TestServerError> {
    serde_json::to_value(object).map_err(|e| TestServerError::InvalidObject(e.to_string()))
}

/// Binds with SO_REUSEADDR so a restart can take the same port back right away.
fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, TestServerError> {
    let listen_error = |source| TestServerError::Listen { addr, source };
    let socket = tokio::net::TcpSocket::new_v4().map_err(listen_error)?;
    socket.set_reuseaddr(true).map_err(listen_error)?;
    socket.bind(addr).map_err(listen_error)?;
    socket.listen(1024).map_err(listen_error)
}

impl Shared {
    /// Starts serving one generation; the caller stores the result in `running`.
    fn serve(self: &Arc<Self>, listener: tokio::net::TcpListener) -> Running {
        let cancel = CancellationToken::new();
        *self.generation.lock() = cancel.clone();
        let app = router(self.clone());
        let shutdown = cancel.clone();
        let listener = match &self.tls {
            Some(tls) => Err(tls.listener(listener, cancel.clone())),
            None => Ok(listener),
        };
        let task = tokio::spawn(async move {
            // Serving ends only on shutdown; an accept error is not something a test can fix.
            let _ = match listener {
                Err(tls) => {
                    axum::serve(tls, app)
                        .with_graceful_shutdown(async move { shutdown.cancelled().await })
                        .await
                }
                Ok(listener) => {
                    axum::serve(listener, app)
                        .with_graceful_shutdown(async move { shutdown.cancelled().await })
                        .await
                }
            };
        });
        Running { cancel, task }
    }

    async fn stop(&self) {
        let Some(running) = self.running.lock().await.take() else {
            return;
        };
        running.cancel.cancel();
        // Graceful shutdown drops the listener first; watches and delays end on the token, so
        // this is quick. Bounded anyway so a stuck connection cannot hang a test.
        let mut task = running.task;
        if tokio::time::timeout(Duration::from_secs(2), &mut task)
            .await
            .is_err()
        {
            task.abort();
        }
    }

    async fn restart(self: &Arc<Self>) -> Result<(), TestServerError> {
        // Held across bind so two restarts cannot race for the port.
        let mut running = self.running.lock().await;
        if running.is_none() {
            *running = Some(self.serve(bind(self.addr)?));
        }
        Ok(())
    }
}
