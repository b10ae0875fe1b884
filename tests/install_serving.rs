//! Health, readiness, metrics, the plugin log sink and startup errors of the real binary.

#[path = "install_support.rs"]
mod support;

use std::process::Command;
use std::time::Duration;

use support::*;

const T: Duration = Duration::from_secs(30);

fn status(port: u16, path: &str) -> Option<u16> {
    http_get(port, path).map(|(s, _)| s)
}

#[test]
fn readiness_follows_the_install_and_metrics_count_it() {
    let d = Dirs::new();
    let mut env = d.base_env();
    env.push(("MONITORING_PORT".into(), free_port().to_string()));
    let mut agent = start(&env, &[]);
    let health = agent.port("health server");
    let metrics = agent.port("metrics server");
    assert_eq!(status(health, "/healthz"), Some(200));
    // No primary config yet: alive but not ready.
    agent.wait_line("waiting for a valid primary CNI config", T);
    assert_eq!(status(health, "/readyz"), Some(503));
    let (_, body) = http_get(metrics, "/metrics").expect("metrics");
    assert!(body.contains("istio_cni_install_ready 0"), "{body}");

    d.put("10-list.conflist", &testdata("list.conflist"));
    assert!(
        wait_for(T, || (status(health, "/readyz") == Some(200)).then_some(())).is_some(),
        "never ready:\n{}",
        agent.output()
    );
    let (code, body) = http_get(metrics, "/metrics").expect("metrics");
    assert_eq!(code, 200);
    assert!(body.contains("istio_cni_install_ready 1"), "{body}");
    assert!(
        body.contains("istio_cni_installs_total{result=\"SUCCESS\"} 1"),
        "{body}"
    );
    // Labelled families of components without samples yet are not listed; gauges always are.
    // Without an Accept header the classic text format: counters are typed by their sample name.
    for name in [
        "# TYPE istio_cni_installs_total counter",
        "# TYPE istio_cni_install_ready gauge",
        "# TYPE ztunnel_connected gauge",
    ] {
        assert!(body.contains(name), "{name} missing:\n{body}");
    }

    // Something removes our entry: repaired, ready again, and counted.
    std::fs::write(d.net.join("10-list.conflist"), testdata("list.conflist")).expect("revert");
    assert!(
        wait_for(T, || {
            let (_, b) = http_get(metrics, "/metrics")?;
            b.contains("istio_cni_installs_total{result=\"SUCCESS\"} 2")
                .then_some(())
        })
        .is_some(),
        "repair not counted:\n{}",
        agent.output()
    );
    assert!(wait_for(T, || (status(health, "/readyz") == Some(200)).then_some(())).is_some());

    // While shutting down readiness drops before cleanup runs; the process exits 0.
    assert!(agent.terminate(T).success());
    assert_eq!(status(health, "/healthz"), None, "server stopped");
}

