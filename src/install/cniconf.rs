//! Pure CNI-config logic: our plugin entry, candidate classification, merge/remove, validation.
//! No file effects here; `installer` feeds file contents in and writes what comes out.
//!
//! Output format matches Istio byte for byte: standalone configs keep the struct order, merged
//! configs go through a sorted map, 2-space indent, trailing newline. Unlike Go we keep integers
//! exact and do not HTML-escape `<`, `>`, `&` (Istio limit L21).

use serde::Serialize;
use serde_json::{Map, Value};

use super::config::{EnablementSelector, InstallConfig};

/// The plugin type (and name) of our entry.
pub const ISTIO_TYPE: &str = "istio-cni";
/// Name of the list a single-plugin primary is wrapped into.
pub const WRAPPED_LIST_NAME: &str = "k8s-pod-network";
/// cniVersion of our entry and of wrapped lists.
pub const CNI_VERSION: &str = "0.3.1";

/// Errors of the pure config logic.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfError {
    #[error("{file}: not valid JSON: {reason}")]
    Json { file: String, reason: String },
    #[error("{file}: {reason}")]
    Shape { file: String, reason: String },
}

/// Our plugin entry, in the field order Istio's standalone file uses.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct IstioPlugin {
    #[serde(rename = "cniVersion")]
    pub cni_version: String,
    pub name: String,
    #[serde(rename = "type")]
    pub plugin_type: String,
    pub ipam: Map<String, Value>,
    pub dns: Map<String, Value>,
    pub plugin_log_level: String,
    pub cni_agent_run_dir: String,
    pub ambient_enabled: bool,
    pub enablement_selectors: Vec<EnablementSelector>,
    /// `null` when empty, as Istio writes it.
    pub exclude_namespaces: Option<Vec<String>>,
    pub pod_namespace: String,
    pub native_nftables: bool,
    pub enable_ambient_detection_retry: bool,
    /// Ours: the node's iptables flavour (`legacy` | `nft`), decided once by the agent (its backend
    /// record) or forced by `FORCE_IPTABLES_BINARY`; the plugin honours it over its own detection.
    /// Absent (as in Istio's entry) when nothing decided it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub force_iptables_binary: Option<String>,
}

impl IstioPlugin {
    /// Builds our entry from the install config.
    pub fn from_config(c: &InstallConfig) -> Self {
        Self {
            cni_version: CNI_VERSION.to_string(),
            name: ISTIO_TYPE.to_string(),
            plugin_type: ISTIO_TYPE.to_string(),
            ipam: Map::new(),
            dns: Map::new(),
            plugin_log_level: c.plugin_log_level.as_str().to_string(),
            cni_agent_run_dir: c.run_dir.to_string_lossy().into_owned(),
            ambient_enabled: c.ambient_enabled,
            enablement_selectors: c.enablement_selectors.clone(),
            exclude_namespaces: Some(c.exclude_namespaces.clone()).filter(|v| !v.is_empty()),
            pod_namespace: c.pod_namespace.clone(),
            native_nftables: c.native_nftables,
            enable_ambient_detection_retry: c.enable_ambient_detection_retry,
            force_iptables_binary: None,
        }
    }

    /// The standalone file content (struct order).
    pub fn standalone_bytes(&self) -> Vec<u8> {
        // A struct of strings, bools, maps and vectors always serializes.
        let mut s = serde_json::to_string_pretty(self).unwrap_or_default();
        s.push('\n');
        s.into_bytes()
    }

    /// The entry as a generic JSON value (for merging; keys come out sorted).
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// The entry as it appears inside a list: without its own cniVersion.
    pub fn list_entry(&self) -> Value {
        let mut v = self.to_value();
        if let Value::Object(m) = &mut v {
            m.remove("cniVersion");
        }
        v
    }
}

/// Serializes a merged document: sorted keys, 2-space indent, trailing newline.
pub fn marshal(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, GoFloats::default());
    if v.serialize(&mut ser).is_err() {
        return b"null\n".to_vec();
    }
    out.push(b'\n');
    out
}

