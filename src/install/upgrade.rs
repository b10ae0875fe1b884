//! "Is this shutdown an upgrade or a reboot?" (§2.10). When the DaemonSet still exists and still
//! targets this node, the node keeps our plugin, config and kubeconfig so pods keep starting
//! captured while the new agent comes up. Istio only asks in ambient mode; we ask in sidecar mode
//! too (L10), retry a few times and keep everything when the answer never comes (B11).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tracing::{info, warn};

/// A boxed future (the trait must stay object-safe).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Answers whether the agent is stopping for an upgrade/restart (true) or for good (false).
pub trait UpgradeCheck: Send + Sync {
    fn is_upgrade(&self) -> BoxFuture<'_, Result<bool, String>>;
}

/// Used when no Kubernetes API is configured: always "not an upgrade", so shutdown cleans up.
pub struct NoApi;

impl UpgradeCheck for NoApi {
    fn is_upgrade(&self) -> BoxFuture<'_, Result<bool, String>> {
        Box::pin(async { Ok(false) })
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
    let mut last_err = String::new();
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
                last_err = e;
            }
        }
        if attempt < ATTEMPTS {
            tokio::time::sleep(retry_delay).await;
        }
    }
    warn!("upgrade check kept failing ({last_err}); keeping the installation to be safe");
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
        fn is_upgrade(&self) -> BoxFuture<'_, Result<bool, String>> {
            let n = self.calls.fetch_add(1, Ordering::SeqCst);
            let out = if n < self.fail_first {
                Err("apiserver unavailable".to_string())
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
