//! The enrolment state machine (§3.5), pure: an event, the pod as the store has it now, its
//! namespace's labels and the policy in; one action out. No effects, no clock.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::pod::{self, Redirection};
use crate::kube::selector::SelectorError;
use crate::kube::selector::enablement::{Enablement, EnablementSelector, NotSelected, PodFacts};

/// Who is enrolled: the enablement selectors, excluded namespaces, and which pods are ztunnel.
#[derive(Debug, Clone)]
pub struct EnrolmentPolicy {
    pub enablement: Enablement,
    pub exclude_namespaces: HashSet<String>,
    pub system_namespace: String,
}

impl EnrolmentPolicy {
    pub fn new(
        selectors: &[EnablementSelector],
        exclude_namespaces: &[String],
        system_namespace: &str,
    ) -> Result<Self, SelectorError> {
        Ok(EnrolmentPolicy {
            enablement: Enablement::compile(selectors)?,
            exclude_namespaces: exclude_namespaces.iter().cloned().collect(),
            system_namespace: system_namespace.to_string(),
        })
    }

    /// The selectors (with the hostNetwork and sidecar exclusions); ztunnel pods never match.
    pub fn matches(&self, pod: &Pod, namespace_labels: &BTreeMap<String, String>) -> bool {
        self.selection(pod, namespace_labels).is_ok()
    }

    fn selection(
        &self,
        pod: &Pod,
        namespace_labels: &BTreeMap<String, String>,
    ) -> Result<(), Exclusion> {
        if pod::is_ztunnel(pod, &self.system_namespace) {
            return Err(Exclusion::Ztunnel);
        }
        let empty = BTreeMap::new();
        let facts = PodFacts {
            labels: pod.metadata.labels.as_ref().unwrap_or(&empty),
            annotations: pod.metadata.annotations.as_ref().unwrap_or(&empty),
            host_network: pod::is_host_network(pod),
        };
        self.enablement
            .pod_verdict(facts, namespace_labels)
            .map_err(Exclusion::NotSelected)
    }

    pub fn is_excluded(&self, namespace: &str) -> bool {
        self.exclude_namespaces.contains(namespace)
    }

    /// Why the policy leaves the pod out (`None`: it is to be enrolled).
    pub fn exclusion(
        &self,
        pod: &Pod,
        namespace_labels: &BTreeMap<String, String>,
    ) -> Option<Exclusion> {
        match self.selection(pod, namespace_labels) {
            Err(e) => Some(e),
            Ok(()) if self.is_excluded(pod::namespace(pod)) => Some(Exclusion::ExcludedNamespace),
            Ok(()) => None,
        }
    }

    /// Matches and not in an excluded namespace.
    pub fn should_enrol(&self, pod: &Pod, namespace_labels: &BTreeMap<String, String>) -> bool {
        self.exclusion(pod, namespace_labels).is_none()
    }
}

/// Why the policy leaves a pod out of ambient.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exclusion {
    Ztunnel,
    NotSelected(NotSelected),
    /// The namespace is in `EXCLUDE_NAMESPACES`.
    ExcludedNamespace,
}

/// A pod event as the worker queues it.
#[derive(Debug, Clone)]
pub enum PodEvent {
    /// A change (or a re-evaluation, old = new, when the namespace changed).
    Update {
        old: Arc<Pod>,
        new: Arc<Pod>,
    },
    Delete(Arc<Pod>),
}

impl PodEvent {
    /// The queue key: `namespace/name`.
    pub fn key(&self) -> String {
        let p = match self {
            PodEvent::Update { new, .. } => new,
            PodEvent::Delete(p) => p,
        };
        crate::kube::stores::pod_key(pod::namespace(p), pod::name(p))
    }
}

/// What to do about an event.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Nothing to do (why, for the debug log).
    Skip(&'static str),
    /// The namespace is not in the store yet: try again later (Istio dropped these, B9).
    RequeueNamespaceMissing,
    Add {
        pod: Arc<Pod>,
        ips: Vec<IpAddr>,
    },
    /// `deleted`: the pod is gone or terminal (no in-pod cleanup, the netns goes with it).
    Remove {
        pod: Arc<Pod>,
        deleted: bool,
    },
    /// Enrolled pod whose IPs changed: put them in the probe set again.
    ReassertProbes {
        pod: Arc<Pod>,
        ips: Vec<IpAddr>,
    },
}

