//! Faults through the real binary: API server down (fails within the deadline), no kubeconfig for
//! pods that need none, bad input of every kind (error JSON, netns unchanged), interception mode
//! NONE, and 50 concurrent ADDs on 50 namespaces.

mod cni_driver;

use std::path::Path;
use std::time::{Duration, Instant};

use cni_driver::*;
use serde_json::{Value, json};

fn conf(run_dir: &Path) -> Value {
    json!({
        "cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "istio-cni",
        "cni_agent_run_dir": run_dir.display().to_string(),
        "exclude_namespaces": ["kube-system"], "pod_namespace": "istio-system",
        "prevResult": {"cniVersion": "1.0.0", "ips": [{"address": "10.30.0.2/24"}], "dns": {}}
    })
}

/// A port on loopback that nothing listens on.
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn add(netns: &NetnsGuard, ns: &str, pod: &str, conf: &Value) -> Run {
    run_plugin(
        &cni_env("ADD", &netns.path().display().to_string(), ns, pod),
        &conf.to_string(),
    )
}

fn assert_untouched(netns: &NetnsGuard) {
    let save = netns.iptables_save();
    assert!(!save.contains("ISTIO"), "netns was changed:\n{save}");
}

#[test]
fn api_server_down_fails_within_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    write_kubeconfig(dir.path(), &format!("http://127.0.0.1:{}", closed_port()));
    let netns = NetnsGuard::new("down");
    let mut c = conf(dir.path());
    c["pod_lookup_timeout_seconds"] = json!(2);
    let start = Instant::now();
    let run = add(&netns, "ns1", "p", &c);
    let took = start.elapsed();
    assert_eq!(run.code, 1, "{}", run.stdout);
    let msg = run.json()["msg"].as_str().unwrap().to_string();
    assert!(
        msg.contains("ns1/p") && msg.contains("Kubernetes API"),
        "{msg}"
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_untouched(&netns);

    // The overall deadline wins over a longer lookup window.
    c["pod_lookup_timeout_seconds"] = json!(30);
    c["add_timeout_seconds"] = json!(2);
    let start = Instant::now();
    let run = add(&netns, "ns1", "p", &c);
    assert_eq!(run.code, 1);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
}

#[test]
fn api_server_that_never_answers_is_bounded_by_the_call_timeout() {
    // Accepts connections but never replies.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    write_kubeconfig(dir.path(), &format!("http://127.0.0.1:{port}"));
    let netns = NetnsGuard::new("hang");
    let mut c = conf(dir.path());
    c["add_timeout_seconds"] = json!(3);
    c["kube_call_timeout_seconds"] = json!(1);
    let start = Instant::now();
    let run = add(&netns, "ns1", "p", &c);
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert!(
        start.elapsed() < Duration::from_secs(6),
        "took {:?}",
        start.elapsed()
    );
    drop(l);
}

#[test]
fn pods_that_need_no_api_succeed_without_a_kubeconfig() {
    let dir = tempfile::tempdir().unwrap(); // no kubeconfig in it
    let netns = NetnsGuard::new("nokc");
    let c = conf(dir.path());
    for (ns, pod) in [
        ("istio-system", "istio-cni-node-x7k2p"),
        ("kube-system", "coredns-1"),
    ] {
        let run = add(&netns, ns, pod, &c);
        assert_eq!(run.code, 0, "{ns}/{pod}: {}{}", run.stdout, run.stderr);
        assert_eq!(run.json()["ips"][0]["address"], "10.30.0.2/24");
    }
    // Not a Kubernetes pod (no K8S_* args).
    let mut env = cni_env("ADD", &netns.path().display().to_string(), "x", "y");
    env.retain(|(k, _)| *k != "CNI_ARGS");
    let run = run_plugin(&env, &c.to_string());
    assert_eq!(run.code, 0, "{}", run.stdout);
    // A normal pod does need it, and says so.
    let run = add(&netns, "ns1", "p", &c);
    assert_eq!(run.code, 1);
    assert!(
        run.json()["msg"]
            .as_str()
            .unwrap()
            .contains("istio-cni-kubeconfig"),
        "{}",
        run.stdout
    );
    assert_untouched(&netns);
}

