//! The plugin-event server (§3.3): HTTP over `<run_dir>/pluginevent.sock`, `/cmdadd` (any
//! method). 200 only once the pod is fully enrolled (rules in, ztunnel acked, annotation
//! written); a body that does not decode gets 400 naming the field and changes nothing; a pod
//! the store does not have (after the stale-cache retries) or that is not eligible gets 500, as
//! does a failed enrolment. An enrolment not done within `Timing::plugin_answer_budget` (below
//! the plugin's own timeout) is answered 504 with the reason; the handler runs to completion
//! regardless, so a pod is never left half-enrolled by a dropped request.

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
use super::settings::PLUGIN_EVENT_SOCKET;
use super::worker::Core;
use crate::kube::plugin_event::PluginAddEvent;
use crate::kube::stores::{self, pod_key};
use crate::telemetry::metrics::ResponseCodeLabel;
use crate::telemetry::serve::{self, Limits, Serving, UnixServer};
use crate::telemetry::socket::SocketError;

/// Largest body accepted (an event is a few hundred bytes).
const MAX_BODY: usize = 64 * 1024;

/// Binds the socket with the one binder (root only, 0600, only a stale socket replaced) and
/// serves it until `shutdown` with the listeners' bounds, supervised (`telemetry::serve`); the
/// socket file is removed when it stops, if it is still ours. Returns the serving task.
pub async fn serve(
    path: PathBuf,
    core: Arc<Core>,
    serving: Serving,
    shutdown: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, SocketError> {
    let bound = serve::bind_unix(&path)?;
    let app = Router::new()
        .route("/cmdadd", any(cmd_add))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        .with_state(core);
    info!(path = %path.display(), "plugin-event server listening");
    let limits = Limits::new(serve::MAX_PLUGIN_EVENT_CONNECTIONS, serving.idle_timeout);
    let server = UnixServer {
        name: PLUGIN_EVENT_SOCKET.to_string(),
        limits,
        readiness: Some(serving.readiness),
    };
    Ok(tokio::spawn(server.run(
        bound,
        serve::http(app, limits),
        shutdown,
    )))
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
    let budget = core.timing.plugin_answer_budget;
    let pod = pod_key(&event.pod_namespace, &event.pod_name);
    let task = tokio::spawn(async move { enrol(&core, &event).await });
    answer_within(budget, &pod, task).await
}

/// The answer to the plugin: the enrolment's outcome, or, when it is not done within `budget`
/// (shorter than the plugin's own 5 s timeout, L23), a 504 naming the pod while the enrolment
/// runs on to its end (enrolled, or marked pending with its cleanup). Without the budget the
/// plugin would only ever report its own timeout, never why the agent was slow.
async fn answer_within(
    budget: std::time::Duration,
    pod: &str,
    mut task: tokio::task::JoinHandle<Result<(), String>>,
) -> (StatusCode, String) {
    match tokio::time::timeout(budget, &mut task).await {
        Ok(Ok(Ok(()))) => (StatusCode::OK, String::new()),
        Ok(Ok(Err(message))) => {
            warn!("/cmdadd: {message}");
            (StatusCode::INTERNAL_SERVER_ERROR, message)
        }
        Ok(Err(e)) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the add task failed: {e}"),
        ),
        Err(_) => {
            let message = format!(
                "pod {pod} not enrolled within {budget:?} (ztunnel has not acknowledged it yet); \
                 the agent finishes the enrolment or marks the pod pending"
            );
            warn!("/cmdadd: {message}");
            (StatusCode::GATEWAY_TIMEOUT, message)
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_slow_enrolment_is_answered_within_the_budget_and_runs_on() {
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = done.clone();
        let task = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        });
        let started = tokio::time::Instant::now();
        let (status, text) = answer_within(Duration::from_millis(100), "ns/p", task).await;
        assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
        assert!(
            text.contains("pod ns/p not enrolled within 100ms"),
            "{text}"
        );
        assert!(started.elapsed() < Duration::from_millis(250));
        assert!(!done.load(std::sync::atomic::Ordering::SeqCst));
        // The enrolment was not cancelled with the answer.
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(done.load(std::sync::atomic::Ordering::SeqCst));
    }

    #[tokio::test]
    async fn outcomes_within_the_budget_pass_through() {
        let ok = tokio::spawn(async { Ok(()) });
        assert_eq!(
            answer_within(Duration::from_secs(1), "ns/p", ok).await.0,
            StatusCode::OK
        );
        let failed = tokio::spawn(async { Err("no netns".to_string()) });
        assert_eq!(
            answer_within(Duration::from_secs(1), "ns/p", failed).await,
            (StatusCode::INTERNAL_SERVER_ERROR, "no netns".to_string())
        );
    }
}
