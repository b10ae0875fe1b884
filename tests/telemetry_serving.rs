//! The agent's telemetry endpoints through the real binary: forwarded plugin records cannot forge
//! log lines or send terminal escapes, an oversize log batch gets 413 and a warning, and
//! `/metrics` speaks OpenMetrics or the classic 0.0.4 text format as the `Accept` header asks.

#[path = "install_support.rs"]
mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use support::*;

const T: Duration = Duration::from_secs(30);

fn started_agent(args: &[&str]) -> (Dirs, Agent) {
    let d = Dirs::new();
    d.put("10-list.conflist", &testdata("list.conflist"));
    let agent = start(&d.base_env(), args);
    agent.wait_line("plugin log sink listening", T);
    (d, agent)
}

#[test]
fn forwarded_records_are_escaped_on_one_line() {
    for json in [false, true] {
        let args: &[&str] = if json { &["--log_as_json"] } else { &[] };
        let (d, mut agent) = started_agent(args);
        let record = serde_json::json!({
            "level": "info",
            "time": "2024-05-06T07:08:09.123456Z\nFORGED-TIME",
            "msg": "hello\n2024-01-01T00:00:00.000000Z\terror\tcni-agent\tFORGED \u{1b}[31mred\r",
            "pod": "ns/p\r\nFORGED-VALUE \u{1b}[0m",
            "k\nFORGED-KEY\u{1b}]0;t\u{7}": "v\u{9b}2J",
        });
        let body = serde_json::to_string(&[record.to_string()]).expect("body");
        assert_eq!(
            uds_post(&d.run.join("log.sock"), "/log", &body).map(|r| r.0),
            Some(200)
        );
        let line = agent.wait_line("hello", T);
        let out = agent.output();
        // Tabs separate the text format's columns; nothing else may be a control character.
        assert!(
            !out.chars()
                .any(|c| c.is_control() && c != '\n' && c != '\t'),
            "control characters reached the log:\n{out:?}"
        );
        for forged in ["FORGED", "FORGED-TIME", "FORGED-VALUE", "FORGED-KEY"] {
            let lines_with: Vec<&str> = out.lines().filter(|l| l.contains(forged)).collect();
            assert_eq!(
                lines_with,
                [line.as_str()],
                "{forged} forged a line:\n{out}"
            );
        }
        if json {
            let v: serde_json::Value = serde_json::from_str(&line).expect("one JSON line");
            // JSON escapes C0 itself; the value survives the round trip unchanged.
            assert_eq!(v["pod"], "ns/p\r\nFORGED-VALUE \u{1b}[0m");
            assert_eq!(v["k\nFORGED-KEY\u{1b}]0;t\u{7}"], "v\\u{9b}2J");
        } else {
            assert!(
                line.starts_with(
                    "2024-05-06T07:08:09.123456Z\\nFORGED-TIME\tinfo\tcni-plugin\thello\\n2024-01-01T00:00:00.000000Z\\terror\\tcni-agent\\tFORGED \\u{1b}[31mred\\r\t"
                ),
                "{line:?}"
            );
            assert!(
                line.contains("k\\nFORGED-KEY\\u{1b}]0;t\\u{7}=v\\u{9b}2J"),
                "{line:?}"
            );
            assert!(
                line.contains("pod=ns/p\\r\\nFORGED-VALUE \\u{1b}[0m"),
                "{line:?}"
            );
        }
        assert!(agent.terminate(T).success());
    }
}

