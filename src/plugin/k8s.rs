//! The plugin's two Kubernetes reads behind a small trait, so the ADD flow can be driven by a fake
//! in unit tests. The real implementation is the crate's one Kubernetes client ([`crate::kube`]).

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod};

use crate::kube::KubeError;

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

/// The shared client ([`crate::kube::KubeClient`]) built from the agent-written kubeconfig.
pub struct KubeClient {
    client: crate::kube::KubeClient,
}

impl KubeClient {
    /// kube's own retry of 429/503/504 is turned off: the ADD flow retries transient errors itself
    /// (one policy, deadline-aware, logged), and a final error then says 503, not "no answer".
    pub async fn from_kubeconfig(path: &Path) -> Result<KubeClient, KubeCallError> {
        let client_error = |source| KubeCallError::Client { source };
        let mut config = crate::kube::config_from_kubeconfig_file(path)
            .await
            .map_err(client_error)?;
        config.default_retry = false;
        crate::kube::KubeClient::from_config(config)
            .map(|client| KubeClient { client })
            .map_err(client_error)
    }
}

impl KubeReads for KubeClient {
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
