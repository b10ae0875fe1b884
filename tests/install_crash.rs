//! install-cni killed (SIGKILL) at every step of its file changes, during install and during
//! cleanup (issue 13 §3). The `test-hooks` build kills itself at the N-th crash point
//! (`ISTIO_CNI_RS_TEST_KILL_AT_STEP`: after each change, and between a write's complete temp file
//! and its rename). After every kill the node must still be usable by the container runtime:
//! every config file parses, the primary's plugins are all there, an `istio-cni` entry only exists
//! with its binary (complete) and kubeconfig beside it; and the next install-cni converges — it
//! installs, and its cleanup gives back exactly the original files.

mod install_support;

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use install_support::{Dirs, bin, has_istio_entry, start, testdata};
use serde_json::Value;

const T: Duration = Duration::from_secs(10);
const KILL_AT: &str = "ISTIO_CNI_RS_TEST_KILL_AT_STEP";

/// Files a container runtime reads from the conf dir, by name (libcni: .conf, .conflist, .json).
fn runtime_configs(d: &Dirs) -> BTreeMap<String, String> {
    d.names()
        .into_iter()
        .filter(|n| n.ends_with(".conf") || n.ends_with(".conflist") || n.ends_with(".json"))
        .filter_map(|n| d.read(&n).map(|c| (n, c)))
        .collect()
}

/// Plugin types of a config file (a list's plugins, or a single conf's type).
fn plugin_types(content: &Value) -> Vec<String> {
    match content["plugins"].as_array() {
        Some(list) => list
            .iter()
            .filter_map(|p| p["type"].as_str().map(str::to_string))
            .collect(),
        None => content["type"]
            .as_str()
            .map(str::to_string)
            .into_iter()
            .collect(),
    }
}

/// The node after a kill: usable by the runtime, never a dangling `istio-cni` entry.
fn assert_usable(d: &Dirs, primary_types: &[String], context: &str) {
    let configs = runtime_configs(d);
    let mut all_types = Vec::new();
    for (name, content) in &configs {
        let parsed: Value = serde_json::from_str(content)
            .unwrap_or_else(|e| panic!("{context}: {name} is not whole JSON ({e}):\n{content}"));
        all_types.extend(plugin_types(&parsed));
        if has_istio_entry(content) {
            let binary = d.bin.join("istio-cni");
            assert!(
                binary.exists(),
                "{context}: {name} names istio-cni but the binary is missing"
            );
            assert_eq!(
                std::fs::read(&binary).expect("read binary"),
                std::fs::read(bin()).expect("read test binary"),
                "{context}: the installed binary is not a complete copy"
            );
            // The plugin reads its kubeconfig from the run dir (as Istio's does).
            let kubeconfig = d.run.join("istio-cni-kubeconfig");
            assert!(
                kubeconfig.exists(),
                "{context}: {name} names istio-cni but {} is missing",
                kubeconfig.display()
            );
        }
    }
    for t in primary_types {
        assert!(
            all_types.contains(t),
            "{context}: the primary's plugin {t} is gone: {configs:?}"
        );
    }
}

/// One primary config; for every step N until a run is no longer killed: run install-cni (killed
/// at step N while installing, or while cleaning up after SIGTERM), check the node, then run it
/// again to completion and check that install + cleanup give back the original files.
fn killed_at_every_step(primary: &str, testdata_name: &str) -> u32 {
    let original = testdata(testdata_name);
    let primary_types = plugin_types(&serde_json::from_slice(&original).expect("primary JSON"));
    let mut step = 1;
    loop {
        let d = Dirs::new();
        d.put(primary, &original);
        let mut env = d.base_env();
        env.push((KILL_AT.into(), step.to_string()));
        let started = std::time::Instant::now();
        let mut agent = start(&env, &[]);
        let installed = install_support::wait_for(T, || {
            if let Ok(Some(st)) = agent.child.try_wait() {
                return Some(Err(st));
            }
            runtime_configs(&d)
                .values()
                .any(|c| has_istio_entry(c))
                .then_some(Ok(()))
        })
        .expect("install-cni neither installed nor exited");
        let status = match installed {
            Err(st) => st,
            // Installed: the kill (if any) comes during cleanup.
            Ok(()) => agent.terminate(T),
        };
        let context = format!("{primary}, killed at step {step}");
        eprintln!("{context}: {status:?} after {:?}", started.elapsed());
        let killed = status.signal() == Some(9);
        assert!(
            killed || status.success(),
            "{context}: install-cni ended with {status:?}:\n{}",
            agent.output()
        );
        assert_usable(&d, &primary_types, &context);
        if !killed {
            // Past the last step: this run installed and cleaned up untouched.
            assert_cleaned_up(&d, primary, &original, &context);
            return step - 1;
        }

        // The next install-cni converges from whatever the kill left.
        let mut again = start(&d.base_env(), &[]);
        assert!(
            d.waits_for(T, primary_name_after_install(primary), has_istio_entry),
            "{context}: the next install-cni did not install:\n{}",
            again.output()
        );
        assert_usable(&d, &primary_types, &format!("{context}, reinstalled"));
        assert!(
            again.terminate(T).success(),
            "{context}: {}",
            again.output()
        );
        assert_cleaned_up(&d, primary, &original, &format!("{context}, recovered"));
        step += 1;
    }
}

