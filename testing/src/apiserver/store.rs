//! The object store: pods and namespaces as JSON under one global resourceVersion, the change
//! history that watches replay from (compacted to 410 Expired), what admission fills in on create,
//! replacement keeping an object's identity, and fixture loading.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use serde_json::Value;
use tokio::sync::broadcast;

use super::selector::Kind;
use super::{Shared, TestServerError, uid};

/// One stored change, fanned out to watchers. `before`/`after` carry the change's
/// resourceVersion already (a deletion's `before` is the final state, as in a DELETED event).
#[derive(Debug)]
pub(super) struct Change {
    pub(super) resource_version: u64,
    pub(super) kind: Kind,
    pub(super) before: Option<Value>,
    pub(super) after: Option<Value>,
}

pub(super) type ObjectKey = (Kind, String, String);

pub(super) struct Store {
    pub(super) resource_version: u64,
    pub(super) objects: BTreeMap<ObjectKey, Value>,
    pub(super) history: VecDeque<Arc<Change>>,
    /// Watches must start at or after this resourceVersion; older ones get 410 Expired.
    pub(super) compacted_through: u64,
    pub(super) history_limit: usize,
    pub(super) events: broadcast::Sender<Arc<Change>>,
    pub(super) activity: tokio::sync::watch::Sender<u64>,
}

impl Store {
    /// Applies a change (create/replace with `Some`, delete with `None`), bumps the global
    /// resourceVersion and tells the watchers. Returns the stored object (or the deleted one).
    pub(super) fn commit(&mut self, key: ObjectKey, after: Option<Value>) -> Option<Value> {
        self.resource_version += 1;
        let rv = self.resource_version.to_string();
        let stamp = |mut object: Value| {
            if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.insert("resourceVersion".into(), Value::String(rv.clone()));
            }
            object
        };
        let before = self.objects.remove(&key);
        let after = after.map(stamp);
        let before = match (&after, before) {
            (None, Some(deleted)) => Some(stamp(deleted)),
            (_, before) => before,
        };
        if let Some(object) = &after {
            self.objects.insert(key.clone(), object.clone());
        }
        let change = Arc::new(Change {
            resource_version: self.resource_version,
            kind: key.0,
            before: before.clone(),
            after: after.clone(),
        });
        self.history.push_back(change.clone());
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.compacted_through = old.resource_version;
            }
        }
        // No receivers is fine: nobody watches yet.
        let _ = self.events.send(change);
        self.activity.send_modify(|count| *count += 1);
        after.or(before)
    }

    /// Fills what the API server would on create: namespace, uid, creationTimestamp.
    pub(super) fn admit(
        &mut self,
        kind: Kind,
        mut object: Value,
    ) -> Result<(ObjectKey, Value), String> {
        let meta = object
            .get_mut("metadata")
            .and_then(Value::as_object_mut)
            .ok_or("object has no metadata")?;
        let name = meta
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or("object has no metadata.name")?
            .to_string();
        let namespace = match kind {
            Kind::Pod => {
                let ns = meta
                    .get("namespace")
                    .and_then(Value::as_str)
                    .filter(|n| !n.is_empty())
                    .unwrap_or("default")
                    .to_string();
                meta.insert("namespace".into(), Value::String(ns.clone()));
                ns
            }
            Kind::Namespace => String::new(),
        };
        match meta.get("uid") {
            Some(Value::String(given)) => uid::check(given)?,
            Some(other) => return Err(format!("metadata.uid {other} is not a string")),
            None => {
                meta.insert("uid".into(), Value::String(uid::new_v4()?));
            }
        }
        meta.entry("creationTimestamp")
            .or_insert(Value::String("2026-01-01T00:00:00Z".into()));
        Ok(((kind, namespace, name), object))
    }
}

impl Shared {
    pub(super) fn compact(&self) {
        let mut store = self.store.lock();
        store.history.clear();
        store.compacted_through = store.resource_version;
    }

    pub(super) fn upsert<T: serde::de::DeserializeOwned>(
        &self,
        kind: Kind,
        object: Value,
    ) -> Result<T, TestServerError> {
        let mut store = self.store.lock();
        let given = |field: &str| object.pointer(&format!("/metadata/{field}")).is_some();
        let unset: Vec<&str> = ["uid", "creationTimestamp"]
            .into_iter()
            .filter(|field| !given(field))
            .collect();
        let (key, mut object) = store
            .admit(kind, object)
            .map_err(TestServerError::InvalidObject)?;
        // A replacement without its own identity keeps the old one, as an update would; one with
        // another uid stands for a re-created object.
        if let Some(existing) = store.objects.get(&key) {
            for field in unset {
                if let (Some(old), Some(meta)) = (
                    existing.pointer(&format!("/metadata/{field}")).cloned(),
                    object.get_mut("metadata").and_then(Value::as_object_mut),
                ) {
                    meta.insert(field.into(), old);
                }
            }
        }
        validate(kind, &object).map_err(TestServerError::InvalidObject)?;
        let stored = store.commit(key, Some(object)).unwrap_or(Value::Null);
        serde_json::from_value(stored).map_err(|e| TestServerError::InvalidObject(e.to_string()))
    }

    pub(super) fn delete(&self, key: ObjectKey) -> Option<Value> {
        let mut store = self.store.lock();
        if !store.objects.contains_key(&key) {
            return None;
        }
        store.commit(key, None)
    }

    pub(super) fn load_objects(&self, value: Value) -> Result<usize, TestServerError> {
        let (items, list_kind) = match value {
            Value::Array(items) => (items, None),
            Value::Object(mut list) if list.contains_key("items") => {
                let kind = list.get("kind").and_then(Value::as_str).map(str::to_string);
                match list.remove("items") {
                    Some(Value::Array(items)) => (items, kind),
                    _ => return Err(TestServerError::InvalidObject("items is not a list".into())),
                }
            }
            single @ Value::Object(_) => (vec![single], None),
            _ => return Err(TestServerError::InvalidObject("expected objects".into())),
        };
        let count = items.len();
        for item in items {
            // Items of a typed list (PodList) may omit their own kind.
            let kind_name = item
                .get("kind")
                .and_then(Value::as_str)
                .map(str::to_string)
                .or_else(|| {
                    list_kind
                        .as_deref()
                        .and_then(|k| k.strip_suffix("List"))
                        .map(str::to_string)
                });
            match kind_name.as_deref() {
                Some("Pod") => {
                    self.upsert::<Pod>(Kind::Pod, item)?;
                }
                Some("Namespace") => {
                    self.upsert::<Namespace>(Kind::Namespace, item)?;
                }
                other => {
                    return Err(TestServerError::InvalidObject(format!(
                        "unsupported kind {other:?} (only Pod and Namespace)"
                    )));
                }
            }
        }
        Ok(count)
    }
}

/// Checks an object against its k8s-openapi type (and normalises nothing: the JSON is kept).
pub(super) fn validate(kind: Kind, object: &Value) -> Result<(), String> {
    let result = match kind {
        Kind::Pod => serde_json::from_value::<Pod>(object.clone()).map(|_| ()),
        Kind::Namespace => serde_json::from_value::<Namespace>(object.clone()).map(|_| ()),
    };
    result.map_err(|e| e.to_string())
}
