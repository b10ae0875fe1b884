//! The guard loop: install, then watch the conf dir, the installed binaries, the token dir
//! and the kubeconfig; re-validate on every change (content, and the mode and owner of the files
//! that are ours alone) and repair what is broken.
//!
//! Runs on its own thread (all of it is blocking file work). A fresh watcher is created before
//! each validation and dropped before each write, so our own writes do not wake us, and a change
//! that lands between validation and waiting is still seen.

use std::path::Path;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use notify::{EventKind, RecursiveMode, Watcher};
use tracing::{debug, error, info, warn};

use super::installer::{Fingerprint, InstallError, InstallPass, Installer, WatchTarget};
use crate::kube::RetryPolicy;

/// What the guard reports to the outside (readiness, metrics).
pub trait GuardObserver: Send + 'static {
    /// The install is valid and being watched (true) or being repaired (false).
    fn set_ready(&self, ready: bool);
    /// An install pass ended: `None` = success, `Some(label)` = Istio's failure label.
    fn pass_result(&self, failure: Option<&'static str>);
    /// A pass (re)wrote the install: the first one, or a repair of our entry that something
    /// removed or changed (pods started meanwhile may lack their rules: verify them).
    fn installed(&self) {}
}

enum Msg {
    Fs(notify::Result<notify::Event>),
    Stop,
}

/// Handle to the running guard.
pub struct GuardHandle {
    tx: Sender<Msg>,
    join: JoinHandle<Installer>,
}

impl GuardHandle {
    /// Stops the guard and hands the installer back (for cleanup).
    pub fn stop(self) -> Option<Installer> {
        let _ = self.tx.send(Msg::Stop);
        self.join.join().ok()
    }

    /// Whether the guard thread has ended on its own (it only does on a panic).
    pub fn is_finished(&self) -> bool {
        self.join.is_finished()
    }
}

/// Starts the guard thread.
pub fn spawn(installer: Installer, observer: impl GuardObserver) -> std::io::Result<GuardHandle> {
    let (tx, rx) = mpsc::channel();
    let tx2 = tx.clone();
    let join = std::thread::Builder::new()
        .name("install-guard".to_string())
        .spawn(move || {
            let mut installer = installer;
            run(&mut installer, &observer, tx2, rx);
            installer
        })?;
    Ok(GuardHandle { tx, join })
}

/// Throttle numbers. Istio allows one pass per 5 s (sleeping at most 1 s); that cannot keep the
/// promise "repaired within 1 s" when a component keeps reverting the file, so we allow short
/// bursts and a sustained 50 passes/s, which still bounds the CPU a fight can take.
const RATE_PER_SEC: f64 = 50.0;
const BURST: f64 = 10.0;
const MAX_SLEEP: Duration = Duration::from_secs(1);
/// Passes closer together than this belong to one burst.
const QUIET: Duration = Duration::from_secs(5);
/// Passes in one burst before we warn (once per burst) that something keeps reverting us.
const WARN_AFTER: u32 = 20;
/// Retry delays after a failed pass: 100 ms doubling to 5 s, jittered (agents on many nodes
/// sharing one failing volume or API should not retry in step). No attempt limit: the guard
/// keeps repairing for as long as the agent runs, and each hold is also ended by a change.
const FAILED_PASS_RETRY: RetryPolicy = RetryPolicy {
    first: Duration::from_millis(100),
    max: Duration::from_secs(5),
    max_attempts: None,
};
/// Re-check everything this often even without events.
const RESYNC: Duration = Duration::from_secs(60);

/// Token bucket + burst accounting (pure: time comes in as an argument).
#[derive(Debug)]
pub struct Throttle {
    tokens: f64,
    last: Option<Instant>,
    hits: u32,
    warned: bool,
}

impl Default for Throttle {
    fn default() -> Self {
        Self::new()
    }
}

impl Throttle {
    pub fn new() -> Self {
        Self {
            tokens: BURST,
            last: None,
            hits: 0,
            warned: false,
        }
    }

