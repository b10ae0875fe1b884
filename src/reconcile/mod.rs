//! The one keyed reconcile engine for pod work (the ambient agent and the repair controller).
//!
//! Every trigger — a watch event, a plugin's add request, a drift finding, ztunnel (re)connecting —
//! is "look at this key again": [`Engine::trigger`] (with a payload: [`Engine::trigger_with`]). The engine guarantees that a key is never
//! worked twice at once (a trigger while it runs marks it dirty, and it runs once more after),
//! that triggers of a key not yet started coalesce into one run, that at most `concurrency` keys
//! run at a time, and that a failure is decided once, by the error's own [`Classify::class`]:
//! retried after a jittered, doubling delay, given up (until the next trigger), or parked until
//! something the key waits for triggers it again (with a slow safety retry). A caller that needs
//! the result of its trigger (the plugin's `/podadd`) uses [`Engine::trigger_with_and_wait`]: it gets
//! the result of the first run that starts after its trigger.
//!
//! The reconcile function reads the world as it is now (level-based). What a trigger knows that
//! the world does not show — a plugin's offer of a netns, a drift finding with the rules to heal,
//! the last object of a deleted pod — is the key's [`Payload`], kept in the key's state beside
//! its phase: triggers merge theirs into it (so it is bounded per key, never a queue), and the
//! key's next run takes it whole. A failed run hands its retry what [`Payload::for_retry`] keeps.
//!
//! Why not kube-runtime's `Controller`: it drives one resource's watch stream and cannot take
//! triggers from elsewhere with a caller awaiting that key's outcome (the plugin's add), nor let
//! the error decide between retry, give-up and wait. The queue here is small and owns only that.
//!
//! May call: `retry`.

use std::collections::HashMap;
use std::fmt::{Debug, Display};
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::future::BoxFuture;
use parking_lot::Mutex;
use tokio::sync::{Semaphore, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};

use crate::retry::RetryPolicy;

#[cfg(test)]
mod tests;

/// What to do about a failed run of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Transient: run the key again after a jittered, doubling delay.
    Retry,
    /// Permanent: nothing will change by trying again; the key rests until its next trigger.
    GiveUp,
    /// Waiting for something that triggers the key when it comes (a namespace in the store,
    /// ztunnel connecting); tried again after the policy's longest delay regardless.
    WaitFor,
}

/// The one decision about an error: the error type says what kind of failure it is.
pub trait Classify {
    fn class(&self) -> Class;
}

/// What triggers bring for a key's next run, beyond "look again".
pub trait Payload: Default + Send + 'static {
    /// A newer trigger's payload joins the one not yet taken.
    fn merge(&mut self, newer: Self);
    /// What a failed run's retry still needs of the payload it took (by default nothing: the
    /// retry reads the world).
    fn for_retry(&self) -> Self {
        Self::default()
    }
}

/// No payload: every trigger is only "look again".
impl Payload for () {
    fn merge(&mut self, _: ()) {}
}

/// The work done for one key.
pub trait Reconcile: Send + Sync + 'static {
    type Key: Clone + Eq + Hash + Display + Debug + Send + Sync + 'static;
    /// What a successful run says (handed to callers waiting on the key).
    type Done: Clone + Send + Sync + 'static;
    type Error: Classify + Display + Send + Sync + 'static;
    /// What triggers bring for the key's next run (`()` when the world says it all).
    type Payload: Payload;

    /// Brings `key` to where it should be, reading the world as it is now, with what the
    /// triggers since the last run brought. `retry` counts the key's failed runs since its last
    /// success (0 on a first run).
    fn reconcile(
        &self,
        key: Self::Key,
        payload: Self::Payload,
        retry: u32,
    ) -> BoxFuture<'_, Result<Self::Done, Self::Error>>;
}

/// How the engine spaces and bounds work.
#[derive(Debug, Clone, Copy)]
pub struct EngineConfig {
    /// Keys run at once.
    pub concurrency: usize,
    /// Spacing of retries (`max_attempts` unused: a key is retried until it succeeds, gives up
    /// or is triggered again); `max` is also the safety retry of a parked key.
    pub retry: RetryPolicy,
    /// A trigger of a key waiting for its retry runs it now (the agent: an event is new
    /// information) or is absorbed by the retry that is due anyway (the repair controller: the
    /// retry reads the newest state, and events must not shorten its backoff).
    pub trigger_cuts_backoff: bool,
}

/// The result a waiting caller gets: the run's value, or its error (shared: several callers
/// may wait on one run).
pub type Answer<R> = Result<<R as Reconcile>::Done, Arc<<R as Reconcile>::Error>>;

/// Why a waiting caller got no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the reconcile engine stopped before the key ran")]
pub struct Stopped;

