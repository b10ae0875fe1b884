//! The real control plane harness itself: TLS only with the generated CA, the admin client in
//! `system:masters`, RBAC enforced for a service account's bound token, pod status written
//! through the `status` subresource, and a control plane of a test's own gone after drop.

use std::time::{Duration, Instant};

use istio_cni_testing::controlplane::{self, ControlPlane, pod_on_node, unique_name};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde_json::json;

#[test]
fn bound_token_is_authenticated_and_rbac_is_enforced() {
    let cp = controlplane::shared();
    let ns = unique_name("harness");
    cp.create_namespace(&ns, &[("purpose", "harness")]);
    let token = cp.token(&ns, "default", Duration::from_secs(600));
    assert_eq!(token.split('.').count(), 3, "a JWT: {token}");
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    cp.write_kubeconfig(&kubeconfig, &token);
    let ns2 = ns.clone();
    let denied = cp.block_on(async move {
        let config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(&kubeconfig).expect("kubeconfig"),
            &Default::default(),
        )
        .await
        .expect("config");
        let client = kube::Client::try_from(config).expect("client");
        Api::<Pod>::namespaced(client, &ns2)
            .list(&ListParams::default())
            .await
            .expect_err("the default ServiceAccount may not list pods")
    });
    let text = denied.to_string();
    assert!(
        text.contains("forbidden") && text.contains("cannot list resource \"pods\""),
        "{text}"
    );
    assert!(
        text.contains(&format!("system:serviceaccount:{ns}:default")),
        "{text}"
    );
}

#[test]
fn pod_status_is_written_through_the_status_subresource() {
    let cp = controlplane::shared();
    let ns = unique_name("harness");
    let node = unique_name("node");
    cp.create_namespace(&ns, &[]);
    cp.create_node(&node, "192.0.2.10");
    let created = cp.create_pod(&pod_on_node(&ns, "app", &node));
    assert_eq!(created.spec.as_ref().expect("spec").node_name, Some(node));
    let pod = cp.set_pod_status(
        &ns,
        "app",
        json!({"phase": "Running", "podIP": "10.244.0.5", "podIPs": [{"ip": "10.244.0.5"}],
               "containerStatuses": [{"name": "app", "ready": true, "restartCount": 0,
                   "image": "app:1", "imageID": "", "state": {"running": {}}}]}),
    );
    let status = pod.status.expect("status");
    assert_eq!(status.phase.as_deref(), Some("Running"));
    assert_eq!(status.pod_ip.as_deref(), Some("10.244.0.5"));
    assert_eq!(
        cp.pod(&ns, "app").and_then(|p| p.status?.pod_ip),
        status.pod_ip
    );
    // The API server answers over TLS only, with a certificate from the generated CA.
    assert!(cp.url().starts_with("https://127.0.0.1:"), "{}", cp.url());
    assert!(cp.ca_pem().contains("BEGIN CERTIFICATE"));
}

#[test]
fn a_control_plane_of_its_own_is_gone_after_drop() {
    let t0 = Instant::now();
    let cp = ControlPlane::start().unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "own control plane ready in {:?} (start to ready {:?})",
        t0.elapsed(),
        cp.start_to_ready()
    );
    let port = cp.port();
    let dir = cp.dir().to_path_buf();
    assert!(dir.join("kube-apiserver.log").is_file());
    drop(cp);
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "kube-apiserver still listens on {port}"
    );
    assert!(!dir.exists(), "{} left behind", dir.display());
}
