//! Differential conformance of the rule tool: Istio's own `pilot-agent istio-iptables` (built
//! from the `istio.io/istio` module by scripts/build-istio) and ours run on the same generated
//! flags and variables, on the same pinned host (tests/differential/sandbox.rs), and must agree:
//! both refuse, or both accept and print the same rules (Istio's dry-run transcript, or the
//! nftables transaction it logs, against our stdout, trimmed as the goldens are).
//!
//! Deliberate differences are listed in tests/differential/allowlist.json, each with why and the
//! docs line that tells operators; the test fails on a difference no entry explains and on an
//! entry nothing in the run needs any more. Seeded: a fixed seed by default, ISTIO_DIFF_SEED picks
//! another (the seed is printed), ISTIO_DIFF_CASES sets the count (default 5000), ISTIO_DIFF_JOBS the parallelism.
//! A failing case is shrunk (tokens dropped one at a time while it still fails) before it is shown.

use std::process::{Command, Output};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

#[path = "differential/gen.rs"]
mod generator;
#[path = "differential/parallel.rs"]
mod parallel;
#[path = "differential/sandbox.rs"]
mod sandbox;
#[path = "differential/suite.rs"]
mod suite;

use generator::{Case, Token};
use istio_cni_testing::istio::istio_bin;
use sandbox::Sandbox;

const DEFAULT_CASES: u64 = 5000;
/// Below this many cases an allowlist entry may go unused by chance, so stale entries are only
/// reported from this count on.
const STALE_CHECK_FROM: u64 = 2000;

/// What one tool did with a case.
#[derive(Debug, Clone)]
struct Outcome {
    ok: bool,
    code: Option<i32>,
    /// The rules it would program (trimmed).
    rules: String,
    stdout: String,
    stderr: String,
    took: Duration,
}

impl Outcome {
    fn verdict(&self) -> &'static str {
        if self.ok { "accept" } else { "refuse" }
    }
}

/// Istio's run: the dry-run transcript from DRY_RUN_FILE_PATH (its stdout carries logs), or,
/// with nftables (where Istio ignores --dry-run and programs the sandbox namespace), the
/// transaction it logs.
fn run_istio(sb: &Sandbox, case: &Case, slot: usize) -> Outcome {
    let file = sb.dir.path().join(format!("istio-dry-run-{slot}"));
    let _ = std::fs::remove_file(&file);
    let mut cmd = Command::new(istio_bin("pilot-agent"));
    cmd.arg("istio-iptables")
        .args(case.args())
        .arg("--log_as_json")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(case.env())
        .env("DRY_RUN_FILE_PATH", &file);
    let start = Instant::now();
    let out = sb.run(cmd, slot, case.host, case.resolv);
    let took = start.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let rules = nft_logged(&stdout)
        .unwrap_or_else(|| std::fs::read_to_string(&file).unwrap_or_default())
        .trim()
        .to_string();
    outcome(out, rules, stdout, took)
}

/// The nftables transaction Istio logged, when it ran its nftables path.
fn nft_logged(stdout: &str) -> Option<String> {
    let msgs: Vec<String> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v["msg"].as_str().map(String::from))
        .collect();
    if !msgs
        .iter()
        .any(|m| m.starts_with("native nftables enabled"))
    {
        return None;
    }
    Some(
        msgs.iter()
            .find_map(|m| m.strip_prefix("nftables rules programmed:\n"))
            .unwrap_or_default()
            .to_string(),
    )
}

fn run_ours(sb: &Sandbox, case: &Case, slot: usize) -> Outcome {
    let mut cmd = Command::new(&sb.ours);
    cmd.arg("istio-iptables");
    if case.pinned {
        cmd.args(case.pinned_args());
    }
    cmd.args(case.args())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(case.env());
    let start = Instant::now();
    let out = sb.run(cmd, slot, case.host, case.resolv);
    let took = start.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    outcome(out, stdout.trim().to_string(), stdout, took)
}

fn outcome(out: Output, rules: String, stdout: String, took: Duration) -> Outcome {
    Outcome {
        ok: out.status.success(),
        code: out.status.code(),
        rules,
        stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        took,
    }
}

