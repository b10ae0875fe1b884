//! Shared harness for the install-cni integration tests: temp dirs standing in for the host
//! mounts, the real binary started as `install-cni`, its log lines collected, tiny HTTP clients.
//! Included by the other `install_*` tests with `#[path]`; as a test target of its own it only
//! checks the harness itself.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const TD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/testdata/install/");

pub fn testdata(name: &str) -> Vec<u8> {
    std::fs::read(format!("{TD}{name}")).unwrap_or_else(|e| panic!("testdata {name}: {e}"))
}

pub fn testdata_str(name: &str) -> String {
    String::from_utf8(testdata(name)).expect("utf8 testdata")
}

/// Temp dirs standing in for /host/etc/cni/net.d, /host/opt/cni/bin, the run dir and the SA dir.
pub struct Dirs {
    pub tmp: tempfile::TempDir,
    pub net: PathBuf,
    pub bin: PathBuf,
    pub run: PathBuf,
    pub sa: PathBuf,
}

impl Default for Dirs {
    fn default() -> Self {
        Self::new()
    }
}

impl Dirs {
    pub fn new() -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path();
        let (net, bin, run, sa) = (
            root.join("net"),
            root.join("bin"),
            root.join("run"),
            root.join("sa"),
        );
        for d in [&net, &bin, &sa] {
            std::fs::create_dir_all(d).expect("mkdir");
        }
        std::fs::write(sa.join("ca.crt"), testdata("kube-ca.crt")).expect("ca");
        std::fs::write(sa.join("token"), "service_account_token_string").expect("token");
        Self {
            tmp,
            net,
            bin,
            run,
            sa,
        }
    }

    /// Writes a file into the conf dir (mode 0644).
    pub fn put(&self, name: &str, content: &[u8]) {
        std::fs::write(self.net.join(name), content).expect("write conf");
    }

    pub fn read(&self, name: &str) -> Option<String> {
        std::fs::read_to_string(self.net.join(name)).ok()
    }

    /// Waits up to `timeout` for `name` in the conf dir to satisfy `ready`; true when it did.
    pub fn waits_for(&self, timeout: Duration, name: &str, ready: impl Fn(&str) -> bool) -> bool {
        wait_for(timeout, || self.read(name).filter(|c| ready(c))).is_some()
    }

    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.net)
            .expect("ls net")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// The env every test run gets: host paths, service env, ephemeral ports.
    pub fn base_env(&self) -> Vec<(String, String)> {
        [
            ("MOUNTED_CNI_NET_DIR", self.net.display().to_string()),
            ("CNI_BIN_DIRS", self.bin.display().to_string()),
            ("CNI_AGENT_RUN_DIR", self.run.display().to_string()),
            ("SERVICE_ACCOUNT_DIR", self.sa.display().to_string()),
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1".to_string()),
            ("KUBERNETES_SERVICE_PORT", "443".to_string()),
            ("HEALTH_PORT", "0".to_string()),
            ("MONITORING_PORT", "0".to_string()),
            ("REPAIR_ENABLED", "false".to_string()),
            ("POD_NAMESPACE", "my-namespace".to_string()),
            // Ambient refuses to start without a procfs here (the chart mounts the host's).
            ("HOST_PROC_DIR", "/proc".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

/// The running binary and its collected log lines.
pub struct Agent {
    pub child: Child,
    pub lines: Arc<Mutex<Vec<String>>>,
}

/// The binary under test: `$ISTIO_CNI_RS_BIN` when set (the benchmarks point it at the static
/// release build), else the one cargo built for the tests.
pub fn bin() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        std::env::var("ISTIO_CNI_RS_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_istio-cni-rs").to_string())
    })
}

/// Starts `install-cni` with exactly `env` (plus PATH) and `args`.
pub fn start(env: &[(String, String)], args: &[&str]) -> Agent {
    start_via(&[], env, args)
}

