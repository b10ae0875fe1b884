//! Where a plugin's ADD is (issue 20 §8): the enrolment records each step as it enters it, so a
//! `/cmdadd` answered 504 can say what it was waiting for (the pod's lock, the pod store, the
//! netns, the rules, ztunnel's ack, ...) instead of blaming ztunnel for every delay. Also keeps
//! the identity of the netns the ADD opened, for the `/cmdadd` log line.

use std::sync::Mutex;

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

#[derive(Debug, Default)]
struct State {
    step: AddStep,
    netns: Option<NetnsId>,
}

/// Shared between the enrolment (which writes) and the `/cmdadd` answer (which reads).
#[derive(Debug, Default)]
pub struct Progress(Mutex<State>);

impl Progress {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn enter(&self, step: AddStep) {
        self.state().step = step;
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
