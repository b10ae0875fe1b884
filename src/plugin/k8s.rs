//! The plugin's two Kubernetes reads behind a small trait, so the ADD flow can be driven by a fake
//! in unit tests. The real implementation is the crate's one Kubernetes client ([`crate::kube`]).

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod};

/// Why a read failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum KubeCallError {
    #[error("cannot build a Kubernetes client from {path}: {reason}")]
    Client { path: String, reason: String },
    #[error("{what}: no answer within {timeout:?}")]
    Timeout { what: String, timeout: Duration },
    /// The shared client's error; it names the call, the object and the cause.
    #[error("{0}")]
    Api(String),
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
    pub async fn from_kubeconfig(path: &Path) -> Result<KubeClient, KubeCallError> {
        crate::kube::KubeClient::from_kubeconfig_file(path)
            .await
            .map(|client| KubeClient { client })
            .map_err(|e| KubeCallError::Client {
                path: path.display().to_string(),
                reason: e.to_string(),
            })
    }
}

fn call_error(e: crate::kube::KubeError, timeout: Duration) -> KubeCallError {
    match e {
        crate::kube::KubeError::Timeout { call, object, .. } => KubeCallError::Timeout {
            what: format!("{call} {object}"),
            timeout,
        },
        other => KubeCallError::Api(other.to_string()),
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
                .map_err(|e| call_error(e, timeout))
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
                .map_err(|e| call_error(e, timeout))
        }
    }
}
