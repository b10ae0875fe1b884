//! Pods with user namespaces (`hostUsers: false`): the pod netns is owned by a child user
//! namespace, and the kernel refuses `-m owner` rules written from any other user namespace. The
//! plugin (netlink fast path, iptables-restore, nftables) and `istio-iptables --cni-mode` must
//! program such a netns, and the rules must work: app traffic is redirected, the pod's uid 1337
//! is not.

mod support;

use std::fs::File;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use nix::sched::{CloneFlags, setns};
use serde_json::{Value, json};
use support::cni_driver::*;

use istio_cni::iptables_cmd::INJECTOR_DEFAULT_ARGS as INIT_ARGS;

/// How the pod's user and network namespaces come to be.
#[derive(Clone, Copy, Debug)]
enum Creation {
    /// `unshare --user --net` at once, the map written afterwards (the netns predates the map).
    Together,
    /// The user namespace and its map first, the netns inside it afterwards (as runtimes do).
    NetnsAfterMap,
}

/// A netns owned by a child user namespace with the given uid/gid map, held by `sleep`
/// processes; they are killed on drop (also when the test fails). No mounts are made: the netns
/// is referenced as `/proc/<pid>/ns/net`.
struct UsernsPod {
    holders: Vec<Child>,
    pid: u32,
    /// Set by [`UsernsPod::attach`]: the `ip netns` name bound to this netns.
    attached: Option<String>,
}

impl UsernsPod {
    fn new(creation: Creation, map: &str) -> UsernsPod {
        require_root();
        require_tool("unshare", "util-linux");
        require_tool("nsenter", "util-linux");
        let spawn = |cmd: &mut Command| {
            cmd.stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .expect("start a namespace holder")
        };
        let write_map = |pid: u32| {
            for file in ["uid_map", "gid_map"] {
                std::fs::write(format!("/proc/{pid}/{file}"), map)
                    .unwrap_or_else(|e| panic!("write {file} of {pid}: {e}"));
            }
        };
        let mut pod = UsernsPod {
            holders: vec![],
            pid: 0,
            attached: None,
        };
        match creation {
            Creation::Together => {
                let child =
                    spawn(Command::new("unshare").args(["--user", "--net", "sleep", "600"]));
                pod.pid = child.id();
                pod.holders.push(child);
                wait_for_userns(pod.pid);
                write_map(pod.pid);
            }
            Creation::NetnsAfterMap => {
                let owner = spawn(Command::new("unshare").args(["--user", "sleep", "600"]));
                let owner_pid = owner.id();
                pod.holders.push(owner);
                wait_for_userns(owner_pid);
                write_map(owner_pid);
                let child = spawn(
                    Command::new("nsenter")
                        .arg(format!("--user=/proc/{owner_pid}/ns/user"))
                        .args(["unshare", "--net", "sleep", "600"]),
                );
                pod.pid = child.id();
                pod.holders.push(child);
                wait_until(|| {
                    std::fs::read_link(format!("/proc/{}/ns/net", pod.pid)).ok()
                        != std::fs::read_link("/proc/self/ns/net").ok()
                        && std::fs::read_to_string(format!("/proc/{}/comm", pod.pid))
                            .is_ok_and(|c| c.trim() == "sleep")
                });
            }
        }
        pod.net_exec("ip", &["link", "set", "lo", "up"]);
        pod
    }

    fn netns(&self) -> String {
        format!("/proc/{}/ns/net", self.pid)
    }

    /// Binds the netns to `/var/run/netns/<name>` (as runtimes hand it to CNI); removed on drop.
    fn attach(&mut self) -> String {
        let name = unique("icus-");
        run_checked("ip", &["netns", "attach", &name, &self.pid.to_string()]);
        self.attached = Some(name.clone());
        format!("/var/run/netns/{name}")
    }

