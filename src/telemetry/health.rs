//! `/healthz`, `/readyz` and `/metrics` over HTTP, and the read-only `/debug/pods` on the
//! health port (the agent's per-pod answer to "is this pod in the mesh right now?", bound once the
//! agent runs; GET only, other methods get 405), answered only to loopback peers: it names every
//! pod of the node, which no pod may read.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use super::metrics::{self, Metrics};
pub use super::readiness::{NotReady, Readiness};
use super::serve::{self, ConnInfo, Limits};

/// Readiness component of the API server's first lists (install-cni waits for them however long
/// the API server is away; the reason says what the last attempt got).
pub const API_SERVER: &str = "api-server";

/// A JSON report made on request (the agent's `/debug/pods`).
pub type Report = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;

/// `/debug/pods`, bound late: the health server starts before the agent.
#[derive(Clone, Default)]
pub struct DebugPods {
    inner: Arc<std::sync::OnceLock<Report>>,
}

impl DebugPods {
    /// Binds the report (the first bind wins).
    pub fn bind(&self, report: Report) {
        let _ = self.inner.set(report);
    }
}

/// Whether a connection may read `/debug/pods`: only from loopback (this netns: install-cni
/// status inside the agent's pod, or the node itself when the agent shares its netns).
/// Everyone else on the health port, kubelet and every pod, gets the probes only.
pub fn may_read_debug(info: &ConnInfo) -> bool {
    info.remote
        .is_some_and(|a| a.ip().to_canonical().is_loopback())
}

/// The answer to anyone else.
pub const DEBUG_REFUSED: &str = "/debug/pods is answered only on loopback (run `install-cni status` inside the istio-cni-node pod)";

async fn debug_pods(
    State((d, r)): State<(DebugPods, Readiness)>,
    Extension(info): Extension<ConnInfo>,
) -> axum::response::Response {
    if !may_read_debug(&info) {
        return (StatusCode::FORBIDDEN, DEBUG_REFUSED).into_response();
    }
    match d.inner.get() {
        Some(report) => axum::Json(report()).into_response(),
        None => {
            // Why it is still starting, for `install-cni status` (e.g. waiting for the API server).
            let waiting = r.not_ready();
            let why = if waiting.is_empty() {
                String::new()
            } else {
                format!("; not ready: {}", waiting.join(", "))
            };
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "the ambient node agent is not running (AMBIENT_ENABLED=false, or still \
                     starting){why}"
                ),
            )
                .into_response()
        }
    }
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(r): State<Readiness>) -> impl IntoResponse {
    if r.is_ready() {
        (StatusCode::OK, "ok".to_string())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "Service Unavailable: not ready: {}",
                r.not_ready().join(", ")
            ),
        )
    }
}

/// OpenMetrics or the classic text format, as the scraper's `Accept` header asks; the
/// Content-Type says which one was sent.
async fn metrics_handler(State(m): State<Metrics>, headers: HeaderMap) -> impl IntoResponse {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let format = metrics::Format::negotiate(accept);
    (
        [(header::CONTENT_TYPE, format.content_type())],
        metrics::render_as(&m.registry(), format),
    )
}

/// Binds the health server; returns the bound address. Errors are returned, not ignored (L18).
/// Every pod can reach the port: connections are bounded and time out (`serve`).
pub async fn serve_health(
    port: u16,
    readiness: Readiness,
    debug: DebugPods,
    idle_timeout: Duration,
    stop: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let debug: Router<()> = Router::new()
        .route("/debug/pods", get(debug_pods))
        .with_state((debug, readiness.clone()));
    let app: Router<()> = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(readiness)
        .merge(debug);
    let limits = Limits::new(serve::MAX_HEALTH_CONNECTIONS, idle_timeout);
    bind_and_serve(port, "health", app, limits, stop).await
}

/// Binds the metrics server; returns the bound address.
pub async fn serve_metrics(
    port: u16,
    m: Metrics,
    idle_timeout: Duration,
    stop: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let app: Router<()> = Router::new()
        .route("/metrics", get(metrics_handler))
        .with_state(m);
    let limits = Limits::new(serve::MAX_METRICS_CONNECTIONS, idle_timeout);
    bind_and_serve(port, "metrics", app, limits, stop).await
}

async fn bind_and_serve(
    port: u16,
    what: &str,
    app: Router<()>,
    limits: Limits,
    stop: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(("0.0.0.0", port)).await?;
    let addr = listener.local_addr()?;
    let name = format!("{what} port {addr}");
    tokio::spawn(serve::serve_tcp(listener, name, app, limits, stop));
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_needs_all_components() {
        let r = Readiness::default();
        assert!(!r.is_ready());
        r.register("installer");
        assert!(!r.is_ready());
        r.set("installer", true);
        assert!(r.is_ready());
        r.register("agent");
        assert!(!r.is_ready());
        assert_eq!(r.not_ready(), vec!["agent".to_string()]);
        r.set("agent", true);
        r.set_state(
            "log.sock",
            Err(NotReady::Socket {
                path: "/run/log.sock".into(),
                why: "removed".into(),
                rebinding: true,
            }),
        );
        assert!(!r.is_ready());
        assert_eq!(
            r.not_ready(),
            vec!["log.sock (/run/log.sock: removed; binding it again)"]
        );
    }
}