/// serde_json's pretty output with fractional numbers spelled as Go's encoder spells them
/// (`1000` for 1e3, `-0`, `1e+23`, `1e-7`), so a primary's floats come back as Istio writes them.
#[derive(Default)]
struct GoFloats(serde_json::ser::PrettyFormatter<'static>);

/// Go's float64 text: plain decimal between 1e-6 and 1e21, else exponent form with a sign and no
/// leading zero in a negative exponent; the shortest digits that read back the same either way.
pub fn go_float(f: f64) -> String {
    let abs = f.abs();
    if abs == 0.0 || (1e-6..1e21).contains(&abs) {
        return format!("{f}");
    }
    let e = format!("{f:e}");
    match e.split_once('e') {
        Some((m, exp)) if exp.starts_with('-') => format!("{m}e{exp}"),
        Some((m, exp)) => format!("{m}e+{exp}"),
        None => e,
    }
}

impl serde_json::ser::Formatter for GoFloats {
    fn write_f64<W: ?Sized + std::io::Write>(&mut self, w: &mut W, v: f64) -> std::io::Result<()> {
        w.write_all(go_float(v).as_bytes())
    }
    fn begin_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.begin_array(w)
    }
    fn end_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.end_array(w)
    }
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.0.begin_array_value(w, first)
    }
    fn end_array_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.end_array_value(w)
    }
    fn begin_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.begin_object(w)
    }
    fn end_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.end_object(w)
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.0.begin_object_key(w, first)
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.begin_object_value(w)
    }
    fn end_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.0.end_object_value(w)
    }
}

/// Why a plugin object would not load into libcni's typed plugin config (Go's decoder: field
/// names matched case-insensitively, `null` fits any field), or None when it loads.
fn libcni_plugin_error(plugin: &Value) -> Option<String> {
    let Some(obj) = plugin.as_object() else {
        return Some("a plugin is not a JSON object".into());
    };
    let strings = |v: &Value| match v {
        Value::Array(a) => a.iter().all(|x| x.is_string() || x.is_null()),
        other => other.is_null(),
    };
    for (key, v) in obj {
        let k = key.to_ascii_lowercase();
        let ok = match k.as_str() {
            "cniversion" | "name" | "type" => v.is_string() || v.is_null(),
            "capabilities" => match v {
                Value::Object(m) => m.values().all(|b| b.is_boolean() || b.is_null()),
                other => other.is_null(),
            },
            "ipam" => match v {
                Value::Object(m) => m
                    .iter()
                    .filter(|(f, _)| f.eq_ignore_ascii_case("type"))
                    .all(|(_, t)| t.is_string() || t.is_null()),
                other => other.is_null(),
            },
            "dns" => match v {
                Value::Object(m) => m
                    .iter()
                    .all(|(f, x)| match f.to_ascii_lowercase().as_str() {
                        "nameservers" | "search" | "options" => strings(x),
                        "domain" => x.is_string() || x.is_null(),
                        _ => true,
                    }),
                other => other.is_null(),
            },
            "prevresult" => v.is_object() || v.is_null(),
            _ => true,
        };
        if !ok {
            return Some(format!("plugin field `{key}` has the wrong type"));
        }
    }
    None
}

/// Why the list-level fields would not load in libcni, or None.
fn libcni_list_error(obj: &serde_json::Map<String, Value>) -> Option<String> {
    if obj.get("cniVersion").is_some_and(|v| !v.is_string()) {
        return Some("`cniVersion` is not a string".into());
    }
    for key in ["disableCheck", "disableGC", "loadOnlyInlinedPlugins"] {
        let ok = match obj.get(key) {
            None | Some(Value::Bool(_)) => true,
            Some(Value::String(s)) => matches!(s.to_lowercase().as_str(), "true" | "false"),
            Some(_) => false,
        };
        if !ok {
            return Some(format!("`{key}` is not a boolean"));
        }
    }
    None
}

