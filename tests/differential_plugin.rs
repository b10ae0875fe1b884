//! Differential conformance of the CNI plugin against Istio's own (`target/istio/istio-cni`, built
//! by scripts/build-istio): the same generated pod (annotations, labels, proxy container, host
//! network, namespace, ambient and nftables switches; [`plugin_gen`]) is created on the real
//! API server (`istio_cni_testing::controlplane`, with its status podIP), then ADDed by each
//! plugin into a fresh network namespace of its own through the same chain (`bridge` with
//! `static` IPAM, then the plugin with that prevResult and the CNI variables), each with the same
//! config but its own run dir and kubeconfig. Compared: the exit code and the result on stdout
//! (error messages aside: their words are ours), the kernel state afterwards (iptables-save of
//! both flavours and families without counters, `nft list ruleset`, policy rules, routes, lo's
//! IPv6 address), then the same after the chain's DEL.
//!
//! Seeded (a fixed seed by default, `ISTIO_PLUGIN_DIFF_SEED` picks another; `ISTIO_PLUGIN_DIFF_CASES`, `_JOBS`);
//! a failing case is shrunk by dropping its items one at a time. Deliberate differences are in
//! tests/differential/plugin_allowlist.json, each naming the behaviour, why ours differs and the
//! docs line that tells operators (checked to exist); the test fails on a difference no entry
//! explains and on an entry that explained no case.

mod cni_driver;

#[path = "differential/parallel.rs"]
mod parallel;
#[path = "differential/plugin_gen.rs"]
mod plugin_gen;
#[path = "differential/plugin_run.rs"]
mod plugin_run;
#[path = "differential/suite.rs"]
mod suite;

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use serde_json::Value;

use plugin_gen::PodCase;
use plugin_run::{Outcome, World};

const DEFAULT_CASES: u64 = 300;
/// Below this many cases an entry may go unused by chance: stale entries are checked from here.
const STALE_CHECK_FROM: u64 = 200;
/// Re-runs a shrink may spend on one failing case.
const SHRINK_BUDGET: usize = 40;

/// One allowlisted deliberate difference.
struct Entry {
    id: String,
    /// The compared parts that may differ ([`Outcome::differences`] names them).
    aspects: Vec<String>,
    /// Any of these in one of the case's `key=value` words.
    input: Vec<String>,
    /// Any of these in Istio's stdout or stderr.
    istio_said: Vec<String>,
    /// Any of these in our stdout or stderr.
    ours_said: Vec<String>,
    /// A named property of the case ([`holds`]).
    when: Option<String>,
}

/// The case properties an entry's `when` can name.
const PREDICATES: &[&str] = &["repeated-list-item"];

