//! End to end, node lifecycle (issue 21): the real install-cni with the agent and the real data
//! plane in a node netns of its own (tests/support/ambient_node.rs), pods enrolled through the
//! real CNI chain, the test ZDS peer as ztunnel. After each scenario every enrolled pod's outbound
//! TCP lands on the peer's listener inside the pod's current netns (counted), and `/debug/pods`
//! on the health port says so.
//!
//! Scenario 5, host rules flushed (Istio's #60607: a firewalld reload flushes the host probe SNAT
//! rules and nothing puts them back): iptables — `ISTIO_POSTRT` flushed and its POSTROUTING jump
//! removed, then the chain and the probe ipset destroyed; nftables — the host chain flushed, then
//! the whole host table (sets included) deleted. Each is healed within one drift period, counted in
//! `istio_cni_drift_repaired_total{kind="host_rules"}` with a warning naming what was repaired, and
//! the probe set holds exactly the enrolled pods again.
//!
//! Every node is on the real kube-apiserver (`Node::start_real*`, the chart's RBAC); each
//! scenario also finds the agent's annotation patches in the server's audit log.

#[path = "support/ambient_node.rs"]
mod ambient_node;
mod install_support;
#[path = "support/lifecycle.rs"]
mod lifecycle;
mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use ambient_node::{Backend, Node, PodNs, PodProcess, in_netns, result_ip};
use lifecycle::*;
use serde_json::{Value, json};
use support::real_cluster::RealCluster;

/// The node's host rules of ours, without counters: what a heal must restore.
fn host_rules(node: &Node) -> String {
    let out = match node.backend {
        Backend::Iptables => node.ns.exec("iptables-save", &["-t", "nat"]),
        Backend::Nftables => node.ns.exec("nft", &["-t", "list", "ruleset"]),
    };
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    match node.backend {
        Backend::Iptables => text
            .lines()
            .filter(|l| l.contains("ISTIO"))
            .map(|l| l.split(" [").next().unwrap_or(l))
            .collect::<Vec<_>>()
            .join("\n"),
        Backend::Nftables => {
            istio_cni_testing::listings::normalise_nft_listing(&text, "istio-ambient-nat")
        }
    }
}

fn host_rules_are_healed(backend: Backend) {
    let node = Node::start_real_on(
        RealCluster::start(),
        backend,
        &[
            ("DRIFT_VERIFY_INTERVAL", "2s"),
            ("MONITORING_PORT", METRICS_PORT),
            ("HEALTH_PORT", HEALTH_PORT),
        ],
    );
    let pods = enrol(&node, &["a", "b"]);
    let expected = host_rules(&node);
    assert!(!expected.is_empty(), "no host rules at all");
    node.wait_until(Duration::from_secs(10), "a first drift pass", || {
        debug_pods(&node)["host_rules"]["result"] == "in_place"
    });
    assert_eq!(repaired(&node, "host_rules"), 0, "a heal before any change");
    assert_in_mesh(&node, &pods);

    let breakages: Vec<(&str, Vec<Vec<&str>>)> = match backend {
        Backend::Iptables => vec![
            (
                "ISTIO_POSTRT flushed, its POSTROUTING jump removed",
                vec![
                    vec!["iptables", "-t", "nat", "-F", "ISTIO_POSTRT"],
                    vec![
                        "iptables",
                        "-t",
                        "nat",
                        "-D",
                        "POSTROUTING",
                        "-j",
                        "ISTIO_POSTRT",
                    ],
                ],
            ),
            (
                "the chain and the probe ipset destroyed",
                vec![
                    vec![
                        "iptables",
                        "-t",
                        "nat",
                        "-D",
                        "POSTROUTING",
                        "-j",
                        "ISTIO_POSTRT",
                    ],
                    vec!["iptables", "-t", "nat", "-F", "ISTIO_POSTRT"],
                    vec!["iptables", "-t", "nat", "-X", "ISTIO_POSTRT"],
                    vec!["ipset", "destroy", "istio-inpod-probes-v4"],
                ],
            ),
        ],
        Backend::Nftables => vec![
            (
                "the host chain flushed",
                vec![vec![
                    "nft",
                    "flush",
                    "chain",
                    "inet",
                    "istio-ambient-nat",
                    "postrouting",
                ]],
            ),
            (
                "the host table (and its probe sets) deleted",
                vec![vec!["nft", "delete", "table", "inet", "istio-ambient-nat"]],
            ),
        ],
    };
    let within = PERIOD + PERIOD / 4 + SLACK;
    for (i, (what, commands)) in breakages.iter().enumerate() {
        for c in commands {
            node.ns.exec(c[0], &c[1..]);
        }
        assert_ne!(host_rules(&node), expected, "{what}: nothing broken");
        let started = Instant::now();
        node.wait_until(within, &format!("{what}: healed and counted"), || {
            host_rules(&node) == expected && repaired(&node, "host_rules") == i as u64 + 1
        });
        // A destroyed set comes back empty; the same pass's probe sync refills it.
        node.wait_until(within, &format!("{what}: probe set refilled"), || {
            pods.iter().all(|p| {
                node.probe_members()
                    .contains(&(p.ip.clone(), p.uid.clone()))
            })
        });
        eprintln!("{backend:?}: {what} healed in {:?}", started.elapsed());
        assert_in_mesh(&node, &pods);
        let report = debug_pods(&node);
        assert_eq!(report["host_rules"]["result"], "repaired", "{report}");
    }
    let log = node.agent.output();
    assert!(
        log.contains("host probe SNAT rules had drifted"),
        "no warning naming the repair:\n{log}"
    );
    // Healed once each: later passes find everything in place.
    node.wait_until(3 * within, "a pass finding the host rules in place", || {
        debug_pods(&node)["host_rules"]["result"] == "in_place"
    });
    assert_eq!(repaired(&node, "host_rules"), breakages.len() as u64);
    assert_eq!(node.peer.violations(), Vec::<String>::new());
    assert_annotated_by_agent(&node, &pods);
}