/// Whether a file name is a CNI config candidate (libcni's extensions, incl. `.json` — L7).
pub fn is_candidate_name(name: &str) -> bool {
    (name.ends_with(".conf") || name.ends_with(".conflist") || name.ends_with(".json"))
        && !name.starts_with('.')
}

/// What a valid candidate file holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    /// A network list (`plugins` array).
    List,
    /// A single plugin config (top-level `type`).
    Single,
}

/// A parsed, valid candidate.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub name: String,
    pub kind: Kind,
    pub value: Value,
    pub bytes: Vec<u8>,
}

/// Classifies one file like the runtime's loader would. `Err` carries why it is skipped.
pub fn classify(name: &str, bytes: &[u8]) -> Result<Candidate, ConfError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| ConfError::Json {
        file: name.to_string(),
        reason: e.to_string(),
    })?;
    let shape = |reason: &str| ConfError::Shape {
        file: name.to_string(),
        reason: reason.to_string(),
    };
    let obj = value
        .as_object()
        .ok_or_else(|| shape("not a JSON object"))?;
    let is_list =
        name.ends_with(".conflist") || (name.ends_with(".json") && obj.contains_key("plugins"));
    let kind = if is_list {
        if obj
            .get("name")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            return Err(shape("network list has no name"));
        }
        if let Some(reason) = libcni_list_error(obj) {
            return Err(shape(&reason));
        }
        match obj.get("plugins") {
            Some(Value::Array(p)) if !p.is_empty() => {
                if let Some(reason) = p.iter().find_map(libcni_plugin_error) {
                    return Err(shape(&reason));
                }
                Kind::List
            }
            Some(Value::Array(_)) => return Err(shape("network list has no plugins")),
            Some(_) => return Err(shape("`plugins` is not a list")),
            // CNI 1.1 allows plugins in a <dir>/<name>/ sub-directory; we cannot merge into that
            // (Istio limit L22), so such a file is skipped explicitly rather than failing later.
            None => return Err(shape("network list has no inline plugins")),
        }
    } else {
        if obj
            .get("type")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            return Err(shape("plugin config has no type"));
        }
        if let Some(reason) = libcni_plugin_error(&value) {
            return Err(shape(&reason));
        }
        Kind::Single
    };
    Ok(Candidate {
        name: name.to_string(),
        kind,
        value,
        bytes: bytes.to_vec(),
    })
}

/// Whether a list carries any istio-cni entry (whatever its content). Every function here treats
/// the istio-cni entries of a list as a set: a list can hold several (an old agent's, one added
/// by hand, a restored backup), and each one makes the plugin run again for every pod.
pub fn has_istio_entry(list: &Value) -> bool {
    list.get("plugins")
        .and_then(Value::as_array)
        .is_some_and(|p| p.iter().any(is_istio_entry))
}

fn is_istio_entry(v: &Value) -> bool {
    v.get("type").and_then(Value::as_str) == Some(ISTIO_TYPE)
}

/// Merges our entry into the primary config: a single plugin becomes a new list
/// `k8s-pod-network` (its cniVersion dropped); a list loses every istio-cni entry, wherever it
/// sits (Istio drops only the first), and gets ours appended last, after the primary's plugins.
pub fn insert(file: &str, primary: &Value, istio: &IstioPlugin) -> Result<Value, ConfError> {
    let shape = |reason: &str| ConfError::Shape {
        file: file.to_string(),
        reason: reason.to_string(),
    };
    let obj = primary
        .as_object()
        .ok_or_else(|| shape("existing config is not a JSON object"))?;
    let entry = istio.list_entry();
    if obj.contains_key("type") && !obj.contains_key("plugins") {
        let mut single = obj.clone();
        single.remove("cniVersion");
        // A single istio-cni plugin (a stale standalone file) is an istio entry like any other:
        // wrapping it would chain the plugin twice.
        let plugins = if is_istio_entry(primary) {
            vec![entry]
        } else {
            vec![Value::Object(single), entry]
        };
        let mut list = Map::new();
        list.insert(
            "cniVersion".to_string(),
            Value::String(CNI_VERSION.to_string()),
        );
        list.insert(
            "name".to_string(),
            Value::String(WRAPPED_LIST_NAME.to_string()),
        );
        list.insert("plugins".to_string(), Value::Array(plugins));
        return Ok(Value::Object(list));
    }
    let mut out = obj.clone();
    let plugins = match out.get_mut("plugins") {
        Some(Value::Array(p)) => p,
        Some(_) => return Err(shape("`plugins` is not a list")),
        None => return Err(shape("existing config has neither `type` nor `plugins`")),
    };
    plugins.retain(|p| !is_istio_entry(p));
    plugins.push(entry);
    Ok(Value::Object(out))
}

