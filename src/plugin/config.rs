//! The plugin's network configuration (stdin JSON). Every field Istio's plugin reads is accepted;
//! legacy keys older installers wrote are tolerated and ignored. Type errors name the field.

use std::path::PathBuf;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::cni::{CniError, code, validate_network_name};

/// Where the agent keeps its sockets, the plugin kubeconfig and the plugin log file.
pub const DEFAULT_AGENT_RUN_DIR: &str = "/var/run/istio-cni";
/// Overall ADD deadline: well below the 4 minutes the kubelet gives a sandbox start, which also
/// covers the primary CNI plugin.
pub const DEFAULT_ADD_TIMEOUT: Duration = Duration::from_secs(60);
/// Each Kubernetes request.
pub const DEFAULT_KUBE_CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the pod lookup is retried (Istio: 30 attempts, 1 s apart).
pub const DEFAULT_POD_LOOKUP_TIMEOUT: Duration = Duration::from_secs(30);
/// The agent answers from memory in well under a millisecond; past this a GET is the better bet.
pub const DEFAULT_POD_FACTS_TIMEOUT: Duration = Duration::from_millis(5);

/// One ambient enablement selector pair (shape checked when the config is parsed, operators and
/// keys when the selector is used; absent selects everything).
pub use crate::kube::selector::enablement::EnablementSelector;

/// The parsed configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct NetConf {
    pub cni_version: String,
    pub name: String,
    pub plugin_type: String,
    pub prev_result: Option<Value>,
    pub plugin_log_level: String,
    pub cni_agent_run_dir: PathBuf,
    pub ambient_enabled: bool,
    pub enablement_selectors: Vec<EnablementSelector>,
    pub exclude_namespaces: Vec<String>,
    pub pod_namespace: String,
    pub native_nftables: bool,
    pub enable_ambient_detection_retry: bool,
    /// The node's iptables flavour (`legacy` | `nft`) as install-cni decided it (our extension
    /// key, see docs/plugin.md): honoured over the plugin's own detection in the pod's netns, so
    /// every role on the node writes one flavour. Checked by ADD only (DEL must always succeed).
    pub force_iptables_binary: Option<String>,
    /// Our time budget (extension keys; see docs/plugin.md).
    pub add_timeout: Duration,
    pub kube_call_timeout: Duration,
    pub pod_lookup_timeout: Duration,
    /// How long the plugin waits for install-cni's pod-facts answer before GETting the pod.
    pub pod_facts_timeout: Duration,
}

/// The config's spec version as libcni decodes it: absent means 0.1.0.
pub fn config_version(stdin: &[u8]) -> Result<String, CniError> {
    let obj = parse_object(stdin)?;
    field::<String>(&obj, "cniVersion").map(|v| v.unwrap_or_else(|| "0.1.0".into()))
}

fn parse_object(stdin: &[u8]) -> Result<Map<String, Value>, CniError> {
    let value: Value = serde_json::from_slice(stdin).map_err(|e| {
        CniError::new(
            code::DECODING_FAILURE,
            format!("error unmarshalling network config: {e}"),
        )
    })?;
    match value {
        Value::Object(obj) => Ok(obj),
        other => Err(CniError::new(
            code::DECODING_FAILURE,
            format!(
                "error unmarshalling network config: expected a JSON object, got {}",
                kind(&other)
            ),
        )),
    }
}

use crate::wire::event::kind;

/// A key's value; like Go's decoder, an exact match first, then any case-insensitive one.
fn get<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).or_else(|| {
        obj.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v)
    })
}

/// Reads one optional key; JSON `null` counts as absent (Go leaves the zero value).
fn field<T: DeserializeOwned>(obj: &Map<String, Value>, key: &str) -> Result<Option<T>, CniError> {
    match get(obj, key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v.clone()).map(Some).map_err(|e| {
            CniError::new(
                code::INVALID_NETWORK_CONFIG,
                format!("invalid network config: field {key:?}: {e}"),
            )
        }),
    }
}

