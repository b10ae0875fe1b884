//! `install-cni status` against the real agent (issue 23, "what an operator sees"): install-cni
//! with ambient on in a node netns of its own (tests/support/ambient_node.rs), the real
//! kube-apiserver (`Node::start_real*`, the chart's RBAC; the test's namespaces carry a suffix
//! there, so every expected `namespace/name` is computed from the server's names) and the test
//! ZDS peer as ztunnel; one ambient pod enrolled through the real CNI chain, a sidecar pod and a
//! plain pod on the server. `install-cni status` (the table) and `--json` (the `/debug/pods`
//! answer) show each pod's mode, enrolment and reason, netns inode, IPs and ZDS state, as the
//! agent learnt them through its watch of the node's pods there (the audit log shows it); with no
//! agent, status exits 1 saying the agent is not running at the address it tried.

#[path = "support/ambient_node.rs"]
mod ambient_node;
mod install_support;
mod support;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use ambient_node::{Backend, NODE, Node, PodNs, PodProcess, in_netns, result_ip};
use install_support::{bin, free_port};
use serde_json::{Value, json};
use support::real_cluster::RealCluster;

const HEALTH_PORT: &str = "15021";

/// `install-cni status ARGS` with `env`, run inside `netns` (None: this test's netns).
fn status(netns: Option<&Path>, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = Command::new(bin());
    cmd.arg("install-cni")
        .arg("status")
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default());
    for (k, v) in env {
        cmd.env(k, v);
    }
    match netns {
        Some(ns) => in_netns(ns, move || cmd.output().expect("run install-cni status")),
        None => cmd.output().expect("run install-cni status"),
    }
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A pod of this node from its JSON (metadata, spec) on the server: Running with `ip`, or with
/// `None` Pending without a network (its ADD failed). Containers get an image (the server
/// requires one).
fn add_pod(node: &Node, namespace: &str, name: &str, ip: Option<&str>, meta: Value, spec: Value) {
    let mut metadata = json!({"name": name, "namespace": namespace});
    metadata
        .as_object_mut()
        .expect("object")
        .extend(meta.as_object().cloned().unwrap_or_default());
    let mut full_spec = json!({"nodeName": NODE});
    full_spec
        .as_object_mut()
        .expect("object")
        .extend(spec.as_object().cloned().unwrap_or_default());
    for c in full_spec["containers"].as_array_mut().into_iter().flatten() {
        c["image"] = json!("registry.invalid/app:1");
    }
    let status = match ip {
        Some(ip) => json!({"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}),
        None => json!({"phase": "Pending"}),
    };
    let pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": full_spec,
        "status": status
    }))
    .expect("Pod");
    node.cluster().add_pod(pod).expect("add pod");
}

/// The agent learnt the node's pods from the real server: its watch of them, by node, is in the
/// audit log.
fn assert_watched_on_server(node: &Node) {
    let node_name = node.cluster().node(NODE);
    let requests = node.cluster().requests();
    assert!(
        requests.iter().any(|(verb, uri)| verb == "watch"
            && uri.starts_with("/api/v1/pods?")
            && uri.contains(&node_name)),
        "no watch of the node's pods by the agent: {requests:#?}"
    );
}

/// The table's row of `id` (`namespace/name`), split into its cells.
fn row(table: &str, id: &str) -> Vec<String> {
    let line = table
        .lines()
        .find(|l| l.starts_with(&format!("{id} ")))
        .unwrap_or_else(|| panic!("no row {id}:\n{table}"));
    line.split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(String::from)
        .collect()
}

