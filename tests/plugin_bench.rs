//! Benchmark, run by `just bench` (ignored in the test run; by hand:
//! `ISTIO_CNI_RS_BIN=target/static/istio-cni-rs cargo test --test plugin_bench -- --ignored --nocapture`,
//! optionally with `ISTIO_CNI_RS_TEST_APISERVER` naming a release-built `test-apiserver`).
//! Prints a Markdown table: wall time of a sidecar ADD through the real binary against the test
//! API server over TLS (as in a cluster: client, handshake, GET), once with install-cni running
//! (the pod comes from its node pod store over the pod-facts socket, no API request) and once
//! without (the GET), netns entry, IPv6 detection, programming the rules — against a bare
//! `iptables-nft-restore --noflush` of the same rules, each in a fresh network namespace, the
//! three interleaved round by round.

mod cni_driver;
mod install_support;

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

const NODE: &str = "bench-node";
const UID: &str = "00000000-0000-4000-8000-0000000be4c5";

/// API requests the server logged so far (control endpoints excluded), read over TLS with the
/// same kubeconfig the plugin uses.
fn api_requests(rt: &tokio::runtime::Runtime, kubeconfig: &std::path::Path) -> usize {
    rt.block_on(async {
        let client = istio_cni::kube::KubeClient::from_kubeconfig_file(kubeconfig)
            .await
            .expect("client");
        let request = axum::http::Request::get("/testserver/requests")
            .body(Vec::new())
            .unwrap();
        let text = client
            .client()
            .request_text(request)
            .await
            .expect("request log");
        let log = serde_json::from_str::<Vec<serde_json::Value>>(&text).expect("JSON log");
        if std::env::var_os("BENCH_SHOW_REQUESTS").is_some() {
            eprintln!("{:?}", log.last());
        }
        log.len()
    })
}

/// The plugin's `took_ms` for the ADD flow, from its log.
fn flow_took(run: &Run) -> Duration {
    let took = run
        .stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|r| r["msg"] == "sidecar redirection programmed")
        .find_map(|r| r["took_ms"].as_u64())
        .expect("took_ms logged");
    Duration::from_millis(took)
}

