//! A real CNI chain: Debian's `bridge` (+ `host-local`) and `loopback` plugins followed by ours,
//! run the way libcni runs a conflist, on fresh network namespaces. Then the redirect is proven
//! with real sockets: outbound TCP from the sidecar pod lands on its 15001 listener, inbound TCP
//! from the other pod lands on 15006; a pod without a sidecar is untouched; DEL works twice.
//! Addresses: one 10.2x.y.0/24 per test on a uniquely named bridge with no host address.

mod cni_driver;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use cni_driver::*;
use serde_json::{Value, json};

static SUBNET: AtomicU8 = AtomicU8::new(0);

fn require_chain_tools() {
    require_root();
    require_tool("ip", "iproute2");
    require_tool("iptables-restore", "iptables");
    for plugin in ["bridge", "host-local", "loopback"] {
        assert!(
            Path::new("/usr/lib/cni").join(plugin).is_file(),
            "/usr/lib/cni/{plugin} is required by this test: apt-get install containernetworking-plugins"
        );
    }
}

/// Everything one chain test owns; dropped in reverse: namespaces, bridge, temp dirs, API server.
struct World {
    chain: Chain,
    api: FakeApiServer,
    run_dir: tempfile::TempDir,
    _ipam_dir: tempfile::TempDir,
    _bin_dir: tempfile::TempDir,
    _bridge: LinkGuard,
}

fn world() -> World {
    require_chain_tools();
    let api = FakeApiServer::start();
    api.put_pod(annotated_pod("ns1", "sidecar-pod", json!({})));
    api.put_pod(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "plain-pod", "namespace": "ns1"},
        "spec": {"containers": [{"name": "app"}]}
    }));
    let run_dir = tempfile::tempdir().unwrap();
    api.write_kubeconfig(run_dir.path());
    let ipam_dir = tempfile::tempdir().unwrap();
    let bin_dir = istio_cni_bin_dir();
    let bridge = unique("icb");
    let octet = 1 + SUBNET.fetch_add(1, Ordering::SeqCst);
    let subnet = format!("10.{}.{octet}.0/24", 20 + std::process::id() % 10);
    let conflist = json!({
        "cniVersion": "1.0.0",
        "name": unique("icnet"),
        "plugins": [
            {
                "type": "bridge", "bridge": bridge, "isGateway": false, "ipMasq": false,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]],
                         "dataDir": ipam_dir.path().display().to_string()}
            },
            {"type": "loopback"},
            {
                "type": "istio-cni", "plugin_log_level": "debug",
                "cni_agent_run_dir": run_dir.path().display().to_string(),
                "exclude_namespaces": ["kube-system"], "pod_namespace": "istio-system",
                "kubernetes": {"kubeconfig": "ignored", "cni_bin_dir": "/opt/cni/bin"}
            }
        ]
    });
    World {
        chain: Chain {
            conflist,
            cni_path: vec![bin_dir.path().to_path_buf(), PathBuf::from("/usr/lib/cni")],
        },
        api,
        run_dir,
        _ipam_dir: ipam_dir,
        _bin_dir: bin_dir,
        _bridge: LinkGuard(bridge),
    }
}

fn args(pod: &str) -> String {
    format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME={pod};K8S_POD_INFRA_CONTAINER_ID=x")
}

fn first_ipv4(result: &Value) -> Ipv4Addr {
    let addr = result["ips"][0]["address"]
        .as_str()
        .expect("an IP in the result");
    addr.split('/').next().unwrap().parse().expect("IPv4")
}

/// Binds a listener inside `netns` (the socket stays in that namespace).
fn listen_in(netns: &Path, port: u16) -> TcpListener {
    istio_cni::netns::Netns::open(netns)
        .and_then(|ns| ns.run(move || TcpListener::bind(("0.0.0.0", port))))
        .expect("enter netns")
        .unwrap_or_else(|e| panic!("bind {port}: {e}"))
}

/// Connects from inside `netns` and sends a line.
fn connect_from(netns: &Path, to: SocketAddr) -> std::io::Result<()> {
    istio_cni::netns::Netns::open(netns)
        .and_then(|ns| {
            ns.run(move || -> std::io::Result<()> {
                let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(3))?;
                s.write_all(b"hello\n")
            })
        })
        .expect("enter netns")
}

