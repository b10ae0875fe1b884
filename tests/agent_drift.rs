//! End to end, ambient drift self-heal: the real install-cni with the agent and the real data
//! plane in a node netns of its own (tests/support/ambient_node.rs) on the real kube-apiserver
//! (`Node::start_real_on`, the agent on the chart's own RBAC), DRIFT_VERIFY_INTERVAL 2s. Two pods are enrolled through the real CNI chain; then pod A's in-pod rules are broken in
//! five ways (its nat table flushed, one rule deleted, the jump into our chain replaced, a rule
//! added to our chain) and its IP removed from the node's probe set. Each is healed within one
//! period (+25% jitter, + slack for a loaded machine), counted in /metrics
//! (`istio_cni_drift_repaired_total{kind=...}`) and recorded as an event on pod A (stored by the
//! server against A's UID; the heals write nothing else, by the audit log). Pod B, never
//! touched, is never rewritten: with iptables its rules' packet counters (`iptables-save -c`,
//! non-zero from a ping first) keep their values across the passes; with nftables its rules keep
//! their handles (`nft -a list ruleset`: a rewrite gives new ones). Run once per backend. And
//! install-cni's guard, putting back our CNI entry that something removed, starts a pass at once.

#[path = "support/ambient_node.rs"]
mod ambient_node;
mod install_support;
mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use ambient_node::{Backend, Node, PodNs, in_netns, result_ip};
use install_support::http_get;
use serde_json::json;
use support::real_cluster::RealCluster;

const AMBIENT: &str = "istio.io/dataplane-mode";
const PERIOD: Duration = Duration::from_secs(2);
/// A port of the node netns (private to this test).
const METRICS_PORT: &str = "15014";
/// Slack on top of one jittered period: the machine runs other tests.
const SLACK: Duration = Duration::from_secs(6);

