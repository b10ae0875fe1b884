//! Trust boundaries of install-cni's listeners (issue 20, classes 4-7), on the real binary: the
//! plugin sockets are root only and bounded, a flood of idle connections leaves every listener
//! serving and gives its fds and memory back, two agents on one run dir keep each other's
//! sockets, a removed socket comes back, and only a stale socket is ever replaced.

#[path = "install_support.rs"]
mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use istio_cni::wire::pod_facts::{PodFactsAnswer, PodFactsRequest};
use support::*;

const T: Duration = Duration::from_secs(30);

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p)
        .expect("stat")
        .permissions()
        .mode()
        & 0o7777
}

/// Runs `work` on a thread whose credentials alone are uid/gid 65534 (the raw syscall changes
/// only the calling thread; glibc's setresuid would change the whole test process).
fn as_nobody<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        let nobody = 65534 as libc::uid_t;
        // SAFETY: plain syscalls on this thread's credentials.
        let rc = unsafe { libc::syscall(libc::SYS_setresgid, nobody, nobody, nobody) };
        assert_eq!(rc, 0, "setresgid: {}", std::io::Error::last_os_error());
        let rc = unsafe { libc::syscall(libc::SYS_setresuid, nobody, nobody, nobody) };
        assert_eq!(rc, 0, "setresuid: {}", std::io::Error::last_os_error());
        work()
    })
    .join()
    .expect("nobody thread")
}

/// One POST on a kept-alive connection: the status.
fn post_keepalive(s: &mut BufReader<UnixStream>, path: &str, body: &str) -> Option<u16> {
    write!(
        s.get_mut(),
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut status = String::new();
    s.read_line(&mut status).ok()?;
    let mut len = 0usize;
    loop {
        let mut h = String::new();
        s.read_line(&mut h).ok()?;
        if h == "\r\n" || h.is_empty() {
            break;
        }
        if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().ok()?;
        }
    }
    let mut rest = vec![0; len];
    s.read_exact(&mut rest).ok()?;
    status.split_whitespace().nth(1)?.parse().ok()
}

fn record(msg: &str) -> String {
    serde_json::to_string(&format!(
        r#"{{"level":"info","time":"2024-05-06T07:08:09.123456Z","msg":"{msg}"}}"#
    ))
    .expect("json")
}

#[test]
fn log_sock_is_root_only_and_a_root_flood_is_bounded_with_one_warning() {
    let d = Dirs::new();
    d.put("10-list.conflist", &testdata("list.conflist"));
    let agent = start(&d.base_env(), &[]);
    agent.wait_line("plugin log sink listening", T);
    let sock = d.run.join("log.sock");
    assert_eq!(mode(&sock), 0o600);
    assert_eq!(mode(&d.run), 0o700, "run dir created 0700");

    // A local user cannot connect through the modes; with them opened up (as a careless
    // hostPath would), SO_PEERCRED still refuses it and the forged record never appears.
    let s = sock.clone();
    let denied = as_nobody(move || UnixStream::connect(&s).err().map(|e| e.kind()));
    assert_eq!(denied, Some(std::io::ErrorKind::PermissionDenied));
    std::fs::set_permissions(&d.run, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let (s, forged) = (
        sock.clone(),
        format!("[{}]", record("forged cmdAdd failed")),
    );
    let answer = as_nobody(move || uds_post(&s, "/log", &forged));
    let (code, body) = answer.expect("an answer");
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("uid 65534 is not root"), "{body}");
    let refusal = agent.wait_line("is not root", T);
    assert!(refusal.contains("uid 65534"), "{refusal}");
    assert!(!agent.output().contains("forged cmdAdd failed"));

    // A root flood on one connection: ~4 MB of records in about 2 s.
    let filler = "x".repeat(180);
    let batch: Vec<String> = (0..200)
        .map(|i| record(&format!("flood {i} {filler}")))
        .collect();
    let body = format!("[{}]", batch.join(","));
    // The budget counts each record's own bytes (the JSON string's content).
    let rec_len = serde_json::from_str::<String>(&batch[0])
        .expect("record")
        .len();
    let mut conn = BufReader::new(UnixStream::connect(&sock).expect("connect"));
    let started = Instant::now();
    let mut sent = 0;
    while started.elapsed() < Duration::from_secs(2) {
        assert_eq!(post_keepalive(&mut conn, "/log", &body), Some(200));
        sent += batch.len();
    }
    let elapsed = started.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(300));
    let out = agent.output();
    let emitted = out.lines().filter(|l| l.contains("\tflood ")).count();
    let bound = (256.0 * 1024.0 + 64.0 * 1024.0 * elapsed) / rec_len as f64;
    assert!(
        emitted as f64 <= bound + 1.0 && emitted > 0 && emitted < sent,
        "{emitted} of {sent} records re-emitted, bound {bound:.0}"
    );
    let warnings: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("plugin log records dropped"))
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("uid 0"), "{}", warnings[0]);
}

