//! A DEL always finds a plugin that succeeds: after an uninstall, and all through a DaemonSet
//! rollout, while the runtime's cached CNI results (libcni's `results/` entries) still name the
//! plugin. The DELs exec the installed plugin binary from the CNI bin dir, as a runtime does.

#[path = "install_support.rs"]
mod support;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};

use support::*;

const T: Duration = Duration::from_secs(30);
const PRIMARY: &str = r#"{"cniVersion":"0.3.1","name":"k8s-pod-network","plugins":[{"type":"ptp","ipam":{"type":"host-local","subnet":"10.1.0.0/16"}}]}"#;

/// Starts install-cni (no API server: every stop is an uninstall) with the results dir set.
fn start_agent(d: &Dirs, results: &Path) -> Agent {
    let mut env = d.base_env();
    env.push(("CNI_RESULTS_DIR".into(), results.display().to_string()));
    let agent = start(&env, &[]);
    agent.wait_line("istio-cni is installed; watching for changes", T);
    agent
}

/// The merged conflist as the runtime would cache it for `n` sandboxes (cniCacheV1 entries).
fn cache_sandboxes(d: &Dirs, results: &Path, n: usize) -> Vec<Value> {
    let merged = d.read("10-primary.conflist").expect("merged config");
    assert!(has_istio_entry(&merged), "{merged}");
    std::fs::create_dir_all(results).expect("results dir");
    let encoded = base64::engine::general_purpose::STANDARD.encode(merged.as_bytes());
    (0..n)
        .map(|i| {
            let id = format!("sandbox{i:04}");
            let entry = json!({
                "kind": "cniCacheV1", "containerId": id, "ifName": "eth0",
                "networkName": "k8s-pod-network", "config": encoded,
                "result": {"cniVersion": "0.3.1", "ips": [{"address": format!("10.1.0.{}/16", i + 2)}]},
            });
            let path = results.join(format!("k8s-pod-network-{id}-eth0"));
            std::fs::write(&path, entry.to_string()).expect("cache entry");
            entry
        })
        .collect()
}

/// The stdin libcni gives our plugin on DEL: our entry of the cached list, with the list's name
/// and version.
fn del_stdin(cached: &Value) -> Vec<u8> {
    let config = cached["config"].as_str().expect("config");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(config)
        .expect("base64");
    let list: Value = serde_json::from_slice(&bytes).expect("list");
    let mut ours = list["plugins"]
        .as_array()
        .expect("plugins")
        .iter()
        .find(|p| p["type"] == "istio-cni")
        .cloned()
        .expect("our entry");
    ours["name"] = list["name"].clone();
    ours["cniVersion"] = list["cniVersion"].clone();
    serde_json::to_vec(&ours).expect("json")
}

/// Execs the plugin in `bin` for DEL; `Err` says why it failed (exec or exit).
fn del(bin: &Path, cached: &Value) -> Result<(), String> {
    let mut child = Command::new(bin.join("istio-cni"))
        .env_clear()
        .env("CNI_COMMAND", "DEL")
        .env(
            "CNI_CONTAINERID",
            cached["containerId"].as_str().unwrap_or(""),
        )
        .env("CNI_NETNS", "")
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", bin)
        .env("CNI_ARGS", "K8S_POD_NAMESPACE=default;K8S_POD_NAME=p")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("failed to find plugin istio-cni: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(&del_stdin(cached));
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "exit {:?}: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout)
        ))
    }
}

#[test]
fn every_del_succeeds_after_an_uninstall_while_cached_results_name_the_plugin() {
    let d = Dirs::new();
    let results = d.tmp.path().join("cni-cache/results");
    d.put("10-primary.conflist", PRIMARY.as_bytes());
    let mut agent = start_agent(&d, &results);
    let sandboxes = cache_sandboxes(&d, &results, 3);
    let st = agent.terminate(T);
    assert!(st.success(), "exit {st:?}\n{}", agent.output());
    // The config went first: no new sandbox is set up with the plugin.
    let after = d.read("10-primary.conflist").expect("primary restored");
    assert!(!has_istio_entry(&after), "{after}");
    assert!(
        agent
            .output()
            .contains("leaving the CNI plugin binary in place"),
        "{}",
        agent.output()
    );
    for s in &sandboxes {
        del(&d.bin, s).unwrap_or_else(|e| panic!("DEL of {}: {e}", s["containerId"]));
    }
    // The runtime drops each entry after its DEL; the next uninstall finds none and removes it.
    std::fs::remove_dir_all(&results).expect("cache emptied");
    let mut again = start_agent(&d, &results);
    let st = again.terminate(T);
    assert!(st.success(), "exit {st:?}\n{}", again.output());
    assert!(!d.bin.join("istio-cni").exists(), "binary removed at last");
}

/// A "new version" of the binary: ours with bytes appended (still runs, different content).
fn new_version(dir: &Path) -> PathBuf {
    let path = dir.join("istio-cni-rs-new");
    let mut bytes = std::fs::read(bin()).expect("read binary");
    bytes.extend_from_slice(b"\0new version\0");
    std::fs::write(&path, bytes).expect("write new binary");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

#[test]
fn no_del_fails_during_a_rollout_with_the_binary_replaced_atomically() {
    let d = Dirs::new();
    let results = d.tmp.path().join("cni-cache/results");
    d.put("10-primary.conflist", PRIMARY.as_bytes());
    let mut old = start_agent(&d, &results);
    let sandboxes = Arc::new(cache_sandboxes(&d, &results, 4));
    let stop = Arc::new(AtomicBool::new(false));
    let (done, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let firsts = Arc::new(std::sync::Mutex::new(Vec::new()));
    let caller = {
        let (bin, sandboxes, stop) = (d.bin.clone(), sandboxes.clone(), stop.clone());
        let (done, failed, firsts) = (done.clone(), failed.clone(), firsts.clone());
        std::thread::spawn(move || {
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                match del(&bin, &sandboxes[i % sandboxes.len()]) {
                    Ok(()) => done.fetch_add(1, Ordering::SeqCst),
                    Err(e) => {
                        firsts.lock().expect("firsts").push(e);
                        failed.fetch_add(1, Ordering::SeqCst)
                    }
                };
                i += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    let st = old.terminate(T);
    assert!(st.success(), "exit {st:?}\n{}", old.output());
    std::thread::sleep(Duration::from_secs(2));
    let new_bin = new_version(d.tmp.path());
    let script = format!("shift; exec {} \"$@\"", new_bin.display());
    let mut env = d.base_env();
    env.push(("CNI_RESULTS_DIR".into(), results.display().to_string()));
    let mut new = start_via(&["sh", "-c", &script, "sh"], &env, &[]);
    new.wait_line("istio-cni is installed; watching for changes", T);
    let replaced = wait_for(T, || {
        (std::fs::read(d.bin.join("istio-cni")).ok()? == std::fs::read(&new_bin).ok()?)
            .then_some(())
    });
    assert!(replaced.is_some(), "new binary installed\n{}", new.output());
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(1) {
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::SeqCst);
    caller.join().expect("caller thread");
    let (ok, bad) = (done.load(Ordering::SeqCst), failed.load(Ordering::SeqCst));
    assert_eq!(bad, 0, "{ok} DELs succeeded; failures: {:?}", firsts.lock());
    assert!(ok >= 20, "only {ok} DELs ran");
    let _ = new.terminate(T);
}
