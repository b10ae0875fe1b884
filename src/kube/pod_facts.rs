//! Pod facts: the plugin asks install-cni's node pod store for the pod it is setting up instead of
//! GETting it from the API server. One typed request and one typed answer, each a single JSON
//! line over a root-only Unix socket in the run dir; this module holds the types (shared by the
//! plugin's encoder and install-cni's decoder), the pure answer over the stores, and the trimming
//! of a pod to what the plugin reads.
//!
//! When an answer may be used (docs/plugin.md, "Pod facts"): the pod store is live (initial list
//! done, no watch failure since the last event, no re-list in progress), the pod is in it, and its
//! uid is the one the runtime gave the plugin (`K8S_POD_UID`) — the same pod object, so its
//! resourceVersion is at least its creation's. Anything else is "not yet" and the plugin GETs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod, PodSpec, SecurityContext};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use super::names;
use super::stores::{NamespaceStore, PodStore, namespace_labels, pod_key};

/// The longest request line accepted (a namespace, a name and a uid fit many times over).
pub const MAX_REQUEST_BYTES: usize = 4096;

/// `<run dir>/podfacts/pod.sock`; the directory is 0700 and the socket 0600, both root's.
pub fn socket_path(run_dir: &Path) -> PathBuf {
    run_dir.join("podfacts").join("pod.sock")
}

/// What the plugin asks: one pod, and optionally its namespace's labels (the ambient check).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodFactsRequest {
    pub namespace: String,
    pub name: String,
    /// `K8S_POD_UID` from CNI_ARGS; required (a pod re-created under the same name has another).
    pub uid: String,
    #[serde(default)]
    pub namespace_labels: bool,
}

/// The one answer to a request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "camelCase")]
pub enum PodFactsAnswer {
    /// The pod as the store holds it, trimmed by [`trim_for_plugin`]; the namespace's labels
    /// when asked for and the namespace store is live and has it.
    #[serde(rename_all = "camelCase")]
    Pod {
        pod: Box<Pod>,
        #[serde(default)]
        namespace_labels: Option<BTreeMap<String, String>>,
    },
    /// Not something the plugin may use now; it asks the API server instead.
    #[serde(rename_all = "camelCase")]
    NotYet { reason: String },
    /// The request was not understood; nothing was looked up.
    #[serde(rename_all = "camelCase")]
    Error { message: String },
}

/// A request that cannot be answered, naming what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("request longer than {MAX_REQUEST_BYTES} bytes")]
    TooLong,
    #[error("request is not a pod-facts request: {0}")]
    Malformed(String),
    #[error("request names no pod: {0}")]
    InvalidName(#[from] names::InvalidName),
    #[error("request has no uid (K8S_POD_UID)")]
    NoUid,
}

impl PodFactsRequest {
    /// One line (no newline inside: serde_json escapes control characters).
    pub fn encode(&self) -> Vec<u8> {
        let mut line = serde_json::to_vec(self).unwrap_or_default();
        line.push(b'\n');
        line
    }

    /// Parses and checks a request line (the trailing newline optional).
    pub fn decode(line: &[u8]) -> Result<PodFactsRequest, RequestError> {
        if line.len() > MAX_REQUEST_BYTES {
            return Err(RequestError::TooLong);
        }
        let request: PodFactsRequest = serde_json::from_slice(line.trim_ascii_end())
            .map_err(|e| RequestError::Malformed(e.to_string()))?;
        names::check_namespace(&request.namespace)?;
        names::check_pod_name(&request.name)?;
        if request.uid.is_empty() {
            return Err(RequestError::NoUid);
        }
        Ok(request)
    }
}

impl PodFactsAnswer {
    pub fn encode(&self) -> Vec<u8> {
        let mut line = serde_json::to_vec(self).unwrap_or_default();
        line.push(b'\n');
        line
    }

    pub fn decode(line: &[u8]) -> Result<PodFactsAnswer, serde_json::Error> {
        serde_json::from_slice(line.trim_ascii_end())
    }