/// A case no allowlist entry explains: its index and both outcomes.
type Failure = (u64, Outcome, Outcome);

/// A disagreement: the verdicts differ, or both accept and the rules differ.
fn differs(istio: &Outcome, ours: &Outcome) -> bool {
    istio.ok != ours.ok || (istio.ok && istio.rules != ours.rules)
}

/// One allowlisted deliberate difference.
struct Entry {
    id: String,
    istio: Option<String>,
    ours: Option<String>,
    /// Any of these in our stderr (our refusal names the flag and the reason).
    ours_stderr: Vec<String>,
    /// Any of these in Istio's output (its logs and errors).
    istio_said: Vec<String>,
    /// Any of these in one of the input's words or `NAME=value` variables.
    input: Vec<String>,
    /// A named property of the input ([`holds`]).
    when: Option<String>,
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(String::from))
        .collect()
}

/// Loads the allowlist (tests/differential/suite.rs checks each entry's why and docs line).
fn allowlist() -> Vec<Entry> {
    let mut entries = Vec::new();
    for (id, e) in suite::allowlist("allowlist.json") {
        let m = &e["match"];
        let when = m["when"].as_str().map(String::from);
        assert!(
            when.as_deref().is_none_or(|w| PREDICATES.contains(&w)),
            "allowlist entry {id}: unknown `when` {when:?} (known: {PREDICATES:?})"
        );
        entries.push(Entry {
            id,
            istio: m["istio"].as_str().map(String::from),
            ours: m["ours"].as_str().map(String::from),
            ours_stderr: strings(&m["ours_stderr"]),
            istio_said: strings(&m["istio_said"]),
            input: strings(&m["input"]),
            when,
        });
    }
    entries
}

/// The input properties an entry's `when` can name.
const PREDICATES: &[&str] = &[
    "repeated-list-item",
    "id-list-without-items",
    "repeated-flag",
];

/// Each value-taking flag or variable of the case: (flag or variable name, value).
fn values(case: &Case) -> Vec<(String, &str)> {
    case.tokens
        .iter()
        .filter_map(|t| match t {
            Token::Env(k, v) => Some((k.clone(), v.as_str())),
            Token::Arg(w) => generator::flag_and_value(w).map(|(f, v)| (f.to_string(), v)),
        })
        .collect()
}

fn items(value: &str) -> Vec<&str> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
}

fn holds(predicate: &str, case: &Case) -> bool {
    let values = values(case);
    match predicate {
        "repeated-list-item" => values.iter().any(|(_, v)| {
            let items = items(v);
            (1..items.len()).any(|i| items[..i].contains(&items[i]))
        }),
        "id-list-without-items" => values.iter().any(|(name, v)| {
            ["proxy-uid", "proxy-gid", "PROXY_UID", "PROXY_GID"].contains(&name.as_str())
                && !v.trim().is_empty()
                && items(v).is_empty()
        }),
        "repeated-flag" => {
            let flags: Vec<&str> = case
                .tokens
                .iter()
                .filter_map(|t| match t {
                    Token::Arg(w) => generator::flag_and_value(w).map(|(f, _)| f),
                    Token::Env(..) => None,
                })
                .collect();
            (1..flags.len()).any(|i| flags[..i].contains(&flags[i]))
        }
        _ => false,
    }
}

/// The first entry that explains this difference.
fn explain<'a>(
    entries: &'a [Entry],
    case: &Case,
    istio: &Outcome,
    ours: &Outcome,
) -> Option<&'a Entry> {
    let words: Vec<String> = case
        .tokens
        .iter()
        .flat_map(|t| match t {
            Token::Arg(w) => w.clone(),
            Token::Env(k, v) => vec![format!("{k}={v}")],
        })
        .collect();
    let input_has = |s: &String| words.iter().any(|w| w.contains(s.as_str()));
    entries.iter().find(|e| {
        e.istio.as_deref().is_none_or(|v| v == istio.verdict())
            && e.ours.as_deref().is_none_or(|v| v == ours.verdict())
            && (e.ours_stderr.is_empty() || e.ours_stderr.iter().any(|s| ours.stderr.contains(s)))
            && (e.istio_said.is_empty()
                || e.istio_said
                    .iter()
                    .any(|s| istio.stdout.contains(s) || istio.stderr.contains(s)))
            && (e.input.is_empty() || e.input.iter().any(input_has))
            && e.when.as_deref().is_none_or(|w| holds(w, case))
    })
}

