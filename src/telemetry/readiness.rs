//! Which components are ready ([`Readiness`]): set by whoever runs a component (the socket server
//! when a socket is bound and ours, the agent, the API server's first lists) and read by
//! `/readyz`. A leaf: both the server (`serve`) and the health endpoints (`health`) use it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::socket::SocketError;

/// Why a component is not ready; `/readyz` shows it after the component's name.
#[derive(Debug, thiserror::Error)]
pub enum NotReady {
    /// Registered or set not ready, no reason given (`/readyz` shows the name alone).
    #[error("")]
    Unstated,
    /// A socket file the component serves is not there or not ours.
    #[error("{}: {why}; {}", path.display(), if *rebinding { "binding it again" } else { "not serving it" })]
    Socket {
        path: PathBuf,
        why: String,
        /// Whether the server binds it again (it was removed) or leaves it (another's now).
        rebinding: bool,
    },
    /// Binding the component's socket again failed.
    #[error(transparent)]
    Bind(#[from] SocketError),
    /// The API server has not answered the first lists yet: why, as the client words it.
    #[error("{0}")]
    ApiServer(String),
    /// A watch was refused after the lists (RBAC without `watch`, a revoked token): the store
    /// may be missing changes.
    #[error("{0}")]
    WatchRefused(String),
    /// The node's own network namespaces could not be identified, so the component enters no
    /// pod's netns (fail closed).
    #[error("refusing to enter pod network namespaces: {0}")]
    NetnsRefused(String),
}

/// Readiness of every enabled component; ready = at least one registered and all ready.
#[derive(Clone, Default)]
pub struct Readiness {
    /// Component -> `Ok` (ready) or why not.
    inner: Arc<Mutex<BTreeMap<String, Result<(), NotReady>>>>,
}

impl Readiness {
    /// Adds a component (not ready yet).
    pub fn register(&self, name: &str) {
        if let Ok(mut m) = self.inner.lock() {
            m.entry(name.to_string()).or_insert(Err(NotReady::Unstated));
        }
    }

    /// Sets a component's readiness.
    pub fn set(&self, name: &str, ready: bool) {
        self.set_state(
            name,
            if ready {
                Ok(())
            } else {
                Err(NotReady::Unstated)
            },
        );
    }

    /// Sets a component's readiness with the reason it is not ready (shown by `/readyz`).
    pub fn set_state(&self, name: &str, state: Result<(), NotReady>) {
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
                        Err(NotReady::Unstated) => Some(k.clone()),
                        Err(why) => Some(format!("{k} ({why})")),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}
