//! The pod-facts socket: install-cni answers the plugin's "what is pod ns/name?" from the node
//! pod store, so a sidecar ADD needs no API round trip. The request, the answer and
//! when a pod may be answered are `wire::pod_facts`'s; this is the socket around it.
//!
//! Root only: the directory is 0700 and the socket 0600 (the plugin runs as root, as the
//! kubelet does), and every connection's peer credentials (SO_PEERCRED) must say uid 0 (the one
//! binder and server: `telemetry::socket`, `telemetry::serve`). One
//! request line per connection, one answer line, then the connection closes; a malformed request
//! gets an error answer and changes nothing (the stores are only read).

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use crate::kube::InvalidName;
use crate::kube::lookup::{self, Query};
use crate::kube::names;
use crate::kube::stores::{NamespaceStore, PodStore};
use crate::telemetry::serve::{self, Access, Limits, Serving, UnixHandler, UnixServer};
use crate::telemetry::socket::{SocketError, SocketFile};
use crate::wire::pod::trim_for_plugin;
use crate::wire::pod_facts::{
    MAX_REQUEST_BYTES, PodFactsAnswer, PodFactsRequest, RequestError, SOCKET_NAME,
};

/// A client gets this long to send its request line.
const READ_TIMEOUT: Duration = Duration::from_secs(1);
/// After answering, unread input is drained for at most this long and this much.
const LINGER: Duration = Duration::from_millis(100);
const LINGER_BYTES: u64 = 64 * 1024;

/// The socket could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("cannot serve pod facts: {0}")]
pub struct PodFactsError(#[from] pub SocketError);

/// Binds `path` with the one binder (`telemetry::socket`: directory 0700 or tightened, only a
/// stale socket replaced, the socket 0600).
pub fn bind(path: &Path) -> Result<(UnixListener, SocketFile), PodFactsError> {
    Ok(serve::bind_unix(path)?)
}

/// Binds and serves until `stop` (supervised, root-only peers, bounded connections:
/// `telemetry::serve`); the socket is removed on the way out if it is still ours.
pub fn start(
    path: &Path,
    pods: PodStore,
    namespaces: Option<NamespaceStore>,
    serving: &Serving,
    stop: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, PodFactsError> {
    let bound = bind(path)?;
    info!(socket = %path.display(), "serving pod facts to the plugin");
    let handler: UnixHandler = Arc::new(move |stream, access, _slot| {
        let (pods, namespaces) = (pods.clone(), namespaces.clone());
        Box::pin(async move {
            if let Err(e) = answer_connection(stream, access, &pods, namespaces.as_ref()).await {
                debug!("pod facts connection: {e}");
            }
        })
    });
    let server = UnixServer {
        name: SOCKET_NAME.to_string(),
        limits: Limits::new(serve::MAX_POD_FACTS_CONNECTIONS, serving.idle_timeout),
        readiness: Some(serving.readiness.clone()),
    };
    Ok(tokio::spawn(server.run(bound, handler, stop)))
}

async fn answer_connection(
    mut stream: UnixStream,
    access: Access,
    pods: &PodStore,
    namespaces: Option<&NamespaceStore>,
) -> io::Result<()> {
    // The request is read before the peer is judged, also from a refused peer: closing with
    // its bytes unread would reset the connection, and it would never see why it was refused.
    let mut line = Vec::with_capacity(256);
    // One byte past the limit tells "too long" from "exactly at the limit".
    let mut reader = BufReader::new((&mut stream).take(MAX_REQUEST_BYTES as u64 + 1));
    let read = tokio::time::timeout(READ_TIMEOUT, reader.read_until(b'\n', &mut line)).await;
    let answer = match (access, read) {
        // The server logged the refusal (throttled).
        (Access::Refused(message), _) => PodFactsAnswer::Error { message },
        (Access::Root(_), Ok(Ok(_))) => answer_line(&line, pods, namespaces),
        (Access::Root(_), Ok(Err(e))) => return Err(e),
        (Access::Root(_), Err(_)) => PodFactsAnswer::Error {
            message: format!("no request line within {READ_TIMEOUT:?}"),
        },
    };
    stream.write_all(&answer.encode()).await?;
    stream.shutdown().await?;
    // Whatever the client sent past what was read (an oversized request) is drained briefly, so
    // closing does not reset the connection before the client has read its answer.
    let mut rest = (&mut stream).take(LINGER_BYTES);
    let _ = tokio::time::timeout(LINGER, tokio::io::copy(&mut rest, &mut tokio::io::sink())).await;
    Ok(())
}

/// Why a request line got an error answer: not a request, or it names no pod.
#[derive(Debug, thiserror::Error)]
enum Unanswerable {
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error("request names no pod: {0}")]
    InvalidName(#[from] InvalidName),
}

/// Answers one request line from the stores (pure apart from reading them): the stored pod
/// trimmed to what the plugin reads when `kube::lookup` allows it, else why not yet; a line that
/// is not a request, or names no valid pod, gets an error answer and nothing is looked up.
pub fn answer_line(
    line: &[u8],
    pods: &PodStore,
    namespaces: Option<&NamespaceStore>,
) -> PodFactsAnswer {
    let checked = PodFactsRequest::decode(line)
        .map_err(Unanswerable::from)
        .and_then(|request| {
            names::check_namespace(&request.namespace)?;
            names::check_pod_name(&request.name)?;
            Ok(request)
        });
    let request = match checked {
        Ok(request) => request,
        Err(e) => {
            return PodFactsAnswer::Error {
                message: e.to_string(),
            };
        }
    };
    let query = Query {
        namespace: &request.namespace,
        name: &request.name,
        uid: &request.uid,
        namespace_labels: request.namespace_labels,
    };
    match lookup::stored_pod(&query, pods, namespaces) {
        Ok((pod, namespace_labels)) => PodFactsAnswer::Pod {
            pod: Box::new(trim_for_plugin(&pod)),
            namespace_labels,
        },
        Err(reason) => PodFactsAnswer::NotYet {
            reason: reason.to_string(),
        },
    }
}

#[cfg(test)]
mod tests;