/// Runs both tools on a case; `Some` when they disagree and no entry explains it.
fn unexplained(
    sb: &Sandbox,
    entries: &[Entry],
    case: &Case,
    slot: usize,
) -> Option<(Outcome, Outcome)> {
    let istio = run_istio(sb, case, slot);
    let ours = run_ours(sb, case, slot);
    (differs(&istio, &ours) && explain(entries, case, &istio, &ours).is_none())
        .then_some((istio, ours))
}

fn is_dry_run(t: &Token) -> bool {
    match t {
        Token::Arg(w) => w[0] == "-n" || w[0].starts_with("--dry-run") || w[0] == "-n=t",
        Token::Env(k, _) => k == "DRY_RUN",
    }
}

/// Re-runs a shrink may spend on one failing case.
const SHRINK_BUDGET: usize = 300;

/// The case made smaller: a token dropped (never the dry-run switch), or the plainest host.
fn smaller(case: &Case) -> Vec<Case> {
    let mut out: Vec<Case> = (0..case.tokens.len())
        .filter(|&i| !is_dry_run(&case.tokens[i]))
        .map(|i| {
            let mut c = case.clone();
            c.tokens.remove(i);
            c
        })
        .collect();
    for (host, pinned) in [(0, false), (0, true)] {
        if case.host != host || (case.pinned && !pinned) {
            let mut plain = case.clone();
            (plain.host, plain.pinned) = (host, pinned);
            out.push(plain);
        }
    }
    out
}

/// The smallest case that still fails with the same verdicts. None: the failure did not happen
/// again.
fn shrink(
    sb: &Sandbox,
    entries: &[Entry],
    case: &Case,
    slot: usize,
) -> Option<(Case, Outcome, Outcome)> {
    let failing = unexplained(sb, entries, case, slot)?;
    let verdicts = (failing.0.ok, failing.1.ok);
    let (small, (istio, ours)) =
        suite::shrink(case.clone(), failing, SHRINK_BUDGET, smaller, |c| {
            unexplained(sb, entries, c, slot).filter(|(i, o)| (i.ok, o.ok) == verdicts)
        });
    Some((small, istio, ours))
}

fn report(seed: u64, index: u64, case: &Case, istio: &Outcome, ours: &Outcome) -> String {
    let mut s = format!(
        "case {index} of seed {seed} (shrunk: {})\n  istio: {} (exit {:?})   ours: {} (exit {:?})\n",
        case.render(),
        istio.verdict(),
        istio.code,
        ours.verdict(),
        ours.code
    );
    if istio.ok && ours.ok {
        s += &line_diff(&istio.rules, &ours.rules);
    } else {
        let tail = |t: &str| t.lines().rev().take(3).collect::<Vec<_>>().join(" | ");
        s += &format!(
            "  istio said: {}\n  ours said: {}\n",
            tail(&istio.stdout),
            tail(&ours.stderr)
        );
    }
    s
}

fn line_diff(want: &str, got: &str) -> String {
    let (w, g): (Vec<&str>, Vec<&str>) = (want.lines().collect(), got.lines().collect());
    let first = w
        .iter()
        .zip(&g)
        .position(|(a, b)| a != b)
        .unwrap_or(w.len().min(g.len()));
    let from = first.saturating_sub(1);
    format!(
        "  first difference at line {}:\n  --- istio\n  {}\n  --- ours\n  {}\n",
        first + 1,
        w[from..w.len().min(first + 3)].join("\n  "),
        g[from..g.len().min(first + 3)].join("\n  ")
    )
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
    )
}

/// A few sequential runs of one plain case, for the per-exec cost of each tool.
fn per_exec_cost(sb: &Sandbox) -> (Duration, Duration) {
    let case = Case {
        tokens: vec![Token::Arg(vec!["--dry-run".into()])],
        host: 0,
        resolv: 0,
        pinned: false,
    };
    let n = 20;
    let (mut istio, mut ours) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..n {
        istio += run_istio(sb, &case, 0).took;
        ours += run_ours(sb, &case, 0).took;
    }
    (istio / n, ours / n)
}

