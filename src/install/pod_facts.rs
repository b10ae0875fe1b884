//! The pod-facts socket: install-cni answers the plugin's "what is pod ns/name?" from the node
//! pod store, so a sidecar ADD needs no API round trip (issue 14). The request, the answer and
//! when a pod may be answered are `kube::pod_facts`'s; this is the socket around it.
//!
//! Root only: the directory is 0700 and the socket 0600 (the plugin runs as root, as the
//! kubelet does), and every connection's peer credentials (SO_PEERCRED) must say uid 0. One
//! request line per connection, one answer line, then the connection closes; a malformed request
//! gets an error answer and changes nothing (the stores are only read).

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::kube::pod_facts::{MAX_REQUEST_BYTES, PodFactsAnswer, answer_line};
use crate::kube::stores::{NamespaceStore, PodStore};
use crate::telemetry::peer::PeerCred;

/// A client gets this long to send its request line.
const READ_TIMEOUT: Duration = Duration::from_secs(1);
/// After answering, unread input is drained for at most this long and this much.
const LINGER: Duration = Duration::from_millis(100);
const LINGER_BYTES: u64 = 64 * 1024;

/// The socket could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("cannot serve pod facts on {path}: {source}")]
pub struct PodFactsError {
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

/// Binds `path`: its directory created (or tightened) to 0700, a stale socket replaced, the
/// socket 0600.
pub fn bind(path: &Path) -> Result<UnixListener, PodFactsError> {
    let fail = |source| PodFactsError {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(fail)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(fail)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(fail(e)),
    }
    let listener = UnixListener::bind(path).map_err(fail)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(fail)?;
    Ok(listener)
}

/// Binds and serves until `stop`; the socket is removed on the way out.
pub fn start(
    path: &Path,
    pods: PodStore,
    namespaces: Option<NamespaceStore>,
    stop: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, PodFactsError> {
    let listener = bind(path)?;
    info!(socket = %path.display(), "serving pod facts to the plugin");
    let path = path.to_path_buf();
    Ok(tokio::spawn(async move {
        serve(listener, pods, namespaces, stop).await;
        let _ = std::fs::remove_file(&path);
    }))
}

/// Accepts connections until `stop`, each answered on its own task.
pub async fn serve(
    listener: UnixListener,
    pods: PodStore,
    namespaces: Option<NamespaceStore>,
    stop: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, _)) => {
                let (pods, namespaces) = (pods.clone(), namespaces.clone());
                tokio::spawn(async move {
                    if let Err(e) = answer_connection(stream, &pods, namespaces.as_ref()).await {
                        debug!("pod facts connection: {e}");
                    }
                });
            }
            Err(e) => {
                warn!("pod facts accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// Only root may ask (the answer carries any pod of the node).
fn peer_is_root(stream: &UnixStream) -> Result<(), String> {
    crate::telemetry::peer::Peer(PeerCred::of(stream).map_err(|e| e.to_string()))
        .require_root()
        .map(|_| ())
}

async fn answer_connection(
    mut stream: UnixStream,
    pods: &PodStore,
    namespaces: Option<&NamespaceStore>,
) -> io::Result<()> {
    // The request is read before the peer is judged, also from a refused peer: closing with
    // its bytes unread would reset the connection, and it would never see why it was refused.
    let mut line = Vec::with_capacity(256);
    // One byte past the limit tells "too long" from "exactly at the limit".
    let mut reader = BufReader::new((&mut stream).take(MAX_REQUEST_BYTES as u64 + 1));
    let read = tokio::time::timeout(READ_TIMEOUT, reader.read_until(b'\n', &mut line)).await;
    let answer = match (peer_is_root(&stream), read) {
        (Err(message), _) => {
            warn!("pod facts: {message}");
            PodFactsAnswer::Error { message }
        }
        (Ok(()), Ok(Ok(_))) => answer_line(&line, pods, namespaces),
        (Ok(()), Ok(Err(e))) => return Err(e),
        (Ok(()), Err(_)) => PodFactsAnswer::Error {
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

#[cfg(test)]
mod tests;
