//! Client construction (kubeconfig file, $KUBECONFIG, in-cluster) and the typed calls the roles make.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::{Event, EventSource, Namespace, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::watcher;

use super::config::{ConfigSource, load_config};
use super::error::{Call, KubeError};
use super::names;
use crate::retry::RetryPolicy;

/// Label and field selectors for list/watch calls. Empty means "everything".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selectors {
    pub fields: Option<String>,
    pub labels: Option<String>,
}

impl Selectors {
    /// Pods scheduled on `node` (`spec.nodeName=<node>`), what the agent informers watch.
    pub fn on_node(node: &str) -> Self {
        Selectors {
            fields: Some(format!("spec.nodeName={node}")),
            labels: None,
        }
    }

    /// Adds field-selector terms (comma-separated, ANDed with the ones already set).
    #[cfg(test)]
    pub(crate) fn and_fields(mut self, terms: &str) -> Self {
        self.fields = join_terms(self.fields.take(), terms);
        self
    }

    /// Adds label-selector terms (comma-separated, ANDed with the ones already set).
    #[cfg(test)]
    pub(crate) fn and_labels(mut self, terms: &str) -> Self {
        self.labels = join_terms(self.labels.take(), terms);
        self
    }

    #[cfg(any(test, feature = "test-hooks"))]
    fn list_params(&self) -> kube::api::ListParams {
        kube::api::ListParams {
            field_selector: self.fields.clone(),
            label_selector: self.labels.clone(),
            ..kube::api::ListParams::default()
        }
    }

    fn watcher_config(&self, initial: watcher::InitialListStrategy) -> watcher::Config {
        watcher::Config {
            field_selector: self.fields.clone(),
            label_selector: self.labels.clone(),
            timeout: Some(watch_timeout_secs()),
            initial_list_strategy: initial,
            ..watcher::Config::default()
        }
    }

    fn describe(&self) -> String {
        format!(
            "fields={:?} labels={:?}",
            self.fields.as_deref().unwrap_or(""),
            self.labels.as_deref().unwrap_or("")
        )
    }
}

#[cfg(test)]
fn join_terms(existing: Option<String>, terms: &str) -> Option<String> {
    let terms = terms.trim_matches(',');
    match (existing, terms.is_empty()) {
        (existing, true) => existing,
        (Some(existing), false) if !existing.is_empty() => Some(format!("{existing},{terms}")),
        (_, false) => Some(terms.to_string()),
    }
}

/// Where a pod metadata patch goes. `Status` (the `pods/status` subresource) needs only
/// `pods/status` patch permission: the ambient agent (redirection annotation) and the repair
/// controller (label mode) use it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodPatchVia {
    Pod,
    Status,
}

/// A list call's objects and the list's resourceVersion (where a watch would resume).
#[cfg(any(test, feature = "test-hooks"))]
pub type Listed<K> = Result<(Vec<K>, Option<String>), KubeError>;

/// Label/annotation changes for a merge patch: `Some(value)` sets the key, `None` removes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetadataPatch {
    pub labels: BTreeMap<String, Option<String>>,
    pub annotations: BTreeMap<String, Option<String>>,
}

impl MetadataPatch {
    pub fn set_label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_string(), Some(value.to_string()));
        self
    }

    #[cfg(test)]
    pub(crate) fn remove_label(mut self, key: &str) -> Self {
        self.labels.insert(key.to_string(), None);
        self
    }

    pub fn set_annotation(mut self, key: &str, value: &str) -> Self {
        self.annotations
            .insert(key.to_string(), Some(value.to_string()));
        self
    }

    pub fn remove_annotation(mut self, key: &str) -> Self {
        self.annotations.insert(key.to_string(), None);
        self
    }

    /// The JSON merge patch body (RFC 7386: `null` deletes a key).
    pub fn to_merge_patch(&self) -> serde_json::Value {
        let mut metadata = serde_json::Map::new();
        if !self.labels.is_empty() {
            metadata.insert("labels".into(), serde_json::json!(self.labels));
        }
        if !self.annotations.is_empty() {
            metadata.insert("annotations".into(), serde_json::json!(self.annotations));
        }
        serde_json::json!({ "metadata": metadata })
    }
}

/// Retry spacing for watch streams after an error: doubling from `min` up to `max`, jittered
/// like every retry ([`RetryPolicy`]: agents on many nodes losing one API server together must
/// not come back in step), reset once the watch makes progress (a listed page's end, an event);
/// the start of a re-list (`Event::Init`) is no progress, so an API server that stays away is
/// retried at ever longer delays up to `max`, not at `min` forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchBackoff {
    pub min: Duration,
    pub max: Duration,
}

impl Default for WatchBackoff {
    /// client-go's reflector spacing (800 ms doubling to 30 s).
    fn default() -> Self {
        WatchBackoff {
            min: Duration::from_millis(800),
            max: Duration::from_secs(30),
        }
    }
}

