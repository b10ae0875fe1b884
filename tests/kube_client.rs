//! The kube client module against the test API server: a real kube client (from the kubeconfig the
//! server writes) doing gets, lists, patches, deletes and watches, with faults injected.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures::StreamExt;
use istio_cni::kube::{
    EventRecord, EventType, KubeClient, KubeError, MetadataPatch, PodPatchVia, PodPreconditions,
    Selectors, WatchBackoff, WatchError, WatchEvent, WatchStream, pod_preconditions,
};
use istio_cni_testing::apiserver::{Fault, TestApiServer, TestServerOptions};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use serde_json::json;

const CALL: Duration = Duration::from_secs(2);
/// Upper bound for anything a test waits for; normally reached in milliseconds.
const PATIENCE: Duration = Duration::from_secs(5);
const FAST_BACKOFF: WatchBackoff = WatchBackoff {
    min: Duration::from_millis(50),
    max: Duration::from_millis(200),
};

fn pod(namespace: &str, name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "app:1"}]},
        "status": {"phase": "Running", "podIP": "10.0.0.5"}
    }))
    .expect("valid pod")
}

fn namespace(name: &str, labels: serde_json::Value) -> Namespace {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": labels}
    }))
    .expect("valid namespace")
}

/// A running server plus a client built the way the plugin builds one: from a kubeconfig file.
struct Fixture {
    server: TestApiServer,
    client: KubeClient,
    _dir: tempfile::TempDir,
    kubeconfig: PathBuf,
}

async fn fixture() -> Fixture {
    fixture_with(TestServerOptions::default()).await
}

/// [`fixture`] with a server started with `options`.
async fn fixture_with(options: TestServerOptions) -> Fixture {
    let server = TestApiServer::start_with(options)
        .await
        .expect("server starts");
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("ZZZ-istio-cni-kubeconfig");
    server
        .write_kubeconfig(&kubeconfig)
        .expect("kubeconfig written");
    let client = KubeClient::from_kubeconfig_file(&kubeconfig)
        .await
        .expect("client from kubeconfig");
    Fixture {
        server,
        client,
        _dir: dir,
        kubeconfig,
    }
}

fn labels(pod: &Pod) -> std::collections::BTreeMap<String, String> {
    pod.metadata.labels.clone().unwrap_or_default()
}

fn annotations(pod: &Pod) -> std::collections::BTreeMap<String, String> {
    pod.metadata.annotations.clone().unwrap_or_default()
}

/// `selectors` with a label selector (the product never adds one to a node's pod selectors).
fn with_labels(selectors: Selectors, labels: &str) -> Selectors {
    Selectors {
        labels: Some(labels.to_string()),
        ..selectors
    }
}

