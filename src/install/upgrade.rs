//! "Is this shutdown an upgrade or a reboot?". When the DaemonSet still exists and still
//! targets this node, the node keeps our plugin, config and kubeconfig so pods keep starting
//! captured while the new agent comes up. Istio only asks in ambient mode; we ask in sidecar mode
//! too (L10), retry failures that may pass (timeouts, refused connections, 5xx) a few times,
//! and keep everything when no answer comes (B11). A failure that cannot pass by waiting
//! (NODE_NAME unset, a bad request) keeps everything at once instead of burning the grace period.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::kube::selector::{map_selector_matches, node_selector_matches};
use crate::kube::{KubeClient, KubeError};
use crate::retry::{RetryPolicy, retry_transient};

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

impl UpgradeCheckError {
    /// Whether asking again may get an answer (only the API's transient failures).
    pub fn is_transient(&self) -> bool {
        match self {
            UpgradeCheckError::NodeNameUnset => false,
            UpgradeCheckError::Kube(e) => e.is_transient(),
        }
    }
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

/// How many times to ask, and how long to wait between attempts (jittered down to half).
pub const ATTEMPTS: u32 = 3;
pub const RETRY_DELAY: Duration = Duration::from_secs(1);
/// No attempt starts later than this after shutdown began: the grace period is 30 s, and an
/// attempt takes at most two calls of `CALL_TIMEOUT`.
const ASK_DEADLINE: Duration = Duration::from_secs(20);

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
    let policy = RetryPolicy {
        first: retry_delay,
        max: retry_delay,
        max_attempts: Some(ATTEMPTS),
    };
    let answer = retry_transient(
        policy,
        Instant::now() + ASK_DEADLINE,
        UpgradeCheckError::is_transient,
        |e, delay| {
            warn!(
                retry_in_ms = delay.as_millis() as u64,
                "upgrade check failed: {e}"
            )
        },
        || check.is_upgrade(),
    )
    .await;
    match answer {
        Ok(keep) => {
            if keep {
                info!(
                    "the DaemonSet still targets this node (upgrade or restart): keeping the installation"
                );
            }
            keep
        }
        Err(e) if e.is_transient() => {
            warn!("upgrade check kept failing ({e}); keeping the installation to be safe");
            true
        }
        Err(e) => {
            warn!("upgrade check cannot answer ({e}); keeping the installation to be safe");
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    struct Flaky {
        calls: AtomicU32,
        fail_first: u32,
        answer: bool,
        /// The failures are ones waiting may cure (an API timeout) or not (NODE_NAME unset).
        transient: bool,
    }

    fn flaky(fail_first: u32, answer: bool, transient: bool) -> Flaky {
        Flaky {
            calls: AtomicU32::new(0),
            fail_first,
            answer,
            transient,
        }
    }

    impl UpgradeCheck for Flaky {
        fn is_upgrade(&self) -> BoxFuture<'_, Result<bool, UpgradeCheckError>> {
            let n = self.calls.fetch_add(1, Ordering::SeqCst);
            let out = match n < self.fail_first {
                false => Ok(self.answer),
                true if self.transient => Err(UpgradeCheckError::Kube(KubeError::Timeout {
                    call: crate::kube::Call::GetDaemonSet,
                    object: "istio-system/istio-cni-node".into(),
                    timeout: CALL_TIMEOUT,
                })),
                true => Err(UpgradeCheckError::NodeNameUnset),
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
        let f = flaky(2, true, true);
        assert!(block(should_keep(&f, false, z)));
        assert_eq!(f.calls.load(Ordering::SeqCst), 3);
        let f = flaky(9, false, true);
        assert!(block(should_keep(&f, false, z)), "never answered: keep");
        assert_eq!(f.calls.load(Ordering::SeqCst), ATTEMPTS);
        let f = flaky(0, true, true);
        assert!(
            !block(should_keep(&f, true, z)),
            "safe upgrade disabled: clean up"
        );
    }

    #[test]
    fn a_permanent_failure_is_not_retried_and_keeps_at_once() {
        let f = flaky(1, false, false);
        assert!(!UpgradeCheckError::NodeNameUnset.is_transient());
        assert!(block(should_keep(&f, false, Duration::from_secs(5))));
        assert_eq!(f.calls.load(Ordering::SeqCst), 1, "asked once");
    }
}