#[test]
fn flushed_host_rules_and_a_destroyed_probe_set_are_healed_iptables() {
    host_rules_are_healed(Backend::Iptables);
}

#[test]
fn flushed_host_rules_and_a_destroyed_probe_set_are_healed_nftables() {
    host_rules_are_healed(Backend::Nftables);
}

/// `/debug/pods` lists each enrolled pod with its netns (path and inode), IPs, the drift pass's
/// last check and what ztunnel answered on which connection; other methods get 405.
#[test]
fn debug_pods_answers_per_pod_and_only_to_get() {
    let node = Node::start_real_on(
        RealCluster::start(),
        Backend::Iptables,
        &[
            ("DRIFT_VERIFY_INTERVAL", "2s"),
            ("HEALTH_PORT", HEALTH_PORT),
        ],
    );
    let pods = enrol(&node, &["a"]);
    let p = &pods[0];
    node.wait_until(Duration::from_secs(10), "a verified pod", || {
        debug_pods(&node)["pods"][0]["last_verified"]["result"] == "in_place"
    });
    let report = debug_pods(&node);
    assert_eq!(report["version"], 1, "{report}");
    let pod = &report["pods"][0];
    assert_eq!(pod["uid"], p.uid.as_str());
    assert_eq!(
        (&pod["namespace"], &pod["name"]),
        (&json!(node.k8s_ns("amb")), &json!("a"))
    );
    assert_eq!(pod["ips"], json!([p.ip]));
    let inode = node.peer.netns_of(&p.uid).expect("proxy").1;
    assert_eq!(pod["netns"]["inode"], inode, "{report}");
    assert!(pod["netns"]["path"].as_str().is_some_and(|s| !s.is_empty()));
    assert_eq!(pod["zds"]["state"], "acked", "{report}");
    assert_eq!(pod["zds"]["request"], "add");
    assert!(pod["zds"]["connection"].as_u64().is_some());
    assert!(pod["last_verified"]["at_unix_ms"].as_u64().is_some());
    assert_eq!(report["host_rules"]["result"], "in_place");

    // Read-only: anything but GET is refused.
    let port: u16 = HEALTH_PORT.parse().expect("port");
    let status = in_netns(Path::new(&node.ns.path()), move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        write!(
            s,
            "POST /debug/pods HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .expect("write");
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    });
    assert!(status.starts_with("HTTP/1.1 405"), "{status}");
    assert_annotated_by_agent(&node, &pods);
}