#[tokio::test]
async fn get_list_patch_and_delete_through_the_written_kubeconfig() {
    let f = fixture().await;
    f.server
        .add_namespace(namespace(
            "ns1",
            json!({"istio.io/dataplane-mode": "ambient"}),
        ))
        .expect("ns");
    f.server.add_pod(pod("ns1", "a", "n1")).expect("pod");
    f.server.add_pod(pod("ns1", "b", "n2")).expect("pod");
    f.server.add_pod(pod("ns2", "c", "n1")).expect("pod");

    let got = f.client.get_pod("ns1", "a", CALL).await.expect("get pod");
    assert_eq!(
        got.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some("n1")
    );
    let ns = f.client.get_namespace("ns1", CALL).await.expect("get ns");
    assert_eq!(
        ns.metadata.labels.unwrap_or_default()["istio.io/dataplane-mode"],
        "ambient"
    );
    let missing = f
        .client
        .get_pod("ns1", "zz", CALL)
        .await
        .expect_err("absent");
    assert!(missing.is_not_found(), "{missing:?}");
    assert!(
        missing.to_string().starts_with("get pod ns1/zz: not found"),
        "{missing}"
    );

    let (on_n1, list_rv) = f
        .client
        .list_pods(&Selectors::on_node("n1"), CALL)
        .await
        .expect("list");
    let mut names: Vec<_> = on_n1
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    names.sort();
    assert_eq!(names, ["a", "c"]);
    assert_eq!(list_rv, Some(f.server.resource_version().to_string()));
    let (labelled, _) = f
        .client
        .list_pods(&with_labels(Selectors::on_node("n1"), "app in (c,x)"), CALL)
        .await
        .expect("list");
    assert_eq!(labelled.len(), 1);
    let (namespaces, _) = f
        .client
        .list_namespaces(
            &with_labels(Selectors::default(), "istio.io/dataplane-mode"),
            CALL,
        )
        .await
        .expect("list ns");
    assert_eq!(namespaces.len(), 1);

    let client = &f.client;
    let patch_a = |via, patch: MetadataPatch| async move {
        client
            .patch_pod_metadata(via, "ns1", "a", &patch, CALL)
            .await
            .expect("patch")
    };
    const REDIRECTION: &str = "ambient.istio.io/redirection";
    // Main resource: labels change, status is not touched.
    let patched = patch_a(
        PodPatchVia::Pod,
        MetadataPatch::default().set_label("repaired", "true"),
    )
    .await;
    assert_eq!(labels(&patched)["repaired"], "true");
    // Status subresource: the redirection annotation the ambient agent writes, then its removal.
    let annotated = patch_a(
        PodPatchVia::Status,
        MetadataPatch::default().set_annotation(REDIRECTION, "enabled"),
    )
    .await;
    assert_eq!(annotations(&annotated)[REDIRECTION], "enabled");
    assert_eq!(
        annotations(&f.server.pod("ns1", "a").expect("stored"))[REDIRECTION],
        "enabled"
    );
    let cleared = patch_a(
        PodPatchVia::Status,
        MetadataPatch::default().remove_annotation(REDIRECTION),
    )
    .await;
    assert!(!annotations(&cleared).contains_key("ambient.istio.io/redirection"));

    // Delete with stale preconditions is refused; with fresh ones it goes through.
    let stale = PodPreconditions {
        uid: Some("someone-else".into()),
        resource_version: None,
    };
    let conflict = f
        .client
        .delete_pod("ns1", "a", Some(stale), CALL)
        .await
        .expect_err("conflict");
    assert!(
        matches!(conflict, KubeError::Conflict { .. }),
        "{conflict:?}"
    );
    let current = f.client.get_pod("ns1", "a", CALL).await.expect("get");
    f.client
        .delete_pod("ns1", "a", Some(pod_preconditions(&current)), CALL)
        .await
        .expect("delete");
    assert!(f.server.pod("ns1", "a").is_none());

    // The repair controller's event about what it did.
    let event = EventRecord {
        event_type: EventType::Warning,
        reason: "DeleteBrokenPod".into(),
        message: "pod detected as broken, deleted".into(),
        component: "cni-repair".into(),
    };
    f.client
        .create_pod_event(&current, &event, CALL)
        .await
        .expect("event");
    assert!(
        f.server
            .wait_until(PATIENCE, || !f.server.events().is_empty())
            .await
    );
    let events = f.server.events();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].reason.as_deref(), Some("DeleteBrokenPod"));
    assert_eq!(events[0].involved_object.uid, current.metadata.uid);

    // The server saw the token from the kubeconfig and the selector the client built.
    let requests = f.server.requests();
    assert!(
        requests
            .iter()
            .all(|r| r.token.as_deref() == Some("istio-cni-test-token"))
    );
    assert!(requests.iter().any(|r| r.path == "/api/v1/pods"
        && r.query_param("fieldSelector").as_deref() == Some("spec.nodeName=n1")));
    assert!(
        requests
            .iter()
            .any(|r| r.method == "PATCH" && r.path == "/api/v1/namespaces/ns1/pods/a/status")
    );
}

/// Next non-error, non-marker event for pods, failing the test after `PATIENCE`.
async fn next_change(stream: &mut WatchStream<Pod>) -> WatchEvent<Pod> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.next()).await {
            Err(_) => panic!("no watch event within {PATIENCE:?}"),
            Ok(None) => panic!("watch stream ended"),
            Ok(Some(Ok(WatchEvent::Init | WatchEvent::InitDone))) | Ok(Some(Err(_))) => {}
            Ok(Some(Ok(event))) => return event,
        }
    }
}

/// Waits for the watcher's initial list to finish, returning what it listed.
async fn initial_sync(stream: &mut WatchStream<Pod>) -> Vec<String> {
    let mut listed = Vec::new();
    let deadline = Instant::now() + PATIENCE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.next()).await {
            Ok(Some(Ok(WatchEvent::InitApply(p)))) => listed.extend(p.metadata.name),
            Ok(Some(Ok(WatchEvent::InitDone))) => return listed,
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => panic!("watcher did not finish its initial list"),
        }
    }
}

fn name_of(event: &WatchEvent<Pod>) -> (&'static str, String, Option<String>) {
    let (kind, pod) = match event {
        WatchEvent::Apply(p) | WatchEvent::InitApply(p) => ("apply", p),
        WatchEvent::Delete(p) => ("delete", p),
        WatchEvent::Init | WatchEvent::InitDone => return ("marker", String::new(), None),
    };
    (
        kind,
        pod.metadata.name.clone().unwrap_or_default(),
        labels(pod).get("phase").cloned(),
    )
}

