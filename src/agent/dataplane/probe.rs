//! Probe-set changes from concurrent adds and removes, applied in batches (group commit).
//!
//! Every enrolment adds its pod's IPs to the host probe sets, so with a hundred pods starting at
//! once the sets are the node's one shared write point. Reading the sets and starting a process
//! per pod under one lock made every ADD wait for all the ADDs before it. Here a change is queued;
//! the first thread to find the sets idle takes every queued change, plans them in queue order
//! against what it knows of the sets, and applies them in ONE batch (one `ipset restore` or one
//! nft transaction, as before); the others find their change done when they get their turn.
//!
//! What is known of the sets (created? which entries?) is kept between batches, so a steady-state
//! batch costs one process and no read. It is forgotten when a batch fails (the next one reads
//! again), and a reconcile (`fresh`) always reads first: the kernel, not the memory, is the truth.
//! A failed batch is retried one change at a time, so one bad change fails alone.

use std::sync::{Mutex, mpsc};

use crate::apply::exec::Executor;
use crate::apply::iptables::ApplyError;
use crate::apply::probe_set::{self, Entries, ProbeSets, SetOp};

/// Plans one change against the current entries: the operations, and warnings to log.
pub type Plan = Box<dyn FnOnce(&Entries) -> (Vec<SetOp>, Vec<String>) + Send>;

/// One queued change.
pub struct Request {
    /// What the change is, for logs and errors (`add pod <uid>`).
    pub label: String,
    /// Read the sets before planning, whatever is remembered (reconciles).
    pub fresh: bool,
    pub plan: Plan,
}

/// What is remembered of the sets between batches.
#[derive(Debug, Default)]
pub struct Known {
    ensured: bool,
    entries: Option<Entries>,
}

/// The work of one batch, run where the sets live (the host netns).
pub struct Job {
    known: Known,
    requests: Vec<(String, bool, Plan)>,
    ipv6: bool,
}

/// A batch's outcome: what is now known, and one result per request, in order.
pub struct Done {
    known: Known,
    results: Vec<Result<(), ApplyError>>,
}

impl Job {
    /// Plans every request in order against the sets, then applies them all at once; when that
    /// fails, reads the sets again and applies each request on its own.
    pub fn execute(self, sets: &dyn ProbeSets, exec: &mut dyn Executor) -> Done {
        let Job {
            mut known,
            requests,
            ipv6,
        } = self;
        let n = requests.len();
        let fresh = requests.iter().any(|(_, fresh, _)| *fresh);
        if let Err(e) = prepare(&mut known, sets, exec, ipv6, fresh) {
            return Done {
                known: Known::default(),
                results: fail_all(n, &e),
            };
        }
        let mut working = known.entries.clone().unwrap_or_default();
        let mut planned = Vec::with_capacity(n);
        for (label, _, plan) in requests {
            let (ops, warnings) = plan(&working);
            for w in &warnings {
                tracing::warn!(step = %label, "{w}");
            }
            probe_set::apply_to(&mut working, &ops);
            planned.push(ops);
        }
        let all: Vec<SetOp> = planned.iter().flatten().cloned().collect();
        if all.is_empty() || sets.apply(exec, &all).is_ok() {
            known.entries = Some(working);
            return Done {
                known,
                results: (0..n).map(|_| Ok(())).collect(),
            };
        }
        // One change at a time, each planned again against what the kernel now holds.
        let mut known = Known::default();
        if let Err(e) = prepare(&mut known, sets, exec, ipv6, true) {
            return Done {
                known: Known::default(),
                results: fail_all(n, &e),
            };
        }
        let mut entries = known.entries.take().unwrap_or_default();
        let mut results = Vec::with_capacity(n);
        for ops in planned {
            let ops = replan(&entries, &ops);
            let result = sets.apply(exec, &ops);
            if result.is_ok() {
                probe_set::apply_to(&mut entries, &ops);
            }
            results.push(result);
        }
        // After a failure, nothing is assumed: the next batch reads the sets again.
        Done {
            known: Known::default(),
            results,
        }
    }
}

