//! One pod at a time: the plugin's `/cmdadd` and the worker's watch events can both act on the
//! same pod (an ADD arrives while the pod's first update is being handled). Each add, remove or
//! probe re-assertion of a pod holds that pod's lock, so their steps never interleave; different
//! pods never wait for each other. Locks exist only while someone holds or waits for them.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, Weak};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// Async locks keyed by pod (`namespace/name`).
#[derive(Default)]
pub struct PodLocks {
    locks: Mutex<HashMap<String, Weak<AsyncMutex<()>>>>,
}

impl PodLocks {
    /// Waits for the pod's lock; it is released when the guard drops.
    pub async fn lock(&self, pod: &str) -> OwnedMutexGuard<()> {
        let lock = {
            let mut locks = self.locks.lock();
            // Forget locks nobody holds any more (bounded by the pods in flight).
            locks.retain(|_, l| l.strong_count() > 0);
            match locks.get(pod).and_then(Weak::upgrade) {
                Some(lock) => lock,
                None => {
                    let lock = Arc::new(AsyncMutex::new(()));
                    locks.insert(pod.to_string(), Arc::downgrade(&lock));
                    lock
                }
            }
        };
        lock.lock_owned().await
    }

    /// Pods with a lock held or awaited.
    pub fn len(&self) -> usize {
        let locks = self.locks.lock();
        locks.values().filter(|l| l.strong_count() > 0).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    async fn hold(locks: Arc<PodLocks>, pod: &'static str, inside: Arc<AtomicU32>) -> u32 {
        let _guard = locks.lock(pod).await;
        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
        inside.fetch_sub(1, Ordering::SeqCst);
        now
    }

    #[tokio::test]
    async fn one_pod_at_a_time_different_pods_together() {
        let locks = Arc::new(PodLocks::default());
        let same = Arc::new(AtomicU32::new(0));
        let tasks: Vec<_> = (0..4)
            .map(|_| tokio::spawn(hold(locks.clone(), "ns/a", same.clone())))
            .collect();
        for t in tasks {
            assert_eq!(t.await.unwrap(), 1, "two holders of one pod's lock");
        }
        let both = Arc::new(AtomicU32::new(0));
        let (a, b) = tokio::join!(
            hold(locks.clone(), "ns/a", both.clone()),
            hold(locks.clone(), "ns/b", both.clone())
        );
        assert_eq!(a.max(b), 2, "different pods waited for each other");
        assert!(locks.is_empty(), "locks outlived their holders");
    }
}
