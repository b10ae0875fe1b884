//! Benchmark, run by `just bench` (ignored in the test run; by hand:
//! `ISTIO_CNI_RS_BIN=target/static/istio-cni-rs cargo test --test plugin_bench -- --ignored --nocapture`,
//! optionally with `ISTIO_CNI_RS_TEST_APISERVER` naming a release-built `test-apiserver`).
//! Prints a Markdown table: wall time of a sidecar ADD through
//! the real binary (API lookup against a local fake server, netns entry, IPv6 detection,
//! programming the rules) against a bare `iptables-nft-restore --noflush` of the same rules, each in a
//! fresh network namespace.

mod cni_driver;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cni_driver::*;
use serde_json::json;

const ROUNDS: usize = 30;

fn stats(mut samples: Vec<Duration>) -> String {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    format!(
        "median {:.2} ms, p90 {:.2} ms, min {:.2} ms",
        ms(samples[samples.len() / 2]),
        ms(samples[samples.len() * 9 / 10]),
        ms(samples[0])
    )
}

#[test]
#[ignore]
fn sidecar_add_vs_bare_restore() {
    require_tool("iptables-nft-restore", "iptables");
    let dir = tempfile::tempdir().unwrap();
    // The API server runs in its own process (scripts/bench points ISTIO_CNI_RS_TEST_APISERVER at
    // a release build), so the measurement is not skewed by a debug-built server in this process.
    let fixtures = dir.path().join("fixtures.json");
    let pod = annotated_pod("ns1", "bench", json!({}));
    std::fs::write(&fixtures, json!([pod]).to_string()).unwrap();
    let mut api = Command::new(test_apiserver_binary())
        .args(["--token", "test-token", "--fixtures"])
        .arg(&fixtures)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start test-apiserver");
    let mut url = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(api.stdout.take().unwrap()),
        &mut url,
    )
    .unwrap();
    write_kubeconfig(dir.path(), url.trim());
    let conf = json!({
        "cniVersion": "1.0.0", "name": "bench", "type": "istio-cni",
        "cni_agent_run_dir": dir.path().display().to_string(),
        "prevResult": {"cniVersion": "1.0.0", "ips": [{"address": "10.29.0.2/24"}], "dns": {}}
    })
    .to_string();

    // The rules to restore, as the plugin computes them (dry run).
    let ns = NetnsGuard::new("bdry");
    let rules_file = dir.path().join("rules.txt");
    let mut env = cni_env("ADD", &ns.path().display().to_string(), "ns1", "bench");
    env.push(("DRY_RUN_FILE_PATH", rules_file.display().to_string()));
    assert_eq!(run_plugin(&env, &conf).code, 0);
    let rules = std::fs::read_to_string(&rules_file).unwrap();

    let mut add = Vec::new();
    let mut add_via_restore = Vec::new();
    let mut in_process = Vec::new();
    let mut bare = Vec::new();
    for _ in 0..ROUNDS {
        let ns = NetnsGuard::new("badd");
        let env = cni_env("ADD", &ns.path().display().to_string(), "ns1", "bench");
        let start = Instant::now();
        let run = run_plugin(&env, &conf);
        add.push(start.elapsed());
        assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
        // The plugin's own measure of the ADD flow (client, lookup, netns, restore).
        let took = run
            .stderr
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|r| r["msg"] == "sidecar redirection programmed")
            .find_map(|r| r["took_ms"].as_u64())
            .expect("took_ms logged");
        in_process.push(Duration::from_millis(took));

        // The same ADD made to run iptables-restore (the opt-out): what the netlink path saves.
        let ns = NetnsGuard::new("brst");
        let mut env = cni_env("ADD", &ns.path().display().to_string(), "ns1", "bench");
        env.push(("ISTIO_IPTABLES_RESTORE_ONLY", "true".to_string()));
        let start = Instant::now();
        let run = run_plugin(&env, &conf);
        add_via_restore.push(start.elapsed());
        assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);

        let ns = NetnsGuard::new("bbare");
        let text = rules.clone();
        let took = istio_cni::netns::Netns::open(&ns.path())
            .and_then(|ns| {
                ns.run(move || {
                    let start = Instant::now();
                    let mut child = Command::new("iptables-nft-restore")
                        .arg("--noflush")
                        .stdin(Stdio::piped())
                        .spawn()
                        .expect("iptables-nft-restore");
                    child
                        .stdin
                        .take()
                        .unwrap()
                        .write_all(text.as_bytes())
                        .unwrap();
                    assert!(child.wait().unwrap().success());
                    start.elapsed()
                })
            })
            .unwrap();
        bare.push(took);
    }
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1000.0);
    let (m_add, m_flow, m_bare) = (
        median(add.clone()),
        median(in_process),
        median(bare.clone()),
    );
    println!("| measurement (median of {ROUNDS}, fresh netns each) | value |");
    println!("| --- | --- |");
    println!(
        "| sidecar ADD, process spawn to exit (API lookup on loopback, netns, rules over netlink) | {} |",
        ms(m_add)
    );
    println!(
        "| of which inside the ADD flow (`took_ms` in the plugin's log) | {} |",
        ms(m_flow)
    );
    println!(
        "| same ADD with `ISTIO_IPTABLES_RESTORE_ONLY=true` (rules through iptables-restore) | {} |",
        ms(median(add_via_restore))
    );
    println!(
        "| bare `iptables-nft-restore --noflush` of the same rules | {} |",
        ms(m_bare)
    );
    println!(
        "| ratio ADD / bare (target <= 1.3) | {:.2} |",
        m_add.as_secs_f64() / m_bare.as_secs_f64()
    );
    println!("| ADD spread: {} |", stats(add).replace(", ", " / "));
    let _ = api.kill();
    let _ = api.wait();
}

#[test]
#[ignore]
fn add_phases() {
    let (_api, dir) = api_with_sidecar_pod("ns1", "bench");
    let conf = json!({"cniVersion": "1.0.0", "name": "bench", "plugin_log_level": "debug",
        "cni_agent_run_dir": dir.path().display().to_string()})
    .to_string();
    for _ in 0..3 {
        let ns = NetnsGuard::new("phase");
        let run = run_plugin(
            &cni_env("ADD", &ns.path().display().to_string(), "ns1", "bench"),
            &conf,
        );
        for line in run.stderr.lines().filter(|l| l.contains("took_ms")) {
            println!("{line}");
        }
    }
}