#[test]
#[ignore]
fn sidecar_add_vs_bare_restore() {
    require_tool("iptables-nft-restore", "iptables");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dirs = install_support::Dirs::new();
    let (_api, down_dir, port) = api_server_process(&dirs);
    let kubeconfig = down_dir.path().join("istio-cni-kubeconfig");

    // install-cni with this node's pod store (repair needs it, so it is on), serving pod facts.
    let mut env = dirs.base_env();
    env.retain(|(k, _)| !k.starts_with("KUBERNETES_SERVICE") && k != "REPAIR_ENABLED");
    for (k, v) in [
        ("KUBERNETES_SERVICE_HOST", "127.0.0.1"),
        ("KUBERNETES_SERVICE_PORT", port.as_str()),
        ("KUBERNETES_SERVICE_PROTOCOL", "https"),
        ("KUBECONFIG", kubeconfig.to_str().unwrap()),
        ("REPAIR_ENABLED", "true"),
        ("REPAIR_NODE_NAME", NODE),
    ] {
        env.push((k.to_string(), v.to_string()));
    }
    let mut agent = install_support::start(&env, &[]);
    let up_dir = dirs.run.clone();
    let ready = install_support::wait_for(Duration::from_secs(30), || {
        rt.block_on(istio_cni::plugin::k8s::cached_pod(
            &up_dir,
            "ns1",
            "bench",
            UID,
            false,
            Duration::from_millis(200),
        ))
    });
    assert!(
        ready.is_some(),
        "install-cni never served pod facts:\n{}",
        agent.output()
    );
    assert!(
        install_support::wait_for(Duration::from_secs(30), || up_dir
            .join("istio-cni-kubeconfig")
            .exists()
            .then_some(()))
        .is_some(),
        "install-cni wrote no plugin kubeconfig"
    );
    let conf = |run_dir: &std::path::Path| {
        json!({
            "cniVersion": "1.0.0", "name": "bench", "type": "istio-cni",
            "cni_agent_run_dir": run_dir.display().to_string(),
            "prevResult": {"cniVersion": "1.0.0", "ips": [{"address": "10.29.0.2/24"}], "dns": {}}
        })
        .to_string()
    };
    let (conf_up, conf_down) = (conf(&up_dir), conf(down_dir.path()));
    let env_for = |ns: &NetnsGuard| {
        let mut env = cni_env("ADD", &ns.path().display().to_string(), "ns1", "bench");
        for (k, v) in env.iter_mut() {
            if *k == "CNI_ARGS" {
                v.push_str(&format!(";K8S_POD_UID={UID}"));
            }
        }
        env
    };

    // The rules to restore, as the plugin computes them (dry run).
    let ns = NetnsGuard::new("bdry");
    let rules_file = down_dir.path().join("rules.txt");
    let mut env = env_for(&ns);
    env.push(("DRY_RUN_FILE_PATH", rules_file.display().to_string()));
    assert_eq!(run_plugin(&env, &conf_down).code, 0);
    let rules = std::fs::read_to_string(&rules_file).unwrap();

    let (mut up, mut down, mut up_flow, mut down_flow, mut bare) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut requests_up, mut requests_down) = (0, 0);
    let (mut cpu_up, mut cpu_down) = (Vec::new(), Vec::new());
    let timed_add = |conf: &str,
                     samples: &mut Vec<Duration>,
                     flow: &mut Vec<Duration>,
                     cpu: &mut Vec<Duration>| {
        let ns = NetnsGuard::new("badd");
        let before = api_requests(&rt, &kubeconfig);
        let cpu_before = children_cpu();
        let start = Instant::now();
        let run = run_plugin(&env_for(&ns), conf);
        samples.push(start.elapsed());
        // Only the plugin is reaped in between: its own CPU (user + system).
        cpu.push(children_cpu().saturating_sub(cpu_before));
        assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
        flow.push(flow_took(&run));
        // Control endpoints (the log read itself) are not in the log.
        api_requests(&rt, &kubeconfig) - before
    };
    for _ in 0..ROUNDS {
        requests_down += timed_add(&conf_down, &mut down, &mut down_flow, &mut cpu_down);
        requests_up += timed_add(&conf_up, &mut up, &mut up_flow, &mut cpu_up);

        let ns = NetnsGuard::new("bbare");
        bare.push(timed_restore(&ns.path(), &rules));
    }
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1000.0);
    let (m_up, m_down, m_bare) = (median(up.clone()), median(down.clone()), median(bare));
    let per_add = |n: usize| format!("{:.2}", n as f64 / ROUNDS as f64);
    println!("| measurement (median of {ROUNDS}, fresh netns each, API server over TLS) | value |");
    println!("| --- | --- |");
    println!(
        "| sidecar ADD, agent up: pod from install-cni's pod store (process spawn to exit) | {} |",
        ms(m_up)
    );
    println!(
        "| of which inside the ADD flow (`took_ms` in the plugin's log) | {} |",
        ms(median(up_flow))
    );
    println!(
        "| sidecar ADD, agent down: TLS client, handshake and GET (process spawn to exit) | {} |",
        ms(m_down)
    );
    println!(
        "| of which inside the ADD flow (`took_ms` in the plugin's log) | {} |",
        ms(median(down_flow))
    );
    println!(
        "| bare `iptables-nft-restore --noflush` of the same rules | {} |",
        ms(m_bare)
    );
    println!(
        "| ratio ADD / bare, agent up (target <= 0.8) | {:.2} |",
        m_up.as_secs_f64() / m_bare.as_secs_f64()
    );
    println!(
        "| ratio ADD / bare, agent down | {:.2} |",
        m_down.as_secs_f64() / m_bare.as_secs_f64()
    );
    println!(
        "| plugin CPU per sidecar ADD (user + system), agent up / agent down | {} / {} |",
        ms(median(cpu_up)),
        ms(median(cpu_down))
    );
    println!(
        "| API requests per ADD, agent up / agent down | {} / {} |",
        per_add(requests_up),
        per_add(requests_down)
    );
    println!(
        "| ADD spread, agent up: {} |",
        stats(up).replace(", ", " / ")
    );
    println!(
        "| ADD spread, agent down: {} |",
        stats(down).replace(", ", " / ")
    );
    agent.terminate(Duration::from_secs(10));
}

/// CPU (user + system) of this process's reaped children so far.
fn children_cpu() -> Duration {
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
        .expect("getrusage");
    let micros = |t: nix::sys::time::TimeVal| t.tv_sec() as u64 * 1_000_000 + t.tv_usec() as u64;
    Duration::from_micros(micros(usage.user_time()) + micros(usage.system_time()))
}

