//! The node agent's view of the cluster: THE node-scoped pod store (pods whose `spec.nodeName` is
//! this node, nothing else is ever cached — Istio users report gigabytes when every pod is kept)
//! and the namespace store (names and labels only). Fed by kube-runtime watchers; shared by every
//! controller of the agent process (enrolment now, the repair controller later), each through its
//! own subscription. A subscription holds its unread changes merged per object ([`Subscription`]),
//! so a subscriber slower than the watch holds at most three per object, never a backlog of events.
//!
//! Why not kube-runtime's `reflector::Store`: subscribers here need the previous object on an
//! update (the enrolment state machine compares old and new IPs, and removes with the old object
//! when a terminal pod's IPs are blanked) and the deleted object on a delete, and a re-list after
//! a lost watch must come out as the adds, updates and deletes it implies.
//!
//! Readiness is the initial sync ([`Store::wait_synced`], with a deadline: the watcher has no read
//! timeout of its own, so a hung first LIST would otherwise wait forever). A first list or watch
//! refused for a reason only an operator can fix (403 RBAC, 401 token, a TLS certificate the
//! kubeconfig's CA does not verify) ends the wait at once with that error, naming the resource
//! and the verb; transient failures (5xx, refused, reset) keep the watcher's jittered retries
//! until the deadline. [`Store::wait_until_synced`] waits with no deadline (install-cni's start:
//! Istio's blocks on its informers too), telling why it still waits.
//!
//! A watch refused after the sync (RBAC that grants `list` but not `watch`, a token revoked)
//! would otherwise go unnoticed: the store keeps its listed objects and kube-runtime retries the
//! watch for ever, so new pods are never seen. Such a store is marked refused
//! ([`Store::refused_watch`], followed by [`Store::follow_watch_refusals`] for readiness) until
//! the watch is allowed again: an event arrives, or a probe watch of the same selection is
//! accepted (a watch that starts sends nothing until something changes).
//!
//! Liveness ([`Store::is_live`]): synced, and no watch error since the last event delivered. A
//! failed watch means changes may be happening that the store has not seen; it is live again with
//! the next event of the resumed watch (which replays from the last resourceVersion) or of a
//! re-list. Readers that must not act on a stale object (the pod-facts answers) check it.

use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::watcher;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::client::{KubeClient, Selectors, WatchBackoff};
use super::error::{Call, KubeError};
use subscription::Publisher;
pub use subscription::Subscription;

pub(super) mod kept;
mod subscription;

/// A change seen by a subscriber.
#[derive(Debug, Clone)]
pub enum StoreEvent<K> {
    Added(Arc<K>),
    Updated {
        old: Arc<K>,
        new: Arc<K>,
    },
    /// The object's last known state.
    Deleted(Arc<K>),
}

/// The store never got its initial list.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SyncError {
    /// Not in time (the API server is down, slow or failing with 5xx).
    #[error("the {what} store did not sync within {timeout:?} (is the API server reachable?)")]
    Timeout {
        what: &'static str,
        timeout: Duration,
    },
    /// Refused in a way retrying cannot fix ([`KubeError::needs_operator`]); not waited out.
    #[error("the {what} store cannot start (it needs list and watch on {what}s): {source}")]
    Refused {
        what: &'static str,
        #[source]
        source: Arc<KubeError>,
    },
}

/// Where the initial sync stands.
#[derive(Debug, Clone)]
enum SyncState {
    Pending,
    Synced,
    /// Not synced, and the last list/watch error needs an operator.
    Refused(Arc<KubeError>),
}

/// Objects a store can hold: how they are keyed and what is kept of them.
pub trait Stored: Clone + Send + Sync + 'static {
    const WHAT: &'static str;
    /// The two calls of the store's list-then-watch (their RBAC verbs are named in errors).
    const LIST: Call;
    const WATCH: Call;
    fn key(&self) -> String;
    fn resource_version(&self) -> Option<&str>;
    /// Drops what no consumer reads, before the object is stored.
    fn trim(self) -> Self;
    /// The addresses the store indexes the object by ([`Store::at_address`]); none by default.
    fn addresses(&self) -> Vec<std::net::IpAddr> {
        Vec::new()
    }
}

