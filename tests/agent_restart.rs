//! End to end, ambient mode (issue 10): the node agent restarts under 20 enrolled pods (install-cni
//! killed and started again, as after a crash or an OOM kill), with the real data plane, both
//! backends. Nothing is flushed or re-written: every pod's in-pod rules keep their packet
//! counters, a poller reading the host probe set throughout never sees a member missing, the
//! pods stay annotated `enabled`, and the first snapshot the new agent sends ztunnel holds all
//! 20 (their netns found again by the /proc scan). On the real kube-apiserver: the new agent
//! lists the node's pods there again and writes nothing (the annotations stand).

#[path = "support/ambient_node.rs"]
mod ambient_node;
mod install_support;
mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ambient_node::{Backend, Node, PodNs, PodProcess, result_ip};
use serde_json::json;
use support::real_cluster::RealCluster;

const AMBIENT: &str = "istio.io/dataplane-mode";
const PODS: usize = 20;

/// A pod's rules with their counters, our chains only (the pod's own tables are not ours).
fn counted_rules(pod: &PodNs, backend: Backend) -> String {
    let out = match backend {
        Backend::Iptables => pod.guard.exec("iptables-save", &["-c"]),
        // With handles: a rule deleted and added again gets a new one.
        Backend::Nftables => pod.guard.exec("nft", &["-a", "list", "ruleset"]),
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
}

fn restart_keeps_everything(backend: Backend) {
    let mut node = Node::start_real_on(
        RealCluster::start(),
        backend,
        &[("AMBIENT_RECONCILE_POD_RULES_ON_STARTUP", "true")],
    );
    node.namespace("amb", json!({AMBIENT: "ambient"}));
    let mut pods = Vec::new();
    for i in 0..PODS {
        let name = format!("app-{i}");
        let uid = node.unique_pod("amb", &name);
        let ns = PodNs::new("rst");
        let ip = result_ip(&node.add(&ns, "amb", &name).expect("ambient ADD"));
        node.set_running("amb", &name, &ip);
        let process = PodProcess::start(&ns, &uid);
        pods.push((name, uid, ip, ns, process));
    }
    let ips: BTreeSet<String> = pods.iter().map(|p| p.2.clone()).collect();
    node.wait_until(
        Duration::from_secs(10),
        "every pod in the probe set",
        || {
            let members: BTreeSet<String> = node.probe_members().into_iter().map(|m| m.0).collect();
            ips.is_subset(&members)
        },
    );
    // Traffic through the pods' rules first, so a rewrite would show as reset counters (and, with
    // nftables, as new rule handles).
    for (_, _, ip, ns, _) in &pods {
        ns.send_tcp_to(ip);
    }
    let before: Vec<String> = pods.iter().map(|p| counted_rules(&p.3, backend)).collect();
    if backend == Backend::Iptables {
        let counted = |rules: &String| {
            rules
                .lines()
                .any(|l| l.contains("ISTIO") && l.starts_with('[') && !l.starts_with("[0:0]"))
        };
        assert!(before.iter().any(counted), "no traffic counted: {before:?}");
    }

    let missing = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let poller = {
        let (missing, stop, ips) = (missing.clone(), stop.clone(), ips.clone());
        let probe = node_probe_reader(&node);
        std::thread::spawn(move || {
            let mut polls = 0;
            while !stop.load(Ordering::SeqCst) {
                let members = probe();
                if !ips.is_subset(&members) {
                    missing.store(true, Ordering::SeqCst);
                }
                polls += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            polls
        })
    };
    // Every annotation is written before the restart, so any write after it is the new agent's.
    for (name, ..) in &pods {
        node.wait_until(Duration::from_secs(10), "the enabled annotation", || {
            node.redirection("amb", name).as_deref() == Some("enabled")
        });
    }
    node.cluster().clear_requests();
    let snapshot = node.restart_agent_killed();
    // The startup work (probe sync, reconcile) has run once the snapshot went out; let the
    // poller look a little longer.
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    let polls = poller.join().expect("poller");
    assert!(polls > 5, "the poller barely ran ({polls} polls)");
    assert!(
        !missing.load(Ordering::SeqCst),
        "a probe-set member went missing during the restart"
    );

    let added: BTreeSet<String> = snapshot
        .iter()
        .filter_map(|s| match s {
            support::zds_peer::Seen::Add { uid, fds: 1, .. } => Some(uid.clone()),
            _ => None,
        })
        .collect();
    for (name, uid, _, _, _) in &pods {
        assert!(
            added.contains(uid),
            "{name} missing from the new agent's snapshot: {snapshot:?}\n{}",
            node.agent.output()
        );
        assert_eq!(node.redirection("amb", name).as_deref(), Some("enabled"));
    }
    let after = node.cluster().requests();
    let node_name = node.cluster().node(ambient_node::NODE);
    assert!(
        after.iter().any(|(verb, uri)| (verb == "list"
            || verb == "watch" && uri.contains("sendInitialEvents=true"))
            && uri.starts_with("/api/v1/pods?")
            && uri.contains(&node_name)),
        "the new agent did not read the node's pods (listed or streamed): {after:#?}"
    );
    let writes: Vec<_> = after
        .iter()
        .filter(|(verb, _)| !["get", "list", "watch"].contains(&verb.as_str()))
        .collect();
    assert_eq!(
        writes,
        Vec::<&(String, String)>::new(),
        "the new agent wrote"
    );
    for ((name, ..), before) in pods.iter().zip(&before) {
        let pod = &pods.iter().find(|p| &p.0 == name).expect("pod").3;
        assert_eq!(
            &counted_rules(pod, backend),
            before,
            "{name}: in-pod rules rewritten (counters reset) by the restart"
        );
    }
}

/// The probe set's IPv4 members as the test poller reads them (with the product's parsers of the
/// two listings), from a thread of its own.
fn node_probe_reader(node: &Node) -> impl Fn() -> BTreeSet<String> + Send + 'static {
    use istio_cni::apply::probe_set::NFT_TABLE;
    use istio_cni::rules::ambient::PROBE_SET_V4;
    use istio_cni_testing::listings::{parse_ipset_save, parse_nft_set};
    let (net, backend) = (format!("--net={}", node.ns.path()), node.backend);
    move || {
        let list: &[&str] = match backend {
            Backend::Iptables => &["ipset", "save", PROBE_SET_V4],
            Backend::Nftables => &["nft", "list", "set", "inet", NFT_TABLE, PROBE_SET_V4],
        };
        let out = std::process::Command::new("nsenter")
            .arg(&net)
            .args(list)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let entries = match backend {
            Backend::Iptables => parse_ipset_save(&out),
            Backend::Nftables => parse_nft_set(&out),
        };
        entries.keys().map(|ip| ip.to_string()).collect()
    }
}

#[test]
fn a_killed_agent_restarts_under_20_pods_without_touching_them_iptables() {
    restart_keeps_everything(Backend::Iptables);
}

#[test]
fn a_killed_agent_restarts_under_20_pods_without_touching_them_nftables() {
    restart_keeps_everything(Backend::Nftables);
}