#[test]
fn oversize_log_batch_gets_413_and_a_warning() {
    let (d, mut agent) = started_agent(&[]);
    let sock = d.run.join("log.sock");
    let record = serde_json::json!({"level": "info", "time": "t", "msg": "x".repeat(3 << 20)});
    let body = serde_json::to_string(&[record.to_string()]).expect("body");
    let (code, text) = post_ignoring_write_errors(&sock, &body);
    assert_eq!(code, 413, "{text}");
    assert!(
        text.contains("log batch larger than 2097152 bytes"),
        "{text}"
    );
    let warning = agent.wait_line("plugin log batch refused", T);
    assert!(warning.contains("\twarn\tcni-agent\t"), "{warning}");
    assert!(warning.contains("limit_bytes=2097152"), "{warning}");
    // The sink keeps working for batches within the limit.
    let small =
        serde_json::to_string(&[r#"{"level":"info","time":"t","msg":"after-413"}"#]).expect("body");
    assert_eq!(uds_post(&sock, "/log", &small).map(|r| r.0), Some(200));
    agent.wait_line("after-413", T);
    assert!(agent.terminate(T).success());
}

/// POST /log over the socket; the server may answer and close before the whole body is written.
fn post_ignoring_write_errors(sock: &std::path::Path, body: &str) -> (u16, String) {
    let mut s = std::os::unix::net::UnixStream::connect(sock).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let head = format!(
        "POST /log HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = s
        .write_all(head.as_bytes())
        .and_then(|_| s.write_all(body.as_bytes()));
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let raw = String::from_utf8_lossy(&raw);
    let status = raw
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP answer: {raw:?}"));
    let text = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, text)
}

/// GET with an optional Accept header: (status, Content-Type, body).
fn get_metrics(port: u16, accept: Option<&str>) -> (u16, String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: localhost\r\n{accept}Connection: close\r\n\r\n"
    )
    .expect("request");
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("response");
    let (head, body) = raw.split_once("\r\n\r\n").expect("head and body");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status");
    let content_type = head
        .lines()
        .find_map(|l| {
            l.split_once(':')
                .filter(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        })
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    (status, content_type, body.to_string())
}

#[test]
fn metrics_follow_the_accept_header() {
    let d = Dirs::new();
    d.put("10-list.conflist", &testdata("list.conflist"));
    let mut env = d.base_env();
    env.push(("MONITORING_PORT".into(), free_port().to_string()));
    let mut agent = start(&env, &[]);
    let port = agent.port("metrics server");
    agent.wait_line("plugin log sink listening", T);
    wait_for(T, || {
        let (_, _, body) = get_metrics(port, None);
        body.contains("istio_cni_installs_total{").then_some(())
    })
    .expect("install counted");

    let classic = [
        None,
        Some("text/plain;version=0.0.4"),
        Some("text/plain; version=0.0.4; q=1.0, */*; q=0.1"),
        Some("*/*"),
    ];
    for accept in classic {
        let (status, content_type, body) = get_metrics(port, accept);
        assert_eq!(status, 200);
        assert_eq!(
            content_type, "text/plain; version=0.0.4; charset=utf-8",
            "{accept:?}"
        );
        assert!(
            body.contains("# TYPE istio_cni_installs_total counter\n")
                && body.contains("# HELP istio_cni_installs_total "),
            "{accept:?}:\n{body}"
        );
        assert!(!body.contains("# EOF"), "{accept:?}:\n{body}");
        assert!(
            body.contains("# TYPE istio_cni_install_ready gauge\n"),
            "{body}"
        );
    }

    let openmetrics = [
        "application/openmetrics-text; version=1.0.0",
        // What Prometheus sends by default.
        "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
    ];
    for accept in openmetrics {
        let (status, content_type, body) = get_metrics(port, Some(accept));
        assert_eq!(status, 200);
        assert_eq!(
            content_type,
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
        );
        assert!(
            body.contains("# TYPE istio_cni_installs counter\n"),
            "{body}"
        );
        assert!(body.ends_with("# EOF\n"), "{body}");
    }
    assert!(agent.terminate(T).success());
}

/// The value of an unlabelled sample `name` in exposition text.
fn sample(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn process_metrics_are_served_with_prometheus_names() {
    let d = Dirs::new();
    d.put("10-list.conflist", &testdata("list.conflist"));
    let mut env = d.base_env();
    env.push(("MONITORING_PORT".into(), free_port().to_string()));
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    let mut agent = start(&env, &[]);
    let port = agent.port("metrics server");
    agent.wait_line("plugin log sink listening", T);
    let pid = agent.child.id();
    let (status, _, body) = get_metrics(port, None);
    assert_eq!(status, 200);
    for (name, kind) in [
        ("process_cpu_seconds_total", "counter"),
        ("process_resident_memory_bytes", "gauge"),
        ("process_virtual_memory_bytes", "gauge"),
        ("process_open_fds", "gauge"),
        ("process_max_fds", "gauge"),
        ("process_start_time_seconds", "gauge"),
    ] {
        assert!(
            body.contains(&format!("# TYPE {name} {kind}\n")),
            "{name}:\n{body}"
        );
        assert!(
            sample(&body, name).is_some(),
            "{name} has no sample:\n{body}"
        );
    }
    let value = |name| sample(&body, name).expect("sample");
    // The agent's own figures, read beside the scrape.
    let rss = proc_status_kb(pid, "VmRSS").expect("VmRSS") as f64 * 1024.0;
    let vsz = proc_status_kb(pid, "VmSize").expect("VmSize") as f64 * 1024.0;
    let resident = value("process_resident_memory_bytes");
    assert!(
        resident > rss / 2.0 && resident < rss * 2.0,
        "{resident} vs VmRSS {rss}"
    );
    let virt = value("process_virtual_memory_bytes");
    assert!(
        virt > vsz / 2.0 && virt < vsz * 2.0,
        "{virt} vs VmSize {vsz}"
    );
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fd")
        .count() as f64;
    let open = value("process_open_fds");
    assert!(open >= 3.0 && (open - fds).abs() <= 8.0, "{open} vs {fds}");
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let soft: f64 = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("Max open files");
    assert_eq!(value("process_max_fds"), soft);
    let start_time = value("process_start_time_seconds");
    assert!(
        (start_time - before).abs() < 5.0,
        "start {start_time}, spawned at {before}"
    );
    let cpu = value("process_cpu_seconds_total");
    assert!((0.0..60.0).contains(&cpu), "{cpu}");
    // OpenMetrics names the counter family without `_total`, its sample with it.
    let (_, _, om) = get_metrics(port, Some("application/openmetrics-text; version=1.0.0"));
    assert!(om.contains("# TYPE process_cpu_seconds counter\n"), "{om}");
    assert!(sample(&om, "process_cpu_seconds_total").is_some(), "{om}");
    assert!(agent.terminate(T).success());
}
