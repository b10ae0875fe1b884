//! Ambient benchmarks, run by `just bench` (ignored in the test run; by hand, as root:
//! `ISTIO_CNI_RS_BIN=target/static/istio-cni-rs cargo test --test ambient_bench -- --ignored
//! --nocapture --test-threads=1`; without `ISTIO_CNI_RS_BIN` the test build's binary is measured).
//! Both print Markdown table rows (lines starting with `|`) that scripts/bench copies into
//! docs/benchmarks.md. They run on the e2e harness (tests/support/ambient_node.rs): a node netns
//! with the real install-cni + agent (iptables backend), the test API server and the test ZDS
//! peer acking every Add.
//!
//! - `ambient_add_latency`: N ambient ADDs (`BENCH_AMBIENT_ADDS`, default 1000) through the real
//!   plugin binary, C at a time (`BENCH_AMBIENT_CONCURRENCY`, default 100), each pod on its own
//!   netns; then the agent's in-pod programming ([`Dataplane::program_pod`], the function the agent
//!   calls) against a bare `iptables-nft-restore --noflush` of the same in-pod rules, each in a
//!   fresh netns, alternating.
//! - `agent_rss_flat_under_churn`: the agent's RSS with 250 enrolled pods on this node and 5,000
//!   pods of other nodes in the API server, then again after the other nodes' pods churn. The
//!   drift pass runs every `BENCH_DRIFT_INTERVAL` (default 5s) meanwhile; once the pods are
//!   enrolled, a few passes are timed from their log lines: pods verified per pass, the median
//!   pass duration, and the agent's CPU per pass (its own and the tools it ran, from
//!   /proc/<pid>/stat), with the RSS after them.

#[path = "support/ambient_node.rs"]
mod ambient_node;
/// Bulk pods on the real API server, its CPU (shared with tests/istio_bench.rs).
#[path = "istio_bench/cluster.rs"]
mod cluster;
mod install_support;
#[path = "support/ambient_bench_records.rs"]
mod records;
mod support;

use std::fs::File;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ambient_node::{Backend, Node, PodNs, rss_mb, rss_split_mb};
use istio_cni::agent::dataplane::{Dataplane, DataplaneSettings, PodNet};
use istio_cni::netns::Netns;
use nix::sched::{CloneFlags, setns};
use records::{breakdown_rows, fallbacks, podadd_lines};
use serde_json::json;
use support::cni_driver::{require_tool, run_cni, timed_restore};