impl Stored for Pod {
    const WHAT: &'static str = "pod";
    const LIST: Call = Call::ListPods;
    const WATCH: Call = Call::WatchPods;

    /// `namespace/name`.
    fn key(&self) -> String {
        pod_key(
            self.metadata.namespace.as_deref().unwrap_or_default(),
            self.metadata.name.as_deref().unwrap_or_default(),
        )
    }

    fn resource_version(&self) -> Option<&str> {
        self.metadata.resource_version.as_deref()
    }

    /// Only what some reader of a stored pod reads ([`kept`]), the subset the protobuf watch
    /// decodes too.
    fn trim(self) -> Self {
        kept::pod(self)
    }

    /// Its IPs ([`pod_ips`]): the agent asks which pods hold an address a netns holds.
    fn addresses(&self) -> Vec<std::net::IpAddr> {
        pod_ips(self)
    }
}

impl Stored for Namespace {
    const WHAT: &'static str = "namespace";
    const LIST: Call = Call::ListNamespaces;
    const WATCH: Call = Call::WatchNamespaces;

    fn key(&self) -> String {
        self.metadata.name.clone().unwrap_or_default()
    }

    fn resource_version(&self) -> Option<&str> {
        self.metadata.resource_version.as_deref()
    }

    /// Name, uid, resourceVersion and labels: all the agent reads of a namespace.
    fn trim(self) -> Self {
        let m = self.metadata;
        Namespace {
            metadata: ObjectMeta {
                name: m.name,
                uid: m.uid,
                resource_version: m.resource_version,
                labels: m.labels,
                ..Default::default()
            },
            ..Default::default()
        }
    }
}

/// A pod's IPs: `status.podIPs`, else `status.podIP`; unparsable entries skipped; v4-in-v6
/// unmapped. What the ambient agent and the repair controller match a netns against.
pub fn pod_ips(pod: &Pod) -> Vec<std::net::IpAddr> {
    let Some(status) = &pod.status else {
        return Vec::new();
    };
    let parse = |ip: &str| {
        ip.parse::<std::net::IpAddr>()
            .ok()
            .map(|ip| ip.to_canonical())
    };
    let from_list: Vec<_> = status
        .pod_ips
        .iter()
        .flatten()
        .filter_map(|p| parse(&p.ip))
        .collect();
    if !from_list.is_empty() {
        return from_list;
    }
    status
        .pod_ip
        .as_deref()
        .and_then(parse)
        .into_iter()
        .collect()
}

/// The key of a pod in the pod store.
pub fn pod_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

struct State<K> {
    objects: HashMap<String, Arc<K>>,
    /// Keys by [`Stored::addresses`] (kept with `objects`).
    by_address: HashMap<std::net::IpAddr, Vec<String>>,
    /// The objects of a re-list in progress (watcher `Init` .. `InitDone`).
    relist: Option<HashMap<String, Arc<K>>>,
    subscribers: Vec<Publisher<K>>,
}

struct Inner<K> {
    state: Mutex<State<K>>,
    synced: tokio::sync::watch::Sender<SyncState>,
    /// Bumped after every applied event: what a waiter for an object watches.
    changes: tokio::sync::watch::Sender<u64>,
    /// False from a watch error until the next event.
    watch_ok: std::sync::atomic::AtomicBool,
    /// The last list/watch error, for a waiter to say why it still waits.
    last_error: Mutex<Option<String>>,
    /// After the sync: the refusal of the watch that needs an operator, until it is allowed.
    refused_watch: tokio::sync::watch::Sender<Option<Arc<KubeError>>>,
}

/// A cache of one kind of object, and the subscribers it tells about changes. Cheap to clone.
pub struct Store<K> {
    inner: Arc<Inner<K>>,
}

impl<K> Clone for Store<K> {
    fn clone(&self) -> Self {
        Store {
            inner: self.inner.clone(),
        }
    }
}

