//! A ztunnel-like ZDS peer you can run next to install-cni in ambient mode (test-only code in the
//! `istio-cni-testing` crate, never part of the shipped binary; the same peer the tests use,
//! `istio_cni_testing::zds_peer`). It connects to the agent's ZDS socket (and reconnects), acks every
//! request, opens a TCP listener on 15001 inside each pod netns it is handed (each connection gets
//! one line `zds-peer <uid>`), and logs what it got until SIGINT/SIGTERM.
//!
//!     cargo run -p istio-cni-testing --bin zds-peer -- /var/run/ztunnel/ztunnel.sock

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use istio_cni_testing::zds_peer;

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

const USAGE: &str = "usage: zds-peer <ztunnel socket, e.g. /var/run/ztunnel/ztunnel.sock>";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = match args.as_slice() {
        [flag] if flag == "--help" || flag == "-h" => {
            println!("{USAGE}");
            return;
        }
        // Anything else that looks like a flag is not a socket path: say so instead of waiting.
        [path] if !path.starts_with('-') => PathBuf::from(path),
        _ => {
            eprintln!("{USAGE}");
            std::process::exit(2);
        }
    };
    use nix::sys::signal::{SigHandler, Signal, signal};
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic.
        if let Err(e) = unsafe { signal(sig, SigHandler::Handler(on_signal)) } {
            eprintln!("zds-peer: cannot handle {sig}: {e}");
        }
    }
    println!("zds-peer: connecting to {}", path.display());
    let peer = zds_peer::ZdsPeer::start(&path);
    let (mut seen, mut reported, mut connected) = (0, 0, false);
    let mut proxies = Default::default();
    while !STOP.load(Ordering::SeqCst) {
        if peer.connected() != connected {
            connected = peer.connected();
            let state = if connected {
                "connected"
            } else {
                "disconnected"
            };
            println!("zds-peer: {state} (connection {})", peer.connection());
        }
        let requests = peer.all_requests();
        for (conn, request) in &requests[seen.min(requests.len())..] {
            println!("zds-peer: [{conn}] {request:?}");
        }
        seen = requests.len();
        let violations = peer.violations();
        for v in &violations[reported.min(violations.len())..] {
            println!("zds-peer: ztunnel would reject: {v}");
        }
        reported = violations.len();
        let now = peer.workloads();
        if now != proxies {
            println!("zds-peer: listening on 15001 in the netns of {now:?}");
            proxies = now;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("zds-peer: stopping; running proxies {:?}", peer.workloads());
}