/// Counters, for logs and tests.
#[derive(Debug, Default)]
pub struct Stats {
    /// Runs finished (any result).
    pub runs: AtomicU64,
    /// Triggers absorbed by a run already queued or a dirty mark already set.
    pub coalesced: AtomicU64,
    pub retried: AtomicU64,
    pub given_up: AtomicU64,
    pub parked: AtomicU64,
}

type Waiters<R> = Vec<oneshot::Sender<Answer<R>>>;

/// Where a key is.
enum Phase {
    /// Spawned, waiting for a concurrency permit.
    Queued,
    /// Running; `dirty`: triggered meanwhile, run again after.
    Running { dirty: bool },
    /// Failed; a timer brings it back (`generation` tells a stale timer from the current one).
    Resting { generation: u64 },
}

struct KeyState<R: Reconcile> {
    phase: Phase,
    /// Failed runs since the last success.
    retry: u32,
    /// Callers waiting for the next run to start (and then for its result).
    next: Waiters<R>,
    /// What the triggers since the last run started brought (merged), for the next run.
    payload: R::Payload,
}

struct Shared<R: Reconcile> {
    reconciler: Arc<R>,
    config: EngineConfig,
    keys: Mutex<HashMap<R::Key, KeyState<R>>>,
    permits: Semaphore,
    shutdown: CancellationToken,
    stats: Stats,
    generations: AtomicU64,
}

/// Handle to the engine; cheap to clone.
pub struct Engine<R: Reconcile> {
    shared: Arc<Shared<R>>,
}

impl<R: Reconcile> Clone for Engine<R> {
    fn clone(&self) -> Self {
        Engine {
            shared: self.shared.clone(),
        }
    }
}

impl<R: Reconcile> Engine<R> {
    /// An engine over `reconciler`; runs stop being started once `shutdown` is cancelled.
    pub fn new(reconciler: Arc<R>, config: EngineConfig, shutdown: CancellationToken) -> Self {
        let permits = Semaphore::new(config.concurrency.max(1));
        Engine {
            shared: Arc::new(Shared {
                reconciler,
                config,
                keys: Mutex::new(HashMap::new()),
                permits,
                shutdown,
                stats: Stats::default(),
                generations: AtomicU64::new(0),
            }),
        }
    }

    pub fn reconciler(&self) -> &Arc<R> {
        &self.shared.reconciler
    }

