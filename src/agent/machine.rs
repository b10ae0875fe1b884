//! The enrolment state machine, pure and level-based: a key's world as it is now (the pod
//! the store has, the pods of the name the agent holds, the last deleted one, the namespace's
//! labels) and the policy in; the actions that bring it where it should be out. No events (the
//! reconcile engine coalesces triggers, so nothing may depend on one), no effects, no clock.

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

/// What the agent holds of a pod (its pod-cache entry): the pod (the last object seen, or one
/// rebuilt from the cache's identity), the probe-set IPs recorded for it, and whether its
/// `enabled` annotation is still owed (a `/podadd` enrolment answers before writing it).
#[derive(Debug, Clone)]
pub struct Held {
    pub pod: Arc<Pod>,
    pub probe_ips: Option<Vec<IpAddr>>,
    pub annotation_owed: bool,
    /// Programmed, but not taken by ztunnel yet (to be added again, as a `pending` pod).
    pub awaiting_ztunnel: bool,
    /// The addresses its ADD verified beyond what a status holds ([`super::cni_ips`]): its
    /// probe entries are these with the status IPs.
    pub cni_ips: Vec<IpAddr>,
}

/// One key's world now, as the reconcile reads it: the pod the store has under the name, the
/// pods of that name the agent holds, the pod the store last reported deleted under it, and the
/// namespace's labels (`None`: the namespace is not in the store).
#[derive(Debug, Clone, Copy)]
pub struct Now<'a> {
    pub current: Option<&'a Arc<Pod>>,
    pub held: &'a [Held],
    pub gone: Option<&'a Arc<Pod>>,
    pub namespace_labels: Option<&'a BTreeMap<String, String>>,
}

/// What to do about a key.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Nothing to do (why, for the debug log).
    Skip(&'static str),
    /// The namespace is not in the store yet: wait for it (Istio dropped these, B9).
    RequeueNamespaceMissing,
    Add {
        pod: Arc<Pod>,
        ips: Vec<IpAddr>,
    },
    /// `deleted`: the pod is gone or terminal (no in-pod cleanup, the netns goes with it);
    /// `terminal`: still in the store, finished (its annotation is cleared). `ips`: the IPs its
    /// probe-set entries were recorded with (a terminal pod's object has none left, k8s issue
    /// 125370).
    Remove {
        pod: Arc<Pod>,
        ips: Vec<IpAddr>,
        deleted: bool,
        terminal: bool,
    },
    /// Enrolled pod whose IPs changed: put them in the probe set again.
    ReassertProbes {
        pod: Arc<Pod>,
        ips: Vec<IpAddr>,
    },
    /// Enrolled by a `/podadd` whose `enabled` annotation is not written yet: write it (a second
    /// add would send ztunnel the pod again).
    WriteOwedAnnotation {
        pod: Arc<Pod>,
    },
}

/// The state table, level-based: first every pod of the name that is not the current one is
/// removed (held by the agent, or reported deleted and enrolled or selected), then one action for
/// the current pod.
pub fn decide(now: &Now<'_>, policy: &EnrolmentPolicy) -> Vec<Action> {
    let current_uid = now.current.map(|p| pod::uid(p));
    let mut actions: Vec<Action> = now
        .held
        .iter()
        .filter(|h| Some(pod::uid(&h.pod)) != current_uid)
        .map(|h| Action::Remove {
            pod: h.pod.clone(),
            ips: held_ips(h),
            deleted: true,
            terminal: false,
        })
        .collect();
    if let Some(gone) = now.gone {
        let uid = pod::uid(gone);
        let held = now.held.iter().any(|h| pod::uid(&h.pod) == uid);
        if Some(uid) != current_uid && !held && was_enrolled(gone, now.namespace_labels, policy) {
            actions.push(Action::Remove {
                pod: gone.clone(),
                ips: pod::ips(gone),
                deleted: true,
                terminal: false,
            });
        }
    }
    let current = match now.current {
        Some(current) => current,
        None if actions.is_empty() => return vec![Action::Skip("pod not in the store")],
        None => return actions,
    };
    let mine = now
        .held
        .iter()
        .find(|h| Some(pod::uid(&h.pod)) == current_uid);
    actions.push(decide_current(current, mine, now.namespace_labels, policy));
    actions
}

