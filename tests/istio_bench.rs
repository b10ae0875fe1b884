//! Side-by-side benchmarks against Istio's own binaries (target/istio, built by
//! scripts/build-istio from the `istio.io/istio` module), run by `just bench` (ignored in the test
//! run). Every test prints a Markdown table: what, Istio's figure, ours, and the ratio ours/Istio.
//! Both builds run in the same process run, alternately where the row is a latency, on the real
//! API server (`istio_cni_testing::controlplane`, TLS), each agent in a network namespace of its
//! own with its own ServiceAccount token (tests/istio_bench/agent.rs). Sizes are env settings so a
//! quick run is possible; the defaults are the benchmark's sizes.
//!
//! By hand: `ISTIO_CNI_RS_BIN=target/static/istio-cni-rs cargo test --test istio_bench --
//! --ignored --nocapture --test-threads=1`.

mod cni_driver;
mod install_support;

#[path = "istio_bench/agent.rs"]
mod agent;
#[path = "istio_bench/cluster.rs"]
mod cluster;
#[path = "istio_bench/many_nodes.rs"]
mod many_nodes;

use std::path::Path;
use std::time::{Duration, Instant};

use agent::{BenchAgent, Shared, Side, our_bin, proc_cpu};
use cluster::{env_usize, mean, ms, quantile, ratio, row};
use cni_driver::{NetnsGuard, Run, cni_env, run_cni};
use istio_cni_testing::controlplane::{self, ControlPlane, unique_name};
use istio_cni_testing::istio::istio_bin;
use serde_json::json;

/// The node's primary CNI network (what both install-cnis chain onto).
fn primary_conflist() -> String {
    json!({"cniVersion": "1.0.0", "name": "k8s-pod-network", "plugins": [
        {"type": "bridge", "bridge": "cni0", "ipam": {"type": "host-local", "subnet": "10.29.0.0/24"}},
        {"type": "portmap", "capabilities": {"portMappings": true}}
    ]})
    .to_string()
}

fn sidecar_settings(node: &str) -> Vec<(&'static str, String)> {
    vec![
        ("REPAIR_ENABLED", "true".into()),
        ("REPAIR_NODE_NAME", node.into()),
        ("NODE_NAME", node.into()),
    ]
}