fn seconds(obj: &Map<String, Value>, key: &str, default: Duration) -> Result<Duration, CniError> {
    match field::<f64>(obj, key)? {
        None => Ok(default),
        Some(s) if s.is_finite() && s > 0.0 && s < 86_400.0 => Ok(Duration::from_secs_f64(s)),
        Some(s) => Err(CniError::new(
            code::INVALID_NETWORK_CONFIG,
            format!(
                "invalid network config: field {key:?}: {s} is not a positive number of seconds"
            ),
        )),
    }
}

/// The pre-2024 place of the exclusion list (`kubernetes.exclude_namespaces`), honoured only when
/// the current key is absent: an old conflist entry left on a node still protects those pods.
fn legacy_exclude_namespaces(obj: &Map<String, Value>) -> Vec<String> {
    get(obj, "kubernetes")
        .and_then(|k| k.as_object())
        .and_then(|k| get(k, "exclude_namespaces"))
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_default()
}

/// The run dir from a config that failed to parse as a whole (so its error can still be logged
/// there); `None` when the JSON or that one field is unusable.
pub fn salvage_run_dir(stdin: &[u8]) -> Option<PathBuf> {
    let obj = parse_object(stdin).ok()?;
    let dir: String = field(&obj, "cni_agent_run_dir").ok()??;
    (!dir.is_empty()).then(|| PathBuf::from(dir))
}

impl NetConf {
    /// Parses and checks the stdin config: JSON, network name, field types, and the spec version.
    pub fn parse(stdin: &[u8]) -> Result<NetConf, CniError> {
        let obj = parse_object(stdin)?;
        let name: String = field(&obj, "name")?.unwrap_or_default();
        validate_network_name(&name)?;
        let cni_version: String = field(&obj, "cniVersion")?.unwrap_or_else(|| "0.1.0".into());
        super::cni::check_supported(&cni_version)?;

        // Standard keys we do not use are still type-checked, as Go's decoder would.
        field::<std::collections::BTreeMap<String, bool>>(&obj, "capabilities")?;
        field::<Map<String, Value>>(&obj, "ipam")?;
        field::<Map<String, Value>>(&obj, "dns")?;
        let prev_result = match get(&obj, "prevResult") {
            None | Some(Value::Null) => None,
            Some(v @ Value::Object(_)) => Some(v.clone()),
            Some(other) => {
                return Err(CniError::new(
                    code::DECODING_FAILURE,
                    format!(
                        "could not parse prevResult: expected an object, got {}",
                        kind(other)
                    ),
                ));
            }
        };

        let selectors: Vec<Map<String, Value>> =
            field(&obj, "enablement_selectors")?.unwrap_or_default();
        let enablement_selectors = selectors
            .iter()
            .map(|s| {
                Ok(EnablementSelector {
                    pod_selector: field(s, "podSelector")?,
                    namespace_selector: field(s, "namespaceSelector")?,
                })
            })
            .collect::<Result<_, CniError>>()?;
        let run_dir: String = field(&obj, "cni_agent_run_dir")?.unwrap_or_default();

        Ok(NetConf {
            cni_version,
            name,
            plugin_type: field(&obj, "type")?.unwrap_or_default(),
            prev_result,
            plugin_log_level: field(&obj, "plugin_log_level")?.unwrap_or_default(),
            cni_agent_run_dir: if run_dir.is_empty() {
                PathBuf::from(DEFAULT_AGENT_RUN_DIR)
            } else {
                PathBuf::from(run_dir)
            },
            ambient_enabled: field(&obj, "ambient_enabled")?.unwrap_or(false),
            enablement_selectors,
            exclude_namespaces: match field::<Vec<String>>(&obj, "exclude_namespaces")? {
                Some(list) => list,
                None => legacy_exclude_namespaces(&obj),
            },
            pod_namespace: field(&obj, "pod_namespace")?.unwrap_or_default(),
            native_nftables: field(&obj, "native_nftables")?.unwrap_or(false),
            enable_ambient_detection_retry: field(&obj, "enable_ambient_detection_retry")?
                .unwrap_or(false),
            force_iptables_binary: field(&obj, "force_iptables_binary")?,
            add_timeout: seconds(&obj, "add_timeout_seconds", DEFAULT_ADD_TIMEOUT)?,
            kube_call_timeout: seconds(
                &obj,
                "kube_call_timeout_seconds",
                DEFAULT_KUBE_CALL_TIMEOUT,
            )?,
            pod_lookup_timeout: seconds(
                &obj,
                "pod_lookup_timeout_seconds",
                DEFAULT_POD_LOOKUP_TIMEOUT,
            )?,
            pod_facts_timeout: seconds(
                &obj,
                "pod_facts_timeout_seconds",
                DEFAULT_POD_FACTS_TIMEOUT,
            )?,
        })
    }

