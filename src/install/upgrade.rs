//! "Is this shutdown an upgrade or a reboot?" (§2.10). When the DaemonSet still exists and still
//! targets this node, the node keeps our plugin, config and kubeconfig so pods keep starting
//! captured while the new agent comes up. Istio only asks in ambient mode; we ask in sidecar mode
//! too (L10), retry a few times and keep everything when the answer never comes (B11).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tracing::{info, warn};

use crate::kube::selector::{map_selector_matches, node_selector_matches};
use crate::kube::{KubeClient, KubeError};

/// A boxed future (the trait must stay object-safe).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Why the upgrade check could not answer.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeCheckError {
    #[error("NODE_NAME is not set; cannot tell whether the DaemonSet still targets this node")]
    NodeNameUnset,
    #[error(transparent)]
    Kube(#[from] KubeError),
}

/// Answers whether the agent is stopping for an upgrade/restart (true) or for good (false).
pub trait UpgradeCheck: Send + Sync {
    fn is_upgrade(&self) -> BoxFuture<'_, Result<bool, UpgradeCheckError>>;
}

/// Used when no Kubernetes API is configured: always "not an upgrade", so shutdown cleans up.
pub struct NoApi;

impl UpgradeCheck for NoApi {
    fn is_upgrade(&self) -> BoxFuture<'_, Result<bool, UpgradeCheckError>> {
        Box::pin(async { Ok(false) })
    }
}

/// The DaemonSet Istio's chart deploys the agent as.
pub const DAEMONSET_NAME: &str = "istio-cni-node";
/// Deadline of each API call (3 attempts must fit the 30 s grace period).
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// Asks the API: does the DaemonSet still exist, not being deleted, and still target this node?
pub struct DaemonSetCheck {
    pub client: KubeClient,
    pub namespace: String,
    pub node: String,
}

/// Outcome of one GET.
enum Got<T> {
    Found(T),
    Gone,
}

/// Not found, and (our RBAC is removed together with the DaemonSet on uninstall) 401/403, mean
/// the object is gone for us.
fn got<T>(answer: Result<Option<T>, KubeError>) -> Result<Got<T>, KubeError> {
    match answer {
        Ok(Some(obj)) => Ok(Got::Found(obj)),
        Ok(None) | Err(KubeError::Forbidden { .. } | KubeError::Unauthorized { .. }) => {
            Ok(Got::Gone)
        }
        Err(e) => Err(e),
    }
}

impl UpgradeCheck for DaemonSetCheck {
    fn is_upgrade(&self) -> BoxFuture<'_, Result<bool, UpgradeCheckError>> {
        Box::pin(async move {
            let answer = self
                .client
                .get_daemonset(&self.namespace, DAEMONSET_NAME, CALL_TIMEOUT)
                .await;
            let ds = match got(answer)? {
                Got::Gone => {
                    info!(namespace = %self.namespace, "DaemonSet {DAEMONSET_NAME} is gone: uninstall");
                    return Ok(false);
                }
                Got::Found(ds) if ds.metadata.deletion_timestamp.is_some() => {
                    info!("DaemonSet {DAEMONSET_NAME} is being deleted: uninstall");
                    return Ok(false);
                }
                Got::Found(ds) => ds,
            };
            let pod_spec = ds.spec.and_then(|s| s.template.spec);
            let selector = pod_spec
                .as_ref()
                .and_then(|p| p.node_selector.clone())
                .unwrap_or_default();
            let required = pod_spec
                .and_then(|p| p.affinity)
                .and_then(|a| a.node_affinity)
                .and_then(|n| n.required_during_scheduling_ignored_during_execution);
            if selector.is_empty() && required.is_none() {
                return Ok(true);
            }
            if self.node.is_empty() {
                return Err(UpgradeCheckError::NodeNameUnset);
            }
            let answer = self.client.get_node(&self.node, CALL_TIMEOUT).await;
            let node = match got(answer)? {
                Got::Found(n) => n,
                Got::Gone => return Ok(false),
            };
            let labels = node.metadata.labels.clone().unwrap_or_default();
            let name = node.metadata.name.clone().unwrap_or_default();
            let targeted = map_selector_matches(&selector, &labels)
                && required
                    .as_ref()
                    .is_none_or(|r| node_selector_matches(r, &labels, &name));
            if !targeted {
                info!(node = %self.node, "the DaemonSet no longer targets this node: uninstall");
            }
            Ok(targeted)
        })
    }
}

