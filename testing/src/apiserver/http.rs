//! The HTTP side of the test API server: routing, the front door (request log, token, faults),
//! `Status` answers, query decoding, get/delete handlers and events. Lists and watches are
//! [`watch`]'s, pod patches [`patch`]'s, the `/testserver/` endpoints [`control`]'s.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use k8s_openapi::api::core::v1::Event;
use serde_json::{Value, json};

use super::selector::Kind;
use super::{FaultKind, REQUEST_LOG_LIMIT, RequestRecord, Shared};

mod control;
mod patch;
mod watch;

use control::{
    control_add_objects, control_clear_faults, control_compact, control_pod_gets, control_requests,
    control_set_fault,
};
use patch::{patch_pod, patch_pod_status};
use watch::{list_or_watch_all_pods, list_or_watch_namespace_pods, list_or_watch_namespaces};

pub(super) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/api/v1/pods", get(list_or_watch_all_pods))
        .route(
            "/api/v1/namespaces/{ns}/pods",
            get(list_or_watch_namespace_pods),
        )
        .route(
            "/api/v1/namespaces/{ns}/pods/{name}",
            get(get_pod).patch(patch_pod).delete(delete_pod),
        )
        .route(
            "/api/v1/namespaces/{ns}/pods/{name}/status",
            get(get_pod).patch(patch_pod_status),
        )
        .route(
            "/api/v1/namespaces/{ns}/events",
            post(create_event).get(list_events),
        )
        .route("/api/v1/namespaces", get(list_or_watch_namespaces))
        .route("/api/v1/namespaces/{name}", get(get_namespace))
        .route("/testserver/objects", post(control_add_objects))
        .route(
            "/testserver/fault",
            post(control_set_fault).delete(control_clear_faults),
        )
        .route("/testserver/requests", get(control_requests))
        .route("/testserver/pod-gets", get(control_pod_gets))
        .route("/testserver/compact", post(control_compact))
        .fallback(not_routed)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(shared.clone(), front_door))
        .with_state(shared)
}

type AppState = State<Arc<Shared>>;

/// Logs the request, checks the token and applies faults, in that order (a real API server
/// authenticates before anything else; faults model the network/server, so they come last).
async fn front_door(State(shared): AppState, request: Request, next: Next) -> Response {
    let path = request.uri().path().to_string();
    if path.starts_with("/testserver/") {
        return next.run(request).await;
    }
    let sent_token = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_string);
    {
        let mut requests = shared.requests.lock();
        // Bounded so a long-running demo server does not grow without end.
        if requests.len() >= REQUEST_LOG_LIMIT {
            requests.remove(0);
        }
        requests.push(RequestRecord {
            method: request.method().to_string(),
            path: path.clone(),
            query: request.uri().query().unwrap_or_default().to_string(),
            token: sent_token.clone(),
            accept_encoding: request
                .headers()
                .get(header::ACCEPT_ENCODING)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
        });
    }
    shared.activity.send_modify(|count| *count += 1);
    let expected = shared.token.lock().clone();
    if let Some(expected) = expected
        && sent_token.as_deref() != Some(expected.as_str())
    {
        return status_response(401, "Unauthorized", None);
    }
    match shared.matching_fault(&path) {
        Some(FaultKind::Delay(delay)) => {
            let cancel = shared.generation.lock().clone();
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = cancel.cancelled() => return status_response(503, "server is shutting down", None),
            }
            next.run(request).await
        }
        Some(FaultKind::Fail(code)) => {
            status_response(code, &format!("injected fault {code}"), None)
        }
        Some(FaultKind::Down) | None => next.run(request).await,
    }
}

fn reason_for(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        410 => "Expired",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    }
}

fn status_object(code: u16, message: &str, details: Option<(&str, &str)>) -> Value {
    let mut status = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason_for(code),
        "code": code,
    });
    if let Some((kind, name)) = details {
        status["details"] = json!({ "name": name, "kind": kind });
    }
    status
}

fn status_response(code: u16, message: &str, details: Option<(&str, &str)>) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_response(status, &status_object(code, message, details))
}