#[test]
fn status_shows_each_pod_of_the_node_from_the_running_agent() {
    let node = Node::start_real_on(
        RealCluster::start(),
        Backend::Iptables,
        &[
            ("DRIFT_VERIFY_INTERVAL", "2s"),
            ("HEALTH_PORT", HEALTH_PORT),
        ],
    );
    let node_ns = node.ns.path();
    let node_ns = Path::new(&node_ns);
    // What the DaemonSet's container has: install-cni's own env names the port.
    let env = [("HEALTH_PORT", HEALTH_PORT)];

    node.namespace("amb", json!({"istio.io/dataplane-mode": "ambient"}));
    node.namespace("web", json!({}));
    let uid = node.unique_pod("amb", "a");
    let pod_ns = PodNs::new("status");
    let ip = result_ip(
        &node
            .add(&pod_ns, "amb", "a")
            .unwrap_or_else(|e| panic!("ADD: {e}\n{}", node.agent.output())),
    );
    node.set_running("amb", "a", &ip);
    let _process = PodProcess::start(&pod_ns, &uid);
    add_pod(
        &node,
        "web",
        "side",
        Some("10.244.9.2"),
        json!({"annotations": {"sidecar.istio.io/status": "{}"}}),
        json!({"containers": [{"name": "app"},
            {"name": "istio-proxy", "args": ["proxy", "sidecar"]}]}),
    );
    add_pod(
        &node,
        "web",
        "plain",
        Some("10.244.9.3"),
        json!({}),
        json!({"containers": [{"name": "app"}]}),
    );

    // Once the agent has verified the pod and sees the other two.
    let json_report = || {
        let out = status(Some(node_ns), &env, &["--json"]);
        assert!(out.status.success(), "{}", text(&out));
        serde_json::from_slice::<Value>(&out.stdout).expect("status --json is JSON")
    };
    node.wait_until(
        Duration::from_secs(15),
        "a verified pod and the others listed",
        || {
            let r = json_report();
            r["pods"][0]["last_verified"]["result"] == "in_place"
                && r["not_enrolled"].as_array().is_some_and(|a| a.len() == 2)
        },
    );
    let report = json_report();
    let inode = node.peer.netns_of(&uid).expect("the peer's proxy").1;

    // --json: the agent's /debug/pods answer.
    assert_eq!(report["version"], 1, "{report}");
    let a = &report["pods"][0];
    assert_eq!(
        (&a["namespace"], &a["name"], &a["uid"]),
        (&json!(node.k8s_ns("amb")), &json!("a"), &json!(uid))
    );
    assert_eq!(a["netns"]["inode"], inode, "{report}");
    assert_eq!(a["ips"], json!([ip]));
    assert_eq!(
        (&a["zds"]["state"], &a["zds"]["request"]),
        (&json!("acked"), &json!("add"))
    );
    let others = report["not_enrolled"].as_array().expect("not_enrolled");
    let by_name = |n: &str| {
        others
            .iter()
            .find(|p| p["name"] == n)
            .unwrap_or_else(|| panic!("{n} not listed: {report}"))
    };
    let side = by_name("side");
    assert_eq!(
        (&side["mode"], &side["reason_code"]),
        (&json!("sidecar"), &json!("sidecar"))
    );
    assert_eq!(side["sidecar"]["redirected"], true);
    assert_eq!(side["ips"], json!(["10.244.9.2"]));
    let plain = by_name("plain");
    assert_eq!(
        (&plain["mode"], &plain["reason_code"]),
        (&json!("none"), &json!("not_selected"))
    );
    assert_eq!(plain["ips"], json!(["10.244.9.3"]));
    assert!(plain.get("sidecar").is_none(), "{plain}");

    // The table.
    let out = status(Some(node_ns), &env, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    let id = |ns: &str, name: &str| format!("{}/{name}", node.k8s_ns(ns));
    let a = row(&table, &id("amb", "a"));
    assert_eq!(
        a[1..6],
        ["ambient", "yes", "-", &inode.to_string(), &ip],
        "{table}"
    );
    assert!(a[6].starts_with("in_place "), "{table}");
    assert!(a[7].starts_with("add acked (conn "), "{table}");
    assert_eq!(
        row(&table, &id("web", "side"))[1..6],
        [
            "sidecar",
            "no",
            "sidecar: redirected by the plugin at ADD",
            "-",
            "10.244.9.2"
        ],
        "{table}"
    );
    assert_eq!(
        row(&table, &id("web", "plain"))[1..6],
        [
            "none",
            "no",
            "not selected by AMBIENT_ENABLEMENT_SELECTOR",
            "-",
            "10.244.9.3"
        ],
        "{table}"
    );
    assert!(table.starts_with("host probe rules: "), "{table}");

    // The wrong port (the flag wins over the env): refused, named.
    let out = status(Some(node_ns), &env, &["--health-port", "1"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not running at 127.0.0.1:1"),
        "{}",
        text(&out)
    );
    assert_watched_on_server(&node);
}

#[test]
fn without_an_agent_status_says_it_is_not_running_where_it_looked() {
    let port = free_port().to_string();
    let out = status(None, &[("HEALTH_PORT", &port)], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(out.stdout.is_empty(), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "the install-cni agent is not running at 127.0.0.1:{port}"
        )),
        "{}",
        text(&out)
    );
    let out = status(
        None,
        &[],
        &["--json", "--address", "127.0.0.1", "--health-port", &port],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
}

#[test]
fn status_help_describes_the_command() {
    let out = status(None, &[], &["--help"]);
    assert!(out.status.success(), "{}", text(&out));
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "install-cni status",
        "/debug/pods",
        "--json",
        "--health-port",
        "HEALTH_PORT",
        "--address",
        "--timeout",
    ] {
        assert!(help.contains(needle), "{needle} missing:\n{help}");
    }
    // Misplaced: install-cni's flags come before it.
    let out = Command::new(bin())
        .args(["install-cni", "--health-port", "8000", "status"])
        .env_clear()
        .output()
        .expect("run");
    assert_ne!(out.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("`status` must be the first argument"),
        "{}",
        text(&out)
    );
}

/// One GET to `addr` from inside `netns`; (status, body).
fn get_from(netns: &Path, addr: &'static str, path: &'static str) -> (u16, String) {
    in_netns(netns, move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).expect("connect to the health port");
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .expect("send");
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        let code = answer
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = answer.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
        (code, body)
    })
}