/// Opens `n` connections that send nothing (every 8th sends half a request head).
fn idle_unix(path: &Path, n: usize) -> Vec<UnixStream> {
    (0..n)
        .map(|i| {
            let mut s = UnixStream::connect(path).expect("connect");
            if i % 8 == 0 {
                let _ = s.write_all(b"POST /log HTTP/1.1\r\nHost: x\r\n");
            }
            s
        })
        .collect()
}

fn idle_tcp(port: u16, n: usize) -> Vec<TcpStream> {
    (0..n)
        .map(|i| {
            let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
            if i % 8 == 0 {
                let _ = s.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\n");
            }
            s
        })
        .collect()
}

/// Whether the server closed the connection (EOF, or reset) within `within`.
fn closed_by_server(s: &mut impl Read, within: Duration, set: impl Fn(Option<Duration>)) -> bool {
    set(Some(within));
    let mut buf = [0u8; 512];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return false,
            Err(_) => return true,
        }
    }
}

fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

fn rss_kb(pid: u32) -> u64 {
    support::proc_status_kb(pid, "VmRSS").unwrap_or(0)
}

fn pod_facts(sock: &Path, name: &str, uid: &str) -> Option<PodFactsAnswer> {
    let mut s = UnixStream::connect(sock).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let req = PodFactsRequest {
        namespace: "default".into(),
        name: name.into(),
        uid: uid.into(),
        namespace_labels: false,
    };
    s.write_all(&req.encode()).ok()?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).ok()?;
    PodFactsAnswer::decode(line.as_bytes()).ok()
}

fn add_pod(api: &ApiServer, name: &str, uid: &str) {
    let pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {"nodeName": "node-1", "containers": [{"name": "app"}]}
    }))
    .expect("pod");
    api.server.add_pod(pod).expect("add pod");
}

/// install-cni with the ambient agent (fake data plane), every listener on, 1 s idle timeout.
fn ambient_agent(api: &ApiServer, d: &Dirs, extra: &[(&str, &str)]) -> (Agent, u16, u16) {
    let mut env = d.base_env();
    env.retain(|(k, _)| k != "MONITORING_PORT");
    env.extend(api.ambient_env());
    env.push(("MONITORING_PORT".into(), free_port().to_string()));
    env.push(("LISTENER_IDLE_TIMEOUT".into(), "1s".into()));
    for (k, v) in extra {
        env.push((k.to_string(), v.to_string()));
    }
    let agent = start(&env, &[]);
    let health = agent.port("health server");
    let metrics = agent.port("metrics server");
    (agent, health, metrics)
}

fn ready(port: u16) -> bool {
    http_get(port, "/readyz").is_some_and(|(c, _)| c == 200)
}

