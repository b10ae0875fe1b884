//! Holding back pods ztunnel NACKed. A NACKed Add often makes ztunnel drop the connection and
//! reconnect at once; re-sending the same Add in the next snapshot would loop (docs/zds.md: over
//! 100,000 reconnects in 145 s were seen). So a NACKed uid is held back for a jittered, doubling
//! delay: its snapshots carry a Keep instead of the Add and adds for it are refused until then.
//! Pure but for the jitter: time is an input.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::retry::RetryPolicy;

#[derive(Debug)]
struct Held {
    nacks: u32,
    until: Instant,
    message: String,
}

#[derive(Debug)]
pub(crate) struct NackBook {
    policy: RetryPolicy,
    held: HashMap<String, Held>,
}

impl NackBook {
    pub(crate) fn new(first: Duration, max: Duration) -> NackBook {
        NackBook {
            policy: RetryPolicy {
                first,
                max,
                max_attempts: None,
            },
            held: HashMap::new(),
        }
    }

    /// Records a NACK for `uid` at `now`; returns how long it is held back. Each NACK in a row
    /// doubles the delay (up to `max`), jittered like every retry ([`RetryPolicy`]).
    pub(crate) fn record(&mut self, uid: &str, message: &str, now: Instant) -> Duration {
        // Forget pods whose last NACK is long past, so the table stays small.
        let max = self.policy.max;
        self.held
            .retain(|_, h| now.saturating_duration_since(h.until) < max * 2);
        let nacks = self.held.get(uid).map_or(0, |h| h.nacks) + 1;
        let delay = self.policy.jittered_delay(nacks - 1);
        self.held.insert(
            uid.to_string(),
            Held {
                nacks,
                until: now + delay,
                message: message.to_string(),
            },
        );
        delay
    }

    /// If `uid` is held back at `now`: the time left and ztunnel's last message.
    pub(crate) fn held(&self, uid: &str, now: Instant) -> Option<(Duration, &str)> {
        let h = self.held.get(uid)?;
        (now < h.until).then(|| (h.until - now, h.message.as_str()))
    }

    /// An acked Add or a delete ends the pod's history.
    pub(crate) fn clear(&mut self, uid: &str) {
        self.held.remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retry::in_band;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_nacked_uid_is_held_until_its_delay_elapses() {
        let mut book = NackBook::new(4 * S, 60 * S);
        let t0 = Instant::now();
        let d = book.record("u1", "failure to start proxy", t0);
        assert!(in_band(d, 4 * S), "{d:?} not in [2 s, 4 s]");
        assert_eq!(
            book.held("u1", t0 + S),
            Some((d - S, "failure to start proxy"))
        );
        assert_eq!(book.held("u1", t0 + d), None);
        assert_eq!(book.held("u2", t0), None);
    }

    #[test]
    fn delays_double_per_nack_up_to_the_cap_within_the_jitter_band() {
        let mut book = NackBook::new(4 * S, 20 * S);
        let t0 = Instant::now();
        let delays: Vec<Duration> = (0..5).map(|_| book.record("u1", "x", t0)).collect();
        for (d, base) in delays.iter().zip([4u64, 8, 16, 20, 20]) {
            let base = Duration::from_secs(base);
            assert!(in_band(*d, base), "{d:?} not in [{:?}, {base:?}]", base / 2);
        }
        // Jittered: another pod NACKed in step draws other delays.
        let other: Vec<Duration> = (0..5).map(|_| book.record("u2", "x", t0)).collect();
        assert_ne!(delays, other);
    }

    #[test]
    fn clearing_resets_the_doubling() {
        let mut book = NackBook::new(4 * S, 60 * S);
        let t0 = Instant::now();
        book.record("u1", "x", t0);
        book.record("u1", "x", t0);
        book.clear("u1");
        assert_eq!(book.held("u1", t0), None);
        // The first delay again ([2 s, 4 s]), not the third ([8 s, 16 s]).
        let d = book.record("u1", "x", t0);
        assert!(in_band(d, 4 * S), "{d:?}");
    }

    #[test]
    fn long_past_entries_are_forgotten() {
        let mut book = NackBook::new(4 * S, 10 * S);
        let t0 = Instant::now();
        book.record("old", "x", t0);
        book.record("new", "x", t0 + 100 * S);
        assert_eq!(book.held.len(), 1);
    }
}