#[tokio::test]
async fn watcher_with_field_selector_sees_added_modified_deleted() {
    let f = fixture().await;
    f.server.add_pod(pod("ns1", "before", "n1")).expect("pod");
    let mut stream = f.client.watch_pods(&Selectors::on_node("n1"), FAST_BACKOFF);
    assert_eq!(initial_sync(&mut stream).await, ["before"]);

    f.server
        .add_pod(pod("ns1", "other-node", "n2"))
        .expect("pod");
    f.server.add_pod(pod("ns1", "p", "n1")).expect("pod");
    assert_eq!(
        name_of(&next_change(&mut stream).await),
        ("apply", "p".into(), None)
    );

    let mut changed = pod("ns1", "p", "n1");
    changed
        .metadata
        .labels
        .get_or_insert_default()
        .insert("phase".into(), "two".into());
    f.server.update_pod(changed).expect("update");
    assert_eq!(
        name_of(&next_change(&mut stream).await),
        ("apply", "p".into(), Some("two".into()))
    );

    f.server.delete_pod("ns1", "p").expect("deleted");
    assert_eq!(name_of(&next_change(&mut stream).await).0, "delete");

    // A pod moving off the node is a deletion for this watcher.
    f.server
        .update_pod(pod("ns1", "before", "n2"))
        .expect("update");
    assert_eq!(
        name_of(&next_change(&mut stream).await),
        ("delete", "before".into(), None)
    );
    let first_watch = f
        .server
        .wait_for_request(PATIENCE, |r| r.is_watch())
        .await
        .expect("a watch request");
    assert_eq!(first_watch.path, "/api/v1/pods");
    let watches: Vec<_> = f
        .server
        .requests()
        .into_iter()
        .filter(|r| r.is_watch())
        .collect();
    assert!(!watches.is_empty());
    assert!(
        watches
            .iter()
            .all(
                |r| r.query_param("fieldSelector").as_deref() == Some("spec.nodeName=n1")
                    && r.query_param("allowWatchBookmarks").as_deref() == Some("true")
            )
    );
}

// Lists and watch streams ask for gzip (a node's pod list shrinks to a few percent; a server
// gzips a watch one member per event, and the client reads every member); a watch streams its
// initial state (one request, no list); each watch stream asks for a timeoutSeconds of its own
// in 300-600 s.
#[tokio::test]
async fn lists_and_watches_ask_for_gzip_and_a_watch_streams_its_initial_state() {
    let f = fixture().await;
    f.server.add_pod(pod("ns1", "p", "n1")).expect("pod");
    let (pods, _) = f
        .client
        .list_pods(&Selectors::on_node("n1"), CALL)
        .await
        .expect("list");
    assert_eq!(pods.len(), 1);
    let mut stream = f.client.watch_pods(&Selectors::on_node("n1"), FAST_BACKOFF);
    assert_eq!(initial_sync(&mut stream).await, ["p"]);
    let pod_requests: Vec<_> = f
        .server
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.path == "/api/v1/pods")
        .collect();
    let [list, watch] = &pod_requests[..] else {
        panic!("one list (list_pods) and one watch: {pod_requests:?}");
    };
    assert!(!list.is_watch() && watch.is_watch(), "{pod_requests:?}");
    assert_eq!(list.accept_encoding.as_deref(), Some("gzip"), "{list:?}");
    assert_eq!(watch.accept_encoding.as_deref(), Some("gzip"), "{watch:?}");
    assert_eq!(
        watch.query_param("sendInitialEvents").as_deref(),
        Some("true")
    );
    let timeout: u32 = watch
        .query_param("timeoutSeconds")
        .and_then(|t| t.parse().ok())
        .expect("timeoutSeconds");
    assert!((300..=600).contains(&timeout), "{watch:?}");
}

