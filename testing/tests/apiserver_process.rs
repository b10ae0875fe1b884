//! The `test-apiserver` binary as a process: fixtures served to the product's kube client, the
//! control endpoints over plain HTTP (request log, a run-time fault, down and back), SIGTERM.
//! Here rather than in the product's tests/: cargo names the binary (`CARGO_BIN_EXE_*`) only to
//! the tests of the package that builds it.

use std::time::{Duration, Instant};

use istio_cni::kube::{KubeClient, KubeError, config_from_kubeconfig_file};
use serde_json::json;

const CALL: Duration = Duration::from_secs(2);
/// Upper bound for anything the test waits for; normally reached in milliseconds.
const PATIENCE: Duration = Duration::from_secs(5);

#[tokio::test]
async fn test_apiserver_binary_serves_fixtures_until_sigterm() {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

    let dir = tempfile::tempdir().expect("tempdir");
    let fixtures = dir.path().join("fixtures.json");
    let kubeconfig = dir.path().join("kubeconfig");
    let list = json!({"apiVersion": "v1", "kind": "PodList", "items": [
        {"metadata": {"name": "fx", "namespace": "ns1"}, "spec": {"nodeName": "n1", "containers": []}}
    ]});
    std::fs::write(&fixtures, list.to_string()).expect("fixtures");
    // Plain HTTP (the option; TLS is the default) so the control calls below can be raw HTTP.
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_test-apiserver"))
        .arg("--plain-http")
        .arg("--port")
        .arg("0")
        .arg("--fixtures")
        .arg(&fixtures)
        .arg("--kubeconfig-out")
        .arg(&kubeconfig)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let stdout = child.stdout.take().expect("stdout");
    let mut first_line = String::new();
    tokio::time::timeout(PATIENCE, BufReader::new(stdout).read_line(&mut first_line))
        .await
        .expect("URL printed in time")
        .expect("read");
    let url = first_line.trim().to_string();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");

    // The plugin's way in (`from_kubeconfig_file` is behind the product's test-hooks feature,
    // which this crate's tests do not turn on).
    let config = config_from_kubeconfig_file(&kubeconfig)
        .await
        .expect("kubeconfig");
    let client = KubeClient::from_config(config).expect("client");
    client
        .get_pod("ns1", "fx", CALL)
        .await
        .expect("fixture served");

    // Run-time fault control over HTTP: one 403, then normal again; then down for a moment.
    let addr = url.trim_start_matches("http://").to_string();
    // One plain HTTP/1.1 exchange with a control endpoint; returns the response body.
    let control = |method: &'static str, path: &'static str, body: &'static str| {
        let addr = addr.clone();
        async move {
            let mut conn = tokio::net::TcpStream::connect(&addr)
                .await
                .expect("connect");
            let request = format!(
                "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            conn.write_all(request.as_bytes()).await.expect("send");
            let mut answer = String::new();
            conn.read_to_string(&mut answer).await.expect("answer");
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
            answer
                .split_once("\r\n\r\n")
                .map(|(_, body)| body.to_string())
                .unwrap_or_default()
        }
    };
    let log: serde_json::Value =
        serde_json::from_str(&control("GET", "/testserver/requests", "").await).expect("JSON log");
    assert_eq!(
        log[0],
        json!({"method": "GET", "path": "/api/v1/namespaces/ns1/pods/fx", "query": "",
               "token": "istio-cni-test-token", "accept_encoding": "gzip"})
    );
    control(
        "POST",
        "/testserver/fault",
        r#"{"kind":"fail","code":403,"times":1}"#,
    )
    .await;
    let err = client.get_pod("ns1", "fx", CALL).await.expect_err("403");
    assert!(matches!(err, KubeError::Forbidden { .. }), "{err:?}");
    client
        .get_pod("ns1", "fx", CALL)
        .await
        .expect("fault used up");

    control("POST", "/testserver/fault", r#"{"kind":"down","ms":300}"#).await;
    let deadline = Instant::now() + PATIENCE;
    let mut went_down = false;
    loop {
        assert!(
            Instant::now() < deadline,
            "server did not go down and come back"
        );
        match client.get_pod("ns1", "fx", CALL).await {
            // Refused, or a pooled connection cut mid-request by the shutdown.
            Err(KubeError::ConnectRefused { .. } | KubeError::Transport { .. }) => went_down = true,
            Ok(_) if went_down => break,
            Ok(_) => {}
            Err(other) => panic!("unexpected error: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let pid = nix::unistd::Pid::from_raw(child.id().expect("pid") as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("signal");
    let status = tokio::time::timeout(PATIENCE, child.wait())
        .await
        .expect("exits on SIGTERM")
        .expect("wait");
    assert!(status.success(), "{status:?}");
}
