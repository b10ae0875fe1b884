//! Unit tests of the node stores: events, re-lists, liveness, sync deadlines and refusals.

use super::*;

fn pod(ns: &str, name: &str, rv: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            namespace: Some(ns.into()),
            name: Some(name.into()),
            resource_version: Some(rv.into()),
            managed_fields: Some(vec![Default::default()]),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn rv(ev: &StoreEvent<Pod>) -> (&'static str, String) {
    let v = |p: &Pod| p.metadata.resource_version.clone().unwrap_or_default();
    match ev {
        StoreEvent::Added(p) => ("add", v(p)),
        StoreEvent::Updated { old, new } => ("update", format!("{}->{}", v(old), v(new))),
        StoreEvent::Deleted(p) => ("delete", v(p)),
    }
}

fn drain(rx: &mut Subscription<Pod>) -> Vec<(&'static str, String)> {
    std::iter::from_fn(|| rx.try_recv().flatten())
        .map(|e| rv(&e))
        .collect()
}

#[test]
fn updates_carry_the_old_object_and_deletes_the_last_state() {
    let store = PodStore::new();
    let mut rx = store.subscribe();
    store.apply(watcher::Event::Init);
    store.apply(watcher::Event::InitApply(pod("a", "p", "1")));
    assert!(!store.is_synced() && store.is_empty());
    store.apply(watcher::Event::InitDone);
    assert!(store.is_synced());
    assert_eq!(drain(&mut rx), [("add", "1".into())]);
    store.apply(watcher::Event::Apply(pod("a", "p", "2")));
    store.apply(watcher::Event::Apply(pod("a", "p", "2")));
    assert_eq!(drain(&mut rx), [("update", "1->2".into())]);
    store.apply(watcher::Event::Delete(pod("a", "p", "3")));
    assert_eq!(drain(&mut rx), [("delete", "3".into())]);
    assert!(store.get("a/p").is_none());
}

/// A subscriber that does not read holds at most three changes per object however many arrive,
/// and reads them as it would have seen them: updates folded from the first old to the last new
/// object, an add kept apart from the updates after it and the delete before it, deletes in a row
/// as the newest.
#[test]
fn a_slow_subscriber_holds_changes_per_object_not_per_event() {
    let store = PodStore::new();
    store.apply(watcher::Event::Init);
    store.apply(watcher::Event::InitApply(pod("a", "p", "1")));
    store.apply(watcher::Event::InitDone);
    let mut rx = store.subscribe();
    for n in 2..10_000 {
        store.apply(watcher::Event::Apply(pod("a", "p", &n.to_string())));
    }
    store.apply(watcher::Event::Apply(pod("a", "q", "1")));
    assert_eq!(rx.pending(), 3);
    assert_eq!(
        drain(&mut rx),
        [
            ("add", "1".into()),
            ("update", "1->9999".into()),
            ("add", "1".into())
        ]
    );
    for round in 0..1_000 {
        store.apply(watcher::Event::Delete(pod("a", "p", &format!("d{round}"))));
        store.apply(watcher::Event::Apply(pod("a", "p", &format!("n{round}"))));
        store.apply(watcher::Event::Apply(pod("a", "p", &format!("u{round}"))));
        assert!(rx.pending() <= 3, "round {round}: {} pending", rx.pending());
    }
    assert_eq!(
        drain(&mut rx),
        [
            ("delete", "d999".into()),
            ("add", "n999".into()),
            ("update", "n999->u999".into())
        ]
    );
    store.apply(watcher::Event::Apply(pod("a", "p", "v")));
    store.apply(watcher::Event::Delete(pod("a", "p", "gone")));
    assert_eq!(drain(&mut rx), [("delete", "gone".into())]);
}

#[tokio::test]
async fn a_subscription_ends_when_the_store_is_gone_after_what_is_pending() {
    let store = PodStore::new();
    let mut rx = store.subscribe();
    store.apply(watcher::Event::Apply(pod("a", "p", "1")));
    drop(store);
    assert!(matches!(rx.recv().await, Some(StoreEvent::Added(_))));
    assert!(rx.recv().await.is_none());
}

#[test]
fn a_relist_comes_out_as_the_changes_it_implies_and_late_subscribers_get_a_replay() {
    let store = PodStore::new();
    let relist = |pods: [Pod; 3]| {
        store.apply(watcher::Event::Init);
        for p in pods {
            store.apply(watcher::Event::InitApply(p));
        }
        store.apply(watcher::Event::InitDone);
    };
    relist([
        pod("a", "keep", "1"),
        pod("a", "change", "1"),
        pod("a", "gone", "1"),
    ]);
    let mut first = store.subscribe();
    let mut replay = drain(&mut first);
    replay.sort();
    assert_eq!(replay.len(), 3);
    let mut second = store.subscribe();
    let _ = drain(&mut second);
    relist([
        pod("a", "keep", "1"),
        pod("a", "change", "5"),
        pod("a", "new", "6"),
    ]);
    for rx in [&mut first, &mut second] {
        let mut got = drain(rx);
        got.sort();
        assert_eq!(
            got,
            [
                ("add", "6".into()),
                ("delete", "1".into()),
                ("update", "1->5".into())
            ]
        );
    }
    assert_eq!(store.len(), 3);
    assert!(
        store
            .get("a/change")
            .unwrap()
            .metadata
            .managed_fields
            .is_none()
    );
    assert_eq!(store.pods_in_namespace("a").len(), 3);
    assert!(store.pods_in_namespace("b").is_empty());
}

#[test]
fn live_means_synced_and_no_watch_failure_since_the_last_event() {
    let store = PodStore::new();
    assert!(!store.is_live());
    store.apply(watcher::Event::Init);
    store.apply(watcher::Event::InitDone);
    assert!(store.is_live());
    store.mark_watch_failed();
    assert!(!store.is_live() && store.is_synced());
    store.apply(watcher::Event::Apply(pod("a", "p", "2")));
    assert!(store.is_live());
    // A re-list in progress may still hold deleted pods: not live until it is done.
    store.apply(watcher::Event::Init);
    store.apply(watcher::Event::InitApply(pod("a", "q", "3")));
    assert!(!store.is_live());
    store.apply(watcher::Event::InitDone);
    assert!(store.is_live() && store.get("a/p").is_none());
}

#[test]
fn namespaces_keep_labels_only_and_sync_waits_have_a_deadline() {
    let store = NamespaceStore::new();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let err = rt
        .block_on(store.wait_synced(Duration::from_millis(20)))
        .unwrap_err();
    assert!(err.to_string().contains("namespace store did not sync"));
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some("shop".into()),
            labels: Some([("istio.io/dataplane-mode".to_string(), "ambient".to_string())].into()),
            annotations: Some([("big".to_string(), "x".repeat(100))].into()),
            ..Default::default()
        },
        spec: Some(Default::default()),
        ..Default::default()
    };
    store.apply(watcher::Event::Init);
    store.apply(watcher::Event::InitApply(ns));
    store.apply(watcher::Event::InitDone);
    rt.block_on(store.wait_synced(Duration::from_millis(20)))
        .unwrap();
    let kept = store.get("shop").unwrap();
    assert!(kept.metadata.annotations.is_none() && kept.spec.is_none());
    assert_eq!(
        namespace_labels(&store, "shop").unwrap()["istio.io/dataplane-mode"],
        "ambient"
    );
    assert_eq!(namespace_labels(&store, "other"), None);
}

