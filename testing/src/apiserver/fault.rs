//! Injected faults: what to break (down, slow, failing), where (a path prefix) and how many
//! times, and which fault the front door applies to a request.

use std::time::Duration;

use super::Shared;

/// What to break, for how long and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultKind {
    /// Stop listening: connects are refused until `clear_faults`/`restart` (same port).
    Down,
    /// Hold every response back this long.
    Delay(Duration),
    /// Answer with this HTTP code and a matching `Status` (403 Forbidden, 500 InternalError, ...).
    Fail(u16),
}

/// One injected fault: a kind, an optional request-path prefix, an optional number of requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub kind: FaultKind,
    /// Only requests whose path starts with this are affected (`None` = all). Ignored for `Down`.
    pub path_prefix: Option<String>,
    /// Affect only this many matching requests, then vanish (`None` = until cleared).
    pub times: Option<u32>,
}

impl Fault {
    pub fn down() -> Self {
        Fault::new(FaultKind::Down)
    }

    pub fn slow(delay: Duration) -> Self {
        Fault::new(FaultKind::Delay(delay))
    }

    pub fn fail(code: u16) -> Self {
        Fault::new(FaultKind::Fail(code))
    }

    pub fn on_path(mut self, prefix: &str) -> Self {
        self.path_prefix = Some(prefix.to_string());
        self
    }

    pub fn times(mut self, count: u32) -> Self {
        self.times = Some(count);
        self
    }

    fn new(kind: FaultKind) -> Self {
        Fault {
            kind,
            path_prefix: None,
            times: None,
        }
    }
}

impl Shared {
    /// Takes the first fault matching this path, counting down limited ones.
    pub(super) fn matching_fault(&self, path: &str) -> Option<FaultKind> {
        let mut faults = self.faults.lock();
        let index = faults
            .iter()
            .position(|f| f.path_prefix.as_deref().is_none_or(|p| path.starts_with(p)))?;
        let kind = faults[index].kind.clone();
        if let Some(times) = faults[index].times.as_mut() {
            *times = times.saturating_sub(1);
            if *times == 0 {
                faults.remove(index);
            }
        }
        Some(kind)
    }
}