// A server that cannot stream a watch's initial state refuses the request (422); the watch then
// lists and watches, syncs and follows changes as before, and does not ask to stream again.
#[tokio::test]
async fn a_server_without_streaming_lists_is_listed_then_watched() {
    let Fixture { server, client, .. } = fixture_with(TestServerOptions {
        streaming_lists: false,
        ..Default::default()
    })
    .await;
    server.add_pod(pod("ns1", "a", "n1")).expect("pod");
    let mut stream = client.watch_pods(&Selectors::on_node("n1"), FAST_BACKOFF);
    assert_eq!(initial_sync(&mut stream).await, ["a"]);
    server.add_pod(pod("ns1", "b", "n1")).expect("pod");
    let deadline = Instant::now() + PATIENCE;
    let added = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.next()).await {
            Ok(Some(Ok(WatchEvent::Apply(p)))) => break p.metadata.name,
            Ok(Some(_)) => {}
            other => panic!("no event for b: {other:?}"),
        }
    };
    assert_eq!(added.as_deref(), Some("b"));
    let kinds: Vec<(bool, Option<String>)> = server
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.path == "/api/v1/pods")
        .map(|r| (r.is_watch(), r.query_param("sendInitialEvents")))
        .collect();
    assert_eq!(
        kinds,
        [
            (true, Some("true".to_string())),
            (false, None),
            (true, None)
        ],
        "a refused streaming watch, then a list and a watch"
    );
}

#[tokio::test]
async fn watcher_relists_after_410_expired() {
    let f = fixture().await;
    f.server.add_pod(pod("ns1", "a", "n1")).expect("pod");
    let mut stream = f.client.watch_pods(&Selectors::on_node("n1"), FAST_BACKOFF);
    assert_eq!(initial_sync(&mut stream).await, ["a"]);

    // The watcher is cut off, changes happen and the history is compacted meanwhile: resuming
    // from its last resourceVersion gets 410 Expired.
    f.server.set_fault(Fault::down()).await;
    f.server.add_pod(pod("ns1", "b", "n1")).expect("pod");
    f.server.compact();
    f.server.clear_faults().await;
    let deadline = Instant::now() + PATIENCE;
    let saw_gone = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.next()).await {
            Ok(Some(Err(WatchError::WatchError(status)))) => break status.code == 410,
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => break false,
        }
    };
    assert!(saw_gone, "watcher never reported 410 Expired");
    // It then lists again from scratch and carries on watching.
    let relisted = initial_sync(&mut stream).await;
    assert_eq!(relisted.len(), 2, "{relisted:?}");
    f.server.add_pod(pod("ns1", "c", "n1")).expect("pod");
    assert_eq!(name_of(&next_change(&mut stream).await).1, "c");
}

#[tokio::test]
async fn watcher_recovers_after_the_server_was_down() {
    let f = fixture().await;
    let mut stream = f.client.watch_pods(&Selectors::on_node("n1"), FAST_BACKOFF);
    assert!(initial_sync(&mut stream).await.is_empty());

    f.server.set_fault(Fault::down()).await;
    // The watcher notices (stream ends, reconnect refused) and reports an error.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.next()).await {
            Ok(Some(Err(_))) => break,
            Ok(Some(Ok(_))) => {}
            Ok(None) | Err(_) => panic!("no error while the server was down"),
        }
    }
    // A change made while it was down arrives after the restart (replayed from history).
    f.server
        .add_pod(pod("ns1", "while-down", "n1"))
        .expect("pod");
    f.server.clear_faults().await;
    assert_eq!(name_of(&next_change(&mut stream).await).1, "while-down");
}

#[tokio::test]
async fn slow_server_gives_a_timeout_error_in_time() {
    let f = fixture().await;
    f.server.add_pod(pod("ns1", "a", "n1")).expect("pod");
    f.server
        .set_fault(Fault::slow(Duration::from_secs(3)))
        .await;
    let started = Instant::now();
    let err = f
        .client
        .get_pod("ns1", "a", Duration::from_millis(200))
        .await
        .expect_err("too slow");
    let took = started.elapsed();
    assert!(matches!(err, KubeError::Timeout { .. }), "{err:?}");
    assert!(took < Duration::from_millis(800), "took {took:?}");
    assert_eq!(err.to_string(), "get pod ns1/a: no answer within 200ms");
}