/// The seed of a run without ISTIO_DIFF_SEED; every allowlist entry occurs in its cases.
const DEFAULT_SEED: u64 = 42;

#[test]
fn rule_tool_matches_istio_on_generated_inputs() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the differential test runs both tools in network namespaces: run as root"
    );
    let entries = allowlist();
    // A fixed default seed: the run is the same every time, so the stale-entry check cannot flake
    // on a rare entry a random draw missed. ISTIO_DIFF_SEED explores other draws.
    let seed = env_u64("ISTIO_DIFF_SEED").unwrap_or(DEFAULT_SEED);
    let count = env_u64("ISTIO_DIFF_CASES").unwrap_or(DEFAULT_CASES);
    let jobs = env_u64("ISTIO_DIFF_JOBS").unwrap_or(3).max(1) as usize;
    eprintln!(
        "differential istio-iptables: seed {seed} (ISTIO_DIFF_SEED={seed} reproduces), {count} cases, {jobs} jobs"
    );
    let sb = Sandbox::new(jobs);
    let (istio_cost, ours_cost) = per_exec_cost(&sb);
    eprintln!("per exec, sequential: Istio's pilot-agent {istio_cost:?}, ours {ours_cost:?}");

    let start = Instant::now();
    let next = AtomicUsize::new(0);
    let hits = Mutex::new(vec![0usize; entries.len()]);
    let failures: Mutex<Vec<Failure>> = Mutex::new(Vec::new());
    let (accepted, took) = (
        AtomicUsize::new(0),
        Mutex::new((Duration::ZERO, Duration::ZERO)),
    );
    std::thread::scope(|s| {
        for slot in 0..jobs {
            let (sb, entries, next, hits, failures) = (&sb, &entries, &next, &hits, &failures);
            let (accepted, took) = (&accepted, &took);
            s.spawn(move || {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed) as u64;
                    if index >= count {
                        break;
                    }
                    let case = generator::case(seed, index);
                    let istio = run_istio(sb, &case, slot);
                    let ours = run_ours(sb, &case, slot);
                    {
                        let mut t = took.lock().unwrap();
                        t.0 += istio.took;
                        t.1 += ours.took;
                    }
                    if istio.ok && ours.ok {
                        accepted.fetch_add(1, Ordering::Relaxed);
                    }
                    if !differs(&istio, &ours) {
                        continue;
                    }
                    match explain(entries, &case, &istio, &ours) {
                        Some(e) => {
                            let at = entries.iter().position(|x| x.id == e.id).unwrap();
                            hits.lock().unwrap()[at] += 1;
                        }
                        None => failures.lock().unwrap().push((index, istio, ours)),
                    }
                }
            });
        }
    });
    let wall = start.elapsed();
    let (istio_total, ours_total) = *took.lock().unwrap();
    let hits = hits.into_inner().unwrap();
    let failures = failures.into_inner().unwrap();
    eprintln!(
        "{count} cases in {wall:.1?} ({} accepted by both); mean exec under load: Istio {:?}, ours {:?}",
        accepted.load(Ordering::Relaxed),
        istio_total / count.max(1) as u32,
        ours_total / count.max(1) as u32,
    );
    let hits: Vec<(&str, usize)> = entries.iter().map(|e| e.id.as_str()).zip(hits).collect();
    let verdict = parallel::Verdict {
        against: "Istio",
        list: "allowlist",
        // Shrinking re-runs both tools per token: a few failures show the pattern.
        show: (
            env_u64("ISTIO_DIFF_SHOW").unwrap_or(4) as usize,
            "ISTIO_DIFF_SHOW",
        ),
        seed,
        count,
        stale_check: count >= STALE_CHECK_FROM,
    };
    verdict.assert(
        failures,
        &hits,
        |index| {
            let case = generator::case(seed, index);
            let (small, istio, ours) = shrink(&sb, &entries, &case, 0)?;
            Some(report(seed, index, &small, &istio, &ours))
        },
        |index, istio, ours| report(seed, index, &generator::case(seed, index), istio, ours),
    );
}

