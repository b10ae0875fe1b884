//! The real node on its own: containerd and kubelet register a Ready node with the real control
//! plane; a pod of the workload image starts through Debian's bridge + host-local and answers on
//! its address; deleting it removes its netns and address; dropping the node leaves no process,
//! mount or cgroup behind. Needs root, scripts/build-controlplane, scripts/build-node and podman.

use std::time::Duration;

use istio_cni_testing::controlplane::ControlPlane;
use istio_cni_testing::node::{Node, WORKLOAD_IMAGE};
use serde_json::json;

#[test]
fn a_real_node_runs_a_pod_on_the_bridge_and_cleans_up() {
    assert!(nix::unistd::geteuid().is_root(), "needs root");
    let cp = ControlPlane::start().unwrap_or_else(|e| panic!("control plane: {e}"));
    let node = Node::start(&cp, &[]).unwrap_or_else(|e| panic!("node: {e}"));
    eprintln!("node {} Ready in {:?}", node.name(), node.start_took());
    let (dir, cgroup) = (
        node.dir().to_path_buf(),
        format!("istio-cni-node-{}", std::process::id()),
    );

    cp.create(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "app"}}));
    cp.create(&json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "echo", "namespace": "app"},
        "spec": {"terminationGracePeriodSeconds": 2, "automountServiceAccountToken": false,
            "containers": [{"name": "echo", "image": WORKLOAD_IMAGE, "imagePullPolicy": "Never",
                "args": ["-tcp", "8080", "-http", "8081", "-name", "echo"],
                "readinessProbe": {"httpGet": {"path": "/", "port": 8081}, "periodSeconds": 1}}]}}));
    let t = Duration::from_secs(120);
    let pod = node
        .wait_pod_ready(&cp, "app", "echo", t)
        .unwrap_or_else(|e| panic!("{e}"));
    let ip = pod.status.and_then(|s| s.pod_ip).expect("pod IP");
    assert!(
        ip.starts_with("10.244.237."),
        "{ip} from the node's bridge range"
    );
    let mut answer = String::new();
    let mut s = std::net::TcpStream::connect_timeout(
        &format!("{ip}:8080").parse().expect("addr"),
        Duration::from_secs(5),
    )
    .expect("connect to the pod");
    std::io::Read::read_to_string(&mut s, &mut answer).expect("read");
    assert!(answer.starts_with("name=echo "), "{answer}");

    node.delete_pod(&cp, "app", "echo", t)
        .unwrap_or_else(|e| panic!("{e}"));
    let left: Vec<_> = std::fs::read_dir(node.netns_dir())
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "netns left: {left:?}");

    drop(node);
    assert!(!dir.exists(), "{} removed", dir.display());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !mounts.contains(&*dir.to_string_lossy()),
        "mounts left under {}",
        dir.display()
    );
    assert!(
        !std::path::Path::new("/sys/fs/cgroup/memory")
            .join(&cgroup)
            .exists(),
        "cgroup left"
    );
    let procs = std::process::Command::new("pgrep")
        .args(["-f", &*dir.to_string_lossy()])
        .output();
    let procs = procs
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    assert!(procs.trim().is_empty(), "processes left: {procs}");
}
