//! Pod patches (`pods/{name}` and `pods/{name}/status`): JSON merge patch, strategic merge read as
//! one, and the subresource rule that a status patch keeps `spec` and a main patch keeps `status`.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use serde_json::Value;

use super::{AppState, PodPath, json_response, not_found, status_response};
use crate::apiserver::selector::Kind;
use crate::apiserver::{Shared, validate};

pub(super) async fn patch_pod(
    State(shared): AppState,
    path: PodPath,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    patch(&shared, path.0, &headers, &body, false)
}

pub(super) async fn patch_pod_status(
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

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
}