    fn not_yet(reason: impl Into<String>) -> PodFactsAnswer {
        PodFactsAnswer::NotYet {
            reason: reason.into(),
        }
    }
}

/// Answers one request line from the stores (pure apart from reading them).
pub fn answer_line(
    line: &[u8],
    pods: &PodStore,
    namespaces: Option<&NamespaceStore>,
) -> PodFactsAnswer {
    match PodFactsRequest::decode(line) {
        Ok(request) => answer(&request, pods, namespaces),
        Err(e) => PodFactsAnswer::Error {
            message: e.to_string(),
        },
    }
}

/// The answer to a checked request (see the module doc for when it is a pod).
pub fn answer(
    request: &PodFactsRequest,
    pods: &PodStore,
    namespaces: Option<&NamespaceStore>,
) -> PodFactsAnswer {
    match lookup(request, pods, namespaces) {
        Ok((pod, namespace_labels)) => PodFactsAnswer::Pod {
            pod: Box::new(trim_for_plugin(&pod)),
            namespace_labels,
        },
        Err(reason) => PodFactsAnswer::not_yet(reason.to_string()),
    }
}

/// A stored pod a request may be answered with, and its namespace's labels (see [`lookup`]).
pub type Found = (std::sync::Arc<Pod>, Option<BTreeMap<String, String>>);

/// The stored pod a request may be answered with, and its namespace's labels when asked for
/// and the namespace store is live and has them; else why not yet. The one rule of the module
/// doc, shared by this socket's answer and the agent's `/podadd`.
pub fn lookup(
    request: &PodFactsRequest,
    pods: &PodStore,
    namespaces: Option<&NamespaceStore>,
) -> Result<Found, NotYet> {
    if !pods.is_synced() {
        return Err(NotYet::NotSynced);
    }
    if !pods.is_live() {
        return Err(NotYet::WatchFailed);
    }
    let key = pod_key(&request.namespace, &request.name);
    let Some(pod) = pods.get(&key) else {
        return Err(NotYet::NotStored { pod: key });
    };
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    if uid != request.uid {
        return Err(NotYet::OtherUid {
            pod: key,
            stored: uid.to_string(),
            asked: request.uid.clone(),
        });
    }
    let namespace_labels = if request.namespace_labels {
        namespaces
            .filter(|ns| ns.is_live())
            .and_then(|ns| namespace_labels(ns, &request.namespace))
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

/// The pod with only what the plugin reads (`sidecar::PodInfo`): identity, labels,
/// annotations, host network, and per container its name, args, literal env values and run-as
/// user/group.
pub fn trim_for_plugin(pod: &Pod) -> Pod {
    let m = &pod.metadata;
    let container = |c: &Container| Container {
        name: c.name.clone(),
        args: c.args.clone(),
        env: c.env.as_ref().map(|env| {
            env.iter()
                .map(|e| EnvVar {
                    name: e.name.clone(),
                    value: e.value.clone(),
                    value_from: None,
                })
                .collect()
        }),
        security_context: c.security_context.as_ref().map(|sc| SecurityContext {
            run_as_user: sc.run_as_user,
            run_as_group: sc.run_as_group,
            ..Default::default()
        }),
        ..Default::default()
    };
    Pod {
        metadata: ObjectMeta {
            name: m.name.clone(),
            namespace: m.namespace.clone(),
            uid: m.uid.clone(),
            resource_version: m.resource_version.clone(),
            labels: m.labels.clone(),
            annotations: m.annotations.clone(),
            ..Default::default()
        },
        spec: pod.spec.as_ref().map(|s| PodSpec {
            host_network: s.host_network,
            node_name: s.node_name.clone(),
            init_containers: s
                .init_containers
                .as_ref()
                .map(|cs| cs.iter().map(container).collect()),
            containers: s.containers.iter().map(container).collect(),
            ..Default::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests;
