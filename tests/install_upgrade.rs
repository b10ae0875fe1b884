//! The shutdown "is this an upgrade?" check against a stand-in API server on loopback: keep the
//! installation while the DaemonSet still targets the node, clean up otherwise, retry a few times
//! and keep when the API never answers (Istio bug B11), in sidecar mode too (Istio limit L10).

#[path = "install_support.rs"]
mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use serde_json::json;

use support::*;

const T: Duration = Duration::from_secs(30);

/// What the stand-in API answers for the DaemonSet.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Ds {
    Present,
    PresentWithAffinity,
    Deleting,
    Missing,
    Forbidden,
    Broken,
}

#[derive(Clone)]
struct Api {
    ds: Arc<Mutex<Ds>>,
    ds_gets: Arc<AtomicUsize>,
    paths: Arc<Mutex<Vec<String>>>,
}

async fn daemonset(
    State(api): State<Api>,
    Path((ns, name)): Path<(String, String)>,
) -> impl IntoResponse {
    api.ds_gets.fetch_add(1, Ordering::SeqCst);
    api.paths
        .lock()
        .expect("paths")
        .push(format!("ds {ns}/{name}"));
    let status = |code: u16, reason: &str| {
        (
            StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            axum::Json(
                json!({"kind":"Status","apiVersion":"v1","status":"Failure","reason":reason,"code":code,"message":reason}),
            ),
        )
    };
    let mut ds = json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"selector": {"matchLabels": {"k8s-app": "istio-cni-node"}},
                 "template": {"metadata": {"labels": {"k8s-app": "istio-cni-node"}},
                              "spec": {"containers": [{"name": "install-cni"}],
                                       "nodeSelector": {"kubernetes.io/os": "linux"}}}}
    });
    let mode = *api.ds.lock().expect("mode");
    match mode {
        Ds::Missing => return status(404, "NotFound"),
        Ds::Forbidden => return status(403, "Forbidden"),
        Ds::Broken => return status(500, "InternalError"),
        Ds::Deleting => ds["metadata"]["deletionTimestamp"] = json!("2024-01-01T00:00:00Z"),
        Ds::PresentWithAffinity => {
            ds["spec"]["template"]["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["mesh"]}]}]}}});
        }
        Ds::Present => {}
    }
    (StatusCode::OK, axum::Json(ds))
}

async fn node(State(api): State<Api>, Path(name): Path<String>) -> impl IntoResponse {
    api.paths
        .lock()
        .expect("paths")
        .push(format!("node {name}"));
    axum::Json(json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/os": "linux", "pool": "general"}}}))
}

/// Starts the stand-in API on loopback; keep the runtime alive while it is used.
fn serve(ds: Ds) -> (tokio::runtime::Runtime, Api, u16) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let api = Api {
        ds: Arc::new(Mutex::new(ds)),
        ds_gets: Arc::new(AtomicUsize::new(0)),
        paths: Arc::new(Mutex::new(Vec::new())),
    };
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(("127.0.0.1", 0)))
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let app: Router<()> = Router::new()
        .route(
            "/apis/apps/v1/namespaces/{ns}/daemonsets/{name}",
            get(daemonset),
        )
        .route("/api/v1/nodes/{name}", get(node))
        .with_state(api.clone());
    rt.spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (rt, api, port)
}

/// The base env of `d` with a kubeconfig (written into `d`) for the stand-in API on `port`.
fn env_for_api(d: &Dirs, port: u16) -> Vec<(String, String)> {
    let kubeconfig = d.tmp.path().join("kubeconfig");
    write_kubeconfig(&kubeconfig, port);
    let mut env = d.base_env();
    env.push(("KUBECONFIG".into(), kubeconfig.display().to_string()));
    env
}

fn write_kubeconfig(path: &std::path::Path, port: u16) {
    std::fs::write(
        path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    server: http://127.0.0.1:{port}\n  name: test\ncontexts:\n- context:\n    cluster: test\n    user: test\n  name: test\ncurrent-context: test\nusers:\n- name: test\n  user:\n    token: test-token\n"
        ),
    )
    .expect("kubeconfig");
}