/// Runs a command in the pod netns; panics naming it on failure.
fn run(pod: &PodNs, program: &str, args: &[&str]) -> String {
    let out = pod.guard.exec(program, args);
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The pod's rules of ours, without counters or handles: what a heal must restore.
fn ours(pod: &PodNs, backend: Backend) -> String {
    match backend {
        Backend::Iptables => run(pod, "iptables-save", &[])
            .lines()
            .filter(|l| l.contains("ISTIO"))
            .map(|l| l.split(" [").next().unwrap_or(l))
            .collect::<Vec<_>>()
            .join("\n"),
        Backend::Nftables => istio_cni_testing::listings::normalise_ambient_nft_listing(&run(
            pod,
            "nft",
            &["list", "ruleset"],
        )),
    }
}

/// The pod's rules with their counters (iptables) or handles (nftables): changes on a rewrite.
fn counted(pod: &PodNs, backend: Backend) -> String {
    let text = match backend {
        Backend::Iptables => run(pod, "iptables-save", &["-c"]),
        Backend::Nftables => run(pod, "nft", &["-a", "list", "ruleset"]),
    };
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Pod B's rules were not rewritten: the same rules (and nft handles) in the same order, and no
/// packet counter went down (a rewrite zeroes them; traffic reaching the pod meanwhile, e.g. a
/// neighbour solicitation, may raise them).
fn assert_kept(before: &str, after: &str) {
    let split = |l: &str| -> (Option<u64>, String) {
        match l.strip_prefix('[').and_then(|r| r.split_once("] ")) {
            Some((counts, rule)) => (
                counts.split(':').next().and_then(|p| p.parse().ok()),
                rule.to_string(),
            ),
            None => (None, l.to_string()),
        }
    };
    let (b, a): (Vec<_>, Vec<_>) = (
        before.lines().map(split).collect(),
        after.lines().map(split).collect(),
    );
    let rules = |v: &[(Option<u64>, String)]| v.iter().map(|x| x.1.clone()).collect::<Vec<_>>();
    assert_eq!(rules(&a), rules(&b), "pod B's rules changed");
    for ((was, rule), (now, _)) in b.iter().zip(&a) {
        assert!(
            now >= was,
            "pod B's rule was rewritten (counter {was:?} -> {now:?}): {rule}"
        );
    }
}

/// `istio_cni_drift_repaired_total{kind}` from the agent's /metrics (in the node netns).
fn repaired(node: &Node, kind: &str) -> u64 {
    let port: u16 = METRICS_PORT.parse().expect("port");
    let (_, body) = in_netns(Path::new(&node.ns.path()), move || {
        http_get(port, "/metrics")
    })
    .expect("GET /metrics");
    let prefix = format!("istio_cni_drift_repaired_total{{kind=\"{kind}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.trim().parse().expect("a count"))
        .unwrap_or(0)
}

/// Events stored by the API server on pod `amb/<pod>` with `reason`, each checked to name the
/// pod's UID as the server gave it.
fn events(node: &Node, pod: &str, reason: &str) -> usize {
    let uid = node
        .get_pod("amb", pod)
        .and_then(|p| p.metadata.uid)
        .expect("pod uid");
    node.cluster()
        .events("amb")
        .iter()
        .filter(|e| {
            e.involved_object.name.as_deref() == Some(pod) && e.reason.as_deref() == Some(reason)
        })
        .inspect(|e| assert_eq!(e.involved_object.uid.as_deref(), Some(uid.as_str())))
        .count()
}

/// The agent's writes since the last `clear_requests`, as (verb, path).
fn writes(node: &Node) -> Vec<(String, String)> {
    node.cluster()
        .requests()
        .into_iter()
        .filter(|(verb, _)| !matches!(verb.as_str(), "get" | "list" | "watch"))
        .map(|(verb, uri)| (verb, uri.split('?').next().unwrap_or_default().to_string()))
        .collect()
}

fn start(backend: Backend, env: &[(&str, &str)]) -> Node {
    Node::start_real_on(RealCluster::start(), backend, env)
}

fn passes(node: &Node) -> usize {
    node.agent
        .lines
        .lock()
        .expect("lines")
        .iter()
        .filter(|l| l.contains("drift pass done"))
        .count()
}

/// The chain and handle of the first rule of the pod's `istio-ambient-nat` table containing
/// `needle`.
fn ambient_nat_rule(p: &PodNs, needle: &str) -> (String, String) {
    let listing = run(
        p,
        "nft",
        &["-a", "list", "table", "inet", "istio-ambient-nat"],
    );
    nft_handle(&listing, needle)
}

/// The `handle` of the first line of `listing` containing `needle` (nft -a output), with the
/// chain it is in.
fn nft_handle(listing: &str, needle: &str) -> (String, String) {
    let mut chain = String::new();
    for line in listing.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("chain ") {
            chain = rest
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_string();
        } else if t.contains(needle) && t.contains("# handle ") {
            let handle = t.rsplit("# handle ").next().unwrap_or_default();
            return (chain, handle.to_string());
        }
    }
    panic!("no rule with {needle:?} in:\n{listing}")
}

/// One way of breaking a pod's rules: what it is, and the commands doing it.
type Breakage = (&'static str, Box<dyn Fn(&PodNs)>);

/// The ways pod A's rules are broken, per backend.
fn breakages(backend: Backend) -> Vec<Breakage> {
    match backend {
        Backend::Iptables => vec![
            (
                "nat table flushed",
                Box::new(|p: &PodNs| {
                    run(p, "iptables", &["-t", "nat", "-F"]);
                }),
            ),
            (
                "one rule deleted",
                Box::new(|p: &PodNs| {
                    run(p, "iptables", &["-t", "nat", "-D", "ISTIO_PRERT", "1"]);
                }),
            ),
            (
                "the jump into our chain replaced",
                Box::new(|p: &PodNs| {
                    let rules = run(p, "iptables", &["-t", "nat", "-S", "PREROUTING"]);
                    let at = rules
                        .lines()
                        .filter(|l| l.starts_with("-A "))
                        .position(|l| l == "-A PREROUTING -j ISTIO_PRERT")
                        .expect("our jump")
                        + 1;
                    let _ = p
                        .guard
                        .exec("iptables", &["-t", "nat", "-N", "DRIFT_OTHER"]);
                    run(
                        p,
                        "iptables",
                        &[
                            "-t",
                            "nat",
                            "-R",
                            "PREROUTING",
                            &at.to_string(),
                            "-j",
                            "DRIFT_OTHER",
                        ],
                    );
                }),
            ),
            (
                "a rule added to our chain",
                Box::new(|p: &PodNs| {
                    run(
                        p,
                        "iptables",
                        &["-t", "mangle", "-A", "ISTIO_OUTPUT", "-j", "RETURN"],
                    );
                }),
            ),
        ],
        Backend::Nftables => vec![
            (
                "our nat table flushed",
                Box::new(|p: &PodNs| {
                    run(p, "nft", &["flush", "table", "inet", "istio-ambient-nat"]);
                }),
            ),
            (
                "one rule deleted",
                Box::new(|p: &PodNs| {
                    let (chain, handle) = ambient_nat_rule(p, "redirect to :15001");
                    run(
                        p,
                        "nft",
                        &[
                            "delete",
                            "rule",
                            "inet",
                            "istio-ambient-nat",
                            &chain,
                            "handle",
                            &handle,
                        ],
                    );
                }),
            ),
            (
                "the jump into our chain replaced",
                Box::new(|p: &PodNs| {
                    let (chain, handle) = ambient_nat_rule(p, "jump istio-prerouting");
                    // A chain added to our table, and the jump sent there instead.
                    run(
                        p,
                        "nft",
                        &["add", "chain", "inet", "istio-ambient-nat", "drift-other"],
                    );
                    run(
                        p,
                        "nft",
                        &[
                            "replace",
                            "rule",
                            "inet",
                            "istio-ambient-nat",
                            &chain,
                            "handle",
                            &handle,
                            "jump",
                            "drift-other",
                        ],
                    );
                }),
            ),
            (
                "a rule added to our chain",
                Box::new(|p: &PodNs| {
                    run(
                        p,
                        "nft",
                        &[
                            "add",
                            "rule",
                            "inet",
                            "istio-ambient-mangle",
                            "istio-output",
                            "meta",
                            "mark",
                            "0x1234",
                            "accept",
                        ],
                    );
                }),
            ),
        ],
    }
}

fn drift_is_healed(backend: Backend) {
    let node = start(
        backend,
        &[
            ("DRIFT_VERIFY_INTERVAL", "2s"),
            ("MONITORING_PORT", METRICS_PORT),
        ],
    );
    node.namespace("amb", json!({AMBIENT: "ambient"}));
    let mut pods = Vec::new();
    for name in ["a", "b"] {
        let uid = node.pod("amb", name, json!({}));
        let ns = PodNs::new("drift");
        let ip = result_ip(
            &node
                .add(&ns, "amb", name)
                .unwrap_or_else(|e| panic!("ADD {name}: {e}\n{}", node.agent.output())),
        );
        node.set_running("amb", name, &ip);
        pods.push((uid, ip, ns));
    }
    for (name, (uid, ip, _)) in ["a", "b"].iter().zip(&pods) {
        node.wait_until(Duration::from_secs(10), "enrolled", || {
            node.redirection("amb", name).as_deref() == Some("enabled")
                && node.probe_members().contains(&(ip.clone(), uid.clone()))
        });
    }
    let (a, b) = (&pods[0], &pods[1]);
    node.cluster().clear_requests();
    // Traffic through B's rules, so a rewrite would show as reset counters: TCP connects to its
    // own address from inside it (refused or not, each SYN passes our OUTPUT chains).
    b.2.send_tcp_to(&b.1);
    let b_before = counted(&b.2, backend);
    if backend == Backend::Iptables {
        assert!(
            b_before
                .lines()
                .any(|l| l.contains("ISTIO") && l.starts_with('[') && !l.starts_with("[0:0]")),
            "no traffic counted in B: {b_before}"
        );
    }
    let a_expected = ours(&a.2, backend);
    assert!(!a_expected.is_empty());
    node.wait_until(Duration::from_secs(10), "a first drift pass", || {
        passes(&node) >= 1
    });
    assert_eq!(
        repaired(&node, "ambient_rules"),
        0,
        "drift before any change"
    );
    let within = PERIOD + PERIOD / 4 + SLACK;

    let cases = breakages(backend);
    for (i, (what, break_it)) in cases.iter().enumerate() {
        let started = Instant::now();
        break_it(&a.2);
        node.wait_until(within, &format!("{what}: healed and counted"), || {
            ours(&a.2, backend) == a_expected
                && repaired(&node, "ambient_rules") == i as u64 + 1
                && events(&node, "a", "RedirectionDriftRepaired") == i + 1
        });
        eprintln!("{backend:?}: {what} healed in {:?}", started.elapsed());
    }

    // The probe set: A's entry removed on the node.
    let started = Instant::now();
    match backend {
        Backend::Iptables => {
            node.ns
                .exec("ipset", &["del", "istio-inpod-probes-v4", &a.1]);
        }
        Backend::Nftables => {
            let element = format!("{{ {} }}", a.1);
            node.ns.exec(
                "nft",
                &[
                    "delete",
                    "element",
                    "inet",
                    "istio-ambient-nat",
                    "istio-inpod-probes-v4",
                    &element,
                ],
            );
        }
    }
    node.wait_until(within, "probe entry put back and counted", || {
        node.probe_members().contains(&(a.1.clone(), a.0.clone()))
            && repaired(&node, "probe_set") == 1
            && events(&node, "a", "ProbeSetDriftRepaired") == 1
    });
    eprintln!("{backend:?}: probe entry healed in {:?}", started.elapsed());

    // B was verified by every pass and never rewritten; a few more passes to be sure.
    let seen = passes(&node);
    node.wait_until(3 * within, "two more passes", || passes(&node) >= seen + 2);
    assert_kept(&b_before, &counted(&b.2, backend));
    assert_eq!(events(&node, "b", "RedirectionDriftRepaired"), 0);
    assert_eq!(
        repaired(&node, "ambient_rules"),
        cases.len() as u64,
        "a heal too many"
    );
    let log = node.agent.output();
    let line = log
        .lines()
        .rfind(|l| l.contains("drift pass done"))
        .expect("pass line");
    assert!(
        line.contains("pods=2") && line.contains("healed=0"),
        "{line}"
    );
    assert!(
        log.contains("in-pod redirection rules had drifted")
            && log.contains(&format!("{}/a", node.k8s_ns("amb"))),
        "no heal log line naming the pod:\n{log}"
    );
    assert_eq!(node.peer.violations(), Vec::<String>::new());
    // The heals wrote nothing to the server but their events: one create each.
    let events_path = format!("/api/v1/namespaces/{}/events", node.k8s_ns("amb"));
    assert_eq!(
        writes(&node),
        vec![("create".to_string(), events_path); cases.len() + 1]
    );
}

#[test]
fn drifted_rules_and_probe_entries_are_healed_untouched_pods_kept_iptables() {
    drift_is_healed(Backend::Iptables);
}

#[test]
fn drifted_rules_and_probe_entries_are_healed_untouched_pods_kept_nftables() {
    drift_is_healed(Backend::Nftables);
}

/// Pods started while our CNI entry was missing ran without the plugin: when the guard puts the
/// entry back it kicks a drift pass at once (here the period is an hour, so only the kick can
/// explain the heal). Shows the wiring install-cni guard -> `drift_kick` -> the agent's pass.
#[test]
fn the_guard_reinstalling_our_entry_starts_a_pass_at_once() {
    let node = start(Backend::Iptables, &[("DRIFT_VERIFY_INTERVAL", "1h")]);
    node.namespace("amb", json!({AMBIENT: "ambient"}));
    node.pod("amb", "a", json!({}));
    let pod = PodNs::new("kick");
    let ip = result_ip(
        &node
            .add(&pod, "amb", "a")
            .unwrap_or_else(|e| panic!("ADD: {e}\n{}", node.agent.output())),
    );
    node.set_running("amb", "a", &ip);
    node.wait_until(Duration::from_secs(10), "enrolled", || {
        node.redirection("amb", "a").as_deref() == Some("enabled")
    });
    node.wait_until(Duration::from_secs(10), "the startup pass", || {
        passes(&node) >= 1
    });
    let expected = ours(&pod, Backend::Iptables);
    run(&pod, "iptables", &["-t", "nat", "-F"]);
    // Another component rewrites the CNI config without our entry.
    let conflist = node.dirs.read("10-e2e.conflist").expect("conflist");
    let mut without: serde_json::Value = serde_json::from_str(&conflist).expect("JSON");
    without["plugins"]
        .as_array_mut()
        .expect("plugins")
        .retain(|p| p["type"] != "istio-cni");
    node.dirs
        .put("10-e2e.conflist", without.to_string().as_bytes());
    let started = Instant::now();
    node.wait_until(
        Duration::from_secs(20),
        "a kicked pass healing the pod",
        || ours(&pod, Backend::Iptables) == expected && passes(&node) >= 2,
    );
    eprintln!(
        "healed {:?} after the conflist was rewritten",
        started.elapsed()
    );
    assert!(
        install_support::has_istio_entry(&node.dirs.read("10-e2e.conflist").expect("conflist")),
        "the guard did not put our entry back"
    );
    // The event is posted after the heal, through the API server: wait for it, not race it.
    node.wait_until(Duration::from_secs(10), "the heal's event", || {
        events(&node, "a", "RedirectionDriftRepaired") >= 1
    });
    assert_eq!(events(&node, "a", "RedirectionDriftRepaired"), 1);
}
