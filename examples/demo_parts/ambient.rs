//! The demo's ambient part: a pod in a namespace labelled `istio.io/dataplane-mode=ambient` ADDed
//! through the real chain, held until the ztunnel-like ZDS peer (`istio_cni_testing::zds_peer`, also
//! runnable on its own: `cargo run -p istio-cni-testing --bin zds-peer`) acked; its outbound connection lands on
//! the peer's listener inside the pod netns; relabelling the namespace `none` removes it.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::cni_driver::{Attachment, Chain};
use crate::{GATEWAY, Netns, wait_until};
use istio_cni_testing::zds_peer::{Seen, ZdsPeer};

pub const NAMESPACE: &str = "reviews-ns";
pub const POD: &str = "reviews";
pub const UID: &str = "5c1f1c9e-0d3e-4a6b-9c1f-00000000d003";
/// install-cni's health port in the demo's node netns (where `install-cni status` asks).
pub const HEALTH_PORT: u16 = 8000;

/// The fixtures the ambient part adds: its namespace (ambient) and pod (no sidecar).
pub fn fixtures() -> [Value; 2] {
    [
        json!({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": NAMESPACE, "labels": {"istio.io/dataplane-mode": "ambient"}}}),
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": POD, "namespace": NAMESPACE, "uid": UID},
               "spec": {"nodeName": "demo-node", "containers": [{"name": "reviews"}]}}),
    ]
}

/// install-cni's ambient settings (the chart sets the same).
pub fn env(zds_socket: &Path, host_proc: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("AMBIENT_ENABLED", "true".into()),
        (
            "AMBIENT_ENABLEMENT_SELECTOR",
            r#"[{"podSelector":{"matchLabels":{"istio.io/dataplane-mode":"ambient"}}},{"podSelector":{"matchExpressions":[{"key":"istio.io/dataplane-mode","operator":"NotIn","values":["none"]}]},"namespaceSelector":{"matchLabels":{"istio.io/dataplane-mode":"ambient"}}}]"#.into(),
        ),
        ("ZTUNNEL_UDS_ADDRESS", zds_socket.display().to_string()),
        // The node's processes are this machine's (the agent finds pod netns through them), seen
        // through a procfs whose pid 1 is in the node's netns.
        ("HOST_PROC_DIR", host_proc.display().to_string()),
    ]
}

/// POSTs objects to the test API server's control endpoint (`test-apiserver --help`).
pub fn post_objects(kubeconfig: &Path, objects: &Value) -> Result<(), String> {
    let body = objects.to_string().into_bytes();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let kc = kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| e.to_string())?;
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .map_err(|e| e.to_string())?;
        let client = kube::Client::try_from(config).map_err(|e| e.to_string())?;
        let request = hyper::Request::post("/testserver/objects")
            .header("content-type", "application/json")
            .body(body)
            .map_err(|e| e.to_string())?;
        client
            .request_text(request)
            .await
            .map(|_| ())
            .map_err(|e| format!("POST /testserver/objects: {e}"))
    })
}