    /// Runs a command in the pod netns only (host user namespace), checked.
    fn net_exec(&self, program: &str, args: &[&str]) -> Output {
        let mut command = vec![program];
        command.extend_from_slice(args);
        let out = self.net_exec_unchecked(&command);
        assert!(
            out.status.success(),
            "{command:?} in the pod netns failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// Runs a command in the pod netns only (host user namespace), whatever its exit code.
    fn net_exec_unchecked(&self, command: &[&str]) -> Output {
        Command::new("nsenter")
            .arg(format!("--net={}", self.netns()))
            .args(command)
            .output()
            .expect("run nsenter")
    }

    /// Runs a command inside the pod's user namespace and netns, as Istio's `nsenter` does.
    fn pod_exec(&self, program: &str, args: &[&str]) -> Output {
        Command::new("nsenter")
            .arg(format!("--user=/proc/{}/ns/user", self.pid))
            .arg(format!("--net={}", self.netns()))
            .arg(program)
            .args(args)
            .output()
            .expect("run nsenter")
    }

    /// `iptables-save` (nft and legacy) of the pod netns, without comments. Read from the host
    /// user namespace: listing needs no `-m owner` check, and legacy's procfs files may be owned
    /// by host root (a netns created before its user namespace had a map).
    fn rules(&self) -> String {
        let mut all = String::new();
        for tool in ["iptables-nft-save", "iptables-legacy-save"] {
            all.push_str(&String::from_utf8_lossy(&self.net_exec(tool, &[]).stdout));
        }
        without_comments(&all)
    }

    fn nft_ruleset(&self) -> String {
        String::from_utf8_lossy(&self.net_exec("nft", &["list", "ruleset"]).stdout).into_owned()
    }

    /// A veth pair: `10.9.<n>.2/24` in the pod, `10.9.<n>.1/24` in a plain `server` netns.
    fn connect_server(&self, server: &support::Netns, n: u8) -> (String, String) {
        let (pod_ip, server_ip) = (format!("10.9.{n}.2"), format!("10.9.{n}.1"));
        let (inner, outer) = (format!("up{n}"), format!("us{n}"));
        support::wire_veth(
            |program, args| {
                self.net_exec(program, args);
            },
            server,
            (&inner, &outer),
            (&pod_ip, &server_ip),
        );
        (pod_ip, server_ip)
    }

    /// Runs `work` on a thread inside the pod netns (the host user namespace is enough for
    /// sockets).
    fn in_netns<T: Send + 'static>(&self, work: impl FnOnce() -> T + Send + 'static) -> T {
        let file = File::open(self.netns()).expect("open pod netns");
        std::thread::spawn(move || {
            setns(&file, CloneFlags::CLONE_NEWNET).expect("setns");
            work()
        })
        .join()
        .expect("netns thread")
    }
}

impl Drop for UsernsPod {
    fn drop(&mut self) {
        if let Some(name) = &self.attached {
            let _ = Command::new("ip").args(["netns", "del", name]).output();
        }
        for child in self.holders.iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn wait_until(mut ready: impl FnMut() -> bool) {
    for _ in 0..200 {
        if ready() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("namespace holder did not come up");
}

/// Until `unshare` has created the user namespace (it then execs sleep).
fn wait_for_userns(pid: u32) {
    wait_until(|| {
        std::fs::read_link(format!("/proc/{pid}/ns/user")).ok()
            != std::fs::read_link("/proc/self/ns/user").ok()
            && std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "sleep")
    });
}

fn without_comments(save: &str) -> String {
    save.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split(" [").next().unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
}

const MAP: &str = "0 100000 65536";

fn conf(run_dir: &std::path::Path) -> Value {
    json!({
        "cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "istio-cni",
        "cni_agent_run_dir": run_dir.display().to_string(),
        "plugin_log_level": "debug",
        "prevResult": {"cniVersion": "1.0.0", "ips": [{"address": "10.31.0.2/24"}], "dns": {}}
    })
}

/// A fake API server with one sidecar pod, and its run dir.
fn api_with_pod(name: &str) -> (FakeApiServer, tempfile::TempDir) {
    require_tool("iptables-restore", "iptables");
    let (api, dir) = api_with_sidecar_pod("ns1", name);
    (api, dir)
}

fn add(netns: &str, pod: &str, conf: &Value, extra_env: &[(&'static str, &str)]) -> Run {
    let mut env = cni_env("ADD", netns, "ns1", pod);
    env.extend(extra_env.iter().map(|(k, v)| (*k, v.to_string())));
    run_plugin(&env, &conf.to_string())
}

/// The rules an ordinary netns gets for the same pod: the reference to compare with.
fn reference_rules(conf: &Value) -> String {
    let plain = NetnsGuard::new("usref");
    let run = add(&plain.path().display().to_string(), "app", conf, &[]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    without_comments(&plain.iptables_save())
}

#[test]
fn plugin_programs_a_user_namespaced_pod_over_netlink_and_restore() {
    let (_api, dir) = api_with_pod("app");
    let conf = conf(dir.path());
    let expected = reference_rules(&conf);
    assert!(expected.contains("-m owner --uid-owner 1337 -j RETURN"));

    for creation in [Creation::Together, Creation::NetnsAfterMap] {
        // Default path: one nf_tables transaction, sent from inside the pod's user namespace.
        // CNI_NETNS as runtimes pass it: a bind mount under /var/run/netns.
        let mut pod = UsernsPod::new(creation, MAP);
        let netns = pod.attach();
        let first = add(&netns, "app", &conf, &[]);
        assert_eq!(
            first.code, 0,
            "{creation:?}: {}{}",
            first.stdout, first.stderr
        );
        assert!(
            first.stderr.contains("applied over nfnetlink"),
            "{creation:?}: the fresh netns should take the netlink path: {}",
            first.stderr
        );
        assert_eq!(pod.rules(), expected, "{creation:?}");
        // A runtime retry: the state check (iptables-save, iptables -C) runs in the pod too.
        let again = add(&netns, "app", &conf, &[]);
        assert_eq!(
            again.code, 0,
            "{creation:?}: {}{}",
            again.stdout, again.stderr
        );
        assert_eq!(
            pod.rules(),
            expected,
            "{creation:?}: a retry changed the rules"
        );

        // The operator's opt-out: iptables-restore, entering the pod's user namespace.
        let pod = UsernsPod::new(creation, MAP);
        let run = add(
            &pod.netns(),
            "app",
            &conf,
            &[("ISTIO_IPTABLES_RESTORE_ONLY", "true")],
        );
        assert_eq!(run.code, 0, "{creation:?}: {}{}", run.stdout, run.stderr);
        assert!(
            !run.stderr.contains("applied over nfnetlink"),
            "{}",
            run.stderr
        );
        assert_eq!(pod.rules(), expected, "{creation:?}");
    }
}

#[test]
fn plugin_programs_a_user_namespaced_pod_with_native_nftables() {
    require_tool("nft", "nftables");
    let (_api, dir) = api_with_pod("app");
    let mut conf = conf(dir.path());
    conf["native_nftables"] = json!(true);
    let pod = UsernsPod::new(Creation::NetnsAfterMap, MAP);
    let run = add(&pod.netns(), "app", &conf, &[]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let ruleset = pod.nft_ruleset();
    assert!(ruleset.contains("meta skuid 1337"), "{ruleset}");
}

/// `istio-iptables` with the injector's arguments (interception `mode`) plus `extra`.
fn istio_iptables_mode(pod: &UsernsPod, mode: &str, extra: &[&str]) -> Output {
    let netns = pod.netns();
    let mut args = vec!["istio-iptables"];
    args.extend(
        INIT_ARGS
            .iter()
            .map(|a| if *a == "REDIRECT" { mode } else { a }),
    );
    args.extend_from_slice(&["--cni-mode", "--network-namespace", &netns]);
    args.extend_from_slice(extra);
    Command::new(support::bin())
        .args(&args)
        .output()
        .expect("run istio-iptables")
}

fn istio_iptables(pod: &UsernsPod, extra: &[&str]) -> Output {
    istio_iptables_mode(pod, "REDIRECT", extra)
}

fn assert_ok(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what}: istio-iptables failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn istio_iptables_cni_mode_programs_a_user_namespaced_netns() {
    require_tool("iptables-legacy-restore", "iptables");
    require_tool("nft", "nftables");
    // Maps with and without uid 0; every one includes the proxy uid 1337.
    for (creation, map) in [
        (Creation::Together, MAP),
        (Creation::NetnsAfterMap, MAP),
        (Creation::Together, "1000 200000 2000"),
    ] {
        for flavour in [
            vec![],
            vec!["--force-iptables-binary", "legacy"],
            vec!["--native-nftables"],
        ] {
            let what = format!("{creation:?} map {map:?} flags {flavour:?}");
            let pod = UsernsPod::new(creation, map);
            pod.net_exec("ip", &["addr", "add", "10.9.9.2/32", "dev", "lo"]);
            assert_ok(&istio_iptables(&pod, &flavour), &what);
            let programmed = pod.rules() + &pod.nft_ruleset();
            assert!(
                programmed.contains("--uid-owner 1337") || programmed.contains("skuid 1337"),
                "{what}:\n{programmed}"
            );
            // Re-run (state check inside the pod), then clean up completely.
            assert_ok(&istio_iptables(&pod, &flavour), &what);
            let mut cleanup = flavour.clone();
            cleanup.push("--cleanup-only");
            assert_ok(&istio_iptables(&pod, &cleanup), &what);
            let after = pod.rules() + &pod.nft_ruleset();
            assert!(
                !after.to_lowercase().contains("istio"),
                "{what}: left behind:\n{after}"
            );
        }
    }
}

#[test]
fn istio_iptables_run_in_the_netns_from_the_host_user_namespace() {
    // Without --cni-mode the netns we run in is the target; here it is owned by the pod's user
    // namespace while we are not in it (e.g. `nsenter --net` from the node).
    let pod = UsernsPod::new(Creation::NetnsAfterMap, MAP);
    pod.net_exec("ip", &["addr", "add", "10.9.9.2/32", "dev", "lo"]);
    let bin = support::bin();
    let mut args = vec![bin, "istio-iptables"];
    args.extend_from_slice(INIT_ARGS);
    let out = pod.net_exec_unchecked(&args);
    assert_ok(&out, "istio-iptables under nsenter --net");
    assert!(pod.rules().contains("-m owner --uid-owner 1337 -j RETURN"));
}

#[test]
fn tproxy_routes_are_set_in_a_user_namespaced_netns() {
    let pod = UsernsPod::new(Creation::NetnsAfterMap, MAP);
    pod.net_exec("ip", &["addr", "add", "10.9.9.2/32", "dev", "lo"]);
    assert_ok(&istio_iptables_mode(&pod, "TPROXY", &[]), "TPROXY");
    let rules = String::from_utf8_lossy(&pod.net_exec("ip", &["rule"]).stdout).into_owned();
    assert_eq!(rules.matches("lookup 133").count(), 1, "{rules}");
    let routes = pod.net_exec("ip", &["route", "show", "table", "133"]);
    let routes = String::from_utf8_lossy(&routes.stdout);
    assert!(routes.contains("local default dev lo"), "{routes}");
    assert!(pod.rules().contains("TPROXY"));
}

#[test]
fn dual_stack_rules_and_loopback_address_in_a_user_namespaced_netns() {
    require_tool("ip6tables-nft-save", "iptables");
    let pod = UsernsPod::new(Creation::Together, MAP);
    pod.net_exec("ip", &["addr", "add", "10.9.9.2/32", "dev", "lo"]);
    pod.net_exec("ip", &["addr", "add", "fd09::2/128", "dev", "lo", "nodad"]);
    assert_ok(&istio_iptables(&pod, &["--dual-stack"]), "dual stack");
    let v6 = String::from_utf8_lossy(&pod.net_exec("ip6tables-nft-save", &[]).stdout).into_owned()
        + &String::from_utf8_lossy(&pod.net_exec("ip6tables-legacy-save", &[]).stdout);
    assert!(v6.contains("-m owner --uid-owner 1337 -j RETURN"), "{v6}");
    let lo = pod.net_exec("ip", &["-6", "addr", "show", "dev", "lo"]);
    assert!(String::from_utf8_lossy(&lo.stdout).contains("::6/128"));
}

/// Connects from inside the pod as uid `uid` of the pod's user namespace (`None`: as this test
/// process, which is no uid there); returns whether the connect succeeded.
fn connect_from_pod(pod: &UsernsPod, target: &str, uid: Option<&str>) -> bool {
    match uid {
        None => {
            let addr: SocketAddr = target.parse().unwrap();
            pod.in_netns(move || TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok())
        }
        Some(uid) => {
            let (host, port) = target.split_once(':').unwrap();
            let script = format!("exec 3<>/dev/tcp/{host}/{port}");
            let out = pod.pod_exec(
                "setpriv",
                &[
                    &format!("--reuid={uid}"),
                    &format!("--regid={uid}"),
                    "--clear-groups",
                    "bash",
                    "-c",
                    &script,
                ],
            );
            out.status.success()
        }
    }
}

#[test]
fn app_traffic_is_redirected_and_the_pods_proxy_uid_is_not() {
    require_tool("setpriv", "util-linux");
    let server = support::Netns::new("uss");
    let pod = UsernsPod::new(Creation::NetnsAfterMap, MAP);
    let (_pod_ip, server_ip) = pod.connect_server(&server, 77);
    let (_api, dir) = api_with_pod("app");
    let run = add(&pod.netns(), "app", &conf(dir.path()), &[]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);

    let proxy: TcpListener = pod
        .in_netns(|| TcpListener::bind("0.0.0.0:15001"))
        .expect("bind 15001 in the pod");
    let real = server.listen(&format!("{server_ip}:8080"));
    let target = format!("{server_ip}:8080");

    // The app: lands on the proxy, which sees the dialed address as the original destination.
    assert!(connect_from_pod(&pod, &target, None), "app connect failed");
    let orig = support::accept_within(&proxy, Duration::from_secs(2))
        .expect("the app's connection did not reach the 15001 listener");
    assert_eq!(orig.to_string(), target);
    assert!(support::accept_within(&real, Duration::from_millis(100)).is_none());

    // The proxy (uid 1337 inside the pod's user namespace) goes straight to the server.
    assert!(
        connect_from_pod(&pod, &target, Some("1337")),
        "proxy connect failed"
    );
    assert!(
        support::accept_within(&real, Duration::from_secs(2)).is_some(),
        "the server did not get the proxy's connection"
    );
    assert!(
        support::accept_within(&proxy, Duration::from_millis(200)).is_none(),
        "the proxy's own traffic was redirected"
    );
}

/// Cost of the user-namespace entry, by hand:
/// `cargo test --test netns_userns -- --ignored --nocapture`. Prints the median time of
/// opening the netns and applying the default sidecar rules (what the plugin does after its API
/// lookup), in fresh namespaces: ordinary vs user-namespaced, netlink vs iptables-restore.
#[test]
#[ignore]
fn bench_user_namespace_entry() {
    use istio_cni::apply::{SidecarOptions, apply_sidecar_here};
    use std::time::Instant;
    const ROUNDS: usize = 30;
    let rules = istio_cni::rules::capture::build(&Default::default());
    let time_apply = |netns: &str, restore_only: bool| {
        let rules = rules.clone();
        let start = Instant::now();
        let ns = istio_cni::netns::Netns::open(std::path::Path::new(netns)).expect("open");
        let opts = SidecarOptions {
            restore_only,
            userns: ns.userns_entry().cloned(),
            ..Default::default()
        };
        ns.run(move || apply_sidecar_here(&rules, &opts, None))
            .expect("netns")
            .expect("apply");
        start.elapsed()
    };
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2].as_secs_f64() * 1000.0
    };
    // The entry alone: fork, setns into the user namespace and the netns, exit.
    let pod = UsernsPod::new(Creation::NetnsAfterMap, MAP);
    let ns = istio_cni::netns::Netns::open(std::path::Path::new(&pod.netns())).expect("open");
    let entry = ns.userns_entry().expect("a user-namespaced netns").clone();
    let entering: Vec<Duration> = (0..ROUNDS)
        .map(|_| {
            let start = Instant::now();
            // SAFETY: the work makes no call at all.
            unsafe { entry.run_forked(|| 0) }.expect("forked child");
            start.elapsed()
        })
        .collect();
    println!("fork + enter alone: {:.2} ms", median(entering));
    // All namespaces exist before and after the timed part: tearing one down makes the kernel
    // busy in the background and would skew whatever is timed next.
    for restore_only in [false, true] {
        let plain: Vec<NetnsGuard> = (0..ROUNDS).map(|_| NetnsGuard::new("usb")).collect();
        let pods: Vec<UsernsPod> = (0..ROUNDS)
            .map(|_| UsernsPod::new(Creation::NetnsAfterMap, MAP))
            .collect();
        let plain_times = plain
            .iter()
            .map(|ns| time_apply(&ns.path().display().to_string(), restore_only))
            .collect();
        let pod_times = pods
            .iter()
            .map(|pod| time_apply(&pod.netns(), restore_only))
            .collect();
        let path = if restore_only {
            "iptables-restore"
        } else {
            "netlink"
        };
        println!(
            "{path}: ordinary netns {:.2} ms, user-namespaced {:.2} ms (median of {ROUNDS})",
            median(plain_times),
            median(pod_times)
        );
    }
}
