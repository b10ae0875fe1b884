//! Faults through the real binary: API server down (fails within the deadline), no kubeconfig for
//! pods that need none, bad input of every kind (error JSON, netns unchanged), interception mode
//! NONE, and 50 concurrent ADDs on 50 namespaces.

mod cni_driver;

use std::path::Path;
use std::time::{Duration, Instant};

use cni_driver::*;
use serde_json::{Value, json};

fn conf(run_dir: &Path) -> Value {
    sidecar_conf(run_dir, "10.30.0.2/24")
}

/// A port on loopback that nothing listens on.
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
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
    let run = netns.add("ns1", "p", &c);
    let took = run.took;
    run.assert_failed_saying(&["ns1/p", "Kubernetes API"]);
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_untouched(&netns);

    // The overall deadline wins over a longer lookup window.
    c["pod_lookup_timeout_seconds"] = json!(30);
    c["add_timeout_seconds"] = json!(2);
    let start = Instant::now();
    let run = netns.add("ns1", "p", &c);
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
    let run = netns.add("ns1", "p", &c);
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
        let run = netns.add(ns, pod, &c);
        assert_eq!(run.code, 0, "{ns}/{pod}: {}{}", run.stdout, run.stderr);
        assert_eq!(run.json()["ips"][0]["address"], "10.30.0.2/24");
    }
    // Not a Kubernetes pod (no K8S_* args).
    let mut env = cni_env("ADD", &netns.path().display().to_string(), "x", "y");
    env.retain(|(k, _)| *k != "CNI_ARGS");
    let run = run_plugin(&env, &c.to_string());
    assert_eq!(run.code, 0, "{}", run.stdout);
    // A normal pod does need it, and says so.
    let run = netns.add("ns1", "p", &c);
    assert_eq!(run.code, 1);
    assert!(run.msg().contains("istio-cni-kubeconfig"), "{}", run.stdout);
    assert_untouched(&netns);
}

#[test]
fn bad_input_is_an_error_and_leaves_the_netns_alone() {
    let (api, dir) = api_and_run_dir();
    api.put_pod(annotated_pod(
        "ns1",
        "bad-ann",
        json!({"traffic.sidecar.istio.io/includeInboundPorts": "80,http"}),
    ));
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
    let run = netns.add("ns1", "bad-ann", &c);
    assert!(run.msg().contains("exclude_namespaces"), "{}", run.stdout);
    // Bad CNI_ARGS.
    let mut env = cni_env("ADD", &ns_path, "ns1", "bad-ann");
    env.retain(|(k, _)| *k != "CNI_ARGS");
    env.push((
        "CNI_ARGS",
        "K8S_POD_NAME=bad-ann;K8S_POD_NAMESPACE=ns1;FOO=bar".into(),
    ));
    let run = run_plugin(&env, &conf(dir.path()).to_string());
    assert_eq!(run.code, 1);
    assert!(run.msg().contains("unknown args"), "{}", run.stdout);
    // Bad annotation: the error names the annotation and the value.
    let run = netns.add("ns1", "bad-ann", &conf(dir.path()));
    run.assert_failed_saying(&["traffic.sidecar.istio.io/includeInboundPorts", "80,http"]);
    assert_untouched(&netns);
}

#[test]
fn interception_mode_none_programs_nothing() {
    let (api, dir) = api_and_run_dir();
    api.put_pod(annotated_pod(
        "ns1",
        "none",
        json!({"sidecar.istio.io/interceptionMode": "NONE"}),
    ));
    let netns = NetnsGuard::new("none");
    let run = netns.add("ns1", "none", &conf(dir.path()));
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert_untouched(&netns);
}

