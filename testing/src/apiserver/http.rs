//! The HTTP side of the test API server: routing, the front door (request log, token, faults),
//! list/watch/get/patch/delete handlers, events, and the control endpoints.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use k8s_openapi::api::core::v1::Event;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::selector::{FieldSelector, Kind, LabelSelector};
use super::{Change, Fault, FaultKind, REQUEST_LOG_LIMIT, RequestRecord, Shared, validate};

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

/// The parsed list/watch query of one request.
struct Query {
    filter: WatchFilter,
    watch: bool,
    resource_version: Option<u64>,
    bookmarks: bool,
    timeout: Option<Duration>,
}

#[derive(Clone)]
struct WatchFilter {
    kind: Kind,
    namespace: Option<String>,
    fields: FieldSelector,
    labels: LabelSelector,
}

impl WatchFilter {
    fn matches(&self, object: &Value) -> bool {
        let in_namespace = self.namespace.as_deref().is_none_or(|ns| {
            object
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                == Some(ns)
        });
        in_namespace && self.fields.matches(object) && self.labels.matches(object)
    }

    /// The watch event this change means for this watcher, if any: an object that stops
    /// matching is DELETED for it, one that starts matching is ADDED.
    fn event_for(&self, change: &Change) -> Option<(&'static str, Value)> {
        if change.kind != self.kind {
            return None;
        }
        let before = change.before.as_ref().filter(|o| self.matches(o));
        let after = change.after.as_ref().filter(|o| self.matches(o));
        match (before, after, &change.after) {
            (Some(_), Some(now), _) => Some(("MODIFIED", now.clone())),
            (None, Some(now), _) => Some(("ADDED", now.clone())),
            (Some(_), None, Some(now)) => Some(("DELETED", now.clone())),
            (Some(gone), None, None) => Some(("DELETED", gone.clone())),
            (None, None, _) => None,
        }
    }
}

/// Errors are messages for a 400 BadRequest.
fn parse_list_query(kind: Kind, namespace: Option<String>, query: &str) -> Result<Query, String> {
    let params = parse_query(query);
    let fields =
        FieldSelector::parse(kind, params.get("fieldSelector").map_or("", String::as_str))?;
    let labels = LabelSelector::parse(params.get("labelSelector").map_or("", String::as_str))?;
    let resource_version = match params.get("resourceVersion").map(String::as_str) {
        None | Some("") => None,
        Some(rv) => Some(
            rv.parse::<u64>()
                .map_err(|_| format!("invalid resourceVersion {rv:?}"))?,
        ),
    };
    let timeout = params
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs);
    Ok(Query {
        filter: WatchFilter {
            kind,
            namespace,
            fields,
            labels,
        },
        watch: params.get("watch").is_some_and(|v| is_true(v)),
        resource_version,
        bookmarks: params
            .get("allowWatchBookmarks")
            .is_some_and(|v| is_true(v)),
        timeout,
    })
}

fn kind_names(kind: Kind) -> (&'static str, &'static str) {
    match kind {
        Kind::Pod => ("Pod", "pods"),
        Kind::Namespace => ("Namespace", "namespaces"),
    }
}

async fn list_or_watch_all_pods(State(shared): AppState, request: Request) -> Response {
    list_or_watch(
        shared,
        Kind::Pod,
        None,
        request.uri().query().unwrap_or_default(),
    )
}

async fn list_or_watch_namespace_pods(
    State(shared): AppState,
    axum::extract::Path(ns): axum::extract::Path<String>,
    request: Request,
) -> Response {
    list_or_watch(
        shared,
        Kind::Pod,
        Some(ns),
        request.uri().query().unwrap_or_default(),
    )
}

async fn list_or_watch_namespaces(State(shared): AppState, request: Request) -> Response {
    list_or_watch(
        shared,
        Kind::Namespace,
        None,
        request.uri().query().unwrap_or_default(),
    )
}

fn list_or_watch(
    shared: Arc<Shared>,
    kind: Kind,
    namespace: Option<String>,
    query: &str,
) -> Response {
    let query = match parse_list_query(kind, namespace, query) {
        Ok(query) => query,
        Err(message) => return status_response(400, &message, None),
    };
    if query.watch {
        return watch(shared, query);
    }
    let store = shared.store.lock();
    let items: Vec<&Value> = store
        .objects
        .iter()
        .filter(|((k, _, _), object)| *k == kind && query.filter.matches(object))
        .map(|(_, object)| object)
        .collect();
    let (kind_name, _) = kind_names(kind);
    let list = json!({
        "kind": format!("{kind_name}List"),
        "apiVersion": "v1",
        "metadata": { "resourceVersion": store.resource_version.to_string() },
        "items": items,
    });
    json_response(StatusCode::OK, &list)
}

