//! The plugin-event server (§3.3): HTTP over `<run_dir>/pluginevent.sock`, `/cmdadd` (any
//! method). 200 only once the pod is fully enrolled (rules in, ztunnel acked, annotation
//! written); a body that does not decode gets 400 naming the field and changes nothing; a pod
//! the store does not have (after the stale-cache retries) or that is not eligible gets 500, as
//! does a failed enrolment. The plugin's client gives up after its own deadline; the handler
//! runs to completion regardless, so a pod is never left half-enrolled by a dropped request.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::any;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::pod;
use super::worker::Core;
use crate::kube::plugin_event::PluginAddEvent;
use crate::kube::stores::{self, pod_key};
use crate::telemetry::metrics::ResponseCodeLabel;

/// Largest body accepted (an event is a few hundred bytes).
const MAX_BODY: usize = 64 * 1024;

/// Binds the socket (stale file replaced, parent created 0750, socket 0666) and serves until
/// `shutdown`; the socket file is removed when it stops. Returns the serving task.
pub async fn serve(
    path: PathBuf,
    core: Arc<Core>,
    shutdown: CancellationToken,
) -> io::Result<tokio::task::JoinHandle<()>> {
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
    // The plugin runs as the kubelet's user.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
    let app = Router::new()
        .route("/cmdadd", any(cmd_add))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        .with_state(core);
    info!(path = %path.display(), "plugin-event server listening");
    Ok(tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
        if let Err(e) = served {
            warn!("plugin-event server failed: {e}");
        }
        let _ = std::fs::remove_file(&path);
    }))
}

async fn cmd_add(State(core): State<Arc<Core>>, body: Bytes) -> (StatusCode, String) {
    let (status, text) = handle(core.clone(), body).await;
    core.metrics
        .plugin_requests
        .get_or_create(&ResponseCodeLabel {
            response_code: status.as_u16().to_string(),
        })
        .inc();
    (status, text)
}

async fn handle(core: Arc<Core>, body: Bytes) -> (StatusCode, String) {
    let event = match PluginAddEvent::decode(&body) {
        Ok(ev) => ev,
        Err(e) => {
            warn!("{e}");
            return (StatusCode::BAD_REQUEST, e.to_string());
        }
    };
    // Run to the end even if the plugin hangs up: a half-done add would otherwise be left.
    let task = tokio::spawn(async move { enrol(&core, &event).await });
    match task.await {
        Ok(Ok(())) => (StatusCode::OK, String::new()),
        Ok(Err(message)) => {
            warn!("/cmdadd: {message}");
            (StatusCode::INTERNAL_SERVER_ERROR, message)
        }
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the add task failed: {e}"),
        ),
    }
}

async fn enrol(core: &Core, event: &PluginAddEvent) -> Result<(), String> {
    let key = pod_key(&event.pod_namespace, &event.pod_name);
    let mut found = core.pods.get(&key);
    // The plugin may be faster than our watch (stale cache).
    for _ in 0..core.timing.stale_cache_attempts {
        if found.is_some() {
            break;
        }
        tokio::time::sleep(core.timing.stale_cache_interval).await;
        found = core.pods.get(&key);
    }
    let Some(p) = found else {
        return Err(format!(
            "failed to get pod {key}: not in the agent's pod store"
        ));
    };
    let Some(ns_labels) = stores::namespace_labels(&core.namespaces, &event.pod_namespace) else {
        return Err(format!(
            "failed to get namespace {}: not in the agent's namespace store",
            event.pod_namespace
        ));
    };
    if !core.policy.matches(&p, &ns_labels) {
        return Err(format!(
            "pod {key} unexpectedly not eligible for ambient enrollment"
        ));
    }
    let mut ips = event.pod_ips();
    if ips.is_empty() {
        ips = pod::ips(&p);
    }
    core.mesh
        .add_pod(&p, &ips, Some(&event.netns))
        .await
        .map_err(|e| e.to_string())
}
