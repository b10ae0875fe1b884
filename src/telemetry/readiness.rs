//! Which components are ready ([`Readiness`]): set by whoever runs a component (the socket server
//! when a socket is bound and ours, the agent, the API server's first lists) and read by
//! `/readyz`. A leaf: both the server (`serve`) and the health endpoints (`health`) use it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Readiness of every enabled component; ready = at least one registered and all ready.
#[derive(Clone, Default)]
pub struct Readiness {
    /// Component -> `Ok` (ready) or why not (empty: no reason given).
    inner: Arc<Mutex<BTreeMap<String, Result<(), String>>>>,
}

impl Readiness {
    /// Adds a component (not ready yet).
    pub fn register(&self, name: &str) {
        if let Ok(mut m) = self.inner.lock() {
            m.entry(name.to_string()).or_insert(Err(String::new()));
        }
    }

    /// Sets a component's readiness.
    pub fn set(&self, name: &str, ready: bool) {
        self.set_state(name, if ready { Ok(()) } else { Err(String::new()) });
    }

    /// Sets a component's readiness with the reason it is not ready (shown by `/readyz`).
    pub fn set_state(&self, name: &str, state: Result<(), String>) {
        if let Ok(mut m) = self.inner.lock() {
            m.insert(name.to_string(), state);
        }
    }

    /// Whether every component is ready.
    pub fn is_ready(&self) -> bool {
        self.inner
            .lock()
            .map(|m| !m.is_empty() && m.values().all(Result::is_ok))
            .unwrap_or(false)
    }

    /// Components not ready (with their reasons), for the 503 body.
    pub fn not_ready(&self) -> Vec<String> {
        self.inner
            .lock()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, r)| match r {
                        Ok(()) => None,
                        Err(why) if why.is_empty() => Some(k.clone()),
                        Err(why) => Some(format!("{k} ({why})")),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}