fn watch_line(event_type: &str, object: &Value) -> Bytes {
    let mut line = json!({ "type": event_type, "object": object }).to_string();
    line.push('\n');
    Bytes::from(line)
}

fn watch(shared: Arc<Shared>, query: Query) -> Response {
    let (kind_name, _) = kind_names(query.filter.kind);
    let cancel = shared.generation.lock().clone();
    let mut initial = Vec::new();
    let mut expired = false;
    // Subscribing and reading the history under the store lock means no change is missed or
    // sent twice.
    let (mut changes, mut last_seen) = {
        let store = shared.store.lock();
        match query.resource_version {
            // No or "0" resourceVersion: the current state as ADDED, then changes.
            None | Some(0) => {
                for ((k, _, _), object) in &store.objects {
                    if *k == query.filter.kind && query.filter.matches(object) {
                        initial.push(watch_line("ADDED", object));
                    }
                }
            }
            Some(rv) if rv < store.compacted_through => {
                let message = format!(
                    "too old resource version: {rv} ({})",
                    store.compacted_through
                );
                initial.push(watch_line("ERROR", &status_object(410, &message, None)));
                expired = true;
            }
            Some(rv) => {
                for change in store.history.iter().filter(|c| c.resource_version > rv) {
                    if let Some((event_type, object)) = query.filter.event_for(change) {
                        initial.push(watch_line(event_type, &object));
                    }
                }
            }
        }
        (store.events.subscribe(), store.resource_version)
    };
    let (sender, receiver) = mpsc::channel::<Bytes>(64);
    let bookmark_interval = shared.options.bookmark_interval;
    tokio::spawn(async move {
        for line in initial {
            if sender.send(line).await.is_err() {
                return;
            }
        }
        if expired {
            return;
        }
        let deadline = query.timeout.map(|t| tokio::time::Instant::now() + t);
        let mut bookmarks = tokio::time::interval_at(
            tokio::time::Instant::now() + bookmark_interval,
            bookmark_interval,
        );
        loop {
            let line = tokio::select! {
                _ = cancel.cancelled() => return,
                _ = sender.closed() => return,
                _ = sleep_until(deadline) => return,
                _ = bookmarks.tick(), if query.bookmarks => {
                    let bookmark = json!({
                        "kind": kind_name,
                        "apiVersion": "v1",
                        "metadata": { "resourceVersion": last_seen.to_string() },
                    });
                    Some(watch_line("BOOKMARK", &bookmark))
                }
                change = changes.recv() => match change {
                    Ok(change) => {
                        last_seen = change.resource_version;
                        query.filter.event_for(&change).map(|(t, object)| watch_line(t, &object))
                    }
                    // Lagged or closed: end the stream; the client resumes from its last version.
                    Err(_) => return,
                },
            };
            if let Some(line) = line
                && sender.send(line).await.is_err()
            {
                return;
            }
        }
    });
    let body = futures::stream::unfold(receiver, |mut receiver| async move {
        receiver
            .recv()
            .await
            .map(|line| (Ok::<_, Infallible>(line), receiver))
    });
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(body),
    )
        .into_response()
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
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

async fn patch_pod(
    State(shared): AppState,
    path: PodPath,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    patch(&shared, path.0, &headers, &body, false)
}

async fn patch_pod_status(
    State(shared): AppState,
    path: PodPath,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    patch(&shared, path.0, &headers, &body, true)
}

/// RFC 7386 JSON merge patch: objects merge recursively, `null` deletes, anything else replaces.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch_fields) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(serde_json::Map::new());
    }
    if let Value::Object(target_fields) = target {
        for (key, value) in patch_fields {
            if value.is_null() {
                target_fields.remove(key);
            } else {
                merge_patch(
                    target_fields.entry(key.clone()).or_insert(Value::Null),
                    value,
                );
            }
        }
    }
}

