use super::*;
use k8s_openapi::api::core::v1::Namespace;
use kube::runtime::watcher::Event;
use serde_json::json;

fn pod() -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                     "labels": {"app": "a"}, "annotations": {"sidecar.istio.io/status": "{}"},
                     "managedFields": [{"manager": "x"}], "ownerReferences": []},
        "spec": {"nodeName": "n1", "hostNetwork": false,
                 "initContainers": [{"name": "istio-validation", "image": "i"}],
                 "containers": [{"name": "istio-proxy", "image": "proxy", "args": ["proxy", "sidecar"],
                                 "env": [{"name": "A", "value": "1"},
                                         {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}],
                                 "securityContext": {"runAsUser": 1337, "runAsGroup": 1337, "privileged": false}}]},
        "status": {"phase": "Pending"}
    }))
    .unwrap()
}

fn synced_pods(pods: Vec<Pod>) -> PodStore {
    let store = PodStore::new();
    store.apply(Event::Init);
    for p in pods {
        store.apply(Event::InitApply(p));
    }
    store.apply(Event::InitDone);
    store
}

fn request(uid: &str) -> PodFactsRequest {
    PodFactsRequest {
        namespace: "ns".into(),
        name: "p".into(),
        uid: uid.into(),
        namespace_labels: true,
    }
}

fn not_yet(answer: &PodFactsAnswer) -> &str {
    match answer {
        PodFactsAnswer::NotYet { reason } => reason,
        other => panic!("expected not yet, got {other:?}"),
    }
}

#[test]
fn answers_the_trimmed_pod_only_for_the_same_uid_from_a_live_store() {
    let store = PodStore::new();
    assert!(not_yet(&answer(&request("u1"), &store, None)).contains("not synced"));
    let store = synced_pods(vec![pod()]);
    let namespaces = NamespaceStore::new();
    namespaces.apply(Event::Init);
    namespaces.apply(Event::InitApply(Namespace {
        metadata: ObjectMeta {
            name: Some("ns".into()),
            labels: Some([("istio.io/dataplane-mode".into(), "ambient".into())].into()),
            ..Default::default()
        },
        ..Default::default()
    }));
    namespaces.apply(Event::InitDone);
    match answer(&request("u1"), &store, Some(&namespaces)) {
        PodFactsAnswer::Pod {
            pod: got,
            namespace_labels,
        } => {
            assert_eq!(*got, trim_for_plugin(&pod()));
            assert!(got.metadata.managed_fields.is_none() && got.status.is_none());
            assert_eq!(
                namespace_labels.unwrap()["istio.io/dataplane-mode"],
                "ambient"
            );
        }
        other => panic!("{other:?}"),
    }
    // A pod re-created under the same name: the store's copy is another object.
    assert!(not_yet(&answer(&request("u2"), &store, None)).contains("uid"));
    let mut other = request("u1");
    other.name = "q".into();
    assert!(not_yet(&answer(&other, &store, None)).contains("not in the store"));
    // A failed watch may have missed an update: nothing is answered until the next event.
    store.mark_watch_failed();
    assert!(not_yet(&answer(&request("u1"), &store, None)).contains("watch failed"));
    // Namespace labels only from a live namespace store.
    store.apply(Event::Apply(pod()));
    namespaces.mark_watch_failed();
    match answer(&request("u1"), &store, Some(&namespaces)) {
        PodFactsAnswer::Pod {
            namespace_labels, ..
        } => assert_eq!(namespace_labels, None),
        other => panic!("{other:?}"),
    }
}

#[test]
fn trimming_keeps_what_the_plugin_reads() {
    let t = trim_for_plugin(&pod());
    let proxy = &t.spec.as_ref().unwrap().containers[0];
    assert_eq!(proxy.args.as_deref().unwrap(), ["proxy", "sidecar"]);
    assert_eq!(proxy.image, None);
    let env = proxy.env.as_ref().unwrap();
    assert_eq!(
        (env[0].value.as_deref(), env[1].value.as_deref()),
        (Some("1"), None)
    );
    let sc = proxy.security_context.as_ref().unwrap();
    assert_eq!(
        (sc.run_as_user, sc.run_as_group, sc.privileged),
        (Some(1337), Some(1337), None)
    );
    assert_eq!(
        t.spec.as_ref().unwrap().init_containers.as_ref().unwrap()[0].name,
        "istio-validation"
    );
    assert_eq!(t.metadata.labels, pod().metadata.labels);
    assert_eq!(t.metadata.annotations, pod().metadata.annotations);
}

#[test]
fn malformed_requests_get_an_error_answer() {
    let store = synced_pods(vec![pod()]);
    let error = |line: &[u8]| match answer_line(line, &store, None) {
        PodFactsAnswer::Error { message } => message,
        other => panic!("{other:?}"),
    };
    assert!(error(b"not json\n").contains("not a pod-facts request"));
    assert!(
        error(br#"{"namespace":"ns","name":"p","uid":"u1","extra":1}"#).contains("unknown field")
    );
    assert!(error(br#"{"namespace":"../x","name":"p","uid":"u1"}"#).contains("names no pod"));
    assert!(error(br#"{"namespace":"ns","name":"p","uid":""}"#).contains("uid"));
    assert!(error(&vec![b' '; MAX_REQUEST_BYTES + 1]).contains("longer"));
    let ok = answer_line(&request("u1").encode(), &store, None);
    assert!(matches!(ok, PodFactsAnswer::Pod { .. }));
    // Both ends speak the same line.
    assert_eq!(PodFactsAnswer::decode(&ok.encode()).unwrap(), ok);
    assert_eq!(
        PodFactsRequest::decode(&request("u1").encode()).unwrap(),
        request("u1")
    );
}
