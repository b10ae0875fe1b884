//! Entering a network namespace. Namespaces are per thread, so the work runs on a fresh, dedicated
//! thread that `setns`es into the target and ends afterwards: no shared (tokio) thread is ever
//! moved. Child processes started from that thread (iptables-restore, nft) inherit its namespace.
//! May call: nothing else in this crate.

use std::fs::File;
use std::path::{Path, PathBuf};

use nix::sched::{CloneFlags, setns};

/// Why work could not run inside a namespace.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("cannot open network namespace {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a network namespace or cannot be entered: {source}")]
    Enter { path: PathBuf, source: nix::Error },
    #[error("the worker thread for network namespace {path} failed: {reason}")]
    Thread { path: PathBuf, reason: String },
}

/// Runs `work` inside the network namespace at `path` (e.g. `/var/run/netns/x` or
/// `/proc/<pid>/ns/net`) and returns its result. The calling thread is not moved.
pub fn run_in<T, F>(path: &Path, work: F) -> Result<T, NetnsError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let file = File::open(path).map_err(|source| NetnsError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let owned_path = path.to_path_buf();
    let handle = std::thread::Builder::new()
        .name("netns".into())
        .spawn(move || -> Result<T, NetnsError> {
            setns(&file, CloneFlags::CLONE_NEWNET).map_err(|source| NetnsError::Enter {
                path: owned_path,
                source,
            })?;
            Ok(work())
        })
        .map_err(|e| NetnsError::Thread {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    handle.join().map_err(|panic| NetnsError::Thread {
        path: path.to_path_buf(),
        reason: panic_message(&panic),
    })?
}

/// The text of a panic payload, for error messages.
pub fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_namespace_names_the_path() {
        let err = run_in(Path::new("/nonexistent/netns"), || ()).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/netns"), "{err}");
    }

    #[test]
    fn regular_file_is_not_a_namespace() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let err = run_in(file.path(), || ()).unwrap_err();
        assert!(matches!(err, NetnsError::Enter { .. }), "{err}");
    }
}
