//! The plugin's calls to the node agent over its Unix sockets, with a fake agent: log records
//! streamed to `log.sock`, and the ambient `/cmdadd` event on `pluginevent.sock`.
//!
//! The plugin's own GETs (pod, namespace) go to the real kube-apiserver
//! (`cni_driver::real_api`) with a kubeconfig as install-cni writes it (bound token, RBAC
//! enforced); the case where the namespace read fails stays on the test API server, which can
//! leave one resource unserved.

mod cni_driver;

use std::path::Path;
use std::sync::{Arc, Mutex};

use cni_driver::real_api::real_api_and_run_dir;
use cni_driver::*;
use serde_json::{Value, json};

/// A fake agent serving `/log` and `/cmdadd` on the run dir's sockets, recording request bodies;
/// `/podadd` too when it is given an answer (else a 404, as Istio's agent).
struct FakeAgent {
    logs: Arc<Mutex<Vec<Value>>>,
    events: Arc<Mutex<Vec<Value>>>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeAgent {
    fn start(run_dir: &Path, event_status: u16) -> FakeAgent {
        FakeAgent::start_with(run_dir, event_status, None)
    }

    /// Also answers `/podadd` with `(status, body)`.
    fn start_with(run_dir: &Path, event_status: u16, pod_add: Option<(u16, String)>) -> FakeAgent {
        use axum::body::Bytes;
        use axum::http::StatusCode;
        use axum::routing::any;
        let logs: Arc<Mutex<Vec<Value>>> = Arc::default();
        let events: Arc<Mutex<Vec<Value>>> = Arc::default();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (l, e) = (logs.clone(), events.clone());
        let log_sock = run_dir.join("log.sock");
        let event_sock = run_dir.join("pluginevent.sock");
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let log_app: axum::Router = axum::Router::new().route(
                    "/log",
                    any(move |body: Bytes| async move {
                        if let Ok(v) = serde_json::from_slice(&body) {
                            l.lock().unwrap().push(v);
                        }
                        StatusCode::OK
                    }),
                );
                let status = StatusCode::from_u16(event_status).unwrap();
                let mut event_app: axum::Router = axum::Router::new().route(
                    "/cmdadd",
                    any(move |body: Bytes| async move {
                        if let Ok(v) = serde_json::from_slice(&body) {
                            e.lock().unwrap().push(v);
                        }
                        (status, "agent says so")
                    }),
                );
                if let Some((code, answer)) = pod_add {
                    let code = StatusCode::from_u16(code).unwrap();
                    event_app = event_app.route(
                        "/podadd",
                        any(move || async move { (code, answer.clone()) }),
                    );
                }
                let log_l = tokio::net::UnixListener::bind(&log_sock).unwrap();
                let ev_l = tokio::net::UnixListener::bind(&event_sock).unwrap();
                ready_tx.send(()).unwrap();
                let a = axum::serve(log_l, log_app);
                let b = axum::serve(ev_l, event_app);
                tokio::select! {
                    _ = a => {}
                    _ = b => {}
                    _ = rx => {}
                }
            });
        });
        ready_rx.recv().unwrap();
        FakeAgent {
            logs,
            events,
            shutdown: Some(tx),
            thread: Some(thread),
        }
    }

    /// Every forwarded record, decoded.
    fn records(&self) -> Vec<Value> {
        self.logs
            .lock()
            .unwrap()
            .iter()
            .flat_map(|batch| batch.as_array().cloned().unwrap_or_default())
            .map(|s| {
                serde_json::from_str(s.as_str().expect("records are strings"))
                    .expect("record is JSON")
            })
            .collect()
    }

    /// The records once `done` holds for them, or as they are after 10 s. The plugin's last batch
    /// is written without waiting for the agent's answer, so it may be served after the plugin
    /// has exited.
    fn records_when(&self, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let records = self.records();
            if done(&records) || std::time::Instant::now() > deadline {
                return records;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for FakeAgent {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn ambient_conf(run_dir: &Path) -> Value {
    json!({
        "cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "istio-cni",
        "plugin_log_level": "debug",
        "cni_agent_run_dir": run_dir.display().to_string(),
        "ambient_enabled": true,
        "enablement_selectors": enablement_selectors(),
        "exclude_namespaces": ["kube-system"], "pod_namespace": "istio-system",
        "prevResult": {"cniVersion": "1.0.0", "ips": [{"address": "10.40.0.7/24", "gateway": "10.40.0.1"}], "dns": {}}
    })
}

/// The plain pod `amb/app` (no sidecar) the ambient cases add.
fn app_pod() -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "app", "namespace": "amb"},
        "spec": {"containers": [{"name": "app"}]}})
}