/// Picks the check: the API when a client can be built (explicit $KUBECONFIG first, then
/// in-cluster) and POD_NAMESPACE is known; otherwise "not an upgrade".
pub async fn checker(namespace: &str, node: &str) -> Box<dyn UpgradeCheck> {
    if namespace.is_empty() {
        info!("POD_NAMESPACE is not set: no upgrade check, shutdown will clean up");
        return Box::new(NoApi);
    }
    match KubeClient::for_agent(None).await {
        Ok((client, source)) => {
            info!(source = %source, "upgrade check on shutdown uses the Kubernetes API");
            Box::new(DaemonSetCheck {
                client,
                namespace: namespace.to_string(),
                node: node.to_string(),
            })
        }
        Err(e) if std::env::var_os("KUBECONFIG").is_some() => {
            warn!(
                "$KUBECONFIG is set but unusable ({e}): no upgrade check, shutdown will clean up"
            );
            Box::new(NoApi)
        }
        Err(e) => {
            info!("no Kubernetes API configured ({e}): shutdown will clean up");
            Box::new(NoApi)
        }
    }
}

/// How many times to ask, and how long to wait between attempts.
pub const ATTEMPTS: u32 = 3;
pub const RETRY_DELAY: Duration = Duration::from_secs(1);

/// Decides whether shutdown keeps the installation in place.
pub async fn should_keep(
    check: &dyn UpgradeCheck,
    disable_safe_upgrade: bool,
    retry_delay: Duration,
) -> bool {
    if disable_safe_upgrade {
        info!("AMBIENT_DISABLE_SAFE_UPGRADE is set: cleaning up on shutdown");
        return false;
    }
    let mut last_err = None;
    for attempt in 1..=ATTEMPTS {
        match check.is_upgrade().await {
            Ok(keep) => {
                if keep {
                    info!(
                        "the DaemonSet still targets this node (upgrade or restart): keeping the installation"
                    );
                }
                return keep;
            }
            Err(e) => {
                warn!(attempt, "upgrade check failed: {e}");
                last_err = Some(e);
            }
        }
        if attempt < ATTEMPTS {
            tokio::time::sleep(retry_delay).await;
        }
    }
    if let Some(e) = last_err {
        warn!("upgrade check kept failing ({e}); keeping the installation to be safe");
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    struct Flaky {
        calls: AtomicU32,
        fail_first: u32,
        answer: bool,
    }

    impl UpgradeCheck for Flaky {
        fn is_upgrade(&self) -> BoxFuture<'_, Result<bool, UpgradeCheckError>> {
            let n = self.calls.fetch_add(1, Ordering::SeqCst);
            let out = if n < self.fail_first {
                Err(UpgradeCheckError::NodeNameUnset)
            } else {
                Ok(self.answer)
            };
            Box::pin(async move { out })
        }
    }

    fn block<T>(f: impl Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    #[test]
    fn decisions() {
        let z = Duration::ZERO;
        assert!(!block(should_keep(&NoApi, false, z)));
        let f = Flaky {
            calls: AtomicU32::new(0),
            fail_first: 2,
            answer: true,
        };
        assert!(block(should_keep(&f, false, z)));
        assert_eq!(f.calls.load(Ordering::SeqCst), 3);
        let f = Flaky {
            calls: AtomicU32::new(0),
            fail_first: 9,
            answer: false,
        };
        assert!(block(should_keep(&f, false, z)), "never answered: keep");
        let f = Flaky {
            calls: AtomicU32::new(0),
            fail_first: 0,
            answer: true,
        };
        assert!(
            !block(should_keep(&f, true, z)),
            "safe upgrade disabled: clean up"
        );
    }
}
