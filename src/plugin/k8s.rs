//! The plugin's two Kubernetes reads behind a small trait, so the ADD flow can be driven by a fake
//! in unit tests. The real implementation is the crate's one Kubernetes client ([`crate::kube`]).
//! Before any of them, the pod may come from install-cni's node pod store over the pod-facts
//! socket ([`cached_pod`]), with a budget of a few milliseconds.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod};

use crate::kube::KubeError;
use crate::wire::pod_facts::{PodFactsAnswer, PodFactsRequest};

/// Why a read failed; the shared client's error is kept as the source.
#[derive(Debug, thiserror::Error)]
pub enum KubeCallError {
    /// The source names the kubeconfig path.
    #[error("cannot build a Kubernetes client: {source}")]
    Client {
        #[source]
        source: KubeError,
    },
    /// The shared client's error; it names the call, the object and the cause.
    #[error(transparent)]
    Api(#[from] KubeError),
}

impl KubeCallError {
    /// Worth trying again (refused, reset, timeout, 429, 5xx); see [`KubeError::is_transient`].
    pub fn is_transient(&self) -> bool {
        match self {
            KubeCallError::Client { .. } => false,
            KubeCallError::Api(e) => e.is_transient(),
        }
    }
}

/// Reads the plugin needs.
pub trait KubeReads {
    fn get_pod(
        &self,
        namespace: &str,
        name: &str,
        timeout: Duration,
    ) -> impl Future<Output = Result<Pod, KubeCallError>> + Send;
    fn get_namespace(
        &self,
        name: &str,
        timeout: Duration,
    ) -> impl Future<Output = Result<Namespace, KubeCallError>> + Send;
}

/// The plugin's view of the API: the shared client ([`crate::kube::KubeClient`]) built from the
/// agent-written kubeconfig, answering only the reads the ADD flow makes ([`KubeReads`]).
pub struct PluginKube {
    client: crate::kube::KubeClient,
}

impl PluginKube {
    /// kube's own retry of 429/503/504 is turned off: the ADD flow retries transient errors itself
    /// (one policy, deadline-aware, logged), and a final error then says 503, not "no answer".
    pub async fn from_kubeconfig(path: &Path) -> Result<PluginKube, KubeCallError> {
        let client_error = |source| KubeCallError::Client { source };
        let mut config = crate::kube::config_from_kubeconfig_file(path)
            .await
            .map_err(client_error)?;
        config.default_retry = false;
        crate::kube::KubeClient::from_config(config)
            .map(|client| PluginKube { client })
            .map_err(client_error)
    }
}

impl KubeReads for PluginKube {
    fn get_pod(
        &self,
        namespace: &str,
        name: &str,
        timeout: Duration,
    ) -> impl Future<Output = Result<Pod, KubeCallError>> + Send {
        let client = self.client.clone();
        let (namespace, name) = (namespace.to_string(), name.to_string());
        async move {
            client
                .get_pod(&namespace, &name, timeout)
                .await
                .map_err(KubeCallError::from)
        }
    }

    fn get_namespace(
        &self,
        name: &str,
        timeout: Duration,
    ) -> impl Future<Output = Result<Namespace, KubeCallError>> + Send {
        let client = self.client.clone();
        let name = name.to_string();
        async move {
            client
                .get_namespace(&name, timeout)
                .await
                .map_err(KubeCallError::from)
        }
    }
}

/// The largest answer read from the pod-facts socket (a trimmed pod is a few KiB).
const MAX_FACTS_ANSWER: u64 = 1 << 20;

/// Why the pod-facts socket gave nothing usable (the plugin then GETs; logged at debug).
#[derive(Debug, thiserror::Error)]
pub enum FactsError {
    #[error("cannot ask {path}: {source}")]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no answer from {path} within {budget:?}")]
    Timeout {
        path: std::path::PathBuf,
        budget: Duration,
    },
    #[error("unreadable answer from {path}: {source}")]
    Decode {
        path: std::path::PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// One request to install-cni's pod store over its socket (`wire::pod_facts`), all of it —
/// connect, write, read — within `budget`.
pub async fn ask_pod_facts(
    path: &Path,
    request: &PodFactsRequest,
    budget: Duration,
) -> Result<PodFactsAnswer, FactsError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let io = |source| FactsError::Io {
        path: path.to_path_buf(),
        source,
    };
    let exchange = async {
        let mut stream = tokio::net::UnixStream::connect(path).await.map_err(io)?;
        stream.write_all(&request.encode()).await.map_err(io)?;
        let mut answer = Vec::with_capacity(4096);
        (&mut stream)
            .take(MAX_FACTS_ANSWER)
            .read_to_end(&mut answer)
            .await
            .map_err(io)?;
        PodFactsAnswer::decode(&answer).map_err(|source| FactsError::Decode {
            path: path.to_path_buf(),
            source,
        })
    };
    tokio::time::timeout(budget, exchange)
        .await
        .map_err(|_| FactsError::Timeout {
            path: path.to_path_buf(),
            budget,
        })?
}

/// A pod from the node's pod store the plugin may use instead of a GET.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedPod {
    pub pod: Pod,
    /// Present when asked for and the agent's namespace store had them.
    pub namespace_labels: Option<std::collections::BTreeMap<String, String>>,
}

/// The plugin's rule for using pod facts (docs/plugin.md): the runtime named the pod's uid, the
/// answer is a pod with that uid and a spec, and when the namespace's labels are needed (the
/// ambient check) they came with it. Anything else — no socket, too slow, "not yet", an error —
/// is `None` and the caller GETs from the API server.
pub async fn cached_pod(
    run_dir: &Path,
    namespace: &str,
    name: &str,
    uid: &str,
    need_namespace_labels: bool,
    budget: Duration,
) -> Option<CachedPod> {
    if uid.is_empty() {
        tracing::debug!("no K8S_POD_UID in CNI_ARGS: pod facts not asked");
        return None;
    }
    let request = PodFactsRequest {
        namespace: namespace.to_string(),
        name: name.to_string(),
        uid: uid.to_string(),
        namespace_labels: need_namespace_labels,
    };
    let path = crate::wire::pod_facts::socket_path(run_dir);
    let reason = match ask_pod_facts(&path, &request, budget).await {
        Ok(PodFactsAnswer::Pod {
            pod,
            namespace_labels,
        }) => {
            let same_uid = pod.metadata.uid.as_deref() == Some(uid);
            let has_spec = pod.spec.as_ref().is_some_and(|s| !s.containers.is_empty());
            if same_uid && has_spec && (namespace_labels.is_some() || !need_namespace_labels) {
                return Some(CachedPod {
                    pod: *pod,
                    namespace_labels,
                });
            }
            format!(
                "answer not usable (same uid: {same_uid}, spec: {has_spec}, namespace labels: {})",
                namespace_labels.is_some()
            )
        }
        Ok(PodFactsAnswer::NotYet { reason }) => format!("not yet: {reason}"),
        Ok(PodFactsAnswer::Error { message }) => format!("refused: {message}"),
        Err(e) => e.to_string(),
    };
    tracing::debug!(pod = %format!("{namespace}/{name}"), %reason, "pod facts not used; asking the API server");
    None
}
