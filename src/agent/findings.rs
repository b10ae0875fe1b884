//! What the drift pass finds: what one pod's program call means ([`DriftFinding`], decided by
//! [`judge`], pure) and the last result per pod and for the host rules ([`Status`], kept in the
//! reconciler's `Core` and served by `status` as `/debug/pods`). Below the reconciler, the drift
//! pass and the answer, which all use it; it names only the ports' types.

use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::ports::{DataplaneError, RuleChange};

/// What one pod's program call means for the pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriftFinding {
    /// The netns held exactly the planned rules; nothing was written.
    InPlace,
    /// The rules differed and were written (how).
    Healed(RuleChange),
    /// Programming failed (why).
    Failed(String),
}

/// Pure: any outcome but `AlreadyApplied` means the netns differed from the plan and was
/// rewritten.
pub fn judge(result: &Result<RuleChange, DataplaneError>) -> DriftFinding {
    match result {
        Ok(RuleChange::AlreadyApplied) => DriftFinding::InPlace,
        Ok(outcome) => DriftFinding::Healed(outcome.clone()),
        Err(e) => DriftFinding::Failed(e.to_string()),
    }
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum CheckResult {
    /// Read and found as planned; nothing written.
    InPlace,
    /// Found different and re-applied (what differed).
    Repaired { what: String },
    /// Could not be verified or re-applied (why).
    Failed { error: String },
}

/// A check and when it finished.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    pub at_unix_ms: u64,
    #[serde(flatten)]
    pub result: CheckResult,
}

impl Check {
    fn now(result: CheckResult) -> Self {
        let at_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        Check { at_unix_ms, result }
    }
}

/// The drift pass's last results.
#[derive(Debug, Default)]
pub struct Status {
    pods: Mutex<HashMap<String, Check>>,
    host: Mutex<Option<Check>>,
}

impl Status {
    pub fn pod_checked(&self, uid: &str, result: CheckResult) {
        self.pods.lock().insert(uid.to_string(), Check::now(result));
    }

    pub fn host_checked(&self, result: CheckResult) {
        *self.host.lock() = Some(Check::now(result));
    }

    /// Forgets pods no longer cached.
    pub fn retain(&self, cached: &HashSet<String>) {
        self.pods.lock().retain(|uid, _| cached.contains(uid));
    }

    pub fn pod(&self, uid: &str) -> Option<Check> {
        self.pods.lock().get(uid).cloned()
    }

    pub fn host(&self) -> Option<Check> {
        self.host.lock().clone()
    }
}