/// ADD of `<namespace>/app` with the ambient config from `run_dir` and a netns path that is
/// never entered (the cases fail before any netns work).
fn add_app_without_netns(run_dir: &Path, namespace: &str) -> Run {
    run_plugin(
        &cni_env("ADD", "/x", namespace, "app"),
        &ambient_conf(run_dir).to_string(),
    )
}

#[test]
fn log_records_reach_the_agent_socket() {
    let dir = tempfile::tempdir().unwrap();
    let agent = FakeAgent::start(dir.path(), 200);
    let conf = json!({
        "cniVersion": "1.0.0", "name": "n", "plugin_log_level": "debug",
        "cni_agent_run_dir": dir.path().display().to_string(), "exclude_namespaces": ["kube-system"]
    });
    let run = run_plugin(
        &cni_env("ADD", "/var/run/netns/none", "kube-system", "logged-pod"),
        &conf.to_string(),
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let pod_info = |r: &Value| r["pod"] == "kube-system/logged-pod" && r["level"] == "info";
    let debug = |r: &Value| r["level"] == "debug";
    let records = agent.records_when(|rs| rs.iter().any(pod_info) && rs.iter().any(debug));
    assert!(records.iter().any(pod_info), "{records:?}");
    // plugin_log_level debug is honoured for the forwarded records.
    assert!(records.iter().any(debug), "{records:?}");
    for r in &records {
        assert!(r["time"].as_str().is_some_and(|t| t.ends_with('Z')), "{r}");
    }
}

#[test]
fn a_missing_log_socket_never_fails_add() {
    let dir = tempfile::tempdir().unwrap();
    // A stale socket file with nobody behind it.
    drop(std::os::unix::net::UnixListener::bind(dir.path().join("log.sock")).unwrap());
    let conf = json!({"cniVersion": "1.0.0", "name": "n", "cni_agent_run_dir": dir.path().display().to_string(), "exclude_namespaces": ["kube-system"]});
    let run = run_plugin(&cni_env("ADD", "/x", "kube-system", "p"), &conf.to_string());
    assert_eq!(run.code, 0, "{}", run.stdout);
}

#[test]
fn ambient_pod_is_handed_to_the_agent() {
    let (api, dir) = real_api_and_run_dir();
    let amb = api.ns("amb");
    api.put_namespace("amb", json!({"istio.io/dataplane-mode": "ambient"}));
    api.put_pod(app_pod());
    api.put_pod(annotated_pod("amb", "with-sidecar", json!({})));
    let agent = FakeAgent::start(dir.path(), 200);
    let netns = NetnsGuard::new("amb");
    let ns_path = netns.path().display().to_string();

    let run = run_plugin(
        &cni_env("ADD", &ns_path, &amb, "app"),
        &ambient_conf(dir.path()).to_string(),
    );
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert_eq!(run.json()["ips"][0]["address"], "10.40.0.7/24");
    let events = agent.events.lock().unwrap().clone();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["Netns"], ns_path.as_str());
    assert_eq!(events[0]["PodName"], "app");
    assert_eq!(events[0]["PodNamespace"], amb.as_str());
    assert_eq!(events[0]["IPs"][0]["Address"]["IP"], "10.40.0.7");
    assert!(
        !netns.iptables_save().contains("ISTIO"),
        "ambient pods get no in-pod rules from the plugin"
    );

    // A sidecar pod in an ambient namespace is not ambient: the sidecar path runs (dry run here).
    let out = dir.path().join("dry.txt");
    let mut env = cni_env("ADD", &ns_path, &amb, "with-sidecar");
    env.push(("DRY_RUN_FILE_PATH", out.display().to_string()));
    let run = run_plugin(&env, &ambient_conf(dir.path()).to_string());
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert_eq!(
        agent.events.lock().unwrap().len(),
        1,
        "agent must not be called for sidecars"
    );
    assert!(file_text(&out).contains("ISTIO_OUTPUT"));
}

#[test]
fn agent_errors_fail_add_clearly() {
    let (api, dir) = real_api_and_run_dir();
    let amb = api.ns("amb");
    api.put_namespace("amb", json!({"istio.io/dataplane-mode": "ambient"}));
    api.put_pod(app_pod());
    // No agent at all.
    let run = add_app_without_netns(dir.path(), &amb);
    assert_eq!(run.code, 1);
    assert!(
        run.msg().contains("failed to contact node Istio CNI agent"),
        "{}",
        run.stdout
    );
    // An agent answering 500.
    let _agent = FakeAgent::start(dir.path(), 500);
    let run = add_app_without_netns(dir.path(), &amb);
    run.assert_failed_saying(&["500", "agent says so"]);
}