/// Removes every istio-cni entry from a list (cleanup; Istio removes only the first, leaving one
/// that points at a deleted binary). `Ok(None)` = there was none.
pub fn remove(file: &str, list: &Value) -> Result<Option<Value>, ConfError> {
    let mut out = list.as_object().cloned().ok_or_else(|| ConfError::Shape {
        file: file.to_string(),
        reason: "not a JSON object".to_string(),
    })?;
    let Some(Value::Array(plugins)) = out.get_mut("plugins") else {
        return Err(ConfError::Shape {
            file: file.to_string(),
            reason: "no `plugins` list".to_string(),
        });
    };
    let before = plugins.len();
    plugins.retain(|p| !is_istio_entry(p));
    if plugins.len() == before {
        return Ok(None);
    }
    Ok(Some(Value::Object(out)))
}

/// Why the config file we wrote is not what we would write now (the guard writes it again).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Stale {
    #[error("our config has no plugins list")]
    NoPlugins,
    #[error("a plugin in our config has no string type")]
    UntypedPlugin,
    #[error("istio-cni entry is missing")]
    MissingEntry,
    #[error("{0} istio-cni entries (exactly one expected)")]
    ManyEntries(usize),
    #[error("the istio-cni entry is not the last plugin")]
    EntryNotLast,
    #[error("istio-cni entry differs from the expected one")]
    EntryDiffers,
    /// Owned mode: the primary's plugins changed (names the primary's file).
    #[error("owned config no longer matches the plugins of {0}")]
    OwnedCopyDiffers(String),
    #[error("standalone config type is not istio-cni")]
    NotStandalone,
    #[error("standalone config differs from the expected one")]
    StandaloneDiffers,
}

/// Checks a chained file we wrote: every plugin an object with a string type, exactly one
/// istio-cni entry, last (after the primary's plugins, where `insert` puts it), and equal to what
/// we would write now.
pub fn check_chained(ours: &Value, istio: &IstioPlugin) -> Result<(), Stale> {
    let plugins = ours
        .get("plugins")
        .and_then(Value::as_array)
        .ok_or(Stale::NoPlugins)?;
    for p in plugins {
        if p.get("type").and_then(Value::as_str).is_none() {
            return Err(Stale::UntypedPlugin);
        }
    }
    match plugins.iter().filter(|p| is_istio_entry(p)).count() {
        0 => return Err(Stale::MissingEntry),
        1 => {}
        n => return Err(Stale::ManyEntries(n)),
    }
    match plugins.last() {
        Some(p) if !is_istio_entry(p) => Err(Stale::EntryNotLast),
        Some(p) if *p != istio.list_entry() => Err(Stale::EntryDiffers),
        _ => Ok(()),
    }
}

/// The plugins the primary contributes to a merge (its list, or the single plugin without its
/// cniVersion), minus any istio entry.
pub fn primary_plugins(primary: &Candidate) -> Vec<Value> {
    match primary.kind {
        Kind::List => primary
            .value
            .get("plugins")
            .and_then(Value::as_array)
            .map(|p| p.iter().filter(|x| !is_istio_entry(x)).cloned().collect())
            .unwrap_or_default(),
        Kind::Single if is_istio_entry(&primary.value) => Vec::new(),
        Kind::Single => {
            let mut single = primary.value.clone();
            if let Value::Object(m) = &mut single {
                m.remove("cniVersion");
            }
            vec![single]
        }
    }
}

