//! The CNI config files install-cni reads and merges into. Input: one byte choosing the file's
//! name (its extension decides list or single plugin), then the file. Properties: no panic;
//! errors start with the file name; for a valid candidate, the merge keeps every plugin of the
//! primary's in order and appends exactly our entry, is idempotent, re-reads equal from its own
//! output, and cleanup takes out only our entry.
#![no_main]

use istio_cni::install::cniconf::{self, ISTIO_TYPE, IstioPlugin, Kind};
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value};

const NAMES: &[&str] = &[
    "10-calico.conflist",
    "10-net.conf",
    "05-cilium.json",
    "99-x.conflist",
];
/// Where the installer writes a merged file (a `.conf` primary becomes a list).
const OUT: &str = "10-merged.conflist";

fn ours() -> IstioPlugin {
    IstioPlugin {
        cni_version: cniconf::CNI_VERSION.into(),
        name: ISTIO_TYPE.into(),
        plugin_type: ISTIO_TYPE.into(),
        ipam: Map::new(),
        dns: Map::new(),
        plugin_log_level: "info".into(),
        cni_agent_run_dir: "/var/run/istio-cni".into(),
        ambient_enabled: true,
        enablement_selectors: vec![],
        exclude_namespaces: None,
        pod_namespace: "istio-system".into(),
        native_nftables: false,
        enable_ambient_detection_retry: false,
    }
}

fn plugins(list: &Value) -> &Vec<Value> {
    list["plugins"]
        .as_array()
        .expect("a merged config has a plugins list")
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, bytes)) = data.split_first() else {
        return;
    };
    let name = NAMES[pick as usize % NAMES.len()];
    let candidate = match cniconf::classify(name, bytes) {
        Ok(c) => c,
        Err(e) => {
            assert!(e.to_string().starts_with(name), "{e}");
            return;
        }
    };
    let ours = ours();
    let primary = cniconf::primary_plugins(&candidate);
    let merged = match cniconf::insert(name, &candidate.value, &ours) {
        Ok(m) => m,
        Err(e) => {
            assert!(e.to_string().starts_with(name), "{e}");
            return;
        }
    };
    // The primary's plugins, in order, then exactly our entry.
    let mut want = primary.clone();
    want.push(ours.list_entry());
    assert_eq!(
        plugins(&merged),
        &want,
        "{name}: merge lost or changed a plugin"
    );
    if primary
        .iter()
        .all(|p| p.get("type").is_some_and(Value::is_string))
    {
        assert_eq!(cniconf::check_chained(&merged, &ours), Ok(()));
    }
    // Idempotent, and our own output reads back as the same list.
    let again = cniconf::insert(OUT, &merged, &ours).expect("insert into our own output");
    assert_eq!(again, merged, "insert is not idempotent");
    let written = cniconf::marshal(&merged);
    let back = cniconf::classify(OUT, &written).expect("our own output classifies");
    assert_eq!(back.kind, Kind::List);
    assert_eq!(back.value, merged, "marshal/classify does not round-trip");
    // Cleanup leaves exactly the primary's plugins, and finds nothing the second time.
    let removed = cniconf::remove(OUT, &merged)
        .expect("remove from our own output")
        .expect("our entry is there");
    assert_eq!(plugins(&removed), &primary);
    assert!(!cniconf::has_istio_entry(&removed));
    assert_eq!(cniconf::remove(OUT, &removed), Ok(None));
});