#[tokio::test]
async fn injected_failures_map_to_typed_errors() {
    let f = fixture().await;
    f.server.add_pod(pod("ns1", "a", "n1")).expect("pod");
    f.server
        .add_namespace(namespace("ns1", json!({})))
        .expect("ns");

    // 403 only on the namespaces path: pods still work.
    f.server
        .set_fault(Fault::fail(403).on_path("/api/v1/namespaces/ns1/pods"))
        .await;
    let forbidden = f.client.get_pod("ns1", "a", CALL).await.expect_err("403");
    assert!(
        matches!(forbidden, KubeError::Forbidden { .. }),
        "{forbidden:?}"
    );
    f.client
        .get_namespace("ns1", CALL)
        .await
        .expect("other path unaffected");

    // A 500 for one request only, then success: what a retry loop sees.
    f.server.set_fault(Fault::fail(500).times(1)).await;
    let failed = f.client.get_pod("ns1", "a", CALL).await.expect_err("500");
    assert!(
        matches!(failed, KubeError::Api { code: 500, .. }) && failed.is_transient(),
        "{failed:?}"
    );
    f.client
        .get_pod("ns1", "a", CALL)
        .await
        .expect("fault used up");

    // Connection refused while down, quickly. A pooled connection the client has not yet seen
    // closed can fail once as a transport error first; a fresh connect must be refused.
    f.server.set_fault(Fault::down()).await;
    let started = Instant::now();
    let mut refused = f.client.get_pod("ns1", "a", CALL).await.expect_err("down");
    if matches!(refused, KubeError::Transport { .. }) {
        refused = f.client.get_pod("ns1", "a", CALL).await.expect_err("down");
    }
    assert!(
        matches!(refused, KubeError::ConnectRefused { .. }),
        "{refused:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    f.server.clear_faults().await;
    f.client.get_pod("ns1", "a", CALL).await.expect("back up");

    // A rotated token makes the old kubeconfig fail with Unauthorized; a rewritten one works.
    f.server.set_token(Some("rotated"));
    let unauthorized = f.client.get_pod("ns1", "a", CALL).await.expect_err("401");
    assert!(
        matches!(unauthorized, KubeError::Unauthorized { .. }),
        "{unauthorized:?}"
    );
    f.server.write_kubeconfig(&f.kubeconfig).expect("rewrite");
    let fresh = KubeClient::from_kubeconfig_file(&f.kubeconfig)
        .await
        .expect("client");
    fresh
        .get_pod("ns1", "a", CALL)
        .await
        .expect("new token accepted");
}

/// The test API server is its own test-only binary: the product answers `test-apiserver` as an
/// unknown role (usage, exit 2) instead of serving.
#[test]
fn the_product_binary_has_no_test_apiserver_role() {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_istio-cni-rs"))
        .args(["test-apiserver", "--port", "0"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn istio-cni-rs");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > PATIENCE {
            let _ = child.kill();
            panic!("istio-cni-rs test-apiserver kept running: the test role is in the product");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr)
        .expect("stderr");
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("usage:"), "{stderr}");
    assert!(!stderr.contains("test-apiserver"), "{stderr}");
}

#[tokio::test]
async fn server_follows_api_server_semantics() {
    use kube::api::{Api, Patch, PatchParams, WatchParams};
    use kube::core::WatchEvent as RawEvent;

    let server = TestApiServer::start_with(TestServerOptions {
        bookmark_interval: Duration::from_millis(50),
        ..TestServerOptions::default()
    })
    .await
    .expect("server");
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let client = KubeClient::from_kubeconfig_file(&kubeconfig)
        .await
        .expect("client");
    let pods: Api<Pod> = Api::namespaced(client.client().clone(), "ns1");
    let stored = server.add_pod(pod("ns1", "a", "n1")).expect("pod");
    let rv_after_add = server.resource_version();
    assert_eq!(
        stored.metadata.resource_version,
        Some(rv_after_add.to_string())
    );
    assert!(stored.metadata.uid.is_some());
    // Replacing keeps the identity unless the replacement brings its own (a re-created pod).
    let replaced = server.add_pod(pod("ns1", "a", "n1")).expect("replace");
    assert_eq!(replaced.metadata.uid, stored.metadata.uid);
    let mut recreated = pod("ns1", "a", "n1");
    recreated.metadata.uid = Some("0f9e8d7c-6b5a-4c3d-9e2f-1a0b9c8d7e6f".into());
    let recreated = server.add_pod(recreated).expect("recreate");
    assert_eq!(
        recreated.metadata.uid.as_deref(),
        Some("0f9e8d7c-6b5a-4c3d-9e2f-1a0b9c8d7e6f")
    );

    let status_code = |err: kube::Error| match err {
        kube::Error::Api(status) => (status.code, status.reason.clone()),
        other => panic!("not an API status: {other:?}"),
    };

    // A status patch cannot change spec; a main patch cannot change status.
    let sneaky =
        json!({"metadata": {"annotations": {"k": "v"}}, "spec": {"nodeName": "elsewhere"}});
    let after = pods
        .patch_status("a", &PatchParams::default(), &Patch::Strategic(&sneaky))
        .await
        .expect("status patch");
    assert_eq!(
        after.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some("n1")
    );
    assert_eq!(annotations(&after)["k"], "v");
    let sneaky = json!({"status": {"phase": "Failed"}});
    let after = pods
        .patch("a", &PatchParams::default(), &Patch::Merge(&sneaky))
        .await
        .expect("patch");
    assert_eq!(
        after.status.and_then(|s| s.phase).as_deref(),
        Some("Running")
    );

    // A no-op patch does not bump the resourceVersion.
    let rv = server.resource_version();
    let same = json!({"metadata": {"annotations": {"k": "v"}}});
    pods.patch("a", &PatchParams::default(), &Patch::Merge(&same))
        .await
        .expect("no-op");
    assert_eq!(server.resource_version(), rv);

    // A stale resourceVersion in the patch is a conflict; server-side apply is not supported.
    let stale = json!({"metadata": {"resourceVersion": "1", "labels": {"x": "y"}}});
    let err = pods
        .patch("a", &PatchParams::default(), &Patch::Merge(&stale))
        .await
        .expect_err("conflict");
    assert_eq!(status_code(err), (409, "Conflict".into()));
    let err = pods
        .patch("a", &PatchParams::apply("test"), &Patch::Apply(&same))
        .await
        .expect_err("415");
    assert_eq!(status_code(err).0, 415);

    // Unsupported field selectors are refused as the API server does.
    let err = pods
        .list(&kube::api::ListParams::default().fields("spec.bogus=1"))
        .await
        .expect_err("400");
    assert_eq!(status_code(err), (400, "BadRequest".into()));

    // Watching from a compacted resourceVersion: one ERROR 410 Expired event.
    server.add_pod(pod("ns1", "b", "n1")).expect("pod");
    server.compact();
    let mut old = pods
        .watch(&WatchParams::default(), &rv_after_add.to_string())
        .await
        .expect("watch starts")
        .boxed();
    match tokio::time::timeout(PATIENCE, old.next()).await {
        Ok(Some(Ok(RawEvent::Error(status)))) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"))
        }
        other => panic!("expected 410 Expired, got {other:?}"),
    }

    // Bookmarks carry the current resourceVersion when asked for.
    let current = server.resource_version().to_string();
    let mut fresh = pods
        .watch(&WatchParams::default(), &current)
        .await
        .expect("watch starts")
        .boxed();
    match tokio::time::timeout(PATIENCE, fresh.next()).await {
        Ok(Some(Ok(RawEvent::Bookmark(bookmark)))) => {
            assert_eq!(bookmark.metadata.resource_version, current)
        }
        other => panic!("expected a bookmark, got {other:?}"),
    }

    // Anything else is answered with a Status, as a real server would.
    let raw = client.client();
    let request = |method: &str, uri: &str| {
        axum::http::Request::builder()
            .method(method)
            .uri(uri)
            .body(Vec::new())
            .expect("request")
    };
    let err = raw
        .request_text(request("GET", "/apis/apps/v1/deployments"))
        .await
        .expect_err("404");
    assert_eq!(status_code(err).0, 404);
    let err = raw
        .request_text(request("PUT", "/api/v1/namespaces/ns1/pods/a"))
        .await
        .expect_err("405");
    assert_eq!(status_code(err).0, 405);

    // Waiting for something that never happens gives up on time.
    let started = Instant::now();
    assert!(!server.wait_until(Duration::from_millis(50), || false).await);
    assert!(started.elapsed() < Duration::from_secs(1));

    // No token: 401 before anything else.
    let mut anonymous = istio_cni::kube::config_from_kubeconfig_file(&kubeconfig)
        .await
        .expect("config");
    anonymous.auth_info = Default::default();
    let anonymous = kube::Client::try_from(anonymous).expect("client");
    let err = Api::<Pod>::namespaced(anonymous, "ns1")
        .get("a")
        .await
        .expect_err("401");
    assert_eq!(status_code(err).0, 401);
}

