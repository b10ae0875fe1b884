//! A small Kubernetes API server for tests and the demo: pods and namespaces over plain HTTP on
//! loopback, speaking the real wire format (k8s-openapi objects, `List`s with a resourceVersion,
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

mod selector;

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use k8s_openapi::api::core::v1::{Event, Namespace, Pod};
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use selector::{FieldSelector, Kind, LabelSelector};

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
    #[error("{kind} {key} not found")]
    NotFound { kind: &'static str, key: String },
}

/// What to break, for how long and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultKind {
    /// Stop listening: connects are refused until `clear_faults`/`restart` (same port).
    Down,
    /// Hold every response back this long.
    Delay(Duration),
    /// Answer with this HTTP code and a matching `Status` (403 Forbidden, 500 InternalError, ...).
    Fail(u16),
}

/// One injected fault: a kind, an optional request-path prefix, an optional number of requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub kind: FaultKind,
    /// Only requests whose path starts with this are affected (`None` = all). Ignored for `Down`.
    pub path_prefix: Option<String>,
    /// Affect only this many matching requests, then vanish (`None` = until cleared).
    pub times: Option<u32>,
}

impl Fault {
    pub fn down() -> Self {
        Fault::new(FaultKind::Down)
    }

    pub fn slow(delay: Duration) -> Self {
        Fault::new(FaultKind::Delay(delay))
    }

    pub fn fail(code: u16) -> Self {
        Fault::new(FaultKind::Fail(code))
    }

    pub fn on_path(mut self, prefix: &str) -> Self {
        self.path_prefix = Some(prefix.to_string());
        self
    }

    pub fn times(mut self, count: u32) -> Self {
        self.times = Some(count);
        self
    }

    fn new(kind: FaultKind) -> Self {
        Fault {
            kind,
            path_prefix: None,
            times: None,
        }
    }
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
}

impl Default for TestServerOptions {
    fn default() -> Self {
        TestServerOptions {
            port: 0,
            token: Some(DEFAULT_TOKEN.to_string()),
            bookmark_interval: Duration::from_secs(2),
            history_limit: 1000,
        }
    }
}

/// One stored change, fanned out to watchers. `before`/`after` carry the change's
/// resourceVersion already (a deletion's `before` is the final state, as in a DELETED event).
#[derive(Debug)]
struct Change {
    resource_version: u64,
    kind: Kind,
    before: Option<Value>,
    after: Option<Value>,
}

type ObjectKey = (Kind, String, String);

struct Store {
    resource_version: u64,
    objects: BTreeMap<ObjectKey, Value>,
    history: VecDeque<Arc<Change>>,
    /// Watches must start at or after this resourceVersion; older ones get 410 Expired.
    compacted_through: u64,
    history_limit: usize,
    next_uid: u64,
    events: broadcast::Sender<Arc<Change>>,
}

impl Store {
    /// Applies a change (create/replace with `Some`, delete with `None`), bumps the global
    /// resourceVersion and tells the watchers. Returns the stored object (or the deleted one).
    fn commit(&mut self, key: ObjectKey, after: Option<Value>) -> Option<Value> {
        self.resource_version += 1;
        let rv = self.resource_version.to_string();
        let stamp = |mut object: Value| {
            if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.insert("resourceVersion".into(), Value::String(rv.clone()));
            }
            object
        };
        let before = self.objects.remove(&key);
        let after = after.map(stamp);
        let before = match (&after, before) {
            (None, Some(deleted)) => Some(stamp(deleted)),
            (_, before) => before,
        };
        if let Some(object) = &after {
            self.objects.insert(key.clone(), object.clone());
        }
        let change = Arc::new(Change {
            resource_version: self.resource_version,
            kind: key.0,
            before: before.clone(),
            after: after.clone(),
        });
        self.history.push_back(change.clone());
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.compacted_through = old.resource_version;
            }
        }
        // No receivers is fine: nobody watches yet.
        let _ = self.events.send(change);
        after.or(before)
    }

    fn new_uid(&mut self) -> String {
        self.next_uid += 1;
        format!("00000000-0000-4000-8000-{:012x}", self.next_uid)
    }

    /// Fills what the API server would on create: namespace, uid, creationTimestamp.
    fn admit(&mut self, kind: Kind, mut object: Value) -> Result<(ObjectKey, Value), String> {
        let uid = self.new_uid();
        let meta = object
            .get_mut("metadata")
            .and_then(Value::as_object_mut)
            .ok_or("object has no metadata")?;
        let name = meta
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or("object has no metadata.name")?
            .to_string();
        let namespace = match kind {
            Kind::Pod => {
                let ns = meta
                    .get("namespace")
                    .and_then(Value::as_str)
                    .filter(|n| !n.is_empty())
                    .unwrap_or("default")
                    .to_string();
                meta.insert("namespace".into(), Value::String(ns.clone()));
                ns
            }
            Kind::Namespace => String::new(),
        };
        meta.entry("uid").or_insert(Value::String(uid));
        meta.entry("creationTimestamp")
            .or_insert(Value::String("2026-01-01T00:00:00Z".into()));
        Ok(((kind, namespace, name), object))
    }
}

