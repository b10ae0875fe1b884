//! Many node agents on one real API server: one build's agents at a time (so the server's CPU is
//! that build's), each with its own node name, run dir, netns and ServiceAccount, in sidecar mode
//! with repair on (the mode that needs no netns privileges: the pod watch of its node is all the
//! API work). Pods spread over the nodes exist before the agents start; then pods are created and
//! deleted. Per agent: requests at start-up and during the churn (the audit log, by user), bytes
//! the server sent it (its relay), watches it holds (the server's open watches with the agents
//! up, less those without, per agent); and the server's CPU.

use std::time::{Duration, Instant};

use istio_cni_testing::controlplane::{ControlPlane, unique_name};

use super::agent::{BenchAgent, Shared, Side, apiserver_pid, proc_cpu};
use super::cluster;

/// The sizes of one run.
pub struct Sizes {
    pub agents: usize,
    pub pods: usize,
    pub churn: usize,
}

/// What one build's agents did, totals over all agents.
#[derive(Default, Clone)]
pub struct Figures {
    pub agents: usize,
    pub start_requests: usize,
    pub start_watches: usize,
    pub start_bytes: u64,
    pub churn_requests: usize,
    pub churn_watches: usize,
    pub churn_bytes: u64,
    pub watches_held: f64,
    pub start_api_cpu: Duration,
    pub churn_api_cpu: Duration,
    pub agents_cpu: Duration,
    pub rss_mb: f64,
    pub ready_s: f64,
}

fn watches(verbs: &[String]) -> usize {
    verbs.iter().filter(|verb| *verb == "watch").count()
}

/// Each agent's verbs since `mark`.
fn requests(cp: &ControlPlane, agents: &[BenchAgent], mark: usize) -> Vec<Vec<String>> {
    let mut by_user = cluster::requests_by_user(cp, mark);
    agents
        .iter()
        .map(|a| by_user.remove(&a.user).unwrap_or_default())
        .collect()
}

/// Starts `sizes.agents` agents of `side` on nodes `node-0..`, waits for all to be ready and
/// settle, churns, and stops them.
pub fn run_side(
    cp: &ControlPlane,
    shared: &Shared,
    side: Side,
    nodes: &[String],
    churn_ns: &str,
    sizes: &Sizes,
) -> Figures {
    let apiserver = apiserver_pid(cp).expect("kube-apiserver's pid");
    let base_watches = cluster::open_watches(cp);
    let (mark, api_before) = (cp.audit_mark(), proc_cpu(apiserver));
    let t0 = Instant::now();
    let mut agents: Vec<BenchAgent> = nodes
        .iter()
        .map(|node| {
            let name = unique_name(&format!("mn-{}", side.name().to_lowercase()));
            BenchAgent::start(
                cp,
                shared,
                side,
                &name,
                &[
                    ("REPAIR_ENABLED", "true"),
                    ("REPAIR_NODE_NAME", node),
                    ("NODE_NAME", node),
                ],
                &[("10-bench.conflist", super::primary_conflist())],
            )
        })
        .collect();
    for a in &mut agents {
        a.wait_ready(Duration::from_secs(300));
    }
    let ready_s = t0.elapsed().as_secs_f64();
    // Start-up includes the first lists and watches; let slow starters finish them.
    std::thread::sleep(Duration::from_secs(10));
    let mut f = Figures {
        agents: agents.len(),
        ready_s,
        start_api_cpu: proc_cpu(apiserver).saturating_sub(api_before),
        watches_held: (cluster::open_watches(cp) - base_watches) / agents.len() as f64,
        ..Figures::default()
    };
    let start_requests = requests(cp, &agents, mark);
    if std::env::var_os("BENCH_SHOW_REQUESTS").is_some() {
        eprintln!(
            "{} start-up: {:?}",
            side.name(),
            cp.requests_of(&agents[0].user, mark)
        );
    }
    f.start_requests = start_requests.iter().map(Vec::len).sum();
    f.start_watches = start_requests.iter().map(|r| watches(r)).sum();
    f.start_bytes = agents.iter().map(|a| a.relay.bytes_received()).sum();
    let (mark, api_before) = (cp.audit_mark(), proc_cpu(apiserver));
    let bytes_before: Vec<u64> = agents.iter().map(|a| a.relay.bytes_received()).collect();
    let cpu_before: Vec<Duration> = agents.iter().map(|a| a.cpu()).collect();
    // The churn: new pods spread over the nodes, then deleted.
    let prefix = unique_name("churn");
    let names: Vec<String> = (0..sizes.churn).map(|i| format!("{prefix}-{i}")).collect();
    cluster::create_pods(
        cp,
        names
            .iter()
            .enumerate()
            .map(|(i, n)| cluster::pod(churn_ns, n, &nodes[i % nodes.len()]))
            .collect(),
    );
    cluster::delete_pods(cp, churn_ns, names);
    std::thread::sleep(Duration::from_secs(5));
    f.churn_api_cpu = proc_cpu(apiserver).saturating_sub(api_before);
    let churn_requests = requests(cp, &agents, mark);
    f.churn_requests = churn_requests.iter().map(Vec::len).sum();
    f.churn_watches = churn_requests.iter().map(|r| watches(r)).sum();
    f.churn_bytes = agents
        .iter()
        .zip(&bytes_before)
        .map(|(a, b)| a.relay.bytes_received() - b)
        .sum();
    f.agents_cpu = agents
        .iter()
        .zip(&cpu_before)
        .map(|(a, b)| a.cpu().saturating_sub(*b))
        .sum();
    f.rss_mb = agents.iter().map(|a| a.rss_mb()).sum::<f64>() / agents.len() as f64;
    for a in &mut agents {
        a.stop();
    }
    f
}