    pub fn kubeconfig_path(&self) -> PathBuf {
        self.cni_agent_run_dir.join("istio-cni-kubeconfig")
    }

    pub fn log_socket_path(&self) -> PathBuf {
        self.cni_agent_run_dir.join(crate::wire::log::SOCKET_NAME)
    }

    pub fn event_socket_path(&self) -> PathBuf {
        self.cni_agent_run_dir
            .join(crate::wire::event::PLUGIN_EVENT_SOCKET)
    }

    pub fn log_file_path(&self) -> PathBuf {
        self.cni_agent_run_dir.join("istio-cni.log")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape Istio's own plugin tests feed (legacy `kubernetes` block and all).
    const ISTIO_TEST_CONF: &str = r#"{
        "cniVersion": "1.0.0",
        "name": "istio-plugin-sample-test",
        "type": "sample",
        "runtimeconfig": {"sampleconfig": []},
        "loglevel": "debug",
        "plugin_log_level": "debug",
        "cni_agent_run_dir": "/tmp/x",
        "ambient_enabled": false,
        "enablement_selectors": [{"podSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}}}],
        "exclude_namespaces": ["testExcludeNS"],
        "kubernetes": {"k8s_api_root": "APIRoot", "kubeconfig": "testK8sConfig", "intercept_type": "iptables"},
        "prevResult": {"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2/24"}]}
    }"#;

    #[test]
    fn accepts_istio_fields_and_legacy_keys() {
        let conf = NetConf::parse(ISTIO_TEST_CONF.as_bytes()).unwrap();
        assert_eq!(conf.cni_version, "1.0.0");
        assert_eq!(conf.exclude_namespaces, vec!["testExcludeNS"]);
        assert_eq!(conf.plugin_log_level, "debug");
        assert_eq!(
            conf.kubeconfig_path(),
            PathBuf::from("/tmp/x/istio-cni-kubeconfig")
        );
        assert_eq!(conf.enablement_selectors.len(), 1);
        assert!(conf.enablement_selectors[0].namespace_selector.is_none());
        assert!(conf.prev_result.is_some());
        assert_eq!(conf.add_timeout, DEFAULT_ADD_TIMEOUT);
    }

    #[test]
    fn enablement_selectors_read_into_the_kube_selector_model() {
        let conf = br#"{"name":"n","enablement_selectors":[{"podSelector":{"matchExpressions":[{"key":"a","operator":"Exists"}]},"namespaceSelector":null}]}"#;
        let parsed = NetConf::parse(conf).expect("parses");
        let pod = parsed.enablement_selectors[0].pod_selector.as_ref();
        assert_eq!(
            pod.and_then(|p| p.match_expressions.as_ref()).map(Vec::len),
            Some(1)
        );
        assert!(parsed.enablement_selectors[0].namespace_selector.is_none());
        let bad = br#"{"name":"n","enablement_selectors":[{"podSelector":{"matchLabels":3}}]}"#;
        let err = NetConf::parse(bad).expect_err("wrong type");
        assert!(err.msg.contains("podSelector"), "{}", err.msg);
    }

