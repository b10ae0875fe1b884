use super::*;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::watcher::Event;
use serde_json::json;

fn pod() -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "7"},
        "spec": {"nodeName": "n1", "containers": [{"name": "app"}]}
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

fn query(uid: &str) -> Query<'_> {
    Query {
        namespace: "ns",
        name: "p",
        uid,
        namespace_labels: true,
    }
}

#[test]
fn answers_only_for_the_same_uid_from_a_live_store() {
    let store = PodStore::new();
    assert_eq!(
        stored_pod(&query("u1"), &store, None).unwrap_err(),
        NotYet::NotSynced
    );
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
    let (got, labels) = stored_pod(&query("u1"), &store, Some(&namespaces)).unwrap();
    assert_eq!(*got, pod());
    assert_eq!(labels.unwrap()["istio.io/dataplane-mode"], "ambient");
    // A pod re-created under the same name: the store's copy is another object.
    let err = stored_pod(&query("u2"), &store, None).unwrap_err();
    assert!(matches!(err, NotYet::OtherUid { .. }), "{err}");
    let other = Query {
        name: "q",
        ..query("u1")
    };
    let err = stored_pod(&other, &store, None).unwrap_err();
    assert!(err.to_string().contains("not in the store"), "{err}");
    // A failed watch may have missed an update: nothing is answered until the next event.
    store.mark_watch_failed();
    assert_eq!(
        stored_pod(&query("u1"), &store, None).unwrap_err(),
        NotYet::WatchFailed
    );
    // Namespace labels only from a live namespace store.
    store.apply(Event::Apply(pod()));
    namespaces.mark_watch_failed();
    let (_, labels) = stored_pod(&query("u1"), &store, Some(&namespaces)).unwrap();
    assert_eq!(labels, None);
}
