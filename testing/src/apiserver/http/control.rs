//! The control endpoints under `/testserver/` (for the `test-apiserver` process): load objects, set
//! and clear faults, read the request log and pod-GET counts, compact the history.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};

use super::{AppState, json_response, status_response};
use crate::apiserver::{Fault, FaultKind};

pub(super) async fn control_add_objects(State(shared): AppState, body: Bytes) -> Response {
    let value: Value = match serde_json::from_slice(&body) {
        Ok(value) => value,
        Err(e) => return status_response(400, &format!("invalid JSON: {e}"), None),
    };
    match shared.load_objects(value) {
        Ok(count) => json_response(StatusCode::OK, &json!({ "loaded": count })),
        Err(e) => status_response(400, &e.to_string(), None),
    }
}

/// `{"kind":"fail","code":500}`, `{"kind":"delay","ms":300}` or `{"kind":"down","ms":1000}`
/// (down for that long, then back), plus optional `"pathPrefix"` and `"times"`.
pub(super) async fn control_set_fault(State(shared): AppState, body: Bytes) -> Response {
    let spec: Value = match serde_json::from_slice(&body) {
        Ok(spec) => spec,
        Err(e) => return status_response(400, &format!("invalid JSON: {e}"), None),
    };
    let number = |field: &str| spec.get(field).and_then(Value::as_u64);
    let kind = match spec.get("kind").and_then(Value::as_str) {
        Some("fail") => match number("code").and_then(|c| u16::try_from(c).ok()) {
            Some(code) => FaultKind::Fail(code),
            None => return status_response(400, "fail needs a numeric code", None),
        },
        Some("delay") => FaultKind::Delay(Duration::from_millis(number("ms").unwrap_or(0))),
        Some("down") => {
            let Some(ms) = number("ms") else {
                return status_response(400, "down needs ms (how long to stay down)", None);
            };
            let shared = shared.clone();
            // Stopping waits for open connections, including this one, so it runs beside this
            // handler: the listener closes at once, this answer still goes out.
            tokio::spawn(async move {
                shared.stop().await;
                tokio::time::sleep(Duration::from_millis(ms)).await;
                let _ = shared.restart().await;
            });
            return json_response(StatusCode::OK, &json!({ "down_ms": ms }));
        }
        other => return status_response(400, &format!("unknown fault kind {other:?}"), None),
    };
    let fault = Fault {
        kind,
        path_prefix: spec
            .get("pathPrefix")
            .and_then(Value::as_str)
            .map(str::to_string),
        times: number("times").and_then(|t| u32::try_from(t).ok()),
    };
    shared.faults.lock().push(fault);
    json_response(StatusCode::OK, &json!({}))
}

pub(super) async fn control_clear_faults(State(shared): AppState) -> Response {
    shared.faults.lock().clear();
    json_response(StatusCode::OK, &json!({}))
}

pub(super) async fn control_requests(State(shared): AppState) -> Response {
    let requests = shared.requests.lock().clone();
    json_response(StatusCode::OK, &json!(requests))
}

/// `{"<node>": <GETs of single pods on that node>}` ("" = unscheduled or unknown pods).
pub(super) async fn control_pod_gets(State(shared): AppState) -> Response {
    let counts = shared.pod_gets.lock().clone();
    json_response(StatusCode::OK, &json!(counts))
}

pub(super) async fn control_compact(State(shared): AppState) -> Response {
    shared.compact();
    json_response(StatusCode::OK, &json!({}))
}