/// The §3.5 table. `current` is the pod as the store has it now (`None`: gone from the store);
/// `namespace_labels` is `None` when the namespace is not in the store.
pub fn decide(
    event: &PodEvent,
    current: Option<&Arc<Pod>>,
    namespace_labels: Option<&BTreeMap<String, String>>,
    policy: &EnrolmentPolicy,
) -> Action {
    match event {
        PodEvent::Delete(gone) => {
            let state = pod::redirection(gone);
            let empty = BTreeMap::new();
            let matches = policy.matches(gone, namespace_labels.unwrap_or(&empty));
            if state != Redirection::None || matches {
                Action::Remove {
                    pod: gone.clone(),
                    deleted: true,
                }
            } else {
                Action::Skip("deleted pod was never enrolled")
            }
        }
        PodEvent::Update { old, .. } => {
            let Some(ns_labels) = namespace_labels else {
                return Action::RequeueNamespaceMissing;
            };
            let Some(current) = current else {
                return Action::Skip("pod no longer in the store");
            };
            let state = pod::redirection(current);
            let enrolled = state == Redirection::Enabled;
            let partial = state == Redirection::Pending;
            let should = policy.should_enrol(current, ns_labels);
            let terminal = pod::is_terminal(current);
            if (enrolled || partial) && terminal {
                // The old object: Kubernetes blanks a terminal pod's IPs (k8s issue 125370).
                return Action::Remove {
                    pod: old.clone(),
                    deleted: true,
                };
            }
            let ips = pod::ips(current);
            if enrolled && should && !terminal && !ips.is_empty() && ips != pod::ips(old) {
                return Action::ReassertProbes {
                    pod: current.clone(),
                    ips,
                };
            }
            if terminal {
                return Action::Skip(SKIP_TERMINAL);
            }
            let change = (enrolled != should) || partial;
            if !change {
                return Action::Skip(if should {
                    "no change"
                } else {
                    SKIP_NOT_SELECTED
                });
            }
            if !should {
                return Action::Remove {
                    pod: current.clone(),
                    deleted: false,
                };
            }
            if ips.is_empty() {
                return Action::Skip(SKIP_NO_IP);
            }
            Action::Add {
                pod: current.clone(),
                ips,
            }
        }
    }
}

const SKIP_TERMINAL: &str = "pod has terminated";
const SKIP_NOT_SELECTED: &str = "not selected";
const SKIP_NO_IP: &str = "pod has no IP yet";

/// Why a pod of the node's store is not in the agent's cache, from the decision a re-evaluation
/// of the pod as stored makes now (the worker's [`decide`], and the policy's reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotEnrolled {
    Excluded(Exclusion),
    /// Selected, but the pod's namespace is not in the store yet (the worker retries).
    NamespaceMissing,
    Terminated,
    NoIp,
    /// Selected with an IP: enrolled by the plugin's ADD, or the worker's event in progress or
    /// retrying after a failure (the agent's log names it).
    Pending,
    /// Annotated as enrolled but no longer selected: the worker is removing it.
    Leaving,
    /// Annotated enabled and selected, yet not in the cache (restored at the next restart).
    NotCached,
}

pub fn not_enrolled(
    stored: &Arc<Pod>,
    namespace_labels: Option<&BTreeMap<String, String>>,
    policy: &EnrolmentPolicy,
) -> NotEnrolled {
    let event = PodEvent::Update {
        old: stored.clone(),
        new: stored.clone(),
    };
    let exclusion = || {
        let empty = BTreeMap::new();
        policy.exclusion(stored, namespace_labels.unwrap_or(&empty))
    };
    match decide(&event, Some(stored), namespace_labels, policy) {
        Action::RequeueNamespaceMissing => NotEnrolled::NamespaceMissing,
        Action::Skip(SKIP_TERMINAL) => NotEnrolled::Terminated,
        Action::Skip(SKIP_NO_IP) => NotEnrolled::NoIp,
        Action::Add { .. } => NotEnrolled::Pending,
        Action::Remove { .. } => NotEnrolled::Leaving,
        Action::Skip(_) | Action::ReassertProbes { .. } => match exclusion() {
            Some(e) => NotEnrolled::Excluded(e),
            None => NotEnrolled::NotCached,
        },
    }
}