fn start_agent(
    cp: &ControlPlane,
    shared: &Shared,
    side: Side,
    settings: &[(&'static str, String)],
) -> BenchAgent {
    let settings: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let name = unique_name(&format!("agent-{}", side.name().to_lowercase()));
    BenchAgent::start(
        cp,
        shared,
        side,
        &name,
        &settings,
        &[("10-bench.conflist", primary_conflist())],
    )
}

/// One plugin ADD of `side` into a fresh netns: the run, its CPU (the plugin and the processes
/// it waited for), the agent's and the API server's CPU across it.
struct Add {
    run: Run,
    plugin_cpu: Duration,
    agent_cpu: Duration,
    apiserver_cpu: Duration,
}

fn add_once(side: Side, agent: &BenchAgent, apiserver: u32, pod: (&str, &str, &str)) -> Add {
    let ns = NetnsGuard::new("iadd");
    // The pod's interface and address as the primary plugin leaves them (Istio's plugin looks
    // for a local address), made before the clock starts.
    for line in [
        "link set lo up",
        "link add eth0 type veth peer name peer0",
        "addr add 10.29.0.2/24 dev eth0",
        "link set eth0 up",
    ] {
        ns.ip(line);
    }
    let conf = json!({
        "cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "istio-cni",
        "cni_agent_run_dir": agent.run_dir.display().to_string(),
        "plugin_log_level": "info", "exclude_namespaces": ["kube-system"],
        "pod_namespace": "istio-system",
        "prevResult": {"cniVersion": "1.0.0", "ips": [{"address": "10.29.0.2/24"}], "dns": {}}
    })
    .to_string();
    let mut env = cni_env("ADD", &ns.path().display().to_string(), pod.0, pod.1);
    // containerd and CRI-O send the pod's UID too.
    for (k, v) in env.iter_mut() {
        if *k == "CNI_ARGS" {
            v.push_str(&format!(";K8S_POD_UID={}", pod.2));
        }
    }
    let (agent_before, api_before, plugin_before) =
        (agent.cpu(), proc_cpu(apiserver), children_cpu());
    let run = match side {
        Side::Istio => run_cni(&istio_bin("istio-cni"), &[], &env, &conf),
        Side::Ours => run_cni(&our_bin(), &["istio-cni"], &env, &conf),
    };
    let add = Add {
        plugin_cpu: children_cpu().saturating_sub(plugin_before),
        agent_cpu: agent.cpu().saturating_sub(agent_before),
        apiserver_cpu: proc_cpu(apiserver).saturating_sub(api_before),
        run,
    };
    assert_eq!(
        add.run.code,
        0,
        "{} plugin ADD failed: {}{}",
        side.name(),
        add.run.stdout,
        add.run.stderr
    );
    add
}

/// CPU (user + system) of this process's reaped children so far.
fn children_cpu() -> Duration {
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
        .expect("getrusage");
    let micros = |t: nix::sys::time::TimeVal| t.tv_sec() as u64 * 1_000_000 + t.tv_usec() as u64;
    Duration::from_micros(micros(usage.user_time()) + micros(usage.system_time()))
}

/// Sidecar ADD with each build's install-cni up (sidecar mode, repair on, as the chart runs it),
/// the pod on the real API server over TLS: Istio's plugin with Istio's install-cni beside it,
/// ours with ours, alternating ADD by ADD, each into a fresh netns.
#[test]
#[ignore]
fn sidecar_add_side_by_side() {
    cni_driver::require_tool("iptables-restore", "iptables");
    let rounds = env_usize("BENCH_ISTIO_SIDECAR_ADDS", 100);
    let cp = controlplane::shared();
    let shared = Shared::new(cp, false);
    let node = unique_name("sc-node");
    cp.create_node(&node, "10.0.0.1");
    let app = unique_name("sc-app");
    cp.create_namespace(&app, &[]);
    let created = cp.create(&cluster::sidecar_pod(&app, "bench", &node, "sc"));
    let uid = created["metadata"]["uid"]
        .as_str()
        .expect("uid")
        .to_string();
    cp.set_pod_status(
        &app,
        "bench",
        json!({"phase": "Pending", "podIP": "10.29.0.2", "podIPs": [{"ip": "10.29.0.2"}]}),
    );
    let settings = sidecar_settings(&node);
    let mut agents = [Side::Istio, Side::Ours].map(|side| {
        let mut a = start_agent(cp, &shared, side, &settings);
        a.wait_ready(Duration::from_secs(60));
        a
    });
    // Our agent answers from its pod store: give its watch the pod before the clock starts.
    std::thread::sleep(Duration::from_secs(2));
    let apiserver = agent::apiserver_pid(cp).expect("kube-apiserver's pid");
    let marks = agents.each_ref().map(|_| cp.audit_mark());
    let mut adds: [Vec<Add>; 2] = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        // Alternate which build goes first, so neither always runs on the warmer cache.
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            adds[i].push(add_once(
                agents[i].side,
                &agents[i],
                apiserver,
                (&app, "bench", &uid),
            ));
        }
    }
    let requests = [0, 1].map(|i| cp.requests_of(&agents[i].user, marks[i]).len());
    if std::env::var_os("BENCH_SHOW_REQUESTS").is_some() {
        for a in &agents {
            eprintln!("{}: {:?}", a.side.name(), cp.requests_of(&a.user, marks[0]));
        }
    }
    let wall = adds
        .each_ref()
        .map(|a| a.iter().map(|x| x.run.took).collect::<Vec<_>>());
    let per = |i: usize, f: fn(&Add) -> Duration| adds[i].iter().map(f).collect::<Vec<_>>();
    let plugin = [0, 1].map(|i| per(i, |a| a.plugin_cpu));
    let agent_cpu = [0, 1].map(|i| mean(&per(i, |a| a.agent_cpu)));
    let api_cpu = [0, 1].map(|i| mean(&per(i, |a| a.apiserver_cpu)));
    let total = [0, 1].map(|i| quantile(&plugin[i], 0.5) + agent_cpu[i]);
    println!(
        "| sidecar ADD, agent up, real API server over TLS ({rounds} each, alternating, fresh netns each) | Istio | ours | ours / Istio |"
    );
    println!("| --- | --- | --- | --- |");
    let r = |a: Duration, b: Duration| ratio(b.as_secs_f64(), a.as_secs_f64());
    for (what, q) in [
        ("wall p50 (process spawn to exit)", 0.5),
        ("wall p99", 0.99),
    ] {
        let (a, b) = (quantile(&wall[0], q), quantile(&wall[1], q));
        row(what, &ms(a), &ms(b), &r(a, b));
    }
    let (a, b) = (quantile(&plugin[0], 0.5), quantile(&plugin[1], 0.5));
    row(
        "CPU of the plugin and the processes it ran (median)",
        &ms(a),
        &ms(b),
        &r(a, b),
    );
    row(
        "CPU of install-cni during an ADD (mean; 10 ms ticks, so over many ADDs)",
        &ms(agent_cpu[0]),
        &ms(agent_cpu[1]),
        &r(agent_cpu[0], agent_cpu[1]),
    );
    row(
        "CPU of every node process per ADD (plugin median + install-cni mean)",
        &ms(total[0]),
        &ms(total[1]),
        &r(total[0], total[1]),
    );
    row(
        "kube-apiserver CPU during an ADD (mean)",
        &ms(api_cpu[0]),
        &ms(api_cpu[1]),
        &r(api_cpu[0], api_cpu[1]),
    );
    let per_add = |n: usize| format!("{:.2}", n as f64 / rounds as f64);
    row(
        "API requests per ADD (plugin and agent, the agent's account)",
        &per_add(requests[0]),
        &per_add(requests[1]),
        &ratio(requests[1] as f64, requests[0] as f64),
    );
    for a in &mut agents {
        a.stop();
    }
}

