//! One test per row of the state table, and the informer cases.

use super::*;
use crate::kube::selector::testing::{chart_default, labels};
use serde_json::{Value, json};

const AMBIENT: (&str, &str) = ("istio.io/dataplane-mode", "ambient");

/// The chart's default selectors; `kube-system` excluded.
fn policy() -> EnrolmentPolicy {
    EnrolmentPolicy::new(&chart_default(), &["kube-system".into()], "istio-system").unwrap()
}

/// A pod in `ns`, patched with `extra` (merged into the object).
fn pod(ns: &str, extra: Value) -> Arc<Pod> {
    let mut base = json!({
        "metadata": {"name": "app", "namespace": ns, "uid": "u1", "resourceVersion": "1"},
        "spec": {"containers": [{"name": "app"}]},
        "status": {"phase": "Running", "podIP": "10.0.0.5", "podIPs": [{"ip": "10.0.0.5"}]}
    });
    merge(&mut base, extra);
    Arc::new(serde_json::from_value(base).unwrap())
}

fn merge(a: &mut Value, b: Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

fn annotated(state: &str) -> Value {
    json!({"metadata": {"annotations": {"ambient.istio.io/redirection": state}}})
}

/// What an update from `old` to `new` used to carry, as the level-based world: `old` held by
/// the agent when it was annotated (enrolled or pending), with its IPs as the probe entries.
struct Update {
    old: Arc<Pod>,
}

fn update(old: &Arc<Pod>, _new: &Arc<Pod>) -> Update {
    Update { old: old.clone() }
}

fn same(p: &Arc<Pod>) -> Update {
    update(p, p)
}

fn kind(a: &Action) -> &'static str {
    match a {
        Action::Skip(_) => "skip",
        Action::RequeueNamespaceMissing => "requeue",
        Action::Add { .. } => "add",
        Action::Remove { deleted: true, .. } => "remove-deleted",
        Action::Remove { deleted: false, .. } => "remove",
        Action::ReassertProbes { .. } => "reassert",
        Action::WriteOwedAnnotation { .. } => "annotate",
    }
}

fn held(p: &Arc<Pod>) -> Vec<Held> {
    if pod::redirection(p) == Redirection::None {
        return vec![];
    }
    vec![Held {
        pod: p.clone(),
        probe_ips: Some(pod::ips(p)),
        annotation_owed: false,
        awaiting_ztunnel: false,
        cni_ips: vec![],
    }]
}

/// The one action for the current pod (no other pod of the name involved).
fn run(ev: &Update, current: Option<&Arc<Pod>>, ns: Option<&BTreeMap<String, String>>) -> Action {
    let held = held(&ev.old);
    let now = Now {
        current,
        held: if current.is_some() { &held } else { &[] },
        gone: None,
        namespace_labels: ns,
    };
    let mut actions = decide(&now, &policy());
    assert_eq!(actions.len(), 1, "{actions:?}");
    actions.remove(0)
}

/// What a delete of `p` (gone from the store) decides in a namespace with `ns` labels.
fn on_delete(p: &Arc<Pod>, ns: Option<&BTreeMap<String, String>>) -> &'static str {
    let now = Now {
        current: None,
        held: &[],
        gone: Some(p),
        namespace_labels: ns,
    };
    let actions = decide(&now, &policy());
    assert_eq!(actions.len(), 1, "{actions:?}");
    kind(&actions[0])
}

#[test]
fn update_with_namespace_not_cached_is_requeued() {
    let p = pod("shop", json!({}));
    assert_eq!(kind(&run(&same(&p), Some(&p), None)), "requeue");
}

#[test]
fn update_for_a_pod_gone_from_the_store_is_skipped_but_delete_still_handled() {
    let p = pod("shop", annotated("enabled"));
    let ns = labels(&[AMBIENT]);
    assert_eq!(kind(&run(&same(&p), None, Some(&ns))), "skip");
    assert_eq!(on_delete(&p, Some(&ns)), "remove-deleted");
}