    /// Accounts for a pass starting at `now`: how long to sleep first, and whether to warn.
    pub fn next(&mut self, now: Instant) -> (Duration, bool) {
        let Some(last) = self.last else {
            self.last = Some(now);
            return (Duration::ZERO, false);
        };
        let elapsed = now.saturating_duration_since(last);
        self.last = Some(now);
        if elapsed > QUIET {
            self.tokens = BURST;
            self.hits = 0;
            self.warned = false;
            return (Duration::ZERO, false);
        }
        self.tokens = (self.tokens + elapsed.as_secs_f64() * RATE_PER_SEC).min(BURST);
        self.hits += 1;
        let sleep = if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Duration::ZERO
        } else {
            let wait = Duration::from_secs_f64((1.0 - self.tokens) / RATE_PER_SEC).min(MAX_SLEEP);
            self.tokens = 0.0;
            // The sleep is part of this pass; count from its end.
            self.last = Some(now + wait);
            wait
        };
        let warn = self.hits > WARN_AFTER && !self.warned;
        if warn {
            self.warned = true;
        }
        (sleep, warn)
    }
}

fn make_watcher(tx: &Sender<Msg>, targets: &[WatchTarget]) -> Option<notify::RecommendedWatcher> {
    let tx = tx.clone();
    let mut w = match notify::recommended_watcher(move |res| {
        let _ = tx.send(Msg::Fs(res));
    }) {
        Ok(w) => w,
        Err(e) => {
            warn!("cannot create a file watcher, polling instead: {e}");
            return None;
        }
    };
    for t in targets {
        if t.dir.is_dir()
            && let Err(e) = w.watch(&t.dir, RecursiveMode::NonRecursive)
        {
            debug!("not watching {}: {e}", t.dir.display());
        }
    }
    Some(w)
}

fn relevant(ev: &notify::Event, targets: &[WatchTarget]) -> bool {
    // Metadata changes count: a chmod or chown of a guarded file is repaired at once, like a
    // write (only reads and opens are noise).
    if matches!(ev.kind, EventKind::Access(_)) {
        return false;
    }
    ev.paths.iter().any(|p| path_relevant(p, targets))
}

fn path_relevant(p: &Path, targets: &[WatchTarget]) -> bool {
    let dir = p.parent().unwrap_or(Path::new(""));
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    targets.iter().any(|t| {
        (t.dir == dir || t.dir == p)
            && match &t.only {
                None => true,
                Some(only) => *only == name || t.dir == p,
            }
    })
}

/// Drops queued messages (from earlier watchers / our own writes). `true` = a stop was queued.
fn drain(rx: &Receiver<Msg>) -> bool {
    while let Ok(m) = rx.try_recv() {
        if matches!(m, Msg::Stop) {
            return true;
        }
    }
    false
}

/// Waits for a relevant event, the timeout, or a stop. `true` = stop.
fn wait(rx: &Receiver<Msg>, targets: &[WatchTarget], timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Msg::Stop) => return true,
            Ok(Msg::Fs(Ok(ev))) => {
                if relevant(&ev, targets) {
                    debug!(paths = ?ev.paths, kind = ?ev.kind, "change detected");
                    return false;
                }
            }
            Ok(Msg::Fs(Err(e))) => {
                // Istio exits here; re-creating the watcher on the next round is enough.
                warn!("file watcher error: {e}");
                return false;
            }
            Err(RecvTimeoutError::Timeout) => return false,
            Err(RecvTimeoutError::Disconnected) => return true,
        }
    }
}

/// Sleeps for `d` unless a stop arrives (other messages are dropped: we re-check after anyway).
fn sleep(rx: &Receiver<Msg>, d: Duration) -> bool {
    let deadline = Instant::now() + d;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        match rx.recv_timeout(left) {
            Ok(Msg::Stop) | Err(RecvTimeoutError::Disconnected) => return true,
            Ok(Msg::Fs(_)) => {}
            Err(RecvTimeoutError::Timeout) => return false,
        }
    }
}

