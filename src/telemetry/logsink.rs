//! The plugin log sink (§2.13): HTTP over a Unix socket at `<run_dir>/log.sock`. The plugin POSTs
//! a JSON array of strings to `/log`, each string one JSON log record; every record is re-emitted
//! under the `cni-plugin` scope with its own level, time and extra keys. A batch is emitted under
//! one lock, so lines of two plugin processes never interleave. The `cni-plugin` scope keeps its
//! own level (Istio bug B16 forced it to the agent's).

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use axum::Router;
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::routing::any;
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;
use tracing::Level;

use super::logging::PLUGIN_TARGET;

static EMIT: Mutex<()> = Mutex::new(());

/// Starts the sink; a stale socket (from a previous run) is replaced.
pub async fn serve(path: PathBuf, stop: CancellationToken) -> io::Result<()> {
    if let Some(parent) = path.parent()
        && !parent.exists()
    {
        std::fs::create_dir_all(parent)?;
        std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o750))?;
    }
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = tokio::net::UnixListener::bind(&path)?;
    // Plugins run as the kubelet's user; anyone on the node may log.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
    let app: Router<()> = Router::new().route("/log", any(handle));
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

async fn handle(body: Bytes) -> StatusCode {
    // Always 200, as Istio: a plugin must never fail because its logs could not be shipped.
    if let Ok(lines) = serde_json::from_slice::<Vec<String>>(&body) {
        emit_batch(&lines);
    }
    StatusCode::OK
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
