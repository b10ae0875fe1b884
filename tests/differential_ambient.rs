//! Differential conformance of ambient enrolment: the same generated pods
//! (tests/differential/ambient_gen.rs) enrolled by Istio's own install-cni with AMBIENT_ENABLED
//! (built by scripts/build-istio, run chrooted as tests/support/istio_root.rs describes) and by
//! ours, one run each on a node of its own (tests/support/ambient_node.rs: a node netns, the real
//! kube-apiserver with the chart's RBAC, the real CNI chain with each side's own plugin, the
//! same ZDS test peer standing in for ztunnel), with the same settings.
//!
//! Per run: the pods are created, ADDed through the chain in order (a container process started
//! in those the case says), and set Running; then the agent is killed and started again; then
//! the pods the case says are labelled out of the mesh; then the pods the case says are torn down
//! (CNI DEL) and deleted. Compared ([`Facets`]): each ADD's outcome and addresses, the
//! pods' redirection annotation, each pod's in-pod rules (iptables of both flavours or native
//! nftables, with the `ip rule`/table-100 routes) after the ADDs and after the restart, the
//! node's host rules, the probe set members after each step, and every ZDS message the peer got
//! on each connection (PodWorkload fields, fd count; a snapshot's order is not the protocol's,
//! so it is sorted). Normalised, because they must differ: pod UIDs (shown as the pod's name) and
//! the server's per-run suffix of namespace and node names.
//!
//! Deliberate differences are in tests/differential/ambient_allowlist.json (the shape of the
//! other allowlists: behaviour, why, the docs line, a `rule` implemented below). The test fails
//! on a difference no combination of rules explains and on an entry no case needed. A fixed
//! seed by default; ISTIO_DIFF_SEED picks another (printed), ISTIO_DIFF_AMBIENT_CASES the count.
//! A failing case is shrunk before it is shown.

#[path = "support/ambient_node.rs"]
mod ambient_node;
mod install_support;
mod support;

#[path = "differential/ambient_gen.rs"]
mod generator;
#[path = "differential/rule_list.rs"]
mod rule_list;
#[path = "differential/suite.rs"]
mod suite;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use ambient_node::{Backend, NODE, Node, PodNs, PodProcess, result_ip};
use generator::{Case, NAMESPACES, Rng};
use serde_json::json;
use support::real_cluster::RealCluster;
use support::zds_peer::Seen;

const DEFAULT_CASES: u64 = 6;
/// The seed of a run without ISTIO_DIFF_SEED; every allowlist entry occurs in its cases.
const DEFAULT_SEED: u64 = 1;

/// What a run left, by facet name; each facet a list of lines.
type Facets = BTreeMap<String, Vec<String>>;

#[derive(Clone, Debug)]
struct Outcome {
    facets: Facets,
    log: String,
}

/// Names that must differ between the runs, turned into the generated ones.
struct Names {
    suffix: String,
    uids: Vec<(String, String)>,
}

impl Names {
    fn apply(&self, text: &str) -> String {
        let mut t = text.to_string();
        for (uid, name) in &self.uids {
            t = t.replace(uid, name);
        }
        t.replace(&self.suffix, "")
    }
}