#[test]
fn terminal_enrolled_or_pending_pod_is_removed_with_the_old_object() {
    let ns = labels(&[AMBIENT]);
    for state in ["enabled", "pending"] {
        let old = pod("shop", annotated(state));
        let mut done = annotated(state);
        merge(
            &mut done,
            json!({"status": {"phase": "Succeeded", "podIP": null, "podIPs": null}}),
        );
        let new = pod("shop", done);
        match run(&update(&old, &new), Some(&new), Some(&ns)) {
            Action::Remove {
                ips,
                deleted,
                terminal,
                ..
            } => {
                assert!(deleted && terminal);
                // The IPs held for it, which the probe set must lose (the object has none).
                assert_eq!(ips.len(), 1, "{state}");
            }
            other => panic!("{state}: {other:?}"),
        }
    }
}

#[test]
fn terminal_pod_never_enrolled_is_skipped() {
    let ns = labels(&[AMBIENT]);
    let p = pod("shop", json!({"status": {"phase": "Failed"}}));
    assert_eq!(kind(&run(&same(&p), Some(&p), Some(&ns))), "skip");
}

#[test]
fn probe_ips_reasserted_only_when_ips_change() {
    let ns = labels(&[AMBIENT]);
    let old = pod("shop", annotated("enabled"));
    assert_eq!(kind(&run(&same(&old), Some(&old), Some(&ns))), "skip");
    let mut moved = annotated("enabled");
    merge(
        &mut moved,
        json!({"status": {"podIPs": [{"ip": "10.0.0.5"}, {"ip": "fd00::5"}]}}),
    );
    let new = pod("shop", moved);
    match run(&update(&old, &new), Some(&new), Some(&ns)) {
        Action::ReassertProbes { ips, .. } => assert_eq!(ips.len(), 2),
        other => panic!("{other:?}"),
    }
}

