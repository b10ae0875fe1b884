//! The plugin's two Kubernetes reads behind a small trait, so the ADD flow can be driven by a fake
//! in unit tests. The real implementation builds a client from the agent-written kubeconfig.

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
    #[error("{what}: {reason}")]
    Failed { what: String, reason: String },
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

/// A client built from a kubeconfig file.
pub struct KubeClient {
    client: kube::Client,
}

impl KubeClient {
    /// Reads the kubeconfig and builds the client; every request is also bounded by
    /// `call_timeout` at the connection level.
    pub async fn from_kubeconfig(
        path: &Path,
        call_timeout: Duration,
    ) -> Result<KubeClient, KubeCallError> {
        let err = |reason: String| KubeCallError::Client {
            path: path.display().to_string(),
            reason,
        };
        let kubeconfig =
            kube::config::Kubeconfig::read_from(path).map_err(|e| err(e.to_string()))?;
        let mut config = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .map_err(|e| err(e.to_string()))?;
        config.connect_timeout = Some(call_timeout);
        config.read_timeout = Some(call_timeout);
        config.write_timeout = Some(call_timeout);
        let client = kube::Client::try_from(config).map_err(|e| err(e.to_string()))?;
        Ok(KubeClient { client })
    }
}

async fn bounded<T>(
    what: String,
    timeout: Duration,
    call: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, KubeCallError> {
    match tokio::time::timeout(timeout, call).await {
        Err(_) => Err(KubeCallError::Timeout { what, timeout }),
        Ok(Err(e)) => Err(KubeCallError::Failed {
            what,
            reason: e.to_string(),
        }),
        Ok(Ok(v)) => Ok(v),
    }
}

impl KubeReads for KubeClient {
    fn get_pod(
        &self,
        namespace: &str,
        name: &str,
        timeout: Duration,
    ) -> impl Future<Output = Result<Pod, KubeCallError>> + Send {
        let api: kube::Api<Pod> = kube::Api::namespaced(self.client.clone(), namespace);
        let what = format!("get pod {namespace}/{name}");
        let name = name.to_string();
        async move { bounded(what, timeout, api.get(&name)).await }
    }

    fn get_namespace(
        &self,
        name: &str,
        timeout: Duration,
    ) -> impl Future<Output = Result<Namespace, KubeCallError>> + Send {
        let api: kube::Api<Namespace> = kube::Api::all(self.client.clone());
        let what = format!("get namespace {name}");
        let name = name.to_string();
        async move { bounded(what, timeout, api.get(&name)).await }
    }
}