const AMBIENT: &str = "istio.io/dataplane-mode";
/// Rounds of the in-pod programming comparison.
const ROUNDS: usize = 30;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// The sample at quantile `q` of sorted `v` (nearest rank).
fn quantile(v: &[Duration], q: f64) -> Duration {
    let rank = ((v.len() as f64) * q).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// A unique pod address for pod `i` (in its netns; the plugin hands it to the agent).
fn pod_ip(i: usize) -> String {
    format!("10.200.{}.{}", i / 250, i % 250 + 2)
}

/// A pod of the node: its name, its UID in the test API server, its netns.
struct BenchPod {
    name: String,
    uid: String,
    ns: PodNs,
    /// Its address (in its netns, and in the prevResult the plugin gets).
    ip: String,
}

/// What a phase of ADDs showed.
struct Adds {
    /// Each ADD's wall time, sorted.
    took: Vec<Duration>,
    failures: Vec<String>,
    /// Each successful ADD's wall time with the plugin's stderr (its JSON log records).
    runs: Vec<(Duration, String)>,
}

/// Runs ADDs of our plugin alone (the chain's istio-cni entry, with a prevResult naming the pod
/// IP as the bridge/host-local plugins would) for `pods`, `concurrency` at a time, every call
/// from inside the node netns, with CNI_ARGS as containerd and CRI-O send them (the pod's UID
/// included).
fn run_adds(node: &Node, k8s_ns: &str, pods: &[BenchPod], concurrency: usize) -> Adds {
    let plugin = node.chain.conflist["plugins"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["type"] == "istio-cni"))
        .cloned()
        .expect("install-cni added the istio-cni entry");
    let exe = node.dirs.bin.join("istio-cni");
    let cni_path = std::env::join_paths(&node.chain.cni_path).expect("CNI_PATH");
    let next = AtomicUsize::new(0);
    let took = Mutex::new(Vec::with_capacity(pods.len()));
    let failures = Mutex::new(Vec::new());
    let runs = Mutex::new(Vec::new());
    let node_ns = PathBuf::from(node.ns.path());
    std::thread::scope(|s| {
        for _ in 0..concurrency.max(1) {
            s.spawn(|| {
                let file = File::open(&node_ns).expect("open node netns");
                setns(&file, CloneFlags::CLONE_NEWNET).expect("enter node netns");
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(BenchPod { name, uid, ns: pod, ip }) = pods.get(i) else {
                        break;
                    };
                    let mut conf = plugin.clone();
                    conf["name"] = node.chain.conflist["name"].clone();
                    conf["cniVersion"] = node.chain.conflist["cniVersion"].clone();
                    conf["prevResult"] = json!({
                        "cniVersion": "1.0.0",
                        "interfaces": [{"name": "eth0", "sandbox": pod.path_string()}],
                        "ips": [{"address": format!("{ip}/16"), "interface": 0}],
                        "dns": {}
                    });
                    let env = vec![
                        ("CNI_COMMAND", "ADD".to_string()),
                        ("CNI_CONTAINERID", pod.guard.name.clone()),
                        ("CNI_NETNS", pod.path_string()),
                        ("CNI_IFNAME", "eth0".to_string()),
                        (
                            "CNI_ARGS",
                            format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={k8s_ns};K8S_POD_NAME={name};K8S_POD_INFRA_CONTAINER_ID={};K8S_POD_UID={uid}", pod.guard.name),
                        ),
                        ("CNI_PATH", cni_path.to_string_lossy().into_owned()),
                    ];
                    let start = Instant::now();
                    let run = run_cni(&exe, &[], &env, &conf.to_string());
                    let elapsed = start.elapsed();
                    took.lock().expect("took").push(elapsed);
                    if run.code != 0 {
                        failures.lock().expect("failures").push(format!(
                            "{name}: exit {} after {elapsed:?}: {}{}",
                            run.code, run.stdout, run.stderr
                        ));
                    } else {
                        runs.lock().expect("runs").push((elapsed, run.stderr));
                    }
                }
            });
        }
    });
    let mut took = took.into_inner().expect("took");
    took.sort();
    Adds {
        took,
        failures: failures.into_inner().expect("failures"),
        runs: runs.into_inner().expect("runs"),
    }
}

/// `n` pods in `k8s_ns` on this node, each with a fresh netns holding its address
/// ([`pod_ip`] from `ip_base`) on an `eth0`, as the CNI chain's bridge plugin would leave it (the
/// agent refuses a netns that does not hold the IPs the plugin names); all before any timing.
fn node_pods(node: &Node, k8s_ns: &str, prefix: &str, n: usize, ip_base: usize) -> Vec<BenchPod> {
    (0..n)
        .map(|i| {
            let name = format!("{prefix}{i}");
            let uid = node.pod(k8s_ns, &name, json!({}));
            let ns = PodNs::new("ab");
            let ip = pod_ip(ip_base + i);
            give_address(&ns, &ip);
            BenchPod { name, uid, ns, ip }
        })
        .collect()
}

