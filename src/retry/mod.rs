//! Retry spacing and the retry loop, one model for every room that waits before trying again:
//! doubling delays with equal jitter (so peers that failed together do not retry in step), and a
//! loop that retries only what the caller calls transient, never past a deadline. The Kubernetes
//! calls use it with `KubeError::is_transient` (transient = refused, reset, timeouts, 429, 5xx; a bad
//! name, 400, 401, 403, 404, 409 or 422 is returned at once: waiting does not fix RBAC), the ZDS
//! server for holding back pods ztunnel NACKed.
//!
//! The loop and the spacing are `backon`'s (already in the graph through kube-runtime); this
//! module only fixes the policy: which spacing, which deadline. May call: nothing else in this
//! crate.

pub mod periodic;

use std::future::Future;
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBuilder, Retryable};

/// Spacing between attempts: `first`, doubling up to `max`; each delay is drawn from
/// `[d/2, d]` ("equal jitter") so plugins started together by one kubelet do not retry in step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    pub first: Duration,
    pub max: Duration,
    /// Attempts in all (the first included); `None` = as many as the deadline allows.
    pub max_attempts: Option<u32>,
}

impl RetryPolicy {
    /// The spacing as a backon builder. backon's jitter adds a random `[0, d)` to `d`; starting
    /// from half the wanted delays turns that into equal jitter, `[d/2, d)`.
    pub fn builder(&self) -> ExponentialBuilder {
        let builder = ExponentialBuilder::new()
            .with_factor(2.0)
            .with_min_delay(self.first / 2)
            .with_max_delay(self.max / 2)
            .with_jitter();
        match self.max_attempts {
            Some(n) => builder.with_max_times(n.saturating_sub(1) as usize),
            None => builder.without_max_times(),
        }
    }

    /// The delays between attempts, in order (ends when the attempts are used up).
    pub fn delays(&self) -> impl Iterator<Item = Duration> + Send + Sync + Unpin + use<> {
        self.builder().build()
    }

    /// The delay before retry number `retry` (0 = the first retry), jittered: the same spacing
    /// as [`RetryPolicy::delays`], for callers that keep their own retry count (the agent's
    /// per-pod queue).
    pub fn jittered_delay(&self, retry: u32) -> Duration {
        let unlimited = RetryPolicy {
            max_attempts: None,
            ..*self
        };
        unlimited
            .delays()
            .nth(retry.min(64) as usize)
            .unwrap_or(self.max)
    }
}

/// Runs `call` until it succeeds, fails with an error `is_transient` rejects, runs out of
/// attempts, or the next attempt would start at or after `until`; the last error is returned.
/// `on_retry` sees each retried error and the delay before the next attempt (for logging).
pub async fn retry_transient<T, E, F, Fut>(
    policy: RetryPolicy,
    until: Instant,
    is_transient: impl Fn(&E) -> bool,
    on_retry: impl FnMut(&E, Duration),
    call: F,
) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    call.retry(policy.builder())
        .sleep(tokio::time::sleep)
        .when(is_transient)
        .adjust(move |_, delay| delay.filter(|d| Instant::now() + *d < until))
        .notify(on_retry)
        .await
}

/// Tests of every delay drawn from a policy: `d` lies in the equal-jitter band `[base/2, base]`,
/// allowing backon's f32 arithmetic a microsecond.
#[cfg(test)]
pub(crate) fn in_band(d: Duration, base: Duration) -> bool {
    let slack = Duration::from_micros(1);
    d + slack >= base / 2 && d <= base + slack
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    const POLICY: RetryPolicy = RetryPolicy {
        first: Duration::from_millis(10),
        max: Duration::from_millis(40),
        max_attempts: None,
    };

    #[test]
    fn delays_double_to_the_cap_and_stay_within_the_jitter_band() {
        for _ in 0..50 {
            let delays: Vec<Duration> = POLICY.delays().take(6).collect();
            for (d, base) in delays.iter().zip([10, 20, 40, 40, 40, 40]) {
                let base = Duration::from_millis(base);
                assert!(in_band(*d, base), "{d:?} not in [{base:?}/2, {base:?}]");
            }
        }
        // Jittered: two runs do not draw the same delays.
        let a: Vec<Duration> = POLICY.delays().take(6).collect();
        let b: Vec<Duration> = POLICY.delays().take(6).collect();
        assert_ne!(a, b);
        let capped = RetryPolicy {
            max_attempts: Some(3),
            ..POLICY
        };
        assert_eq!(capped.delays().count(), 2, "3 attempts = 2 waits");
    }

    fn run<T>(f: impl Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    }

    /// Runs a call that always fails with `error` (transient when it is "503"); returns the
    /// result and how many times the call ran.
    fn always_failing(policy: RetryPolicy, until: Instant, error: &str) -> (Result<(), &str>, u32) {
        let calls = Cell::new(0);
        let result = run(retry_transient(
            policy,
            until,
            |e: &&str| *e == "503",
            |_, _| {},
            || {
                calls.set(calls.get() + 1);
                async move { Err(error) }
            },
        ));
        (result, calls.get())
    }

    #[test]
    fn permanent_errors_are_not_retried() {
        let until = Instant::now() + Duration::from_secs(5);
        assert_eq!(
            always_failing(POLICY, until, "forbidden"),
            (Err("forbidden"), 1)
        );
    }

    #[test]
    fn transient_errors_are_retried_until_success_or_the_deadline() {
        let calls = Cell::new(0);
        let result: Result<u32, &str> = run(retry_transient(
            POLICY,
            Instant::now() + Duration::from_secs(5),
            |_: &&str| true,
            |_, _| {},
            || {
                calls.set(calls.get() + 1);
                let n = calls.get();
                async move { if n < 3 { Err("503") } else { Ok(n) } }
            },
        ));
        assert_eq!(result, Ok(3));

        let started = Instant::now();
        let (result, calls) = always_failing(POLICY, started + Duration::from_millis(150), "503");
        assert_eq!(result, Err("503"));
        // Gives up before the deadline (timer granularity allowed for).
        assert!(
            started.elapsed() < Duration::from_millis(170),
            "{:?}",
            started.elapsed()
        );
        assert!(calls >= 3, "{calls}");
    }

    #[test]
    fn attempts_are_capped() {
        let policy = RetryPolicy {
            max_attempts: Some(2),
            ..POLICY
        };
        let until = Instant::now() + Duration::from_secs(5);
        assert_eq!(always_failing(policy, until, "503").1, 2);
    }
}