/// Owned mode (L9): our file must carry the primary's plugins with identical content, in order.
/// Compared as written: our copy went through [`marshal`], which spells some numbers otherwise
/// (`1.0` as `1`, `1e3` as `1000`) and so reads back as another JSON number kind; comparing the
/// parsed values would call a fresh copy stale and rewrite it forever.
pub fn check_owned_copy(ours: &Value, primary: &Candidate) -> Result<(), Stale> {
    let ours: Vec<Value> = ours
        .get("plugins")
        .and_then(Value::as_array)
        .map(|p| p.iter().filter(|x| !is_istio_entry(x)).cloned().collect())
        .unwrap_or_default();
    if marshal(&Value::Array(ours)) == marshal(&Value::Array(primary_plugins(primary))) {
        Ok(())
    } else {
        Err(Stale::OwnedCopyDiffers(primary.name.clone()))
    }
}

/// Standalone: our file's top-level type must be istio-cni and its content what we would write.
pub fn check_standalone(ours: &Value, istio: &IstioPlugin) -> Result<(), Stale> {
    if ours.get("type").and_then(Value::as_str) != Some(ISTIO_TYPE) {
        return Err(Stale::NotStandalone);
    }
    if *ours != istio.to_value() {
        return Err(Stale::StandaloneDiffers);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    const TD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/testdata/install/");

    fn read(name: &str) -> Vec<u8> {
        std::fs::read(format!("{TD}{name}")).unwrap_or_else(|e| panic!("reading {name}: {e}"))
    }

    /// The plugin object Istio's tests use (testdata/istio-cni.conf).
    pub(crate) fn test_plugin(ambient: bool) -> IstioPlugin {
        let cfg = InstallConfig {
            ambient_enabled: ambient,
            ..InstallConfig::for_tests(PathBuf::from("/x"))
        };
        IstioPlugin::from_config(&cfg)
    }

    fn merged(primary_file: &str, ambient: bool) -> String {
        let cand = classify(primary_file, &read(primary_file)).expect("valid primary");
        let v = insert(primary_file, &cand.value, &test_plugin(ambient)).expect("merges");
        String::from_utf8(marshal(&v)).expect("utf8")
    }

    fn golden(name: &str) -> String {
        String::from_utf8(read(name)).expect("utf8")
    }

    /// A stale standalone istio-cni `.conf` as the primary: wrapped, it must not chain the
    /// plugin twice (the list would then fail our own check and be rewritten).
    #[test]
    fn a_single_istio_plugin_is_not_wrapped_twice() {
        let stale = serde_json::json!({"cniVersion": "0.3.1", "name": "x", "type": ISTIO_TYPE});
        let ours = test_plugin(false);
        let merged = insert("20-b.conf", &stale, &ours).unwrap();
        assert_eq!(merged["plugins"], Value::Array(vec![ours.list_entry()]));
        assert_eq!(check_chained(&merged, &ours), Ok(()));
        let c = classify("20-b.conf", &marshal(&stale)).unwrap();
        assert_eq!(primary_plugins(&c), Vec::<Value>::new());
    }

    /// A float in a primary's config survives our rewrite exactly: were it re-read 1 ulp off,
    /// the owned copy would never match its primary again and be rewritten on every check.
    #[test]
    fn floats_survive_marshal_and_reparse() {
        let text = br#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"x","f":-3.7877248441367966e+155}]}"#;
        let primary = classify("10-n.conflist", text).unwrap();
        let ours = insert("02-istio-cni.conflist", &primary.value, &test_plugin(false)).unwrap();
        let reread = classify("02-istio-cni.conflist", &marshal(&ours)).unwrap();
        assert_eq!(reread.value, ours);
        assert_eq!(check_owned_copy(&reread.value, &primary), Ok(()));
    }

    #[test]
    fn standalone_matches_istio_cni_conf() {
        let out = String::from_utf8(test_plugin(false).standalone_bytes()).expect("utf8");
        pretty_assertions::assert_eq!(out, golden("istio-cni.conf"));
    }

    #[test]
    fn merge_into_list_matches_golden() {
        pretty_assertions::assert_eq!(
            merged("list.conflist", false),
            golden("list.conflist.golden")
        );
    }

    #[test]
    fn merge_into_single_matches_golden() {
        pretty_assertions::assert_eq!(merged("bridge.conf", false), golden("bridge.conf.golden"));
    }

    #[test]
    fn merge_replaces_old_istio_entry() {
        pretty_assertions::assert_eq!(
            merged("list-with-istio.conflist", false),
            golden("list-with-istio.conflist.golden")
        );
    }

    #[test]
    fn owned_merges_match_goldens() {
        pretty_assertions::assert_eq!(
            merged("list.conflist", true),
            golden("istio-owned.conflist.golden")
        );
        pretty_assertions::assert_eq!(
            merged("bridge.conf", true),
            golden("istio-owned-bridge.conflist.golden")
        );
    }

    #[test]
    fn remove_matches_list_no_istio() {
        let v: Value = serde_json::from_slice(&read("list-with-istio.conflist")).expect("json");
        let out = remove("x", &v).expect("ok").expect("had an entry");
        pretty_assertions::assert_eq!(
            String::from_utf8(marshal(&out)).expect("utf8"),
            golden("list-no-istio.conflist")
        );
    }

    #[test]
    fn invalid_inputs_fail_to_merge() {
        let arr: Value = serde_json::from_slice(&read("invalid-arr.conflist")).expect("json");
        assert!(insert("invalid-arr.conflist", &arr, &test_plugin(false)).is_err());
        let map: Value = serde_json::from_slice(&read("invalid-map.conflist")).expect("json");
        assert!(insert("invalid-map.conflist", &map, &test_plugin(false)).is_err());
        assert!(classify("invalid-arr.conflist", &read("invalid-arr.conflist")).is_err());
        assert!(classify("invalid-map.conflist", &read("invalid-map.conflist")).is_err());
    }

    #[test]
    fn classify_follows_the_loader() {
        assert_eq!(
            classify("a.conf", br#"{"type":"x"}"#).map(|c| c.kind),
            Ok(Kind::Single)
        );
        assert!(classify("a.conf", br#"{"name":"x"}"#).is_err());
        assert!(classify("a.conflist", br#"{"plugins":[{"type":"x"}]}"#).is_err());
        assert!(classify("a.conflist", br#"{"name":"n","plugins":[]}"#).is_err());
        assert!(classify("a.conflist", br#"{"name":"n"}"#).is_err());
        assert!(classify("a.conflist", b"").is_err());
        assert_eq!(
            classify("a.json", br#"{"name":"n","plugins":[{"type":"x"}]}"#).map(|c| c.kind),
            Ok(Kind::List)
        );
        assert_eq!(
            classify("a.json", br#"{"type":"x"}"#).map(|c| c.kind),
            Ok(Kind::Single)
        );
        assert!(is_candidate_name("10-x.json") && !is_candidate_name("x.conflist.tmp.abc"));
    }

    #[test]
    fn big_integers_and_html_chars_survive() {
        let src = br#"{"name":"n","cniVersion":"1.0.0","plugins":[{"type":"x","big":18446744073709551615,"neg":-9007199254740993,"s":"<a&b>"}]}"#;
        let cand = classify("n.conflist", src).expect("valid");
        let out = String::from_utf8(marshal(
            &insert("n", &cand.value, &test_plugin(false)).expect("merges"),
        ))
        .expect("utf8");
        assert!(out.contains("18446744073709551615"), "{out}");
        assert!(out.contains("-9007199254740993"), "{out}");
        assert!(out.contains("\"<a&b>\""), "{out}");
    }

    #[test]
    fn checks_detect_missing_and_stale_entries() {
        let p = test_plugin(false);
        let good: Value = serde_json::from_str(&golden("list.conflist.golden")).expect("json");
        assert_eq!(check_chained(&good, &p), Ok(()));
        let bare: Value = serde_json::from_slice(&read("list.conflist")).expect("json");
        assert!(check_chained(&bare, &p).is_err());
        let old: Value = serde_json::from_slice(&read("list-with-istio.conflist")).expect("json");
        assert!(check_chained(&old, &p).is_err());
        let standalone: Value = serde_json::from_slice(&read("istio-cni.conf")).expect("json");
        assert_eq!(check_standalone(&standalone, &p), Ok(()));
        assert!(check_standalone(&bare, &p).is_err());
    }

    #[test]
    fn entry_carries_exclusions_and_selectors() {
        use crate::install::config::EnablementSelector;
        use crate::kube::selector::LabelSelector;
        let mut p = test_plugin(true);
        p.exclude_namespaces = Some(vec!["kube-system".to_string(), "istio-system".to_string()]);
        let mut labels = std::collections::BTreeMap::new();
        labels.insert("istio.io/dataplane-mode".to_string(), "ambient".to_string());
        p.enablement_selectors = vec![EnablementSelector {
            pod_selector: Some(LabelSelector {
                match_labels: Some(labels),
                match_expressions: None,
            }),
            namespace_selector: None,
        }];
        let v = p.list_entry();
        assert_eq!(
            v["exclude_namespaces"],
            serde_json::json!(["kube-system", "istio-system"])
        );
        assert_eq!(
            v["enablement_selectors"],
            serde_json::json!([{"podSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}}}])
        );
        assert!(v.get("cniVersion").is_none());
        let standalone = String::from_utf8(p.standalone_bytes()).expect("utf8");
        assert!(
            standalone.contains("\"exclude_namespaces\": [\n    \"kube-system\""),
            "{standalone}"
        );
    }

    #[test]
    fn insert_is_idempotent_and_remove_undoes_it() {
        let p = test_plugin(false);
        for input in ["list.conflist", "list-with-istio.conflist", "bridge.conf"] {
            let cand = classify(input, &read(input)).expect("valid");
            let once = insert(input, &cand.value, &p).expect("merges");
            let twice = insert(input, &once, &p).expect("merges again");
            assert_eq!(once, twice, "{input}");
            let removed = remove(input, &once).expect("ok").expect("had an entry");
            assert_eq!(remove(input, &removed).expect("ok"), None, "{input}");
            let plugins = removed
                .get("plugins")
                .and_then(Value::as_array)
                .expect("plugins");
            assert_eq!(plugins, &primary_plugins(&cand), "{input}");
        }
    }

    #[test]
    fn istio_entries_are_a_set_merge_keeps_one_last_and_remove_takes_all() {
        let p = test_plugin(false);
        let ours = p.list_entry();
        let stale: Value = serde_json::json!({"type": "istio-cni", "name": "istio-cni", "old": 1});
        let bridge: Value = serde_json::json!({"type": "bridge"});
        let tuning: Value = serde_json::json!({"type": "tuning"});
        let list = |plugins: Vec<Value>| serde_json::json!({"name": "n", "plugins": plugins});
        for plugins in [
            vec![stale.clone(), bridge.clone(), stale.clone(), tuning.clone()],
            vec![ours.clone(), bridge.clone(), tuning.clone(), ours.clone()],
            vec![bridge.clone(), ours.clone(), tuning.clone()],
            vec![bridge.clone(), tuning.clone(), ours.clone(), stale.clone()],
        ] {
            let input = list(plugins.clone());
            let merged = insert("x", &input, &p).expect("merges");
            assert_eq!(
                merged,
                list(vec![bridge.clone(), tuning.clone(), ours.clone()]),
                "{plugins:?}"
            );
            assert_eq!(check_chained(&merged, &p), Ok(()));
            if plugins.iter().filter(|x| is_istio_entry(x)).count() > 1 || plugins[2] != ours {
                assert!(check_chained(&input, &p).is_err(), "{plugins:?} passed");
            }
            assert_eq!(
                remove("x", &input).expect("ok"),
                Some(list(vec![bridge.clone(), tuning.clone()])),
                "{plugins:?}"
            );
        }
    }

    #[test]
    fn owned_copy_compares_full_plugin_content() {
        let primary = classify("list.conflist", &read("list.conflist")).expect("valid");
        let owned: Value =
            serde_json::from_str(&golden("istio-owned.conflist.golden")).expect("json");
        assert_eq!(check_owned_copy(&owned, &primary), Ok(()));
        let changed = classify(
            "list.conflist",
            String::from_utf8(read("list.conflist"))
                .expect("utf8")
                .replace("500", "501")
                .as_bytes(),
        )
        .expect("valid");
        assert!(check_owned_copy(&owned, &changed).is_err());
        let bridge = classify("bridge.conf", &read("bridge.conf")).expect("valid");
        let owned_b: Value =
            serde_json::from_str(&golden("istio-owned-bridge.conflist.golden")).expect("json");
        assert_eq!(check_owned_copy(&owned_b, &bridge), Ok(()));
    }

    /// A primary whose numbers our writer spells otherwise (`1.0`, `1e3`, `2.5E-3`): the copy we
    /// wrote, read back, still matches it (a mismatch here made owned mode rewrite in a loop),
    /// and a real change is still seen.
    #[test]
    fn owned_copy_of_numbers_spelled_otherwise_still_matches() {
        let text = r#"{"cniVersion":"0.3.1","name":"n","plugins":[{"type":"bridge","a":1.0,"b":1e3,"c":2.5E-3,"d":[1.0,-0.0]}]}"#;
        let primary = classify("00-a.conflist", text.as_bytes()).expect("valid");
        let copy = serde_json::json!({"plugins": primary_plugins(&primary)});
        let written: Value = serde_json::from_slice(&marshal(&copy)).expect("json");
        assert_eq!(check_owned_copy(&written, &primary), Ok(()));
        let changed = classify("00-a.conflist", text.replace("1e3", "1e4").as_bytes()).expect("ok");
        assert!(check_owned_copy(&written, &changed).is_err());
    }

    /// Fractional and huge numbers come back spelled as Go's encoder spells them (Istio's bytes).
    #[test]
    fn floats_are_written_as_go_writes_them() {
        let v: Value =
            serde_json::from_str(r#"{"a":1e3,"b":-0,"c":1e23,"d":1.5e-7,"e":0.0025,"f":1.0}"#)
                .expect("json");
        let text = String::from_utf8(marshal(&v)).expect("utf8");
        for want in [
            "\"a\": 1000,",
            "\"b\": -0,",
            "\"c\": 1e+23,",
            "\"d\": 1.5e-7,",
            "\"e\": 0.0025,",
            "\"f\": 1\n",
        ] {
            assert!(text.contains(want), "{want} in {text}");
        }
    }

    /// A plugin whose typed fields libcni cannot load makes the whole file invalid, as for the
    /// runtime (which then uses the next file).
    #[test]
    fn plugins_libcni_cannot_load_are_not_candidates() {
        for bad in [
            r#"{"name":"n","plugins":[{"type":"ptp","capabilities":{"x":{}}}]}"#,
            r#"{"name":"n","plugins":[{"type":"ptp","ipam":{"type":1}}]}"#,
            r#"{"name":"n","plugins":[{"type":"ptp","dns":{"nameservers":"1.1.1.1"}}]}"#,
            r#"{"name":"n","plugins":[{"type":"ptp","Name":5}]}"#,
            r#"{"name":"n","cniVersion":1,"plugins":[{"type":"ptp"}]}"#,
            r#"{"name":"n","disableCheck":"yes","plugins":[{"type":"ptp"}]}"#,
        ] {
            assert!(classify("a.conflist", bad.as_bytes()).is_err(), "{bad}");
        }
        assert!(classify("a.conf", br#"{"type":"ptp","capabilities":[]}"#).is_err());
        let good = r#"{"name":"n","disableCheck":"TRUE","plugins":[{"type":"ptp","capabilities":{"a":true,"b":null},"ipam":{"type":null,"x":{}},"dns":null,"other":{"k":[1]}}]}"#;
        assert!(classify("a.conflist", good.as_bytes()).is_ok());
    }
}