#[test]
fn an_idle_connection_flood_leaves_every_listener_serving_and_gives_back_fds_and_memory() {
    let api = ApiServer::start();
    add_pod(&api, "p1", "7d3f2c1a-5b4e-4c6d-8e9f-0a1b2c3d4e51");
    let d = Dirs::new();
    d.put("10-list.conflist", &testdata("list.conflist"));
    let (agent, health, metrics) = ambient_agent(&api, &d, &[]);
    assert!(
        wait_for(T, || ready(health).then_some(())).is_some(),
        "{}",
        agent.output()
    );
    let (log, event, facts) = (
        d.run.join("log.sock"),
        d.run.join("pluginevent.sock"),
        d.run.join("podfacts/pod.sock"),
    );
    let pid = agent.child.id();
    // Warm up every path once, so the baseline holds what a served request allocates.
    assert!(pod_facts(&facts, "p1", "7d3f2c1a-5b4e-4c6d-8e9f-0a1b2c3d4e51").is_some());
    assert_eq!(uds_post(&event, "/cmdadd", "{").map(|r| r.0), Some(400));
    assert_eq!(uds_post(&log, "/log", "[]").map(|r| r.0), Some(200));
    std::thread::sleep(Duration::from_millis(200));
    let (fds0, rss0) = (fds(pid), rss_kb(pid));

    // Twice each listener's bound of connections that send nothing (or half a head).
    let started = Instant::now();
    let mut unix = idle_unix(&log, 128);
    unix.extend(idle_unix(&event, 256));
    unix.extend(idle_unix(&facts, 256));
    let mut tcp = idle_tcp(health, 64);
    tcp.extend(idle_tcp(metrics, 64));
    let opened = started.elapsed();

    // Meanwhile everything still answers: readiness, metrics, /cmdadd, pod facts, the log sink,
    // and the install pass repairs a removed entry.
    assert!(ready(health), "{}", agent.output());
    assert_eq!(http_get(metrics, "/metrics").map(|r| r.0), Some(200));
    assert_eq!(uds_post(&event, "/cmdadd", "{").map(|r| r.0), Some(400));
    assert!(matches!(
        pod_facts(&facts, "p1", "7d3f2c1a-5b4e-4c6d-8e9f-0a1b2c3d4e51"),
        Some(PodFactsAnswer::Pod { .. })
    ));
    assert_eq!(uds_post(&log, "/log", "[]").map(|r| r.0), Some(200));
    d.put("10-list.conflist", &testdata("list.conflist"));
    assert!(
        d.waits_for(T, "10-list.conflist", has_istio_entry),
        "{}",
        agent.output()
    );
    let bounds = 64 + 128 + 128 + 32 + 32;
    let flooded = fds(pid);
    assert!(
        flooded <= fds0 + bounds + 16,
        "{flooded} fds open under the flood, {fds0} before, bounds {bounds}"
    );

    // Idle and slow-header connections are closed by the server within the timeout (1 s from
    // their start, plus slack for a loaded machine).
    let budget = (Duration::from_secs(1) + Duration::from_millis(1500)).saturating_sub(opened);
    let deadline = Instant::now() + budget.max(Duration::from_millis(500));
    let left = || deadline.saturating_duration_since(Instant::now()) + Duration::from_millis(10);
    let open_unix = unix
        .iter()
        .filter(|s| {
            let mut r: &UnixStream = s;
            !closed_by_server(&mut r, left(), |t| s.set_read_timeout(t).expect("timeout"))
        })
        .count();
    let open_tcp = tcp
        .iter()
        .filter(|s| {
            let mut r: &TcpStream = s;
            !closed_by_server(&mut r, left(), |t| s.set_read_timeout(t).expect("timeout"))
        })
        .count();
    assert_eq!(
        (open_unix, open_tcp),
        (0, 0),
        "connections the server kept open"
    );
    drop(unix);
    drop(tcp);

    // The agent's fds and memory come back.
    let back = wait_for(Duration::from_secs(5), || {
        (fds(pid) <= fds0 + 2 && rss_kb(pid) <= rss0 + 4096).then_some(())
    });
    assert!(
        back.is_some(),
        "fds {} (before {fds0}), RSS {} kB (before {rss0} kB)",
        fds(pid),
        rss_kb(pid)
    );
    eprintln!(
        "fds: {fds0} before, {flooded} flooded, {} after; RSS kB: {rss0} before, {} after",
        fds(pid),
        rss_kb(pid)
    );
    assert!(ready(health));
}

fn sockets(run: &Path) -> [PathBuf; 3] {
    [
        run.join("log.sock"),
        run.join("pluginevent.sock"),
        run.join("podfacts/pod.sock"),
    ]
}