impl WatchBackoff {
    /// The same spacing as a one-shot retry with no attempt limit (a watch never gives up).
    pub fn policy(&self) -> RetryPolicy {
        RetryPolicy {
            first: self.min,
            max: self.max,
            max_attempts: None,
        }
    }
}

/// The shortest `timeoutSeconds` a watch asks for; each watch stream draws its own from
/// `[WATCH_TIMEOUT_MIN, 2 * WATCH_TIMEOUT_MIN]`, as client-go's reflector does, so the agents of
/// many nodes started together do not all re-open their watches in the same second.
pub const WATCH_TIMEOUT_MIN: Duration = Duration::from_secs(300);

/// One watch stream's `timeoutSeconds`, drawn at random from the range above.
fn watch_timeout_secs() -> u32 {
    let band = RetryPolicy {
        first: 2 * WATCH_TIMEOUT_MIN,
        max: 2 * WATCH_TIMEOUT_MIN,
        max_attempts: None,
    };
    u32::try_from(band.jittered_delay(0).as_secs()).unwrap_or(u32::MAX)
}

/// How long [`KubeClient::watch_allowed`] waits for the watch to start.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// The watcher with [`WatchBackoff`]'s spacing: after an error the next poll waits the next
/// delay. Not kube-runtime's `StreamBackoff`: it resets on every `Ok`, and the watcher yields
/// `Ok(Event::Init)` before each list attempt, so a failing first list never backed off.
fn backed_off<K: Send + 'static>(
    inner: BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>,
    backoff: WatchBackoff,
) -> WatchStream<K> {
    let policy = backoff.policy();
    let state = (inner, policy.delays(), None::<Duration>);
    futures::stream::unfold(state, move |(mut inner, mut delays, pause)| async move {
        if let Some(pause) = pause {
            tokio::time::sleep(pause).await;
        }
        let item = inner.next().await?;
        let pause = match &item {
            Err(_) => Some(delays.next().unwrap_or(policy.max)),
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => None,
            Ok(_) => {
                delays = policy.delays();
                None
            }
        };
        Some((item, (inner, delays, pause)))
    })
    .boxed()
}

/// A stream of watch events that re-lists and re-watches on its own (410 Gone, dropped
/// connections, server restarts); errors are passed through for logging, then retried.
pub type WatchStream<K> = BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>;

/// A Kubernetes client plus the typed calls the roles make. Cheap to clone.
#[derive(Clone)]
pub struct KubeClient {
    client: kube::Client,
    /// The server URL, for errors that must name it (TLS).
    server: std::sync::Arc<str>,
}

impl KubeClient {
    /// A client from a kubeconfig file (the tests' way in; the plugin amends the config first).
    #[cfg(any(test, feature = "test-hooks"))]
    pub async fn from_kubeconfig_file(path: &Path) -> Result<Self, KubeError> {
        let config = super::config::config_from_kubeconfig_file(path).await?;
        Self::from_config(config)
    }

    /// What the agent does: explicit path > $KUBECONFIG > in-cluster.
    pub async fn for_agent(explicit: Option<&Path>) -> Result<(Self, ConfigSource), KubeError> {
        let (config, source) = load_config(explicit).await?;
        Ok((Self::from_config(config)?, source))
    }

    /// Builds the HTTP stack (rustls with ring; webpki roots when the config has no CA).
    pub fn from_config(config: kube::Config) -> Result<Self, KubeError> {
        let server = config.cluster_url.to_string().trim_end_matches('/').into();
        let client = kube::client::ClientBuilder::try_from(config)
            .map_err(KubeError::BuildClient)?
            .with_layer(&super::gzip::GzipLayer)
            // Outside gzip: it reads the decompressed body.
            .with_layer(&super::protobuf::ProtobufLayer)
            .build();
        Ok(KubeClient { client, server })
    }

    /// The API server's URL.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The underlying client, for calls not covered here.
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    pub async fn get_pod(
        &self,
        namespace: &str,
        name: &str,
        timeout: Duration,
    ) -> Result<Pod, KubeError> {
        check_pod_names(Call::GetPod, namespace, name)?;
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        bounded(
            &self.server,
            Call::GetPod,
            format!("{namespace}/{name}"),
            timeout,
            api.get(name),
        )
        .await
    }

    pub async fn get_namespace(
        &self,
        name: &str,
        timeout: Duration,
    ) -> Result<Namespace, KubeError> {
        check_name(
            Call::GetNamespace,
            "namespace",
            names::check_namespace(name),
        )?;
        let api: Api<Namespace> = Api::all(self.client.clone());
        bounded(
            &self.server,
            Call::GetNamespace,
            name.to_string(),
            timeout,
            api.get(name),
        )
        .await
    }