/// The node-scoped pod store.
pub type PodStore = Store<Pod>;
/// The namespace store (labels only).
pub type NamespaceStore = Store<Namespace>;

impl<K: Stored> Default for Store<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Stored> Store<K> {
    /// An empty, not yet synced store (fed by [`Store::apply`]).
    pub fn new() -> Self {
        Store {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    objects: HashMap::new(),
                    by_address: HashMap::new(),
                    relist: None,
                    subscribers: Vec::new(),
                }),
                synced: tokio::sync::watch::Sender::new(SyncState::Pending),
                changes: tokio::sync::watch::Sender::new(0),
                watch_ok: std::sync::atomic::AtomicBool::new(true),
                last_error: Mutex::new(None),
                refused_watch: tokio::sync::watch::Sender::new(None),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State<K>> {
        // Plain data; a panicked holder cannot leave it half-updated in a way readers mind.
        self.inner.state.lock()
    }

    pub fn get(&self, key: &str) -> Option<Arc<K>> {
        self.state().objects.get(key).cloned()
    }

    pub fn list(&self) -> Vec<Arc<K>> {
        self.state().objects.values().cloned().collect()
    }

    /// The objects whose [`Stored::addresses`] hold `ip` (a lookup, not a scan).
    pub fn at_address(&self, ip: std::net::IpAddr) -> Vec<Arc<K>> {
        let state = self.state();
        state
            .by_address
            .get(&ip.to_canonical())
            .into_iter()
            .flatten()
            .filter_map(|key| state.objects.get(key).cloned())
            .collect()
    }

    pub fn len(&self) -> usize {
        self.state().objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Wakes on every change after it was taken (`changed().await`): a caller waiting for an
    /// object takes it, looks, and waits for the next change, instead of polling.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.changes.subscribe()
    }

    /// A new subscriber: it first gets every object already stored as `Added` (as a client-go
    /// handler added late does), then every change, in order. Dropping the receiver unsubscribes.
    pub fn subscribe(&self) -> Subscription<K> {
        let (tx, rx) = subscription::feed();
        let mut state = self.state();
        for (key, object) in &state.objects {
            tx.send(key, StoreEvent::Added(object.clone()));
        }
        state.subscribers.push(tx);
        rx
    }

    pub fn is_synced(&self) -> bool {
        matches!(*self.inner.synced.borrow(), SyncState::Synced)
    }