/// The node's host holds the iptables host rules / the nft host table.
fn host_has(node: &Node) -> (bool, bool) {
    let ipt = String::from_utf8_lossy(&node.ns.exec("iptables-save", &["-t", "nat"]).stdout)
        .contains(":ISTIO_POSTRT");
    let nft = node
        .ns
        .try_exec("nft", &["list", "table", "inet", "istio-ambient-nat"])
        .status
        .success();
    (ipt, nft)
}

/// The pod netns holds our iptables chains / our nft tables.
fn pod_has(p: &Enrolled) -> (bool, bool) {
    let ipt = p.ns.guard.iptables_save().contains("ISTIO_");
    let nft = String::from_utf8_lossy(&p.ns.guard.exec("nft", &["list", "tables"]).stdout)
        .contains("istio-ambient-");
    (ipt, nft)
}

/// Scenario 6 (Istio's #61020): the backend chosen at first install is recorded in the run dir and
/// reused by a restart although the detection inputs changed (an iptables probe ipset appeared on
/// the host, which alone would put a fresh decision on iptables); a change of NATIVE_NFTABLES
/// migrates: the old host and in-pod rules removed, the new applied, the pod re-verified and in the
/// mesh, one rule set only; uninstall (SIGTERM) deletes the record.
#[test]
fn the_backend_is_decided_once_per_node_and_a_native_nftables_change_migrates() {
    let mut node = Node::start_real_on(
        RealCluster::start(),
        Backend::Nftables,
        &[
            ("DRIFT_VERIFY_INTERVAL", "1s"),
            ("HEALTH_PORT", HEALTH_PORT),
        ],
    );
    let pods = enrol(&node, &["a"]);
    let record = node.dirs.run.join("ambient-backend");
    let text = std::fs::read_to_string(&record).expect("the backend record");
    assert!(text.contains("backend=nftables"), "{text}");
    assert_eq!(
        (host_has(&node), pod_has(&pods[0])),
        ((false, true), (false, true))
    );

    // The other backend's artifact appears; a restart keeps the recorded backend.
    node.ns.exec(
        "ipset",
        &[
            "create",
            "istio-inpod-probes-v4",
            "hash:ip",
            "family",
            "inet",
            "comment",
        ],
    );
    node.restart_agent_killed();
    node.agent.wait_line(
        "first install (recorded in the run dir)",
        Duration::from_secs(10),
    );
    node.wait_until(Duration::from_secs(10), "re-verified", || {
        debug_pods(&node)["pods"][0]["last_verified"]["result"] == "in_place"
    });
    assert_eq!(host_has(&node), (false, true), "a second host rule set");
    assert_eq!(pod_has(&pods[0]), (false, true), "a second in-pod rule set");
    node.ns.exec("ipset", &["destroy", "istio-inpod-probes-v4"]);
    assert_in_mesh(&node, &pods);

    // NATIVE_NFTABLES turned off: migrated to iptables, one rule set everywhere.
    node.set_env("NATIVE_NFTABLES", None);
    node.backend = Backend::Iptables;
    node.restart_agent_killed();
    node.wait_until(Duration::from_secs(15), "migrated to iptables", || {
        host_has(&node) == (true, false) && pod_has(&pods[0]) == (true, false)
    });
    let text = std::fs::read_to_string(&record).expect("the backend record");
    assert!(text.contains("backend=iptables"), "{text}");
    node.wait_until(Duration::from_secs(10), "the probe set refilled", || {
        node.probe_members()
            .contains(&(pods[0].ip.clone(), pods[0].uid.clone()))
    });
    assert_in_mesh(&node, &pods);
    assert_annotated_by_agent(&node, &pods);

    // Uninstall: the record goes with it.
    node.agent.terminate(Duration::from_secs(15));
    assert!(!record.exists(), "the record outlived the uninstall");
}

/// Our host objects still in the node netns, by name: the iptables chain and its jump (both
/// families, either flavour), the probe ipsets, the nft host table.
fn host_leftovers(node: &Node) -> Vec<String> {
    let mut found = Vec::new();
    for tool in [
        "iptables-nft-save",
        "iptables-legacy-save",
        "ip6tables-nft-save",
        "ip6tables-legacy-save",
    ] {
        let out = node.ns.try_exec(tool, &["-t", "nat"]);
        let text = String::from_utf8_lossy(&out.stdout);
        for l in text.lines() {
            if l.starts_with(":ISTIO_POSTRT") || l.contains("-j ISTIO_POSTRT") {
                found.push(format!("{tool}: {l}"));
            }
        }
    }
    let sets = node.ns.try_exec("ipset", &["list", "-n"]);
    for set in String::from_utf8_lossy(&sets.stdout).lines() {
        if set.starts_with("istio-inpod-probes") {
            found.push(format!("ipset {set}"));
        }
    }
    let tables = node.ns.try_exec("nft", &["list", "tables"]);
    for t in String::from_utf8_lossy(&tables.stdout).lines() {
        if t.contains("istio-ambient-nat") {
            found.push(t.to_string());
        }
    }
    found
}

