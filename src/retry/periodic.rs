//! A pass that runs periodically and on demand: the drift verification's schedule. Each wait lasts
//! one period plus up to a quarter more, drawn at random (the nodes of a cluster started together
//! by one rollout do not verify, and log, in step); a [`Kick`] ends the wait early. Kicks that
//! arrive during a pass are kept: the next wait ends at once, so a change seen mid-pass is never
//! missed. One kick reaches every schedule made with it (the ambient and the sidecar verifiers
//! share install-cni's).

use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use super::RetryPolicy;

/// Ends a [`Periodic`] wait early, for every schedule made with it (cheap to clone; a kick while
/// a schedule is not waiting is kept for it, once).
#[derive(Clone, Default, Debug)]
pub struct Kick(Arc<Mutex<Vec<Arc<Notify>>>>);

impl Kick {
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks for a pass now (or right after the running one).
    pub fn kick(&self) {
        for schedule in self.0.lock().iter() {
            schedule.notify_one();
        }
    }

    /// A new schedule's own wake-up.
    fn register(&self) -> Arc<Notify> {
        let notify = Arc::new(Notify::new());
        self.0.lock().push(notify.clone());
        notify
    }
}

/// Why a [`Periodic::wait`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woken {
    Timer,
    Kicked,
}

/// The schedule: a period and the kick that shortens it.
#[derive(Clone, Debug)]
pub struct Periodic {
    period: Duration,
    kicked: Arc<Notify>,
}

impl Periodic {
    pub fn new(period: Duration, kick: Kick) -> Self {
        Periodic {
            period,
            kicked: kick.register(),
        }
    }

    pub fn period(&self) -> Duration {
        self.period
    }

    /// The next wait: `period + [0, period/4]`, jittered.
    pub fn next_delay(&self) -> Duration {
        let extra = RetryPolicy {
            first: self.period / 4,
            max: self.period / 4,
            max_attempts: None,
        }
        .jittered_delay(0);
        // `extra` lies in [period/8, period/4]; shift it so the band starts at `period`.
        self.period + extra.saturating_sub(self.period / 8) * 2
    }

    /// Waits one jittered period, or less when kicked.
    pub async fn wait(&self) -> Woken {
        tokio::select! {
            _ = tokio::time::sleep(self.next_delay()) => Woken::Timer,
            _ = self.kicked.notified() => Woken::Kicked,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_lie_between_one_period_and_a_quarter_more_and_vary() {
        let p = Periodic::new(Duration::from_secs(60), Kick::new());
        let delays: Vec<Duration> = (0..200).map(|_| p.next_delay()).collect();
        for d in &delays {
            assert!(
                *d >= Duration::from_secs(60)
                    && *d <= Duration::from_secs(75) + Duration::from_millis(1),
                "{d:?}"
            );
        }
        assert!(delays.iter().any(|d| *d != delays[0]), "jittered");
    }

    #[tokio::test]
    async fn a_kick_ends_the_wait_and_one_sent_during_a_pass_is_kept() {
        let kick = Kick::new();
        let p = Periodic::new(Duration::from_secs(3600), kick.clone());
        kick.kick();
        assert_eq!(p.wait().await, Woken::Kicked, "kept from before the wait");
        let waiter = tokio::spawn({
            let p = p.clone();
            async move { p.wait().await }
        });
        tokio::task::yield_now().await;
        kick.kick();
        assert_eq!(waiter.await.unwrap(), Woken::Kicked);
        let idle = tokio::time::timeout(Duration::from_millis(50), p.wait()).await;
        assert!(
            idle.is_err(),
            "no kick left: only the (hour-long) timer could end it"
        );
    }

    #[tokio::test]
    async fn one_kick_wakes_every_schedule_made_with_it() {
        let kick = Kick::new();
        let hour = Duration::from_secs(3600);
        let (ambient, sidecar) = (
            Periodic::new(hour, kick.clone()),
            Periodic::new(hour, kick.clone()),
        );
        kick.kick();
        let both = async { (ambient.wait().await, sidecar.wait().await) };
        let woken = tokio::time::timeout(Duration::from_secs(5), both).await;
        assert_eq!(woken.unwrap(), (Woken::Kicked, Woken::Kicked));
    }
}