/// A deleted pod is removed when it was annotated (enrolled or pending) or is selected.
fn was_enrolled(
    gone: &Pod,
    namespace_labels: Option<&BTreeMap<String, String>>,
    policy: &EnrolmentPolicy,
) -> bool {
    let empty = BTreeMap::new();
    pod::redirection(gone) != Redirection::None
        || policy.matches(gone, namespace_labels.unwrap_or(&empty))
}

fn held_ips(h: &Held) -> Vec<IpAddr> {
    h.probe_ips.clone().unwrap_or_else(|| pod::ips(&h.pod))
}

fn decide_current(
    current: &Arc<Pod>,
    mine: Option<&Held>,
    namespace_labels: Option<&BTreeMap<String, String>>,
    policy: &EnrolmentPolicy,
) -> Action {
    let Some(ns_labels) = namespace_labels else {
        return Action::RequeueNamespaceMissing;
    };
    let state = pod::redirection(current);
    let partial = state == Redirection::Pending || mine.is_some_and(|h| h.awaiting_ztunnel);
    let in_mesh = state == Redirection::Enabled || mine.is_some();
    let should = policy.should_enrol(current, ns_labels);
    let terminal = pod::is_terminal(current);
    if terminal {
        if in_mesh || partial {
            let ips = mine.map(held_ips).unwrap_or_else(|| pod::ips(current));
            return Action::Remove {
                pod: current.clone(),
                ips,
                deleted: true,
                terminal: true,
            };
        }
        return Action::Skip(SKIP_TERMINAL);
    }
    if should && !partial && mine.is_some_and(|h| h.annotation_owed) {
        return Action::WriteOwedAnnotation {
            pod: current.clone(),
        };
    }
    let recorded = mine.map(|h| h.cni_ips.as_slice()).unwrap_or_default();
    let ips = super::cni_ips::union(&pod::ips(current), recorded);
    let moved = mine.is_some_and(|h| h.probe_ips.as_deref() != Some(ips.as_slice()));
    if in_mesh && should && !partial && !ips.is_empty() && moved {
        return Action::ReassertProbes {
            pod: current.clone(),
            ips,
        };
    }
    let change = (in_mesh != should) || partial;
    if !change {
        return Action::Skip(if should {
            "no change"
        } else {
            SKIP_NOT_SELECTED
        });
    }
    if !should {
        let ips = mine.map(held_ips).unwrap_or_else(|| ips.clone());
        return Action::Remove {
            pod: current.clone(),
            ips,
            deleted: false,
            terminal: false,
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
    let exclusion = || {
        let empty = BTreeMap::new();
        policy.exclusion(stored, namespace_labels.unwrap_or(&empty))
    };
    match decide_current(stored, None, namespace_labels, policy) {
        Action::RequeueNamespaceMissing => NotEnrolled::NamespaceMissing,
        Action::Skip(SKIP_TERMINAL) => NotEnrolled::Terminated,
        Action::Skip(SKIP_NO_IP) => NotEnrolled::NoIp,
        Action::Add { .. } => NotEnrolled::Pending,
        Action::Remove { .. } => NotEnrolled::Leaving,
        Action::Skip(_) | Action::ReassertProbes { .. } | Action::WriteOwedAnnotation { .. } => {
            match exclusion() {
                Some(e) => NotEnrolled::Excluded(e),
                None => NotEnrolled::NotCached,
            }
        }
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

/// The pods a namespace re-evaluation looks at again (their keys), ztunnel excepted.
pub fn reevaluated_keys(pods: &[Arc<Pod>], policy: &EnrolmentPolicy) -> Vec<String> {
    pods.iter()
        .filter(|p| !pod::is_ztunnel(p, &policy.system_namespace))
        .map(|p| crate::kube::stores::pod_key(pod::namespace(p), pod::name(p)))
        .collect()
}

/// The startup snapshot: fully enrolled pods, not ztunnel, not terminal.
pub fn in_snapshot(pod: &Pod, policy: &EnrolmentPolicy) -> bool {
    pod::redirection(pod) == Redirection::Enabled
        && !pod::is_ztunnel(pod, &policy.system_namespace)
        && !pod::is_terminal(pod)
}

#[cfg(test)]
#[path = "machine_tests.rs"]
mod tests;