/// Shutdown as Istio's agent does it: SIGTERM while the DaemonSet still targets the node (an
/// upgrade) keeps the host probe SNAT rules and probe sets for the next agent; SIGTERM once the
/// DaemonSet is gone (an uninstall) removes them — iptables: `ISTIO_POSTRT` and its POSTROUTING
/// jump in both families and the probe ipsets; nftables: the host table with its sets — along
/// with the backend record.
fn shutdown_keeps_host_rules_on_upgrade_and_removes_them_on_uninstall(backend: Backend) {
    let home = istio_cni_testing::controlplane::unique_name("cni-home");
    let daemonset = json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "istio-cni-node", "namespace": home},
        "spec": {
            "selector": {"matchLabels": {"k8s-app": "istio-cni-node"}},
            "template": {
                "metadata": {"labels": {"k8s-app": "istio-cni-node"}},
                "spec": {"containers": [{"name": "install-cni", "image": "istio/install-cni"}]}
            }
        }
    });
    let mut node = Node::start_real_dual_stack(
        backend,
        &[
            ("POD_NAMESPACE", &home),
            ("HEALTH_PORT", HEALTH_PORT),
            ("AMBIENT_IPV6", "true"),
        ],
    );
    node.cluster().cp.create_namespace(&home, &[]);
    let pods = enrol(&node, &["a"]);
    node.wait_until(Duration::from_secs(10), "the probe set filled", || {
        node.probe_members()
            .contains(&(pods[0].ip.clone(), pods[0].uid.clone()))
    });
    let installed = host_leftovers(&node);
    // Dual stack: the chain and its jump in both families and both ipsets; or the nft table.
    let expected = match backend {
        Backend::Iptables => 6,
        Backend::Nftables => 1,
    };
    assert_eq!(installed.len(), expected, "{installed:#?}");
    let record = node.dirs.run.join("ambient-backend");

    // Upgrade: the DaemonSet still targets the node.
    node.cluster().cp.create(&daemonset);
    node.agent.terminate(Duration::from_secs(20));
    assert_eq!(
        host_leftovers(&node),
        installed,
        "an upgrade removed host rules"
    );
    assert!(record.exists(), "an upgrade removed the backend record");

    // Uninstall: the DaemonSet is gone.
    node.start_agent();
    node.agent
        .wait_line("ambient node agent ready", Duration::from_secs(30));
    node.cluster().cp.delete(&daemonset);
    node.agent.terminate(Duration::from_secs(20));
    let log = node.agent.output();
    assert_eq!(host_leftovers(&node), Vec::<String>::new(), "{log}");
    assert!(!record.exists(), "the record outlived the uninstall");
}

#[test]
fn shutdown_keeps_host_rules_on_upgrade_and_removes_them_on_uninstall_iptables() {
    shutdown_keeps_host_rules_on_upgrade_and_removes_them_on_uninstall(Backend::Iptables);
}

#[test]
fn shutdown_keeps_host_rules_on_upgrade_and_removes_them_on_uninstall_nftables() {
    shutdown_keeps_host_rules_on_upgrade_and_removes_them_on_uninstall(Backend::Nftables);
}

/// A PATH directory with every tool of this machine's PATH except ip6tables (and its
/// -save/-restore/-legacy/-nft variants): a node without IPv6 tooling.
fn path_without_ip6tables() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    for d in path.split(':') {
        let Ok(entries) = std::fs::read_dir(d) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let link = dir.path().join(&name);
            if name.to_string_lossy().starts_with("ip6tables") || link.exists() {
                continue;
            }
            let _ = std::os::unix::fs::symlink(e.path(), &link);
        }
    }
    assert!(dir.path().join("iptables").exists() && !dir.path().join("ip6tables").exists());
    dir
}