/// The serving loop of one generation (stopped by `Down`, restarted on the same port).
struct Running {
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

struct Shared {
    addr: SocketAddr,
    options: TestServerOptions,
    store: Mutex<Store>,
    token: Mutex<Option<String>>,
    faults: Mutex<Vec<Fault>>,
    requests: Mutex<Vec<RequestRecord>>,
    /// core/v1 Events created by clients (kept apart: nothing lists or watches them here).
    events: Mutex<Vec<Value>>,
    /// Cancelled when the current generation stops; watches and delays end with it.
    generation: Mutex<CancellationToken>,
    running: tokio::sync::Mutex<Option<Running>>,
}

/// Locks a std mutex; a panicked holder leaves plain data behind, still fine to use in a test.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
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

    pub async fn start_with(options: TestServerOptions) -> Result<Self, TestServerError> {
        let requested = SocketAddr::from(([127, 0, 0, 1], options.port));
        let listener = bind(requested)?;
        let addr = listener
            .local_addr()
            .map_err(|source| TestServerError::Listen {
                addr: requested,
                source,
            })?;
        let (events, _) = broadcast::channel(1024);
        let shared = Arc::new(Shared {
            addr,
            store: Mutex::new(Store {
                resource_version: 1,
                objects: BTreeMap::new(),
                history: VecDeque::new(),
                compacted_through: 0,
                history_limit: options.history_limit.max(1),
                next_uid: 0,
                events,
            }),
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

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.shared.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// The token clients must send (`None`: anonymous is accepted).
    pub fn token(&self) -> Option<String> {
        lock(&self.shared.token).clone()
    }

    /// Changes the accepted token, e.g. to test a rotated service-account token.
    pub fn set_token(&self, token: Option<&str>) {
        *lock(&self.shared.token) = token.map(str::to_string);
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
        let object = lock(&self.shared.store).objects.get(&key).cloned()?;
        serde_json::from_value(object).ok()
    }

    pub fn namespace(&self, name: &str) -> Option<Namespace> {
        let key = (Kind::Namespace, String::new(), name.to_string());
        let object = lock(&self.shared.store).objects.get(&key).cloned()?;
        serde_json::from_value(object).ok()
    }

    /// The current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        lock(&self.shared.store).resource_version
    }

    /// Forgets the change history: watches from any earlier resourceVersion get `410 Expired`
    /// (what etcd compaction does). Open watches go on; to force a client to resume from an old
    /// version, take the server down, change something, compact, and bring it back.
    pub fn compact(&self) {
        self.shared.compact();
    }

    /// Replaces all faults with this one (`Down` stops the listener).
    pub async fn set_fault(&self, fault: Fault) {
        lock(&self.shared.faults).clear();
        self.add_fault(fault).await;
    }

    /// Adds a fault next to the ones already active.
    pub async fn add_fault(&self, fault: Fault) {
        if fault.kind == FaultKind::Down {
            self.stop().await;
        } else {
            lock(&self.shared.faults).push(fault);
        }
    }

    /// Removes every fault and listens again if the server was down.
    pub async fn clear_faults(&self) {
        lock(&self.shared.faults).clear();
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
        lock(&self.shared.requests).clone()
    }

    /// Events clients created (`POST /api/v1/namespaces/{ns}/events`), oldest first.
    pub fn events(&self) -> Vec<Event> {
        lock(&self.shared.events)
            .iter()
            .filter_map(|e| serde_json::from_value(e.clone()).ok())
            .collect()
    }

    pub fn clear_requests(&self) {
        lock(&self.shared.requests).clear();
    }

    /// Writes a kubeconfig pointing here, in the layout install-cni writes (cluster `local`,
    /// user `istio-cni`, context `istio-cni-context`, embedded token).
    pub fn write_kubeconfig(&self, path: &Path) -> Result<(), TestServerError> {
        write_kubeconfig(path, &self.url(), self.token().as_deref())
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
        lock(&self.shared.generation).cancel();
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
        *lock(&self.generation) = cancel.clone();
        let app = router(self.clone());
        let shutdown = cancel.clone();
        let task = tokio::spawn(async move {
            // Serving ends only on shutdown; an accept error is not something a test can fix.
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move { shutdown.cancelled().await })
                .await;
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

    fn compact(&self) {
        let mut store = lock(&self.store);
        store.history.clear();
        store.compacted_through = store.resource_version;
    }

    fn upsert<T: serde::de::DeserializeOwned>(
        &self,
        kind: Kind,
        object: Value,
    ) -> Result<T, TestServerError> {
        let mut store = lock(&self.store);
        let given = |field: &str| object.pointer(&format!("/metadata/{field}")).is_some();
        let unset: Vec<&str> = ["uid", "creationTimestamp"]
            .into_iter()
            .filter(|field| !given(field))
            .collect();
        let (key, mut object) = store
            .admit(kind, object)
            .map_err(TestServerError::InvalidObject)?;
        // A replacement without its own identity keeps the old one, as an update would; one with
        // another uid stands for a re-created object.
        if let Some(existing) = store.objects.get(&key) {
            for field in unset {
                if let (Some(old), Some(meta)) = (
                    existing.pointer(&format!("/metadata/{field}")).cloned(),
                    object.get_mut("metadata").and_then(Value::as_object_mut),
                ) {
                    meta.insert(field.into(), old);
                }
            }
        }
        validate(kind, &object).map_err(TestServerError::InvalidObject)?;
        let stored = store.commit(key, Some(object)).unwrap_or(Value::Null);
        serde_json::from_value(stored).map_err(|e| TestServerError::InvalidObject(e.to_string()))
    }

    fn delete(&self, key: ObjectKey) -> Option<Value> {
        let mut store = lock(&self.store);
        if !store.objects.contains_key(&key) {
            return None;
        }
        store.commit(key, None)
    }

    fn load_objects(&self, value: Value) -> Result<usize, TestServerError> {
        let (items, list_kind) = match value {
            Value::Array(items) => (items, None),
            Value::Object(mut list) if list.contains_key("items") => {
                let kind = list.get("kind").and_then(Value::as_str).map(str::to_string);
                match list.remove("items") {
                    Some(Value::Array(items)) => (items, kind),
                    _ => return Err(TestServerError::InvalidObject("items is not a list".into())),
                }
            }
            single @ Value::Object(_) => (vec![single], None),
            _ => return Err(TestServerError::InvalidObject("expected objects".into())),
        };
        let count = items.len();
        for item in items {
            // Items of a typed list (PodList) may omit their own kind.
            let kind_name = item
                .get("kind")
                .and_then(Value::as_str)
                .map(str::to_string)
                .or_else(|| {
                    list_kind
                        .as_deref()
                        .and_then(|k| k.strip_suffix("List"))
                        .map(str::to_string)
                });
            match kind_name.as_deref() {
                Some("Pod") => {
                    self.upsert::<Pod>(Kind::Pod, item)?;
                }
                Some("Namespace") => {
                    self.upsert::<Namespace>(Kind::Namespace, item)?;
                }
                other => {
                    return Err(TestServerError::InvalidObject(format!(
                        "unsupported kind {other:?} (only Pod and Namespace)"
                    )));
                }
            }
        }
        Ok(count)
    }

    /// Takes the first fault matching this path, counting down limited ones.
    fn matching_fault(&self, path: &str) -> Option<FaultKind> {
        let mut faults = lock(&self.faults);
        let index = faults
            .iter()
            .position(|f| f.path_prefix.as_deref().is_none_or(|p| path.starts_with(p)))?;
        let kind = faults[index].kind.clone();
        if let Some(times) = faults[index].times.as_mut() {
            *times = times.saturating_sub(1);
            if *times == 0 {
                faults.remove(index);
            }
        }
        Some(kind)
    }
}

/// Checks an object against its k8s-openapi type (and normalises nothing: the JSON is kept).
fn validate(kind: Kind, object: &Value) -> Result<(), String> {
    let result = match kind {
        Kind::Pod => serde_json::from_value::<Pod>(object.clone()).map(|_| ()),
        Kind::Namespace => serde_json::from_value::<Namespace>(object.clone()).map(|_| ()),
    };
    result.map_err(|e| e.to_string())
}

fn write_kubeconfig(path: &Path, url: &str, token: Option<&str>) -> Result<(), TestServerError> {
    // JSON strings are valid YAML scalars, so quoting through serde_json escapes safely.
    let quote = |s: &str| Value::String(s.to_string()).to_string();
    let user = match token {
        Some(token) => format!("    token: {}\n", quote(token)),
        None => "    {}\n".to_string(),
    };
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    server: {server}\n  name: local\n\
         contexts:\n- context:\n    cluster: local\n    user: istio-cni\n  name: istio-cni-context\n\
         current-context: istio-cni-context\npreferences: {{}}\nusers:\n- name: istio-cni\n  user:\n{user}",
        server = quote(url),
    );
    std::fs::write(path, text).map_err(|source| TestServerError::WriteKubeconfig {
        path: path.to_path_buf(),
        source,
    })
}

// ---------------------------------------------------------------------------------------------
// HTTP

fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/api/v1/pods", get(list_or_watch_all_pods))
        .route(
            "/api/v1/namespaces/{ns}/pods",
            get(list_or_watch_namespace_pods),
        )
        .route(
            "/api/v1/namespaces/{ns}/pods/{name}",
            get(get_pod).patch(patch_pod).delete(delete_pod),
        )
        .route(
            "/api/v1/namespaces/{ns}/pods/{name}/status",
            get(get_pod).patch(patch_pod_status),
        )
        .route(
            "/api/v1/namespaces/{ns}/events",
            post(create_event).get(list_events),
        )
        .route("/api/v1/namespaces", get(list_or_watch_namespaces))
        .route("/api/v1/namespaces/{name}", get(get_namespace))
        .route("/testserver/objects", post(control_add_objects))
        .route(
            "/testserver/fault",
            post(control_set_fault).delete(control_clear_faults),
        )
        .route("/testserver/requests", get(control_requests))
        .route("/testserver/compact", post(control_compact))
        .fallback(not_routed)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(shared.clone(), front_door))
        .with_state(shared)
}

type AppState = State<Arc<Shared>>;

/// Logs the request, checks the token and applies faults, in that order (a real API server
/// authenticates before anything else; faults model the network/server, so they come last).
async fn front_door(State(shared): AppState, request: Request, next: Next) -> Response {
    let path = request.uri().path().to_string();
    if path.starts_with("/testserver/") {
        return next.run(request).await;
    }
    let sent_token = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_string);
    {
        let mut requests = lock(&shared.requests);
        // Bounded so a long-running demo server does not grow without end.
        if requests.len() >= REQUEST_LOG_LIMIT {
            requests.remove(0);
        }
        requests.push(RequestRecord {
            method: request.method().to_string(),
            path: path.clone(),
            query: request.uri().query().unwrap_or_default().to_string(),
            token: sent_token.clone(),
        });
    }
    let expected = lock(&shared.token).clone();
    if let Some(expected) = expected
        && sent_token.as_deref() != Some(expected.as_str())
    {
        return status_response(401, "Unauthorized", None);
    }
    match shared.matching_fault(&path) {
        Some(FaultKind::Delay(delay)) => {
            let cancel = lock(&shared.generation).clone();
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = cancel.cancelled() => return status_response(503, "server is shutting down", None),
            }
            next.run(request).await
        }
        Some(FaultKind::Fail(code)) => {
            status_response(code, &format!("injected fault {code}"), None)
        }
        Some(FaultKind::Down) | None => next.run(request).await,
    }
}

