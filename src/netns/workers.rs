//! The threads that do work inside another network namespace. Each is a dedicated thread (never
//! a tokio one): it enters the target for one piece of work and goes back to the process's own
//! namespace before it takes the next, so an idle worker holds no pod's namespace alive. Creating
//! a thread per piece of work cost more than the work (a stack mapped, faulted and unmapped several
//! times per ambient ADD); these are kept, at most [`KEEP_IDLE`] of them idle. A worker that cannot
//! get back home ends instead of being reused: no later work can run in a namespace it did not ask
//! for.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, LazyLock};

use nix::sched::{CloneFlags, setns};
use parking_lot::Mutex;

use super::{NetnsError, panic_text};

/// Idle workers kept for reuse; more run at once when asked (each ends when not kept).
const KEEP_IDLE: usize = 4;

type Job = Box<dyn FnOnce() -> bool + Send>;

/// A worker waiting for a job; `true` back from a job = it is home again and may be reused.
struct Worker {
    jobs: mpsc::Sender<Job>,
}

static IDLE: LazyLock<Mutex<Vec<Worker>>> = LazyLock::new(|| Mutex::new(Vec::new()));

/// The process's own network namespace (the main thread's, which never moves): where every
/// worker starts and returns to, whichever thread first asked for it.
fn home() -> Result<&'static OwnedFd, std::io::Error> {
    static HOME: LazyLock<Result<OwnedFd, String>> = LazyLock::new(|| {
        File::open("/proc/self/ns/net")
            .map(OwnedFd::from)
            .map_err(|e| e.to_string())
    });
    HOME.as_ref().map_err(|e| std::io::Error::other(e.clone()))
}

fn spawn_worker() -> Result<Worker, std::io::Error> {
    let home = home()?;
    let (jobs, queue) = mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name("netns".into())
        .spawn(move || {
            // Started by a thread that may itself be inside some pod's namespace.
            if setns(home, CloneFlags::CLONE_NEWNET).is_err() {
                return;
            }
            while let Ok(job) = queue.recv() {
                if !job() {
                    return;
                }
            }
        })?;
    Ok(Worker { jobs })
}

/// What a job reports: the work's outcome, and whether its worker got back home (and so may be
/// kept for the next job).
type Answer<T> = (Result<T, NetnsError>, bool);

fn thread_failed(path: &Path, reason: String) -> NetnsError {
    NetnsError::Thread {
        path: path.to_path_buf(),
        reason,
    }
}

/// The job that runs `work` inside `net` and hands its answer to `deliver`; a panic in `work` is
/// its error (the worker survives it).
fn job_for<T, F>(
    net: Arc<OwnedFd>,
    path: &Path,
    work: F,
    deliver: impl FnOnce(Answer<T>) + Send + 'static,
) -> Result<Job, NetnsError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let home =
        home().map_err(|e| thread_failed(path, format!("cannot open our own netns: {e}")))?;
    let owned_path: PathBuf = path.to_path_buf();
    Ok(Box::new(move || {
        let outcome = match setns(&*net, CloneFlags::CLONE_NEWNET) {
            Err(source) => Err(NetnsError::Enter {
                path: owned_path.clone(),
                source,
            }),
            Ok(()) => {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).map_err(|panic| {
                    NetnsError::Thread {
                        path: owned_path.clone(),
                        reason: panic_text(panic.as_ref()).unwrap_or("panic").to_string(),
                    }
                })
            }
        };
        let back_home = setns(home, CloneFlags::CLONE_NEWNET).is_ok();
        deliver((outcome, back_home));
        back_home
    }))
}

/// Gives `job` to an idle worker, else a new one (a worker whose thread ended hands it back).
fn hand_over(mut job: Job, path: &Path) -> Result<Worker, NetnsError> {
    loop {
        let worker = match IDLE.lock().pop() {
            Some(w) => w,
            None => spawn_worker().map_err(|e| thread_failed(path, e.to_string()))?,
        };
        match worker.jobs.send(job) {
            Ok(()) => return Ok(worker),
            Err(mpsc::SendError(returned)) => job = returned,
        }
    }
}

/// After its answer: a worker that got home is kept for reuse (up to [`KEEP_IDLE`]).
fn settle<T>(worker: Worker, (outcome, back_home): Answer<T>) -> Result<T, NetnsError> {
    if back_home {
        let mut idle = IDLE.lock();
        if idle.len() < KEEP_IDLE {
            idle.push(worker);
        }
    }
    outcome
}