/// The TLS stack must stay rustls + ring: a second provider (aws-lc) makes client construction
/// panic at run time, and OpenSSL would break the static build. Cargo.lock lists every package
/// any target or platform could pull in, so it is a fast, strict stand-in for `cargo tree -i`.
#[test]
fn lockfile_has_no_aws_lc_or_openssl() {
    let lock = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.lock"))
        .expect("Cargo.lock is committed");
    for banned in [
        "aws-lc-sys",
        "aws-lc-rs",
        "openssl-sys",
        "openssl",
        "native-tls",
    ] {
        let entry = format!("name = \"{banned}\"\n");
        assert!(
            !lock.contains(&entry),
            "{banned} is in the dependency graph"
        );
    }
}

/// The very next item of a watch stream, which must be an event and come within `PATIENCE`.
async fn next_any<K>(stream: &mut WatchStream<K>) -> WatchEvent<K> {
    match tokio::time::timeout(PATIENCE, stream.next()).await {
        Ok(Some(Ok(event))) => event,
        Ok(Some(Err(e))) => panic!("watch error: {e}"),
        Ok(None) | Err(_) => panic!("no watch event within {PATIENCE:?}"),
    }
}

#[tokio::test]
async fn namespace_watcher_follows_label_changes() {
    let f = fixture().await;
    f.server
        .add_namespace(namespace("plain", json!({})))
        .expect("ns");
    let selectors = with_labels(Selectors::default(), "istio.io/dataplane-mode=ambient");
    let mut stream = f.client.watch_namespaces(&selectors, FAST_BACKOFF);
    assert!(matches!(next_any(&mut stream).await, WatchEvent::Init));
    assert!(matches!(next_any(&mut stream).await, WatchEvent::InitDone));
    // Labelling the namespace makes it appear for this watcher; unlabelling makes it disappear.
    f.server
        .add_namespace(namespace(
            "plain",
            json!({"istio.io/dataplane-mode": "ambient"}),
        ))
        .expect("label");
    assert!(
        matches!(next_any(&mut stream).await, WatchEvent::Apply(ns) if ns.metadata.name.as_deref() == Some("plain"))
    );
    f.server
        .add_namespace(namespace("plain", json!({})))
        .expect("unlabel");
    assert!(matches!(next_any(&mut stream).await, WatchEvent::Delete(_)));
}

