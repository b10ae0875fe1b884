//! What the side-by-side benchmarks do to the real API server in bulk: pods created and deleted
//! many at a time, the server's open watches, its CPU; and the small statistics they print.
#![allow(dead_code)]

use std::time::Duration;

use futures::StreamExt;
use istio_cni_testing::controlplane::ControlPlane;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

/// How many requests go to the server at once when pods are made or removed in bulk.
const IN_FLIGHT: usize = 16;

/// A pod on `node` as a workload looks (labels, an annotation of some size, one container).
pub fn pod(namespace: &str, name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace,
            "labels": {"app": name.split('-').next().unwrap_or("app")},
            "annotations": {"note": "x".repeat(200)}},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "registry.invalid/app:1"}]}
    }))
    .expect("pod")
}

/// A pod as Istio's injector leaves it (app + istio-proxy, the status annotation) on `node`.
pub fn sidecar_pod(namespace: &str, name: &str, node: &str, uid_hint: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace,
            "labels": {"bench": uid_hint},
            "annotations": {"sidecar.istio.io/status": "{\"initContainers\":null,\"containers\":[\"istio-proxy\"]}"}},
        "spec": {"nodeName": node, "containers": [
            {"name": "app", "image": "registry.invalid/app:1"},
            {"name": "istio-proxy", "image": "registry.invalid/proxyv2:1"}
        ]}
    })
}

/// Creates every pod, [`IN_FLIGHT`] at a time; panics naming the first failure.
pub fn create_pods(cp: &ControlPlane, pods: Vec<Pod>) {
    let client = cp.client();
    cp.block_on(async move {
        let results: Vec<Result<(), String>> = futures::stream::iter(pods)
            .map(|p| {
                let api: Api<Pod> = Api::namespaced(
                    client.clone(),
                    p.metadata.namespace.as_deref().unwrap_or("default"),
                );
                async move {
                    api.create(&PostParams::default(), &p)
                        .await
                        .map(|_| ())
                        .map_err(|e| format!("create pod {:?}: {e}", p.metadata.name))
                }
            })
            .buffer_unordered(IN_FLIGHT)
            .collect()
            .await;
        if let Some(Err(e)) = results.into_iter().find(|r| r.is_err()) {
            panic!("{e}");
        }
    });
}

/// Deletes the named pods of `namespace` at once (no grace period: no kubelet runs).
pub fn delete_pods(cp: &ControlPlane, namespace: &str, names: Vec<String>) {
    let api: Api<Pod> = Api::namespaced(cp.client(), namespace);
    cp.block_on(async move {
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        futures::stream::iter(names)
            .map(|n| {
                let (api, params) = (api.clone(), params.clone());
                async move {
                    let _ = api.delete(&n, &params).await;
                }
            })
            .buffer_unordered(IN_FLIGHT)
            .collect::<Vec<()>>()
            .await;
    });
}

