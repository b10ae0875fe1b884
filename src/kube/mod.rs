//! The one Kubernetes client module shared by every role.
//!
//! Owns: building a `kube::Client` (kubeconfig file, $KUBECONFIG, in-cluster; rustls with ring
//! only; gzip on every response, watch streams included: `gzip`; a watch's initial state streamed
//! over it, or listed where the server cannot: `initial_list`; pod watches in Kubernetes' protobuf
//! encoding, decoded to what the pod store keeps and handed to kube as JSON lines: `protobuf`),
//! the typed calls the roles make (get/list/watch pods and namespaces, metadata patches on pods
//! and `pods/status`, pod delete, pod events), each under an explicit deadline and with errors
//! that name the call, the object and the cause; names checked before they become request paths
//! ([`names`]); label selectors, one model for every role ([`selector`]); which failures are worth
//! retrying, and how ([`retry`]); ambient enablement selectors ([`selector::enablement`]); when a
//! stored pod may be answered for instead of the API server being asked ([`lookup`], for the
//! plugin's pod-facts and `/podadd` askers, whose wire is `wire`'s); the node agent's node-scoped
//! pod store (keeping only what its readers read) and namespace store with change subscriptions
//! ([`stores`]). The test API server is not here: it is test-only and lives in the
//! `istio-cni-testing` crate (`testing/`).
//!
//! May call: `retry` (the one retry policy and loop, re-exported as [`retry`]).

mod client;
mod cluster;
mod config;
mod error;
mod gzip;
mod initial_list;
pub mod lookup;
pub mod names;
mod protobuf;
pub mod selector;
pub mod stores;

pub use crate::retry::RetryPolicy;
pub use client::{
    EventRecord, EventType, KubeClient, MetadataPatch, PodPatchVia, PodPreconditions, Selectors,
    WatchBackoff, WatchStream, pod_preconditions,
};
pub use config::{ConfigSource, config_from_kubeconfig_file, load_config_with};
pub use error::{ApiRefusal, Call, KubeError, TlsDetail};
pub use names::InvalidName;
#[cfg(feature = "test-hooks")]
pub use protobuf::observed::{PodWatchEncodings, pod_watch_encodings};

/// Watch events and errors, re-exported so callers need no direct kube-runtime import.
pub use kube::runtime::watcher::{Error as WatchError, Event as WatchEvent};