/// Polls until `snapshot` stops changing for a while (or a bound passes).
fn settle<T: PartialEq>(mut snapshot: impl FnMut() -> T) {
    let (start, mut last, mut since) = (Instant::now(), snapshot(), Instant::now());
    while start.elapsed() < Duration::from_secs(8) && since.elapsed() < Duration::from_millis(800) {
        std::thread::sleep(Duration::from_millis(50));
        let now = snapshot();
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
}

fn lines_of(out: std::process::Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// iptables lines of ours and Istio's (either flavour), counters dropped, flavour named.
fn iptables_lines(exec: impl Fn(&str) -> std::process::Output) -> Vec<String> {
    let mut lines = Vec::new();
    for tool in ["iptables-legacy-save", "iptables-nft-save"] {
        let mut table = String::new();
        for l in lines_of(exec(tool)) {
            if let Some(t) = l.strip_prefix('*') {
                table = t.to_string();
            } else if l.contains("ISTIO") || l.contains("istio") {
                let l = l.split(" [").next().unwrap_or(&l).to_string();
                lines.push(format!("{tool} {table}: {l}"));
            }
        }
    }
    lines
}

/// `nft list ruleset` of the Istio tables, counters dropped.
fn nft_lines(out: std::process::Output) -> Vec<String> {
    let mut lines = Vec::new();
    let mut keep = false;
    for l in lines_of(out) {
        let t = l.trim();
        if let Some(table) = t.strip_prefix("table ") {
            keep = table.contains("istio");
        }
        if keep && !t.is_empty() {
            let words: Vec<&str> = t.split_whitespace().collect();
            let mut kept = Vec::new();
            let mut i = 0;
            while i < words.len() {
                if matches!(words[i], "packets" | "bytes") {
                    i += 2;
                    continue;
                }
                kept.push(words[i]);
                i += 1;
            }
            lines.push(kept.join(" "));
        }
    }
    lines
}

fn inpod_rules(node: &Node, pod: &PodNs) -> Vec<String> {
    let mut lines = match node.backend {
        Backend::Iptables => iptables_lines(|tool| pod.guard.exec(tool, &[])),
        Backend::Nftables => nft_lines(pod.guard.exec("nft", &["list", "ruleset"])),
    };
    for args in [
        &["-4", "rule", "show"][..],
        &["-6", "rule", "show"],
        &["-4", "route", "show", "table", "100"],
        &["-6", "route", "show", "table", "100"],
    ] {
        let out = pod.guard.exec("ip", args);
        lines.extend(
            lines_of(out)
                .into_iter()
                .filter(|l| !l.contains("lookup local") && !l.contains("lookup main"))
                .filter(|l| !l.contains("lookup default"))
                .map(|l| format!("ip {}: {l}", args.join(" "))),
        );
    }
    lines
}

fn host_rules(node: &Node, names: &Names) -> Vec<String> {
    let lines = match node.backend {
        Backend::Iptables => iptables_lines(|tool| node.ns.try_exec(tool, &[])),
        Backend::Nftables => nft_lines(node.ns.try_exec("nft", &["list", "ruleset"])),
    };
    lines.iter().map(|l| names.apply(l)).collect()
}

fn probes(node: &Node, names: &Names) -> Vec<String> {
    let mut all = Vec::new();
    for set in ["istio-inpod-probes-v4", "istio-inpod-probes-v6"] {
        for (ip, comment) in node.probe_set_members(set) {
            all.push(format!("{set}: {ip} {}", names.apply(&comment)));
        }
    }
    all.sort();
    all
}

fn seen(s: &Seen, names: &Names) -> String {
    let text = match s {
        Seen::Add {
            uid,
            name,
            namespace,
            service_account,
            fds,
        } => format!("Add {uid} name={name} ns={namespace} sa={service_account} fds={fds}"),
        Seen::Keep { uid, fds } => format!("Keep {uid} fds={fds}"),
        Seen::Del { uid } => format!("Del {uid}"),
        other => format!("{other:?}"),
    };
    names.apply(&text)
}

/// The peer's messages per connection that carried any (numbered in order: a connection the
/// agent closed before sending anything is not a message), the part before SnapshotSent sorted.
fn zds(node: &Node, names: &Names) -> Vec<(String, Vec<String>)> {
    let mut conns: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for (conn, s) in node.peer.all_requests() {
        conns.entry(conn).or_default().push(seen(&s, names));
    }
    conns
        .into_values()
        .enumerate()
        .map(|(i, mut msgs)| {
            if let Some(at) = msgs.iter().position(|m| m == "SnapshotSent") {
                msgs[..at].sort();
            }
            (format!("zds connection {}", i + 1), msgs)
        })
        .collect()
}

/// Sets the pod's `istio.io/dataplane-mode` label, as an operator would.
fn relabel(node: &Node, namespace: &str, name: &str, mode: &str) {
    let cluster = node.cluster();
    let (client, ns, pod) = (cluster.cp.client(), cluster.ns(namespace), name.to_string());
    let patch = json!({"metadata": {"labels": {"istio.io/dataplane-mode": mode}}});
    cluster
        .cp
        .block_on(async move {
            kube::api::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client, &ns)
                .patch(&pod, &Default::default(), &kube::api::Patch::Merge(patch))
                .await
                .map(|_| ())
        })
        .unwrap_or_else(|e| panic!("relabel pod {namespace}/{name}: {e}"));
}

/// Which pods the peer runs a proxy for, and whether in the pod's own netns (the fd it got).
fn proxies(node: &Node, pods: &[PodNs], names: &Names) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let mut lines = Vec::new();
    for ((uid, name), pod) in names.uids.iter().zip(pods) {
        if let Some(got) = node.peer.netns_of(uid) {
            let own = std::fs::metadata(pod.guard.path()).map(|m| (m.dev(), m.ino()));
            let own = own.is_ok_and(|ids| ids == got);
            lines.push(format!("{name}: in its own netns {own}"));
        }
    }
    lines
}