fn reason_for(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        410 => "Expired",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    }
}

fn status_object(code: u16, message: &str, details: Option<(&str, &str)>) -> Value {
    let mut status = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason_for(code),
        "code": code,
    });
    if let Some((kind, name)) = details {
        status["details"] = json!({ "name": name, "kind": kind });
    }
    status
}

fn status_response(code: u16, message: &str, details: Option<(&str, &str)>) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_response(status, &status_object(code, message, details))
}

fn not_found(resource: &str, name: &str) -> Response {
    status_response(
        404,
        &format!("{resource} \"{name}\" not found"),
        Some((resource, name)),
    )
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn method_not_allowed() -> Response {
    status_response(
        405,
        "the server does not allow this method on the requested resource",
        None,
    )
}

async fn not_routed() -> Response {
    status_response(
        404,
        "the server could not find the requested resource",
        None,
    )
}

/// Decoded query parameters (last one wins, as Go's `url.Values.Get` would return the first —
/// clients never repeat these).
fn parse_query(query: &str) -> BTreeMap<String, String> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(byte) => {
                        out.push(byte);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            other => out.push(other),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn is_true(value: &str) -> bool {
    matches!(value, "true" | "1")
}

/// The parsed list/watch query of one request.
struct Query {
    filter: WatchFilter,
    watch: bool,
    resource_version: Option<u64>,
    bookmarks: bool,
    timeout: Option<Duration>,
}

#[derive(Clone)]
struct WatchFilter {
    kind: Kind,
    namespace: Option<String>,
    fields: FieldSelector,
    labels: LabelSelector,
}

impl WatchFilter {
    fn matches(&self, object: &Value) -> bool {
        let in_namespace = self.namespace.as_deref().is_none_or(|ns| {
            object
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                == Some(ns)
        });
        in_namespace && self.fields.matches(object) && self.labels.matches(object)
    }

    /// The watch event this change means for this watcher, if any: an object that stops
    /// matching is DELETED for it, one that starts matching is ADDED.
    fn event_for(&self, change: &Change) -> Option<(&'static str, Value)> {
        if change.kind != self.kind {
            return None;
        }
        let before = change.before.as_ref().filter(|o| self.matches(o));
        let after = change.after.as_ref().filter(|o| self.matches(o));
        match (before, after, &change.after) {
            (Some(_), Some(now), _) => Some(("MODIFIED", now.clone())),
            (None, Some(now), _) => Some(("ADDED", now.clone())),
            (Some(_), None, Some(now)) => Some(("DELETED", now.clone())),
            (Some(gone), None, None) => Some(("DELETED", gone.clone())),
            (None, None, _) => None,
        }
    }
}

/// Errors are messages for a 400 BadRequest.
fn parse_list_query(kind: Kind, namespace: Option<String>, query: &str) -> Result<Query, String> {
    let params = parse_query(query);
    let fields =
        FieldSelector::parse(kind, params.get("fieldSelector").map_or("", String::as_str))?;
    let labels = LabelSelector::parse(params.get("labelSelector").map_or("", String::as_str))?;
    let resource_version = match params.get("resourceVersion").map(String::as_str) {
        None | Some("") => None,
        Some(rv) => Some(
            rv.parse::<u64>()
                .map_err(|_| format!("invalid resourceVersion {rv:?}"))?,
        ),
    };
    let timeout = params
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs);
    Ok(Query {
        filter: WatchFilter {
            kind,
            namespace,
            fields,
            labels,
        },
        watch: params.get("watch").is_some_and(|v| is_true(v)),
        resource_version,
        bookmarks: params
            .get("allowWatchBookmarks")
            .is_some_and(|v| is_true(v)),
        timeout,
    })
}

fn kind_names(kind: Kind) -> (&'static str, &'static str) {
    match kind {
        Kind::Pod => ("Pod", "pods"),
        Kind::Namespace => ("Namespace", "namespaces"),
    }
}

async fn list_or_watch_all_pods(State(shared): AppState, request: Request) -> Response {
    list_or_watch(
        shared,
        Kind::Pod,
        None,
        request.uri().query().unwrap_or_default(),
    )
}

async fn list_or_watch_namespace_pods(
    State(shared): AppState,
    axum::extract::Path(ns): axum::extract::Path<String>,
    request: Request,
) -> Response {
    list_or_watch(
        shared,
        Kind::Pod,
        Some(ns),
        request.uri().query().unwrap_or_default(),
    )
}

async fn list_or_watch_namespaces(State(shared): AppState, request: Request) -> Response {
    list_or_watch(
        shared,
        Kind::Namespace,
        None,
        request.uri().query().unwrap_or_default(),
    )
}

fn list_or_watch(
    shared: Arc<Shared>,
    kind: Kind,
    namespace: Option<String>,
    query: &str,
) -> Response {
    let query = match parse_list_query(kind, namespace, query) {
        Ok(query) => query,
        Err(message) => return status_response(400, &message, None),
    };
    if query.watch {
        return watch(shared, query);
    }
    let store = lock(&shared.store);
    let items: Vec<&Value> = store
        .objects
        .iter()
        .filter(|((k, _, _), object)| *k == kind && query.filter.matches(object))
        .map(|(_, object)| object)
        .collect();
    let (kind_name, _) = kind_names(kind);
    let list = json!({
        "kind": format!("{kind_name}List"),
        "apiVersion": "v1",
        "metadata": { "resourceVersion": store.resource_version.to_string() },
        "items": items,
    });
    json_response(StatusCode::OK, &list)
}

fn watch_line(event_type: &str, object: &Value) -> Bytes {
    let mut line = json!({ "type": event_type, "object": object }).to_string();
    line.push('\n');
    Bytes::from(line)
}

fn watch(shared: Arc<Shared>, query: Query) -> Response {
    let (kind_name, _) = kind_names(query.filter.kind);
    let cancel = lock(&shared.generation).clone();
    let mut initial = Vec::new();
    let mut expired = false;
    // Subscribing and reading the history under the store lock means no change is missed or
    // sent twice.
    let (mut changes, mut last_seen) = {
        let store = lock(&shared.store);
        match query.resource_version {
            // No or "0" resourceVersion: the current state as ADDED, then changes.
            None | Some(0) => {
                for ((k, _, _), object) in &store.objects {
                    if *k == query.filter.kind && query.filter.matches(object) {
                        initial.push(watch_line("ADDED", object));
                    }
                }
            }
            Some(rv) if rv < store.compacted_through => {
                let message = format!(
                    "too old resource version: {rv} ({})",
                    store.compacted_through
                );
                initial.push(watch_line("ERROR", &status_object(410, &message, None)));
                expired = true;
            }
            Some(rv) => {
                for change in store.history.iter().filter(|c| c.resource_version > rv) {
                    if let Some((event_type, object)) = query.filter.event_for(change) {
                        initial.push(watch_line(event_type, &object));
                    }
                }
            }
        }
        (store.events.subscribe(), store.resource_version)
    };
    let (sender, receiver) = mpsc::channel::<Bytes>(64);
    let bookmark_interval = shared.options.bookmark_interval;
    tokio::spawn(async move {
        for line in initial {
            if sender.send(line).await.is_err() {
                return;
            }
        }
        if expired {
            return;
        }
        let deadline = query.timeout.map(|t| tokio::time::Instant::now() + t);
        let mut bookmarks = tokio::time::interval_at(
            tokio::time::Instant::now() + bookmark_interval,
            bookmark_interval,
        );
        loop {
            let line = tokio::select! {
                _ = cancel.cancelled() => return,
                _ = sender.closed() => return,
                _ = sleep_until(deadline) => return,
                _ = bookmarks.tick(), if query.bookmarks => {
                    let bookmark = json!({
                        "kind": kind_name,
                        "apiVersion": "v1",
                        "metadata": { "resourceVersion": last_seen.to_string() },
                    });
                    Some(watch_line("BOOKMARK", &bookmark))
                }
                change = changes.recv() => match change {
                    Ok(change) => {
                        last_seen = change.resource_version;
                        query.filter.event_for(&change).map(|(t, object)| watch_line(t, &object))
                    }
                    // Lagged or closed: end the stream; the client resumes from its last version.
                    Err(_) => return,
                },
            };
            if let Some(line) = line
                && sender.send(line).await.is_err()
            {
                return;
            }
        }
    });
    let body = futures::stream::unfold(receiver, |mut receiver| async move {
        receiver
            .recv()
            .await
            .map(|line| (Ok::<_, Infallible>(line), receiver))
    });
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(body),
    )
        .into_response()
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

type PodPath = axum::extract::Path<(String, String)>;

async fn get_pod(State(shared): AppState, axum::extract::Path((ns, name)): PodPath) -> Response {
    let key = (Kind::Pod, ns, name);
    match lock(&shared.store).objects.get(&key) {
        Some(object) => json_response(StatusCode::OK, object),
        None => not_found("pods", &key.2),
    }
}

async fn get_namespace(
    State(shared): AppState,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> Response {
    let key = (Kind::Namespace, String::new(), name);
    match lock(&shared.store).objects.get(&key) {
        Some(object) => json_response(StatusCode::OK, object),
        None => not_found("namespaces", &key.2),
    }
}

async fn patch_pod(
    State(shared): AppState,
    path: PodPath,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    patch(&shared, path.0, &headers, &body, false)
}

async fn patch_pod_status(
    State(shared): AppState,
    path: PodPath,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    patch(&shared, path.0, &headers, &body, true)
}

/// RFC 7386 JSON merge patch: objects merge recursively, `null` deletes, anything else replaces.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch_fields) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(serde_json::Map::new());
    }
    if let Value::Object(target_fields) = target {
        for (key, value) in patch_fields {
            if value.is_null() {
                target_fields.remove(key);
            } else {
                merge_patch(
                    target_fields.entry(key.clone()).or_insert(Value::Null),
                    value,
                );
            }
        }
    }
}