    #[test]
    fn legacy_exclusion_list_is_a_fallback_only() {
        let old = br#"{"name":"n","kubernetes":{"exclude_namespaces":["kube-system"],"kubeconfig":"/x"}}"#;
        assert_eq!(
            NetConf::parse(old).unwrap().exclude_namespaces,
            vec!["kube-system"]
        );
        let both =
            br#"{"name":"n","exclude_namespaces":["a"],"kubernetes":{"exclude_namespaces":["b"]}}"#;
        assert_eq!(NetConf::parse(both).unwrap().exclude_namespaces, vec!["a"]);
        let junk = br#"{"name":"n","kubernetes":{"exclude_namespaces":"nope"}}"#;
        assert!(NetConf::parse(junk).unwrap().exclude_namespaces.is_empty());
    }

    #[test]
    fn null_exclude_namespaces_and_defaults() {
        let conf = NetConf::parse(br#"{"name":"n","exclude_namespaces":null}"#).unwrap();
        assert!(conf.exclude_namespaces.is_empty());
        assert_eq!(conf.cni_version, "0.1.0");
        assert_eq!(conf.cni_agent_run_dir, PathBuf::from(DEFAULT_AGENT_RUN_DIR));
    }

    #[test]
    fn errors_name_what_is_wrong() {
        let e = NetConf::parse(b"{\"name\": ").unwrap_err();
        assert_eq!(e.code, code::DECODING_FAILURE);
        assert!(e.msg.contains("EOF"), "{}", e.msg);
        let e = NetConf::parse(br#"{"name":"n","ambient_enabled":"yes"}"#).unwrap_err();
        assert_eq!(e.code, code::INVALID_NETWORK_CONFIG);
        assert!(e.msg.contains("ambient_enabled"), "{}", e.msg);
        let e = NetConf::parse(br#"{"name":"n","exclude_namespaces":"kube-system"}"#).unwrap_err();
        assert!(e.msg.contains("exclude_namespaces"), "{}", e.msg);
        let e = NetConf::parse(br#"{"cniVersion":"1.0.0"}"#).unwrap_err();
        assert_eq!(e.msg, "missing network name");
        let e = NetConf::parse(br#"{"name":"n","cniVersion":"2.0.0"}"#).unwrap_err();
        assert_eq!(e.code, code::INCOMPATIBLE_VERSION);
        let e = NetConf::parse(br#"[1]"#).unwrap_err();
        assert!(e.msg.contains("an array"), "{}", e.msg);
        let e = NetConf::parse(br#"{"name":"n","add_timeout_seconds":-1}"#).unwrap_err();
        assert!(e.msg.contains("add_timeout_seconds"), "{}", e.msg);
    }

    #[test]
    fn run_dir_is_salvaged_from_an_otherwise_bad_config() {
        let bad = br#"{"name":"n","cni_agent_run_dir":"/run/x","ambient_enabled":"yes"}"#;
        assert!(NetConf::parse(bad).is_err());
        assert_eq!(salvage_run_dir(bad), Some(PathBuf::from("/run/x")));
        assert_eq!(salvage_run_dir(b"{"), None);
    }

    #[test]
    fn keys_match_case_insensitively_like_go() {
        let conf =
            NetConf::parse(br#"{"Name":"n","CNIVersion":"0.4.0","Exclude_Namespaces":["a"]}"#)
                .unwrap();
        assert_eq!(conf.cni_version, "0.4.0");
        assert_eq!(conf.exclude_namespaces, vec!["a"]);
    }

    #[test]
    fn version_defaults_to_0_1_0() {
        assert_eq!(config_version(br#"{"name":"x"}"#).unwrap(), "0.1.0");
        assert_eq!(
            config_version(br#"{"cniVersion":"1.1.0"}"#).unwrap(),
            "1.1.0"
        );
    }
}
