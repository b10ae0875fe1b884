//! The install pass against a temp conf dir holding any mix of valid, broken and odd config
//! files: when it does not install, nothing in the conf dir changed; when it does, no plugin of
//! any primary is lost; and cleanup takes every istio-cni entry out again, keeping the rest.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use istio_cni::install::cniconf::{self, ISTIO_TYPE};
use istio_cni::install::config::{InstallConfig, LogLevel};
use istio_cni::install::installer::{InstallPass, Installer};
use proptest::prelude::*;
use serde_json::{Value, json};

use super::cniconf::{plugin, primary_list};
use super::{any_json, config as cases};

const TD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/testdata/install/");

/// File contents: valid lists and single plugins, broken JSON, valid JSON of the wrong shape.
fn content() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        primary_list().prop_map(|v| cniconf::marshal(&v)),
        plugin().prop_map(|p| serde_json::to_vec(&p).unwrap()),
        any_json().prop_map(|v| v.to_string().into_bytes()),
        Just(
            json!({"name": "n", "plugins": {"type": "x"}})
                .to_string()
                .into_bytes()
        ),
        Just(json!({"name": "n", "plugins": []}).to_string().into_bytes()),
        prop::collection::vec(any::<u8>(), 0..40),
        Just(b"{\"name\": \"half".to_vec()),
    ]
}

fn files() -> impl Strategy<Value = BTreeMap<String, Vec<u8>>> {
    prop::collection::btree_map(
        prop::sample::select(
            &[
                "10-a.conflist",
                "20-b.conf",
                "05-c.json",
                "99-z.conflist",
                ".hidden.conf",
                "30-d.txt",
            ][..],
        )
        .prop_map(str::to_string),
        content(),
        0..4,
    )
}

fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_file())
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

/// The plugins of every valid candidate file, istio-cni entries left out.
fn primaries(files: &BTreeMap<String, Vec<u8>>) -> BTreeMap<String, Vec<Value>> {
    files
        .iter()
        .filter(|(name, _)| cniconf::is_candidate_name(name))
        .filter_map(|(name, bytes)| cniconf::classify(name, bytes).ok())
        .map(|c| {
            let plugins = cniconf::primary_plugins(&c);
            (
                c.name,
                plugins
                    .into_iter()
                    .filter(|p| p["type"] != ISTIO_TYPE)
                    .collect::<Vec<_>>(),
            )
        })
        .filter(|(_, plugins)| !plugins.is_empty())
        .collect()
}

fn installer(root: &Path) -> (Installer, PathBuf) {
    let (net, bin, sa) = (root.join("net"), root.join("bin"), root.join("sa"));
    for d in [&net, &bin, &sa] {
        fs::create_dir_all(d).unwrap();
    }
    fs::copy(format!("{TD}kube-ca.crt"), sa.join("ca.crt")).unwrap();
    fs::write(sa.join("token"), "token").unwrap();
    let exe = root.join("exe");
    fs::write(&exe, b"#!/bin/true\n").unwrap();
    fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).unwrap();
    let cfg = InstallConfig {
        mounted_cni_net_dir: net.clone(),
        cni_conf_name: None,
        chained: true,
        istio_owned_cni_config: false,
        owned_filename: "02-istio-cni.conflist".into(),
        cni_bin_dirs: vec![bin],
        results_dir: root.join("cni-results"),
        run_dir: root.join("run"),
        kubeconfig_mode: 0o600,
        cni_conf_group_read: false,
        kube_ca_file: sa.join("ca.crt"),
        skip_tls_verify: false,
        service_account_dir: sa,
        k8s_service_host: Some("10.96.0.1".into()),
        k8s_service_port: Some("443".into()),
        k8s_service_protocol: "https".into(),
        ambient_enabled: true,
        enable_ambient_detection_retry: false,
        native_nftables: false,
        exclude_namespaces: vec![],
        pod_namespace: "istio-system".into(),
        enablement_selectors: vec![],
        plugin_log_level: LogLevel::Info,
        ambient_disable_safe_upgrade: false,
        node_name: "node".into(),
    };
    (Installer::new(cfg, exe).expect("installer"), net)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..cases() })]

    #[test]
    fn install_changes_nothing_unless_it_installs_and_cleanup_restores(files in files()) {
        let tmp = tempfile::tempdir().unwrap();
        let (mut installer, net) = installer(tmp.path());
        for (name, bytes) in &files {
            fs::write(net.join(name), bytes).unwrap();
        }
        let before = primaries(&files);
        let outcome = installer.install_all();
        let after = snapshot(&net);
        match &outcome {
            Ok(InstallPass::Installed) => {
                // Exactly one file was written, with one istio-cni entry, last (other files keep
                // whatever stale entries they had: they are not ours to rewrite) ...
                let written: Vec<_> = after.iter()
                    .filter(|(n, b)| files.get(*n) != Some(*b))
                    .filter_map(|(n, b)| cniconf::classify(n, b).ok())
                    .collect();
                prop_assert_eq!(written.len(), 1, "{:?}", after.keys());
                let plugins = written[0].value["plugins"].as_array().unwrap();
                prop_assert_eq!(plugins.iter().filter(|p| p["type"] == ISTIO_TYPE).count(), 1);
                prop_assert_eq!(&plugins.last().unwrap()["type"], ISTIO_TYPE);
                // ... and no primary lost a plugin (a converted .conf lives on in the list).
                let kept: Vec<Value> = primaries(&after).into_values().flatten().collect();
                for (name, plugins) in &before {
                    for p in plugins {
                        prop_assert!(kept.contains(p), "{name}: lost {p}");
                    }
                }
            }
            _ => prop_assert_eq!(&after, &files, "{:?} changed the conf dir", outcome),
        }
        installer.cleanup();
        let cleaned = snapshot(&net);
        for (name, bytes) in &cleaned {
            if let Ok(c) = cniconf::classify(name, bytes) && files.get(name) != Some(bytes) {
                prop_assert!(!cniconf::has_istio_entry(&c.value), "{name} keeps an istio-cni entry after cleanup");
            }
        }
        // Files that were no candidate (broken, hidden, other names) are never touched.
        for (name, bytes) in &files {
            if cniconf::classify(name, bytes).is_err() || !cniconf::is_candidate_name(name) {
                prop_assert_eq!(cleaned.get(name), Some(bytes), "{} changed", name);
            }
        }
        prop_assert_eq!(primaries(&cleaned), before, "cleanup changed a primary's plugins");
    }
}