#[tokio::test]
async fn names_that_are_not_kubernetes_names_never_reach_the_server() {
    let f = fixture().await;
    f.server.clear_requests();
    let pod_names = [
        ("../../etc", "a"),
        ("ns1", "a/b"),
        ("ns1", "../ns2/pods/x"),
        ("ns1", "p?watch=true"),
        ("ns 1", "a"),
        ("ns1", ""),
        ("", "a"),
        ("ns1", "a%2Fb"),
    ];
    for (namespace, name) in pod_names {
        let err = f
            .client
            .get_pod(namespace, name, CALL)
            .await
            .expect_err("invalid");
        assert!(
            matches!(err, KubeError::InvalidName { .. }) && !err.is_transient(),
            "{namespace:?}/{name:?}: {err:?}"
        );
        let patch = MetadataPatch::default().set_label("a", "b");
        for err in [
            f.client
                .patch_pod_metadata(PodPatchVia::Pod, namespace, name, &patch, CALL)
                .await
                .expect_err("invalid"),
            f.client
                .patch_pod_metadata(PodPatchVia::Status, namespace, name, &patch, CALL)
                .await
                .expect_err("invalid"),
            f.client
                .delete_pod(namespace, name, None, CALL)
                .await
                .expect_err("invalid"),
        ] {
            assert!(matches!(err, KubeError::InvalidName { .. }), "{err:?}");
        }
    }
    let err = f
        .client
        .get_namespace("../../etc", CALL)
        .await
        .expect_err("invalid");
    assert_eq!(
        err.to_string(),
        "get namespace: invalid namespace: \"../../etc\" is not a valid DNS-1123 label: \
         character '.' at offset 0 is not allowed (only ASCII letters, digits, '-' and, in pod names, '.')"
    );
    let bad_event_pod = pod("a/b", "p", "n1");
    let event = EventRecord {
        event_type: EventType::Warning,
        reason: "R".into(),
        message: "m".into(),
        component: "c".into(),
    };
    assert!(matches!(
        f.client
            .create_pod_event(&bad_event_pod, &event, CALL)
            .await,
        Err(KubeError::InvalidName { .. })
    ));
    assert_eq!(f.server.requests().len(), 0, "{:?}", f.server.requests());
}

#[tokio::test]
async fn daemonset_and_node_names_are_checked_before_any_request() {
    let f = fixture().await;
    f.server.clear_requests();
    for (namespace, name) in [
        ("../x", "ds"),
        ("ns1", "a/b"),
        ("ns1", ""),
        ("ns1", "ds?x=1"),
    ] {
        let err = f
            .client
            .get_daemonset(namespace, name, CALL)
            .await
            .expect_err("invalid");
        assert!(
            matches!(err, KubeError::InvalidName { .. }) && !err.is_transient(),
            "{namespace:?}/{name:?}: {err:?}"
        );
    }
    let err = f
        .client
        .get_node("../nodes/x", CALL)
        .await
        .expect_err("invalid");
    assert!(
        err.to_string()
            .starts_with("get node: invalid node name: \"../nodes/x\""),
        "{err}"
    );
    assert_eq!(f.server.requests().len(), 0, "{:?}", f.server.requests());
}

