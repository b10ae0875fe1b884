//! The ZDS server: hands enrolled pods' network namespaces to ztunnel over a Unix SOCK_SEQPACKET
//! socket (one protobuf message per datagram, the netns fd in SCM_RIGHTS; docs/zds.md).
//!
//! Owns: the protocol messages (`proto`, generated from `zds.proto` and committed), the socket
//! (`socket`: bind with tight permissions, accept, send with one fd, receive with truncation
//! detection), the per-connection session (`conn`: hello, snapshot, lock-step updates, liveness),
//! the connection set and the public handle (`server`), the NACK backoff (`backoff`) and what was
//! last sent about each pod and its answer (`ledger`, for the agent's debug endpoint); what the
//! connections and the handle share sits below both (`shared`), so no file imports in a circle.
//! It knows nothing of Kubernetes: the agent feeds it pods through [`SnapshotSource`] and
//! [`ZdsHandle`]. May call: `netns` (the handle whose fd is sent), `retry` (the NACK hold's
//! spacing) and `telemetry` (metrics).

mod backoff;
mod conn;
pub mod ledger;
pub mod proto;
mod server;
mod shared;
mod socket;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::netns::Netns;
use crate::telemetry::metrics::Metrics;

pub use server::{ZdsHandle, serve};
pub use socket::NotANetns;

/// What ztunnel needs to find a pod's workload: `metadata.name`, `metadata.namespace`,
/// `spec.serviceAccountName`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodWorkload {
    pub name: String,
    pub namespace: String,
    pub service_account: String,
}

/// One enrolled pod in a snapshot. With a netns it is sent as an Add carrying the fd; without one
/// (the agent knows the pod but could not find its netns) as a Keep, so ztunnel spares its proxy.
#[derive(Debug, Clone)]
pub struct SnapshotEntry {
    pub uid: String,
    pub info: PodWorkload,
    pub netns: Option<Arc<Netns>>,
}

/// The agent's enrolled-pod state, read once per connection to build its snapshot. It must list
/// every enrolled pod: ztunnel drops every proxy the snapshot does not mention.
pub trait SnapshotSource: Send + Sync + 'static {
    fn snapshot(&self) -> Vec<SnapshotEntry>;
}

/// Server settings; `Default` is Istio's behaviour with this project's fixes (docs/zds.md).
#[derive(Clone)]
pub struct ZdsConfig {
    /// `ZTUNNEL_UDS_ADDRESS`.
    pub socket: PathBuf,
    /// How long ztunnel has to send its hello after the accept.
    pub hello_timeout: Duration,
    /// Deadline for each send and for the ack that answers it; past it the connection is closed.
    pub ack_timeout: Duration,
    /// How long [`ZdsHandle::add_workload`] / [`ZdsHandle::del_workload`] wait in all (queued
    /// behind a snapshot, then sent and acked).
    pub update_timeout: Duration,
    /// Minimum spacing of accepts (Istio: 5 per second, burst 1).
    pub accept_interval: Duration,
    /// Receive buffer for acks; longer datagrams are NACKs with the text cut off.
    pub recv_buffer: usize,
    /// Updates a connection queues while its snapshot is going out.
    pub queue_depth: usize,
    /// After a NACKed Add the pod is held back (snapshots send Keep, adds are refused) for this
    /// long, doubling per further NACK up to `nack_backoff_max`, jittered.
    pub nack_backoff_first: Duration,
    pub nack_backoff_max: Duration,
    /// Where `ztunnel_connected` lives.
    pub metrics: Metrics,
}

impl Default for ZdsConfig {
    fn default() -> Self {
        ZdsConfig {
            socket: PathBuf::from("/var/run/ztunnel/ztunnel.sock"),
            hello_timeout: Duration::from_secs(5),
            ack_timeout: Duration::from_secs(5),
            update_timeout: Duration::from_secs(30),
            accept_interval: Duration::from_millis(200),
            recv_buffer: 64 * 1024,
            queue_depth: 100,
            nack_backoff_first: Duration::from_secs(5),
            nack_backoff_max: Duration::from_secs(300),
            metrics: Metrics::default(),
        }
    }
}

/// Why a ZDS operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ZdsError {
    #[error(
        "ztunnel is not connected (no ztunnel connection on the ZDS socket; retry once it is up)"
    )]
    NoConnection,
    /// An add before the agent bound its ZDS server (it starts serving once the startup snapshot
    /// is in the pod cache).
    #[error("ztunnel is not connected (no ztunnel connection: the ZDS server is not running yet)")]
    NotRunning,
    #[error("ztunnel rejected pod {uid}: {message}")]
    Nack { uid: String, message: String },
    #[error("pod {uid} is held back for {retry_in:?} after ztunnel rejected it: {message}")]
    Backoff {
        uid: String,
        retry_in: Duration,
        message: String,
    },
    #[error("ztunnel connection {conn} did not ack {what} within {after:?}; connection closed")]
    AckTimeout {
        conn: u64,
        what: String,
        after: Duration,
    },
    #[error("{what} for pod {uid} was not done within {after:?}")]
    UpdateTimeout {
        uid: String,
        what: &'static str,
        after: Duration,
    },
    #[error("ztunnel connection {conn} closed before {what} was acked")]
    ConnectionClosed { conn: u64, what: String },
    #[error("ztunnel connection {conn}: {what}: {source}")]
    Transport {
        conn: u64,
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("ztunnel connection {conn}: protocol error: {what}")]
    Protocol { conn: u64, what: String },
    #[error("pod {uid}: {path} is not a network namespace ({reason}); not sent to ztunnel")]
    NotANetns {
        uid: String,
        path: PathBuf,
        #[source]
        reason: NotANetns,
    },
    #[error("cannot listen on ZDS socket {path}: {source}")]
    Bind {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}
