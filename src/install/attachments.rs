//! Which network attachments on the node may still call the plugin: the container runtime's
//! cached CNI results (libcni's `<cache dir>/results/<network>-<container>-<ifname>`, each holding
//! the network config the sandbox was set up with) and the CNI configs still in the conf dir.
//! An uninstall keeps the plugin binary while any of them names it, so the runtime's DEL for a
//! pod set up with the plugin finds it and succeeds instead of leaving the pod Terminating.
//!
//! Every entry is untrusted input: the directory is read up to [`MAX_ENTRIES`] entries, each file
//! up to [`MAX_ENTRY_BYTES`], only regular files (never through a symlink). Whatever cannot be
//! judged (too many entries, an unreadable or malformed one) counts as "may name it": a binary
//! left behind is harmless (no config names it), a missing one strands pods.

use std::fs;
use std::path::Path;

use base64::Engine;
use serde_json::Value;

use super::cniconf::ISTIO_TYPE;
use super::fsutil;

/// Entries of the results directory looked at; past this the answer is "may name it".
pub const MAX_ENTRIES: usize = 4096;
/// Size limit of one cached result (they are a few KiB).
pub const MAX_ENTRY_BYTES: u64 = 256 * 1024;

/// Why the plugin binary must stay, or `None` when nothing on the node names it any more.
pub fn binary_still_needed(results_dir: &Path, conf_dir: &Path) -> Option<String> {
    let mut why = Vec::new();
    match cached_attachments(results_dir) {
        Ok(0) => {}
        Ok(n) => why.push(format!(
            "{n} cached network attachment(s) in {} name it",
            results_dir.display()
        )),
        Err(e) => why.push(e),
    }
    let confs = configs_naming_it(conf_dir);
    if !confs.is_empty() {
        why.push(format!(
            "CNI config(s) {} in {} still name it",
            confs.join(", "),
            conf_dir.display()
        ));
    }
    (!why.is_empty()).then(|| why.join("; "))
}

/// How many cached results name the plugin. A missing directory is none (the runtime has cached
/// nothing); anything that cannot be judged is an error saying what.
fn cached_attachments(dir: &Path) -> Result<usize, String> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(format!("cannot list {}: {e}", dir.display())),
    };
    let mut naming = 0;
    for (seen, entry) in entries.enumerate() {
        if seen >= MAX_ENTRIES {
            return Err(format!(
                "{} holds more than {MAX_ENTRIES} entries; not all were checked",
                dir.display()
            ));
        }
        let entry = entry.map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
        // The entry's own type (not followed): a link or a directory is not a runtime's record.
        if !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let path = entry.path();
        let bytes = fsutil::read_bounded_to(&path, MAX_ENTRY_BYTES).map_err(|e| e.to_string())?;
        if entry_names_plugin(&bytes)
            .map_err(|why| format!("cached result {}: {why}", path.display()))?
        {
            naming += 1;
        }
    }
    Ok(naming)
}

/// Whether one cached result (libcni's `cniCacheV1`: the network config, base64, under
/// `config`) was set up with a config naming the plugin.
fn entry_names_plugin(bytes: &[u8]) -> Result<bool, String> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| format!("not JSON ({e})"))?;
    let encoded = value
        .get("config")
        .and_then(Value::as_str)
        .ok_or("no `config` string")?;
    let config = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|e| format!("`config` is not base64 ({e})"))?;
    let config: Value =
        serde_json::from_slice(&config).map_err(|e| format!("`config` is not JSON ({e})"))?;
    Ok(config_names_plugin(&config))
}

/// A single-plugin config of our type, or a list with an entry of our type.
pub fn config_names_plugin(config: &Value) -> bool {
    let ours = |v: &Value| v.get("type").and_then(Value::as_str) == Some(ISTIO_TYPE);
    ours(config)
        || config
            .get("plugins")
            .and_then(Value::as_array)
            .is_some_and(|p| p.iter().any(ours))
}

