//! The control plane's child processes: tied to the test process (`crate::tied`: killed by the
//! kernel when the test process dies), killed on drop, and killed at exit
//! for the shared instance (statics are never dropped), with its data dir removed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use parking_lot::Mutex;

use super::ControlPlaneError;

/// Children and data dirs still to clean up when the process exits.
static AT_EXIT: Mutex<(Vec<i32>, Vec<PathBuf>)> = Mutex::new((Vec::new(), Vec::new()));

/// Registers the exit-time clean-up once, before the first thing is registered for it.
fn at_exit() -> &'static Mutex<(Vec<i32>, Vec<PathBuf>)> {
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    // SAFETY: registering a plain extern "C" function with libc.
    REGISTERED.call_once(|| unsafe {
        libc::atexit(clean_up_at_exit);
    });
    &AT_EXIT
}

extern "C" fn clean_up_at_exit() {
    // try_lock: never block an exit on a lock a dying thread may hold.
    let Some(mut registered) = AT_EXIT.try_lock() else {
        return;
    };
    let (pids, dirs) = &mut *registered;
    for pid in pids.drain(..) {
        // SAFETY: signalling and reaping our own children by pid.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
    }
    for dir in dirs.drain(..) {
        if std::env::var_os("CONTROLPLANE_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Cleans `pid` up at process exit unless [`forget`] says it is gone.
pub(super) fn remember(pid: u32) {
    at_exit().lock().0.push(pid as i32);
}

pub(super) fn forget(pid: u32) {
    AT_EXIT.lock().0.retain(|p| *p != pid as i32);
}

/// Removes `dir` at process exit.
pub(super) fn remove_at_exit(dir: &Path) {
    at_exit().lock().1.push(dir.to_path_buf());
}

/// Spawns `command` (stdout and stderr into `log`) so that it dies with the test process.
pub(super) fn spawn(command: Command, log: &Path) -> Result<Child, ControlPlaneError> {
    let program = command.get_program().to_string_lossy().into_owned();
    let write_error = |source| ControlPlaneError::Write {
        path: log.to_path_buf(),
        source,
    };
    let file = std::fs::File::create(log).map_err(write_error)?;
    let err = file.try_clone().map_err(write_error)?;
    let child = crate::tied::spawn(command, file, err)
        .map_err(|source| ControlPlaneError::Spawn { program, source })?;
    remember(child.id());
    Ok(child)
}

/// Kills and reaps a child.
pub(super) fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
    forget(child.id());
}

/// A loopback port that was free a moment ago.
pub(super) fn free_port() -> Result<u16, ControlPlaneError> {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|source| ControlPlaneError::Spawn {
            program: "a free loopback port".into(),
            source,
        })
}

/// For failure messages: a log's error and fatal lines (klog's `E`/`F` prefix; the cause is
/// rarely at the very end) and then its last `lines` lines.
pub(super) fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    let errors: Vec<&str> = all
        .iter()
        .copied()
        .filter(|l| l.starts_with('E') || l.starts_with('F'))
        .collect();
    let errors = &errors[errors.len().saturating_sub(10)..];
    let last = &all[all.len().saturating_sub(lines)..];
    format!("{}\n...\n{}", errors.join("\n"), last.join("\n"))
}
