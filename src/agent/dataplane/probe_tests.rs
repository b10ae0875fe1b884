use std::net::IpAddr;
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use super::*;
use crate::apply::exec::{Cmd, CmdOutput, Executor, SpawnError};

/// Sets in memory, counting what the batcher asks of them.
#[derive(Default)]
struct FakeSets {
    entries: Mutex<Entries>,
    calls: Mutex<Calls>,
    /// An add of this IP fails (the whole batch it is in, as `ipset restore` would).
    poison: Option<IpAddr>,
    /// How long an apply takes (lets concurrent requests pile up).
    apply_time: Duration,
}

#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
struct Calls {
    ensure: usize,
    read: usize,
    apply: usize,
}

impl FakeSets {
    fn calls(&self) -> Calls {
        *self.calls.lock().unwrap()
    }
}

impl ProbeSets for FakeSets {
    fn ensure(&self, _: &mut dyn Executor, _: bool) -> Result<(), ApplyError> {
        self.calls.lock().unwrap().ensure += 1;
        Ok(())
    }
    fn entries(&self, _: &mut dyn Executor) -> Result<Entries, ApplyError> {
        self.calls.lock().unwrap().read += 1;
        Ok(self.entries.lock().unwrap().clone())
    }
    fn apply(&self, _: &mut dyn Executor, ops: &[SetOp]) -> Result<(), ApplyError> {
        self.calls.lock().unwrap().apply += 1;
        std::thread::sleep(self.apply_time);
        let poisoned = ops
            .iter()
            .any(|op| matches!(op, SetOp::Add { ip, .. } if Some(*ip) == self.poison));
        if poisoned {
            return Err(ApplyError::Failed {
                command: "ipset -exist restore".into(),
                code: Some(1),
                stderr: "bad entry".into(),
            });
        }
        probe_set::apply_to(&mut self.entries.lock().unwrap(), ops);
        Ok(())
    }
}

struct NoProcesses;

impl Executor for NoProcesses {
    fn run(&mut self, cmd: &Cmd) -> Result<CmdOutput, SpawnError> {
        panic!("no process expected, got {}", cmd.display())
    }
}

fn ip(i: usize) -> IpAddr {
    format!("10.9.{}.{}", i / 250, i % 250 + 1).parse().unwrap()
}

fn add(uid: &str, ips: Vec<IpAddr>) -> Request {
    let uid = uid.to_string();
    Request {
        label: format!("add pod {uid}"),
        fresh: false,
        plan: Box::new(move |current| (probe_set::plan_upsert(current, &uid, &ips), vec![])),
    }
}

fn submit(b: &Batcher, sets: &FakeSets, r: Request) -> Result<(), ApplyError> {
    b.submit(r, false, |job| Ok(job.execute(sets, &mut NoProcesses)))
        .expect("the batch ran")
}

#[test]
fn a_steady_state_change_costs_one_apply_and_no_read() {
    let (b, sets) = (Batcher::default(), FakeSets::default());
    submit(&b, &sets, add("a", vec![ip(1)])).unwrap();
    assert_eq!(
        sets.calls(),
        Calls {
            ensure: 1,
            read: 1,
            apply: 1
        }
    );
    submit(&b, &sets, add("b", vec![ip(2)])).unwrap();
    submit(&b, &sets, add("c", vec![ip(3)])).unwrap();
    assert_eq!(
        sets.calls(),
        Calls {
            ensure: 1,
            read: 1,
            apply: 3
        }
    );
    // Already present with this UID: nothing to apply at all.
    submit(&b, &sets, add("c", vec![ip(3)])).unwrap();
    assert_eq!(sets.calls().apply, 3);
}

#[test]
fn concurrent_changes_share_batches_and_all_land() {
    let b = Arc::new(Batcher::default());
    let sets = Arc::new(FakeSets {
        apply_time: Duration::from_millis(20),
        ..Default::default()
    });
    let n = 40;
    let start = Arc::new(Barrier::new(n));
    let threads: Vec<_> = (0..n)
        .map(|i| {
            let (b, sets, start) = (b.clone(), sets.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                submit(&b, &sets, add(&format!("uid-{i}"), vec![ip(i)]))
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap().unwrap();
    }
    let entries = sets.entries.lock().unwrap().clone();
    assert_eq!(entries.len(), n);
    assert!((0..n).all(|i| entries[&ip(i)] == format!("uid-{i}")));
    let applies = sets.calls().apply;
    assert!(
        applies < n / 2,
        "{applies} applies for {n} concurrent changes: not batched"
    );
}

#[test]
fn a_reused_ip_in_one_batch_ends_with_the_later_uid() {
    let (b, sets) = (Batcher::default(), FakeSets::default());
    let (old, new) = (add("old", vec![ip(1)]), add("new", vec![ip(1)]));
    // Both queued before either runs: the second is planned against the first's outcome.
    lock(&b.queue).push(Pending {
        request: old,
        done: mpsc::channel().0,
    });
    submit(&b, &sets, new).unwrap();
    assert_eq!(sets.entries.lock().unwrap()[&ip(1)], "new");
    assert_eq!(sets.calls().apply, 1);
}

#[test]
fn a_failing_change_fails_alone_and_the_next_batch_reads_again() {
    let (b, sets) = (
        Batcher::default(),
        FakeSets {
            poison: Some(ip(66)),
            ..Default::default()
        },
    );
    submit(&b, &sets, add("a", vec![ip(1)])).unwrap();
    let (tx, rx) = mpsc::channel();
    lock(&b.queue).push(Pending {
        request: add("good", vec![ip(2)]),
        done: tx,
    });
    let err = submit(&b, &sets, add("bad", vec![ip(66)])).unwrap_err();
    assert!(err.to_string().contains("bad entry"), "{err}");
    rx.recv()
        .unwrap()
        .expect("the good change landed on its own");
    let entries = sets.entries.lock().unwrap().clone();
    assert!(entries.contains_key(&ip(2)) && !entries.contains_key(&ip(66)));
    let reads = sets.calls().read;
    submit(&b, &sets, add("c", vec![ip(3)])).unwrap();
    assert_eq!(
        sets.calls().read,
        reads + 1,
        "after a failure the sets are read again"
    );
}

#[test]
fn a_fresh_request_reads_the_sets_whatever_is_remembered() {
    let (b, sets) = (Batcher::default(), FakeSets::default());
    submit(&b, &sets, add("a", vec![ip(1)])).unwrap();
    // Someone else removed the entry behind our back.
    sets.entries.lock().unwrap().clear();
    let mut sync = add("a", vec![ip(1)]);
    sync.fresh = true;
    submit(&b, &sets, sync).unwrap();
    assert_eq!(sets.calls().read, 2);
    assert_eq!(sets.entries.lock().unwrap()[&ip(1)], "a");
}

#[test]
fn a_batch_that_cannot_run_fails_every_request_in_it() {
    let b = Batcher::default();
    let (tx, rx) = mpsc::channel();
    lock(&b.queue).push(Pending {
        request: add("other", vec![ip(2)]),
        done: tx,
    });
    let err = b
        .submit(add("a", vec![ip(1)]), false, |_| {
            Err("cannot enter the host netns".into())
        })
        .unwrap_err();
    assert!(err.to_string().contains("host netns"), "{err}");
    assert!(
        rx.recv().is_err(),
        "the other request learns it got no result"
    );
}
