//! HTTP/1.1 over a Unix socket: the plugin's calls to the node agent (`log.sock` for log
//! records, `pluginevent.sock` for ambient pod events: `/podadd`, or Istio's `/cmdadd`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

/// Why a request to the agent failed.
#[derive(Debug, thiserror::Error)]
pub enum UdsError {
    #[error("cannot connect to {path}: {source}")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("HTTP exchange with {path} failed: {reason}")]
    Http { path: PathBuf, reason: String },
    #[error("no answer from {path} within {timeout:?}")]
    Timeout { path: PathBuf, timeout: Duration },
}

/// An open HTTP/1.1 connection to a socket (kept alive for several requests).
pub struct Connection {
    path: PathBuf,
    sender: SendRequest<Full<Bytes>>,
}

impl Connection {
    /// Connects and starts the connection driver on the current tokio runtime.
    pub async fn open(path: &Path) -> Result<Connection, UdsError> {
        let stream = tokio::net::UnixStream::connect(path)
            .await
            .map_err(|source| UdsError::Connect {
                path: path.to_path_buf(),
                source,
            })?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| UdsError::Http {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })?;
        tokio::spawn(async move {
            // Ends when the peer closes or the sender is dropped; errors are not actionable.
            let _ = conn.await;
        });
        Ok(Connection {
            path: path.to_path_buf(),
            sender,
        })
    }

    /// POSTs a JSON body; returns the status code and (at most 1 MiB of) the response body.
    pub async fn post_json(
        &mut self,
        uri_path: &str,
        body: Vec<u8>,
    ) -> Result<(u16, String), UdsError> {
        let http_err = |reason: String| UdsError::Http {
            path: self.path.clone(),
            reason,
        };
        self.sender
            .ready()
            .await
            .map_err(|e| http_err(e.to_string()))?;
        let request = hyper::Request::post(format!("http://unix{uri_path}"))
            .header("Host", "unix")
            .header("Content-Type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| http_err(e.to_string()))?;
        let response = self
            .sender
            .send_request(request)
            .await
            .map_err(|e| http_err(e.to_string()))?;
        let status = response.status().as_u16();
        let body = http_body_util::Limited::new(response.into_body(), 1 << 20)
            .collect()
            .await
            .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
            .unwrap_or_default();
        Ok((status, body))
    }
}

/// One request on a fresh connection, bounded by `timeout` as a whole.
pub async fn post_once(
    path: &Path,
    uri_path: &str,
    body: Vec<u8>,
    timeout: Duration,
) -> Result<(u16, String), UdsError> {
    let exchange = async {
        let mut conn = Connection::open(path).await?;
        conn.post_json(uri_path, body).await
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| UdsError::Timeout {
            path: path.to_path_buf(),
            timeout,
        })?
}

/// Writes one POST on a fresh connection and closes it without reading the answer (the plugin's
/// last log batch: the agent serves a request followed by end-of-file, see `telemetry::serve`).
/// A stream socket keeps what was written for the agent after this end is closed.
pub async fn post_unanswered(path: &Path, uri_path: &str, body: &[u8]) -> Result<(), UdsError> {
    use tokio::io::AsyncWriteExt;
    let mut stream = tokio::net::UnixStream::connect(path)
        .await
        .map_err(|source| UdsError::Connect {
            path: path.to_path_buf(),
            source,
        })?;
    let mut request = format!(
        "POST {uri_path} HTTP/1.1\r\nHost: unix\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    let written = stream.write_all(&request).await;
    written.map_err(|e| UdsError::Http {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}