#[test]
fn bad_input_is_an_error_and_leaves_the_netns_alone() {
    let api = FakeApiServer::start();
    api.put_pod(sidecar_pod(
        "ns1",
        "bad-ann",
        json!({"traffic.sidecar.istio.io/includeInboundPorts": "80,http"}),
        json!([]),
        json!({}),
    ));
    let dir = tempfile::tempdir().unwrap();
    api.write_kubeconfig(dir.path());
    let netns = NetnsGuard::new("bad");
    let ns_path = netns.path().display().to_string();

    // Malformed stdin.
    let run = run_plugin(
        &cni_env("ADD", &ns_path, "ns1", "bad-ann"),
        "{\"cniVersion\": \"1.0.0\", ",
    );
    assert_eq!((run.code, run.json()["code"].clone()), (1, json!(6)));
    // A field of the wrong type names the field.
    let mut c = conf(dir.path());
    c["exclude_namespaces"] = json!("kube-system");
    let run = add(&netns, "ns1", "bad-ann", &c);
    assert!(
        run.json()["msg"]
            .as_str()
            .unwrap()
            .contains("exclude_namespaces"),
        "{}",
        run.stdout
    );
    // Bad CNI_ARGS.
    let mut env = cni_env("ADD", &ns_path, "ns1", "bad-ann");
    env.retain(|(k, _)| *k != "CNI_ARGS");
    env.push((
        "CNI_ARGS",
        "K8S_POD_NAME=bad-ann;K8S_POD_NAMESPACE=ns1;FOO=bar".into(),
    ));
    let run = run_plugin(&env, &conf(dir.path()).to_string());
    assert_eq!(run.code, 1);
    assert!(
        run.json()["msg"].as_str().unwrap().contains("unknown args"),
        "{}",
        run.stdout
    );
    // Bad annotation: the error names the annotation and the value.
    let run = add(&netns, "ns1", "bad-ann", &conf(dir.path()));
    assert_eq!(run.code, 1);
    let msg = run.json()["msg"].as_str().unwrap().to_string();
    assert!(
        msg.contains("traffic.sidecar.istio.io/includeInboundPorts") && msg.contains("80,http"),
        "{msg}"
    );
    assert_untouched(&netns);
}

#[test]
fn interception_mode_none_programs_nothing() {
    let api = FakeApiServer::start();
    api.put_pod(sidecar_pod(
        "ns1",
        "none",
        json!({"sidecar.istio.io/interceptionMode": "NONE"}),
        json!([]),
        json!({}),
    ));
    let dir = tempfile::tempdir().unwrap();
    api.write_kubeconfig(dir.path());
    let netns = NetnsGuard::new("none");
    let run = add(&netns, "ns1", "none", &conf(dir.path()));
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert_untouched(&netns);
}

#[test]
fn fifty_concurrent_adds_on_fifty_namespaces() {
    require_tool("iptables-restore", "iptables");
    let api = FakeApiServer::start();
    api.put_pod(sidecar_pod(
        "ns1",
        "sidecar",
        json!({}),
        json!([]),
        json!({}),
    ));
    let dir = tempfile::tempdir().unwrap();
    api.write_kubeconfig(dir.path());
    let namespaces: Vec<NetnsGuard> = (0..50).map(|_| NetnsGuard::new("c")).collect();
    let c = conf(dir.path());
    let runs: Vec<Run> = std::thread::scope(|s| {
        let handles: Vec<_> = namespaces
            .iter()
            .map(|ns| {
                let c = &c;
                s.spawn(move || add(ns, "ns1", "sidecar", c))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (run, ns) in runs.iter().zip(&namespaces) {
        assert_eq!(run.code, 0, "{}: {}{}", ns.name, run.stdout, run.stderr);
        let save = ns.iptables_save();
        assert!(
            save.contains("-A ISTIO_OUTPUT -j ISTIO_REDIRECT"),
            "{}:\n{save}",
            ns.name
        );
    }
}

#[test]
fn native_nftables_programs_nft_tables() {
    require_tool("nft", "nftables");
    let api = FakeApiServer::start();
    api.put_pod(sidecar_pod("ns1", "nft", json!({}), json!([]), json!({})));
    let dir = tempfile::tempdir().unwrap();
    api.write_kubeconfig(dir.path());
    let netns = NetnsGuard::new("nft");
    let mut c = conf(dir.path());
    c["native_nftables"] = json!(true);
    let run = add(&netns, "ns1", "nft", &c);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let out = netns.exec("nft", &["list", "ruleset"]);
    let ruleset = String::from_utf8_lossy(&out.stdout);
    assert!(ruleset.contains("table inet istio-proxy-nat"), "{ruleset}");
    assert!(ruleset.contains("redirect to :15001"), "{ruleset}");
}

#[test]
fn transient_api_errors_are_retried() {
    use istio_cni::kube::testserver::Fault;
    let api = FakeApiServer::start();
    api.put_pod(sidecar_pod("ns1", "flaky", json!({}), json!([]), json!({})));
    let dir = tempfile::tempdir().unwrap();
    api.write_kubeconfig(dir.path());
    // The first two pod reads fail with 500; the third works.
    api.fault(Fault::fail(500).times(2));
    let netns = NetnsGuard::new("flaky");
    let out = dir.path().join("dry.txt");
    let mut env = cni_env("ADD", &netns.path().display().to_string(), "ns1", "flaky");
    env.push(("DRY_RUN_FILE_PATH", out.display().to_string()));
    let run = run_plugin(&env, &conf(dir.path()).to_string());
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(
        std::fs::read_to_string(&out)
            .unwrap()
            .contains("ISTIO_REDIRECT")
    );
    assert!(api.request_count() >= 3, "expected retries");
}