#[tokio::test]
async fn forbidden_names_the_missing_permission() {
    let f = fixture().await;
    f.server.add_pod(pod("ns1", "a", "n1")).expect("pod");
    f.server.set_fault(Fault::fail(403)).await;
    let err = f.client.get_pod("ns1", "a", CALL).await.expect_err("403");
    let text = err.to_string();
    assert!(
        text.contains("cannot get pods in namespace ns1") && text.contains("ClusterRole"),
        "{text}"
    );
    let err = f
        .client
        .list_namespaces(&Selectors::default(), CALL)
        .await
        .expect_err("403");
    assert!(
        err.to_string()
            .contains("cannot list namespaces at cluster scope"),
        "{err}"
    );
    let patch = MetadataPatch::default().set_annotation("a", "b");
    let err = f
        .client
        .patch_pod_metadata(PodPatchVia::Status, "ns1", "a", &patch, CALL)
        .await
        .expect_err("403");
    assert!(
        err.to_string()
            .contains("cannot patch pods/status in namespace ns1"),
        "{err}"
    );
}

/// The test API server speaks TLS by default: the kubeconfig it writes carries its CA, a client
/// without that CA is refused, plain HTTP is an option; single-pod GETs are counted per node.
#[tokio::test]
async fn test_server_serves_tls_by_default_and_counts_pod_gets_per_node() {
    let server = TestApiServer::start().await.expect("server");
    assert!(
        server.url().starts_with("https://127.0.0.1:"),
        "{}",
        server.url()
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let text = std::fs::read_to_string(&kubeconfig).expect("read");
    assert!(text.contains("certificate-authority-data: "), "{text}");
    server.add_pod(pod("ns1", "a", "n1")).expect("pod");
    server.add_pod(pod("ns1", "b", "n2")).expect("pod");
    let client = KubeClient::from_kubeconfig_file(&kubeconfig)
        .await
        .expect("client");
    client
        .get_pod("ns1", "a", CALL)
        .await
        .expect("GET over TLS");
    client
        .get_pod("ns1", "a", CALL)
        .await
        .expect("GET over TLS");
    client
        .get_pod("ns1", "b", CALL)
        .await
        .expect("GET over TLS");
    let _ = client.get_pod("ns1", "gone", CALL).await;
    assert_eq!(server.pod_gets_on_node("n1"), 2);
    assert_eq!(server.pod_gets_on_node("n2"), 1);
    assert_eq!(server.pod_gets_on_node(""), 1);

    // Without the CA (webpki roots only) the handshake fails: the CA is really checked.
    let mut untrusting = istio_cni::kube::config_from_kubeconfig_file(&kubeconfig)
        .await
        .expect("config");
    untrusting.root_cert = None;
    untrusting.default_retry = false;
    let untrusting = kube::Client::try_from(untrusting).expect("client");
    let err = kube::Api::<Pod>::namespaced(untrusting, "ns1")
        .get("a")
        .await
        .expect_err("unknown issuer");
    assert!(format!("{err:?}").contains("UnknownIssuer"), "{err:?}");

    let plain = TestApiServer::start_with(istio_cni_testing::apiserver::TestServerOptions {
        tls: false,
        ..Default::default()
    })
    .await
    .expect("plain server");
    assert!(plain.url().starts_with("http://"), "{}", plain.url());
    assert_eq!(plain.ca_pem(), None);
}

#[tokio::test]
async fn an_expired_server_certificate_is_a_permanent_tls_error_naming_the_server() {
    use istio_cni::kube::stores::{SyncError, spawn_pod_store};
    let Fixture { server, client, .. } = fixture_with(TestServerOptions {
        expired_certificate: true,
        ..Default::default()
    })
    .await;
    let err = client.get_pod("ns1", "a", CALL).await.unwrap_err();
    assert!(matches!(err, KubeError::Tls { .. }), "{err:?}");
    assert!(!err.is_transient() && err.needs_operator());
    let text = err.to_string();
    for part in [
        "get pod ns1/a",
        &server.url(),
        "invalid peer certificate: certificate expired",
    ] {
        assert!(text.contains(part), "{part:?} missing: {text}");
    }
    // A store on it gives up at once instead of waiting out its deadline.
    let stop = tokio_util::sync::CancellationToken::new();
    let pods = spawn_pod_store(&client, "n1", FAST_BACKOFF, stop.clone());
    let started = Instant::now();
    let err = pods.wait_synced(Duration::from_secs(30)).await.unwrap_err();
    assert!(matches!(err, SyncError::Refused { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5));
    // The store's first call is its watch, which streams the initial state.
    assert!(err.to_string().contains("watch pods"), "{err}");
    stop.cancel();
    assert!(server.requests().is_empty(), "no request gets through");
}
