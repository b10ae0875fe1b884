//! Istio's capture goldens as an external oracle: each case of tests/testdata/istio/cases.json whose
//! golden is a sidecar capture transcript is run through the real binary as `istio-iptables` with
//! the case's argv and env (plus the host facts pinned by our reproducibility flags), and stdout is
//! compared with Istio's file. Istio's files are never rewritten.

use std::process::Command;

#[path = "support/cases.rs"]
mod cases;
use cases::{case_args, case_env, cases_under, testdata};

fn run_cases(prefix: &str) -> usize {
    let mut failures = Vec::new();
    let mut ran = 0;
    for case in &cases_under(prefix) {
        let golden = case["golden"].as_str().unwrap_or_default();
        ran += 1;
        let args = case_args(case);
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_istio-cni-rs"));
        cmd.arg("istio-iptables")
            .args(&args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default());
        cmd.envs(case_env(case));
        let out = cmd.output().expect("run istio-iptables");
        let want = std::fs::read_to_string(testdata().join(golden)).expect("golden file");
        let got = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || got.trim() != want.trim() {
            failures.push(format!(
                "case {golden}\nargs: {args:?}\nexit: {:?}\nstderr: {}\n{}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr),
                diff(want.trim(), got.trim())
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {ran} golden cases differ:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    ran
}

/// A small line diff: the first differing line with context.
fn diff(want: &str, got: &str) -> String {
    let (w, g): (Vec<&str>, Vec<&str>) = (want.lines().collect(), got.lines().collect());
    let first = w
        .iter()
        .zip(&g)
        .position(|(a, b)| a != b)
        .unwrap_or(w.len().min(g.len()));
    let from = first.saturating_sub(2);
    format!(
        "first difference at line {}:\n--- want\n{}\n--- got\n{}",
        first + 1,
        w[from..w.len().min(first + 3)].join("\n"),
        g[from..g.len().min(first + 3)].join("\n")
    )
}

#[test]
fn iptables_capture_goldens() {
    let ran = run_cases("tools/istio-iptables/pkg/capture/testdata/");
    assert!(ran >= 14, "expected the shipped capture cases, ran {ran}");
}

#[test]
fn nftables_capture_goldens() {
    let ran = run_cases("tools/istio-nftables/pkg/capture/testdata/");
    assert!(
        ran >= 15,
        "expected the shipped nftables capture cases, ran {ran}"
    );
}