fn patch(
    shared: &Shared,
    (ns, name): (String, String),
    headers: &HeaderMap,
    body: &[u8],
    status_subresource: bool,
) -> Response {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    // Strategic merge differs from a merge patch only for lists with merge keys; labels and
    // annotations are maps, so treating it as a merge patch is exact for what the roles send.
    let media = content_type.split(';').next().unwrap_or_default().trim();
    if !matches!(
        media,
        "application/merge-patch+json" | "application/strategic-merge-patch+json"
    ) {
        return status_response(
            415,
            &format!(
                "the body of the request was in an unknown format - accepted media types include: application/merge-patch+json, application/strategic-merge-patch+json (got {content_type:?})"
            ),
            None,
        );
    }
    let patch: Value = match serde_json::from_slice(body) {
        Ok(patch) => patch,
        Err(e) => return status_response(400, &format!("invalid patch JSON: {e}"), None),
    };
    let key = (Kind::Pod, ns, name);
    let mut store = lock(&shared.store);
    let Some(current) = store.objects.get(&key).cloned() else {
        return not_found("pods", &key.2);
    };
    let current_rv = current.pointer("/metadata/resourceVersion").cloned();
    if let Some(wanted) = patch.pointer("/metadata/resourceVersion")
        && Some(wanted) != current_rv.as_ref()
    {
        return status_response(
            409,
            &format!(
                "Operation cannot be fulfilled on pods \"{}\": the object has been modified; please apply your changes to the latest version and try again",
                key.2
            ),
            Some(("pods", &key.2)),
        );
    }
    let mut updated = current.clone();
    merge_patch(&mut updated, &patch);
    // The subresource owns status (plus metadata); the main resource owns everything else.
    let kept = if status_subresource { "spec" } else { "status" };
    match current.get(kept) {
        Some(value) => updated[kept] = value.clone(),
        None => {
            if let Some(fields) = updated.as_object_mut() {
                fields.remove(kept);
            }
        }
    }
    for identity in [
        "name",
        "namespace",
        "uid",
        "creationTimestamp",
        "resourceVersion",
    ] {
        if let (Some(old), Some(meta)) = (
            current.pointer(&format!("/metadata/{identity}")).cloned(),
            updated.get_mut("metadata").and_then(Value::as_object_mut),
        ) {
            meta.insert(identity.into(), old);
        }
    }
    if let Err(e) = validate(Kind::Pod, &updated) {
        return status_response(
            422,
            &format!("Pod \"{}\" is invalid: {e}", key.2),
            Some(("pods", &key.2)),
        );
    }
    if updated == current {
        // A no-op patch neither bumps the resourceVersion nor wakes watchers.
        return json_response(StatusCode::OK, &current);
    }
    let stored = store.commit(key, Some(updated)).unwrap_or(Value::Null);
    json_response(StatusCode::OK, &stored)
}

