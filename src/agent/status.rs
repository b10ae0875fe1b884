//! "Is this pod in the mesh right now?": the `/debug/pods` answer ([`debug_pods`]) that joins it
//! with the pod cache (netns), the pod store (IPs) and ztunnel's side (what was last sent on
//! which connection, and the answer). The JSON shape is versioned and documented in
//! docs/troubleshooting.md; fields are only ever added. What the drift pass last found for each
//! enrolled pod and for the host rules ([`Status`](super::findings::Status)) is kept in
//! `findings`, below the reconciler whose `Core` holds it; the check types are named here too, as
//! the answer's.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

pub use super::findings::{Check, CheckResult};
use super::pod;
use super::ports::WorkloadState;
use super::reconciler::Core;
use crate::kube::stores::pod_key;

/// The shape's version (`version` in the answer): bumped only if a field changes meaning.
pub const DEBUG_PODS_VERSION: u32 = 1;

/// The `/debug/pods` answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DebugPods {
    pub version: u32,
    /// The host probe SNAT rules and probe sets at the last drift pass (null before the first).
    pub host_rules: Option<Check>,
    /// Every pod in the agent's cache (ztunnel's state of the world), by namespace and name.
    pub pods: Vec<PodStatus>,
    /// The node store's other pods: mode and why not enrolled (`agent::node_pods`).
    #[serde(default)]
    pub not_enrolled: Vec<super::node_pods::NodePod>,
}

/// One enrolled pod.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PodStatus {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// The netns handle the agent holds (null: not found; ztunnel then gets a Keep).
    pub netns: Option<NetnsStatus>,
    /// The pod's IPs (the store's pod with the second addresses its ADD verified, else — when the
    /// store lists none yet — what the agent verified and put in the probe set).
    pub ips: Vec<String>,
    /// The drift pass's last check of the pod's in-pod rules (null before the first).
    pub last_verified: Option<Check>,
    /// What was last sent to ztunnel about the pod (null: nothing since the agent started).
    pub zds: Option<WorkloadState>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NetnsStatus {
    pub path: String,
    pub inode: u64,
}

/// The answer of a node without the ambient agent (sidecar-only: the repair controller's pod
/// store): every pod with its sidecar state, none enrolled, no host rules.
pub fn debug_pods_without_agent(pods: &crate::kube::stores::PodStore) -> DebugPods {
    DebugPods {
        version: DEBUG_PODS_VERSION,
        host_rules: None,
        pods: Vec::new(),
        not_enrolled: super::node_pods::without_agent(&pods.list()),
    }
}

/// Builds the answer from the agent's state; read-only.
pub fn debug_pods(core: &Core) -> DebugPods {
    let zds = core.mesh.ztunnel.workload_states();
    let mut pods: Vec<PodStatus> = core
        .mesh
        .cache
        .snapshot()
        .into_iter()
        .map(|(uid, entry)| {
            let key = pod_key(&entry.info.namespace, &entry.info.name);
            let stored = core.pods.get(&key).filter(|p| pod::uid(p) == uid);
            // The store's pod may not list its IPs yet (the kubelet reports them after ADD);
            // then the IPs the agent verified and put in the probe set.
            // A second address the ADD verified is in no status: listed after the store's.
            let ips = match stored.as_ref().map(|p| pod::ips(p)) {
                Some(ips) if !ips.is_empty() => super::cni_ips::union(&ips, &entry.cni_ips),
                _ => entry.probe_ips.clone().unwrap_or_default(),
            };
            PodStatus {
                netns: entry.netns.as_ref().map(|ns| NetnsStatus {
                    path: ns.path().display().to_string(),
                    inode: ns.id().inode,
                }),
                ips: ips.iter().map(ToString::to_string).collect(),
                last_verified: core.status.pod(&uid),
                zds: zds.get(&uid).cloned(),
                namespace: entry.info.namespace,
                name: entry.info.name,
                uid,
            }
        })
        .collect();
    pods.sort_by(|a, b| (&a.namespace, &a.name, &a.uid).cmp(&(&b.namespace, &b.name, &b.uid)));
    let cached: HashSet<String> = pods.iter().map(|p| p.uid.clone()).collect();
    DebugPods {
        version: DEBUG_PODS_VERSION,
        host_rules: core.status.host(),
        not_enrolled: super::node_pods::not_enrolled(core, &cached),
        pods,
    }
}
