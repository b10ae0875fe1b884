//! Where a client's configuration comes from: an explicit kubeconfig, $KUBECONFIG, in-cluster.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use kube::config::{KubeConfigOptions, Kubeconfig};

use super::error::KubeError;

/// Where a client's configuration came from; logged by the roles at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigSource {
    /// An explicit kubeconfig path (the plugin's netconf `kubeconfig` field, an agent flag).
    File(PathBuf),
    /// The file(s) named by $KUBECONFIG.
    KubeconfigEnv,
    /// The pod's service account (KUBERNETES_SERVICE_HOST/PORT + token + CA).
    InCluster,
}

/// How logs name the source: the path, `$KUBECONFIG` or `in-cluster`.
impl std::fmt::Display for ConfigSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigSource::File(path) => write!(f, "{}", path.display()),
            ConfigSource::KubeconfigEnv => f.write_str("$KUBECONFIG"),
            ConfigSource::InCluster => f.write_str("in-cluster"),
        }
    }
}

/// Reads one kubeconfig file (current context) into a client config.
pub async fn config_from_kubeconfig_file(path: &Path) -> Result<kube::Config, KubeError> {
    let kubeconfig = Kubeconfig::read_from(path).map_err(|source| KubeError::Kubeconfig {
        path: path.to_path_buf(),
        source,
    })?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|source| KubeError::Kubeconfig {
            path: path.to_path_buf(),
            source,
        })
}

/// The agent's order: explicit path > $KUBECONFIG (may list several files) > in-cluster.
/// `~/.kube/config` is deliberately not consulted: the agent runs in a pod, not in a user's shell.
pub async fn load_config(
    explicit: Option<&Path>,
) -> Result<(kube::Config, ConfigSource), KubeError> {
    load_config_with(explicit, std::env::var_os("KUBECONFIG").as_deref()).await
}

/// [`load_config`] with the value of $KUBECONFIG passed in (testable without touching the
/// process environment).
pub async fn load_config_with(
    explicit: Option<&Path>,
    kubeconfig_env: Option<&OsStr>,
) -> Result<(kube::Config, ConfigSource), KubeError> {
    if let Some(path) = explicit {
        let config = config_from_kubeconfig_file(path).await?;
        return Ok((config, ConfigSource::File(path.to_path_buf())));
    }
    // Like kubectl: a path list, empty entries ignored, merged with the first file winning.
    let env_paths: Vec<PathBuf> = kubeconfig_env
        .map(|value| {
            std::env::split_paths(value)
                .filter(|p| !p.as_os_str().is_empty())
                .collect()
        })
        .unwrap_or_default();
    if !env_paths.is_empty() {
        let merged = env_paths
            .iter()
            .try_fold(Kubeconfig::default(), |merged, path| {
                Kubeconfig::read_from(path).and_then(|next| merged.merge(next))
            })
            .map_err(KubeError::KubeconfigEnv)?;
        let config = kube::Config::from_custom_kubeconfig(merged, &KubeConfigOptions::default())
            .await
            .map_err(KubeError::KubeconfigEnv)?;
        return Ok((config, ConfigSource::KubeconfigEnv));
    }
    let config = kube::Config::incluster().map_err(KubeError::InCluster)?;
    Ok((config, ConfigSource::InCluster))
}