/// The test API server in its own process (scripts/bench points ISTIO_CNI_RS_TEST_APISERVER at a
/// release build, so a debug-built server in this process does not skew the measurement), over
/// TLS (its default: a generated CA, written where install-cni reads the service account's), with
/// the one sidecar pod. Returns the server, a run dir holding the plugin kubeconfig for it, and
/// its port.
fn api_server_process(dirs: &install_support::Dirs) -> (ChildGuard, tempfile::TempDir, String) {
    let down_dir = tempfile::tempdir().unwrap();
    let kubeconfig = down_dir.path().join("istio-cni-kubeconfig");
    let fixtures = down_dir.path().join("fixtures.json");
    let mut pod = annotated_pod("ns1", "bench", json!({}));
    pod["metadata"]["uid"] = json!(UID);
    pod["spec"]["nodeName"] = json!(NODE);
    std::fs::write(&fixtures, json!([pod]).to_string()).unwrap();
    std::fs::write(dirs.sa.join("token"), "test-token").unwrap();
    let mut api = ChildGuard(
        Command::new(test_apiserver_binary())
            .args(["--token", "test-token", "--fixtures"])
            .arg(&fixtures)
            .arg("--kubeconfig-out")
            .arg(&kubeconfig)
            .arg("--ca-out")
            .arg(dirs.sa.join("ca.crt"))
            .stdout(Stdio::piped())
            .spawn()
            .expect("start test-apiserver"),
    );
    let mut url = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(api.0.stdout.take().unwrap()),
        &mut url,
    )
    .unwrap();
    let url = url.trim().to_string();
    assert!(url.starts_with("https://"), "{url}");
    let port = url.rsplit(':').next().unwrap().to_string();
    (api, down_dir, port)
}

/// The same sidecar ADD (TLS GET, no install-cni) through this build and through a baseline
/// binary (`ISTIO_CNI_RS_BIN_BASELINE`, e.g. a static build of an earlier commit), interleaved
/// with a bare restore of the same rules, fresh netns each: a refactor's cost, side by side in
/// one run. By hand:
/// `ISTIO_CNI_RS_BIN=... ISTIO_CNI_RS_BIN_BASELINE=... cargo test --test plugin_bench -- --ignored --nocapture against_a_baseline`.
#[test]
#[ignore]
fn sidecar_add_against_a_baseline_binary() {
    require_tool("iptables-nft-restore", "iptables");
    let baseline = std::env::var_os("ISTIO_CNI_RS_BIN_BASELINE")
        .map(std::path::PathBuf::from)
        .expect("set ISTIO_CNI_RS_BIN_BASELINE to the binary to compare with");
    let dirs = install_support::Dirs::new();
    let (_api, run_dir, _port) = api_server_process(&dirs);
    let conf = json!({
        "cniVersion": "1.0.0", "name": "bench", "type": "istio-cni",
        "cni_agent_run_dir": run_dir.path().display().to_string(),
        "prevResult": {"cniVersion": "1.0.0", "ips": [{"address": "10.29.0.2/24"}], "dns": {}}
    })
    .to_string();
    let env_for =
        |ns: &NetnsGuard| cni_env("ADD", &ns.path().display().to_string(), "ns1", "bench");
    let ns = NetnsGuard::new("bbdry");
    let rules_file = run_dir.path().join("rules.txt");
    let mut env = env_for(&ns);
    env.push(("DRY_RUN_FILE_PATH", rules_file.display().to_string()));
    assert_eq!(run_plugin(&env, &conf).code, 0);
    let rules = std::fs::read_to_string(&rules_file).unwrap();
    let (mut ours, mut base, mut bare) = (Vec::new(), Vec::new(), Vec::new());
    let timed = |bin: &std::path::Path, samples: &mut Vec<Duration>| {
        let ns = NetnsGuard::new("bbadd");
        let run = run_cni(bin, &["istio-cni"], &env_for(&ns), &conf);
        assert_eq!(
            run.code,
            0,
            "{}: {}{}",
            bin.display(),
            run.stdout,
            run.stderr
        );
        samples.push(run.took);
    };
    for round in 0..ROUNDS {
        // Alternate which binary goes first, so neither always gets the warmer cache.
        if round % 2 == 0 {
            timed(&binary(), &mut ours);
            timed(&baseline, &mut base);
        } else {
            timed(&baseline, &mut base);
            timed(&binary(), &mut ours);
        }
        let ns = NetnsGuard::new("bbbare");
        bare.push(timed_restore(&ns.path(), &rules));
    }
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let (m_ours, m_base, m_bare) = (median(ours), median(base), median(bare));
    let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1000.0);
    let size = |p: &std::path::Path| {
        std::fs::metadata(p)
            .map(|m| format!("{:.2} MB", m.len() as f64 / 1e6))
            .unwrap_or_default()
    };
    println!(
        "| measurement (median of {ROUNDS}, TLS GET, fresh netns each) | this build | baseline | bare restore |"
    );
    println!("| --- | --- | --- | --- |");
    println!(
        "| sidecar ADD, process spawn to exit | {} | {} | {} |",
        ms(m_ours),
        ms(m_base),
        ms(m_bare)
    );
    println!(
        "| ratio to the bare restore | {:.2} | {:.2} | 1.00 |",
        m_ours.as_secs_f64() / m_bare.as_secs_f64(),
        m_base.as_secs_f64() / m_bare.as_secs_f64()
    );
    println!(
        "| binary size | {} | {} | |",
        size(&binary()),
        size(&baseline)
    );
}

/// Kills the child when dropped, also when the benchmark panics.
struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
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