    pub fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    /// Keys queued, running or resting before a retry.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.shared.keys.lock().len()
    }

    /// Whether `key` is queued, running or resting.
    #[cfg(test)]
    pub(crate) fn is_pending(&self, key: &R::Key) -> bool {
        self.shared.keys.lock().contains_key(key)
    }

    /// Look at `key` again.
    pub fn trigger(&self, key: R::Key) {
        self.enter(key, R::Payload::default(), None);
    }

    /// Look at `key` again, bringing `payload` for its next run.
    pub fn trigger_with(&self, key: R::Key, payload: R::Payload) {
        self.enter(key, payload, None);
    }

    /// Look at `key` again and wait for the result of the first run that starts after now.
    /// No deadline here: the caller bounds the wait (the run itself goes on regardless).
    #[cfg(test)]
    pub(crate) async fn trigger_and_wait(&self, key: R::Key) -> Result<Answer<R>, Stopped> {
        self.trigger_with_and_wait(key, R::Payload::default()).await
    }

    /// Look at `key` again, bringing `payload`, and wait for the result of the first run that
    /// starts after now. No deadline here: the caller bounds the wait (the run itself goes on
    /// regardless).
    pub async fn trigger_with_and_wait(
        &self,
        key: R::Key,
        payload: R::Payload,
    ) -> Result<Answer<R>, Stopped> {
        let (tx, rx) = oneshot::channel();
        self.enter(key, payload, Some(tx));
        rx.await.map_err(|_| Stopped)
    }

    /// A trigger arrives for `key` with its payload, maybe with a caller waiting for its answer.
    fn enter(&self, key: R::Key, payload: R::Payload, waiter: Option<oneshot::Sender<Answer<R>>>) {
        if self.shared.shutdown.is_cancelled() {
            return;
        }
        let mut keys = self.shared.keys.lock();
        let Some(state) = keys.get_mut(&key) else {
            keys.insert(
                key.clone(),
                KeyState {
                    phase: Phase::Queued,
                    retry: 0,
                    next: waiter.into_iter().collect(),
                    payload,
                },
            );
            drop(keys);
            self.spawn_run(key);
            return;
        };
        state.payload.merge(payload);
        state.next.extend(waiter);
        match &mut state.phase {
            Phase::Queued | Phase::Running { dirty: true } => {
                self.shared.stats.coalesced.fetch_add(1, Ordering::Relaxed);
            }
            Phase::Running { dirty } => *dirty = true,
            Phase::Resting { .. } => {
                // A caller waiting for an answer is never made to wait out a backoff.
                if !self.shared.config.trigger_cuts_backoff && state.next.is_empty() {
                    self.shared.stats.coalesced.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                state.phase = Phase::Queued;
                drop(keys);
                self.spawn_run(key);
            }
        }
    }

    /// A resting key's timer is due: run it, unless it was run or rescheduled meanwhile.
    fn due(&self, key: R::Key, generation: u64) {
        let mut keys = self.shared.keys.lock();
        match keys.get_mut(&key) {
            Some(state) if matches!(state.phase, Phase::Resting { generation: g } if g == generation) =>
            {
                state.phase = Phase::Queued;
                drop(keys);
                self.spawn_run(key);
            }
            _ => {}
        }
    }

    fn spawn_run(&self, key: R::Key) {
        let engine = self.clone();
        tokio::spawn(async move { engine.run(key).await });
    }

    async fn run(self, key: R::Key) {
        let shared = &self.shared;
        let permit = tokio::select! {
            _ = shared.shutdown.cancelled() => None,
            permit = shared.permits.acquire() => permit.ok(),
        };
        let Some(_permit) = permit else {
            shared.keys.lock().remove(&key);
            return;
        };
        let (retry, waiters, payload) = {
            let mut keys = shared.keys.lock();
            let Some(state) = keys.get_mut(&key) else {
                return;
            };
            state.phase = Phase::Running { dirty: false };
            let payload = std::mem::take(&mut state.payload);
            (state.retry, std::mem::take(&mut state.next), payload)
        };
        let kept = payload.for_retry();
        // A panic inside the reconcile must not leave the key marked running forever: it is
        // caught here and treated as a transient failure (logged as a bug).
        let work = shared.reconciler.reconcile(key.clone(), payload, retry);
        let result = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(work)).await;
        shared.stats.runs.fetch_add(1, Ordering::Relaxed);
        let result = match result {
            Ok(result) => result.map_err(Arc::new),
            Err(_) => {
                error!(key = %key, "reconcile panicked (a bug); retrying the key");
                self.finish_panicked(key, waiters, kept);
                return;
            }
        };
        self.finish(key, result, waiters, kept);
    }

    fn finish(&self, key: R::Key, result: Answer<R>, waiters: Waiters<R>, kept: R::Payload) {
        let class = result.as_ref().err().map(|e| e.class());
        for waiter in waiters {
            let _ = waiter.send(result.clone());
        }
        if let Err(e) = &result {
            self.after_failure(key, class.unwrap_or(Class::Retry), &e.to_string(), kept);
            return;
        }
        let mut keys = self.shared.keys.lock();
        let Some(state) = keys.get_mut(&key) else {
            return;
        };
        state.retry = 0;
        if matches!(state.phase, Phase::Running { dirty: true }) {
            state.phase = Phase::Queued;
            drop(keys);
            self.spawn_run(key);
        } else {
            keys.remove(&key);
        }
    }

    fn finish_panicked(&self, key: R::Key, waiters: Waiters<R>, kept: R::Payload) {
        // The waiters' senders drop (they get `Stopped`); the key itself is retried.
        drop(waiters);
        self.after_failure(key, Class::Retry, "panicked", kept);
    }

    fn after_failure(&self, key: R::Key, class: Class, why: &str, mut kept: R::Payload) {
        let shared = &self.shared;
        let mut keys = shared.keys.lock();
        let Some(state) = keys.get_mut(&key) else {
            return;
        };
        // What the retry needs of the failed run's payload, under what came meanwhile.
        kept.merge(std::mem::take(&mut state.payload));
        state.payload = kept;
        let retry = state.retry;
        state.retry = retry.saturating_add(1);
        if matches!(state.phase, Phase::Running { dirty: true }) {
            // New information arrived while it ran: look again now rather than after a delay.
            debug!(key = %key, "failed run superseded by a newer trigger: {why}");
            state.phase = Phase::Queued;
            drop(keys);
            self.spawn_run(key);
            return;
        }
        let delay = match class {
            Class::Retry => {
                shared.stats.retried.fetch_add(1, Ordering::Relaxed);
                let delay = shared.config.retry.jittered_delay(retry);
                warn!(key = %key, retry, delay_ms = delay.as_millis() as u64, "will retry: {why}");
                delay
            }
            Class::WaitFor => {
                shared.stats.parked.fetch_add(1, Ordering::Relaxed);
                debug!(key = %key, "waiting for the next trigger: {why}");
                shared.config.retry.max
            }
            Class::GiveUp => {
                shared.stats.given_up.fetch_add(1, Ordering::Relaxed);
                error!(key = %key, "giving up until the key is triggered again: {why}");
                keys.remove(&key);
                return;
            }
        };
        let generation = shared.generations.fetch_add(1, Ordering::Relaxed);
        state.phase = Phase::Resting { generation };
        drop(keys);
        let engine = self.clone();
        let stop = shared.shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::time::sleep(delay) => engine.due(key, generation),
            }
        });
    }
}