/// Like [`start`], with the binary run through `wrapper` (e.g. `unshare -m sh -c ...`), which
/// must exec it (the child's pid is signalled).
pub fn start_via(wrapper: &[&str], env: &[(String, String)], args: &[&str]) -> Agent {
    let mut cmd = match wrapper.split_first() {
        Some((program, rest)) => {
            let mut c = Command::new(program);
            c.args(rest).arg(bin());
            c
        }
        None => Command::new(bin()),
    };
    cmd.arg("install-cni")
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // The allocator's own knobs pass through, so a bench can try one without a rebuild.
    for (k, v) in std::env::vars().filter(|(k, _)| k.starts_with("MIMALLOC_")) {
        cmd.env(k, v);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn install-cni");
    let lines = Arc::new(Mutex::new(Vec::new()));
    for stream in [
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .flatten()
    {
        let lines = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                lines.lock().expect("lines").push(line);
            }
        });
    }
    Agent { child, lines }
}

impl Agent {
    pub fn output(&self) -> String {
        self.lines.lock().expect("lines").join("\n")
    }

    /// Waits for a log line containing `needle`; returns it.
    pub fn wait_line(&self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(l) = self
                .lines
                .lock()
                .expect("lines")
                .iter()
                .find(|l| l.contains(needle))
            {
                return l.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no log line with {needle:?} within {timeout:?}; output:\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The port from a `... listening\taddr=0.0.0.0:PORT` line.
    pub fn port(&self, what: &str) -> u16 {
        let line = self.wait_line(&format!("{what} listening"), Duration::from_secs(20));
        line.rsplit(':')
            .next()
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("no port in {line:?}"))
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig)
            .expect("kill");
    }

    /// Sends SIGTERM and waits for the exit.
    pub fn terminate(&mut self, timeout: Duration) -> ExitStatus {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        self.wait(timeout)
    }

    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                // Let the reader threads drain the pipes.
                std::thread::sleep(Duration::from_millis(50));
                return st;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!(
                    "install-cni did not exit within {timeout:?}; output:\n{}",
                    self.output()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A port that was free a moment ago (MONITORING_PORT=0 means "disabled", as in Istio).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// Polls `f` until it returns Some or the timeout passes.
pub fn wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A minimal HTTP/1.1 GET on loopback: (status, body).
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    read_response(&mut s)
}

/// A minimal HTTP/1.1 POST over a Unix socket: (status, body).
pub fn uds_post(sock: &Path, path: &str, body: &str) -> Option<(u16, String)> {
    let mut s = UnixStream::connect(sock).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    read_response(&mut s)
}

fn read_response(s: &mut impl Read) -> Option<(u16, String)> {
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((status, body))
}

/// Whether a JSON config's plugin list ends with an istio-cni entry.
pub fn has_istio_entry(content: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(content)
        .ok()
        .and_then(|v| {
            v.get("plugins")?
                .as_array()?
                .last()?
                .get("type")?
                .as_str()
                .map(|t| t == "istio-cni")
        })
        .unwrap_or(false)
}

#[test]
fn harness_parses_http_status() {
    let mut raw: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 2\r\n\r\nno";
    assert_eq!(read_response(&mut raw), Some((503, "no".to_string())));
    assert!(has_istio_entry(&testdata_str("list.conflist.golden")));
    assert!(!has_istio_entry(&testdata_str("list.conflist")));
}

/// A test API server on loopback (its own runtime) and a kubeconfig for it, for install-cni runs
/// with the ambient agent (which watches pods and namespaces before anything is installed).
pub struct ApiServer {
    pub rt: tokio::runtime::Runtime,
    pub server: istio_cni_testing::apiserver::TestApiServer,
    pub kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

impl ApiServer {
    pub fn start() -> ApiServer {
        let (server, rt) = istio_cni_testing::apiserver::TestApiServer::start_blocking();
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = dir.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig).expect("kubeconfig");
        ApiServer {
            rt,
            server,
            kubeconfig,
            _dir: dir,
        }
    }

    /// Env for an install-cni run with the ambient agent on node `node-1`, against this server,
    /// with the test-only fake data plane and ztunnel.
    pub fn ambient_env(&self) -> Vec<(String, String)> {
        [
            ("AMBIENT_ENABLED", "true"),
            ("NODE_NAME", "node-1"),
            ("KUBECONFIG", self.kubeconfig.to_str().expect("utf-8 path")),
            ("ISTIO_CNI_RS_TEST_FAKE_DATAPLANE", "1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }
}

/// A `kB` field of `/proc/<pid>/status` (`VmRSS`, `RssAnon`, ...).
pub fn proc_status_kb(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