/// Istio's nftables path programs the namespace even with --dry-run, and a jump to a chain it
/// does not create (an IPv6 DNS server on an IPv4-only host) only succeeds where an earlier case
/// left that chain: each case must see the namespace as the first case did.
#[test]
fn a_case_is_not_changed_by_the_cases_run_before_it() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the differential test runs both tools in network namespaces: run as root"
    );
    let sb = Sandbox::new(1);
    let nft_dns = |resolv| Case {
        tokens: ["--native-nftables", "--dry-run", "--redirect-dns"]
            .map(|w| Token::Arg(vec![w.into()]))
            .to_vec(),
        host: 0,
        resolv,
        pinned: false,
    };
    // Only an IPv6 server (no chain of DNS rules on this host); then an IPv4 one (both chains).
    let (v6_dns, v4_dns) = (nft_dns(4), nft_dns(0));
    assert_eq!(sandbox::RESOLV[4].1, ["fd00::1"]);
    assert_eq!(sandbox::RESOLV[0].1, ["10.96.0.10"]);
    let first = run_istio(&sb, &v6_dns, 0);
    let before = run_istio(&sb, &v4_dns, 0);
    assert!(
        before.ok,
        "Istio refused the IPv4 DNS case: {}",
        before.stdout
    );
    let again = run_istio(&sb, &v6_dns, 0);
    assert_eq!(
        (again.ok, &again.rules),
        (first.ok, &first.rules),
        "the same case, run after another, came out differently:\nfirst: {}\nagain: {}",
        first.stdout,
        again.stdout
    );
}

/// The shared shrinker (tests/differential/suite.rs) takes each smaller variant that still
/// fails, ends where no variant does, and spends no more re-runs than its budget.
#[test]
fn the_shrinker_ends_where_no_smaller_case_fails() {
    let smaller = |c: &Vec<u32>| -> Vec<Vec<u32>> {
        (0..c.len())
            .map(|i| [&c[..i], &c[i + 1..]].concat())
            .collect()
    };
    let fails = |c: &Vec<u32>| (c.contains(&3) && c.contains(&17)).then_some(c.len());
    let mut runs = 0;
    let (small, len) = suite::shrink((1..=20).collect(), 20, 1000, smaller, |c| {
        runs += 1;
        fails(c)
    });
    assert_eq!((small, len), (vec![3, 17], 2));
    // One pass drops the 18 others; a last round finds both left needed.
    assert!(runs <= 22, "{runs} re-runs");
    let mut runs = 0;
    suite::shrink((1..=20).collect(), 20, 5, smaller, |c| {
        runs += 1;
        fails(c)
    });
    assert_eq!(runs, 5);
}

/// The parallel suites' verdict (tests/differential/parallel.rs) passes a clean run and fails on
/// an unexplained case (shown as first seen where the re-run agreed) and on a stale entry.
#[test]
fn the_verdict_fails_on_an_unexplained_case_and_on_a_stale_entry() {
    let verdict = parallel::Verdict {
        against: "Istio",
        list: "allowlist",
        show: (1, "ISTIO_DIFF_SHOW"),
        seed: 7,
        count: 10,
        stale_check: true,
    };
    let seen = |i: u64, _: &(), _: &()| format!("case {i} as seen");
    verdict.assert::<()>(Vec::new(), &[("used", 2)], |_| None, seen);
    let failed = std::panic::catch_unwind(|| {
        let failures = vec![(5, (), ()), (3, (), ())];
        verdict.assert(failures, &[("used", 2), ("stale", 0)], |_| None, seen)
    });
    let message = *failed
        .expect_err("a failing run")
        .downcast::<String>()
        .unwrap();
    for part in [
        "2 of 10 cases differ from Istio without an allowlist entry (seed 7)",
        "(flaky: the difference did not happen again on a re-run; as first seen:)\ncase 3 as seen",
        "... and 1 more failing cases (indices [5]...; ISTIO_DIFF_SHOW=n shrinks and shows n)",
        "allowlist entry stale explained no case of 10",
    ] {
        assert!(message.contains(part), "{part:?} not in:\n{message}");
    }
}