fn redirections(node: &Node, case: &Case) -> Vec<String> {
    case.pods
        .iter()
        .map(|p| {
            let got = node.get_pod(case.namespace(p), &p.name).map(|pod| {
                pod.metadata
                    .annotations
                    .and_then(|a| a.get("ambient.istio.io/redirection").cloned())
            });
            format!("{}: {got:?}", p.name)
        })
        .collect()
}

/// One run of `case` with Istio's agent or ours.
fn run(case: &Case, istio: bool) -> Outcome {
    let cluster = RealCluster::start();
    let suffix = cluster.ns("");
    let backend = if case.nftables {
        Backend::Nftables
    } else {
        Backend::Iptables
    };
    let env = case.env(|n| cluster.ns(n));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut node = if istio {
        Node::start_istio_on(cluster, backend, &env)
    } else {
        Node::start_real_on(cluster, backend, &env)
    };
    for (ns, label) in NAMESPACES {
        let labels = label.map_or(json!({}), |l| json!({"istio.io/dataplane-mode": l}));
        node.namespace(ns, labels);
    }
    let mut facets = Facets::new();
    let mut uids = Vec::new();
    let mut pods = Vec::new();
    let mut processes = Vec::new();
    let mut adds = Vec::new();
    for p in &case.pods {
        let pod = serde_json::from_value(case.pod_json(p, NODE)).expect("Pod");
        node.cluster().add_pod(pod).expect("add pod");
        let uid = node
            .get_pod(case.namespace(p), &p.name)
            .and_then(|p| p.metadata.uid)
            .expect("uid");
        uids.push((uid.clone(), format!("<uid of {}>", p.name)));
        let netns = PodNs::new(&p.name);
        match node.add(&netns, case.namespace(p), &p.name) {
            Ok(result) => {
                let ip = result_ip(&result);
                adds.push(format!("{}: ok {ip}", p.name));
                if p.process {
                    processes.push(PodProcess::start(&netns, &uid));
                }
                node.set_running(case.namespace(p), &p.name, &ip);
            }
            Err(_) => adds.push(format!("{}: failed", p.name)),
        }
        pods.push(netns);
    }
    let names = Names { suffix, uids };
    facets.insert("ADD".into(), adds);
    let quiet = |node: &Node| {
        settle(|| {
            (
                node.peer.all_requests().len(),
                redirections(node, case),
                node.probe_members(),
            )
        })
    };
    quiet(&node);
    let inpod = |node: &Node, facets: &mut Facets, when: &str| {
        for (p, netns) in case.pods.iter().zip(&pods) {
            facets.insert(
                format!("{when}: in-pod rules of {}", p.name),
                inpod_rules(node, netns),
            );
        }
    };
    inpod(&node, &mut facets, "enrolled");
    facets.insert("enrolled: redirection".into(), redirections(&node, case));
    facets.insert("enrolled: host rules".into(), host_rules(&node, &names));
    facets.insert("enrolled: probe set".into(), probes(&node, &names));

    facets.insert("enrolled: proxies".into(), proxies(&node, &pods, &names));
    node.restart_agent_killed();
    quiet(&node);
    facets.insert("restarted: proxies".into(), proxies(&node, &pods, &names));
    inpod(&node, &mut facets, "restarted");
    facets.insert("restarted: host rules".into(), host_rules(&node, &names));
    facets.insert("restarted: probe set".into(), probes(&node, &names));

    for p in case.pods.iter().filter(|p| p.unenrol) {
        relabel(&node, case.namespace(p), &p.name, "none");
    }
    quiet(&node);
    for (p, netns) in case.pods.iter().zip(&pods).filter(|(p, _)| p.unenrol) {
        let rules = inpod_rules(&node, netns);
        facets.insert(format!("unenrolled: in-pod rules of {}", p.name), rules);
    }
    facets.insert("unenrolled: redirection".into(), redirections(&node, case));
    facets.insert("unenrolled: probe set".into(), probes(&node, &names));

    let mut dels = Vec::new();
    for (p, netns) in case.pods.iter().zip(&pods).filter(|(p, _)| p.delete) {
        let del = node.del(netns, case.namespace(p), &p.name);
        dels.push(format!(
            "{}: {}",
            p.name,
            if del.is_ok() { "ok" } else { "failed" }
        ));
        node.delete_pod(case.namespace(p), &p.name);
    }
    facets.insert("DEL".into(), dels);
    quiet(&node);
    for (p, netns) in case.pods.iter().zip(&pods).filter(|(p, _)| p.delete) {
        let rules = inpod_rules(&node, netns);
        facets.insert(format!("deleted: in-pod rules of {}", p.name), rules);
    }
    facets.insert("deleted: probe set".into(), probes(&node, &names));
    for (name, msgs) in zds(&node, &names) {
        facets.insert(name, msgs);
    }
    let log = node.agent.output();
    if let Some(dir) = std::env::var_os("ISTIO_DIFF_LOG_DIR") {
        let side = if istio { "istio" } else { "ours" };
        let _ = std::fs::write(Path::new(&dir).join(format!("{side}.log")), &log);
    }
    drop(processes);
    drop(node);
    drop(pods);
    Outcome { facets, log }
}