fn run(installer: &mut Installer, obs: &dyn GuardObserver, tx: Sender<Msg>, rx: Receiver<Msg>) {
    let mut throttle = Throttle::new();
    // After a failed pass or one that found no primary: how long to wait for a change, and the
    // inputs that pass saw (a change that slipped in before the new watcher voids the hold).
    let mut hold: Option<(Duration, Fingerprint)> = None;
    let mut retry = FAILED_PASS_RETRY.delays();
    let mut ready = false;
    let mut waiting_logged: Option<String> = None;
    loop {
        if drain(&rx) {
            return;
        }
        // Recomputed every round: a symlinked config can start pointing somewhere else.
        let targets = installer.watch_targets();
        let watcher = make_watcher(&tx, &targets);
        let poll = if watcher.is_some() {
            RESYNC
        } else {
            Duration::from_secs(1)
        };
        match installer.validate() {
            Ok(()) => {
                if !ready {
                    ready = true;
                    obs.set_ready(true);
                    obs.pass_result(None);
                    info!("istio-cni is installed; watching for changes");
                }
                retry = FAILED_PASS_RETRY.delays();
                hold = None;
                if wait(&rx, &targets, poll) {
                    return;
                }
                continue;
            }
            Err(reason) => {
                if let Some((d, seen)) = hold.take()
                    && seen == installer.inputs_fingerprint()
                {
                    // Nothing changed since that pass: wait for a change (or the retry delay).
                    if wait(&rx, &targets, d.min(poll)) {
                        return;
                    }
                    continue;
                }
                debug!("install is not valid: {reason}");
            }
        }
        if ready {
            ready = false;
            obs.set_ready(false);
        }
        let (delay, warn_now) = throttle.next(Instant::now());
        if warn_now {
            let file = installer
                .conf_path()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "the CNI config".to_string());
            let hint = if file.contains("cilium") {
                " (Cilium: set cni.exclusive=false)"
            } else {
                ""
            };
            warn!(
                "{file} keeps being changed and re-installed; another component is probably \
                 reverting it{hint}"
            );
        }
        drop(watcher);
        if !delay.is_zero() && sleep(&rx, delay) {
            return;
        }
        let seen = installer.inputs_fingerprint();
        match installer.install_all() {
            Ok(InstallPass::Installed) => {
                waiting_logged = None;
                obs.installed();
            }
            Ok(InstallPass::WaitingForPrimary(what)) => {
                if waiting_logged.as_deref() != Some(what.as_str()) {
                    info!("{what}");
                    waiting_logged = Some(what);
                }
                hold = Some((Duration::from_secs(5), seen));
            }
            Err(e) => {
                report_failure(obs, &e);
                let delay = retry.next().unwrap_or(FAILED_PASS_RETRY.max);
                hold = Some((delay, seen));
            }
        }
    }
}

fn report_failure(obs: &dyn GuardObserver, e: &InstallError) {
    obs.pass_result(Some(e.metric_label()));
    error!("install pass failed (will retry): {e}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn throttle_allows_a_burst_then_paces_and_warns_once() {
        let mut t = Throttle::new();
        let start = Instant::now();
        assert_eq!(t.next(start), (Duration::ZERO, false));
        let mut slept = Duration::ZERO;
        let mut warnings = 0;
        let mut now = start;
        for _ in 0..100 {
            let (d, w) = t.next(now);
            slept += d;
            now += d;
            warnings += usize::from(w);
        }
        // 10 free passes, then 1/50 s each for the other 90.
        assert!(
            slept >= Duration::from_millis(1700) && slept <= Duration::from_millis(1900),
            "{slept:?}"
        );
        assert_eq!(warnings, 1);
        // After a quiet period the burst resets, and the warning may come again.
        let later = now + Duration::from_secs(6);
        assert_eq!(t.next(later), (Duration::ZERO, false));
    }

    #[test]
    fn failed_pass_retries_double_to_five_seconds_with_jitter() {
        let delays: Vec<Duration> = FAILED_PASS_RETRY.delays().take(8).collect();
        let bases_ms = [100, 200, 400, 800, 1600, 3200, 5000, 5000];
        for (d, base) in delays.iter().zip(bases_ms) {
            let base = Duration::from_millis(base);
            let slack = Duration::from_micros(1);
            assert!(
                *d + slack >= base / 2 && *d <= base + slack,
                "{d:?} vs {base:?}"
            );
        }
        let again: Vec<Duration> = FAILED_PASS_RETRY.delays().take(8).collect();
        assert_ne!(delays, again, "jittered");
    }

    fn rel(p: &str, dir: &str, only: Option<&str>) -> bool {
        let t = [WatchTarget {
            dir: PathBuf::from(dir),
            only: only.map(str::to_string),
        }];
        path_relevant(Path::new(p), &t)
    }

    #[test]
    fn path_filter() {
        assert!(rel("/b/istio-cni", "/b", Some("istio-cni")));
        assert!(!rel("/b/bridge", "/b", Some("istio-cni")));
        assert!(rel("/b", "/b", Some("istio-cni")));
        assert!(rel("/n/x.conf", "/n", None));
        assert!(!rel("/o/x.conf", "/n", None));
    }
}
