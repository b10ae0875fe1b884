//! The shipped image run the way the chart's DaemonSet runs it: the image built from the
//! Containerfile (scripts/image, around the faster `static-test` profile of the same code; `just
//! image` builds the release one through the same runtime stage), the chart rendered by real Helm
//! with the ambient values on the host network, and podman given the rendered container's command,
//! args, env, volume mounts and securityContext (every capability dropped but the chart's, not
//! privileged, root). Host paths are temp dirs (the netns dir is the machine's, where `ip netns`
//! puts pods), the node's network is a netns of its own, and the API server is the real
//! kube-apiserver, reached on the node's loopback, holding the release's objects as rendered
//! (ServiceAccount, ClusterRoles and bindings, ConfigMap, DaemonSet); the service account (a bound
//! token of the chart's ServiceAccount, the server's CA) is mounted where Kubernetes mounts it and
//! the agent's client is the in-cluster one. It must turn ready, install the plugin, its
//! kubeconfig and the conflist entry; a pod in an ambient namespace ADDed through the real CNI
//! chain on the "host" must be enrolled through the test ZDS peer (its outbound connection lands
//! on the peer's listener in the pod netns) and annotated on the server; every request the pod
//! made must have been allowed by the release's own ClusterRoles; after `helm uninstall` (the
//! server then refuses the pod's token) SIGTERM must clean up.
//!
//! Needs root, podman + runc + mmdebstrap (scripts/deps-image, run by scripts/image), the Helm
//! venv (scripts/deps) and the control plane (scripts/build-controlplane). The image's base is
//! cached in target/image-base after the first run.

mod support;

#[path = "install_support.rs"]
mod install_support;

#[path = "support/ambient_node.rs"]
mod ambient_node;

#[path = "chart_helm/chart.rs"]
mod chart;
#[path = "chart_helm/release.rs"]
mod release;

#[path = "image_daemonset/podman.rs"]
mod podman;

#[path = "image_daemonset/host.rs"]
mod host;

use std::time::{Duration, Instant};

use serde_json::json;

use ambient_node::{PodNs, result_ip};
use chart::Case;
use host::Host;
use install_support::has_istio_entry;

const T: Duration = Duration::from_secs(60);

fn rendered() -> chart::Rendered {
    let case = Case {
        name: "ambient-host-network".into(),
        values: json!({"profile": "ambient", "ambient": {"shareHostNetworkNamespace": true}}),
        lint: false,
    };
    let mut helm = chart::render(&[case]);
    let r = helm
        .cases
        .remove("ambient-host-network")
        .expect("rendered case");
    assert!(r.error.is_none(), "render failed: {:?}", r.error);
    r
}