/// Runs `install-cni status` in the node netns, as an operator would in the DaemonSet pod.
fn show_status(node: &Netns, binary: &str) -> Result<(), String> {
    let out = node
        .spawn(
            binary,
            &["install-cni", "status"],
            &[("HEALTH_PORT", HEALTH_PORT.to_string())],
            std::process::Stdio::piped(),
            std::process::Stdio::piped(),
        )?
        .wait_with_output()
        .map_err(|e| format!("install-cni status: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !text.contains(POD) {
        return Err(format!(
            "install-cni status did not list {NAMESPACE}/{POD}: {}{text}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    println!("   `install-cni status` on the node:");
    for line in text.lines() {
        println!("     {line}");
    }
    Ok(())
}

fn connect(pod: &Netns, to: SocketAddr) -> Result<bool, String> {
    pod.run(move || TcpStream::connect_timeout(&to, Duration::from_secs(1)).is_ok())
}

/// The ambient part, once install-cni (with [`env`]) merged its entry and the peer is connected.
pub fn run(
    node: &Netns,
    merged: &Value,
    bin: &Path,
    binary: &str,
    peer: &ZdsPeer,
    kubeconfig: &Path,
) -> Result<(), String> {
    println!("== ambient: namespace {NAMESPACE} is labelled istio.io/dataplane-mode=ambient");
    let pod = Netns::new(POD)?;
    let netns = pod.path();
    let args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={NAMESPACE};K8S_POD_NAME={POD}");
    let chain = Chain {
        conflist: merged.clone(),
        cni_path: vec![bin.to_path_buf(), PathBuf::from("/usr/lib/cni")],
    };
    // ADD is answered only once ztunnel (the peer) acked the pod: hold the ack to show it.
    peer.hold_acks();
    let add = {
        let (netns, args) = (netns.clone(), args.clone());
        let node_path = node.path();
        std::thread::spawn(move || -> Result<Value, String> {
            let file = std::fs::File::open(node_path).map_err(|e| e.to_string())?;
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| e.to_string())?;
            chain.add(&Attachment {
                container_id: "demo-reviews",
                netns: &netns,
                ifname: "eth0",
                args: &args,
            })
        })
    };
    wait_until("the peer to get the pod", Duration::from_secs(10), || {
        peer.all_requests().iter().any(|(_, r)| r.is_add_of(UID)) || add.is_finished()
    })?;
    std::thread::sleep(Duration::from_millis(500));
    if add.is_finished() {
        return Err(format!(
            "ADD returned before the peer acked: {:?}",
            add.join()
        ));
    }
    println!(
        "   CNI ADD for {NAMESPACE}/{POD}: the agent sent ztunnel the pod (uid {UID}) with its netns; ADD still waiting after 0.5 s of no ack"
    );
    peer.release_acks();
    let result = add.join().map_err(|_| "ADD thread panicked")??;
    let ip = result["ips"][0]["address"].as_str().unwrap_or("?");
    println!("   the peer acked: ADD returned, pod IP {ip}");
    show_status(node, binary)?;
    let target: SocketAddr = format!("{GATEWAY}:9080")
        .parse()
        .map_err(|e| format!("{e}"))?;
    let connected = connect(&pod, target)?;
    wait_until(
        "the peer's listener to accept",
        Duration::from_secs(5),
        || peer.accepted(UID) == Some(1),
    )
    .map_err(|e| format!("{e} (connected: {connected})"))?;
    println!(
        "   the app dialed {target}: it landed on the peer's :15001 listener inside the pod netns"
    );

    // Relabelled `none`: the agent takes the pod out of ambient again.
    let relabelled = json!([{"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": NAMESPACE, "labels": {"istio.io/dataplane-mode": "none"}}}]);
    // The API server listens inside the node netns.
    let kubeconfig = kubeconfig.to_path_buf();
    node.run(move || post_objects(&kubeconfig, &relabelled))??;
    wait_until(
        "the peer to get the pod's removal",
        Duration::from_secs(10),
        || {
            peer.all_requests()
                .iter()
                .any(|(_, r)| *r == Seen::Del { uid: UID.into() })
        },
    )?;
    let pod_name = pod.0.clone();
    let has_rules = move || {
        ["iptables-save", "iptables-legacy-save", "iptables-nft-save"]
            .iter()
            .any(|save| {
                std::process::Command::new("ip")
                    .args(["netns", "exec", &pod_name, save])
                    .output()
                    .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("ISTIO"))
            })
    };
    wait_until("the in-pod rules to go", Duration::from_secs(10), || {
        !has_rules()
    })?;
    println!(
        "== namespace {NAMESPACE} relabelled istio.io/dataplane-mode=none: the agent told ztunnel to \
         remove the pod and took its in-pod rules out"
    );
    if peer.accepted(UID).is_some_and(|n| n > 1) {
        return Err("the pod's traffic still reached the peer after the relabel".into());
    }
    Ok(())
}
