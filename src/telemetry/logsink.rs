//! The plugin log sink (§2.13): HTTP over a Unix socket at `<run_dir>/log.sock`. The plugin POSTs
//! a JSON array of strings to `/log`, each string one JSON log record; every record is re-emitted
//! under the `cni-plugin` scope with its own level, time and extra keys. A batch is emitted under
//! one lock, so lines of two plugin processes never interleave. The `cni-plugin` scope keeps its
//! own level (Istio bug B16 forced it to the agent's). Control characters in forwarded records are
//! escaped by the log formatter, so a record cannot forge lines or send terminal escapes. A body
//! over [`MAX_BATCH_BYTES`] is refused with 413 and a warning naming its size; every other body,
//! valid or not, gets 200 (a plugin must never fail over logging).

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use axum::Router;
use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode, header};
use axum::routing::any;
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;
use tracing::Level;

use super::logging::PLUGIN_TARGET;

/// Largest `/log` body accepted (the plugin splits its batches below this).
pub const MAX_BATCH_BYTES: usize = 2 * 1024 * 1024;

static EMIT: Mutex<()> = Mutex::new(());

/// Binds a socket the plugin calls in the agent's run dir (`log.sock`, `pluginevent.sock`):
/// parent created 0750 when missing, a stale socket from a previous run replaced, the socket
/// 0666 because plugins run as the kubelet's user.
pub fn bind_plugin_socket(path: &std::path::Path) -> io::Result<tokio::net::UnixListener> {
    if let Some(parent) = path.parent()
        && !parent.exists()
    {
        std::fs::create_dir_all(parent)?;
        std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o750))?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = tokio::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    Ok(listener)
}

/// Starts the sink; a stale socket (from a previous run) is replaced.
pub async fn serve(path: PathBuf, stop: CancellationToken) -> io::Result<()> {
    let listener = bind_plugin_socket(&path)?;
    let app: Router<()> = Router::new()
        .route("/log", any(handle))
        .layer(DefaultBodyLimit::max(MAX_BATCH_BYTES));
    tokio::spawn(async move {
        let res = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
        if let Err(e) = res {
            tracing::error!("plugin log sink failed: {e}");
        }
        let _ = std::fs::remove_file(&path);
    });
    Ok(())
}

async fn handle(headers: HeaderMap, body: Result<Bytes, BytesRejection>) -> (StatusCode, String) {
    match body {
        Ok(body) => {
            // 200 for anything readable, as Istio: unparsable batches are dropped.
            if let Ok(lines) = serde_json::from_slice::<Vec<String>>(&body) {
                emit_batch(&lines);
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

/// Re-emits one batch of plugin records.
pub fn emit_batch(lines: &[String]) {
    let _guard = EMIT.lock().unwrap_or_else(|p| p.into_inner());
    for line in lines {
        emit(line);
    }
}

fn emit(line: &str) {
    let Ok(Value::Object(mut rec)) = serde_json::from_str::<Value>(line) else {
        return;
    };
    let text = |v: Option<Value>| match v {
        Some(Value::String(s)) => s,
        Some(other) => other.to_string(),
        None => String::new(),
    };
    let level = text(rec.remove("level"));
    let time = text(rec.remove("time"));
    let msg = text(rec.remove("msg"));
    rec.remove("scope");
    let fields = serde_json::to_string(&Value::Object(
        std::mem::take(&mut rec) as Map<String, Value>
    ))
    .unwrap_or_default();
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
    run_dir.join("log.sock")
}