    /// Pods in all namespaces matching `selectors`, and the list's resourceVersion (the stores
    /// list through their watch; the tests list here).
    #[cfg(any(test, feature = "test-hooks"))]
    pub async fn list_pods(&self, selectors: &Selectors, timeout: Duration) -> Listed<Pod> {
        self.list(Call::ListPods, selectors, timeout).await
    }

    #[cfg(any(test, feature = "test-hooks"))]
    pub async fn list_namespaces(
        &self,
        selectors: &Selectors,
        timeout: Duration,
    ) -> Listed<Namespace> {
        self.list(Call::ListNamespaces, selectors, timeout).await
    }

    #[cfg(any(test, feature = "test-hooks"))]
    async fn list<K>(&self, call: Call, selectors: &Selectors, timeout: Duration) -> Listed<K>
    where
        K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let api: Api<K> = Api::all(self.client.clone());
        let list = bounded(
            &self.server,
            call,
            selectors.describe(),
            timeout,
            api.list(&selectors.list_params()),
        )
        .await?;
        Ok((list.items, list.metadata.resource_version))
    }

    /// Watches pods in all namespaces, bookmarks on; the initial state streamed over the watch,
    /// or listed first where the server cannot stream it (`initial_list`).
    pub fn watch_pods(&self, selectors: &Selectors, backoff: WatchBackoff) -> WatchStream<Pod> {
        let api: Api<Pod> = Api::all(self.client.clone());
        watch(api, selectors, backoff)
    }

    pub fn watch_namespaces(
        &self,
        selectors: &Selectors,
        backoff: WatchBackoff,
    ) -> WatchStream<Namespace> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        watch(api, selectors, backoff)
    }

    /// Whether the API server allows a watch of `selectors` now: one is started and dropped at
    /// once (a store whose watch was refused learns so that it is allowed again).
    pub async fn watch_allowed<K>(&self, call: Call, selectors: &Selectors) -> Result<(), KubeError>
    where
        K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let api: Api<K> = Api::all(self.client.clone());
        let params = kube::api::WatchParams {
            field_selector: selectors.fields.clone(),
            label_selector: selectors.labels.clone(),
            timeout: Some(1),
            ..Default::default()
        };
        let started = tokio::time::timeout(PROBE_TIMEOUT, api.watch(&params, "0")).await;
        match started {
            Ok(Ok(_stream)) => Ok(()),
            Ok(Err(e)) => Err(KubeError::from_call_to(
                &self.server,
                call,
                selectors.describe(),
                e,
            )),
            Err(_) => Err(KubeError::Timeout {
                call,
                object: selectors.describe(),
                timeout: PROBE_TIMEOUT,
            }),
        }
    }

    /// A watch stream's error as the one call that failed: the list half (`list`) or the watch
    /// half (`watch`) of a list-then-watch over `selectors`, so 403/401/TLS read as they do for
    /// one-shot calls. The watcher's own `NoResourceVersion` is given back unchanged.
    pub fn watch_error(
        &self,
        list: Call,
        watch: Call,
        selectors: &Selectors,
        err: watcher::Error,
    ) -> Result<KubeError, watcher::Error> {
        let (call, source) = match err {
            watcher::Error::InitialListFailed(e) => (list, e),
            watcher::Error::WatchStartFailed(e) | watcher::Error::WatchFailed(e) => (watch, e),
            watcher::Error::WatchError(status) => (watch, kube::Error::Api(status)),
            other @ watcher::Error::NoResourceVersion => return Err(other),
        };
        Ok(KubeError::from_call_to(
            &self.server,
            call,
            selectors.describe(),
            source,
        ))
    }

    /// Merge-patches the pod's labels/annotations, through the pod itself or through its
    /// `pods/status` subresource ([`PodPatchVia`]).
    pub async fn patch_pod_metadata(
        &self,
        via: PodPatchVia,
        namespace: &str,
        name: &str,
        patch: &MetadataPatch,
        timeout: Duration,
    ) -> Result<Pod, KubeError> {
        let call = match via {
            PodPatchVia::Pod => Call::PatchPod,
            PodPatchVia::Status => Call::PatchPodStatus,
        };
        check_pod_names(call, namespace, name)?;
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let body = Patch::Merge(patch.to_merge_patch());
        let params = PatchParams::default();
        let object = format!("{namespace}/{name}");
        match via {
            PodPatchVia::Status => {
                bounded(
                    &self.server,
                    call,
                    object,
                    timeout,
                    api.patch_status(name, &params, &body),
                )
                .await
            }
            PodPatchVia::Pod => {
                bounded(
                    &self.server,
                    call,
                    object,
                    timeout,
                    api.patch(name, &params, &body),
                )
                .await
            }
        }
    }

    /// Deletes a pod; with `preconditions` the server refuses (Conflict) when the pod was
    /// replaced (other UID) or changed (other resourceVersion) since it was read.
    pub async fn delete_pod(
        &self,
        namespace: &str,
        name: &str,
        preconditions: Option<PodPreconditions>,
        timeout: Duration,
    ) -> Result<(), KubeError> {
        check_pod_names(Call::DeletePod, namespace, name)?;
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let params = DeleteParams {
            preconditions,
            ..DeleteParams::default()
        };
        bounded(
            &self.server,
            Call::DeletePod,
            format!("{namespace}/{name}"),
            timeout,
            api.delete(name, &params),
        )
        .await
        .map(|_| ())
    }

    /// Records an event about `pod` in the pod's namespace.
    pub async fn create_pod_event(
        &self,
        pod: &Pod,
        event: &EventRecord,
        timeout: Duration,
    ) -> Result<(), KubeError> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        check_name(
            Call::CreateEvent,
            "namespace",
            names::check_namespace(namespace),
        )?;
        let api: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        let body = event.to_event(pod, Time(k8s_openapi::jiff::Timestamp::now()));
        bounded(
            &self.server,
            Call::CreateEvent,
            format!("{namespace}/{name} {}", event.reason),
            timeout,
            api.create(&PostParams::default(), &body),
        )
        .await
        .map(|_| ())
    }
}