    /// Synced and the watch has not failed since the last event (see the module doc).
    pub fn is_live(&self) -> bool {
        self.is_synced()
            && self
                .inner
                .watch_ok
                .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The watch failed: until the next event the store may be missing changes.
    pub fn mark_watch_failed(&self) {
        self.inner
            .watch_ok
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// Remembers the last list/watch error (see [`Store::wait_until_synced`]).
    pub fn note_error(&self, err: String) {
        *self.inner.last_error.lock() = Some(err);
    }

    /// Waits for the initial list however long the API server takes, as Istio's start-up
    /// blocks on its informers' sync; the watcher retries meanwhile with its jittered backoff.
    /// `report` is told why it still waits whenever that changes: the refusal that needs an
    /// operator, else the last list/watch error. Cancel by dropping the future.
    pub async fn wait_until_synced(&self, poll: Duration, mut report: impl FnMut(&str)) {
        let mut told = String::new();
        loop {
            let why = match self.wait_synced(poll).await {
                Ok(()) => return,
                Err(e @ SyncError::Refused { .. }) => {
                    // Settled as refused: wait_synced answers at once until a list succeeds.
                    tokio::time::sleep(poll).await;
                    e.to_string()
                }
                Err(SyncError::Timeout { .. }) => match self.inner.last_error.lock().clone() {
                    Some(err) => format!("the {} store's first list failed: {err}", K::WHAT),
                    None => format!("the {} store's first list has not answered", K::WHAT),
                },
            };
            if why != told {
                report(&why);
                told = why;
            }
        }
    }

    /// A list/watch error that retrying cannot fix. Before the first sync waiters stop waiting;
    /// after it the store keeps its objects but counts as refused ([`Store::refused_watch`])
    /// until the watch is allowed again. True when it is a refusal after the sync that was not
    /// one already (the caller logs it once).
    pub fn refuse(&self, err: KubeError) -> bool {
        let err = Arc::new(err);
        let synced = !self.inner.synced.send_if_modified(|state| match state {
            SyncState::Synced => false,
            _ => {
                *state = SyncState::Refused(err.clone());
                true
            }
        });
        synced
            && self.inner.refused_watch.send_if_modified(|refused| {
                let first = refused.is_none();
                *refused = Some(err);
                first
            })
    }

    /// The watch is allowed again (an event came, or a probe watch was accepted). True when it
    /// was refused until now.
    pub fn watch_allowed(&self) -> bool {
        self.inner
            .refused_watch
            .send_if_modified(|refused| refused.take().is_some())
    }

    /// Why the store, synced, no longer sees changes: its watch is refused (see the module doc).
    pub fn refused_watch(&self) -> Option<String> {
        self.inner
            .refused_watch
            .borrow()
            .as_ref()
            .map(|err| refused_watch_reason(K::WHAT, err))
    }

    /// Tells `report` the refusal of the watch after the sync ([`Store::refused_watch`]) each
    /// time it starts, changes or ends (`None`), until `stop`. A readiness component follows it.
    pub async fn follow_watch_refusals(
        &self,
        stop: CancellationToken,
        mut report: impl FnMut(Option<String>),
    ) {
        let mut rx = self.inner.refused_watch.subscribe();
        loop {
            let now = rx
                .borrow_and_update()
                .as_ref()
                .map(|err| refused_watch_reason(K::WHAT, err));
            report(now);
            tokio::select! {
                _ = stop.cancelled() => return,
                changed = rx.changed() => if changed.is_err() { return },
            }
        }
    }

    /// Waits for the initial list, at most `timeout`; at once with the error when the list or
    /// watch was refused for a reason only an operator can fix ([`Store::refuse`]).
    pub async fn wait_synced(&self, timeout: Duration) -> Result<(), SyncError> {
        let mut rx = self.inner.synced.subscribe();
        let settled = rx.wait_for(|state| !matches!(state, SyncState::Pending));
        let state = match tokio::time::timeout(timeout, settled).await {
            Ok(Ok(state)) => state.clone(),
            _ => SyncState::Pending,
        };
        match state {
            SyncState::Synced => Ok(()),
            SyncState::Refused(source) => Err(SyncError::Refused {
                what: K::WHAT,
                source,
            }),
            SyncState::Pending => Err(SyncError::Timeout {
                what: K::WHAT,
                timeout,
            }),
        }
    }

    /// Applies one watcher event and tells the subscribers what changed.
    pub fn apply(&self, event: watcher::Event<K>) {
        let mut state = self.state();
        let mut out = Vec::new();
        // Init starts a re-list: not live until its InitDone (objects deleted meanwhile are
        // still here until then).
        let live_after = !matches!(event, watcher::Event::Init | watcher::Event::InitApply(_));
        match event {
            watcher::Event::Init => state.relist = Some(HashMap::new()),
            watcher::Event::InitApply(object) => {
                let object = object.trim();
                let key = object.key();
                state
                    .relist
                    .get_or_insert_with(HashMap::new)
                    .insert(key, Arc::new(object));
            }
            watcher::Event::InitDone => {
                let fresh = state.relist.take().unwrap_or_default();
                let mut old = std::mem::take(&mut state.objects);
                for (key, new) in &fresh {
                    match old.remove(key) {
                        None => out.push((key.clone(), StoreEvent::Added(new.clone()))),
                        Some(prev) if changed(prev.as_ref(), new.as_ref()) => {
                            let event = StoreEvent::Updated {
                                old: prev,
                                new: new.clone(),
                            };
                            out.push((key.clone(), event))
                        }
                        Some(_) => {}
                    }
                }
                out.extend(old.into_iter().map(|(k, o)| (k, StoreEvent::Deleted(o))));
                state.by_address.clear();
                for (key, object) in &fresh {
                    index(&mut state.by_address, key, object.as_ref(), true);
                }
                state.objects = fresh;
                self.inner.synced.send_replace(SyncState::Synced);
            }
            watcher::Event::Apply(object) => {
                let new = Arc::new(object.trim());
                let key = new.key();
                let old = state.objects.insert(key.clone(), new.clone());
                if let Some(old) = &old {
                    index(&mut state.by_address, &key, old.as_ref(), false);
                }
                index(&mut state.by_address, &key, new.as_ref(), true);
                match old {
                    None => out.push((key, StoreEvent::Added(new))),
                    Some(old) if changed(old.as_ref(), new.as_ref()) => {
                        out.push((key, StoreEvent::Updated { old, new }))
                    }
                    Some(_) => {}
                }
            }
            watcher::Event::Delete(object) => {
                let gone = Arc::new(object.trim());
                let key = gone.key();
                if let Some(old) = state.objects.remove(&key) {
                    index(&mut state.by_address, &key, old.as_ref(), false);
                }
                out.push((key, StoreEvent::Deleted(gone)));
            }
        }
        if !out.is_empty() {
            state.subscribers.retain(|tx| {
                out.iter()
                    .all(|(key, ev)| tx.send(key.as_str(), ev.clone()))
            });
        }
        self.inner
            .watch_ok
            .store(live_after, std::sync::atomic::Ordering::SeqCst);
        drop(state);
        self.inner.changes.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// Adds (or removes) `key` under each of `object`'s addresses.
fn index<K: Stored>(
    by_address: &mut HashMap<std::net::IpAddr, Vec<String>>,
    key: &str,
    object: &K,
    add: bool,
) {
    for ip in object.addresses() {
        let ip = ip.to_canonical();
        let keys = by_address.entry(ip).or_default();
        keys.retain(|k| k != key);
        if add {
            keys.push(key.to_string());
        } else if keys.is_empty() {
            by_address.remove(&ip);
        }
    }
}

/// What a store whose watch is refused after its sync says (readiness and logs).
fn refused_watch_reason(what: &str, err: &KubeError) -> String {
    format!("the {what} store's watch is refused, so it sees no new {what}s or changes: {err}")
}

/// An update with the same resourceVersion is a replay (re-list) and tells nobody anything.
fn changed<K: Stored>(old: &K, new: &K) -> bool {
    old.resource_version().is_none() || old.resource_version() != new.resource_version()
}

impl Store<Pod> {
    /// The pods of one namespace (the store holds one node's pods, so a scan is cheap).
    pub fn pods_in_namespace(&self, namespace: &str) -> Vec<Arc<Pod>> {
        self.state()
            .objects
            .values()
            .filter(|p| p.metadata.namespace.as_deref() == Some(namespace))
            .cloned()
            .collect()
    }
}

/// Namespace labels from the store (`None` when the namespace is not cached).
pub fn namespace_labels(
    store: &NamespaceStore,
    name: &str,
) -> Option<std::collections::BTreeMap<String, String>> {
    store
        .get(name)
        .map(|ns| ns.metadata.labels.clone().unwrap_or_default())
}

/// Starts the pod store: a watcher on pods with `spec.nodeName=<node>` only, running until
/// `shutdown`. Watch errors are logged; the watcher re-lists and re-watches by itself.
pub fn spawn_pod_store(
    client: &KubeClient,
    node: &str,
    backoff: WatchBackoff,
    shutdown: CancellationToken,
) -> PodStore {
    let selectors = Selectors::on_node(node);
    let stream = client.watch_pods(&selectors, backoff);
    start(client, selectors, stream, backoff, shutdown)
}

/// Starts the namespace store (every namespace, labels only).
pub fn spawn_namespace_store(
    client: &KubeClient,
    backoff: WatchBackoff,
    shutdown: CancellationToken,
) -> NamespaceStore {
    let selectors = Selectors::default();
    let stream = client.watch_namespaces(&selectors, backoff);
    start(client, selectors, stream, backoff, shutdown)
}

/// A new store fed by `stream` (watching what `selectors` select) until `shutdown`.
fn start<K>(
    client: &KubeClient,
    selectors: Selectors,
    stream: super::client::WatchStream<K>,
    backoff: WatchBackoff,
    shutdown: CancellationToken,
) -> Store<K>
where
    K: Stored + kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let store = Store::new();
    let watch = Watch {
        client: client.clone(),
        selectors,
        stream,
        backoff,
    };
    tokio::spawn(drive(store.clone(), watch, shutdown));
    store
}

/// A store's watch and what its errors are named with.
struct Watch<K> {
    client: KubeClient,
    selectors: Selectors,
    stream: super::client::WatchStream<K>,
    /// The spacing of the probes of a refused watch.
    backoff: WatchBackoff,
}

async fn drive<K>(store: Store<K>, mut watch: Watch<K>, shutdown: CancellationToken)
where
    K: Stored + kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned + std::fmt::Debug,
{
    // While the watch is refused after the sync: when to probe it next, and the spacing after.
    let mut probe: Option<(tokio::time::Instant, _)> = None;
    loop {
        let probe_at = probe.as_ref().map(|(at, _)| *at);
        let next = tokio::select! {
            _ = shutdown.cancelled() => break,
            next = watch.stream.next() => next,
            _ = sleep_until(probe_at), if probe_at.is_some() => {
                let (client, selectors) = (&watch.client, &watch.selectors);
                probe = probe_watch(&store, client, selectors, watch.backoff, probe.take()).await;
                continue;
            }
        };
        match next {
            Some(Ok(event)) => {
                let proves_watch =
                    matches!(event, watcher::Event::Apply(_) | watcher::Event::Delete(_));
                store.apply(event);
                if proves_watch && store.watch_allowed() {
                    info!(
                        what = K::WHAT,
                        "the watch is allowed again: changes are seen again"
                    );
                }
                if proves_watch {
                    probe = None;
                }
            }
            Some(Err(e)) => {
                store.mark_watch_failed();
                let err = watch
                    .client
                    .watch_error(K::LIST, K::WATCH, &watch.selectors, e);
                store.note_error(match &err {
                    Ok(err) => err.to_string(),
                    Err(e) => e.to_string(),
                });
                match err {
                    Ok(err) if err.needs_operator() => {
                        let text = err.to_string();
                        if store.refuse(err) {
                            error!(what = K::WHAT, "{}", store.refused_watch().unwrap_or(text));
                            let mut delays = watch.backoff.policy().delays();
                            let first = delays.next().unwrap_or(watch.backoff.max);
                            probe = Some((tokio::time::Instant::now() + first, delays));
                        } else {
                            error!(what = K::WHAT, "watch refused, retrying: {text}");
                        }
                    }
                    Ok(err) => warn!(what = K::WHAT, "watch failed, retrying: {err}"),
                    Err(e) => warn!(what = K::WHAT, "watch failed, retrying: {e}"),
                }
            }
            None => break,
        }
    }
    debug!(what = K::WHAT, "store watcher stopped");
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at).await;
    }
}

/// Asks the API server whether the refused watch is allowed now (a watch of the same
/// selection, dropped once it starts): the watcher's own retry starts one without telling.
/// Returns when to probe next, or `None` once it is allowed.
async fn probe_watch<K, D>(
    store: &Store<K>,
    client: &KubeClient,
    selectors: &Selectors,
    backoff: WatchBackoff,
    probe: Option<(tokio::time::Instant, D)>,
) -> Option<(tokio::time::Instant, D)>
where
    K: Stored + kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned + std::fmt::Debug,
    D: Iterator<Item = Duration>,
{
    let (_, mut delays) = probe?;
    match client.watch_allowed::<K>(K::WATCH, selectors).await {
        Ok(()) => {
            if store.watch_allowed() {
                info!(
                    what = K::WHAT,
                    "the watch is allowed again: changes are seen again"
                );
            }
            None
        }
        Err(e) => {
            debug!(what = K::WHAT, "the watch is still refused: {e}");
            let next = delays.next().unwrap_or(backoff.max);
            Some((tokio::time::Instant::now() + next, delays))
        }
    }
}

#[cfg(test)]
mod tests;