/// The watches the server holds open now (`apiserver_longrunning_requests`, verb WATCH, summed).
pub fn open_watches(cp: &ControlPlane) -> f64 {
    let client = cp.client();
    let text = cp.block_on(async move {
        let request = axum::http::Request::get("/metrics")
            .body(Vec::new())
            .expect("request");
        client.request_text(request).await.unwrap_or_default()
    });
    text.lines()
        .filter(|l| {
            l.starts_with("apiserver_longrunning_requests{") && l.contains("verb=\"WATCH\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Milliseconds with two decimals.
pub fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// The `q` quantile (0..=1) of `samples` (nearest rank).
pub fn quantile(samples: &[Duration], q: f64) -> Duration {
    let mut v = samples.to_vec();
    v.sort();
    if v.is_empty() {
        return Duration::ZERO;
    }
    let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

/// Mean of `samples`.
pub fn mean(samples: &[Duration]) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    samples.iter().sum::<Duration>() / samples.len() as u32
}

/// `ours / istio`, two decimals ("n/a" when Istio's is zero).
pub fn ratio(ours: f64, istio: f64) -> String {
    if istio == 0.0 {
        return "n/a".into();
    }
    format!("{:.2}", ours / istio)
}

/// A row of the side-by-side table: what, Istio's, ours, the ratio ours/Istio.
pub fn row(what: &str, istio: &str, ours: &str, ratio: &str) {
    println!("| {what} | {istio} | {ours} | {ratio} |");
}

/// An env setting as a number, or `default`.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Every user's requests after the first `from` audit entries, read in one pass (what
/// [`ControlPlane::requests_of`] gives for one user; many agents would read the log once each):
/// user -> the verbs, one per request.
pub fn requests_by_user(
    cp: &ControlPlane,
    from: usize,
) -> std::collections::HashMap<String, Vec<String>> {
    // The control plane's audit log (`--audit-log-path`, in its dir).
    let text = std::fs::read_to_string(cp.dir().join("audit.log")).unwrap_or_default();
    let mut seen = std::collections::HashSet::new();
    let mut by_user: std::collections::HashMap<String, Vec<String>> = Default::default();
    for e in text
        .lines()
        .skip(from)
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
    {
        if !seen.insert(e["auditID"].as_str().unwrap_or_default().to_string()) {
            continue;
        }
        let user = e["user"]["username"].as_str().unwrap_or_default();
        by_user
            .entry(user.to_string())
            .or_default()
            .push(e["verb"].as_str().unwrap_or_default().to_string());
    }
    by_user
}

/// utime + stime + cutime + cstime of `pid` (clock ticks of 10 ms: read over many operations).
pub fn proc_cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<u64> = rest
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    // utime, stime, cutime, cstime are fields 14-17 of stat: 11-14 after the state (index 0).
    let ticks: u64 = fields.get(11..15).map_or(0, |f| f.iter().sum());
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as u64;
    Duration::from_micros(ticks * 1_000_000 / hz)
}

/// The kube-apiserver process of `cp` (its command line names the control plane's dir).
pub fn apiserver_pid(cp: &ControlPlane) -> Option<u32> {
    let dir = cp.dir().display().to_string();
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd);
            cmd.contains("kube-apiserver") && cmd.contains(&dir)
        })
}

/// Sizes of one node's pod list as the server sends it for each encoding a client may ask for
/// (JSON, protobuf; each plain and gzip), for the many-nodes report's explanation.
pub fn list_sizes(cp: &ControlPlane, node: &str) -> Vec<(String, usize)> {
    let uri = format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{node}");
    let kubeconfig = cp.admin_kubeconfig().to_path_buf();
    cp.block_on(async move {
        // A client that leaves the body as sent: the shared one decodes gzip and drops the
        // Content-Encoding header, which would measure the decoded size.
        let kubeconfig = kube::config::Kubeconfig::read_from(&kubeconfig).expect("kubeconfig");
        let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .expect("config");
        config.disable_compression = true;
        let client = kube::Client::try_from(config).expect("client");
        let mut out = Vec::new();
        for (accept, gzip) in [
            ("application/json", false),
            ("application/json", true),
            ("application/vnd.kubernetes.protobuf", false),
            ("application/vnd.kubernetes.protobuf", true),
        ] {
            let mut request = axum::http::Request::get(&uri).header("Accept", accept);
            if gzip {
                request = request.header("Accept-Encoding", "gzip");
            }
            let request = request.body(Vec::new()).expect("request");
            let size = match client.send(request.map(kube::client::Body::from)).await {
                Ok(response) => {
                    use http_body_util::BodyExt;
                    let encoding = response
                        .headers()
                        .get("content-encoding")
                        .map(|v| v.to_str().unwrap_or("").to_string())
                        .unwrap_or_default();
                    let body = response
                        .into_body()
                        .collect()
                        .await
                        .map(|b| b.to_bytes().len());
                    let said = if encoding.is_empty() {
                        "plain"
                    } else {
                        &encoding
                    };
                    out.push((
                        format!("`{accept}`, gzip accepted: {gzip}; sent {said}"),
                        body.unwrap_or(0),
                    ));
                    continue;
                }
                Err(_) => 0,
            };
            out.push((
                format!("`{accept}`, gzip accepted: {gzip}; request failed"),
                size,
            ));
        }
        out
    })
}
