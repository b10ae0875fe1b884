//! Retrying one-shot API calls: only failures that may go away by themselves
//! ([`KubeError::is_transient`](super::KubeError::is_transient): refused, reset, timeouts, 429,
//! 5xx) are retried, with doubling, jittered spacing, and never past a deadline. Everything else
//! (a bad name, 400, 401, 403, 404, 409, 422) is returned at once: waiting does not fix RBAC.

use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, Instant};

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
    /// The un-jittered delay before retry number `retry` (0 = the first retry).
    pub fn base_delay(&self, retry: u32) -> Duration {
        let factor = 1u32.checked_shl(retry.min(16)).unwrap_or(u32::MAX);
        self.first.saturating_mul(factor).min(self.max)
    }

    /// The delay before retry number `retry`, jittered with a fresh random number.
    pub fn jittered_delay(&self, retry: u32) -> Duration {
        self.delay(retry, random_u64())
    }

    /// The delay before retry number `retry`, jittered with `random` (any u64).
    pub fn delay(&self, retry: u32, random: u64) -> Duration {
        let base = self.base_delay(retry);
        let half = base / 2;
        let span = (base - half).as_nanos() as u64;
        let extra = if span == 0 { 0 } else { random % (span + 1) };
        half + Duration::from_nanos(extra)
    }
}

/// A random u64 without a random-number crate: std's hasher keys are random per process and
/// differ for each `RandomState`.
fn random_u64() -> u64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    hasher.finish()
}

/// Runs `call` until it succeeds, fails with an error `is_transient` rejects, runs out of
/// attempts, or the next attempt would start at or after `until`; the last error is returned.
/// `on_retry` sees each retried error and the delay before the next attempt (for logging).
pub async fn retry_transient<T, E, F, Fut>(
    policy: RetryPolicy,
    until: Instant,
    is_transient: impl Fn(&E) -> bool,
    mut on_retry: impl FnMut(&E, Duration),
    mut call: F,
) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut retry = 0u32;
    loop {
        let err = match call().await {
            Ok(value) => return Ok(value),
            Err(err) => err,
        };
        let attempts_left = policy.max_attempts.is_none_or(|max| retry + 1 < max);
        if !is_transient(&err) || !attempts_left {
            return Err(err);
        }
        let delay = policy.delay(retry, random_u64());
        if Instant::now() + delay >= until {
            return Err(err);
        }
        on_retry(&err, delay);
        tokio::time::sleep(delay).await;
        retry += 1;
    }
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
        let bases: Vec<u128> = (0..5).map(|r| POLICY.base_delay(r).as_millis()).collect();
        assert_eq!(bases, [10, 20, 40, 40, 40]);
        assert_eq!(POLICY.base_delay(u32::MAX), Duration::from_millis(40));
        for random in [0, 1, 7_777_777, u64::MAX] {
            let d = POLICY.delay(1, random);
            assert!(
                d >= Duration::from_millis(10) && d <= Duration::from_millis(20),
                "{d:?}"
            );
        }
        assert_ne!(random_u64(), random_u64());
    }

    fn run<T>(f: impl Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn permanent_errors_are_not_retried() {
        let calls = Cell::new(0);
        let until = Instant::now() + Duration::from_secs(5);
        let result: Result<(), &str> = run(retry_transient(
            POLICY,
            until,
            |e: &&str| *e == "transient",
            |_, _| {},
            || {
                calls.set(calls.get() + 1);
                async { Err("forbidden") }
            },
        ));
        assert_eq!(result, Err("forbidden"));
        assert_eq!(calls.get(), 1);
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
        calls.set(0);
        let result: Result<(), &str> = run(retry_transient(
            POLICY,
            started + Duration::from_millis(150),
            |_: &&str| true,
            |_, _| {},
            || {
                calls.set(calls.get() + 1);
                async { Err("503") }
            },
        ));
        assert_eq!(result, Err("503"));
        // Gives up before the deadline (timer granularity allowed for).
        assert!(
            started.elapsed() < Duration::from_millis(170),
            "{:?}",
            started.elapsed()
        );
        assert!(calls.get() >= 3, "{}", calls.get());
    }

    #[test]
    fn attempts_are_capped() {
        let calls = Cell::new(0);
        let policy = RetryPolicy {
            max_attempts: Some(2),
            ..POLICY
        };
        let _: Result<(), &str> = run(retry_transient(
            policy,
            Instant::now() + Duration::from_secs(5),
            |_: &&str| true,
            |_, _| {},
            || {
                calls.set(calls.get() + 1);
                async { Err("503") }
            },
        ));
        assert_eq!(calls.get(), 2);
    }
}