/// `eth0` (one end of a veth pair inside the netns: no dummy module everywhere) with `ip`/16,
/// up, in the pod's netns: one `ip` process.
fn give_address(pod: &PodNs, ip: &str) {
    use std::io::Write;
    let mut child = Command::new("ip")
        .args(["-n", &pod.guard.name, "-batch", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("run ip");
    let script = format!(
        "link add eth0 type veth peer name eth0p\naddr add {ip}/16 dev eth0\n\
         link set eth0p up\nlink set eth0 up\n"
    );
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(script.as_bytes())
        .expect("write ip batch");
    let status = child.wait().expect("wait for ip");
    assert!(
        status.success(),
        "ip -batch in {}: {status}",
        pod.guard.name
    );
}

/// The IPv4 restore text of `istio-iptables ambient --dry-run` (what the agent programs in a pod).
fn inpod_restore_text() -> String {
    let out = Command::new(install_support::bin())
        .args(["istio-iptables", "ambient", "--dry-run", "--ipv6=false"])
        .output()
        .expect("run istio-iptables ambient --dry-run");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let start = text.find("* ").expect("a table in the dry run");
    let end = text.rfind("COMMIT").expect("COMMIT in the dry run") + "COMMIT\n".len();
    text[start..end.min(text.len())].to_string()
}

fn bare_restore(text: &str) -> Duration {
    let ns = PodNs::new("abare");
    timed_restore(&ns.guard.path(), text)
}

fn program_once(dp: &Dataplane, i: usize) -> Duration {
    let ns = PodNs::new("aprog");
    let netns = Netns::open(&ns.guard.path()).expect("open netns");
    let pod = PodNet {
        uid: format!("bench-{i}"),
        name: format!("p{i}"),
        namespace: "amb".into(),
        ips: vec![pod_ip(i).parse().expect("ip")],
        overrides: Default::default(),
    };
    let start = Instant::now();
    dp.program_pod(&netns, &pod).expect("program_pod");
    start.elapsed()
}

#[test]
#[ignore]
fn ambient_add_latency() {
    require_tool("iptables-nft-restore", "iptables");
    let n = env_usize("BENCH_AMBIENT_ADDS", 1000);
    let c = env_usize("BENCH_AMBIENT_CONCURRENCY", 100);
    let node = Node::start(Backend::Iptables);
    node.namespace("amb", json!({AMBIENT: "ambient"}));
    let serial_n = env_usize("BENCH_AMBIENT_SERIAL_ADDS", 50);
    let burst_n = env_usize("BENCH_AMBIENT_FALLBACK_ADDS", 200);
    let burst_c = env_usize("BENCH_AMBIENT_FALLBACK_CONCURRENCY", 50);
    let serial_pods = node_pods(&node, "amb", "s", serial_n, n);
    let pods = node_pods(&node, "amb", "p", n, 0);
    let burst_pods = node_pods(&node, "amb", "b", burst_n, n + serial_n);

    // One at a time first: the latency of an ADD on an otherwise idle agent.
    let agent_lines_before = podadd_lines(&node).len();
    let serial = run_adds(&node, "amb", &serial_pods, 1);
    // The agent's records of exactly these ADDs (the later phases add theirs).
    let mut serial_agent = podadd_lines(&node);
    let serial_agent = serial_agent.split_off(agent_lines_before.min(serial_agent.len()));
    let serial_failures = serial.failures.clone();
    let cpu_before = cpu_split(&node);
    let wall = Instant::now();
    let Adds { took, failures, .. } = run_adds(&node, "amb", &pods, c);
    let wall = wall.elapsed();
    let cpu_after = cpu_split(&node);
    let per_add = |i: usize| (cpu_after[i] - cpu_before[i]) * 1000.0 / n as f64;
    // The node-start burst: would the agent, busy, send plugins to the API server?
    let burst = run_adds(&node, "amb", &burst_pods, burst_c);
    for f in failures.iter().chain(&burst.failures).take(5) {
        eprintln!("failed ADD: {f}");
    }
    let enrolled = node.peer.workloads().len();
    assert_eq!(node.peer.violations(), Vec::<String>::new());

    // In-pod programming alone vs a bare restore of the same rules, fresh netns each, alternating.
    let settings = DataplaneSettings {
        skip_host_rules: true,
        ..Default::default()
    };
    let dp = Dataplane::new(&settings).expect("data plane");
    let text = inpod_restore_text();
    let (mut ours, mut bare) = (Vec::new(), Vec::new());
    for i in 0..ROUNDS {
        if i % 2 == 0 {
            ours.push(program_once(&dp, n + serial_n + burst_n + i));
            bare.push(bare_restore(&text));
        } else {
            bare.push(bare_restore(&text));
            ours.push(program_once(&dp, n + serial_n + burst_n + i));
        }
    }
    ours.sort();
    bare.sort();
    let (m_ours, m_bare) = (quantile(&ours, 0.5), quantile(&bare, 0.5));

    println!("| measurement | value | target |");
    println!("| --- | --- | --- |");
    println!(
        "| ambient ADD one at a time ({serial_n} pods): p50 / p99 | {} / {} | |",
        ms(quantile(&serial.took, 0.5)),
        ms(quantile(&serial.took, 0.99))
    );
    breakdown_rows(&serial, &serial_agent);
    println!(
        "| ambient ADDs through the plugin binary ({n}, {c} concurrent, own netns each, ZDS peer acking) | {:.1} s wall, {:.0} ADD/s | |",
        wall.as_secs_f64(),
        n as f64 / wall.as_secs_f64()
    );
    println!("| ADD latency p50 | {} | |", ms(quantile(&took, 0.5)));
    println!(
        "| ADD latency p99 | {} | <= 0.5 s |",
        ms(quantile(&took, 0.99))
    );
    println!("| ADD latency max | {} | |", ms(quantile(&took, 1.0)));
    println!(
        "| CPU per concurrent ADD: plugin process / agent / tools the agent ran / test API server + ZDS peer + harness | {:.1} / {:.1} / {:.1} / {:.1} ms | |",
        per_add(1),
        per_add(2),
        per_add(3),
        per_add(0)
    );
    println!(
        "| ADDs that fell back to the API server (GET pod): one at a time / {n} at {c} / {burst_n} at {burst_c} | {} / {} / {} | 0 |",
        fallbacks(&node, "amb", &serial_pods),
        fallbacks(&node, "amb", &pods),
        fallbacks(&node, "amb", &burst_pods)
    );
    println!(
        "| failed ADDs | {} of {n} (+ {} of {serial_n} one at a time, {} of {burst_n} in the burst) | 0 |",
        failures.len(),
        serial_failures.len(),
        burst.failures.len()
    );
    println!(
        "| pods the ZDS peer holds afterwards | {enrolled} | {} |",
        n + serial_n + burst_n
    );
    println!(
        "| in-pod programming by the agent's data plane (`program_pod`, {:?}), median of {ROUNDS}, fresh netns each | {} | |",
        dp.decision().backend,
        ms(m_ours)
    );
    println!(
        "| bare `iptables-nft-restore --noflush` of the same in-pod rules | {} | |",
        ms(m_bare)
    );
    println!(
        "| ratio programming / bare restore | {:.2} | |",
        m_ours.as_secs_f64() / m_bare.as_secs_f64()
    );
    let failures = [serial_failures, failures, burst.failures].concat();
    assert!(
        failures.is_empty(),
        "{} ADDs failed; first: {:?}",
        failures.len(),
        failures.first()
    );
    assert_eq!(
        enrolled,
        n + serial_n + burst_n,
        "pods acked by the ZDS peer"
    );
}

/// CPU time of a process from /proc/<pid>/stat, in seconds: (its own, its reaped children's).
fn cpu_seconds(pid: &str) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    // Fields after the command name (which may hold spaces): state is field 3, utime 14.
    let fields: Vec<f64> = stat[stat.rfind(')').expect("comm") + 2..]
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0.0))
        .collect();
    let tick = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    let at = |field: usize| fields[field - 3] / tick;
    (at(14) + at(15), at(16) + at(17))
}