#[test]
fn fifty_concurrent_adds_on_fifty_namespaces() {
    require_tool("iptables-restore", "iptables");
    let (api, dir) = api_and_run_dir();
    api.put_pod(annotated_pod("ns1", "sidecar", json!({})));
    let namespaces: Vec<NetnsGuard> = (0..50).map(|_| NetnsGuard::new("c")).collect();
    let c = conf(dir.path());
    let runs: Vec<Run> = std::thread::scope(|s| {
        let handles: Vec<_> = namespaces
            .iter()
            .map(|ns| {
                let c = &c;
                s.spawn(move || ns.add("ns1", "sidecar", c))
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
    let (_api, dir) = api_with_sidecar_pod("ns1", "nft");
    let netns = NetnsGuard::new("nft");
    let mut c = conf(dir.path());
    c["native_nftables"] = json!(true);
    let run = netns.add("ns1", "nft", &c);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let out = netns.exec("nft", &["list", "ruleset"]);
    let ruleset = String::from_utf8_lossy(&out.stdout);
    assert!(ruleset.contains("table inet istio-proxy-nat"), "{ruleset}");
    assert!(ruleset.contains("redirect to :15001"), "{ruleset}");
}

#[test]
fn transient_api_errors_are_retried() {
    use istio_cni_testing::apiserver::Fault;
    let (api, dir) = api_with_sidecar_pod("ns1", "flaky");
    // The first two pod reads fail with 500; the third works.
    api.fault(Fault::fail(500).times(2));
    let netns = NetnsGuard::new("flaky");
    let out = dir.path().join("dry.txt");
    let mut env = cni_env("ADD", &netns.path().display().to_string(), "ns1", "flaky");
    env.push(("DRY_RUN_FILE_PATH", out.display().to_string()));
    let run = run_plugin(&env, &conf(dir.path()).to_string());
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(file_text(&out).contains("ISTIO_REDIRECT"));
    assert!(api.request_count() >= 3, "expected retries");
}

#[test]
fn an_api_server_certificate_from_another_ca_fails_add_at_once_naming_the_server() {
    let (api, dir) = api_with_sidecar_pod("ns1", "tls");
    // The kubeconfig trusts another server's CA (what a rotated cluster CA looks like).
    let other = FakeApiServer::start();
    let other_dir = tempfile::tempdir().unwrap();
    other.write_kubeconfig(other_dir.path());
    let text = file_text(&other_dir.path().join("istio-cni-kubeconfig"));
    std::fs::write(
        dir.path().join("istio-cni-kubeconfig"),
        text.replace(&other.server.url(), &api.server.url()),
    )
    .unwrap();
    let netns = NetnsGuard::new("tls");
    let mut c = conf(dir.path());
    // A transient error would be retried for this long; a certificate error is not retried.
    c["pod_lookup_timeout_seconds"] = json!(10);
    let run = netns.add("ns1", "tls", &c);
    run.assert_failed_saying(&[
        "ns1/tls",
        "TLS with the API server",
        &api.server.url(),
        "invalid peer certificate",
        "certificate authority in the kubeconfig",
    ]);
    assert!(run.took < Duration::from_secs(3), "took {:?}", run.took);
    // The handshake failed: no request ever reached the server.
    assert_eq!(api.request_count(), 0);
    assert_untouched(&netns);
}

/// The host's ISTIO rule lines (iptables-save of this process's netns).
fn host_istio_lines() -> std::collections::BTreeSet<String> {
    let mut lines = std::collections::BTreeSet::new();
    for tool in ["iptables-nft-save", "iptables-legacy-save"] {
        let out = std::process::Command::new(tool).output();
        let Ok(out) = out else { continue };
        lines.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| l.contains("ISTIO"))
                .map(str::to_string),
        );
    }
    lines
}

/// After the netns went away: the ADD failed naming its path, the host got no rule of ours, and
/// DEL (twice, as runtimes retry) succeeds.
fn assert_failed_cleanly_and_del_succeeds(
    run: &Run,
    saying: &str,
    path: &Path,
    before: &std::collections::BTreeSet<String>,
    c: &Value,
) {
    run.assert_failed_saying(&["ns1/gone", saying, &path.display().to_string()]);
    let added: Vec<_> = host_istio_lines().difference(before).cloned().collect();
    assert!(added.is_empty(), "rules left on the host: {added:?}");
    for _ in 0..2 {
        let env = cni_env("DEL", &path.display().to_string(), "ns1", "gone");
        let del = run_plugin(&env, &c.to_string());
        assert_eq!(del.code, 0, "{}{}", del.stdout, del.stderr);
    }
}

#[test]
fn a_netns_removed_before_add_fails_naming_it_and_del_still_succeeds() {
    let (_api, dir) = api_with_sidecar_pod("ns1", "gone");
    let before = host_istio_lines();
    let netns = NetnsGuard::new("gone");
    let path = netns.path();
    drop(netns);
    assert!(!path.exists());
    let c = conf(dir.path());
    let run = run_plugin(
        &cni_env("ADD", &path.display().to_string(), "ns1", "gone"),
        &c.to_string(),
    );
    let saying = "cannot open network namespace";
    assert_failed_cleanly_and_del_succeeds(&run, saying, &path, &before, &c);
}

#[test]
fn a_netns_removed_while_add_reads_the_pod_fails_naming_it_and_del_still_succeeds() {
    use istio_cni_testing::apiserver::Fault;
    let (api, dir) = api_with_sidecar_pod("ns1", "gone");
    // The pod read takes a while: the netns is removed in the middle of the ADD.
    api.fault(Fault::slow(Duration::from_millis(1500)).on_path("/api/v1/namespaces/ns1/pods"));
    let before = host_istio_lines();
    let netns = NetnsGuard::new("gone-mid");
    let path = netns.path();
    let c = conf(dir.path());
    let run = std::thread::scope(|s| {
        let add = s.spawn(|| {
            run_plugin(
                &cni_env("ADD", &path.display().to_string(), "ns1", "gone"),
                &c.to_string(),
            )
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while api.request_count() == 0 {
            assert!(Instant::now() < deadline, "the ADD never asked for its pod");
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(netns);
        assert!(!path.exists());
        add.join().expect("ADD thread")
    });
    let saying = "cannot open network namespace";
    assert_failed_cleanly_and_del_succeeds(&run, saying, &path, &before, &c);
}

#[test]
fn a_netns_removed_while_add_programs_it_fails_naming_it_and_del_still_succeeds() {
    require_tool("iptables-restore", "iptables");
    let (api, dir) = api_with_sidecar_pod("ns1", "gone");
    let before = host_istio_lines();
    let netns = NetnsGuard::new("gone-prog");
    let path = netns.path();
    let c = conf(dir.path());
    let mut env = cni_env("ADD", &path.display().to_string(), "ns1", "gone");
    // test-hooks: the ADD holds 2 s between opening the netns and programming it.
    env.push(("ISTIO_CNI_RS_TEST_PAUSE_AFTER_NETNS_OPEN_MS", "2000".into()));
    let run = std::thread::scope(|s| {
        let add = s.spawn(|| run_plugin(&env, &c.to_string()));
        let deadline = Instant::now() + Duration::from_secs(10);
        while api.request_count() == 0 {
            assert!(Instant::now() < deadline, "the ADD never asked for its pod");
            std::thread::sleep(Duration::from_millis(5));
        }
        // The pod answer and the open take milliseconds; the pause is 2 s.
        std::thread::sleep(Duration::from_millis(500));
        drop(netns);
        assert!(!path.exists());
        add.join().expect("ADD thread")
    });
    let saying = "was removed while the ADD programmed it";
    assert_failed_cleanly_and_del_succeeds(&run, saying, &path, &before, &c);
    assert!(
        run.took >= Duration::from_secs(2),
        "the pause did not happen"
    );
}

/// A FIFO as CNI_NETNS (a blocking open would wait for a writer forever): the ADD fails at once
/// naming the path and what it is, and the host gets no rule of ours (issue 20 §2).
#[test]
fn a_fifo_as_the_netns_fails_fast_naming_it() {
    let (_api, dir) = api_with_sidecar_pod("ns1", "gone");
    let before = host_istio_lines();
    let fifo = dir.path().join("netns-fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let c = conf(dir.path());
    let started = Instant::now();
    let run = run_plugin(
        &cni_env("ADD", &fifo.display().to_string(), "ns1", "gone"),
        &c.to_string(),
    );
    let took = started.elapsed();
    assert!(took < Duration::from_secs(1), "the ADD took {took:?}");
    let saying = "is a FIFO, not a network namespace";
    assert_failed_cleanly_and_del_succeeds(&run, saying, &fifo, &before, &c);
}