/// A rule brings Istio's facets and ours to common ground for one deliberate difference.
type Rule = rule_list::Rule<Case, Facets>;
type Entry = rule_list::Entry<Case, Facets>;

const RULES: &[(&str, Rule)] = &[("flavour-kept-on-restart", flavour_kept_on_restart)];

/// Istio's restarted agent detects the iptables flavour afresh, and its own usability probe at
/// the first start left an empty legacy nat table, which now counts as "legacy has rules": it
/// writes a second, legacy rule set (host, and in-pod on reconcile) beside the nft one. Ours
/// keeps the flavour decided at the node's first install. Istio's legacy lines after the restart
/// are dropped where ours wrote none and Istio had none before it.
fn flavour_kept_on_restart(_: &Case, istio: &mut Facets, ours: &mut Facets) {
    let legacy = |lines: &Vec<String>| lines.iter().any(|l| l.starts_with("iptables-legacy-save"));
    let before = istio
        .iter()
        .filter(|(k, _)| k.starts_with("enrolled:"))
        .any(|(_, v)| legacy(v));
    if before || ours.values().any(legacy) {
        return;
    }
    for (k, lines) in istio.iter_mut() {
        if k.starts_with("restarted:") {
            lines.retain(|l| !l.starts_with("iptables-legacy-save"));
        }
    }
}

fn diff_text(istio: &Facets, ours: &Facets) -> String {
    let mut s = String::new();
    let keys: std::collections::BTreeSet<&String> = istio.keys().chain(ours.keys()).collect();
    for k in keys {
        let (a, b) = (istio.get(k), ours.get(k));
        if a != b {
            s += &format!("{k}:\n  istio: {a:#?}\n  ours:  {b:#?}\n");
        }
    }
    s
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

fn both(case: &Case) -> (Outcome, Outcome) {
    (run(case, true), run(case, false))
}

/// Smaller inputs that still show an unexplained difference, a bounded number of tries (each
/// try is two runs of several seconds).
fn shrink(entries: &[Entry], case: Case, found: (Outcome, Outcome)) -> (Case, (Outcome, Outcome)) {
    suite::shrink(case, found, 12, Case::shrinks, |smaller| {
        let f = both(smaller);
        rule_list::explain(entries, smaller, &f.0.facets, &f.1.facets)
            .is_none()
            .then_some(f)
    })
}

#[test]
fn ambient_enrolment_agrees_with_istios_agent_on_generated_pods() {
    support::require_root();
    let (seed, cases) =
        rule_list::seed_and_cases(DEFAULT_SEED, "ISTIO_DIFF_AMBIENT_CASES", DEFAULT_CASES);
    let entries = rule_list::load("ambient_allowlist.json", RULES);
    let suite = rule_list::Suite {
        name: "differential_ambient",
        entries: &entries,
        seed,
        cases,
        check_stale: cases >= DEFAULT_CASES,
    };
    let mut rng = Rng::new(seed);
    let show = std::env::var_os("ISTIO_DIFF_SHOW").is_some();
    suite.run(
        (0..cases).map(|i| (i, generator::case(&mut rng, i))),
        |case, istio| {
            let outcome = run(case, istio);
            if show && !istio {
                eprintln!("{}{:#?}", case.describe(), outcome.facets);
            }
            outcome
        },
        |o| &o.facets,
        |case, found| shrink(&entries, case, found),
        |i, case, istio, ours| {
            format!(
                "case {i} (seed {seed}) differs from Istio's agent, shrunk to:\n{}\n{}\nIstio's log:\n{}\nour log:\n{}",
                case.describe(),
                diff_text(&istio.facets, &ours.facets),
                tail(&istio.log),
                tail(&ours.log)
            )
        },
    );
}