#[test]
fn failed_ambient_check_does_not_let_a_non_sidecar_pod_start_uncaptured() {
    // The namespace read fails (not served), the pod read works: Istio would fall through to the
    // sidecar path and start the pod with no redirection (its B5). We fail ADD so it is retried.
    let (api, dir) = api_and_run_dir();
    api.put_pod(app_pod());
    let run = add_app_without_netns(dir.path(), "amb");
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert_eq!(run.json()["code"], 11, "{}", run.stdout);
}

#[test]
fn an_agent_without_podadd_is_asked_the_istio_way_when_the_uid_is_given() {
    let (api, dir) = real_api_and_run_dir();
    api.put_namespace("amb", json!({"istio.io/dataplane-mode": "ambient"}));
    api.put_pod(app_pod());
    // Serves /cmdadd only, as Istio's agent does: /podadd is a 404.
    let agent = FakeAgent::start(dir.path(), 200);
    let netns = NetnsGuard::new("ambu");
    let ns_path = netns.path().display().to_string();
    let mut env = cni_env("ADD", &ns_path, &api.ns("amb"), "app");
    for (key, value) in env.iter_mut() {
        if *key == "CNI_ARGS" {
            value.push_str(";K8S_POD_UID=00000000-0000-4000-8000-00000000a9e1");
        }
    }
    let run = run_plugin(&env, &ambient_conf(dir.path()).to_string());
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let events = agent.events.lock().unwrap().clone();
    assert_eq!(events.len(), 1, "one /cmdadd after the 404: {events:?}");
    assert_eq!(events[0]["PodName"], "app");
    assert!(
        events[0].get("PodUID").is_none(),
        "Istio's body: {}",
        events[0]
    );
}

/// ADD of `<namespace>/app` with the pod's UID in CNI_ARGS (the plugin asks `/podadd`).
fn add_app_with_uid(run_dir: &Path, namespace: &str) -> Run {
    let mut env = cni_env("ADD", "/x", namespace, "app");
    for (key, value) in env.iter_mut() {
        if *key == "CNI_ARGS" {
            value.push_str(";K8S_POD_UID=00000000-0000-4000-8000-00000000a9e2");
        }
    }
    run_plugin(&env, &ambient_conf(run_dir).to_string())
}

/// The agent's `/podadd` failure answer for `error`, as the agent encodes it.
fn agent_answer(error: istio_cni::agent::server::AddError) -> String {
    error.failure("amb/app").to_json()
}

#[test]
fn a_transient_agent_failure_reaches_kubelet_naming_the_pod_the_kind_and_the_cause() {
    use istio_cni::agent::mesh::MeshError;
    use istio_cni::agent::server::AddError;
    let (_api, dir) = api_and_run_dir();
    let refused = AddError::Mesh(Arc::new(MeshError::Ztunnel {
        pod: "amb/app".into(),
        source: istio_cni::zds::ZdsError::NoConnection,
    }));
    let _agent = FakeAgent::start_with(dir.path(), 500, Some((500, agent_answer(refused))));
    let run = add_app_with_uid(dir.path(), "amb");
    // Istio's plugin reports an agent's refusal as a plain error: its code stays.
    assert_eq!(run.json()["code"], 999, "{}", run.stdout);
    run.assert_failed_saying(&[
        "answered status 500",
        "pod amb/app not enrolled",
        "transient: the kubelet's next try of the ADD may succeed",
        "Ztunnel failed: ztunnel is not connected",
    ]);
}

#[test]
fn a_permanent_agent_failure_reaches_kubelet_naming_the_pod_the_kind_and_the_cause() {
    use istio_cni::agent::mesh::MeshError;
    use istio_cni::agent::server::AddError;
    let (_api, dir) = api_and_run_dir();
    let refused = AddError::Mesh(Arc::new(MeshError::NoNetns {
        pod: "amb/app".into(),
    }));
    let _agent = FakeAgent::start_with(dir.path(), 500, Some((500, agent_answer(refused))));
    let run = add_app_with_uid(dir.path(), "amb");
    assert_eq!(run.json()["code"], 999, "{}", run.stdout);
    run.assert_failed_saying(&[
        "answered status 500",
        "pod amb/app not enrolled",
        "permanent: each try of the ADD fails so until the cause named is fixed",
        "no netns found",
    ]);
}

#[test]
fn an_older_agent_s_plain_text_failure_still_fails_add_with_its_words_and_the_pod() {
    let (_api, dir) = api_and_run_dir();
    let _agent = FakeAgent::start_with(
        dir.path(),
        500,
        Some((
            500,
            "pod amb/app: ProgramPod failed: iptables-restore: exit 2".into(),
        )),
    );
    let run = add_app_with_uid(dir.path(), "amb");
    assert_eq!(run.json()["code"], 999, "{}", run.stdout);
    run.assert_failed_saying(&[
        "answered status 500",
        "pod amb/app not enrolled",
        "iptables-restore: exit 2",
    ]);
    assert!(!run.msg().contains("transient"), "{}", run.msg());
}