fn holds(predicate: &str, case: &PodCase) -> bool {
    match predicate {
        "repeated-list-item" => case.annotations.iter().any(|(_, v)| {
            let items: Vec<&str> = v.split(',').map(str::trim).collect();
            (1..items.len()).any(|i| items[..i].contains(&items[i]))
        }),
        _ => false,
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Loads the allowlist (tests/differential/suite.rs checks each entry's why and docs line).
fn allowlist() -> Vec<Entry> {
    let mut entries = Vec::new();
    for (id, e) in suite::allowlist("plugin_allowlist.json") {
        let m = &e["match"];
        if let Some(w) = m["when"].as_str() {
            assert!(
                PREDICATES.contains(&w),
                "plugin allowlist entry {id}: unknown when {w:?}"
            );
        }
        entries.push(Entry {
            id,
            aspects: strings(&m["aspects"]),
            input: strings(&m["input"]),
            istio_said: strings(&m["istio_said"]),
            ours_said: strings(&m["ours_said"]),
            when: m["when"].as_str().map(String::from),
        });
    }
    entries
}

/// For each difference of this case the first entry that explains it (by index); `None` when
/// one is explained by no entry.
fn explain(
    entries: &[Entry],
    case: &PodCase,
    istio: &Outcome,
    ours: &Outcome,
) -> Option<Vec<usize>> {
    let words = case.words();
    let said = |o: &Outcome, s: &String| o.output().contains(s.as_str());
    let applies = |e: &Entry| {
        (e.input.is_empty() || e.input.iter().any(|i| words.iter().any(|w| w.contains(i))))
            && (e.istio_said.is_empty() || e.istio_said.iter().any(|s| said(istio, s)))
            && (e.ours_said.is_empty() || e.ours_said.iter().any(|s| said(ours, s)))
            && e.when.as_deref().is_none_or(|w| holds(w, case))
    };
    let mut used = Vec::new();
    for d in istio.differences(ours) {
        let at = entries
            .iter()
            .position(|e| e.aspects.contains(&d) && applies(e))?;
        if !used.contains(&at) {
            used.push(at);
        }
    }
    Some(used)
}

/// Runs both plugins on a case; `Some` when they differ and no entry explains it.
fn unexplained(
    world: &World,
    entries: &[Entry],
    case: &PodCase,
    slot: usize,
) -> Option<(Outcome, Outcome)> {
    let (istio, ours) = world.run_both(case, slot);
    (!istio.differences(&ours).is_empty() && explain(entries, case, &istio, &ours).is_none())
        .then_some((istio, ours))
}

/// Drops items one at a time while the case still differs unexplained; the smallest found.
fn shrink(world: &World, entries: &[Entry], case: &PodCase) -> Option<(PodCase, Outcome, Outcome)> {
    let failing = unexplained(world, entries, case, 0)?;
    let (small, (istio, ours)) = suite::shrink(
        case.clone(),
        failing,
        SHRINK_BUDGET,
        PodCase::smaller,
        |c| unexplained(world, entries, c, 0),
    );
    Some((small, istio, ours))
}

fn report(seed: u64, index: u64, case: &PodCase, istio: &Outcome, ours: &Outcome) -> String {
    let mut s = format!(
        "case {index} (ISTIO_PLUGIN_DIFF_SEED={seed}), shrunk to: {:?}\n  differs in: {:?}\n",
        case.words(),
        istio.differences(ours)
    );
    s += &istio.side_by_side(ours);
    s
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
    })
}

/// The seed of a run without ISTIO_PLUGIN_DIFF_SEED.
const DEFAULT_SEED: u64 = 42;

#[test]
fn plugin_matches_istio_on_generated_pods() {
    cni_driver::require_root();
    let entries = allowlist();
    // A fixed default seed: the same cases every run, so the suite cannot flake on a draw; the
    // env var explores other draws.
    let seed = env_u64("ISTIO_PLUGIN_DIFF_SEED").unwrap_or(DEFAULT_SEED);
    let count = env_u64("ISTIO_PLUGIN_DIFF_CASES").unwrap_or(DEFAULT_CASES);
    let jobs = env_u64("ISTIO_PLUGIN_DIFF_JOBS").unwrap_or(2).max(1) as usize;
    eprintln!(
        "differential istio-cni: seed {seed} (ISTIO_PLUGIN_DIFF_SEED={seed} reproduces), {count} cases, {jobs} jobs"
    );
    let world = World::new(jobs);
    let start = Instant::now();
    let next = AtomicUsize::new(0);
    let hits = Mutex::new(vec![0usize; entries.len()]);
    let failures: Mutex<Vec<(u64, Outcome, Outcome)>> = Mutex::new(Vec::new());
    let added = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for slot in 0..jobs {
            let (world, entries, next, hits, failures, added) =
                (&world, &entries, &next, &hits, &failures, &added);
            s.spawn(move || {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed) as u64;
                    if index >= count {
                        break;
                    }
                    let case = plugin_gen::case(seed, index);
                    let (istio, ours) = world.run_both(&case, slot);
                    if istio.changed_netns() {
                        added.fetch_add(1, Ordering::Relaxed);
                    }
                    if istio.differences(&ours).is_empty() {
                        continue;
                    }
                    match explain(entries, &case, &istio, &ours) {
                        Some(used) => {
                            let mut hits = hits.lock().unwrap();
                            for at in used {
                                hits[at] += 1;
                            }
                        }
                        None => failures.lock().unwrap().push((index, istio, ours)),
                    }
                }
            });
        }
    });
    let wall = start.elapsed();
    let hits = hits.into_inner().unwrap();
    let failures = failures.into_inner().unwrap();
    eprintln!(
        "{count} cases in {wall:.1?} ({} where Istio's plugin wrote rules)",
        added.load(Ordering::Relaxed)
    );
    let hits: Vec<(&str, usize)> = entries.iter().map(|e| e.id.as_str()).zip(hits).collect();
    let verdict = parallel::Verdict {
        against: "Istio's plugin",
        list: "plugin allowlist",
        show: (
            env_u64("ISTIO_PLUGIN_DIFF_SHOW").unwrap_or(3) as usize,
            "ISTIO_PLUGIN_DIFF_SHOW",
        ),
        seed,
        count,
        stale_check: count >= STALE_CHECK_FROM,
    };
    verdict.assert(
        failures,
        &hits,
        |index| {
            let case = plugin_gen::case(seed, index);
            let (small, istio, ours) = shrink(&world, &entries, &case)?;
            Some(report(seed, index, &small, &istio, &ours))
        },
        |index, istio, ours| report(seed, index, &plugin_gen::case(seed, index), istio, ours),
    );
}