async fn delete_pod(State(shared): AppState, path: PodPath, body: Bytes) -> Response {
    let (ns, name) = path.0;
    let options: Value = if body.is_empty() {
        Value::Null
    } else {
        match serde_json::from_slice(&body) {
            Ok(options) => options,
            Err(e) => return status_response(400, &format!("invalid DeleteOptions: {e}"), None),
        }
    };
    let key = (Kind::Pod, ns, name);
    let mut store = lock(&shared.store);
    let Some(current) = store.objects.get(&key) else {
        return not_found("pods", &key.2);
    };
    for (precondition, field) in [("uid", "UID"), ("resourceVersion", "ResourceVersion")] {
        let wanted = options
            .pointer(&format!("/preconditions/{precondition}"))
            .and_then(Value::as_str);
        let actual = current
            .pointer(&format!("/metadata/{precondition}"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        if let Some(wanted) = wanted
            && wanted != actual
        {
            return status_response(
                409,
                &format!(
                    "Precondition failed: {field} in precondition: {wanted}, {field} in object meta: {actual}"
                ),
                Some(("pods", &key.2)),
            );
        }
    }
    let deleted = store.commit(key, None).unwrap_or(Value::Null);
    json_response(StatusCode::OK, &deleted)
}

async fn create_event(
    State(shared): AppState,
    axum::extract::Path(ns): axum::extract::Path<String>,
    body: Bytes,
) -> Response {
    let mut event: Value = match serde_json::from_slice(&body) {
        Ok(event) => event,
        Err(e) => return status_response(400, &format!("invalid JSON: {e}"), None),
    };
    if let Err(e) = serde_json::from_value::<Event>(event.clone()) {
        return status_response(422, &format!("Event is invalid: {e}"), None);
    }
    let name = event
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let involved_namespace = event
        .pointer("/involvedObject/namespace")
        .and_then(Value::as_str);
    // The API server's event validation: the event lives in its object's namespace.
    if name.is_empty() || involved_namespace.is_some_and(|n| n != ns) {
        return status_response(
            422,
            &format!(
                "Event {name:?} is invalid: name required, involvedObject.namespace must be {ns:?}"
            ),
            Some(("events", &name)),
        );
    }
    let mut store = lock(&shared.store);
    store.resource_version += 1;
    let uid = store.new_uid();
    let rv = store.resource_version.to_string();
    drop(store);
    if let Some(meta) = event.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("namespace".into(), Value::String(ns));
        meta.insert("uid".into(), Value::String(uid));
        meta.insert("resourceVersion".into(), Value::String(rv));
    }
    lock(&shared.events).push(event.clone());
    json_response(StatusCode::CREATED, &event)
}

async fn list_events(
    State(shared): AppState,
    axum::extract::Path(ns): axum::extract::Path<String>,
) -> Response {
    let items: Vec<Value> = lock(&shared.events)
        .iter()
        .filter(|e| e.pointer("/metadata/namespace").and_then(Value::as_str) == Some(ns.as_str()))
        .cloned()
        .collect();
    let rv = lock(&shared.store).resource_version.to_string();
    let list = json!({
        "kind": "EventList",
        "apiVersion": "v1",
        "metadata": { "resourceVersion": rv },
        "items": items,
    });
    json_response(StatusCode::OK, &list)
}

// ---------------------------------------------------------------------------------------------
// Control endpoints (for the `test-apiserver` process)

async fn control_add_objects(State(shared): AppState, body: Bytes) -> Response {
    let value: Value = match serde_json::from_slice(&body) {
        Ok(value) => value,
        Err(e) => return status_response(400, &format!("invalid JSON: {e}"), None),
    };
    match shared.load_objects(value) {
        Ok(count) => json_response(StatusCode::OK, &json!({ "loaded": count })),
        Err(e) => status_response(400, &e.to_string(), None),
    }
}

/// `{"kind":"fail","code":500}`, `{"kind":"delay","ms":300}` or `{"kind":"down","ms":1000}`
/// (down for that long, then back), plus optional `"pathPrefix"` and `"times"`.
async fn control_set_fault(State(shared): AppState, body: Bytes) -> Response {
    let spec: Value = match serde_json::from_slice(&body) {
        Ok(spec) => spec,
        Err(e) => return status_response(400, &format!("invalid JSON: {e}"), None),
    };
    let number = |field: &str| spec.get(field).and_then(Value::as_u64);
    let kind = match spec.get("kind").and_then(Value::as_str) {
        Some("fail") => match number("code").and_then(|c| u16::try_from(c).ok()) {
            Some(code) => FaultKind::Fail(code),
            None => return status_response(400, "fail needs a numeric code", None),
        },
        Some("delay") => FaultKind::Delay(Duration::from_millis(number("ms").unwrap_or(0))),
        Some("down") => {
            let Some(ms) = number("ms") else {
                return status_response(400, "down needs ms (how long to stay down)", None);
            };
            let shared = shared.clone();
            // Stopping waits for open connections, including this one, so it runs beside this
            // handler: the listener closes at once, this answer still goes out.
            tokio::spawn(async move {
                shared.stop().await;
                tokio::time::sleep(Duration::from_millis(ms)).await;
                let _ = shared.restart().await;
            });
            return json_response(StatusCode::OK, &json!({ "down_ms": ms }));
        }
        other => return status_response(400, &format!("unknown fault kind {other:?}"), None),
    };
    let fault = Fault {
        kind,
        path_prefix: spec
            .get("pathPrefix")
            .and_then(Value::as_str)
            .map(str::to_string),
        times: number("times").and_then(|t| u32::try_from(t).ok()),
    };
    lock(&shared.faults).push(fault);
    json_response(StatusCode::OK, &json!({}))
}

async fn control_clear_faults(State(shared): AppState) -> Response {
    lock(&shared.faults).clear();
    json_response(StatusCode::OK, &json!({}))
}

async fn control_requests(State(shared): AppState) -> Response {
    let requests = lock(&shared.requests).clone();
    json_response(StatusCode::OK, &json!(requests))
}

async fn control_compact(State(shared): AppState) -> Response {
    shared.compact();
    json_response(StatusCode::OK, &json!({}))
}

// ---------------------------------------------------------------------------------------------
// The hidden `test-apiserver` role

/// Runs the test API server as a process (for the demo and tests that spawn the real binary).
#[derive(argh::FromArgs, Debug)]
struct Args {
    /// port on 127.0.0.1 (0 picks a free one)
    #[argh(option, default = "0")]
    port: u16,
    /// JSON file with a list of Pods/Namespaces (or a Kubernetes List) to start with
    #[argh(option)]
    fixtures: Option<PathBuf>,
    /// write a kubeconfig pointing at the server here
    #[argh(option)]
    kubeconfig_out: Option<PathBuf>,
    /// bearer token to require (default: istio-cni-test-token)
    #[argh(option)]
    token: Option<String>,
    /// accept requests without a token
    #[argh(switch)]
    anonymous: bool,
}

/// Entry point of the `test-apiserver` role: prints the URL on stdout line 1 once listening and
/// serves until SIGTERM/SIGINT.
pub fn main(args: Vec<String>) -> i32 {
    let strs: Vec<&str> = args.iter().map(String::as_str).collect();
    let (command, rest) = strs
        .split_first()
        .map_or(("test-apiserver", &[][..]), |(c, r)| (*c, r));
    let parsed = match <Args as argh::FromArgs>::from_args(&[command], rest) {
        Ok(parsed) => parsed,
        Err(exit) => {
            let ok = exit.status.is_ok();
            if ok {
                println!("{}", exit.output);
            } else {
                eprintln!("{}", exit.output);
            }
            return if ok { 0 } else { 2 };
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("test-apiserver: cannot start runtime: {e}");
            return 1;
        }
    };
    match runtime.block_on(run(parsed)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("test-apiserver: {e}");
            1
        }
    }
}