/// After cleanup the conf dir holds the primary alone, as it was (a list is written back without
/// our entry, so compare what it says; a converted `.conf` comes back byte for byte), and the
/// binary is gone.
fn assert_cleaned_up(d: &Dirs, primary: &str, original: &[u8], context: &str) {
    let configs = runtime_configs(d);
    assert_eq!(
        configs.keys().collect::<Vec<_>>(),
        [primary],
        "{context}: cleanup left other configs"
    );
    let now = &configs[primary];
    if primary.ends_with(".conf") {
        assert_eq!(
            now.as_bytes(),
            original,
            "{context}: the .conf was not given back"
        );
    } else {
        let now: Value = serde_json::from_str(now).expect("JSON");
        let was: Value = serde_json::from_slice(original).expect("JSON");
        assert_eq!(now, was, "{context}: the primary differs after cleanup");
    }
    assert!(!d.bin.join("istio-cni").exists(), "{context}: binary left");
}

/// Where our entry goes: a single `.conf` is converted to a `.conflist` of the same stem.
fn primary_name_after_install(primary: &str) -> &str {
    if primary == "10-bridge.conf" {
        "10-bridge.conflist"
    } else {
        primary
    }
}

#[test]
fn a_kill_at_any_step_of_merging_into_a_conflist_leaves_the_node_usable() {
    let steps = killed_at_every_step("10-list.conflist", "list.conflist");
    assert!(steps >= 6, "only {steps} crash points were exercised");
}

#[test]
fn a_kill_at_any_step_of_converting_a_single_conf_leaves_the_node_usable() {
    let steps = killed_at_every_step("10-bridge.conf", "bridge.conf");
    assert!(steps >= 6, "only {steps} crash points were exercised");
}

/// A rolling update with surge: the new install-cni starts while the old one still runs, then the
/// old one is stopped and cleans up (no DaemonSet to tell it otherwise). The new one's guard puts
/// the entry and the binary back, and when it stops in turn the original comes back.
#[test]
fn two_install_cni_at_once_during_a_rolling_update_end_installed() {
    let d = Dirs::new();
    let original = testdata("bridge.conf");
    d.put("10-bridge.conf", &original);
    let installed = |d: &Dirs| {
        d.read("10-bridge.conflist")
            .is_some_and(|c| has_istio_entry(&c))
            && std::fs::read(d.bin.join("istio-cni")).ok() == std::fs::read(bin()).ok()
            && d.run.join("istio-cni-kubeconfig").exists()
    };
    let mut old = start(&d.base_env(), &[]);
    assert!(
        install_support::wait_for(T, || installed(&d).then_some(())).is_some(),
        "the old install-cni did not install:\n{}",
        old.output()
    );
    let mut new = start(&d.base_env(), &[]);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        installed(&d),
        "two at once broke the install:\n{}",
        new.output()
    );
    assert!(old.terminate(T).success(), "{}", old.output());
    assert!(
        install_support::wait_for(T, || installed(&d).then_some(())).is_some(),
        "the new install-cni did not put back what the old one removed:\n{}",
        new.output()
    );
    assert_usable(&d, &["bridge".to_string()], "after the old one left");
    assert!(new.terminate(T).success(), "{}", new.output());
    assert_cleaned_up(&d, "10-bridge.conf", &original, "after the new one left");
}
