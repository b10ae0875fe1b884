//! Pod facts: the plugin asks install-cni's node pod store for the pod it is setting up instead of
//! GETting it from the API server. One typed request and one typed answer, each a single JSON
//! line over a root-only Unix socket in the run dir (`podfacts/pod.sock`); this module holds both
//! (the plugin encodes the request and decodes the answer, install-cni the other way round).
//! When a stored pod may be answered is the stores' rule (`kube::lookup`); the answering is the
//! socket's (`install::pod_facts`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

/// The longest request line accepted (a namespace, a name and a uid fit many times over).
pub const MAX_REQUEST_BYTES: usize = 4096;

/// File name of the socket (also its readiness component).
pub const SOCKET_NAME: &str = "pod.sock";

/// `<run dir>/podfacts/pod.sock`; the directory is 0700 and the socket 0600, both root's.
pub fn socket_path(run_dir: &Path) -> PathBuf {
    run_dir.join("podfacts").join(SOCKET_NAME)
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
    /// The pod as the store holds it, trimmed by [`super::pod::trim_for_plugin`]; the namespace's labels
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

/// A request line that is not a pod-facts request, naming what is wrong (the names in it are
/// checked by the answering side, which owns what a name may be).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("request longer than {MAX_REQUEST_BYTES} bytes")]
    TooLong,
    #[error("request is not a pod-facts request: {0}")]
    Malformed(String),
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
}

#[cfg(test)]
mod tests;