/// Scenario 8 (Istio's #57869): with AMBIENT_IPV6=false (the default) the agent runs on a node
/// without ip6tables: host rules, enrolment, the drift pass and a restart all work, the pod is in
/// the mesh, and nothing in the log mentions ip6tables. The pod network is dual-stack, so the pod
/// also has an IPv6 address (in its status too): it is left out of the probe sets, not an error.
#[test]
fn ipv6_off_needs_no_ip6tables_iptables() {
    ipv6_off(Backend::Iptables);
}

#[test]
fn ipv6_off_needs_no_ip6tables_nftables() {
    ipv6_off(Backend::Nftables);
}

fn ipv6_off(backend: Backend) {
    let bin = path_without_ip6tables();
    let mut node = Node::start_real_dual_stack(
        backend,
        &[
            ("PATH", bin.path().to_str().expect("utf-8")),
            ("AMBIENT_IPV6", "false"),
            ("DRIFT_VERIFY_INTERVAL", "1s"),
            ("HEALTH_PORT", HEALTH_PORT),
        ],
    );
    let pods = enrol(&node, &["a"]);
    let v6 = global_ipv6(&pods[0].ns);
    node.set_status(
        "amb",
        "a",
        json!({
            "phase": "Running", "podIP": pods[0].ip,
            "podIPs": [{"ip": pods[0].ip}, {"ip": v6}]
        }),
    );
    let verified = |node: &Node| {
        let report = debug_pods(node);
        report["host_rules"]["result"] == "in_place"
            && report["pods"][0]["last_verified"]["result"] == "in_place"
    };
    node.wait_until(Duration::from_secs(10), "a clean drift pass", || {
        verified(&node)
    });
    assert_in_mesh(&node, &pods);
    node.restart_agent_killed();
    node.wait_until(
        Duration::from_secs(10),
        "a clean pass after the restart",
        || verified(&node),
    );
    assert_in_mesh(&node, &pods);
    let sets = match backend {
        Backend::Iptables => node.ns.try_exec("ipset", &["list", "-n"]).stdout,
        Backend::Nftables => node.ns.try_exec("nft", &["list", "sets"]).stdout,
    };
    assert!(
        !String::from_utf8_lossy(&sets).contains("istio-inpod-probes-v6"),
        "an IPv6 probe set with IPv6 off"
    );
    let log = node.agent.output();
    assert!(
        !log.to_lowercase().contains("ip6tables"),
        "the agent spoke of ip6tables:\n{log}"
    );
    assert_annotated_by_agent(&node, &pods);
}

/// Scenario 7 (Istio's #61027), IPv4 half, on the real kube-apiserver: the chain gives the pod a
/// second IPv4 address on eth0, named in the CNI result at ADD and in no status (the server keeps
/// one address per family). Across a killed-and-restarted agent both stay in the probe set (the
/// restarted agent learns the second from its record of the ADD, checked against the pod's
/// netns), and inbound TCP to either lands on ztunnel inside the pod.
#[test]
fn a_secondary_address_survives_an_agent_restart() {
    let mut node = Node::start_real_two_v4(
        Backend::Iptables,
        &[
            ("HEALTH_PORT", HEALTH_PORT),
            ("DRIFT_VERIFY_INTERVAL", "1s"),
        ],
    );
    let pods = enrol(&node, &["a"]);
    let (first, uid) = (pods[0].ip.clone(), pods[0].uid.clone());
    let second = second_v4(&pods[0].ns, &first);
    let stored = node.get_pod("amb", "a").expect("the pod on the server");
    let status_ips: Vec<String> = stored
        .status
        .and_then(|s| s.pod_ips)
        .unwrap_or_default()
        .into_iter()
        .map(|ip| ip.ip)
        .collect();
    assert_eq!(status_ips, vec![first.clone()], "the server's status");
    let both = vec![(first.clone(), uid.clone()), (second.clone(), uid.clone())];
    node.wait_until(
        Duration::from_secs(10),
        "both addresses after the ADD",
        || node.probe_members_sorted() == both,
    );
    node.restart_agent_killed();
    node.wait_until(
        Duration::from_secs(10),
        "both addresses in the probe set after the restart",
        || node.probe_members_sorted() == both,
    );
    let report = debug_pods(&node);
    assert_eq!(report["pods"][0]["ips"], json!([first, second]), "{report}");
    // A drift pass (which prunes entries the agent does not expect) leaves both.
    node.wait_until(
        Duration::from_secs(10),
        "a drift pass after the restart",
        || debug_pods(&node)["host_rules"]["result"] == "in_place",
    );
    assert_eq!(node.probe_members_sorted(), both);
    assert_outbound_lands(&node, &pods);
    // Both addresses take inbound traffic into the mesh (#61027: the secondary was blackholed).
    let from = client(&node);
    assert_inbound_lands_at(&node, &from, &pods[0], &first);
    assert_inbound_lands_at(&node, &from, &pods[0], &second);
    assert_annotated_by_agent(&node, &pods);
}

