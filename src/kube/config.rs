//! Where a client's configuration comes from: an explicit kubeconfig, $KUBECONFIG, in-cluster.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};

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
    let kubeconfig = read_kubeconfig(path).map_err(|source| KubeError::Kubeconfig {
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

/// Reads one kubeconfig file through kube's reader, which indexes past the end of a UTF-16 file
/// (byte-order mark) with an odd number of bytes and panics (found by fuzz/kubeconfig): such a file
/// is refused here naming it, and any other panic inside the reader becomes an error naming the
/// file rather than unwinding into a CNI call.
fn read_kubeconfig(path: &Path) -> Result<Kubeconfig, KubeconfigError> {
    let refuse = |io: std::io::Error| KubeconfigError::ReadConfig(io, path.to_path_buf());
    // A read error here is left to kube's reader, which reports it the usual way.
    if let Ok(bytes) = std::fs::read(path)
        && (bytes.starts_with(&[0xff, 0xfe]) || bytes.starts_with(&[0xfe, 0xff]))
        && bytes.len() % 2 == 1
    {
        return Err(refuse(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "UTF-16 text (byte-order mark) with an odd number of bytes",
        )));
    }
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| Kubeconfig::read_from(path)))
        .unwrap_or_else(|_| {
            Err(refuse(std::io::Error::other(
                "the kubeconfig reader failed on this file (panicked)",
            )))
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
                read_kubeconfig(path).and_then(|next| merged.merge(next))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_odd_length_utf16_kubeconfig_is_an_error_naming_the_file_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        for (name, bom) in [("le", [0xff, 0xfe]), ("be", [0xfe, 0xff])] {
            let path = dir.path().join(name);
            std::fs::write(&path, [&bom[..], b"a"].concat()).unwrap();
            let err = config_from_kubeconfig_file(&path).await.unwrap_err();
            let text = err.to_string();
            assert!(text.contains(&*path.to_string_lossy()), "{text}");
            assert!(text.contains("odd number of bytes"), "{text}");
        }
        // An even-length UTF-16 file still goes to kube's reader (and is read as UTF-16).
        let path = dir.path().join("even");
        let text: Vec<u8> = [0xff, 0xfe]
            .into_iter()
            .chain("x: [".encode_utf16().flat_map(u16::to_le_bytes))
            .collect();
        std::fs::write(&path, text).unwrap();
        let err = config_from_kubeconfig_file(&path).await.unwrap_err();
        assert!(!err.to_string().contains("odd number"), "{err}");
    }
}