fn forbidden() -> KubeError {
    let status = kube::core::Status::failure("pods is forbidden", "Forbidden").with_code(403);
    KubeError::from_call(
        Call::ListPods,
        "node=n1",
        kube::Error::Api(Box::new(status)),
    )
}

#[test]
fn a_refused_first_list_ends_the_wait_at_once_and_a_later_sync_wins() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = PodStore::new();
    store.refuse(forbidden());
    let started = std::time::Instant::now();
    let err = rt
        .block_on(store.wait_synced(Duration::from_secs(30)))
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(1));
    let text = err.to_string();
    for part in [
        "pod store",
        "list pods",
        "forbidden",
        "ClusterRole",
        "list and watch",
    ] {
        assert!(text.contains(part), "{part:?} missing: {text}");
    }
    assert!(!store.is_synced());
    // RBAC fixed: the watcher's next list syncs the store, and the wait succeeds.
    store.apply(watcher::Event::Init);
    store.apply(watcher::Event::InitDone);
    rt.block_on(store.wait_synced(Duration::from_millis(20)))
        .unwrap();
    // Once synced, a later refusal does not unsync it (the store only goes not-live).
    assert!(
        store.refuse(forbidden()),
        "the first refusal after the sync is told"
    );
    assert!(store.is_synced());
    rt.block_on(store.wait_synced(Duration::from_millis(20)))
        .unwrap();
}

