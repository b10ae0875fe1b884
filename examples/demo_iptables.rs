//! The demo: create a "pod" and a "server" network namespace joined by a veth pair, apply Istio's
//! sidecar capture rules in the pod with our `istio-iptables` (the exact flags Istio's injector
//! uses), then show an application connection being captured by the sidecar port with its original
//! destination intact. Everything is removed at the end. Run as root: `scripts/demo`.

use std::fs::File;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sched::{CloneFlags, setns};
use nix::sys::socket::{getsockopt, sockopt};

#[path = "support/mod.rs"]
mod support;

const POD: &str = "istio-demo-pod";
const SERVER: &str = "istio-demo-server";
const POD_IP: &str = "10.254.77.2";
const SERVER_IP: &str = "10.254.77.1";

fn ip(args: &[&str]) -> Result<(), String> {
    support::run("ip", args)
}

fn in_netns<T: Send + 'static>(ns: &str, work: impl FnOnce() -> T + Send + 'static) -> T {
    let file = File::open(format!("/var/run/netns/{ns}")).expect("open netns");
    std::thread::spawn(move || {
        setns(&file, CloneFlags::CLONE_NEWNET).expect("setns");
        work()
    })
    .join()
    .expect("netns thread")
}

struct Cleanup;
impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", POD]);
        let _ = ip(&["netns", "del", SERVER]);
    }
}

fn main() -> Result<(), String> {
    let binary = std::env::args()
        .nth(1)
        .ok_or("usage: demo <path to istio-cni-rs>")?;
    drop(Cleanup); // leftovers of an interrupted run
    let _cleanup = Cleanup;
    for ns in [POD, SERVER] {
        ip(&["netns", "add", ns])?;
        ip(&["-n", ns, "link", "set", "lo", "up"])?;
    }
    ip(&[
        "-n", POD, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", SERVER,
    ])?;
    ip(&[
        "-n",
        POD,
        "addr",
        "add",
        &format!("{POD_IP}/24"),
        "dev",
        "eth0",
    ])?;
    ip(&[
        "-n",
        SERVER,
        "addr",
        "add",
        &format!("{SERVER_IP}/24"),
        "dev",
        "eth0",
    ])?;
    ip(&["-n", POD, "link", "set", "eth0", "up"])?;
    ip(&["-n", SERVER, "link", "set", "eth0", "up"])?;
    println!("== created pod netns {POD} ({POD_IP}) and server netns {SERVER} ({SERVER_IP})");

    let mut args = vec!["istio-iptables"];
    args.extend_from_slice(istio_cni::iptables_cmd::INJECTOR_DEFAULT_ARGS);
    println!(
        "== ip netns exec {POD} istio-iptables {}",
        args[1..].join(" ")
    );
    let started = Instant::now();
    let out = Command::new("ip")
        .args(["netns", "exec", POD, &binary])
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {binary}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "istio-iptables failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    println!("   applied in {:?}", started.elapsed());

    // The "sidecar": a listener on 15001 inside the pod.
    let proxy = in_netns(POD, || TcpListener::bind("0.0.0.0:15001")).map_err(|e| e.to_string())?;
    proxy.set_nonblocking(true).map_err(|e| e.to_string())?;
    // The "application": dials the server; nothing listens there, the rules send it to 15001.
    let target: SocketAddr = format!("{SERVER_IP}:80")
        .parse()
        .map_err(|e| format!("{e}"))?;
    let connected = in_netns(POD, move || {
        TcpStream::connect_timeout(&target, Duration::from_secs(2)).is_ok()
    });
    println!("== the app in the pod dialed {target}: connected = {connected}");
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut landed = None;
    while landed.is_none() && Instant::now() < deadline {
        if let Ok((stream, peer)) = proxy.accept() {
            let orig = getsockopt(&stream, sockopt::OriginalDst).map_err(|e| e.to_string())?;
            let orig = SocketAddr::from((
                std::net::Ipv4Addr::from(u32::from_be(orig.sin_addr.s_addr)),
                u16::from_be(orig.sin_port),
            ));
            landed = Some((peer, orig));
        } else {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    match landed {
        Some((peer, orig)) => println!(
            "== the sidecar listener on :15001 accepted it from {peer}; SO_ORIGINAL_DST = {orig} (redirect works)"
        ),
        None => return Err("the connection did not reach the sidecar listener".into()),
    }

    println!("== iptables-save in the pod netns:");
    let save = Command::new("ip")
        .args(["netns", "exec", POD, "iptables-save"])
        .output()
        .map_err(|e| e.to_string())?;
    for line in String::from_utf8_lossy(&save.stdout)
        .lines()
        .filter(|l| !l.starts_with('#'))
    {
        println!("   {line}");
    }
    println!("== done; namespaces removed");
    Ok(())
}
