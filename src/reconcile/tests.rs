//! The engine's promises, on paused time: one run per key at a time, coalesced triggers, bounded
//! concurrency, the error's class deciding, waiters answered by the run after their trigger.

use super::*;
use std::collections::VecDeque;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

#[derive(Debug, Clone)]
struct Failure(Class);

impl Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "failed ({:?})", self.0)
    }
}

impl Classify for Failure {
    fn class(&self) -> Class {
        self.0
    }
}

/// A test payload: notes that merge by appending; a retry keeps those starting with `keep`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Notes(Vec<String>);

impl Payload for Notes {
    fn merge(&mut self, newer: Notes) {
        self.0.extend(newer.0);
    }
    fn for_retry(&self) -> Notes {
        Notes(
            self.0
                .iter()
                .filter(|n| n.starts_with("keep"))
                .cloned()
                .collect(),
        )
    }
}

fn notes(of: &[&str]) -> Notes {
    Notes(of.iter().map(|n| n.to_string()).collect())
}

/// Runs take `work` of (paused) time; results are scripted per key, then `Ok`.
#[derive(Default)]
struct Scripted {
    work: Duration,
    results: Mutex<HashMap<String, VecDeque<Result<u32, Failure>>>>,
    running: AtomicUsize,
    most_at_once: AtomicUsize,
    runs: Mutex<Vec<(String, u32)>>,
    /// A key's runs overlapping each other (must stay empty).
    overlaps: Mutex<Vec<String>>,
    in_flight: Mutex<std::collections::HashSet<String>>,
    panic_on: Mutex<Option<String>>,
    /// The payload each run took, per key in run order.
    payloads: Mutex<Vec<(String, Notes)>>,
}

impl Scripted {
    fn script(&self, key: &str, results: Vec<Result<u32, Failure>>) {
        self.results.lock().insert(key.into(), results.into());
    }

    fn runs_of(&self, key: &str) -> usize {
        self.runs.lock().iter().filter(|(k, _)| k == key).count()
    }
}

impl Reconcile for Scripted {
    type Key = String;
    type Done = u32;
    type Error = Failure;
    type Payload = Notes;

    fn reconcile(
        &self,
        key: String,
        payload: Notes,
        retry: u32,
    ) -> BoxFuture<'_, Result<u32, Failure>> {
        Box::pin(async move {
            self.payloads.lock().push((key.clone(), payload));
            if !self.in_flight.lock().insert(key.clone()) {
                self.overlaps.lock().push(key.clone());
            }
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_at_once.fetch_max(now, Ordering::SeqCst);
            self.runs.lock().push((key.clone(), retry));
            tokio::time::sleep(self.work).await;
            self.running.fetch_sub(1, Ordering::SeqCst);
            self.in_flight.lock().remove(&key);
            if self.panic_on.lock().as_deref() == Some(key.as_str()) {
                self.panic_on.lock().take();
                panic!("scripted panic");
            }
            let next = self
                .results
                .lock()
                .get_mut(&key)
                .and_then(VecDeque::pop_front);
            next.unwrap_or(Ok(retry))
        })
    }
}

fn config(concurrency: usize, trigger_cuts_backoff: bool) -> EngineConfig {
    EngineConfig {
        concurrency,
        retry: RetryPolicy {
            first: Duration::from_millis(100),
            max: Duration::from_secs(10),
            max_attempts: None,
        },
        trigger_cuts_backoff,
    }
}

fn engine(work_ms: u64, cfg: EngineConfig) -> (Engine<Scripted>, Arc<Scripted>) {
    let r = Arc::new(Scripted {
        work: Duration::from_millis(work_ms),
        ..Default::default()
    });
    (Engine::new(r.clone(), cfg, CancellationToken::new()), r)
}