/// Runs install-cni against a stand-in API answering `ds`, sends SIGTERM, and says whether the
/// installation was kept; also returns how many DaemonSet GETs were made and the shutdown time.
fn run(ds: Ds, extra_env: &[(&str, &str)]) -> (bool, usize, Duration, Vec<String>) {
    let (_rt, api, port) = serve(ds);
    let d = Dirs::new();
    d.put("10-list.conflist", &testdata("list.conflist"));
    let mut env = env_for_api(&d, port);
    env.push(("NODE_NAME".into(), "node-1".into()));
    env.extend(
        extra_env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    let mut agent = start(&env, &[]);
    assert!(
        d.waits_for(T, "10-list.conflist", has_istio_entry),
        "not installed:\n{}",
        agent.output()
    );
    let t0 = Instant::now();
    let st = agent.terminate(T);
    let took = t0.elapsed();
    assert!(st.success(), "{}", agent.output());
    let kept = d
        .read("10-list.conflist")
        .is_some_and(|c| has_istio_entry(&c));
    assert_eq!(
        kept,
        d.bin.join("istio-cni").exists(),
        "binary follows the config"
    );
    assert_eq!(
        kept,
        d.run.join("istio-cni-kubeconfig").exists(),
        "kubeconfig follows the config"
    );
    if !kept {
        assert_eq!(
            d.read("10-list.conflist"),
            Some(testdata_str("list-no-istio.conflist"))
        );
    }
    let gets = api.ds_gets.load(Ordering::SeqCst);
    let paths = api.paths.lock().expect("paths").clone();
    (kept, gets, took, paths)
}

#[test]
fn daemonset_present_means_upgrade_keep_everything_in_sidecar_mode_too() {
    let (kept, gets, _, paths) = run(Ds::Present, &[]);
    assert!(kept);
    assert_eq!(gets, 1);
    assert!(
        paths.contains(&"ds my-namespace/istio-cni-node".to_string()),
        "{paths:?}"
    );
    assert!(
        paths.contains(&"node node-1".to_string()),
        "nodeSelector is checked against the node: {paths:?}"
    );
}

#[test]
fn daemonset_missing_forbidden_or_deleting_means_uninstall() {
    for ds in [Ds::Missing, Ds::Forbidden, Ds::Deleting] {
        let (kept, gets, _, _) = run(ds, &[]);
        assert!(!kept, "{ds:?}");
        assert_eq!(gets, 1, "{ds:?}");
    }
}

#[test]
fn daemonset_no_longer_targeting_the_node_means_uninstall() {
    let (kept, _, _, paths) = run(Ds::PresentWithAffinity, &[]);
    assert!(!kept);
    assert!(paths.contains(&"node node-1".to_string()), "{paths:?}");
}

#[test]
fn api_errors_are_retried_then_keep() {
    let (kept, gets, took, _) = run(Ds::Broken, &[]);
    assert!(kept, "an unanswered check must not uninstall");
    assert_eq!(gets, 3);
    // Two waits of about 1 s, each jittered down to no less than half.
    assert!(
        took >= Duration::from_secs(1),
        "retries are spaced: {took:?}"
    );
}

#[test]
fn safe_upgrade_disabled_always_cleans_up() {
    let (kept, gets, _, _) = run(Ds::Present, &[("AMBIENT_DISABLE_SAFE_UPGRADE", "true")]);
    assert!(!kept);
    assert_eq!(gets, 0);
}

#[test]
fn restart_after_an_upgrade_still_restores_the_original_conf_on_uninstall() {
    let (_rt, api, port) = serve(Ds::Present);
    let d = Dirs::new();
    d.put("10-bridge.conf", &testdata("bridge.conf"));
    let env = env_for_api(&d, port);
    let installed = || d.read("10-bridge.conflist").filter(|c| has_istio_entry(c));

    // First agent: converts the .conf, then is stopped for an upgrade and keeps everything.
    let mut first = start(&env, &[]);
    assert!(wait_for(T, installed).is_some(), "{}", first.output());
    assert!(first.terminate(T).success());
    assert!(
        installed().is_some() && d.read("10-bridge.conf").is_none(),
        "kept for the upgrade"
    );

    // Second agent (the new version) takes over, then the chart is uninstalled.
    let mut second = start(&env, &[]);
    second.wait_line("istio-cni is installed; watching for changes", T);
    *api.ds.lock().expect("mode") = Ds::Missing;
    assert!(second.terminate(T).success());
    assert_eq!(
        d.names(),
        vec!["10-bridge.conf".to_string()],
        "{}",
        second.output()
    );
    assert_eq!(
        d.read("10-bridge.conf"),
        Some(testdata_str("bridge.conf")),
        "original restored byte for byte"
    );
    assert!(!d.run.join("istio-cni-restore.json").exists());
}