/// The CNI configs (`.conf`, `.conflist`, `.json`) in `dir` naming the plugin, bounded like the
/// results; one that cannot be read or parsed does not name it (the runtime cannot load it either).
fn configs_naming_it(dir: &Path) -> Vec<String> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.take(MAX_ENTRIES).flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !super::cniconf::is_candidate_name(&name) {
            continue;
        }
        let names_it = fsutil::read_bounded_to(&entry.path(), MAX_ENTRY_BYTES)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .is_some_and(|v| config_names_plugin(&v));
        if names_it {
            out.push(name);
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::STANDARD;

    fn cached(config: &str) -> Vec<u8> {
        serde_json::json!({
            "kind": "cniCacheV1", "containerId": "c1", "ifName": "eth0",
            "networkName": "k8s-pod-network", "config": STANDARD.encode(config),
        })
        .to_string()
        .into_bytes()
    }

    #[test]
    fn a_cached_result_names_the_plugin_through_its_decoded_config() {
        let list = r#"{"name":"k8s-pod-network","plugins":[{"type":"ptp"},{"type":"istio-cni"}]}"#;
        assert_eq!(entry_names_plugin(&cached(list)), Ok(true));
        let other = r#"{"name":"k8s-pod-network","plugins":[{"type":"ptp"}]}"#;
        assert_eq!(entry_names_plugin(&cached(other)), Ok(false));
        assert_eq!(
            entry_names_plugin(&cached(r#"{"type":"istio-cni"}"#)),
            Ok(true)
        );
    }

    #[test]
    fn a_malformed_cached_result_is_an_error_naming_the_cause() {
        assert!(entry_names_plugin(b"{").unwrap_err().contains("not JSON"));
        assert!(entry_names_plugin(b"{}").unwrap_err().contains("config"));
        let bad = br#"{"config":"%%%"}"#;
        assert!(entry_names_plugin(bad).unwrap_err().contains("base64"));
        let not_json = format!(r#"{{"config":"{}"}}"#, STANDARD.encode("xx"));
        assert!(
            entry_names_plugin(not_json.as_bytes())
                .unwrap_err()
                .contains("not JSON")
        );
    }

    #[test]
    fn the_results_directory_is_read_bounded_and_doubt_keeps_the_binary() {
        let dir = tempfile::tempdir().expect("tempdir");
        let results = dir.path().join("results");
        let conf = dir.path().join("net.d");
        fs::create_dir_all(&conf).expect("conf dir");
        assert_eq!(binary_still_needed(&results, &conf), None, "missing dir");
        fs::create_dir_all(&results).expect("results");
        let ours = r#"{"name":"n","plugins":[{"type":"istio-cni"}]}"#;
        fs::write(results.join("n-c1-eth0"), cached(ours)).expect("write");
        fs::write(results.join("n-c2-eth0"), cached(r#"{"type":"ptp"}"#)).expect("write");
        std::os::unix::fs::symlink("/etc/passwd", results.join("n-c3-eth0")).expect("link");
        assert_eq!(cached_attachments(&results), Ok(1));
        assert!(binary_still_needed(&results, &conf).is_some());
        fs::remove_file(results.join("n-c1-eth0")).expect("rm");
        assert_eq!(binary_still_needed(&results, &conf), None);
        fs::write(
            results.join("big"),
            vec![b' '; MAX_ENTRY_BYTES as usize + 1],
        )
        .expect("big");
        let why = binary_still_needed(&results, &conf).expect("too large keeps it");
        assert!(why.contains("big"), "{why}");
        fs::remove_file(results.join("big")).expect("rm");
        fs::write(conf.join("10-x.conflist"), ours).expect("conf");
        let why = binary_still_needed(&results, &conf).expect("a config names it");
        assert!(why.contains("10-x.conflist"), "{why}");
    }

    #[test]
    fn too_many_entries_keep_the_binary() {
        let dir = tempfile::tempdir().expect("tempdir");
        let other = cached(r#"{"type":"ptp"}"#);
        for i in 0..=MAX_ENTRIES {
            fs::write(dir.path().join(format!("e{i}")), &other).expect("write");
        }
        let e = cached_attachments(dir.path()).unwrap_err();
        assert!(e.contains("more than"), "{e}");
    }
}