/// The primary config rewritten without the plugin (as a primary CNI's own install does) and the
/// time until the file holds an `istio-cni` entry again; `None` after `timeout`.
fn rewrite_and_wait(agent: &BenchAgent, timeout: Duration) -> Option<Duration> {
    let file = agent.net_dir.join("10-bench.conflist");
    let start = Instant::now();
    std::fs::write(&file, primary_conflist()).expect("rewrite the primary config");
    while start.elapsed() < timeout {
        if std::fs::read_to_string(&file).is_ok_and(|t| t.contains("\"istio-cni\"")) {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    None
}

/// install-cni from spawn to its readiness endpoint answering 200 (with the plugin installed and
/// the conflist written), alternating the builds, a fresh netns and dirs each; then on a running
/// one the primary config rewritten and the time until our entry is back, alternating too.
#[test]
#[ignore]
fn install_cni_start_and_rewrite_side_by_side() {
    let starts = env_usize("BENCH_ISTIO_STARTS", 10);
    let rewrites = env_usize("BENCH_ISTIO_REWRITES", 50);
    let cp = controlplane::shared();
    let shared = Shared::new(cp, true);
    let node = unique_name("st-node");
    let settings = sidecar_settings(&node);
    let mut ready: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    let mut ready_cpu: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    for round in 0..starts {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let side = [Side::Istio, Side::Ours][i];
            let mut a = start_agent(cp, &shared, side, &settings);
            ready[i].push(a.wait_ready(Duration::from_secs(60)));
            ready_cpu[i].push(a.cpu());
            a.stop();
            let _ = std::fs::remove_dir_all(&a.root);
        }
    }
    let agents = [Side::Istio, Side::Ours].map(|side| {
        let mut a = start_agent(cp, &shared, side, &settings);
        a.wait_ready(Duration::from_secs(60));
        a
    });
    std::thread::sleep(Duration::from_secs(1));
    let mut back: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    let mut missed = [0usize; 2];
    for round in 0..rewrites {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            match rewrite_and_wait(&agents[i], Duration::from_secs(10)) {
                Some(d) => back[i].push(d),
                None => missed[i] += 1,
            }
            // The watcher settles (a rewrite also triggers its own file event).
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let idle = agents.each_ref().map(|a| a.rss_mb());
    println!(
        "| install-cni ({starts} starts, {rewrites} rewrites each, alternating) | Istio | ours | ours / Istio |"
    );
    println!("| --- | --- | --- | --- |");
    let r = |a: Duration, b: Duration| ratio(b.as_secs_f64(), a.as_secs_f64());
    let (a, b) = (quantile(&ready[0], 0.5), quantile(&ready[1], 0.5));
    row(
        "start to ready (spawn to `/readyz` 200: plugin copied, conflist written), median",
        &ms(a),
        &ms(b),
        &r(a, b),
    );
    let (a, b) = (quantile(&ready_cpu[0], 0.5), quantile(&ready_cpu[1], 0.5));
    row("CPU from start to ready, median", &ms(a), &ms(b), &r(a, b));
    for (what, q) in [
        ("primary conflist rewritten -> our entry back, median", 0.5),
        ("same, p99", 0.99),
    ] {
        let (a, b) = (quantile(&back[0], q), quantile(&back[1], q));
        row(what, &ms(a), &ms(b), &r(a, b));
    }
    row(
        "rewrites not answered within 10 s",
        &missed[0].to_string(),
        &missed[1].to_string(),
        "",
    );
    row(
        "install-cni RSS idle (sidecar mode, repair on)",
        &format!("{:.1} MB", idle[0]),
        &format!("{:.1} MB", idle[1]),
        &ratio(idle[1], idle[0]),
    );
    drop(agents);
}

/// Binary sizes, and the image: ours as built, Istio's as the sum of its binaries on the same
/// base (Istio's images cannot be pulled offline). `BENCH_IMAGE_BYTES` and `BENCH_BASE_BYTES`
/// come from scripts/bench (podman's figures).
#[test]
#[ignore]
fn sizes_side_by_side() {
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let mb = |b: u64| format!("{:.1} MB", b as f64 / 1e6);
    let ours = size(&our_bin());
    let istio: Vec<(&str, u64)> = ["istio-cni", "install-cni", "pilot-agent"]
        .into_iter()
        .map(|b| (b, size(&istio_bin(b))))
        .collect();
    let istio_sum: u64 = istio.iter().map(|(_, s)| s).sum();
    println!("| size | Istio | ours | ours / Istio |");
    println!("| --- | --- | --- | --- |");
    row(
        "binaries (Istio: istio-cni + install-cni + pilot-agent for `istio-iptables`; ours: one for all roles)",
        &format!(
            "{} ({})",
            mb(istio_sum),
            istio
                .iter()
                .map(|(n, s)| format!("{n} {}", mb(*s)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        &mb(ours),
        &ratio(ours as f64, istio_sum as f64),
    );
    let env_u64 = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    if let (Some(image), Some(base)) = (env_u64("BENCH_IMAGE_BYTES"), env_u64("BENCH_BASE_BYTES")) {
        // Istio's cni image carries its two CNI binaries on its base (pilot-agent is not in it).
        let istio_cni_image = base + istio[0].1 + istio[1].1;
        row(
            "image (ours: podman's size; Istio's: our base + its istio-cni and install-cni, an estimate: its images are not available offline)",
            &mb(istio_cni_image),
            &mb(image),
            &ratio(image as f64, istio_cni_image as f64),
        );
    }
}

/// Many agents of each build, one build at a time, on one real API server
/// (tests/istio_bench/many_nodes.rs), and the 5,000-node estimate from their per-agent figures.
#[test]
#[ignore]
fn many_nodes_side_by_side() {
    let sizes = many_nodes::Sizes {
        agents: env_usize("BENCH_ISTIO_NODES", 50),
        pods: env_usize("BENCH_ISTIO_NODE_PODS", 5000),
        churn: env_usize("BENCH_ISTIO_NODE_CHURN", 1000),
    };
    let cp = controlplane::shared();
    let shared = Shared::new(cp, false);
    let nodes: Vec<String> = (0..sizes.agents)
        .map(|i| unique_name(&format!("mn-node{i}")))
        .collect();
    let ns = unique_name("mn-pods");
    cp.create_namespace(&ns, &[]);
    cluster::create_pods(
        cp,
        (0..sizes.pods)
            .map(|i| cluster::pod(&ns, &format!("p{i}"), &nodes[i % nodes.len()]))
            .collect(),
    );
    let churn_ns = unique_name("mn-churn");
    cp.create_namespace(&churn_ns, &[]);
    let istio = many_nodes::run_side(cp, &shared, Side::Istio, &nodes, &churn_ns, &sizes);
    let ours = many_nodes::run_side(cp, &shared, Side::Ours, &nodes, &churn_ns, &sizes);
    many_nodes::report(&sizes, &[istio, ours]);
    // Why the bytes differ: one node's pod list as the server sends it for each encoding.
    let pods_per_node = sizes.pods.div_ceil(sizes.agents.max(1));
    println!();
    println!(
        "| one node's pod list ({pods_per_node} pods) as the server sends it, by what the client accepts | bytes |"
    );
    println!("| --- | --- |");
    for (accept, bytes) in cluster::list_sizes(cp, &nodes[0]) {
        println!("| {accept} | {:.1} kB |", bytes as f64 / 1e3);
    }
}
