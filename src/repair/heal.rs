//! What the sidecar drift pass brings for a pod's next run on the repair controller's engine
//! ([`Findings`], the engine's per-key payload: the rules to heal in place, or a hand-off to the
//! policy), and the in-place heal that run does ([`heal`]) with its report. The heal is the only
//! write the drift pass causes, and it runs as a run of the pod's key: never beside the
//! controller's own work on the pod, with the engine's retries and backoff when it fails.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use tracing::info;

use super::effects::{ActError, Effects, Expected, event};
use crate::kube::EventType;
use crate::kube::stores::Stored;
use crate::netns::Netns;
use crate::reconcile::Payload;
use crate::telemetry::metrics::Metrics;

/// The `kind` label of the sidecar drift counters.
pub const KIND: &str = "sidecar_rules";
/// Event reasons.
pub const REASON_REPAIRED: &str = "RedirectionDriftRepaired";
pub const REASON_UNHEALED: &str = "RedirectionDriftUnhealed";

/// A drifted pod's rules, to be put back as its derivation gives them.
#[derive(Clone)]
pub struct Heal {
    /// The pod's netns, as the pass's /proc scan found it (held open until the heal ran).
    pub netns: Arc<Netns>,
    /// The pod (its UID: the heal is dropped when another pod has the name now) and its rules.
    pub expected: Expected,
    /// What drifted, for the log and the event.
    pub what: String,
}

/// A running pod the drift pass hands to the controller's policy: its redirect derivation changed
/// since its rules were programmed, so re-programming them is not the drift pass's call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandOff {
    pub uid: String,
    /// Why, for the log and the event.
    pub why: String,
}

/// What the drift pass found about a pod, for the next run of its key. Kept in the engine's
/// state of the key: a newer finding replaces an older one not yet taken, so a pod holds at most
/// one of each, however many passes ran meanwhile.
#[derive(Clone, Default)]
pub struct Findings {
    pub heal: Option<Heal>,
    pub hand_off: Option<HandOff>,
}

impl Findings {
    pub fn heal(heal: Heal) -> Findings {
        Findings {
            heal: Some(heal),
            hand_off: None,
        }
    }

    pub fn hand_off(uid: String, why: String) -> Findings {
        Findings {
            heal: None,
            hand_off: Some(HandOff { uid, why }),
        }
    }
}

impl Payload for Findings {
    fn merge(&mut self, newer: Findings) {
        if newer.heal.is_some() {
            self.heal = newer.heal;
        }
        if newer.hand_off.is_some() {
            self.hand_off = newer.hand_off;
        }
    }

    /// A failed run is retried with what it was brought: the heal and the hand-off are not
    /// shown by the store, so the retry could not find them again.
    fn for_retry(&self) -> Findings {
        self.clone()
    }
}

/// What a successful run did about a heal it was brought (a failed heal is the run's error).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HealDone {
    /// None brought, or the pod under the name is another one now (dropped).
    #[default]
    NotBrought,
    Healed,
}

/// Puts `pod`'s rules back as `heal` says; a success is reported (log, Normal event,
/// `istio_cni_drift_repaired_total`), whichever run of the key it came in. A failure is the
/// caller's to report (the drift pass reports it once until the pod is fine again).
pub async fn heal<E: Effects + ?Sized>(
    effects: &E,
    metrics: &Metrics,
    pod: Arc<Pod>,
    heal: Heal,
) -> Result<(), ActError> {
    let Heal {
        netns,
        expected,
        what,
    } = heal;
    effects.heal(netns, expected).await?;
    let key = pod.key();
    info!(pod = %key, drifted = %what, "sidecar redirection drift repaired");
    metrics.drift(KIND, true);
    let message = format!("traffic redirection drifted ({what}); re-programmed");
    let record = event(EventType::Normal, REASON_REPAIRED, message);
    if let Err(e) = effects.event(pod, record).await {
        tracing::warn!(pod = %key, "recording the drift event failed: {e}");
    }
    Ok(())
}

#[cfg(test)]
#[path = "heal_tests.rs"]
mod tests;