/// The pod's IPv4 address on eth0 other than `first`.
fn second_v4(pod: &PodNs, first: &str) -> String {
    let out = pod
        .guard
        .exec("ip", &["-4", "-o", "addr", "show", "dev", "eth0"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .filter_map(|l| l.split_whitespace().skip_while(|w| *w != "inet").nth(1))
        .filter_map(|a| a.split('/').next())
        .find(|a| *a != first)
        .unwrap_or_else(|| panic!("no second IPv4 address on eth0:\n{text}"))
        .to_string()
}

/// Scenario 7, dual-stack: a pod with an IPv4 and an IPv6 address (the chain gives both and the
/// kubelet reports both) keeps each in its probe set across a killed-and-restarted agent, and both
/// families' outbound and inbound TCP land on ztunnel inside the pod.
#[test]
fn a_dual_stack_pod_keeps_both_families_across_an_agent_restart_iptables() {
    dual_stack_across_a_restart(Backend::Iptables);
}

#[test]
fn a_dual_stack_pod_keeps_both_families_across_an_agent_restart_nftables() {
    dual_stack_across_a_restart(Backend::Nftables);
}

fn dual_stack_across_a_restart(backend: Backend) {
    const V6_SET: &str = "istio-inpod-probes-v6";
    let mut node = Node::start_real_dual_stack(
        backend,
        &[("HEALTH_PORT", HEALTH_PORT), ("AMBIENT_IPV6", "true")],
    );
    let pods = enrol(&node, &["ds"]);
    let pod = &pods[0];
    let v6 = global_ipv6(&pod.ns);
    node.set_status(
        "amb",
        "ds",
        json!({
            "phase": "Running", "podIP": pod.ip,
            "podIPs": [{"ip": pod.ip}, {"ip": v6}]
        }),
    );
    let v6_member = vec![(v6.clone(), pod.uid.clone())];
    node.wait_until(Duration::from_secs(10), "the IPv6 probe entry", || {
        node.probe_set_members(V6_SET) == v6_member
    });
    node.restart_agent_killed();
    node.wait_until(
        Duration::from_secs(10),
        "both families in the probe sets after the restart",
        || {
            node.probe_set_members(V6_SET) == v6_member
                && node.probe_members() == expected_members(&pods)
        },
    );
    let report = debug_pods(&node);
    assert_eq!(report["pods"][0]["ips"], json!([pod.ip, v6]), "{report}");
    assert_in_mesh(&node, &pods);
    assert_outbound_lands_to(&node, pod, "[fd00:10:244::250]:8080".parse().expect("addr"));
    let from = client(&node);
    assert_inbound_lands_at(&node, &from, pod, &v6);
    assert_annotated_by_agent(&node, &pods);
}

/// The pod's global IPv6 address on eth0 (waits out duplicate address detection).
fn global_ipv6(pod: &PodNs) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = pod.guard.exec(
            "ip",
            &["-6", "-o", "addr", "show", "dev", "eth0", "scope", "global"],
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let ready = text.lines().find(|l| !l.contains("tentative"));
        if let Some(addr) = ready
            .and_then(|l| l.split_whitespace().skip_while(|w| *w != "inet6").nth(1))
            .and_then(|a| a.split('/').next())
        {
            return addr.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "no usable IPv6 address on eth0: {text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Scenario 4: the agent killed (-9) in the middle of 10 concurrent ADDs, started again; the
/// failed ADDs are retried as the kubelet does. Every pod ends enrolled exactly once: annotated,
/// its in-pod rules not duplicated, the probe set exactly the enrolled IPs, ztunnel's current
/// connection given one Add per pod, and each pod in the mesh.
#[test]
fn an_agent_killed_mid_burst_enrols_every_pod_exactly_once_iptables() {
    agent_killed_mid_burst(Backend::Iptables);
}

#[test]
fn an_agent_killed_mid_burst_enrols_every_pod_exactly_once_nftables() {
    agent_killed_mid_burst(Backend::Nftables);
}

fn agent_killed_mid_burst(backend: Backend) {
    const N: usize = 10;
    let mut node = Node::start_real(backend);
    node.namespace("amb", json!({AMBIENT: "ambient"}));
    let names: Vec<String> = (0..N).map(|i| format!("burst-{i}")).collect();
    let sandboxes: Vec<(String, PodNs)> = names
        .iter()
        .map(|n| (node.unique_pod("amb", n), PodNs::new("burst")))
        .collect();
    // A real sandbox has its process from the start: the restarted agent's /proc scan finds the
    // netns of a pod whose ADD finished before the kill through it.
    let mut processes: Vec<Option<PodProcess>> = sandboxes
        .iter()
        .map(|(uid, ns)| Some(PodProcess::start(ns, uid)))
        .collect();
    let results: Vec<Result<Value, String>> = std::thread::scope(|s| {
        let adds: Vec<_> = names
            .iter()
            .zip(&sandboxes)
            .map(|(name, (_, ns))| s.spawn(|| node.add(ns, "amb", name)))
            .collect();
        std::thread::sleep(Duration::from_millis(400));
        node.agent.signal(nix::sys::signal::Signal::SIGKILL);
        adds.into_iter()
            .map(|a| a.join().expect("ADD thread"))
            .collect()
    });
    let failed = results.iter().filter(|r| r.is_err()).count();
    eprintln!("{failed} of {N} ADDs failed with the agent killed");
    // The kubelet reports the IP of a sandbox whose ADD succeeded.
    for (name, first) in names.iter().zip(&results) {
        if let Ok(r) = first {
            node.set_running("amb", name, &result_ip(r));
        }
    }
    node.restart_agent_killed();
    let mut pods = Vec::new();
    for (((name, (uid, ns)), first), process) in
        names.iter().zip(sandboxes).zip(results).zip(&mut processes)
    {
        let result = match first {
            Ok(r) => r,
            // The kubelet retries a failed ADD (after a DEL of the half-made sandbox).
            Err(_) => {
                let _ = node.del(&ns, "amb", name);
                node.add(&ns, "amb", name)
                    .unwrap_or_else(|e| panic!("retried ADD {name}: {e}\n{}", node.agent.output()))
            }
        };
        let ip = result_ip(&result);
        node.set_running("amb", name, &ip);
        let _process = process.take().expect("one process per sandbox");
        pods.push(Enrolled {
            name: name.clone(),
            uid,
            ip,
            ns,
            _process,
        });
    }
    for p in &pods {
        node.wait_until(Duration::from_secs(10), "annotated", || {
            node.redirection("amb", &p.name).as_deref() == Some("enabled")
        });
        // Each rule of ours once per table.
        let ours = node.owned_rules(&p.ns);
        assert!(!ours.is_empty(), "{}: no in-pod rules", p.name);
        let unique: std::collections::BTreeSet<&String> = ours.iter().collect();
        assert_eq!(
            unique.len(),
            ours.len(),
            "{}: duplicated rules: {ours:#?}",
            p.name
        );
    }
    wait_probe_set_exactly(&node, &pods, "the probe set exactly the pods");
    // Counted on the connection whose snapshot is complete: the peer may have reconnected (an
    // agent killed under it ends its connection) and a snapshot in progress lists fewer Adds.
    node.peer.wait(
        Duration::from_secs(10),
        "the current connection's snapshot",
        |p| {
            p.requests(p.connection())
                .contains(&support::zds_peer::Seen::SnapshotSent)
        },
    );
    let conn = node.peer.connection();
    for p in &pods {
        let adds = node
            .peer
            .requests(conn)
            .iter()
            .filter(|s| s.is_add_of(&p.uid))
            .count();
        assert_eq!(
            adds,
            1,
            "{}: {adds} Adds on connection {conn}: {:?}; violations {:?}",
            p.name,
            node.peer.requests(conn),
            node.peer.violations()
        );
    }
    assert_in_mesh(&node, &pods);
    assert_annotated_by_agent(&node, &pods);
}
