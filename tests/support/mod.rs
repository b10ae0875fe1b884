//! Test support: uniquely named network namespaces joined by a veth pair, removed on drop (also when
//! a test fails), and helpers to run sockets or commands inside them. Only addresses inside these
//! namespaces are ever used.
#![allow(dead_code)]

use std::fs::File;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use istio_cni::agent::dataplane::DataplaneSettings;
use istio_cni::rules::ambient::AmbientConfig;
use nix::sched::{CloneFlags, setns};

pub mod istio_root;
pub mod node_proc;
pub mod real_cluster;
pub mod user_state;
// The ZDS test peer lives in the test-only crate (testing/); re-exported under the old paths.
#[allow(unused_imports)] // each test binary uses a different part of support
pub use istio_cni_testing::{zds_peer, zds_raw};

static COUNTER: AtomicU32 = AtomicU32::new(0);

// The tool and root checks are shared with the plugin tests' support module (public for tests
// that need both, e.g. netns_userns).
#[path = "../cni_driver/mod.rs"]
pub mod cni_driver;
pub use cni_driver::{require_root, require_tool};

/// Runs a command and returns its output; panics with its output on failure.
pub use cni_driver::run_checked as sh;

/// A named network namespace, deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(tag: &str) -> Netns {
        require_root();
        require_tool("ip", "iproute2");
        let name = format!(
            "icrs-{tag}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        sh("ip", &["netns", "add", &name]);
        let ns = Netns { name };
        ns.exec("ip", &["link", "set", "lo", "up"]);
        ns
    }

    pub fn path(&self) -> String {
        format!("/var/run/netns/{}", self.name)
    }

    /// Runs a command inside the namespace (panics on failure).
    pub fn exec(&self, program: &str, args: &[&str]) -> Output {
        let mut full = vec!["netns", "exec", &self.name, program];
        full.extend_from_slice(args);
        sh("ip", &full)
    }

    /// Runs a command inside the namespace and returns its output whatever the exit code.
    pub fn try_exec(&self, program: &str, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.name, program])
            .args(args)
            .output()
            .expect("run ip netns exec")
    }

    /// `iptables-save` without comments and counters, for before/after comparisons.
    pub fn iptables_state(&self) -> String {
        let out = self.exec("iptables-save", &[]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| {
                if l.starts_with(':') {
                    l.split(" [").next().unwrap_or(l).to_string()
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Runs `work` on a thread inside this namespace.
    pub fn spawn<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<T> {
        let file = File::open(self.path()).expect("open netns");
        std::thread::spawn(move || {
            setns(&file, CloneFlags::CLONE_NEWNET).expect("setns");
            work()
        })
    }

    /// Binds a TCP listener inside this namespace.
    pub fn listen(&self, addr: &str) -> TcpListener {
        let addr: SocketAddr = addr.parse().expect("listen address");
        self.spawn(move || TcpListener::bind(addr))
            .join()
            .expect("listener thread")
            .expect("bind")
    }

    /// Connects from inside this namespace; returns whether the connect succeeded.
    pub fn connect(&self, addr: &str) -> bool {
        let addr: SocketAddr = addr.parse().expect("connect address");
        self.spawn(move || TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok())
            .join()
            .expect("thread")
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// A fake host for the ambient data plane: its netns entered through a fixture /proc whose pid 1
/// links to it (`1/ns/net`), plus a kubelet process (UID 4242) for the nftables rule.
pub struct FakeHost {
    pub netns: Netns,
    pub proc: tempfile::TempDir,
    /// Whether [`FakeHost::settings`] turns on DNS capture.
    pub redirect_dns: bool,
}

impl FakeHost {
    pub fn new(tag: &str) -> FakeHost {
        let netns = Netns::new(tag);
        let proc = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(proc.path().join("1/ns")).unwrap();
        std::os::unix::fs::symlink(netns.path(), proc.path().join("1/ns/net")).unwrap();
        let kubelet = proc.path().join("500");
        std::fs::create_dir_all(&kubelet).unwrap();
        std::fs::write(kubelet.join("comm"), "kubelet\n").unwrap();
        std::fs::write(kubelet.join("cmdline"), "/usr/bin/kubelet\0--v=2\0").unwrap();
        std::fs::write(kubelet.join("status"), "Uid:\t4242\t4242\t4242\t4242\n").unwrap();
        FakeHost {
            netns,
            proc,
            redirect_dns: false,
        }
    }

    /// Data-plane settings that reach this host through its /proc.
    pub fn settings(&self, nft: bool, ipv6: bool) -> DataplaneSettings {
        DataplaneSettings {
            ambient: AmbientConfig {
                redirect_dns: self.redirect_dns,
                enable_ipv6: ipv6,
                ..AmbientConfig::default()
            },
            native_nftables: nft,
            host_prefix: "/".into(),
            host_proc: self.proc.path().to_path_buf(),
            allow_switch_to_host_ns: true,
            ..DataplaneSettings::default()
        }
    }
}

/// The tools the ambient data plane runs (or is checked against).
pub fn require_dataplane_tools() {
    require_tool("iptables-restore", "iptables");
    require_tool("nft", "nftables");
    require_tool("ipset", "ipset");
}

/// iptables-nft-restore (the oracle of the netlink conformance tests) applies `rules` in `ns`,
/// family by family; Err with what it said when it refuses.
pub fn restore_iptables_nft(ns: &Netns, rules: &istio_cni::rules::RuleSet) -> Result<(), String> {
    for (tool, family_rules) in [
        ("iptables-nft-restore", &rules.v4),
        ("ip6tables-nft-restore", &rules.v6),
    ] {
        if family_rules.is_empty() {
            continue;
        }
        let text = istio_cni::rules::iptables::render_restore(family_rules);
        let mut child = std::process::Command::new("ip")
            .args(["netns", "exec", &ns.name, tool, "--noflush"])
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("restore");
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), text.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).to_string());
        }
    }
    Ok(())
}

/// A "pod" and a "server" namespace joined by a veth pair on a private /24 that only they use.
pub struct PodAndServer {
    pub pod: Netns,
    pub server: Netns,
    pub pod_ip: String,
    pub server_ip: String,
}

impl PodAndServer {
    pub fn new(tag: &str) -> PodAndServer {
        let pod = Netns::new(&format!("{tag}p"));
        let server = Netns::new(&format!("{tag}s"));
        let subnet = 200 + (COUNTER.fetch_add(1, Ordering::SeqCst) % 50);
        let pod_ip = format!("10.253.{subnet}.2");
        let server_ip = format!("10.253.{subnet}.1");
        let veth_pod = format!("vp{}", COUNTER.fetch_add(1, Ordering::SeqCst));
        let veth_srv = format!("vs{}", COUNTER.fetch_add(1, Ordering::SeqCst));
        wire_veth(
            |program, args| {
                pod.exec(program, args);
            },
            &server,
            (&veth_pod, &veth_srv),
            (&pod_ip, &server_ip),
        );
        PodAndServer {
            pod,
            server,
            pod_ip,
            server_ip,
        }
    }
}

/// A connection from the pod to the server lands on a 15001 listener in the pod, with the dialed
/// address as its original destination.
pub fn assert_outbound_redirected(env: &PodAndServer) {
    let proxy = env.pod.listen("0.0.0.0:15001");
    let target = format!("{}:8080", env.server_ip);
    assert!(
        env.pod.connect(&target),
        "outbound connect to {target} was not accepted by anything"
    );
    let orig =
        accept_within(&proxy, Duration::from_secs(2)).expect("no connection on the 15001 listener");
    assert_eq!(
        orig.to_string(),
        target,
        "SO_ORIGINAL_DST must be the address the app dialed"
    );
}

/// Joins a pod netns to `server` by a veth pair: `inner` with `pod_ip/24` on the pod side (set up
/// through `pod_exec`, which runs a command inside the pod netns however that is entered), `outer`
/// with `server_ip/24` in `server`; both ends up.
pub fn wire_veth(
    pod_exec: impl Fn(&str, &[&str]),
    server: &Netns,
    (inner, outer): (&str, &str),
    (pod_ip, server_ip): (&str, &str),
) {
    pod_exec(
        "ip",
        &["link", "add", inner, "type", "veth", "peer", "name", outer],
    );
    pod_exec("ip", &["link", "set", outer, "netns", &server.name]);
    pod_exec(
        "ip",
        &["addr", "add", &format!("{pod_ip}/24"), "dev", inner],
    );
    pod_exec("ip", &["link", "set", inner, "up"]);
    server.exec(
        "ip",
        &["addr", "add", &format!("{server_ip}/24"), "dev", outer],
    );
    server.exec("ip", &["link", "set", outer, "up"]);
}

/// Accepts one connection within `timeout`; returns the peer's original destination (for
/// redirected connections) or the local address.
pub fn accept_within(listener: &TcpListener, timeout: Duration) -> Option<SocketAddr> {
    listener.set_nonblocking(true).ok()?;
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        match listener.accept() {
            Ok((stream, _)) => {
                let orig =
                    nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::OriginalDst)
                        .ok();
                return Some(match orig {
                    Some(sa) => SocketAddr::from((
                        std::net::Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr)),
                        u16::from_be(sa.sin_port),
                    )),
                    None => stream.local_addr().ok()?,
                });
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    None
}

/// The binary under test, invoked under a role name.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_istio-cni-rs")
}

/// The injector's istio-init arguments (`INJECTOR_DEFAULT_ARGS`) without the flags in `without`
/// (each with its value), followed by `extra`: one source for the argument lists of the tests.
pub fn injector_args(without: &[&str], extra: &[&'static str]) -> Vec<&'static str> {
    let defaults = istio_cni::iptables_cmd::INJECTOR_DEFAULT_ARGS;
    // Every default is a flag followed by its value.
    let mut args: Vec<&'static str> = defaults
        .chunks(2)
        .filter(|pair| !without.contains(&pair[0]))
        .flatten()
        .copied()
        .collect();
    args.extend_from_slice(extra);
    args
}
