//! What `ambient_bench` reads back from a run (included with `#[path]` by tests/ambient_bench.rs
//! only): the ADDs that fell back to the API server (its request log), and the latency breakdown
//! of one ambient ADD from the plugin's and the agent's timing records.

use std::collections::HashMap;
use std::time::Duration;

use crate::ambient_node::Node;
use crate::{Adds, BenchPod, ms, quantile};

/// The pods of `k8s_ns` GET by name from the API server so far (not lists or watches): each
/// is an ADD that fell back to the API server (the agent reads its pods from its watch).
pub fn pods_got(node: &Node, k8s_ns: &str) -> std::collections::HashSet<String> {
    let prefix = format!("/api/v1/namespaces/{k8s_ns}/pods/");
    node.api
        .server
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET" && !r.is_watch())
        .filter_map(|r| r.path.strip_prefix(&prefix).map(str::to_string))
        .filter(|name| !name.contains('/'))
        .collect()
}

/// The ADDs of `pods` that fell back to the API server.
pub fn fallbacks(node: &Node, k8s_ns: &str, pods: &[BenchPod]) -> usize {
    let got = pods_got(node, k8s_ns);
    pods.iter().filter(|p| got.contains(&p.name)).count()
}

/// The median of `v` (unsorted), zero when empty.
pub fn median(mut v: Vec<Duration>) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort();
    quantile(&v, 0.5)
}

/// A plugin run's `took_us` / `agent_us` (the ADD flow, the agent round trip in it) from its
/// "enrolled by the node agent" record; None on any other path.
pub fn plugin_timings(stderr: &str) -> Option<(Duration, Duration)> {
    stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|r| r["msg"] == "pod is ambient; enrolled by the node agent")
        .and_then(|r| {
            let us = |k: &str| r[k].as_u64().map(Duration::from_micros);
            Some((us("took_us")?, us("agent_us")?))
        })
}

/// The agent's `/podadd done` lines' fields (key=value, as `pass_lines` reads them).
pub fn podadd_lines(node: &Node) -> Vec<HashMap<String, String>> {
    let lines = node.agent.lines.lock().expect("lines").clone();
    lines
        .iter()
        .filter(|l| l.contains("/podadd done"))
        .map(|l| {
            l.split(['\t', ' '])
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
                .collect()
        })
        .collect()
}

/// The latency breakdown of one ambient ADD, medians over the one-at-a-time ADDs: the plugin's
/// own records split its wall time, the agent's per-step timings (`progress`) its part.
pub fn breakdown_rows(serial: &Adds, agent: &[HashMap<String, String>]) {
    let plugin: Vec<(Duration, Duration, Duration)> = serial
        .runs
        .iter()
        .filter_map(|(wall, stderr)| plugin_timings(stderr).map(|(f, a)| (*wall, f, a)))
        .collect();
    let agent_took =
        |l: &HashMap<String, String>| l.get("took_us")?.parse().ok().map(Duration::from_micros);
    let step = |name: &str| {
        median(
            agent
                .iter()
                .filter_map(|l| {
                    l.get("steps_us")?
                        .split(',')
                        .filter_map(|kv| kv.split_once(':'))
                        .find(|(k, _)| *k == name)
                        .and_then(|(_, v)| v.parse().ok())
                        .map(Duration::from_micros)
                })
                .collect(),
        )
    };
    if plugin.is_empty() || agent.is_empty() {
        println!(
            "| one ambient ADD: latency breakdown | n/a (no `/podadd` timing records: a build without them) | |"
        );
        return;
    }
    let handled = median(agent.iter().filter_map(agent_took).collect());
    let wall = median(plugin.iter().map(|p| p.0).collect());
    let flow = median(plugin.iter().map(|p| p.1).collect());
    let trip = median(plugin.iter().map(|p| p.2).collect());
    println!(
        "| one ambient ADD, medians of {} plugin runs / {} agent records: wall (exec to exit) | {} | |",
        plugin.len(),
        agent.len(),
        ms(wall)
    );
    println!(
        "| - exec, process start and exit, config and args (wall - ADD flow) | {} | |",
        ms(wall.saturating_sub(flow))
    );
    println!(
        "| - plugin work in the ADD flow outside the agent request | {} | |",
        ms(flow.saturating_sub(trip))
    );
    println!(
        "| - socket and HTTP (agent round trip - agent handling) | {} | |",
        ms(trip.saturating_sub(handled))
    );
    println!(
        "| - agent handling in all (request read to enrolled; parts below) | {} | |",
        ms(handled)
    );
    for (code, what) in [
        ("store", "agent: pod and namespace from its stores"),
        ("lock", "agent: the pod's lock"),
        ("netns_open", "agent: opening the netns"),
        (
            "netns_check",
            "agent: netns checks (identity, addresses, trust)",
        ),
        ("program", "agent: in-pod rules and routes"),
        ("zds", "agent: ZDS add and ztunnel's ack"),
        ("probe_set", "agent: host probe set"),
    ] {
        println!("| - {what} | {} | |", ms(step(code)));
    }
}
