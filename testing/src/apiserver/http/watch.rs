//! Lists and watches of pods and namespaces: the list query (selectors, resourceVersion,
//! bookmarks, timeout), the list answer, and the watch stream that replays history and then follows
//! the store, with selector-aware ADDED/DELETED events.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::{AppState, is_true, json_response, parse_query, status_object, status_response};
use crate::apiserver::selector::{FieldSelector, Kind, LabelSelector};
use crate::apiserver::{Change, Shared};

/// The parsed list/watch query of one request.
struct Query {
    filter: WatchFilter,
    watch: bool,
    resource_version: Option<u64>,
    bookmarks: bool,
    /// `sendInitialEvents`: the current state as ADDED, ended by a bookmark saying so.
    initial_events: bool,
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
        initial_events: params.get("sendInitialEvents").is_some_and(|v| is_true(v)),
        timeout,
    })
}

fn kind_names(kind: Kind) -> (&'static str, &'static str) {
    match kind {
        Kind::Pod => ("Pod", "pods"),
        Kind::Namespace => ("Namespace", "namespaces"),
    }
}

pub(super) async fn list_or_watch_all_pods(State(shared): AppState, request: Request) -> Response {
    list_or_watch(
        shared,
        Kind::Pod,
        None,
        request.uri().query().unwrap_or_default(),
    )
}

pub(super) async fn list_or_watch_namespace_pods(
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

pub(super) async fn list_or_watch_namespaces(
    State(shared): AppState,
    request: Request,
) -> Response {
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
        if query.initial_events && !shared.options.streaming_lists {
            let message = "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled";
            return status_response(422, message, None);
        }
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
                if query.initial_events {
                    let end = json!({
                        "kind": kind_name,
                        "apiVersion": "v1",
                        "metadata": {
                            "resourceVersion": store.resource_version.to_string(),
                            "annotations": {"k8s.io/initial-events-end": "true"},
                        },
                    });
                    initial.push(watch_line("BOOKMARK", &end));
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

#[cfg(test)]
mod tests {
    use super::*;

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