#[test]
fn log_sink_reemits_plugin_records_with_their_own_level_time_and_fields() {
    let d = Dirs::new();
    d.put("10-list.conflist", &testdata("list.conflist"));
    // The agent logs at info, the plugin scope at debug: independent scopes (Istio bug B16).
    let mut agent = start(&d.base_env(), &["--log_output_level=info,cni-plugin:debug"]);
    let sock = d.run.join("log.sock");
    agent.wait_line("plugin log sink listening", T);

    // Root only (the plugin runs as root): the socket is 0600 (issue 20).
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&sock).expect("sock").permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);

    let rec = |level: &str, msg: &str, extra: &str| {
        serde_json::to_string(&format!(
            r#"{{"level":"{level}","time":"2024-05-06T07:08:09.123456Z","msg":"{msg}"{extra}}}"#
        ))
        .expect("json string")
    };
    let body = format!(
        "[{},{},{},{}]",
        rec(
            "info",
            "hello from the plugin",
            r#","pod":"default/p1","netns":"/var/run/netns/x""#
        ),
        rec("debug", "plugin debug detail", ""),
        rec("trace", "dropped: unknown level", ""),
        serde_json::to_string("not json").expect("json")
    );
    // Posted by another process (curl) when it is installed, as a real plugin would.
    let via_curl = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--unix-socket",
        ])
        .arg(&sock)
        .args(["-X", "POST", "--data-binary", &body, "http://localhost/log"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    match via_curl {
        Some(code) => assert_eq!(code, "200"),
        None => assert_eq!(uds_post(&sock, "/log", &body).map(|r| r.0), Some(200)),
    }
    let line = agent.wait_line("hello from the plugin", T);
    assert_eq!(
        line,
        "2024-05-06T07:08:09.123456Z\tinfo\tcni-plugin\thello from the plugin\tnetns=/var/run/netns/x pod=default/p1"
    );
    let dbg = agent.wait_line("plugin debug detail", T);
    assert!(
        dbg.starts_with("2024-05-06T07:08:09.123456Z\tdebug\tcni-plugin\t"),
        "{dbg}"
    );
    assert!(!agent.output().contains("dropped: unknown level"));
    // Garbage gets a 200 too: a plugin must never fail over logging.
    assert_eq!(
        uds_post(&sock, "/log", "{not an array").map(|r| r.0),
        Some(200)
    );

    // Two plugins posting at once: each batch comes out in one piece.
    let batch = |tag: char| {
        let recs: Vec<String> = (0..40)
            .map(|i| rec("info", &format!("batch-{tag} line {i}"), ""))
            .collect();
        format!("[{}]", recs.join(","))
    };
    let (a, b) = (batch('a'), batch('b'));
    let sa = sock.clone();
    let t = std::thread::spawn(move || uds_post(&sa, "/log", &a));
    let rb = uds_post(&sock, "/log", &b);
    let ra = t.join().expect("thread");
    assert_eq!((ra.map(|r| r.0), rb.map(|r| r.0)), (Some(200), Some(200)));
    agent.wait_line("batch-a line 39", T);
    agent.wait_line("batch-b line 39", T);
    let out = agent.output();
    let tags: Vec<char> = out
        .lines()
        .filter_map(|l| l.split("batch-").nth(1).and_then(|r| r.chars().next()))
        .collect();
    let switches = tags.windows(2).filter(|w| w[0] != w[1]).count();
    assert_eq!(switches, 1, "batches interleaved: {tags:?}");

    // The plugin's last batch: written, then the connection closed at once, no answer read. The
    // records are served all the same (a stream socket keeps them for the agent), also when the
    // writer is gone before the agent even accepted; each on its own connection.
    for i in 0..20 {
        let body = format!("[{}]", rec("info", &format!("unanswered {i:02}"), ""));
        let mut raw = std::os::unix::net::UnixStream::connect(&sock).expect("connect");
        std::io::Write::write_all(
            &mut raw,
            format!(
                "POST /log HTTP/1.1\r\nHost: unix\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .expect("write");
        drop(raw);
    }
    for i in 0..20 {
        agent.wait_line(&format!("\tunanswered {i:02}"), T);
    }

    assert!(agent.terminate(T).success());
    assert!(!sock.exists(), "socket removed on shutdown");
}

#[test]
fn stale_socket_is_replaced_and_json_logs_work() {
    let d = Dirs::new();
    std::fs::create_dir_all(&d.run).expect("run dir");
    // A socket left by a previous run (a regular file would stop startup: install_listeners).
    drop(std::os::unix::net::UnixListener::bind(d.run.join("log.sock")).expect("stale"));
    d.put("10-list.conflist", &testdata("list.conflist"));
    let mut agent = start(&d.base_env(), &["--log_as_json"]);
    let line = agent.wait_line("plugin log sink listening", T);
    let v: serde_json::Value = serde_json::from_str(&line).expect("json log line");
    assert_eq!(v["scope"], "cni-agent");
    assert_eq!(v["level"], "info");
    assert!(
        v["time"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z') && t.len() == 27),
        "{v}"
    );
    let body = format!(
        "[{}]",
        serde_json::to_string(r#"{"level":"warn","time":"t0","msg":"m","k":1}"#).expect("json")
    );
    assert_eq!(
        uds_post(&d.run.join("log.sock"), "/log", &body).map(|r| r.0),
        Some(200)
    );
    let l = agent.wait_line("\"msg\":\"m\"", T);
    let v: serde_json::Value = serde_json::from_str(&l).expect("json");
    assert_eq!(
        (
            v["scope"].as_str(),
            v["level"].as_str(),
            v["time"].as_str(),
            v["k"].as_i64()
        ),
        (Some("cni-plugin"), Some("warn"), Some("t0"), Some(1))
    );
    assert!(agent.terminate(T).success());
}

fn run_to_exit(env: &[(String, String)], args: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin())
        .arg("install-cni")
        .args(args)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .expect("run");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn invalid_settings_stop_startup_naming_the_variable() {
    let d = Dirs::new();
    for (k, v, needle) in [
        ("HEALTH_PORT", "99999", "HEALTH_PORT"),
        ("KUBECONFIG_MODE", "rwx", "KUBECONFIG_MODE"),
        ("CHAINED_CNI_PLUGIN", "maybe", "CHAINED_CNI_PLUGIN"),
        (
            "AMBIENT_ENABLEMENT_SELECTOR",
            "- podSelector:\n    matchLabels: [\n",
            "AMBIENT_ENABLEMENT_SELECTOR",
        ),
        (
            "AMBIENT_ENABLEMENT_SELECTOR",
            "[{\"podSelector\":{\"matchExpressions\":[{\"key\":\"a\",\"operator\":\"Near\"}]}}]",
            "AMBIENT_ENABLEMENT_SELECTOR",
        ),
        // Repair on with no node would watch every pod of the cluster (Istio's B3).
        ("REPAIR_ENABLED", "true", "REPAIR_NODE_NAME"),
    ] {
        let mut env = d.base_env();
        env.push((k.to_string(), v.to_string()));
        let (code, out, err) = run_to_exit(&env, &[]);
        assert_ne!(code, 0, "{k}={v:?} accepted");
        // Refused while parsing: on stderr; found once logging is up (REPAIR_NODE_NAME): an error
        // record on the log target, stdout by default.
        assert!(
            err.contains(needle) || out.contains(needle),
            "{k}: {err}{out}"
        );
    }
    let (code, _, err) = run_to_exit(&d.base_env(), &["--monitoring-port=x"]);
    assert_ne!(code, 0);
    assert!(err.contains("--monitoring-port"), "{err}");
}

#[test]
fn help_lists_every_flag_with_its_env_name() {
    let (code, out, _) = run_to_exit(&[], &["--help"]);
    assert_eq!(code, 0);
    for (flag, env) in [
        ("--cni-conf-name", "CNI_CONF_NAME"),
        ("--chained-cni-plugin", "CHAINED_CNI_PLUGIN"),
        (
            "--istio-owned-cni-config-filename",
            "ISTIO_OWNED_CNI_CONFIG_FILENAME",
        ),
        ("--mounted-cni-net-dir", "MOUNTED_CNI_NET_DIR"),
        ("--cni-bin-dirs", "CNI_BIN_DIRS"),
        ("--cni-agent-run-dir", "CNI_AGENT_RUN_DIR"),
        ("--kubeconfig-mode", "KUBECONFIG_MODE"),
        ("--service-account-dir", "SERVICE_ACCOUNT_DIR"),
        ("--host-proc-dir", "HOST_PROC_DIR"),
        ("--host-netns-dir", "HOST_NETNS_DIR"),
        ("--health-port", "HEALTH_PORT"),
        ("--monitoring-port", "MONITORING_PORT"),
        (
            "--repair-init-container-exit-code",
            "REPAIR_INIT_CONTAINER_EXIT_CODE",
        ),
        ("--log-output-level", "LOG_OUTPUT_LEVEL"),
    ] {
        assert!(
            out.contains(flag) && out.contains(env),
            "{flag}/{env} missing from help:\n{out}"
        );
    }
    let (code, out, _) = run_to_exit(&[], &["version"]);
    assert_eq!(code, 0);
    assert!(out.contains("install-cni"), "{out}");
}

#[test]
fn sigint_also_cleans_up() {
    let d = Dirs::new();
    d.put("10-list.conflist", &testdata("list.conflist"));
    let mut agent = start(&d.base_env(), &[]);
    assert!(d.waits_for(T, "10-list.conflist", has_istio_entry));
    agent.signal(nix::sys::signal::Signal::SIGINT);
    assert!(agent.wait(T).success());
    assert_eq!(
        d.read("10-list.conflist"),
        Some(testdata_str("list-no-istio.conflist"))
    );
    assert!(!d.bin.join("istio-cni").exists());
}

#[test]
fn read_only_bin_dir_fails_the_pass_with_the_platform_hint_and_keeps_retrying() {
    let d = Dirs::new();
    d.put("10-list.conflist", &testdata("list.conflist"));
    let probe = Command::new("unshare").args(["-m", "true"]).status();
    assert!(
        probe.is_ok_and(|s| s.success()),
        "this test needs root and unshare(1) for a private read-only bind mount: run it as root \
         with util-linux installed (apt-get install util-linux; scripts/deps does)"
    );
    let mut env = d.base_env();
    env.push(("MONITORING_PORT".into(), free_port().to_string()));
    let bin_dir = d.bin.display().to_string();
    // A private mount namespace where the bin dir is a read-only bind mount of itself.
    let script = format!("mount --bind -o ro {bin_dir} {bin_dir} && exec \"$@\"");
    let mut agent = start_via(
        &[
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            &script,
            "sh",
        ],
        &env,
        &[],
    );
    let line = agent.wait_line("install pass failed", T);
    assert!(
        line.contains("global.platform") && line.contains(&bin_dir),
        "{line}"
    );
    let metrics = agent.port("metrics server");
    let health = agent.port("health server");
    assert_eq!(status(health, "/readyz"), Some(503));
    let (_, body) = http_get(metrics, "/metrics").expect("metrics");
    assert!(
        body.contains("istio_cni_installs_total{result=\"COPY_BINARIES_FAILURE\"}"),
        "{body}"
    );
    // Still alive and retrying, and exits cleanly.
    assert!(agent.child.try_wait().expect("try_wait").is_none());
    assert!(agent.terminate(T).success(), "{}", agent.output());
}

#[test]
fn a_deleted_or_replaced_plugin_binary_is_put_back() {
    let d = Dirs::new();
    d.put("10-list.conflist", &testdata("list.conflist"));
    let mut agent = start(&d.base_env(), &[]);
    let plugin = d.bin.join("istio-cni");
    let same = || {
        std::fs::read(&plugin)
            .ok()
            .filter(|b| *b == std::fs::read(bin()).expect("self"))
    };
    assert!(wait_for(T, same).is_some());
    std::fs::remove_file(&plugin).expect("rm");
    assert!(
        wait_for(T, same).is_some(),
        "deleted binary not restored:\n{}",
        agent.output()
    );
    std::fs::write(&plugin, b"#!/bin/sh\nexit 1\n").expect("replace");
    assert!(
        wait_for(T, same).is_some(),
        "replaced binary not restored:\n{}",
        agent.output()
    );
    assert!(agent.terminate(T).success());
}

#[test]
fn own_writes_do_not_wake_the_guard() {
    let d = Dirs::new();
    d.put("10-bridge.conf", &testdata("bridge.conf"));
    let mut agent = start(&d.base_env(), &["--log_output_level=debug"]);
    agent.wait_line("istio-cni is installed; watching for changes", T);
    // A negative check needs a quiet period: nothing may happen in it.
    std::thread::sleep(Duration::from_millis(1500));
    let out = agent.output();
    let count = |needle: &str| out.lines().filter(|l| l.contains(needle)).count();
    assert_eq!(count("wrote the istio-cni entry"), 1, "{out}");
    assert_eq!(count("installed the CNI plugin binary"), 1, "{out}");
    assert_eq!(count("wrote the plugin kubeconfig"), 1, "{out}");
    assert_eq!(count("istio-cni is installed; watching"), 1, "{out}");
    assert!(agent.terminate(T).success());
}

#[test]
fn logs_can_go_to_a_file() {
    let d = Dirs::new();
    d.put("10-list.conflist", &testdata("list.conflist"));
    let log = d.tmp.path().join("agent.log");
    let target = format!("--log_target={}", log.display());
    let mut agent = start(&d.base_env(), &[&target]);
    let ok = wait_for(T, || {
        std::fs::read_to_string(&log)
            .ok()
            .filter(|t| t.contains("istio-cni is installed; watching for changes"))
    });
    assert!(
        ok.is_some(),
        "log file: {:?}",
        std::fs::read_to_string(&log)
    );
    assert!(agent.terminate(T).success());
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(text.lines().all(|l| l.split('\t').count() >= 4), "{text}");
    assert!(
        !agent.output().contains("watching for changes"),
        "nothing on stderr"
    );
}