/// Prints the table, then the 5,000-node estimate.
pub fn report(sizes: &Sizes, f: &[Figures; 2]) {
    let n = |x: &Figures| x.agents.max(1) as f64;
    let per = |x: &Figures, v: f64| v / n(x);
    println!(
        "| many nodes on one real API server: {} agents per build, {} pods over their nodes, then {} pods created and deleted | Istio | ours | ours / Istio |",
        sizes.agents, sizes.pods, sizes.churn
    );
    println!("| --- | --- | --- | --- |");
    let line = |what: &str, get: &dyn Fn(&Figures) -> f64, unit: &str, digits: usize| {
        let (a, b) = (get(&f[0]), get(&f[1]));
        cluster::row(
            what,
            &format!("{a:.digits$}{unit}"),
            &format!("{b:.digits$}{unit}"),
            &cluster::ratio(b, a),
        );
    };
    line(
        "requests per agent at start-up",
        &|x| per(x, x.start_requests as f64),
        "",
        1,
    );
    line(
        "of which watches",
        &|x| per(x, x.start_watches as f64),
        "",
        1,
    );
    line(
        "bytes received per agent at start-up",
        &|x| per(x, x.start_bytes as f64) / 1e3,
        " kB",
        1,
    );
    line(
        "requests per agent during the churn",
        &|x| per(x, x.churn_requests as f64),
        "",
        2,
    );
    line(
        "of which watches (re-opened)",
        &|x| per(x, x.churn_watches as f64),
        "",
        2,
    );
    line(
        "bytes received per agent during the churn",
        &|x| per(x, x.churn_bytes as f64) / 1e3,
        " kB",
        1,
    );
    line("watches held per agent", &|x| x.watches_held, "", 2);
    line(
        "kube-apiserver CPU, all agents starting (spawn to ready + 10 s)",
        &|x| x.start_api_cpu.as_secs_f64(),
        " s",
        2,
    );
    line(
        "kube-apiserver CPU during the churn (its own work for the pods included)",
        &|x| x.churn_api_cpu.as_secs_f64(),
        " s",
        2,
    );
    line(
        "agents' CPU during the churn, per agent",
        &|x| per(x, x.agents_cpu.as_secs_f64() * 1e3),
        " ms",
        1,
    );
    line("agent RSS, mean", &|x| x.rss_mb, " MB", 1);
    line("all agents spawned to all ready", &|x| x.ready_s, " s", 1);
    estimate(sizes, f);
}

/// The 5,000-node estimate from the per-agent figures, each with its formula.
fn estimate(sizes: &Sizes, f: &[Figures; 2]) {
    let per = |x: &Figures, v: f64| v / x.agents.max(1) as f64;
    println!();
    println!("Estimate for 5,000 nodes (N = 5000), from the per-agent figures above:");
    println!();
    println!("| estimate | formula | Istio | ours |");
    println!("| --- | --- | --- | --- |");
    let est = |what: &str, formula: &str, get: &dyn Fn(&Figures) -> String| {
        println!("| {what} | {formula} | {} | {} |", get(&f[0]), get(&f[1]));
    };
    const N: f64 = 5000.0;
    est(
        "requests when every agent starts (a rollout)",
        "N x requests per agent at start-up",
        &|x| format!("{:.0}", N * per(x, x.start_requests as f64)),
    );
    est(
        "bytes sent when every agent starts",
        "N x bytes per agent at start-up (each agent lists only its node's pods)",
        &|x| format!("{:.1} MB", N * per(x, x.start_bytes as f64) / 1e6),
    );
    est(
        "watches the API server holds",
        "N x watches held per agent",
        &|x| format!("{:.0}", N * x.watches_held),
    );
    est(
        "bytes sent per pod event",
        "bytes during the churn over all agents / (2 x pods churned): an event goes to its node's agent only, so this does not grow with N",
        &|x| {
            format!(
                "{:.0} B",
                x.churn_bytes as f64 / (2.0 * sizes.churn.max(1) as f64)
            )
        },
    );
    est(
        "requests per pod event",
        "requests during the churn over all agents / (2 x pods churned)",
        &|x| {
            format!(
                "{:.3}",
                x.churn_requests as f64 / (2.0 * sizes.churn.max(1) as f64)
            )
        },
    );
}
