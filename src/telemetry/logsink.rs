//! The plugin log sink: HTTP over a Unix socket at `<run_dir>/log.sock`. The plugin POSTs
//! a JSON array of strings to `/log`, each string one JSON log record (the wire: `wire::log`); every record is re-emitted
//! under the `cni-plugin` scope with its own level, time and extra keys. A batch is emitted under
//! one lock, so lines of two plugin processes never interleave. The `cni-plugin` scope keeps its
//! own level (Istio bug B16 forced it to the agent's). Control characters in forwarded records are
//! escaped by the log formatter, so a record cannot forge lines or send terminal escapes. A body
//! over [`MAX_BATCH_BYTES`] is refused with 413 and a warning naming its size; every other body,
//! valid or not, gets 200 (a plugin must never fail over logging).
//!
//! Root only (the one binder and server: `telemetry::socket`, `telemetry::serve`), so no local
//! user can forge `cni-plugin` records; each connection may have at most
//! [`RECORD_BYTES_PER_SEC`] of records re-emitted (after a [`RECORD_BURST_BYTES`] burst), the
//! rest are dropped with one warning per connection naming the peer's pid and uid.

use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode, header};
use axum::routing::any;
use axum::{Extension, Router};
use serde_json::Value;
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;
use tracing::Level;

use super::logging::PLUGIN_TARGET;
use super::readiness::Readiness;
use super::serve::{self, ConnInfo, Limits, UnixServer};
use super::socket::{SocketError, SocketFile};
use crate::wire::log::{MAX_BATCH_BYTES, Record, SOCKET_NAME};

static EMIT: Mutex<()> = Mutex::new(());

/// Sustained bytes of records per second one connection may have re-emitted ...
pub const RECORD_BYTES_PER_SEC: u64 = 64 * 1024;
/// ... and what it may send at once beyond that (a plugin run logs a few KiB).
pub const RECORD_BURST_BYTES: u64 = 256 * 1024;

/// Binds `<run_dir>/log.sock` with the one binder (root only, 0600; see `telemetry::socket`).
/// An error names the path; nothing that is not a stale socket is removed.
pub fn bind(path: &Path) -> Result<(UnixListener, SocketFile), SocketError> {
    serve::bind_unix(path)
}

/// Serves the sink on a bound socket until `stop` (supervised: see `telemetry::serve`); the
/// socket file is removed on the way out if it is still ours.
pub async fn serve(
    bound: (UnixListener, SocketFile),
    readiness: Readiness,
    idle_timeout: Duration,
    stop: CancellationToken,
) {
    let mut limits = Limits::new(serve::MAX_LOG_SINK_CONNECTIONS, idle_timeout);
    limits.bytes_per_sec = Some((RECORD_BYTES_PER_SEC, RECORD_BURST_BYTES));
    let app: Router<()> = Router::new()
        .route(crate::wire::log::PATH, any(handle))
        .layer(DefaultBodyLimit::max(MAX_BATCH_BYTES));
    let server = UnixServer {
        name: SOCKET_NAME.to_string(),
        limits,
        readiness: Some(readiness),
    };
    server.run(bound, serve::http(app, limits), stop).await;
}

async fn handle(
    conn: Option<Extension<ConnInfo>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> (StatusCode, String) {
    match body {
        Ok(body) => {
            // 200 for anything readable, as Istio: unparsable batches are dropped.
            if let Some(lines) = crate::wire::log::decode_batch(&body) {
                let kept = within_budget(conn.as_ref().map(|c| &c.0), lines);
                emit_batch(&kept);
            }
            (StatusCode::OK, String::new())
        }
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            let size = headers
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .map_or_else(|| "unknown".to_string(), |v| format!("{v} bytes"));
            tracing::warn!(
                size = %size,
                limit_bytes = MAX_BATCH_BYTES,
                "plugin log batch refused: larger than the log sink accepts; its records are lost"
            );
            (
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("log batch larger than {MAX_BATCH_BYTES} bytes\n"),
            )
        }
        Err(rejection) => (rejection.status(), rejection.body_text()),
    }
}

/// The records of a batch the connection's byte budget allows; the rest are dropped, with one
/// warning per connection naming the peer.
fn within_budget(conn: Option<&ConnInfo>, lines: Vec<String>) -> Vec<String> {
    let Some((info, budget)) = conn.and_then(|c| Some((c, c.budget.as_ref()?))) else {
        return lines;
    };
    let mut budget = budget.lock();
    let now = Instant::now();
    let total = lines.len();
    let kept: Vec<String> = lines
        .into_iter()
        .filter(|l| budget.take(l.len(), now))
        .collect();
    if kept.len() < total && !budget.warned {
        budget.warned = true;
        let peer = info
            .peer
            .map_or_else(|| "unknown peer".to_string(), |p| p.to_string());
        tracing::warn!(
            peer = %peer,
            limit_bytes_per_sec = RECORD_BYTES_PER_SEC,
            burst_bytes = RECORD_BURST_BYTES,
            "plugin log records dropped: this connection sends more than the log sink re-emits; \
             further drops on it are not reported"
        );
    }
    kept
}

/// Re-emits one batch of plugin records.
pub fn emit_batch(lines: &[String]) {
    let _guard = EMIT.lock();
    for line in lines {
        emit(line);
    }
}

fn emit(line: &str) {
    let Some(Record {
        level,
        time,
        msg,
        fields,
    }) = Record::parse(line)
    else {
        return;
    };
    let fields = serde_json::to_string(&Value::Object(fields)).unwrap_or_default();
    let level = match level.as_str() {
        "debug" => Level::DEBUG,
        "info" => Level::INFO,
        "warn" | "warning" => Level::WARN,
        "error" => Level::ERROR,
        _ => return,
    };
    // Each level needs its own call site (tracing levels are static).
    if level == Level::DEBUG {
        tracing::event!(target: PLUGIN_TARGET, Level::DEBUG, orig_time = %time, orig_fields = %fields, "{msg}");
    } else if level == Level::INFO {
        tracing::event!(target: PLUGIN_TARGET, Level::INFO, orig_time = %time, orig_fields = %fields, "{msg}");
    } else if level == Level::WARN {
        tracing::event!(target: PLUGIN_TARGET, Level::WARN, orig_time = %time, orig_fields = %fields, "{msg}");
    } else {
        tracing::event!(target: PLUGIN_TARGET, Level::ERROR, orig_time = %time, orig_fields = %fields, "{msg}");
    }
}

/// Path of the sink socket in a run dir.
pub fn socket_path(run_dir: &Path) -> PathBuf {
    run_dir.join(SOCKET_NAME)
}
