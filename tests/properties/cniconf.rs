//! The CNI config files install-cni reads and merges: classification of any file, and the merge
//! laws (insert twice = insert once, remove after insert leaves only the primary's plugins, the
//! primary's plugins are never lost), plus marshal/classify round trips.

use istio_cni::install::cniconf::{self, ConfError, ISTIO_TYPE, IstioPlugin, Kind};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

use super::{any_json, config as cases, nasty_string};

fn istio(level: &str, ambient: bool) -> IstioPlugin {
    IstioPlugin {
        cni_version: cniconf::CNI_VERSION.into(),
        name: ISTIO_TYPE.into(),
        plugin_type: ISTIO_TYPE.into(),
        ipam: Map::new(),
        dns: Map::new(),
        plugin_log_level: level.into(),
        cni_agent_run_dir: "/var/run/istio-cni".into(),
        ambient_enabled: ambient,
        enablement_selectors: vec![],
        exclude_namespaces: None,
        pod_namespace: "istio-system".into(),
        native_nftables: false,
        enable_ambient_detection_retry: false,
        force_iptables_binary: None,
    }
}

/// A plugin entry: the primary's kind, or a stale istio-cni entry with any content.
pub fn plugin() -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => (prop::sample::select(&["calico", "bandwidth", "portmap", "cilium-cni", "flannel"][..]), any_json())
            .prop_map(|(t, extra)| json!({"type": t, "extra": extra})),
        1 => any_json().prop_map(|extra| json!({"type": ISTIO_TYPE, "stale": extra})),
    ]
}

pub fn primary_list() -> impl Strategy<Value = Value> {
    ("[a-z0-9-]{1,16}", prop::collection::vec(plugin(), 1..6), any_json())
        .prop_map(|(name, plugins, extra)| json!({"cniVersion": "1.0.0", "name": name, "plugins": plugins, "x-extra": extra}))
}

/// A value with every number as the f64 it stands for. `marshal` writes numbers as Go's encoder
/// does (`0.0` as `0`, `3.7e17` as `370000000000000000`), so a float can read back as an integer:
/// the same number under another serde_json tag. Integers are written exactly (unit tests in
/// `cniconf` hold that), so both sides convert alike.
fn numbers_as_go_writes_them(v: Value) -> Value {
    match v {
        Value::Number(n) => n.as_f64().map_or(Value::Number(n), |f| json!(f)),
        Value::Array(a) => Value::Array(a.into_iter().map(numbers_as_go_writes_them).collect()),
        Value::Object(o) => Value::Object(
            o.into_iter()
                .map(|(k, v)| (k, numbers_as_go_writes_them(v)))
                .collect(),
        ),
        other => other,
    }
}

fn non_istio(list: &Value) -> Vec<Value> {
    list["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["type"] != ISTIO_TYPE)
        .cloned()
        .collect()
}

proptest! {
    #![proptest_config(cases())]

    #[test]
    fn classify_never_panics(name in prop_oneof![nasty_string(), "[a-z]{1,8}\\.(conf|conflist|json)"],
                             bytes in prop_oneof![prop::collection::vec(any::<u8>(), 0..200),
                                                  any_json().prop_map(|v| v.to_string().into_bytes()),
                                                  primary_list().prop_map(|v| cniconf::marshal(&v))]) {
        if let Ok(c) = cniconf::classify(&name, &bytes) {
            let _ = cniconf::primary_plugins(&c);
            let _ = cniconf::insert(&name, &c.value, &istio("info", false));
            let _ = cniconf::remove(&name, &c.value);
        }
    }

    #[test]
    fn invalid_json_is_an_error_naming_the_file(name in "[a-z]{1,8}\\.conflist", bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        prop_assume!(serde_json::from_slice::<Value>(&bytes).is_err());
        match cniconf::classify(&name, &bytes) {
            Err(e @ ConfError::Json { .. }) => prop_assert!(e.to_string().starts_with(&name), "{e}"),
            other => prop_assert!(false, "{other:?}"),
        }
    }

    #[test]
    fn insert_is_idempotent_and_keeps_the_primary(primary in primary_list(), level in prop::sample::select(&["info", "debug"][..]), ambient in any::<bool>()) {
        let ours = istio(level, ambient);
        let once = cniconf::insert("p.conflist", &primary, &ours).expect("insert");
        let twice = cniconf::insert("p.conflist", &once, &ours).expect("insert again");
        prop_assert_eq!(&once, &twice);
        prop_assert!(cniconf::check_chained(&once, &ours).is_ok(), "{:?}", cniconf::check_chained(&once, &ours));
        // Every plugin of the primary's, in order, then exactly our entry.
        let mut want = non_istio(&primary);
        want.push(ours.list_entry());
        prop_assert_eq!(once["plugins"].as_array().unwrap(), &want);
        // Everything else of the primary is kept.
        for (k, v) in primary.as_object().unwrap() {
            if k != "plugins" { prop_assert_eq!(&once[k], v); }
        }
    }

    #[test]
    fn remove_after_insert_removes_only_ours(primary in primary_list()) {
        let ours = istio("info", false);
        let merged = cniconf::insert("p.conflist", &primary, &ours).expect("insert");
        let removed = cniconf::remove("p.conflist", &merged).expect("remove").expect("there was an entry");
        prop_assert_eq!(non_istio(&removed), non_istio(&primary));
        prop_assert_eq!(removed["plugins"].as_array().unwrap().len(), non_istio(&primary).len());
        prop_assert_eq!(cniconf::remove("p.conflist", &removed).expect("remove"), None);
    }

    #[test]
    fn a_single_plugin_is_wrapped_and_kept(t in "[a-z-]{1,12}", extra in any_json()) {
        prop_assume!(t != ISTIO_TYPE);
        let single = json!({"cniVersion": "0.4.0", "name": "net", "type": t, "extra": extra});
        let ours = istio("info", true);
        let merged = cniconf::insert("10-net.conf", &single, &ours).expect("insert");
        let mut inner = single.clone();
        inner.as_object_mut().unwrap().remove("cniVersion");
        prop_assert_eq!(&merged["plugins"][0], &inner);
        let c = cniconf::classify("10-net.conf", &cniconf::marshal(&single)).expect("classify");
        prop_assert_eq!(&c.kind, &Kind::Single);
        prop_assert_eq!(numbers_as_go_writes_them(Value::Array(cniconf::primary_plugins(&c))),
                        numbers_as_go_writes_them(Value::Array(vec![inner])));
    }

    #[test]
    fn marshal_then_classify_round_trips(primary in primary_list()) {
        let merged = cniconf::insert("p.conflist", &primary, &istio("info", false)).unwrap();
        let bytes = cniconf::marshal(&merged);
        prop_assert!(bytes.ends_with(b"\n"));
        let c = cniconf::classify("p.conflist", &bytes).expect("our own output classifies");
        prop_assert_eq!(&c.kind, &Kind::List);
        prop_assert_eq!(numbers_as_go_writes_them(c.value), numbers_as_go_writes_them(merged));
    }

    #[test]
    fn wrong_shapes_are_errors_naming_the_file(plugins in any_json().prop_filter("not a list", |v| !v.is_array())) {
        let doc = json!({"name": "n", "plugins": plugins});
        let err = cniconf::insert("bad.conflist", &doc, &istio("info", false)).expect_err("insert into a non-list");
        prop_assert!(err.to_string().starts_with("bad.conflist"), "{err}");
        let err = cniconf::remove("bad.conflist", &doc).expect_err("remove from a non-list");
        prop_assert!(err.to_string().starts_with("bad.conflist"), "{err}");
    }
}