/// `/debug/pods` names every pod of the node: only loopback (install-cni status inside the
/// agent's netns) reads it. From another netns over a real link the probes answer and
/// `/debug/pods` is refused; inside, `install-cni status` still works, but not through the
/// agent's non-loopback address.
#[test]
fn debug_pods_is_served_only_on_loopback_while_the_probes_answer_everyone() {
    let node = Node::start_real_on(
        RealCluster::start(),
        Backend::Iptables,
        &[("HEALTH_PORT", HEALTH_PORT)],
    );
    let node_ns = node.ns.path();
    let node_ns = Path::new(&node_ns);
    // A neighbour netns linked to the node netns: 10.252.0.2 -> 10.252.0.1 (the node's side).
    let neighbour = support::Netns::new("dbg");
    neighbour.exec(
        "ip",
        &[
            "link",
            "add",
            "v0",
            "type",
            "veth",
            "peer",
            "name",
            "vdbg",
            "netns",
            &node.ns.name,
        ],
    );
    neighbour.exec("ip", &["addr", "add", "10.252.0.2/30", "dev", "v0"]);
    neighbour.exec("ip", &["link", "set", "v0", "up"]);
    node.ns
        .exec("ip", &["addr", "add", "10.252.0.1/30", "dev", "vdbg"]);
    node.ns.exec("ip", &["link", "set", "vdbg", "up"]);
    let outside = Path::new(&neighbour.path()).to_path_buf();
    let addr = "10.252.0.1:15021";

    let (code, body) = get_from(&outside, addr, "/healthz");
    assert_eq!((code, body.as_str()), (200, "ok"));
    let (code, _) = get_from(&outside, addr, "/readyz");
    assert_eq!(code, 200);
    let (code, body) = get_from(&outside, addr, "/debug/pods");
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("answered only on loopback"), "{body}");
    assert!(!body.contains("\"pods\""), "{body}");
    // The node's own non-loopback address, from inside: refused the same way.
    let (code, _) = get_from(node_ns, addr, "/debug/pods");
    assert_eq!(code, 403);

    let env = [("HEALTH_PORT", HEALTH_PORT)];
    let out = status(Some(node_ns), &env, &["--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(report["version"], 1, "{report}");
    let out = status(Some(node_ns), &env, &["--address", "10.252.0.1"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("answered only on loopback"),
        "{}",
        text(&out)
    );
    assert_watched_on_server(&node);
}

/// A sidecar pod whose ADD the plugin refuses (an unusable annotation: no network, Pending) and
/// one whose validation init container fails are never called redirected: status names the
/// failure and its reason. Sidecar-only (no ambient agent, the repair controller's pod store)
/// status answers too.
#[test]
fn status_calls_a_sidecar_pod_redirected_only_when_it_is_and_works_without_ambient() {
    for ambient in ["true", "false"] {
        let cluster = RealCluster::start();
        let repair_node = cluster.node(NODE);
        let extra = [
            ("HEALTH_PORT", HEALTH_PORT),
            ("AMBIENT_ENABLED", ambient),
            ("REPAIR_ENABLED", "true"),
            ("REPAIR_NODE_NAME", &repair_node),
            ("REPAIR_LABEL_PODS", "true"),
            ("REPAIR_REPAIR_PODS", "false"),
        ];
        let node = if ambient == "true" {
            Node::start_real_on(cluster, Backend::Iptables, &extra)
        } else {
            Node::start_real_without_peer(cluster, Backend::Iptables, &extra)
        };
        let node_ns = node.ns.path();
        let node_ns = Path::new(&node_ns);
        node.namespace("web", json!({}));
        let sidecar = json!({"containers": [{"name": "app"},
            {"name": "istio-proxy", "args": ["proxy", "sidecar"]}]});
        let injected = |extra: Value| {
            let mut a = json!({"sidecar.istio.io/status": "{}"});
            a.as_object_mut()
                .expect("object")
                .extend(extra.as_object().cloned().unwrap_or_default());
            json!({ "annotations": a })
        };
        add_pod(
            &node,
            "web",
            "good",
            Some("10.244.9.2"),
            injected(json!({})),
            sidecar.clone(),
        );
        add_pod(
            &node,
            "web",
            "bad",
            // The ADD failed: no network, Pending.
            None,
            injected(json!({"traffic.sidecar.istio.io/excludeOutboundPorts": "http"})),
            sidecar.clone(),
        );

        let env = [("HEALTH_PORT", HEALTH_PORT)];
        let row_of = |report: &Value, name: &str| -> Value {
            report["not_enrolled"]
                .as_array()
                .and_then(|a| a.iter().find(|p| p["name"] == name).cloned())
                .unwrap_or(Value::Null)
        };
        node.wait_until(Duration::from_secs(15), "both pods listed", || {
            let out = status(Some(node_ns), &env, &["--json"]);
            out.status.success()
                && serde_json::from_slice::<Value>(&out.stdout).is_ok_and(|r| {
                    row_of(&r, "good") != Value::Null
                        && row_of(&r, "bad")["ips"]
                            .as_array()
                            .is_some_and(Vec::is_empty)
                })
        });
        let out = status(Some(node_ns), &env, &["--json"]);
        let report: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let bad = row_of(&report, "bad");
        assert_eq!(bad["sidecar"]["redirected"], false, "{ambient}: {bad}");
        assert_eq!(bad["sidecar"]["state"], "failed", "{ambient}: {bad}");
        let why = bad["sidecar"]["failed"].as_str().unwrap_or_default();
        assert!(why.contains("excludeOutboundPorts"), "{ambient}: {bad}");
        let good = row_of(&report, "good");
        assert_eq!(good["sidecar"]["redirected"], true, "{ambient}: {good}");

        let out = status(Some(node_ns), &env, &[]);
        assert!(out.status.success(), "{ambient}: {}", text(&out));
        let table = String::from_utf8_lossy(&out.stdout).into_owned();
        let id = |name: &str| format!("{}/{name}", node.k8s_ns("web"));
        let cells = row(&table, &id("bad")).join(" | ");
        assert!(
            cells.contains("sidecar redirection failed: the plugin's ADD refuses it")
                && !cells.contains("redirected by the plugin"),
            "{ambient}: {table}"
        );
        assert!(
            row(&table, &id("good"))
                .join(" ")
                .contains("redirected by the plugin at ADD"),
            "{ambient}: {table}"
        );
        assert_watched_on_server(&node);
    }
}