async fn run(args: Args) -> Result<(), TestServerError> {
    use tokio::signal::unix::{SignalKind, signal};
    let options = TestServerOptions {
        port: args.port,
        token: if args.anonymous {
            None
        } else {
            Some(args.token.unwrap_or_else(|| DEFAULT_TOKEN.to_string()))
        },
        ..TestServerOptions::default()
    };
    let server = TestApiServer::start_with(options).await?;
    if let Some(path) = &args.fixtures {
        server.load_fixtures(path)?;
    }
    if let Some(path) = &args.kubeconfig_out {
        server.write_kubeconfig(path)?;
    }
    let signal_error = |source| TestServerError::Listen {
        addr: server.addr(),
        source,
    };
    let mut terminate = signal(SignalKind::terminate()).map_err(signal_error)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(signal_error)?;
    println!("{}", server.url());
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
    server.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding_and_query_parsing() {
        let q = parse_query(
            "fieldSelector=spec.nodeName%3Dn1&labelSelector=a+in+%28x%2Cy%29&watch=1&bad=%zz",
        );
        assert_eq!(q["fieldSelector"], "spec.nodeName=n1");
        assert_eq!(q["labelSelector"], "a in (x,y)");
        assert_eq!(q["watch"], "1");
        assert_eq!(q["bad"], "%zz");
        assert_eq!(percent_decode("50%"), "50%");
    }

    #[test]
    fn merge_patch_follows_rfc7386() {
        let mut target = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"x": [1]}});
        merge_patch(
            &mut target,
            &json!({"metadata": {"labels": {"a": null, "c": "3"}}, "spec": {"x": [2]}}),
        );
        assert_eq!(
            target,
            json!({"metadata": {"labels": {"b": "2", "c": "3"}}, "spec": {"x": [2]}})
        );
    }

    #[test]
    fn selector_changes_become_added_and_deleted() {
        let filter = WatchFilter {
            kind: Kind::Pod,
            namespace: None,
            fields: FieldSelector::default(),
            labels: LabelSelector::parse("mode=ambient").expect("parses"),
        };
        let with = |mode: &str| json!({"metadata": {"name": "p", "labels": {"mode": mode}}});
        let change = |before: Option<Value>, after: Option<Value>| Change {
            resource_version: 5,
            kind: Kind::Pod,
            before,
            after,
        };
        let kind_of = |c: &Change| filter.event_for(c).map(|(t, _)| t);
        assert_eq!(
            kind_of(&change(Some(with("none")), Some(with("ambient")))),
            Some("ADDED")
        );
        assert_eq!(
            kind_of(&change(Some(with("ambient")), Some(with("none")))),
            Some("DELETED")
        );
        assert_eq!(
            kind_of(&change(Some(with("ambient")), Some(with("ambient")))),
            Some("MODIFIED")
        );
        assert_eq!(
            kind_of(&change(Some(with("ambient")), None)),
            Some("DELETED")
        );
        assert_eq!(kind_of(&change(None, Some(with("none")))), None);
    }

    #[test]
    fn kubeconfig_written_for_the_server_parses() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("kubeconfig");
        write_kubeconfig(&path, "http://127.0.0.1:1234", Some("tok\"en")).expect("writes");
        let text = std::fs::read_to_string(&path).expect("reads");
        let parsed = kube::config::Kubeconfig::from_yaml(&text).expect("parses");
        assert_eq!(parsed.current_context.as_deref(), Some("istio-cni-context"));
        let cluster = parsed.clusters[0].cluster.as_ref().expect("cluster");
        assert_eq!(cluster.server.as_deref(), Some("http://127.0.0.1:1234"));
        // The token itself is a secrecy type; check the escaped form is what was written.
        assert!(text.contains(r#"token: "tok\"en""#), "{text}");
    }
}