/// Accepts one connection within a few seconds and returns what it sent.
fn accept_one(l: &TcpListener) -> Option<String> {
    l.set_nonblocking(true).unwrap();
    for _ in 0..60 {
        if let Ok((mut s, _)) = l.accept() {
            s.set_nonblocking(false).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let mut buf = String::new();
            let _ = s.read_to_string(&mut buf);
            return Some(buf);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

#[test]
fn chain_redirects_sidecar_pod_and_leaves_plain_pod_alone() {
    let w = world();
    let sidecar_ns = NetnsGuard::new("side");
    let plain_ns = NetnsGuard::new("plain");
    let (sidecar_path, plain_path) = (sidecar_ns.path(), plain_ns.path());
    let sidecar_args = args("sidecar-pod");
    let plain_args = args("plain-pod");
    let sidecar = Attachment {
        container_id: "sidecar0",
        netns: &sidecar_path,
        ifname: "eth0",
        args: &sidecar_args,
    };
    let plain = Attachment {
        container_id: "plain0",
        netns: &plain_path,
        ifname: "eth0",
        args: &plain_args,
    };
    let sidecar_result = w.chain.add(&sidecar).expect("ADD sidecar pod");
    let plain_result = w.chain.add(&plain).expect("ADD plain pod");
    // Our plugin passes the bridge's result on.
    assert_eq!(sidecar_result["cniVersion"], "1.0.0");
    assert!(
        sidecar_result["interfaces"]
            .as_array()
            .is_some_and(|i| !i.is_empty())
    );
    let sidecar_ip = first_ipv4(&sidecar_result);
    let plain_ip = first_ipv4(&plain_result);

    let rules = sidecar_ns.iptables_save();
    assert!(
        rules.contains("ISTIO_OUTPUT") && rules.contains("ISTIO_INBOUND"),
        "{rules}"
    );
    assert!(
        !plain_ns.iptables_save().contains("ISTIO"),
        "plain pod was touched"
    );

    // Outbound: the sidecar pod dials the plain pod; the SYN is redirected to its own 15001.
    let outbound = listen_in(&sidecar_path, 15001);
    let app = listen_in(&plain_path, 8080);
    connect_from(&sidecar_path, SocketAddr::from((plain_ip, 8080))).expect("outbound connect");
    assert_eq!(
        accept_one(&outbound).as_deref(),
        Some("hello\n"),
        "not redirected to 15001"
    );
    assert!(
        accept_one_quick(&app).is_none(),
        "reached the real destination uncaptured"
    );

    // Inbound: the plain pod dials the sidecar pod on any port; it lands on 15006.
    let inbound = listen_in(&sidecar_path, 15006);
    connect_from(&plain_path, SocketAddr::from((sidecar_ip, 9090))).expect("inbound connect");
    assert_eq!(
        accept_one(&inbound).as_deref(),
        Some("hello\n"),
        "not redirected to 15006"
    );

    // Excluded inbound ports (15021) reach the real listener.
    let direct = listen_in(&sidecar_path, 15021);
    connect_from(&plain_path, SocketAddr::from((sidecar_ip, 15021))).expect("excluded port");
    assert_eq!(
        accept_one(&direct).as_deref(),
        Some("hello\n"),
        "15021 must not be captured"
    );

    // DEL twice for both pods, in reverse plugin order with the cached result.
    for _ in 0..2 {
        w.chain
            .del(&sidecar, Some(&sidecar_result))
            .expect("DEL sidecar");
        w.chain.del(&plain, Some(&plain_result)).expect("DEL plain");
    }
    drop(w.run_dir);
}

fn accept_one_quick(l: &TcpListener) -> Option<()> {
    l.set_nonblocking(true).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    l.accept().ok().map(|_| ())
}

#[test]
fn del_is_safe_after_the_netns_is_gone() {
    let w = world();
    let path = {
        let ns = NetnsGuard::new("gone");
        let path = ns.path();
        let a = args("sidecar-pod");
        let att = Attachment {
            container_id: "gone0",
            netns: &path,
            ifname: "eth0",
            args: &a,
        };
        w.chain.add(&att).expect("ADD");
        path
    };
    // Only our plugin: the runtime may call DEL after the sandbox netns was removed.
    let plugin = w.chain.conflist["plugins"][2].clone();
    let mut conf = plugin;
    conf["name"] = json!("n");
    conf["cniVersion"] = json!("1.0.0");
    for _ in 0..2 {
        let mut env = cni_env("DEL", &path.display().to_string(), "ns1", "sidecar-pod");
        env.retain(|(k, _)| *k != "CNI_NETNS");
        let run = run_plugin(&env, &conf.to_string());
        assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
        assert!(
            run.stdout.trim().is_empty(),
            "DEL prints nothing: {}",
            run.stdout
        );
        let run = run_plugin(
            &cni_env("DEL", &path.display().to_string(), "ns1", "sidecar-pod"),
            &conf.to_string(),
        );
        assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    }
    let _ = &w.api;
}
