//! Where a plugin's ADD is: the enrolment records each step as it enters it, so a
//! `/cmdadd` answered 504 can say what it was waiting for (the pod's lock, the pod store, the
//! netns, the rules, ztunnel's ack, ...) instead of blaming ztunnel for every delay. Also keeps
//! the identity of the netns the ADD opened, for the `/cmdadd` log line, and when each step was
//! entered: the log line's per-step timings (the latency breakdown of an ADD).

use parking_lot::Mutex;
use std::time::Instant;

use crate::netns::NetnsId;

/// One step of an enrolment, in the order they happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AddStep {
    #[default]
    Received,
    WaitingForPodInStore,
    WaitingForPodLock,
    OpeningNetns,
    CheckingNetns,
    ProgrammingRules,
    WaitingForZtunnelAck,
    UpdatingProbeSet,
    WritingAnnotation,
    Done,
}

impl std::fmt::Display for AddStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AddStep::Received => "the request was received",
            AddStep::WaitingForPodInStore => {
                "waiting for the pod to appear in the agent's pod store"
            }
            AddStep::WaitingForPodLock => {
                "waiting for the pod's lock (another add or remove of the pod is running)"
            }
            AddStep::OpeningNetns => "opening the pod's netns",
            AddStep::CheckingNetns => "checking the pod's netns (identity and addresses)",
            AddStep::ProgrammingRules => "programming the in-pod rules",
            AddStep::WaitingForZtunnelAck => "waiting for ztunnel to acknowledge the pod",
            AddStep::UpdatingProbeSet => "adding the pod's IPs to the host probe set",
            AddStep::WritingAnnotation => "writing the pod's redirection annotation",
            AddStep::Done => "done",
        })
    }
}

impl AddStep {
    /// A short name for the per-step timings of the log line.
    pub fn code(self) -> &'static str {
        match self {
            AddStep::Received => "received",
            AddStep::WaitingForPodInStore => "store",
            AddStep::WaitingForPodLock => "lock",
            AddStep::OpeningNetns => "netns_open",
            AddStep::CheckingNetns => "netns_check",
            AddStep::ProgrammingRules => "program",
            AddStep::WaitingForZtunnelAck => "zds",
            AddStep::UpdatingProbeSet => "probe_set",
            AddStep::WritingAnnotation => "annotate",
            AddStep::Done => "done",
        }
    }
}

#[derive(Debug, Default)]
struct State {
    step: AddStep,
    netns: Option<NetnsId>,
    /// Each step as entered, with when (a few entries per ADD).
    entered: Vec<(AddStep, Instant)>,
}

/// Shared between the enrolment (which writes) and the `/cmdadd` answer (which reads).
#[derive(Debug, Default)]
pub struct Progress(Mutex<State>);

impl Progress {
    fn state(&self) -> parking_lot::MutexGuard<'_, State> {
        self.0.lock()
    }

    pub fn enter(&self, step: AddStep) {
        let mut state = self.state();
        state.step = step;
        state.entered.push((step, Instant::now()));
    }

    /// Microseconds spent in each step entered so far, in order (`store:40,lock:2,...`; the
    /// last one up to now unless it is `Done`): what the log line reports per ADD.
    pub fn timings(&self) -> String {
        let state = self.state();
        let now = Instant::now();
        let ends = state.entered.iter().skip(1).map(|(_, at)| *at).chain([now]);
        state
            .entered
            .iter()
            .zip(ends)
            .filter(|((step, _), _)| *step != AddStep::Done)
            .map(|((step, from), to)| {
                format!("{}:{}", step.code(), to.duration_since(*from).as_micros())
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn step(&self) -> AddStep {
        self.state().step
    }

    /// Records the netns the ADD opened.
    pub fn opened(&self, id: NetnsId) {
        self.state().netns = Some(id);
    }

    pub fn netns(&self) -> Option<NetnsId> {
        self.state().netns
    }
}

/// Records `step` when there is a progress to record it in (watch adds have none).
pub fn enter(progress: Option<&Progress>, step: AddStep) {
    if let Some(p) = progress {
        p.enter(step);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timings_name_each_step_entered_in_order() {
        let p = Progress::default();
        assert_eq!(p.timings(), "");
        p.enter(AddStep::WaitingForPodInStore);
        p.enter(AddStep::ProgrammingRules);
        std::thread::sleep(std::time::Duration::from_millis(2));
        p.enter(AddStep::Done);
        let t = p.timings();
        let parts: Vec<(&str, u128)> = t
            .split(',')
            .map(|kv| {
                let (k, v) = kv.split_once(':').expect("step:us");
                (k, v.parse().expect("micros"))
            })
            .collect();
        assert_eq!(parts.len(), 2, "{t}");
        assert_eq!((parts[0].0, parts[1].0), ("store", "program"), "{t}");
        assert!(parts[1].1 >= 2000, "{t}");
    }
}