#[test]
fn the_image_runs_as_the_daemonset_does_and_enrols_an_ambient_pod() {
    support::require_root();
    let r = rendered();
    let spec = &r.pod_spec();
    assert_eq!(
        spec["hostNetwork"], true,
        "the case runs on the host network"
    );
    let c = r.container();
    let sc = &c["securityContext"];
    assert_eq!(sc["privileged"], false);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));

    let built = podman::build();
    eprintln!(
        "image {} built in {:?}, {:.1} MB",
        built.image,
        built.took,
        built.size_bytes as f64 / 1e6
    );
    // The layout the DaemonSet and operators rely on.
    let layout = podman::run_sh(
        &built.image,
        "command -v install-cni; readlink -f /opt/cni/bin/istio-cni; \
         for t in iptables-legacy-restore iptables-nft-restore ip6tables-legacy-restore ipset ip; \
         do command -v $t >/dev/null || echo missing $t; done; \
         command -v nft >/dev/null && echo nft is in the image; install-cni --version",
    );
    assert_eq!(
        layout,
        "/usr/local/bin/install-cni\n/usr/local/bin/install-cni\ninstall-cni (istio-cni-rs) 0.1.0",
        "the image's layout"
    );
    assert!(!layout.contains("missing"), "{layout}");
    assert!(!layout.contains("nft is in the image"), "{layout}");

    let mut host = Host::new(&r);
    let container = host.start_container(&r, &built.image);

    // Ready on the chart's probe, through the node netns.
    let probe = &c["readinessProbe"]["httpGet"];
    let port = probe["port"].as_u64().expect("probe port") as u16;
    let path = probe["path"].as_str().expect("probe path").to_string();
    let deadline = Instant::now() + T;
    while host.get(port, &path).map(|(s, _)| s) != Some(200) {
        let (running, code) = container.state();
        assert!(
            running,
            "the container exited ({code}):\n{}",
            container.logs()
        );
        assert!(
            Instant::now() < deadline,
            "not ready on :{port}{path} within {T:?}:\n{}",
            container.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        host.dirs.bin.join("istio-cni").is_file(),
        "no plugin on the host"
    );
    assert!(
        host.dirs.run.join("istio-cni-kubeconfig").is_file(),
        "no plugin kubeconfig on the host:\n{}",
        container.logs()
    );
    let conf = host.dirs.read(host::PRIMARY).unwrap_or_default();
    assert!(has_istio_entry(&conf), "conflist not merged:\n{conf}");

    // Ambient: the ZDS peer connects to the agent's socket on the host.
    let peer = host.peer();
    peer.wait_snapshots(1, T);
    let amb = host.namespace("amb", &[("istio.io/dataplane-mode", "ambient")]);
    let uid = host.pod(&amb, "app");
    let app = PodNs::new("img");
    peer.hold_acks();
    let result = std::thread::scope(|s| {
        let add = s.spawn(|| host.add(&conf, &app, &amb, "app"));
        peer.wait(T, "the agent's Add", |p| {
            add.is_finished() || p.all_requests().iter().any(|(_, q)| q.is_add_of(&uid))
        });
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !add.is_finished(),
            "ADD returned before the peer acked: {:?}\n{}",
            add.join(),
            container.logs()
        );
        peer.release_acks();
        add.join().expect("ADD thread")
    })
    .unwrap_or_else(|e| panic!("ADD of the ambient pod: {e}\n{}", container.logs()));
    let ip = result_ip(&result);
    // Any outbound TCP from the pod is captured to the peer's 15001 inside the pod netns.
    let to = format!("{}:8080", peer_target(&ip));
    assert!(
        connect_from(&app, &to),
        "outbound connect to {to} was not accepted:\n{}",
        container.logs()
    );
    peer.wait(Duration::from_secs(5), "the peer's 15001 accept", |p| {
        p.accepted(&uid) == Some(1)
    });
    assert_eq!(peer.violations(), Vec::<String>::new());
    // The enrolment is on the pod as the real server stores it (the agent's patch, applied).
    let cp = host.release.cp;
    let deadline = Instant::now() + T;
    while !cp
        .pod(&amb, "app")
        .and_then(|p| p.metadata.annotations)
        .is_some_and(|a| a.contains_key("ambient.istio.io/redirection"))
    {
        assert!(
            Instant::now() < deadline,
            "the pod was not annotated on the server within {T:?}:\n{}",
            container.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // Everything the pod asked while installed, the real RBAC authorizer allowed through the
    // release's own bindings.
    let calls = host.release.requests();
    let patched = calls
        .iter()
        .any(|a| a.call.verb == "patch" && a.call.resource == "pods/status");
    assert!(patched, "no annotation patch among {calls:?}");
    host.release
        .assert_all_allowed_by_its_rbac("the image's agent", &calls);

    // `helm uninstall` (every object of the release, the ServiceAccount last), then the kubelet's
    // SIGTERM: the server refuses the pod's bound token once its ServiceAccount is gone, the
    // shutdown's DaemonSet lookup takes that for an uninstall, and the agent exits 0 taking its
    // config entry, plugin and kubeconfig with it.
    host.release.uninstall();
    let token = std::fs::read_to_string(host.dirs.sa.join("token")).expect("token");
    let deadline = Instant::now() + T;
    loop {
        match host.release.ask_with(&token) {
            Err(istio_cni::kube::KubeError::Unauthorized(_)) => break,
            other => assert!(
                Instant::now() < deadline,
                "the token of a deleted ServiceAccount still answered: {other:?}"
            ),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let code = container.stop(Duration::from_secs(30));
    assert_eq!(code, 0, "exit code on SIGTERM:\n{}", container.logs());
    let after = host.dirs.read(host::PRIMARY).unwrap_or_default();
    assert!(
        !has_istio_entry(&after),
        "entry left after SIGTERM:\n{after}"
    );
    assert!(
        !host.dirs.run.join("istio-cni-kubeconfig").exists(),
        "kubeconfig left after SIGTERM"
    );
    let logs = container.logs();
    assert!(
        logs.contains("DaemonSet istio-cni-node is gone: uninstall"),
        "no shutdown check:\n{logs}"
    );
}

/// An address in the pod's subnet other than its own: nothing listens there, so only capture
/// can accept the connection.
fn peer_target(pod_ip: &str) -> String {
    let mut octets: Vec<&str> = pod_ip.split('.').collect();
    octets[3] = "250";
    octets.join(".")
}

fn connect_from(pod: &PodNs, to: &str) -> bool {
    let to: std::net::SocketAddr = to.parse().expect("address");
    istio_cni::netns::Netns::open(&pod.guard.path())
        .and_then(|ns| {
            ns.run(move || {
                std::net::TcpStream::connect_timeout(&to, Duration::from_secs(2)).is_ok()
            })
        })
        .expect("enter the pod netns")
}
