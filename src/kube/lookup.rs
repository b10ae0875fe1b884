//! When a stored pod may be answered for, instead of the API server being asked: the pod store is
//! live (initial list done, no watch failure since the last event, no re-list in progress), the
//! pod is in it, and its uid is the one the runtime gave the plugin (`K8S_POD_UID`) — the same pod
//! object, so its resourceVersion is at least its creation's. Anything else is "not yet" and the
//! asker falls back to the API server (docs/plugin.md, "Pod facts"). One rule for both askers:
//! install-cni's pod-facts socket and the agent's `/podadd`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use super::stores::{NamespaceStore, PodStore, namespace_labels, pod_key};

/// The pod asked about: its namespace, name and uid, and whether its namespace's labels are wanted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Query<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
    pub namespace_labels: bool,
}

/// A stored pod a request may be answered with, and its namespace's labels (see [`stored_pod`]).
pub type Found = (std::sync::Arc<Pod>, Option<BTreeMap<String, String>>);

/// The stored pod a request may be answered with, and its namespace's labels when asked for
/// and the namespace store is live and has them; else why not yet. The one rule of the module
/// doc, shared by the pod-facts socket's answer and the agent's `/podadd`.
pub fn stored_pod(
    request: &Query<'_>,
    pods: &PodStore,
    namespaces: Option<&NamespaceStore>,
) -> Result<Found, NotYet> {
    if !pods.is_synced() {
        return Err(NotYet::NotSynced);
    }
    if !pods.is_live() {
        return Err(NotYet::WatchFailed);
    }
    let key = pod_key(request.namespace, request.name);
    let Some(pod) = pods.get(&key) else {
        return Err(NotYet::NotStored { pod: key });
    };
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    if uid != request.uid {
        return Err(NotYet::OtherUid {
            pod: key,
            stored: uid.to_string(),
            asked: request.uid.to_string(),
        });
    }
    let namespace_labels = if request.namespace_labels {
        namespaces
            .filter(|ns| ns.is_live())
            .and_then(|ns| namespace_labels(ns, request.namespace))
    } else {
        None
    };
    Ok((pod, namespace_labels))
}

/// Why the stores cannot answer for a pod yet (the asker falls back to the API server).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotYet {
    #[error("the pod store has not synced")]
    NotSynced,
    #[error("the pod watch failed; the store may be missing changes")]
    WatchFailed,
    #[error("pod {pod} is not in the store yet")]
    NotStored { pod: String },
    #[error("the store holds pod {pod} with uid {stored:?}, not {asked:?}")]
    OtherUid {
        pod: String,
        stored: String,
        asked: String,
    },
    #[error("namespace {namespace} is not in the agent's namespace store (or its watch failed)")]
    NamespaceNotStored { namespace: String },
}

#[cfg(test)]
mod tests;