/// Kubernetes event severity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// A core/v1 Event about a pod, as client-go's event recorder writes it (the repair controller's
/// `DeleteBrokenPod` / `LabelBrokenPod` warnings, source component `cni-repair`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRecord {
    pub event_type: EventType,
    pub reason: String,
    pub message: String,
    pub component: String,
}

impl EventRecord {
    fn to_event(&self, pod: &Pod, now: Time) -> Event {
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let namespace = pod.metadata.namespace.clone();
        // client-go names events `<object>.<unix nanos in hex>`; unique enough per object.
        let nanos = now.0.as_nanosecond();
        Event {
            metadata: ObjectMeta {
                name: Some(format!("{pod_name}.{nanos:x}")),
                namespace: namespace.clone(),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod_name),
                namespace,
                uid: pod.metadata.uid.clone(),
                resource_version: pod.metadata.resource_version.clone(),
                ..ObjectReference::default()
            },
            type_: Some(self.event_type.as_str().into()),
            reason: Some(self.reason.clone()),
            message: Some(self.message.clone()),
            source: Some(EventSource {
                component: Some(self.component.clone()),
                host: None,
            }),
            count: Some(1),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            ..Event::default()
        }
    }
}

/// What a pod must still be for a delete to go through (UID, resourceVersion): the API's own
/// preconditions, named for the roles.
pub type PodPreconditions = Preconditions;

/// The pod as it was read: the same UID, so a new pod of the same name is never the one
/// deleted. Not the same resourceVersion: a crash-looping pod's kubelet writes its status on
/// every restart, so the copy read is often stale by the time the delete arrives, and the
/// server would refuse (409) the delete of a pod that is still the broken one.
pub fn pod_preconditions(pod: &Pod) -> PodPreconditions {
    Preconditions {
        uid: pod.metadata.uid.clone(),
        resource_version: None,
    }
}

/// Refuses a namespace/pod pair that cannot be part of a request path, before any request.
fn check_pod_names(call: Call, namespace: &str, name: &str) -> Result<(), KubeError> {
    check_name(call, "namespace", names::check_namespace(namespace))?;
    check_name(call, "pod name", names::check_pod_name(name))
}

pub(super) fn check_name(
    call: Call,
    field: &'static str,
    checked: Result<(), names::InvalidName>,
) -> Result<(), KubeError> {
    checked.map_err(|source| KubeError::InvalidName {
        call,
        field,
        source,
    })
}

/// Runs one call under a deadline and names the call and object in any error.
pub(super) async fn bounded<T>(
    server: &str,
    call: Call,
    object: String,
    timeout: Duration,
    request: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, KubeError> {
    match tokio::time::timeout(timeout, request).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => Err(KubeError::from_call_to(server, call, object, err)),
        Err(_) => Err(KubeError::Timeout {
            call,
            object,
            timeout,
        }),
    }
}

fn watch<K>(api: Api<K>, selectors: &Selectors, backoff: WatchBackoff) -> WatchStream<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    use watcher::InitialListStrategy::{ListWatch, StreamingList};
    let streaming = watcher(api.clone(), selectors.watcher_config(StreamingList)).boxed();
    let listed_config = selectors.watcher_config(ListWatch);
    let listed = move || watcher(api, listed_config).boxed();
    let events = super::initial_list::streaming_or_listed(
        streaming,
        listed,
        super::initial_list::STREAMING_DEADLINE,
    );
    backed_off(events, backoff)
}

#[cfg(test)]
mod tests;