/// Runs `work` inside the namespace `net` on a worker and returns its result, blocking the
/// calling thread until then.
pub(super) fn run_in<T, F>(net: Arc<OwnedFd>, path: &Path, work: F) -> Result<T, NetnsError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let (answer, result) = mpsc::sync_channel::<Answer<T>>(1);
    let job = job_for(net, path, work, move |a| {
        let _ = answer.send(a);
    })?;
    let worker = hand_over(job, path)?;
    let answered = result
        .recv()
        .map_err(|_| thread_failed(path, "the worker thread ended".into()))?;
    settle(worker, answered)
}

/// [`run_in`] for async callers: the caller's task waits, its thread does not (the plugin's
/// one-thread runtime needs no blocking-pool thread beside the worker). Dropped before the
/// answer, the work still finishes and its worker ends instead of being kept.
pub(super) async fn run_in_async<T, F>(
    net: Arc<OwnedFd>,
    path: PathBuf,
    work: F,
) -> Result<T, NetnsError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let (answer, result) = tokio::sync::oneshot::channel::<Answer<T>>();
    let job = job_for(net, &path, work, move |a| {
        let _ = answer.send(a);
    })?;
    let worker = hand_over(job, &path)?;
    let answered = result
        .await
        .map_err(|_| thread_failed(&path, "the worker thread ended".into()))?;
    settle(worker, answered)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netns::Netns;

    fn scratch_netns() -> Netns {
        // A namespace of our own, held by a thread parked inside it until the handle is open.
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            nix::sched::unshare(CloneFlags::CLONE_NEWNET).expect("unshare (root needed)");
            tx.send(Netns::current().unwrap()).unwrap();
        });
        rx.recv().unwrap()
    }

    #[test]
    fn work_runs_inside_the_target_and_the_worker_comes_back_for_the_next() {
        let ours = Netns::current().unwrap().id();
        let (a, b) = (scratch_netns(), scratch_netns());
        for _ in 0..3 {
            assert_eq!(a.run(|| Netns::current().unwrap().id()).unwrap(), a.id());
            assert_eq!(b.run(|| Netns::current().unwrap().id()).unwrap(), b.id());
        }
        // The calling thread never moved.
        assert_eq!(Netns::current().unwrap().id(), ours);
        // A nested run (work inside a that runs work inside b) comes back to a, then home.
        let b2 = Arc::new(b);
        let inner = b2.clone();
        let (seen_b, after) = a
            .run(move || {
                let seen = inner.run(|| Netns::current().unwrap().id()).unwrap();
                (seen, Netns::current().unwrap().id())
            })
            .unwrap();
        assert_eq!((seen_b, after), (b2.id(), a.id()));
    }

    #[test]
    fn async_work_runs_inside_the_target_without_moving_the_runtime_thread() {
        let ours = Netns::current().unwrap().id();
        let a = scratch_netns();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let seen = rt
            .block_on(a.run_async(|| Netns::current().unwrap().id()))
            .unwrap();
        assert_eq!(seen, a.id());
        assert_eq!(Netns::current().unwrap().id(), ours);
        let err = rt
            .block_on(a.run_async(|| -> u32 { panic!("bang") }))
            .unwrap_err();
        assert!(err.to_string().contains("bang"), "{err}");
    }

    #[test]
    fn a_panic_in_the_work_is_its_error_and_the_next_work_still_runs() {
        let a = scratch_netns();
        let err = a.run(|| -> u32 { panic!("boom") }).unwrap_err();
        assert!(err.to_string().contains("boom"), "{err}");
        assert_eq!(a.run(|| 7).unwrap(), 7);
    }

    #[test]
    fn an_idle_worker_holds_no_pod_namespace() {
        let a = scratch_netns();
        a.run(|| ()).unwrap();
        // Every worker thread is back out of the pod's namespace once its work is answered.
        let tasks = std::fs::read_dir("/proc/self/task").unwrap();
        for task in tasks.flatten() {
            let name = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            if name.trim() == "netns"
                && let Ok(ns) = Netns::open(&task.path().join("ns/net"))
            {
                assert_ne!(
                    ns.id(),
                    a.id(),
                    "an idle worker still inside the pod's netns"
                );
            }
        }
    }
}
