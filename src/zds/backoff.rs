//! Holding back pods ztunnel NACKed. A NACKed Add often makes ztunnel drop the connection and
//! reconnect at once; re-sending the same Add in the next snapshot would loop (docs/zds.md: over
//! 100,000 reconnects in 145 s were seen). So a NACKed uid is held back for a jittered, doubling
//! delay: its snapshots carry a Keep instead of the Add and adds for it are refused until then.
//! Pure: time and randomness are inputs.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, Instant};

#[derive(Debug)]
struct Held {
    nacks: u32,
    until: Instant,
    message: String,
}

#[derive(Debug)]
pub(crate) struct NackBook {
    first: Duration,
    max: Duration,
    held: HashMap<String, Held>,
}

impl NackBook {
    pub(crate) fn new(first: Duration, max: Duration) -> NackBook {
        NackBook {
            first,
            max,
            held: HashMap::new(),
        }
    }

    /// Records a NACK for `uid` at `now`; returns how long it is held back. Each NACK in a row
    /// doubles the delay (up to `max`); the delay is drawn from `[d/2, d]`.
    pub(crate) fn record(
        &mut self,
        uid: &str,
        message: &str,
        now: Instant,
        random: u64,
    ) -> Duration {
        // Forget pods whose last NACK is long past, so the table stays small.
        let max = self.max;
        self.held
            .retain(|_, h| now.saturating_duration_since(h.until) < max * 2);
        let nacks = self.held.get(uid).map_or(0, |h| h.nacks) + 1;
        let factor = 1u32.checked_shl((nacks - 1).min(16)).unwrap_or(u32::MAX);
        let base = self.first.saturating_mul(factor).min(self.max);
        let half = base / 2;
        let span = (base - half).as_nanos() as u64;
        let delay = half + Duration::from_nanos(if span == 0 { 0 } else { random % (span + 1) });
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

/// A random u64 without a random-number crate: std's hasher keys are random per process and per
/// `RandomState`.
pub(crate) fn random_u64() -> u64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_nacked_uid_is_held_until_its_delay_elapses() {
        let mut book = NackBook::new(4 * S, 60 * S);
        let t0 = Instant::now();
        let d = book.record("u1", "failure to start proxy", t0, 0);
        assert_eq!(d, 2 * S, "random 0 = the low end of [d/2, d]");
        assert_eq!(book.held("u1", t0 + S), Some((S, "failure to start proxy")));
        assert_eq!(book.held("u1", t0 + d), None);
        assert_eq!(book.held("u2", t0), None);
    }

    #[test]
    fn delays_double_per_nack_up_to_the_cap_within_the_jitter_band() {
        let mut book = NackBook::new(4 * S, 20 * S);
        let t0 = Instant::now();
        let mut ceilings = Vec::new();
        for _ in 0..5 {
            let d = book.record("u1", "x", t0, u64::MAX);
            ceilings.push(d);
        }
        // The high end of the band for 4, 8, 16, 20 (cap), 20 s (u64::MAX % span may land
        // anywhere in the band; check the band rather than the exact value).
        for (d, base) in ceilings.iter().zip([4u64, 8, 16, 20, 20]) {
            let base = Duration::from_secs(base);
            assert!(
                *d >= base / 2 && *d <= base,
                "{d:?} not in [{:?}, {base:?}]",
                base / 2
            );
        }
    }

    #[test]
    fn clearing_resets_the_doubling() {
        let mut book = NackBook::new(4 * S, 60 * S);
        let t0 = Instant::now();
        book.record("u1", "x", t0, 0);
        book.record("u1", "x", t0, 0);
        book.clear("u1");
        assert_eq!(book.held("u1", t0), None);
        assert_eq!(book.record("u1", "x", t0, 0), 2 * S);
    }

    #[test]
    fn long_past_entries_are_forgotten() {
        let mut book = NackBook::new(4 * S, 10 * S);
        let t0 = Instant::now();
        book.record("old", "x", t0, 0);
        book.record("new", "x", t0 + 100 * S, 0);
        assert_eq!(book.held.len(), 1);
    }
}