fn not_found(resource: &str, name: &str) -> Response {
    status_response(
        404,
        &format!("{resource} \"{name}\" not found"),
        Some((resource, name)),
    )
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn method_not_allowed() -> Response {
    status_response(
        405,
        "the server does not allow this method on the requested resource",
        None,
    )
}

async fn not_routed() -> Response {
    status_response(
        404,
        "the server could not find the requested resource",
        None,
    )
}

/// Decoded query parameters (last one wins, as Go's `url.Values.Get` would return the first —
/// clients never repeat these).
pub(super) fn parse_query(query: &str) -> BTreeMap<String, String> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(byte) => {
                        out.push(byte);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            other => out.push(other),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub(super) fn is_true(value: &str) -> bool {
    matches!(value, "true" | "1")
}

type PodPath = axum::extract::Path<(String, String)>;

async fn get_pod(State(shared): AppState, axum::extract::Path((ns, name)): PodPath) -> Response {
    let key = (Kind::Pod, ns, name);
    let store = shared.store.lock();
    let node = store
        .objects
        .get(&key)
        .and_then(|pod| pod.pointer("/spec/nodeName"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    *shared.pod_gets.lock().entry(node.to_string()).or_default() += 1;
    match store.objects.get(&key) {
        Some(object) => json_response(StatusCode::OK, object),
        None => not_found("pods", &key.2),
    }
}

async fn get_namespace(
    State(shared): AppState,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> Response {
    let key = (Kind::Namespace, String::new(), name);
    match shared.store.lock().objects.get(&key) {
        Some(object) => json_response(StatusCode::OK, object),
        None => not_found("namespaces", &key.2),
    }
}

async fn delete_pod(State(shared): AppState, path: PodPath, body: Bytes) -> Response {
    let (ns, name) = path.0;
    let options: Value = if body.is_empty() {
        Value::Null
    } else {
        match serde_json::from_slice(&body) {
            Ok(options) => options,
            Err(e) => return status_response(400, &format!("invalid DeleteOptions: {e}"), None),
        }
    };
    let key = (Kind::Pod, ns, name);
    let mut store = shared.store.lock();
    let Some(current) = store.objects.get(&key) else {
        return not_found("pods", &key.2);
    };
    for (precondition, field) in [("uid", "UID"), ("resourceVersion", "ResourceVersion")] {
        let wanted = options
            .pointer(&format!("/preconditions/{precondition}"))
            .and_then(Value::as_str);
        let actual = current
            .pointer(&format!("/metadata/{precondition}"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        if let Some(wanted) = wanted
            && wanted != actual
        {
            return status_response(
                409,
                &format!(
                    "Precondition failed: {field} in precondition: {wanted}, {field} in object meta: {actual}"
                ),
                Some(("pods", &key.2)),
            );
        }
    }
    let deleted = store.commit(key, None).unwrap_or(Value::Null);
    json_response(StatusCode::OK, &deleted)
}

async fn create_event(
    State(shared): AppState,
    axum::extract::Path(ns): axum::extract::Path<String>,
    body: Bytes,
) -> Response {
    let mut event: Value = match serde_json::from_slice(&body) {
        Ok(event) => event,
        Err(e) => return status_response(400, &format!("invalid JSON: {e}"), None),
    };
    if let Err(e) = serde_json::from_value::<Event>(event.clone()) {
        return status_response(422, &format!("Event is invalid: {e}"), None);
    }
    let name = event
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let involved_namespace = event
        .pointer("/involvedObject/namespace")
        .and_then(Value::as_str);
    // The API server's event validation: the event lives in its object's namespace.
    if name.is_empty() || involved_namespace.is_some_and(|n| n != ns) {
        return status_response(
            422,
            &format!(
                "Event {name:?} is invalid: name required, involvedObject.namespace must be {ns:?}"
            ),
            Some(("events", &name)),
        );
    }
    let mut store = shared.store.lock();
    store.resource_version += 1;
    let uid = match super::uid::new_v4() {
        Ok(uid) => uid,
        Err(e) => return status_response(500, &e, Some(("events", &name))),
    };
    let rv = store.resource_version.to_string();
    drop(store);
    if let Some(meta) = event.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("namespace".into(), Value::String(ns));
        meta.insert("uid".into(), Value::String(uid));
        meta.insert("resourceVersion".into(), Value::String(rv));
    }
    shared.events.lock().push(event.clone());
    shared.activity.send_modify(|count| *count += 1);
    json_response(StatusCode::CREATED, &event)
}

async fn list_events(
    State(shared): AppState,
    axum::extract::Path(ns): axum::extract::Path<String>,
) -> Response {
    let items: Vec<Value> = shared
        .events
        .lock()
        .iter()
        .filter(|e| e.pointer("/metadata/namespace").and_then(Value::as_str) == Some(ns.as_str()))
        .cloned()
        .collect();
    let rv = shared.store.lock().resource_version.to_string();
    let list = json!({
        "kind": "EventList",
        "apiVersion": "v1",
        "metadata": { "resourceVersion": rv },
        "items": items,
    });
    json_response(StatusCode::OK, &list)
}

// ---------------------------------------------------------------------------------------------
// Control endpoints (for the `test-apiserver` process)

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding_and_query_parsing() {
        let q = parse_query(
            "fieldSelector=spec.nodeName%3Dn1&labelSelector=a+in+%28x%2Cy%29&watch=1&bad=%zz",
        );
        assert_eq!(q["fieldSelector"], "spec.nodeName=n1");
        assert_eq!(q["labelSelector"], "a in (x,y)");
        assert_eq!(q["watch"], "1");
        assert_eq!(q["bad"], "%zz");
        assert_eq!(percent_decode("50%"), "50%");
    }
}