fn watch_forbidden() -> KubeError {
    let status = kube::core::Status::failure("pods is forbidden", "Forbidden").with_code(403);
    KubeError::from_call(
        Call::WatchPods,
        "node=n1",
        kube::Error::Api(Box::new(status)),
    )
}

/// A watch refused after the sync is not forgotten: the store says so until an event (or an
/// accepted probe) shows the watch allowed again, and a follower hears each change.
#[test]
fn a_watch_refused_after_the_sync_counts_until_it_is_allowed_again() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = PodStore::new();
    store.apply(watcher::Event::Init);
    store.apply(watcher::Event::InitDone);
    assert_eq!(store.refused_watch(), None);
    let heard = Arc::new(Mutex::new(Vec::new()));
    let stop = CancellationToken::new();
    let follower = {
        let (store, heard, stop) = (store.clone(), heard.clone(), stop.clone());
        rt.spawn(async move {
            store
                .follow_watch_refusals(stop, |why| heard.lock().push(why))
                .await
        })
    };
    let settle = || rt.block_on(async { tokio::time::sleep(Duration::from_millis(20)).await });
    settle();
    assert!(store.refuse(watch_forbidden()));
    assert!(
        !store.refuse(watch_forbidden()),
        "told once, not on every retry"
    );
    settle();
    let why = store.refused_watch().expect("refused");
    for part in ["pod store", "watch pods", "forbidden", "ClusterRole"] {
        assert!(why.contains(part), "{part:?} missing: {why}");
    }
    assert!(store.is_synced());
    // An event of the resumed watch ends it.
    store.apply(watcher::Event::Apply(pod("a", "p", "2")));
    assert!(store.watch_allowed());
    assert!(!store.watch_allowed());
    settle();
    assert_eq!(store.refused_watch(), None);
    stop.cancel();
    rt.block_on(follower).unwrap();
    let heard = heard.lock().clone();
    assert_eq!(heard.len(), 3, "{heard:?}");
    assert_eq!(heard[0], None);
    assert_eq!(heard[1].as_deref(), Some(why.as_str()));
    assert_eq!(heard[2], None);
}

#[test]
fn pods_are_found_by_address_through_updates_deletes_and_relists() {
    let with_ip = |name: &str, rv: &str, ip: &str| {
        let mut p = pod("a", name, rv);
        p.status = Some(k8s_openapi::api::core::v1::PodStatus {
            pod_ip: Some(ip.into()),
            ..Default::default()
        });
        p
    };
    let names = |store: &PodStore, ip: &str| -> Vec<String> {
        let mut n: Vec<String> = store
            .at_address(ip.parse().unwrap())
            .iter()
            .map(|p| p.metadata.name.clone().unwrap_or_default())
            .collect();
        n.sort();
        n
    };
    let store = PodStore::new();
    store.apply(watcher::Event::Init);
    store.apply(watcher::Event::InitApply(with_ip("p", "1", "10.0.0.1")));
    store.apply(watcher::Event::InitDone);
    assert_eq!(names(&store, "10.0.0.1"), ["p"]);
    // A new IP moves the pod; a finished pod's IP reused by another: both found.
    store.apply(watcher::Event::Apply(with_ip("p", "2", "10.0.0.2")));
    store.apply(watcher::Event::Apply(with_ip("q", "3", "10.0.0.2")));
    assert!(names(&store, "10.0.0.1").is_empty());
    assert_eq!(names(&store, "10.0.0.2"), ["p", "q"]);
    assert_eq!(
        names(&store, "::ffff:10.0.0.2"),
        ["p", "q"],
        "v4-mapped is the same IP"
    );
    store.apply(watcher::Event::Delete(with_ip("p", "4", "10.0.0.2")));
    assert_eq!(names(&store, "10.0.0.2"), ["q"]);
    // A re-list replaces the index with what it found.
    store.apply(watcher::Event::Init);
    store.apply(watcher::Event::InitApply(with_ip("r", "5", "10.0.0.3")));
    store.apply(watcher::Event::InitDone);
    assert!(names(&store, "10.0.0.2").is_empty());
    assert_eq!(names(&store, "10.0.0.3"), ["r"]);
}