/// Where the CPU of a phase went: (test process, its reaped children = plugin runs, agent,
/// agent's reaped children = the tools it ran).
fn cpu_split(node: &Node) -> [f64; 4] {
    let agent = node.agent.child.id().to_string();
    let (me, children) = cpu_seconds("self");
    let (agent_own, agent_children) = cpu_seconds(&agent);
    [me, children, agent_own, agent_children]
}

#[test]
#[ignore]
fn agent_rss_flat_under_churn() {
    let enrolled = env_usize("BENCH_AMBIENT_RSS_PODS", 250);
    let others = env_usize("BENCH_AMBIENT_OTHER_PODS", 5000);
    let churn = env_usize("BENCH_AMBIENT_CHURN", 3000).min(others);
    let drift_interval = std::env::var("BENCH_DRIFT_INTERVAL").unwrap_or_else(|_| "5s".into());
    let node = Node::start_with(
        Backend::Iptables,
        &[("DRIFT_VERIFY_INTERVAL", drift_interval.as_str())],
    );
    node.namespace("amb", json!({AMBIENT: "ambient"}));
    node.namespace("elsewhere", json!({AMBIENT: "ambient"}));
    let before = rss_mb(&node);
    node.add_other_node_pods(others);
    let pods = node_pods(&node, "amb", "p", enrolled, 0);
    // An ADD that missed its 4.5 s budget on a busy machine still gets enrolled by the agent
    // (ztunnel acks late); what is measured here is memory once all are in.
    let failures = run_adds(&node, "amb", &pods, 10).failures;
    node.wait_until(
        Duration::from_secs(60),
        "all pods held by the ZDS peer",
        || node.peer.workloads().len() >= enrolled,
    );
    node.wait_until(Duration::from_secs(30), "all pods annotated", || {
        node.api
            .server
            .pod("amb", &format!("p{}", enrolled - 1))
            .and_then(|p| p.metadata.annotations)
            .is_some_and(|a| a.contains_key("ambient.istio.io/redirection"))
    });
    std::thread::sleep(Duration::from_secs(2));
    let after_enrol = rss_mb(&node);
    let (enrol_anon, enrol_file) = rss_split_mb(&node);
    let drift = drift_passes(&node, enrolled, env_usize("BENCH_DRIFT_PASSES", 3));
    let after_drift = rss_mb(&node);

    node.churn_other_node_pods(churn);
    let after_churn = rss_mb(&node);
    assert_eq!(node.peer.workloads().len(), enrolled);
    assert_eq!(node.peer.violations(), Vec::<String>::new());

    println!("| measurement | value | target |");
    println!("| --- | --- | --- |");
    println!("| agent (install-cni) RSS before any pod | {before:.1} MB | |");
    println!(
        "| ADDs of the enrolled pods that missed the 4.5 s budget (enrolled later) | {} of {enrolled} | |",
        failures.len()
    );
    println!(
        "| RSS with {enrolled} enrolled pods on this node, {others} pods of other nodes in the API server | {after_enrol:.1} MB | <= 12 MB |"
    );
    println!(
        "| of which heap and stacks (`RssAnon`) / the binary's mapped pages (`RssFile`) | {enrol_anon:.1} / {enrol_file:.1} MB | |"
    );
    println!(
        "| RSS after {churn} of the other nodes' pods were deleted and recreated | {after_churn:.1} MB | flat |"
    );
    println!(
        "| growth from the churn | {:+.1} MB | ~0 |",
        after_churn - after_enrol
    );
    println!(
        "| drift pass (every {drift_interval} here, 60 s by default): pods verified per pass | {} of {enrolled} | all |",
        drift.pods
    );
    println!(
        "| drift pass duration, median of {} passes | {} | < 60 s (one period) |",
        drift.passes,
        ms(drift.median)
    );
    println!(
        "| agent CPU per drift pass: own / the `iptables-save` runs it started | {:.0} / {:.0} ms ({:.2} ms per pod) | <= 150 ms, no process |",
        drift.cpu_own_ms,
        drift.cpu_tools_ms,
        (drift.cpu_own_ms + drift.cpu_tools_ms) / enrolled.max(1) as f64
    );
    println!(
        "| RSS after the drift passes ({enrolled} pods) | {after_drift:.1} MB ({:+.1} MB) | |",
        after_drift - after_enrol
    );
}