async fn settle() {
    // Paused time: advancing runs every timer and task that is due.
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn triggers_of_a_queued_key_coalesce_and_a_running_key_runs_once_more() {
    let (e, r) = engine(100, config(4, true));
    for _ in 0..5 {
        e.trigger("a".into());
    }
    settle().await;
    assert_eq!(r.runs_of("a"), 1, "queued triggers were not coalesced");
    e.trigger("a".into());
    tokio::time::sleep(Duration::from_millis(10)).await;
    // Running now: three more triggers make exactly one more run.
    for _ in 0..3 {
        e.trigger("a".into());
    }
    settle().await;
    assert_eq!(r.runs_of("a"), 3);
    assert!(r.overlaps.lock().is_empty(), "a key ran twice at once");
    assert_eq!(e.pending(), 0);
}

#[tokio::test(start_paused = true)]
async fn concurrency_is_bounded_and_different_keys_run_together() {
    let (e, r) = engine(100, config(3, true));
    for i in 0..10 {
        e.trigger(format!("k{i}"));
    }
    settle().await;
    assert_eq!(r.most_at_once.load(Ordering::SeqCst), 3);
    assert_eq!(r.runs.lock().len(), 10);
}

#[tokio::test(start_paused = true)]
async fn the_errors_class_decides_retry_give_up_or_wait() {
    let (e, r) = engine(1, config(4, true));
    r.script(
        "retry",
        vec![Err(Failure(Class::Retry)), Err(Failure(Class::Retry))],
    );
    r.script("give-up", vec![Err(Failure(Class::GiveUp))]);
    r.script("wait", vec![Err(Failure(Class::WaitFor))]);
    for k in ["retry", "give-up", "wait"] {
        e.trigger(k.into());
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Retried with the retry count passed in, until it succeeded.
    let retries: Vec<u32> = r
        .runs
        .lock()
        .iter()
        .filter(|(k, _)| k == "retry")
        .map(|(_, n)| *n)
        .collect();
    assert_eq!(retries, [0, 1, 2]);
    assert_eq!(r.runs_of("give-up"), 1);
    assert!(!e.is_pending(&"give-up".into()));
    // Parked: not retried on the short spacing, only by a trigger or the slow safety retry.
    assert_eq!(r.runs_of("wait"), 1);
    assert!(e.is_pending(&"wait".into()));
    e.trigger("wait".into());
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(r.runs_of("wait"), 2);
    assert_eq!(e.stats().given_up.load(Ordering::Relaxed), 1);
    assert_eq!(e.stats().parked.load(Ordering::Relaxed), 1);
}

#[tokio::test(start_paused = true)]
async fn a_parked_key_is_tried_again_after_the_longest_delay() {
    let (e, r) = engine(1, config(4, true));
    r.script("wait", vec![Err(Failure(Class::WaitFor))]);
    e.trigger("wait".into());
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert_eq!(r.runs_of("wait"), 1);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(r.runs_of("wait"), 2);
    assert_eq!(e.pending(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_failed_run_with_a_newer_trigger_runs_again_at_once() {
    let (e, r) = engine(100, config(4, true));
    r.script("a", vec![Err(Failure(Class::Retry))]);
    e.trigger("a".into());
    tokio::time::sleep(Duration::from_millis(10)).await;
    e.trigger("a".into());
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(r.runs_of("a"), 2, "the newer trigger waited out a backoff");
}

#[tokio::test(start_paused = true)]
async fn backoff_is_cut_by_a_trigger_only_when_configured() {
    for (cuts, runs_after_trigger) in [(true, 2), (false, 1)] {
        let (e, r) = engine(1, config(4, cuts));
        r.script("a", vec![Err(Failure(Class::Retry))]);
        e.trigger("a".into());
        tokio::time::sleep(Duration::from_millis(20)).await;
        e.trigger("a".into());
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(
            r.runs_of("a"),
            runs_after_trigger,
            "trigger_cuts_backoff={cuts}"
        );
        settle().await;
        assert_eq!(e.pending(), 0);
    }
}

#[tokio::test(start_paused = true)]
async fn a_waiter_gets_the_result_of_the_run_after_its_trigger() {
    let (e, r) = engine(100, config(4, false));
    r.script("a", vec![Ok(7), Err(Failure(Class::GiveUp)), Ok(9)]);
    assert_eq!(e.trigger_and_wait("a".into()).await.unwrap().unwrap(), 7);
    // Started while a run is in flight: answered by the next run, not the current one.
    e.trigger("a".into());
    tokio::time::sleep(Duration::from_millis(10)).await;
    let answer = e.trigger_and_wait("a".into()).await.unwrap();
    assert_eq!(
        answer.unwrap(),
        9,
        "answered by the run that started before the trigger"
    );
    // A waiter is never made to wait out a backoff, even when triggers do not cut it.
    r.script("b", vec![Err(Failure(Class::Retry)), Ok(1)]);
    let first = e.trigger_and_wait("b".into()).await.unwrap();
    assert_eq!(first.unwrap_err().0, Class::Retry);
    let started = tokio::time::Instant::now();
    assert_eq!(e.trigger_and_wait("b".into()).await.unwrap().unwrap(), 1);
    assert!(started.elapsed() < Duration::from_millis(150));
}

#[tokio::test(start_paused = true)]
async fn a_panicking_run_is_retried_and_its_waiters_are_released() {
    let (e, r) = engine(1, config(4, true));
    *r.panic_on.lock() = Some("a".into());
    assert_eq!(e.trigger_and_wait("a".into()).await.unwrap_err(), Stopped);
    settle().await;
    assert_eq!(r.runs_of("a"), 2, "the key was not retried after the panic");
    assert_eq!(e.pending(), 0);
}

#[tokio::test(start_paused = true)]
async fn shutdown_stops_queued_keys_and_retries() {
    let shutdown = CancellationToken::new();
    let r = Arc::new(Scripted {
        work: Duration::from_millis(100),
        ..Default::default()
    });
    let e = Engine::new(r.clone(), config(1, true), shutdown.clone());
    r.script("a", vec![Err(Failure(Class::Retry))]);
    e.trigger("a".into());
    e.trigger("b".into());
    tokio::time::sleep(Duration::from_millis(50)).await;
    shutdown.cancel();
    settle().await;
    assert_eq!(r.runs.lock().len(), 1, "work started after shutdown");
    e.trigger("c".into());
    settle().await;
    assert_eq!(r.runs.lock().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn payloads_merge_in_the_key_state_and_the_next_run_takes_them_whole() {
    let (e, r) = engine(100, config(4, true));
    e.trigger_with("a".into(), notes(&["one"]));
    e.trigger_with("a".into(), notes(&["two"]));
    tokio::time::sleep(Duration::from_millis(10)).await;
    // Running now: these wait in the key's state for the run after.
    e.trigger_with("a".into(), notes(&["three"]));
    e.trigger("a".into());
    e.trigger_with("a".into(), notes(&["four"]));
    settle().await;
    let taken: Vec<_> = r.payloads.lock().iter().map(|(_, n)| n.clone()).collect();
    assert_eq!(taken, [notes(&["one", "two"]), notes(&["three", "four"])]);
    assert_eq!(e.pending(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_failed_runs_retry_gets_what_the_payload_keeps_under_what_came_meanwhile() {
    let (e, r) = engine(100, config(4, false));
    let taken = |key: &str| -> Vec<Notes> {
        let payloads = r.payloads.lock();
        payloads
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, n)| n.clone())
            .collect()
    };
    // Retried after its backoff: only what the payload keeps.
    r.script("a", vec![Err(Failure(Class::Retry))]);
    e.trigger_with("a".into(), notes(&["keep-heal", "offer"]));
    settle().await;
    assert_eq!(
        taken("a"),
        [notes(&["keep-heal", "offer"]), notes(&["keep-heal"])]
    );
    // Triggered while the failing run ran: the run after gets both, the kept one first.
    r.script("b", vec![Err(Failure(Class::Retry))]);
    e.trigger_with("b".into(), notes(&["keep-heal", "offer"]));
    tokio::time::sleep(Duration::from_millis(10)).await;
    e.trigger_with("b".into(), notes(&["later"]));
    settle().await;
    assert_eq!(
        taken("b"),
        [
            notes(&["keep-heal", "offer"]),
            notes(&["keep-heal", "later"])
        ]
    );
    // A success keeps nothing: the next trigger brings only its own.
    e.trigger_with("b".into(), notes(&["fresh"]));
    settle().await;
    assert_eq!(taken("b").last(), Some(&notes(&["fresh"])));
    assert_eq!(e.pending(), 0);
}