impl NotEnrolled {
    /// A stable name for scripts.
    pub fn code(self) -> &'static str {
        match self {
            NotEnrolled::Excluded(Exclusion::Ztunnel) => "ztunnel",
            NotEnrolled::Excluded(Exclusion::NotSelected(NotSelected::HostNetwork)) => {
                "host_network"
            }
            NotEnrolled::Excluded(Exclusion::NotSelected(NotSelected::SidecarInjected)) => {
                "sidecar"
            }
            NotEnrolled::Excluded(Exclusion::NotSelected(NotSelected::NoSelectorMatches)) => {
                "not_selected"
            }
            NotEnrolled::Excluded(Exclusion::ExcludedNamespace) => "excluded_namespace",
            NotEnrolled::NamespaceMissing => "namespace_missing",
            NotEnrolled::Terminated => "terminated",
            NotEnrolled::NoIp => "no_ip",
            NotEnrolled::Pending => "pending",
            NotEnrolled::Leaving => "leaving",
            NotEnrolled::NotCached => "not_cached",
        }
    }

    /// For operators.
    pub fn text(self) -> &'static str {
        match self {
            NotEnrolled::Excluded(Exclusion::Ztunnel) => "a ztunnel pod (never enrolled)",
            NotEnrolled::Excluded(Exclusion::NotSelected(NotSelected::HostNetwork)) => {
                "hostNetwork pod (never ambient)"
            }
            NotEnrolled::Excluded(Exclusion::NotSelected(NotSelected::SidecarInjected)) => {
                "sidecar-injected (sidecar.istio.io/status; never ambient)"
            }
            NotEnrolled::Excluded(Exclusion::NotSelected(NotSelected::NoSelectorMatches)) => {
                "not selected by AMBIENT_ENABLEMENT_SELECTOR"
            }
            NotEnrolled::Excluded(Exclusion::ExcludedNamespace) => {
                "namespace is in EXCLUDE_NAMESPACES"
            }
            NotEnrolled::NamespaceMissing => "selected, but its namespace is not in the store yet",
            NotEnrolled::Terminated => "pod has terminated",
            NotEnrolled::NoIp => "selected, but the pod has no IP yet",
            NotEnrolled::Pending => {
                "selected, not enrolled yet (plugin ADD or agent retry pending; see the agent log)"
            }
            NotEnrolled::Leaving => "no longer selected; being removed",
            NotEnrolled::NotCached => "annotated enrolled but not in the agent's cache",
        }
    }
}

/// Whether a namespace event re-evaluates the namespace's pods: always when it first appears
/// (that is how pods selected before the agent started get enrolled), else when the namespace's
/// own match (non-empty namespace selectors only) changed.
pub fn namespace_reevaluates(
    old: Option<&BTreeMap<String, String>>,
    new: &BTreeMap<String, String>,
    policy: &EnrolmentPolicy,
) -> bool {
    match old {
        None => true,
        Some(old) => {
            policy.enablement.namespace_matches(old) != policy.enablement.namespace_matches(new)
        }
    }
}

/// The events a namespace re-evaluation queues: an update (old = new) per pod, ztunnel excepted.
pub fn reevaluation_events(pods: &[Arc<Pod>], policy: &EnrolmentPolicy) -> Vec<PodEvent> {
    pods.iter()
        .filter(|p| !pod::is_ztunnel(p, &policy.system_namespace))
        .map(|p| PodEvent::Update {
            old: p.clone(),
            new: p.clone(),
        })
        .collect()
}

/// The startup snapshot (§3.2): fully enrolled pods, not ztunnel, not terminal.
pub fn in_snapshot(pod: &Pod, policy: &EnrolmentPolicy) -> bool {
    pod::redirection(pod) == Redirection::Enabled
        && !pod::is_ztunnel(pod, &policy.system_namespace)
        && !pod::is_terminal(pod)
}

#[cfg(test)]
#[path = "machine_tests.rs"]
mod tests;