/// What the timed drift passes showed.
struct DriftPasses {
    passes: usize,
    /// Pods verified by the last pass.
    pods: usize,
    median: Duration,
    cpu_own_ms: f64,
    cpu_tools_ms: f64,
}

/// The agent's `drift pass done` lines (its key=value fields).
fn pass_lines(node: &Node) -> Vec<std::collections::HashMap<String, String>> {
    let lines = node.agent.lines.lock().expect("lines").clone();
    lines
        .iter()
        .filter(|l| l.contains("drift pass done"))
        .map(|l| {
            l.split(['\t', ' '])
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

/// Waits for a pass that verified `pods`, then times `n` more: their durations from the log
/// lines, the agent's CPU (own, and its reaped children: the tools it ran) between the end of
/// the first and the end of the last, per pass.
fn drift_passes(node: &Node, pods: usize, n: usize) -> DriftPasses {
    let verified = |line: &std::collections::HashMap<String, String>| {
        line.get("pods").and_then(|v| v.parse::<usize>().ok())
    };
    node.wait_until(
        Duration::from_secs(120),
        "a drift pass over every pod",
        || {
            pass_lines(node)
                .last()
                .and_then(verified)
                .is_some_and(|v| v >= pods)
        },
    );
    let agent = node.agent.child.id().to_string();
    let seen = pass_lines(node).len();
    let (own0, tools0) = cpu_seconds(&agent);
    node.wait_until(Duration::from_secs(600), "the timed drift passes", || {
        pass_lines(node).len() >= seen + n
    });
    let (own1, tools1) = cpu_seconds(&agent);
    let lines = pass_lines(node);
    let timed = &lines[seen..seen + n];
    let mut took: Vec<Duration> = timed
        .iter()
        .filter_map(|l| l.get("duration_ms")?.parse().ok())
        .map(Duration::from_millis)
        .collect();
    took.sort();
    DriftPasses {
        passes: n,
        pods: timed.last().and_then(verified).unwrap_or(0),
        median: quantile(&took, 0.5),
        cpu_own_ms: (own1 - own0) * 1000.0 / n as f64,
        cpu_tools_ms: (tools1 - tools0) * 1000.0 / n as f64,
    }
}

/// One node of each build on the real API server (Istio's install-cni with AMBIENT_ENABLED and
/// its plugin, `Node::start_istio_on`; ours, `Node::start_real`), each with its own ZDS test peer.
fn both_nodes() -> [Node; 2] {
    let istio = Node::start_istio_on(
        support::real_cluster::RealCluster::start(),
        Backend::Iptables,
        &[],
    );
    let ours = Node::start_real(Backend::Iptables);
    for node in [&istio, &ours] {
        node.namespace("amb", json!({AMBIENT: "ambient"}));
    }
    [istio, ours]
}

/// CPU of a node's processes: the plugins this process ran (and what they ran), the agent and
/// the tools it ran, in seconds.
fn node_cpu(node: &Node) -> f64 {
    let [_, plugins, agent, tools] = cpu_split(node);
    plugins + agent + tools
}

/// What the one-at-a-time ADDs of both nodes showed, per build: each ADD's wall time, the CPU of
/// the node's processes and kube-apiserver's summed over them, the failures.
struct Serial {
    took: [Vec<Duration>; 2],
    node_cpu: [f64; 2],
    api_cpu: [f64; 2],
    failures: [Vec<String>; 2],
}

/// One ADD at a time, alternating the builds ADD by ADD (which goes first alternates too).
fn serial_alternating(nodes: &[Node; 2], k8s_ns: &[String; 2], pods: [&[BenchPod]; 2]) -> Serial {
    let mut out = Serial {
        took: [Vec::new(), Vec::new()],
        node_cpu: [0.0; 2],
        api_cpu: [0.0; 2],
        failures: [Vec::new(), Vec::new()],
    };
    let apiserver = cluster::apiserver_pid(nodes[0].cluster().cp).expect("kube-apiserver's pid");
    let api_cpu = || cluster::proc_cpu(apiserver).as_secs_f64();
    for i in 0..pods[0].len().min(pods[1].len()) {
        let order = if i % 2 == 0 { [0, 1] } else { [1, 0] };
        for s in order {
            let (before, api_before) = (node_cpu(&nodes[s]), api_cpu());
            let adds = run_adds(&nodes[s], &k8s_ns[s], &pods[s][i..i + 1], 1);
            out.node_cpu[s] += node_cpu(&nodes[s]) - before;
            out.api_cpu[s] += api_cpu() - api_before;
            out.took[s].extend(adds.took);
            out.failures[s].extend(adds.failures);
        }
    }
    out
}

/// Ambient ADDs side by side with Istio's build, on the real API server: one at a time
/// alternating the builds ADD by ADD (p50, p99, CPU of the node's processes per ADD: plugin,
/// agent, the tools it ran; the agent's from 10 ms ticks, so summed over all ADDs), then a burst
/// of each build's ADDs at a concurrency (Istio's first, then ours): ADD/s, p99, failures.
/// Prints `| what | Istio | ours | ours / Istio |` rows.
#[test]
#[ignore]
fn ambient_add_side_by_side() {
    let serial_n = env_usize("BENCH_AMBIENT_SERIAL_ADDS", 50);
    let n = env_usize("BENCH_AMBIENT_ADDS", 1000);
    let c = env_usize("BENCH_AMBIENT_CONCURRENCY", 100);
    let nodes = both_nodes();
    let pods = nodes.each_ref().map(|node| {
        (
            node_pods(node, "amb", "s", serial_n, n),
            node_pods(node, "amb", "p", n, 0),
        )
    });
    let k8s_ns = nodes.each_ref().map(|node| node.k8s_ns("amb"));
    let Serial {
        mut took,
        node_cpu: serial_cpu,
        api_cpu: serial_api,
        failures: serial_failures,
    } = serial_alternating(&nodes, &k8s_ns, [&pods[0].0, &pods[1].0]);
    let serial = &mut took;
    // Each build's burst alone on the machine, Istio's first: (ADDs, wall, node CPU).
    let burst = [0, 1].map(|s| {
        let before = node_cpu(&nodes[s]);
        let wall = Instant::now();
        let adds = run_adds(&nodes[s], &k8s_ns[s], &pods[s].1, c);
        (adds, wall.elapsed(), node_cpu(&nodes[s]) - before)
    });
    for s in serial.iter_mut() {
        s.sort();
    }
    let row = |what: &str, istio: String, ours: String, ratio: String| {
        cluster::row(what, &istio, &ours, &ratio);
    };
    let ratio = cluster::ratio;
    println!(
        "| ambient ADD, real API server, same ZDS test peer, iptables | Istio | ours | ours / Istio |"
    );
    println!("| --- | --- | --- | --- |");
    for (what, q) in [
        (
            format!("one at a time ({serial_n} each, alternating): p50"),
            0.5,
        ),
        ("one at a time: p99".to_string(), 0.99),
    ] {
        let v = [0, 1].map(|s| quantile(&serial[s], q));
        row(
            &what,
            ms(v[0]),
            ms(v[1]),
            ratio(v[1].as_secs_f64(), v[0].as_secs_f64()),
        );
    }
    let per = [0, 1].map(|s| serial_cpu[s] * 1000.0 / serial[s].len().max(1) as f64);
    row(
        "one at a time: node CPU per ADD (plugin + what it ran + agent + what it ran)",
        format!("{:.1} ms", per[0]),
        format!("{:.1} ms", per[1]),
        ratio(per[1], per[0]),
    );
    let api = [0, 1].map(|s| serial_api[s] * 1000.0 / serial[s].len().max(1) as f64);
    row(
        "one at a time: kube-apiserver CPU per ADD (10 ms ticks, summed over the ADDs)",
        format!("{:.1} ms", api[0]),
        format!("{:.1} ms", api[1]),
        ratio(api[1], api[0]),
    );
    let rate = [0, 1].map(|s| n as f64 / burst[s].1.as_secs_f64());
    row(
        &format!("{n} ADDs at {c} in flight (Istio's burst first): ADD/s"),
        format!("{:.0}", rate[0]),
        format!("{:.0}", rate[1]),
        ratio(rate[1], rate[0]),
    );
    let p99 = [0, 1].map(|s| quantile(&burst[s].0.took, 0.99));
    row(
        "same: p99",
        ms(p99[0]),
        ms(p99[1]),
        ratio(p99[1].as_secs_f64(), p99[0].as_secs_f64()),
    );
    let cpu = [0, 1].map(|s| burst[s].2 * 1000.0 / n as f64);
    row(
        "same: node CPU per ADD",
        format!("{:.1} ms", cpu[0]),
        format!("{:.1} ms", cpu[1]),
        ratio(cpu[1], cpu[0]),
    );
    let failed = [0, 1].map(|s| burst[s].0.failures.len() + serial_failures[s].len());
    row(
        &format!("failed ADDs (of {n} + {serial_n})"),
        failed[0].to_string(),
        failed[1].to_string(),
        String::new(),
    );
    let held = nodes.each_ref().map(|node| node.peer.workloads().len());
    row(
        "pods the ZDS peer holds afterwards",
        held[0].to_string(),
        held[1].to_string(),
        String::new(),
    );
    for line in serial_failures
        .iter()
        .chain(burst.iter().map(|b| &b.0.failures))
        .flatten()
        .take(4)
    {
        eprintln!("failed ADD: {line}");
    }
}

/// The agent's RSS side by side with Istio's, on the real API server (one node of each build
/// running at once, `ambient_add_side_by_side`'s nodes): before any pod; with this node's pods
/// enrolled through ADD and many pods of other nodes in the API server; after the other nodes'
/// pods were deleted and recreated.
#[test]
#[ignore]
fn agent_rss_side_by_side() {
    let enrolled = env_usize("BENCH_AMBIENT_RSS_PODS", 250);
    let others = env_usize("BENCH_AMBIENT_OTHER_PODS", 5000);
    let churn = env_usize("BENCH_AMBIENT_CHURN", 3000).min(others);
    let nodes = both_nodes();
    std::thread::sleep(Duration::from_secs(3));
    let idle = nodes.each_ref().map(rss_mb);
    let cp = nodes[0].cluster().cp;
    let elsewhere = istio_cni_testing::controlplane::unique_name("elsewhere");
    cp.create_namespace(&elsewhere, &[(AMBIENT, "ambient")]);
    let other = |i: usize, generation: usize| {
        cluster::pod(
            &elsewhere,
            &format!("o{i}-g{generation}"),
            &format!("{elsewhere}-n{}", i % 50),
        )
    };
    cluster::create_pods(cp, (0..others).map(|i| other(i, 0)).collect());
    let mut failures = [0usize; 2];
    // The pods' netns stay until the end (the agents hold them enrolled).
    let mut kept = Vec::new();
    for (s, node) in nodes.iter().enumerate() {
        let pods = node_pods(node, "amb", "p", enrolled, 0);
        failures[s] = run_adds(node, &node.k8s_ns("amb"), &pods, 10)
            .failures
            .len();
        node.wait_until(
            Duration::from_secs(60),
            "all pods held by the ZDS peer",
            || node.peer.workloads().len() >= enrolled,
        );
        kept.push(pods);
    }
    std::thread::sleep(Duration::from_secs(5));
    let loaded = nodes.each_ref().map(rss_mb);
    cluster::delete_pods(
        cp,
        &elsewhere,
        (0..churn).map(|i| format!("o{i}-g0")).collect(),
    );
    cluster::create_pods(cp, (0..churn).map(|i| other(i, 1)).collect());
    std::thread::sleep(Duration::from_secs(5));
    let after = nodes.each_ref().map(rss_mb);
    let ratio = |o: f64, i: f64| format!("{:.2}", o / i);
    println!(
        "| agent (install-cni, ambient) RSS, real API server, both running | Istio | ours | ours / Istio |"
    );
    println!("| --- | --- | --- | --- |");
    println!(
        "| idle | {:.1} MB | {:.1} MB | {} |",
        idle[0],
        idle[1],
        ratio(idle[1], idle[0])
    );
    println!(
        "| {enrolled} enrolled pods on this node, {others} pods of 50 other nodes | {:.1} MB | {:.1} MB | {} |",
        loaded[0],
        loaded[1],
        ratio(loaded[1], loaded[0])
    );
    println!(
        "| after {churn} of the other nodes' pods were deleted and recreated | {:.1} MB | {:.1} MB | {} |",
        after[0],
        after[1],
        ratio(after[1], after[0])
    );
    println!(
        "| ADDs of the enrolled pods that failed | {} | {} | |",
        failures[0], failures[1]
    );
}