#[test]
fn two_agents_on_one_run_dir_keep_each_others_sockets_and_a_removed_socket_comes_back() {
    let api = ApiServer::start();
    add_pod(&api, "p1", "7d3f2c1a-5b4e-4c6d-8e9f-0a1b2c3d4e51");
    let (da, db) = (Dirs::new(), Dirs::new());
    da.put("10-list.conflist", &testdata("list.conflist"));
    db.put("10-list.conflist", &testdata("list.conflist"));
    let run = da.run.display().to_string();
    let (mut a, health_a, _) = ambient_agent(&api, &da, &[]);
    assert!(
        wait_for(T, || ready(health_a).then_some(())).is_some(),
        "{}",
        a.output()
    );
    // The surge: a second agent on the same run dir takes the sockets over.
    let (mut b, health_b, _) = ambient_agent(&api, &db, &[("CNI_AGENT_RUN_DIR", &run)]);
    assert!(
        wait_for(T, || ready(health_b).then_some(())).is_some(),
        "{}",
        b.output()
    );
    let superseded = wait_for(T, || {
        http_get(health_a, "/readyz").filter(|(c, body)| *c == 503 && body.contains("log.sock"))
    });
    let (_, body) = superseded.expect("the replaced agent still says ready");
    assert!(body.contains("another server"), "{body}");

    // The old one stops: the survivor's sockets stay, and they are served.
    assert!(a.terminate(T).success(), "{}", a.output());
    for s in sockets(&da.run) {
        assert!(
            s.exists(),
            "{} removed by the agent that stopped",
            s.display()
        );
    }
    assert!(ready(health_b), "{}", b.output());
    let log = da.run.join("log.sock");
    assert_eq!(uds_post(&log, "/log", "[]").map(|r| r.0), Some(200));

    // Removed by hand: readiness fails naming it, then it is bound again and served.
    for s in sockets(&da.run) {
        std::fs::remove_file(&s).expect("rm");
        let name = s.file_name().expect("name").to_string_lossy().into_owned();
        let seen = wait_for(T, || {
            http_get(health_b, "/readyz").filter(|(c, body)| *c == 503 && body.contains(&name))
        });
        let (_, body) = seen.unwrap_or_else(|| panic!("{name}: readiness never failed"));
        assert!(body.contains("removed"), "{body}");
        assert!(
            wait_for(T, || ready(health_b).then_some(())).is_some(),
            "{}",
            b.output()
        );
        assert!(s.exists(), "{name} not bound again");
    }
    assert_eq!(uds_post(&log, "/log", "[]").map(|r| r.0), Some(200));
    assert!(matches!(
        pod_facts(
            &da.run.join("podfacts/pod.sock"),
            "p1",
            "7d3f2c1a-5b4e-4c6d-8e9f-0a1b2c3d4e51"
        ),
        Some(PodFactsAnswer::Pod { .. })
    ));
    assert_eq!(
        uds_post(&da.run.join("pluginevent.sock"), "/cmdadd", "{").map(|r| r.0),
        Some(400)
    );
    assert!(b.terminate(T).success());
    for s in sockets(&da.run) {
        assert!(
            !s.exists(),
            "{} left after the last agent stopped",
            s.display()
        );
    }
}

#[test]
fn only_a_stale_log_socket_is_replaced_and_a_regular_file_stops_startup_untouched() {
    let d = Dirs::new();
    d.put("10-list.conflist", &testdata("list.conflist"));
    std::fs::create_dir_all(&d.run).expect("run dir");
    let sock = d.run.join("log.sock");
    std::fs::write(&sock, b"not a socket").expect("file");
    let mut agent = start(&d.base_env(), &[]);
    let status = agent.wait(T);
    assert!(!status.success());
    let out = agent.output();
    assert!(
        out.contains(&sock.display().to_string()) && out.contains("a regular file"),
        "{out}"
    );
    assert_eq!(std::fs::read(&sock).expect("kept"), b"not a socket");

    // A stale socket and a dangling symlink are replaced.
    std::fs::remove_file(&sock).expect("rm");
    drop(std::os::unix::net::UnixListener::bind(&sock).expect("stale socket"));
    let mut agent = start(&d.base_env(), &[]);
    agent.wait_line("plugin log sink listening", T);
    assert!(agent.terminate(T).success());
    std::os::unix::fs::symlink(d.tmp.path().join("nowhere"), &sock).expect("symlink");
    let mut agent = start(&d.base_env(), &[]);
    agent.wait_line("plugin log sink listening", T);
    assert_eq!(uds_post(&sock, "/log", "[]").map(|r| r.0), Some(200));
    assert!(agent.terminate(T).success());
}