/// Creates the sets and reads their entries unless both are known (and `fresh` is not asked).
fn prepare(
    known: &mut Known,
    sets: &dyn ProbeSets,
    exec: &mut dyn Executor,
    ipv6: bool,
    fresh: bool,
) -> Result<(), ApplyError> {
    if !known.ensured {
        sets.ensure(exec, ipv6)?;
        known.ensured = true;
    }
    if fresh || known.entries.is_none() {
        known.entries = Some(sets.entries(exec)?);
    }
    Ok(())
}

/// A request's operations adjusted to the entries actually present: deletes of absent entries
/// and adds of entries already held by the same UID are dropped (both would be no-ops).
fn replan(current: &Entries, ops: &[SetOp]) -> Vec<SetOp> {
    ops.iter()
        .filter(|op| match op {
            SetOp::Del { ip } => current.contains_key(ip),
            SetOp::Add { ip, uid } => current.get(ip) != Some(uid),
        })
        .cloned()
        .collect()
}

fn fail_all(n: usize, e: &ApplyError) -> Vec<Result<(), ApplyError>> {
    (0..n)
        .map(|_| {
            Err(ApplyError::Failed {
                command: "reading the probe sets".into(),
                code: None,
                stderr: e.to_string(),
            })
        })
        .collect()
}

struct Pending {
    request: Request,
    done: mpsc::Sender<Result<(), ApplyError>>,
}

/// The queue of probe-set changes and what is known of the sets.
#[derive(Default)]
pub struct Batcher {
    queue: Mutex<Vec<Pending>>,
    /// Held by the thread running a batch.
    known: Mutex<Known>,
}

/// Why a request got no result of its own: the batch it was in could not run at all.
#[derive(Debug, thiserror::Error)]
#[error("the probe-set batch could not run: {0}")]
pub struct BatchNotRun(pub String);

impl Batcher {
    /// Forgets what is known of the sets (they were recreated behind our back): the next batch
    /// creates and reads them again.
    pub fn forget(&self) {
        *lock(&self.known) = Known::default();
    }

    /// Queues `request` and returns once it was applied, by this thread or in another thread's
    /// batch. `run` executes a batch where the sets live; it is called only when this thread
    /// runs the batch.
    pub fn submit(
        &self,
        request: Request,
        ipv6: bool,
        run: impl FnOnce(Job) -> Result<Done, String>,
    ) -> Result<Result<(), ApplyError>, BatchNotRun> {
        let (done, result) = mpsc::channel();
        lock(&self.queue).push(Pending { request, done });
        let mut known = lock(&self.known);
        // A batch that ran while this thread waited for the lock may have taken the request.
        match result.try_recv() {
            Ok(r) => return Ok(r),
            Err(mpsc::TryRecvError::Disconnected) => {
                return Err(BatchNotRun("the batch it was in could not run".into()));
            }
            Err(mpsc::TryRecvError::Empty) => {}
        }
        let batch = std::mem::take(&mut *lock(&self.queue));
        let (requests, senders): (Vec<_>, Vec<_>) = batch
            .into_iter()
            .map(|p| {
                let r = p.request;
                ((r.label, r.fresh, r.plan), p.done)
            })
            .unzip();
        let job = Job {
            known: std::mem::take(&mut *known),
            requests,
            ipv6,
        };
        match run(job) {
            Ok(out) => {
                *known = out.known;
                for (sender, r) in senders.into_iter().zip(out.results) {
                    let _ = sender.send(r);
                }
            }
            Err(reason) => {
                drop(senders);
                return Err(BatchNotRun(reason));
            }
        }
        drop(known);
        result
            .recv()
            .map_err(|_| BatchNotRun("the batch ended without an answer".into()))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
#[path = "probe_tests.rs"]
mod tests;