fn patch(
    shared: &Shared,
    (ns, name): (String, String),
    headers: &HeaderMap,
    body: &[u8],
    status_subresource: bool,
) -> Response {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    // Strategic merge differs from a merge patch only for lists with merge keys; labels and
    // annotations are maps, so treating it as a merge patch is exact for what the roles send.
    let media = content_type.split(';').next().unwrap_or_default().trim();
    if !matches!(
        media,
        "application/merge-patch+json" | "application/strategic-merge-patch+json"
    ) {
        return status_response(
            415,
            &format!(
                "the body of the request was in an unknown format - accepted media types include: application/merge-patch+json, application/strategic-merge-patch+json (got {content_type:?})"
            ),
            None,
        );
    }
    let patch: Value = match serde_json::from_slice(body) {
        Ok(patch) => patch,
        Err(e) => return status_response(400, &format!("invalid patch JSON: {e}"), None),
    };
    let key = (Kind::Pod, ns, name);
    let mut store = shared.store.lock();
    let Some(current) = store.objects.get(&key).cloned() else {
        return not_found("pods", &key.2);
    };
    let current_rv = current.pointer("/metadata/resourceVersion").cloned();
    if let Some(wanted) = patch.pointer("/metadata/resourceVersion")
        && Some(wanted) != current_rv.as_ref()
    {
        return status_response(
            409,
            &format!(
                "Operation cannot be fulfilled on pods \"{}\": the object has been modified; please apply your changes to the latest version and try again",
                key.2
            ),
            Some(("pods", &key.2)),
        );
    }
    let mut updated = current.clone();
    merge_patch(&mut updated, &patch);
    // The subresource owns status (plus metadata); the main resource owns everything else.
    let kept = if status_subresource { "spec" } else { "status" };
    match current.get(kept) {
        Some(value) => updated[kept] = value.clone(),
        None => {
            if let Some(fields) = updated.as_object_mut() {
                fields.remove(kept);
            }
        }
    }
    for identity in [
        "name",
        "namespace",
        "uid",
        "creationTimestamp",
        "resourceVersion",
    ] {
        if let (Some(old), Some(meta)) = (
            current.pointer(&format!("/metadata/{identity}")).cloned(),
            updated.get_mut("metadata").and_then(Value::as_object_mut),
        ) {
            meta.insert(identity.into(), old);
        }
    }
    if let Err(e) = validate(Kind::Pod, &updated) {
        return status_response(
            422,
            &format!("Pod \"{}\" is invalid: {e}", key.2),
            Some(("pods", &key.2)),
        );
    }
    if updated == current {
        // A no-op patch neither bumps the resourceVersion nor wakes watchers.
        return json_response(StatusCode::OK, &current);
    }
    let stored = store.commit(key, Some(updated)).unwrap_or(Value::Null);
    json_response(StatusCode::OK, &stored)
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

async fn control_add_objects(State(shared): AppState, body: Bytes) -> Response {
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
async fn control_set_fault(State(shared): AppState, body: Bytes) -> Response {
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

async fn control_clear_faults(State(shared): AppState) -> Response {
    shared.faults.lock().clear();
    json_response(StatusCode::OK, &json!({}))
}

async fn control_requests(State(shared): AppState) -> Response {
    let requests = shared.requests.lock().clone();
    json_response(StatusCode::OK, &json!(requests))
}

/// `{"<node>": <GETs of single pods on that node>}` ("" = unscheduled or unknown pods).
async fn control_pod_gets(State(shared): AppState) -> Response {
    let counts = shared.pod_gets.lock().clone();
    json_response(StatusCode::OK, &json!(counts))
}

async fn control_compact(State(shared): AppState) -> Response {
    shared.compact();
    json_response(StatusCode::OK, &json!({}))
}

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

    #[test]
    fn merge_patch_follows_rfc7386() {
        let mut target = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"x": [1]}});
        merge_patch(
            &mut target,
            &json!({"metadata": {"labels": {"a": null, "c": "3"}}, "spec": {"x": [2]}}),
        );
        assert_eq!(
            target,
            json!({"metadata": {"labels": {"b": "2", "c": "3"}}, "spec": {"x": [2]}})
        );
    }

    #[test]
    fn selector_changes_become_added_and_deleted() {
        let filter = WatchFilter {
            kind: Kind::Pod,
            namespace: None,
            fields: FieldSelector::default(),
            labels: LabelSelector::parse("mode=ambient").expect("parses"),
        };
        let with = |mode: &str| json!({"metadata": {"name": "p", "labels": {"mode": mode}}});
        let change = |before: Option<Value>, after: Option<Value>| Change {
            resource_version: 5,
            kind: Kind::Pod,
            before,
            after,
        };
        let kind_of = |c: &Change| filter.event_for(c).map(|(t, _)| t);
        assert_eq!(
            kind_of(&change(Some(with("none")), Some(with("ambient")))),
            Some("ADDED")
        );
        assert_eq!(
            kind_of(&change(Some(with("ambient")), Some(with("none")))),
            Some("DELETED")
        );
        assert_eq!(
            kind_of(&change(Some(with("ambient")), Some(with("ambient")))),
            Some("MODIFIED")
        );
        assert_eq!(
            kind_of(&change(Some(with("ambient")), None)),
            Some("DELETED")
        );
        assert_eq!(kind_of(&change(None, Some(with("none")))), None);
    }
}