/// A second address the ADD verified (in no status) stays among the pod's probe entries: a status
/// holding only the first is no change, and a moved status keeps the second.
#[test]
fn a_recorded_cni_address_stays_in_the_probe_entries() {
    let ns = labels(&[AMBIENT]);
    let p = pod("shop", annotated("enabled"));
    let first = pod::ips(&p);
    let second: std::net::IpAddr = "10.0.0.201".parse().unwrap();
    let mut held = held(&p);
    held[0].cni_ips = vec![first[0], second];
    held[0].probe_ips = Some(vec![first[0], second]);
    let now = |current: &Arc<Pod>, held: &[Held]| {
        let now = Now {
            current: Some(current),
            held,
            gone: None,
            namespace_labels: Some(&ns),
        };
        decide(&now, &policy())
    };
    assert_eq!(kind(&now(&p, &held)[0]), "skip");
    let mut moved = annotated("enabled");
    merge(
        &mut moved,
        json!({"status": {"podIPs": [{"ip": "10.0.0.6"}]}}),
    );
    let q = pod("shop", moved);
    match &now(&q, &held)[0] {
        Action::ReassertProbes { ips, .. } => {
            assert_eq!(ips, &vec!["10.0.0.6".parse().unwrap(), first[0], second])
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn enrolled_and_still_selected_is_no_change() {
    let ns = labels(&[AMBIENT]);
    let p = pod("shop", annotated("enabled"));
    assert_eq!(kind(&run(&same(&p), Some(&p), Some(&ns))), "skip");
    // Not selected and not enrolled: no change either.
    let q = pod("plain", json!({}));
    assert_eq!(kind(&run(&same(&q), Some(&q), Some(&labels(&[])))), "skip");
}

#[test]
fn unlabelling_the_namespace_or_pod_removes() {
    let p = pod("shop", annotated("enabled"));
    assert_eq!(
        kind(&run(&same(&p), Some(&p), Some(&labels(&[])))),
        "remove"
    );
    let mut opted_out = annotated("enabled");
    merge(
        &mut opted_out,
        json!({"metadata": {"labels": {"istio.io/dataplane-mode": "none"}}}),
    );
    let q = pod("shop", opted_out);
    assert_eq!(
        kind(&run(&same(&q), Some(&q), Some(&labels(&[AMBIENT])))),
        "remove"
    );
}

#[test]
fn excluded_namespace_removes_enrolled_and_never_adds() {
    let ns = labels(&[AMBIENT]);
    let enrolled = pod("kube-system", annotated("enabled"));
    assert_eq!(
        kind(&run(&same(&enrolled), Some(&enrolled), Some(&ns))),
        "remove"
    );
    let fresh = pod("kube-system", json!({}));
    assert_eq!(kind(&run(&same(&fresh), Some(&fresh), Some(&ns))), "skip");
    assert_eq!(on_delete(&enrolled, Some(&ns)), "remove-deleted");
}

#[test]
fn pod_without_ip_is_not_added() {
    let ns = labels(&[AMBIENT]);
    let p = pod("shop", json!({"status": {"podIP": null, "podIPs": null}}));
    assert_eq!(kind(&run(&same(&p), Some(&p), Some(&ns))), "skip");
}

#[test]
fn selected_pod_is_added_with_every_ip_and_pending_is_retried() {
    let ns = labels(&[AMBIENT]);
    let p = pod(
        "shop",
        json!({"status": {"podIPs": [{"ip": "10.0.0.5"}, {"ip": "fd00::5"}]}}),
    );
    match run(&same(&p), Some(&p), Some(&ns)) {
        Action::Add { ips, .. } => assert_eq!(ips.len(), 2),
        other => panic!("{other:?}"),
    }
    // A pod labelled for ambient itself, in a plain namespace.
    let own = pod(
        "plain",
        json!({"metadata": {"labels": {"istio.io/dataplane-mode": "ambient"}}}),
    );
    assert_eq!(
        kind(&run(&same(&own), Some(&own), Some(&labels(&[])))),
        "add"
    );
    // Partially enrolled and still selected: add again.
    let partial = pod("shop", annotated("pending"));
    assert_eq!(
        kind(&run(&same(&partial), Some(&partial), Some(&ns))),
        "add"
    );
}

#[test]
fn host_network_sidecar_and_ztunnel_pods_are_never_added() {
    let ns = labels(&[AMBIENT]);
    for extra in [
        json!({"spec": {"hostNetwork": true}}),
        json!({"metadata": {"annotations": {"sidecar.istio.io/status": "{}"}}}),
    ] {
        let p = pod("shop", extra);
        assert_eq!(kind(&run(&same(&p), Some(&p), Some(&ns))), "skip");
    }
    let zt = pod(
        "istio-system",
        json!({"metadata": {"labels": {"app": "ztunnel", "istio.io/dataplane-mode": "ambient"}}}),
    );
    assert_eq!(kind(&run(&same(&zt), Some(&zt), Some(&ns))), "skip");
}

#[test]
fn stale_event_for_an_already_enrolled_pod_does_not_undo_it() {
    // The event says "not annotated", the store says enabled: decided on the store's view.
    let ns = labels(&[AMBIENT]);
    let stale = pod("shop", json!({}));
    let current = pod("shop", annotated("enabled"));
    assert_eq!(kind(&run(&same(&stale), Some(&current), Some(&ns))), "skip");
}

#[test]
fn delete_of_a_never_enrolled_unselected_pod_is_skipped_and_of_a_selected_one_removed() {
    let p = pod("plain", json!({}));
    assert_eq!(on_delete(&p, Some(&labels(&[]))), "skip");
    assert_eq!(on_delete(&p, None), "skip");
    let q = pod("shop", json!({}));
    assert_eq!(on_delete(&q, Some(&labels(&[AMBIENT]))), "remove-deleted");
}

#[test]
fn namespace_rows() {
    let pol = policy();
    let ambient = labels(&[AMBIENT]);
    let plain = labels(&[("team", "a")]);
    assert!(
        namespace_reevaluates(None, &plain, &pol),
        "namespace Add always"
    );
    assert!(namespace_reevaluates(Some(&plain), &ambient, &pol));
    assert!(namespace_reevaluates(Some(&ambient), &plain, &pol));
    assert!(!namespace_reevaluates(
        Some(&plain),
        &labels(&[("team", "b")]),
        &pol
    ));
    let pods = [
        pod(
            "istio-system",
            json!({"metadata": {"labels": {"app": "ztunnel"}}}),
        ),
        pod("istio-system", json!({"metadata": {"name": "other"}})),
    ];
    assert_eq!(reevaluated_keys(&pods, &pol), ["istio-system/other"]);
}

#[test]
fn snapshot_holds_enabled_running_pods_only() {
    let pol = policy();
    assert!(in_snapshot(&pod("shop", annotated("enabled")), &pol));
    assert!(!in_snapshot(&pod("shop", annotated("pending")), &pol));
    let mut done = annotated("enabled");
    merge(&mut done, json!({"status": {"phase": "Succeeded"}}));
    assert!(!in_snapshot(&pod("shop", done), &pol));
}
