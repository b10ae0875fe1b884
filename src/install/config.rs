//! Pure configuration parsing for `install-cni`: flags (argh, after the pflag normaliser) and env
//! fallbacks, resolved as flag > env > default, exactly under Istio's names. The env lookup is a
//! function argument so tests never touch the process environment.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

use argh::FromArgs;
use serde::{Deserialize, Serialize};

use crate::kube::selector::{self, LabelSelector};

/// install-cni: installs the Istio CNI plugin on this node, guards its config, serves health/metrics.
/// Every option can also be set through the env var named in its description (flag > env >
/// default); `--flag=value`, bare boolean flags and underscore names are accepted.
#[derive(FromArgs, Debug, Default)]
pub struct Flags {
    /// primary CNI config file name; empty = auto-detect the highest-priority file (env CNI_CONF_NAME)
    #[argh(option)]
    pub cni_conf_name: Option<String>,
    /// chain istio-cni into the primary config (true) or write a standalone config (false); default true (env CHAINED_CNI_PLUGIN)
    #[argh(option)]
    pub chained_cni_plugin: Option<String>,
    /// write a separate Istio-owned conflist (only with chained + ambient); default false (env ISTIO_OWNED_CNI_CONFIG)
    #[argh(option)]
    pub istio_owned_cni_config: Option<String>,
    /// file name of the Istio-owned conflist; default 02-istio-cni.conflist (env ISTIO_OWNED_CNI_CONFIG_FILENAME, legacy ISTIO_OWNED_CNI_CONF_FILENAME)
    #[argh(option)]
    pub istio_owned_cni_config_filename: Option<String>,
    /// directory holding the node's CNI configs as seen here; default /host/etc/cni/net.d (env MOUNTED_CNI_NET_DIR)
    #[argh(option)]
    pub mounted_cni_net_dir: Option<String>,
    /// comma-separated directories the plugin binary is installed into; default /host/opt/cni/bin,/host/secondary-bin-dir (env CNI_BIN_DIRS)
    #[argh(option)]
    pub cni_bin_dirs: Option<String>,
    /// agent run directory (sockets, plugin kubeconfig, plugin log); same path on host and here; default /var/run/istio-cni (env CNI_AGENT_RUN_DIR)
    #[argh(option)]
    pub cni_agent_run_dir: Option<String>,
    /// file mode of the plugin kubeconfig (octal with a leading 0, or decimal); default 0600 (env KUBECONFIG_MODE)
    #[argh(option)]
    pub kubeconfig_mode: Option<String>,
    /// write CNI config files 0640 instead of 0600 when not keeping an existing mode; default false (env CNI_CONF_GROUP_READ)
    #[argh(option)]
    pub cni_conf_group_read: Option<String>,
    /// CA file embedded in the plugin kubeconfig; default <service-account-dir>/ca.crt (env KUBE_CA_FILE)
    #[argh(option)]
    pub kube_ca_file: Option<String>,
    /// write insecure-skip-tls-verify into the plugin kubeconfig instead of a CA; default false (env SKIP_TLS_VERIFY)
    #[argh(option)]
    pub skip_tls_verify: Option<String>,
    /// service-account directory holding token and ca.crt; default /var/run/secrets/kubernetes.io/serviceaccount (env SERVICE_ACCOUNT_DIR)
    #[argh(option)]
    pub service_account_dir: Option<String>,
    /// host procfs mount; default /host/proc (env HOST_PROC_DIR)
    #[argh(option)]
    pub host_proc_dir: Option<String>,
    /// host netns directory mount; default /host/var/run/netns (env HOST_NETNS_DIR)
    #[argh(option)]
    pub host_netns_dir: Option<String>,
    /// port of /healthz and /readyz (0 = any free port); default 8000 (env HEALTH_PORT)
    #[argh(option)]
    pub health_port: Option<String>,
    /// port of the Prometheus /metrics endpoint, <= 0 disables it; default 15014 (env MONITORING_PORT)
    #[argh(option)]
    pub monitoring_port: Option<String>,
    /// ZDS socket ztunnel connects to; default /var/run/ztunnel/ztunnel.sock (env ZTUNNEL_UDS_ADDRESS)
    #[argh(option)]
    pub ztunnel_uds_address: Option<String>,
    /// enable ambient mode (node agent, plugin ambient branch); default false (env AMBIENT_ENABLED)
    #[argh(option)]
    pub ambient_enabled: Option<String>,
    /// plugin retries ambient pod detection and fails ADD on API errors; default false (env ENABLE_AMBIENT_DETECTION_RETRY)
    #[argh(option)]
    pub enable_ambient_detection_retry: Option<String>,
    /// run the repair controller; default true (env REPAIR_ENABLED)
    #[argh(option)]
    pub repair_enabled: Option<String>,
    /// repair by deleting broken pods; default false (env REPAIR_DELETE_PODS)
    #[argh(option)]
    pub repair_delete_pods: Option<String>,
    /// repair by labelling broken pods; default false (env REPAIR_LABEL_PODS)
    #[argh(option)]
    pub repair_label_pods: Option<String>,
    /// label key put on broken pods; default cni.istio.io/uninitialized (env REPAIR_BROKEN_POD_LABEL_KEY)
    #[argh(option)]
    pub repair_broken_pod_label_key: Option<String>,
    /// label value put on broken pods; default true (env REPAIR_BROKEN_POD_LABEL_VALUE)
    #[argh(option)]
    pub repair_broken_pod_label_value: Option<String>,
    /// node whose pods are repaired; default empty (env REPAIR_NODE_NAME)
    #[argh(option)]
    pub repair_node_name: Option<String>,
    /// annotation marking injected pods; default sidecar.istio.io/status (env REPAIR_SIDECAR_ANNOTATION)
    #[argh(option)]
    pub repair_sidecar_annotation: Option<String>,
    /// validation init container name; default istio-validation (env REPAIR_INIT_CONTAINER_NAME)
    #[argh(option)]
    pub repair_init_container_name: Option<String>,
    /// termination message identifying broken pods; default empty = any (env REPAIR_INIT_CONTAINER_TERMINATION_MESSAGE)
    #[argh(option)]
    pub repair_init_container_termination_message: Option<String>,
    /// exit code identifying broken pods (0 = any); default 126 (env REPAIR_INIT_CONTAINER_EXIT_CODE)
    #[argh(option)]
    pub repair_init_container_exit_code: Option<String>,
    /// extra label selectors for the repair informer; default empty (env REPAIR_LABEL_SELECTORS)
    #[argh(option)]
    pub repair_label_selectors: Option<String>,
    /// extra field selectors for the repair informer; default empty (env REPAIR_FIELD_SELECTORS)
    #[argh(option)]
    pub repair_field_selectors: Option<String>,
    /// accepted and ignored, as in Istio (env LOG_LEVEL); use --log_output_level
    #[argh(option)]
    pub log_level: Option<String>,
    /// accepted and ignored (legacy template mechanism) (env CNI_NETWORK_CONFIG)
    #[argh(option)]
    pub cni_network_config: Option<String>,
    /// accepted and ignored (legacy template mechanism) (env CNI_NETWORK_CONFIG_FILE)
    #[argh(option)]
    pub cni_network_config_file: Option<String>,
    /// per-scope log levels, `<level>` or `<scope>:<level>,...` (scopes: all, default, cni-agent, cni-plugin; levels: debug, info, warn, error, fatal, none); default info (env LOG_OUTPUT_LEVEL)
    #[argh(option)]
    pub log_output_level: Option<String>,
    /// log as JSON lines instead of Istio's tab-separated text; default false (env LOG_AS_JSON)
    #[argh(option)]
    pub log_as_json: Option<String>,
    /// where logs go: stderr, stdout or a file path; default stderr (env LOG_TARGET)
    #[argh(option)]
    pub log_target: Option<String>,
    /// accepted for compatibility; stack traces are not emitted (env LOG_STACKTRACE_LEVEL)
    #[argh(option)]
    pub log_stacktrace_level: Option<String>,
    /// accepted for compatibility; caller info is not emitted (env LOG_CALLER)
    #[argh(option)]
    pub log_caller: Option<String>,
    /// accepted for compatibility; no log rotation (env LOG_ROTATE)
    #[argh(option)]
    pub log_rotate: Option<String>,
    /// accepted for compatibility (env LOG_ROTATE_MAX_AGE)
    #[argh(option)]
    pub log_rotate_max_age: Option<String>,
    /// accepted for compatibility (env LOG_ROTATE_MAX_BACKUPS)
    #[argh(option)]
    pub log_rotate_max_backups: Option<String>,
    /// accepted for compatibility (env LOG_ROTATE_MAX_SIZE)
    #[argh(option)]
    pub log_rotate_max_size: Option<String>,
    /// accepted for compatibility; there is no ControlZ (env CTRLZ_PORT)
    #[argh(option)]
    pub ctrlz_port: Option<String>,
    /// accepted for compatibility; there is no ControlZ (env CTRLZ_ADDRESS)
    #[argh(option)]
    pub ctrlz_address: Option<String>,
    /// print the version and exit
    #[argh(switch)]
    pub version: bool,
    /// optional subcommand: `version`
    #[argh(positional)]
    pub command: Vec<String>,
}

/// Flags that are booleans (dash form); the normaliser turns a bare one into `--flag true`.
const BOOL_FLAGS: &[&str] = &[
    "chained-cni-plugin",
    "istio-owned-cni-config",
    "cni-conf-group-read",
    "skip-tls-verify",
    "ambient-enabled",
    "enable-ambient-detection-retry",
    "repair-enabled",
    "repair-delete-pods",
    "repair-label-pods",
    "log-as-json",
    "log-caller",
];

/// Default owned conflist name (Istio's).
pub const DEFAULT_OWNED_FILENAME: &str = "02-istio-cni.conflist";
/// Default standalone config name (Istio's).
pub const DEFAULT_STANDALONE_FILENAME: &str = "YYY-istio-cni.conf";
/// Name of the plugin kubeconfig in the run dir.
pub const KUBECONFIG_FILENAME: &str = "istio-cni-kubeconfig";
/// Name the plugin binary is installed under.
pub const PLUGIN_BINARY: &str = "istio-cni";

/// A configuration error; every variant names the flag/env var and the bad value.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("invalid value {value:?} for {name}: {reason}")]
    Invalid {
        name: String,
        value: String,
        reason: String,
    },
    #[error("{0}")]
    Args(String),
}

/// The outcome of parsing argv: run with a config, or print text and exit.
#[derive(Debug)]
pub enum Parsed {
    Run(Box<Config>),
    Exit { text: String, code: i32 },
}

/// A minimum log level of one scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
    Fatal,
    None,
}

impl LogLevel {
    fn parse(s: &str) -> Option<Self> {
        Some(match s.trim().to_ascii_lowercase().as_str() {
            "debug" => Self::Debug,
            "info" => Self::Info,
            "warn" | "warning" => Self::Warn,
            "error" => Self::Error,
            "fatal" => Self::Fatal,
            "none" => Self::None,
            _ => return None,
        })
    }

    /// The name as Istio spells it (also what the plugin's `plugin_log_level` takes).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Debug => "debug",
            Self::Info => "info",
            Self::Warn => "warn",
            Self::Error => "error",
            Self::Fatal => "fatal",
            Self::None => "none",
        }
    }
}

/// Where logs are written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogTarget {
    Stderr,
    Stdout,
    File(PathBuf),
}

/// Logging settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    /// Level of scopes not named explicitly.
    pub default_level: LogLevel,
    /// Explicit per-scope levels.
    pub scopes: BTreeMap<String, LogLevel>,
    pub as_json: bool,
    pub target: LogTarget,
}

impl LogConfig {
    /// Level of one scope.
    pub fn level_of(&self, scope: &str) -> LogLevel {
        self.scopes
            .get(scope)
            .copied()
            .unwrap_or(self.default_level)
    }
}

/// One ambient enablement selector (pod + namespace label selectors), as the plugin expects it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnablementSelector {
    #[serde(
        rename = "podSelector",
        default,
        deserialize_with = "selector::deserialize_strict",
        skip_serializing_if = "Option::is_none"
    )]
    pub pod_selector: Option<LabelSelector>,
    #[serde(
        rename = "namespaceSelector",
        default,
        deserialize_with = "selector::deserialize_strict",
        skip_serializing_if = "Option::is_none"
    )]
    pub namespace_selector: Option<LabelSelector>,
}

/// Settings of the install pass, the guard and cleanup.
#[derive(Debug, Clone, PartialEq)]
pub struct InstallConfig {
    pub mounted_cni_net_dir: PathBuf,
    pub cni_conf_name: Option<String>,
    pub chained: bool,
    pub istio_owned_cni_config: bool,
    pub owned_filename: String,
    pub cni_bin_dirs: Vec<PathBuf>,
    pub run_dir: PathBuf,
    pub kubeconfig_mode: u32,
    pub cni_conf_group_read: bool,
    pub kube_ca_file: PathBuf,
    pub skip_tls_verify: bool,
    pub service_account_dir: PathBuf,
    pub k8s_service_host: Option<String>,
    pub k8s_service_port: Option<String>,
    pub k8s_service_protocol: String,
    pub ambient_enabled: bool,
    pub enable_ambient_detection_retry: bool,
    pub native_nftables: bool,
    pub exclude_namespaces: Vec<String>,
    pub pod_namespace: String,
    pub enablement_selectors: Vec<EnablementSelector>,
    pub plugin_log_level: LogLevel,
    pub ambient_disable_safe_upgrade: bool,
    pub node_name: String,
}

impl InstallConfig {
    /// The one predicate for "Istio owns a separate conflist", used by writing, validation AND
    /// cleanup (Istio bug B2: cleanup used the raw flag and deleted the primary's config).
    pub fn owned_mode(&self) -> bool {
        self.istio_owned_cni_config && self.chained && self.ambient_enabled
    }

    /// Path of the plugin kubeconfig.
    pub fn kubeconfig_path(&self) -> PathBuf {
        self.run_dir.join(KUBECONFIG_FILENAME)
    }
}

/// Repair controller settings (parsed and validated here; the controller lives elsewhere).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairConfig {
    pub enabled: bool,
    pub delete_pods: bool,
    pub label_pods: bool,
    pub repair_pods: bool,
    pub broken_pod_label_key: String,
    pub broken_pod_label_value: String,
    pub node_name: String,
    pub sidecar_annotation: String,
    pub init_container_name: String,
    pub init_container_termination_message: String,
    pub init_container_exit_code: i32,
    pub label_selectors: String,
    pub field_selectors: String,
}

/// Ambient node-agent settings (parsed and validated here for the agent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentConfig {
    pub ztunnel_uds_address: PathBuf,
    pub dns_capture: bool,
    pub ipv6: bool,
    pub reconcile_pod_rules_on_startup: bool,
    pub system_namespace: String,
    pub pod_name: String,
    pub node_name: String,
    pub host_probe_snat_ip: IpAddr,
    pub host_probe_snat_ipv6: IpAddr,
    pub scoped_xtables_locking: bool,
    pub aws_branch_eni_probe: bool,
    pub force_iptables_binary: Option<String>,
    pub allow_switch_to_host_ns: bool,
}

/// The whole `install-cni` configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub install: InstallConfig,
    pub repair: RepairConfig,
    pub agent: AgentConfig,
    pub log: LogConfig,
    pub health_port: u16,
    /// `None` = metrics disabled.
    pub monitoring_port: Option<u16>,
    pub host_proc_dir: PathBuf,
    pub host_netns_dir: PathBuf,
    /// Warnings found while parsing, logged once logging is up.
    pub warnings: Vec<String>,
}

/// Parses `args` (the full argv, program name first) with `env` as the environment.
pub fn parse(args: &[String], env: &dyn Fn(&str) -> Option<String>) -> Result<Parsed, ConfigError> {
    let shapes = crate::cli::FlagShapes {
        switches: &["version"],
        shorts: &[],
        underscore_longs: &[],
        all_underscores: true,
        bool_options: BOOL_FLAGS,
        repeatable: &[],
        positionals: true,
    };
    let rest = crate::cli::normalise_args(args.get(1..).unwrap_or(&[]), &shapes)
        .map_err(|e| ConfigError::Args(e.to_string()))?
        .args;
    let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
    let flags = match Flags::from_args(&["install-cni"], &rest) {
        Ok(f) => f,
        Err(early) => {
            return Ok(Parsed::Exit {
                text: early.output,
                code: if early.status.is_ok() { 0 } else { 2 },
            });
        }
    };
    if flags.version || flags.command.first().is_some_and(|c| c == "version") {
        return Ok(Parsed::Exit {
            text: format!("install-cni (istio-cni-rs) {}\n", crate::VERSION),
            code: 0,
        });
    }
    if let Some(cmd) = flags.command.first() {
        return Err(ConfigError::Args(format!(
            "unknown command {cmd:?} (only `version`)"
        )));
    }
    from_flags(&flags, env).map(|c| Parsed::Run(Box::new(c)))
}

/// One setting's raw value and where it came from (for error messages).
struct Raw {
    name: String,
    value: String,
}

struct Resolver<'a> {
    env: &'a dyn Fn(&str) -> Option<String>,
}

impl Resolver<'_> {
    /// flag > env > none. An empty env var counts as unset (viper's default).
    fn raw(&self, flag: &Option<String>, flag_name: &str, env_name: &str) -> Option<Raw> {
        if let Some(v) = flag {
            return Some(Raw {
                name: format!("--{flag_name}"),
                value: v.clone(),
            });
        }
        self.env_raw(env_name)
    }

    fn env_raw(&self, env_name: &str) -> Option<Raw> {
        (self.env)(env_name)
            .filter(|v| !v.is_empty())
            .map(|value| Raw {
                name: format!("env {env_name}"),
                value,
            })
    }

    fn string(
        &self,
        flag: &Option<String>,
        flag_name: &str,
        env_name: &str,
        default: &str,
    ) -> String {
        self.raw(flag, flag_name, env_name)
            .map(|r| r.value)
            .unwrap_or_else(|| default.to_string())
    }

    fn env_string(&self, env_name: &str, default: &str) -> String {
        self.env_raw(env_name)
            .map(|r| r.value)
            .unwrap_or_else(|| default.to_string())
    }

    fn boolean(
        &self,
        flag: &Option<String>,
        flag_name: &str,
        env_name: &str,
        default: bool,
    ) -> Result<bool, ConfigError> {
        match self.raw(flag, flag_name, env_name) {
            Some(r) => parse_bool(&r),
            None => Ok(default),
        }
    }

    fn env_bool(&self, env_name: &str, default: bool) -> Result<bool, ConfigError> {
        match self.env_raw(env_name) {
            Some(r) => parse_bool(&r),
            None => Ok(default),
        }
    }
}

fn invalid(raw: &Raw, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        name: raw.name.clone(),
        value: raw.value.clone(),
        reason: reason.into(),
    }
}

/// Go's strconv.ParseBool, which pflag and viper use.
fn parse_bool(raw: &Raw) -> Result<bool, ConfigError> {
    crate::cli::parse_go_bool(raw.value.trim())
        .ok_or_else(|| invalid(raw, "expected a boolean (true/false)"))
}

/// Go's strconv.ParseInt with base 0 (viper's cast): `0600` is octal, `0x..` hex, `0o..` octal.
fn parse_go_int(s: &str) -> Option<i64> {
    let s = s.trim();
    let (neg, digits) = match s.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let digits = digits.replace('_', "");
    let parsed = if let Some(h) = digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        i64::from_str_radix(h, 16).ok()
    } else if let Some(o) = digits
        .strip_prefix("0o")
        .or_else(|| digits.strip_prefix("0O"))
    {
        i64::from_str_radix(o, 8).ok()
    } else if let Some(b) = digits
        .strip_prefix("0b")
        .or_else(|| digits.strip_prefix("0B"))
    {
        i64::from_str_radix(b, 2).ok()
    } else if digits.len() > 1 && digits.starts_with('0') {
        i64::from_str_radix(&digits[1..], 8).ok()
    } else {
        digits.parse::<i64>().ok()
    }?;
    Some(if neg { -parsed } else { parsed })
}

fn file_name_only(raw: &Raw) -> Result<String, ConfigError> {
    let v = raw.value.trim();
    if v.contains('/') || v == "." || v == ".." {
        return Err(invalid(raw, "must be a file name, not a path"));
    }
    Ok(v.to_string())
}

fn split_list(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect()
}

/// Parses `--log_output_level`: `level` or `scope:level,...`. A bare level and `default:` set the
/// level of every scope not named explicitly; `all:` sets every scope.
pub fn parse_log_levels(s: &str) -> Result<(LogLevel, BTreeMap<String, LogLevel>), String> {
    let mut default = LogLevel::Info;
    let mut scopes = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (scope, level) = match part.rsplit_once(':') {
            Some((sc, lv)) => (sc.trim(), lv),
            None => ("default", part),
        };
        let level = LogLevel::parse(level).ok_or_else(|| format!("unknown log level {level:?}"))?;
        match scope {
            "default" => default = level,
            "all" => {
                default = level;
                scopes.clear();
            }
            "" => return Err(format!("empty scope in {part:?}")),
            other => {
                scopes.insert(other.to_string(), level);
            }
        }
    }
    Ok((default, scopes))
}

/// Parses `AMBIENT_ENABLEMENT_SELECTOR` (JSON or the chart's YAML).
pub fn parse_selectors(text: &str) -> Result<Vec<EnablementSelector>, String> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Ok(Vec::new());
    }
    // JSON first (its errors are the clearer ones for JSON input), then YAML (the chart's `toYaml`).
    let selectors: Option<Vec<EnablementSelector>> = match serde_json::from_str(trimmed) {
        Ok(v) => v,
        Err(json_err) if trimmed.starts_with('[') || trimmed.starts_with('{') => {
            serde_saphyr::from_str(trimmed).map_err(|_| format!("bad JSON: {json_err}"))?
        }
        Err(_) => serde_saphyr::from_str(trimmed).map_err(|e| format!("bad YAML: {e}"))?,
    };
    let selectors = selectors.unwrap_or_default();
    for sel in &selectors {
        for ls in [&sel.pod_selector, &sel.namespace_selector]
            .into_iter()
            .flatten()
        {
            selector::Selector::compile(ls).map_err(|e| e.to_string())?;
        }
    }
    Ok(selectors)
}

fn port(raw: &Raw) -> Result<u16, ConfigError> {
    match parse_go_int(&raw.value) {
        Some(p) if (0..=65535).contains(&p) => Ok(p as u16),
        _ => Err(invalid(raw, "expected a port number 0-65535")),
    }
}

/// Builds the config from parsed flags and the environment.
pub fn from_flags(f: &Flags, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
    let r = Resolver { env };
    let mut warnings = Vec::new();

    let chained = r.boolean(
        &f.chained_cni_plugin,
        "chained-cni-plugin",
        "CHAINED_CNI_PLUGIN",
        true,
    )?;
    let owned = r.boolean(
        &f.istio_owned_cni_config,
        "istio-owned-cni-config",
        "ISTIO_OWNED_CNI_CONFIG",
        false,
    )?;
    let ambient_enabled = r.boolean(
        &f.ambient_enabled,
        "ambient-enabled",
        "AMBIENT_ENABLED",
        false,
    )?;

    // Istio bug B1: the chart writes ISTIO_OWNED_CNI_CONF_FILENAME, the agent reads
    // ISTIO_OWNED_CNI_CONFIG_FILENAME. Accept both; the correct name wins.
    let owned_raw = r.raw(
        &f.istio_owned_cni_config_filename,
        "istio-owned-cni-config-filename",
        "ISTIO_OWNED_CNI_CONFIG_FILENAME",
    );
    let legacy = r.env_raw("ISTIO_OWNED_CNI_CONF_FILENAME");
    let owned_raw = match (owned_raw, legacy) {
        (Some(o), Some(l)) => {
            if o.value != l.value {
                warnings.push(format!(
                    "ignoring legacy env ISTIO_OWNED_CNI_CONF_FILENAME={:?}: {} is set to {:?}",
                    l.value, o.name, o.value
                ));
            }
            Some(o)
        }
        (Some(o), None) => Some(o),
        (None, Some(l)) => {
            warnings.push(
                "env ISTIO_OWNED_CNI_CONF_FILENAME is a misspelt legacy name (Istio chart bug); \
                 using it, please set ISTIO_OWNED_CNI_CONFIG_FILENAME instead"
                    .to_string(),
            );
            Some(l)
        }
        (None, None) => None,
    };
    let owned_filename = match owned_raw {
        Some(raw) => file_name_only(&raw)?,
        None => DEFAULT_OWNED_FILENAME.to_string(),
    };
    let cni_conf_name = match r.raw(&f.cni_conf_name, "cni-conf-name", "CNI_CONF_NAME") {
        Some(raw) => Some(file_name_only(&raw)?).filter(|s| !s.is_empty()),
        None => None,
    };

    let bin_raw = r
        .raw(&f.cni_bin_dirs, "cni-bin-dirs", "CNI_BIN_DIRS")
        .unwrap_or(Raw {
            name: "--cni-bin-dirs".to_string(),
            value: "/host/opt/cni/bin,/host/secondary-bin-dir".to_string(),
        });
    let cni_bin_dirs: Vec<PathBuf> = split_list(&bin_raw.value)
        .into_iter()
        .map(PathBuf::from)
        .collect();
    if cni_bin_dirs.is_empty() {
        return Err(invalid(&bin_raw, "needs at least one directory"));
    }

    let kubeconfig_mode = match r.raw(&f.kubeconfig_mode, "kubeconfig-mode", "KUBECONFIG_MODE") {
        Some(raw) => match parse_go_int(&raw.value) {
            Some(m) if (0..=0o7777).contains(&m) => m as u32,
            _ => {
                return Err(invalid(
                    &raw,
                    "expected a file mode such as 0600 (octal) or 384",
                ));
            }
        },
        None => 0o600,
    };

    let service_account_dir = PathBuf::from(r.string(
        &f.service_account_dir,
        "service-account-dir",
        "SERVICE_ACCOUNT_DIR",
        "/var/run/secrets/kubernetes.io/serviceaccount",
    ));
    let kube_ca_file = r
        .raw(&f.kube_ca_file, "kube-ca-file", "KUBE_CA_FILE")
        .map(|raw| PathBuf::from(raw.value))
        .unwrap_or_else(|| service_account_dir.join("ca.crt"));

    let log_levels_raw = r.raw(&f.log_output_level, "log-output-level", "LOG_OUTPUT_LEVEL");
    let (default_level, scopes) = match &log_levels_raw {
        Some(raw) => parse_log_levels(&raw.value).map_err(|e| invalid(raw, e))?,
        None => (LogLevel::Info, BTreeMap::new()),
    };
    let log = LogConfig {
        default_level,
        scopes,
        as_json: r.boolean(&f.log_as_json, "log-as-json", "LOG_AS_JSON", false)?,
        target: match r
            .string(&f.log_target, "log-target", "LOG_TARGET", "stderr")
            .as_str()
        {
            "stderr" => LogTarget::Stderr,
            "stdout" => LogTarget::Stdout,
            path => LogTarget::File(PathBuf::from(path)),
        },
    };
    // Istio bug B16: the plugin's scope keeps its own level instead of the agent's.
    let plugin_log_level = log.level_of("cni-plugin");

    let selectors_raw = r.env_raw("AMBIENT_ENABLEMENT_SELECTOR");
    let enablement_selectors = match &selectors_raw {
        Some(raw) => parse_selectors(&raw.value).map_err(|e| invalid(raw, e))?,
        None => Vec::new(),
    };

    let health_port = match r.raw(&f.health_port, "health-port", "HEALTH_PORT") {
        Some(raw) => port(&raw)?,
        None => 8000,
    };
    let monitoring_port = match r.raw(&f.monitoring_port, "monitoring-port", "MONITORING_PORT") {
        Some(raw) => match parse_go_int(&raw.value) {
            Some(p) if p <= 0 => None,
            Some(p) if p <= 65535 => Some(p as u16),
            _ => {
                return Err(invalid(
                    &raw,
                    "expected a port number (<= 0 disables metrics)",
                ));
            }
        },
        None => Some(15014),
    };

    let node_name = r.env_string("NODE_NAME", "");
    let install = InstallConfig {
        mounted_cni_net_dir: PathBuf::from(r.string(
            &f.mounted_cni_net_dir,
            "mounted-cni-net-dir",
            "MOUNTED_CNI_NET_DIR",
            "/host/etc/cni/net.d",
        )),
        cni_conf_name,
        chained,
        istio_owned_cni_config: owned,
        owned_filename,
        cni_bin_dirs,
        run_dir: PathBuf::from(r.string(
            &f.cni_agent_run_dir,
            "cni-agent-run-dir",
            "CNI_AGENT_RUN_DIR",
            "/var/run/istio-cni",
        )),
        kubeconfig_mode,
        cni_conf_group_read: r.boolean(
            &f.cni_conf_group_read,
            "cni-conf-group-read",
            "CNI_CONF_GROUP_READ",
            false,
        )?,
        kube_ca_file,
        skip_tls_verify: r.boolean(
            &f.skip_tls_verify,
            "skip-tls-verify",
            "SKIP_TLS_VERIFY",
            false,
        )?,
        service_account_dir,
        k8s_service_host: r.env_raw("KUBERNETES_SERVICE_HOST").map(|r| r.value),
        k8s_service_port: r.env_raw("KUBERNETES_SERVICE_PORT").map(|r| r.value),
        k8s_service_protocol: r.env_string("KUBERNETES_SERVICE_PROTOCOL", "https"),
        ambient_enabled,
        enable_ambient_detection_retry: r.boolean(
            &f.enable_ambient_detection_retry,
            "enable-ambient-detection-retry",
            "ENABLE_AMBIENT_DETECTION_RETRY",
            false,
        )?,
        native_nftables: r.env_bool("NATIVE_NFTABLES", false)?,
        exclude_namespaces: split_list(&r.env_string("EXCLUDE_NAMESPACES", "")),
        pod_namespace: r.env_string("POD_NAMESPACE", ""),
        enablement_selectors,
        plugin_log_level,
        ambient_disable_safe_upgrade: r.env_bool("AMBIENT_DISABLE_SAFE_UPGRADE", false)?,
        node_name: node_name.clone(),
    };
    if owned && !install.owned_mode() {
        warnings.push(format!(
            "ISTIO_OWNED_CNI_CONFIG is set but has no effect: it needs CHAINED_CNI_PLUGIN=true (is {chained}) \
             and AMBIENT_ENABLED=true (is {ambient_enabled}); merging into the primary config instead"
        ));
    }

    let exit_code_raw = r.raw(
        &f.repair_init_container_exit_code,
        "repair-init-container-exit-code",
        "REPAIR_INIT_CONTAINER_EXIT_CODE",
    );
    let init_container_exit_code = match &exit_code_raw {
        Some(raw) => match parse_go_int(&raw.value) {
            Some(c) if (i32::MIN as i64..=i32::MAX as i64).contains(&c) => c as i32,
            _ => return Err(invalid(raw, "expected an integer exit code")),
        },
        None => 126,
    };
    let repair = RepairConfig {
        enabled: r.boolean(&f.repair_enabled, "repair-enabled", "REPAIR_ENABLED", true)?,
        delete_pods: r.boolean(
            &f.repair_delete_pods,
            "repair-delete-pods",
            "REPAIR_DELETE_PODS",
            false,
        )?,
        label_pods: r.boolean(
            &f.repair_label_pods,
            "repair-label-pods",
            "REPAIR_LABEL_PODS",
            false,
        )?,
        repair_pods: r.env_bool("REPAIR_REPAIR_PODS", false)?,
        broken_pod_label_key: r.string(
            &f.repair_broken_pod_label_key,
            "repair-broken-pod-label-key",
            "REPAIR_BROKEN_POD_LABEL_KEY",
            "cni.istio.io/uninitialized",
        ),
        broken_pod_label_value: r.string(
            &f.repair_broken_pod_label_value,
            "repair-broken-pod-label-value",
            "REPAIR_BROKEN_POD_LABEL_VALUE",
            "true",
        ),
        node_name: r.string(
            &f.repair_node_name,
            "repair-node-name",
            "REPAIR_NODE_NAME",
            "",
        ),
        sidecar_annotation: r.string(
            &f.repair_sidecar_annotation,
            "repair-sidecar-annotation",
            "REPAIR_SIDECAR_ANNOTATION",
            "sidecar.istio.io/status",
        ),
        init_container_name: r.string(
            &f.repair_init_container_name,
            "repair-init-container-name",
            "REPAIR_INIT_CONTAINER_NAME",
            "istio-validation",
        ),
        init_container_termination_message: r.string(
            &f.repair_init_container_termination_message,
            "repair-init-container-termination-message",
            "REPAIR_INIT_CONTAINER_TERMINATION_MESSAGE",
            "",
        ),
        init_container_exit_code,
        label_selectors: r.string(
            &f.repair_label_selectors,
            "repair-label-selectors",
            "REPAIR_LABEL_SELECTORS",
            "",
        ),
        field_selectors: r.string(
            &f.repair_field_selectors,
            "repair-field-selectors",
            "REPAIR_FIELD_SELECTORS",
            "",
        ),
    };

    let ip_env = |name: &str, default: &str| -> Result<IpAddr, ConfigError> {
        match r.env_raw(name) {
            Some(raw) => raw
                .value
                .trim()
                .parse()
                .map_err(|_| invalid(&raw, "expected an IP address")),
            None => default
                .parse()
                .map_err(|_| ConfigError::Args(format!("bad built-in default for {name}"))),
        }
    };
    let force_iptables_binary = match r.env_raw("FORCE_IPTABLES_BINARY") {
        Some(raw) if raw.value == "legacy" || raw.value == "nft" => Some(raw.value),
        Some(raw) => return Err(invalid(&raw, "expected `legacy` or `nft`")),
        None => None,
    };
    let agent = AgentConfig {
        ztunnel_uds_address: PathBuf::from(r.string(
            &f.ztunnel_uds_address,
            "ztunnel-uds-address",
            "ZTUNNEL_UDS_ADDRESS",
            "/var/run/ztunnel/ztunnel.sock",
        )),
        dns_capture: r.env_bool("AMBIENT_DNS_CAPTURE", false)?,
        ipv6: r.env_bool("AMBIENT_IPV6", false)?,
        reconcile_pod_rules_on_startup: r
            .env_bool("AMBIENT_RECONCILE_POD_RULES_ON_STARTUP", false)?,
        system_namespace: r.env_string("SYSTEM_NAMESPACE", "istio-system"),
        pod_name: r.env_string("POD_NAME", ""),
        node_name,
        host_probe_snat_ip: ip_env("HOST_PROBE_SNAT_IP", "169.254.7.127")?,
        host_probe_snat_ipv6: ip_env(
            "HOST_PROBE_SNAT_IPV6",
            "fd16:9254:7127:1337:ffff:ffff:ffff:ffff",
        )?,
        scoped_xtables_locking: r.env_bool("AMBIENT_USE_SCOPED_XTABLES_LOCKING", true)?,
        aws_branch_eni_probe: r.env_bool("AMBIENT_ENABLE_AWS_BRANCH_ENI_PROBE", true)?,
        force_iptables_binary,
        allow_switch_to_host_ns: r.env_bool("ALLOW_SWITCH_TO_HOST_NS", false)?,
    };

    if install.ambient_enabled && install.native_nftables && agent.force_iptables_binary.is_some() {
        warnings.push(
            "NATIVE_NFTABLES is set together with FORCE_IPTABLES_BINARY; the iptables binary choice \
             has no effect with the nftables backend"
                .to_string(),
        );
    }

    // Read-and-ignored for drop-in compatibility; say so when someone sets them.
    for (flag, name, env_name) in [
        (&f.log_level, "log-level", "LOG_LEVEL"),
        (
            &f.cni_network_config,
            "cni-network-config",
            "CNI_NETWORK_CONFIG",
        ),
        (
            &f.cni_network_config_file,
            "cni-network-config-file",
            "CNI_NETWORK_CONFIG_FILE",
        ),
        (&f.ctrlz_port, "ctrlz-port", "CTRLZ_PORT"),
        (&f.log_rotate, "log-rotate", "LOG_ROTATE"),
    ] {
        if let Some(raw) = r.raw(flag, name, env_name) {
            warnings.push(format!(
                "{} is accepted for compatibility and ignored",
                raw.name
            ));
        }
    }

    Ok(Config {
        install,
        repair,
        agent,
        log,
        health_port,
        monitoring_port,
        host_proc_dir: PathBuf::from(r.string(
            &f.host_proc_dir,
            "host-proc-dir",
            "HOST_PROC_DIR",
            "/host/proc",
        )),
        host_netns_dir: PathBuf::from(r.string(
            &f.host_netns_dir,
            "host-netns-dir",
            "HOST_NETNS_DIR",
            "/host/var/run/netns",
        )),
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn run(args: &[&str], env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let map: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut argv = vec!["install-cni".to_string()];
        argv.extend(args.iter().map(|s| s.to_string()));
        match parse(&argv, &|k| map.get(k).cloned())? {
            Parsed::Run(c) => Ok(*c),
            Parsed::Exit { text, .. } => Err(ConfigError::Args(text)),
        }
    }

    fn err_text<T>(r: Result<T, ConfigError>) -> String {
        match r {
            Ok(_) => "no error".to_string(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn unreadable_boolean_variables_are_errors_and_empty_ones_keep_the_default() {
        for var in [
            "CHAINED_CNI_PLUGIN",
            "ISTIO_OWNED_CNI_CONFIG",
            "CNI_CONF_GROUP_READ",
            "SKIP_TLS_VERIFY",
            "AMBIENT_ENABLED",
            "ENABLE_AMBIENT_DETECTION_RETRY",
            "NATIVE_NFTABLES",
            "AMBIENT_DISABLE_SAFE_UPGRADE",
            "REPAIR_ENABLED",
            "REPAIR_DELETE_PODS",
            "REPAIR_LABEL_PODS",
            "REPAIR_REPAIR_PODS",
            "AMBIENT_DNS_CAPTURE",
            "AMBIENT_IPV6",
            "AMBIENT_RECONCILE_POD_RULES_ON_STARTUP",
            "AMBIENT_USE_SCOPED_XTABLES_LOCKING",
            "AMBIENT_ENABLE_AWS_BRANCH_ENI_PROBE",
            "ALLOW_SWITCH_TO_HOST_NS",
            "LOG_AS_JSON",
        ] {
            for value in ["yes", "on", "enabled"] {
                match run(&[], &[(var, value)]) {
                    Err(ConfigError::Invalid { name, value: v, .. }) => {
                        assert_eq!((name, v), (format!("env {var}"), value.to_string()))
                    }
                    other => panic!("{var}={value:?} was not refused: {other:?}"),
                }
            }
            // viper's rule: an empty variable is unset, so the (safe) default stays.
            assert_eq!(
                run(&[], &[(var, "")]).ok(),
                run(&[], &[]).ok(),
                "{var}=\"\""
            );
        }
    }

    #[test]
    fn defaults_match_istio() {
        let c = run(&[], &[]).expect("defaults parse");
        let i = &c.install;
        assert_eq!(i.mounted_cni_net_dir, PathBuf::from("/host/etc/cni/net.d"));
        assert_eq!(i.cni_conf_name, None);
        assert!(i.chained);
        assert!(!i.istio_owned_cni_config);
        assert_eq!(i.owned_filename, "02-istio-cni.conflist");
        assert_eq!(
            i.cni_bin_dirs,
            vec![
                PathBuf::from("/host/opt/cni/bin"),
                PathBuf::from("/host/secondary-bin-dir")
            ]
        );
        assert_eq!(i.run_dir, PathBuf::from("/var/run/istio-cni"));
        assert_eq!(i.kubeconfig_mode, 0o600);
        assert_eq!(
            i.kube_ca_file,
            PathBuf::from("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
        );
        assert_eq!(i.k8s_service_protocol, "https");
        assert_eq!(i.plugin_log_level, LogLevel::Info);
        assert!(i.enablement_selectors.is_empty());
        assert_eq!(c.health_port, 8000);
        assert_eq!(c.monitoring_port, Some(15014));
        assert!(c.repair.enabled);
        assert!(!c.repair.repair_pods);
        assert_eq!(c.repair.init_container_exit_code, 126);
        assert_eq!(c.repair.init_container_name, "istio-validation");
        assert_eq!(
            c.agent.ztunnel_uds_address,
            PathBuf::from("/var/run/ztunnel/ztunnel.sock")
        );
        assert_eq!(c.host_proc_dir, PathBuf::from("/host/proc"));
        assert_eq!(c.log.target, LogTarget::Stderr);
        assert!(c.warnings.is_empty());
    }

    #[test]
    fn flag_beats_env_beats_default() {
        let c = run(&["--cni-conf-name=a.conf"], &[("CNI_CONF_NAME", "b.conf")]).expect("parses");
        assert_eq!(c.install.cni_conf_name.as_deref(), Some("a.conf"));
        let c = run(&[], &[("CNI_CONF_NAME", "b.conf")]).expect("parses");
        assert_eq!(c.install.cni_conf_name.as_deref(), Some("b.conf"));
        let c = run(
            &["--chained-cni-plugin=false"],
            &[("CHAINED_CNI_PLUGIN", "true")],
        )
        .expect("parses");
        assert!(!c.install.chained);
        let c = run(&["--ambient-enabled"], &[("AMBIENT_ENABLED", "false")]).expect("parses");
        assert!(c.install.ambient_enabled);
        let c = run(&[], &[("CHAINED_CNI_PLUGIN", "")]).expect("empty env = unset");
        assert!(c.install.chained);
    }

    #[test]
    fn host_paths_and_ports_are_configurable() {
        let c = run(
            &[
                "--cni-bin-dirs",
                "/a, /b,",
                "--health-port=0",
                "--service-account-dir=/sa",
            ],
            &[
                ("HOST_PROC_DIR", "/p"),
                ("HOST_NETNS_DIR", "/n"),
                ("MONITORING_PORT", "-1"),
            ],
        )
        .expect("parses");
        assert_eq!(
            c.install.cni_bin_dirs,
            vec![PathBuf::from("/a"), PathBuf::from("/b")]
        );
        assert_eq!(c.health_port, 0);
        assert_eq!(c.install.kube_ca_file, PathBuf::from("/sa/ca.crt"));
        assert_eq!(c.host_proc_dir, PathBuf::from("/p"));
        assert_eq!(c.host_netns_dir, PathBuf::from("/n"));
        assert_eq!(c.monitoring_port, None);
    }

    #[test]
    fn kubeconfig_mode_is_go_base_zero() {
        let mode = |v: &str| run(&[], &[("KUBECONFIG_MODE", v)]).map(|c| c.install.kubeconfig_mode);
        assert_eq!(mode("0600").expect("octal"), 0o600);
        assert_eq!(mode("384").expect("decimal"), 0o600);
        assert_eq!(mode("0o640").expect("0o"), 0o640);
        let e = err_text(mode("rw-------"));
        assert!(
            e.contains("KUBECONFIG_MODE") && e.contains("rw-------"),
            "{e}"
        );
        assert!(err_text(mode("0800")).contains("KUBECONFIG_MODE"));
    }

    #[test]
    fn invalid_values_name_the_variable() {
        let e = err_text(run(&[], &[("HEALTH_PORT", "70000")]));
        assert!(e.contains("env HEALTH_PORT") && e.contains("70000"), "{e}");
        let e = err_text(run(&["--monitoring-port=abc"], &[]));
        assert!(e.contains("--monitoring-port"), "{e}");
        let e = err_text(run(&[], &[("AMBIENT_ENABLED", "yes")]));
        assert!(e.contains("AMBIENT_ENABLED"), "{e}");
        let e = err_text(run(
            &[],
            &[("AMBIENT_ENABLEMENT_SELECTOR", "- podSelector: [\n")],
        ));
        assert!(e.contains("AMBIENT_ENABLEMENT_SELECTOR"), "{e}");
        let e = err_text(run(
            &[],
            &[("AMBIENT_ENABLEMENT_SELECTOR", "[{\"podSelector\": 3}]")],
        ));
        assert!(e.contains("AMBIENT_ENABLEMENT_SELECTOR"), "{e}");
        let e = err_text(run(&["--log_output_level=cni-agent:loud"], &[]));
        assert!(e.contains("--log-output-level"), "{e}");
        let e = err_text(run(&[], &[("HOST_PROBE_SNAT_IP", "1.2.3")]));
        assert!(e.contains("HOST_PROBE_SNAT_IP"), "{e}");
        let e = err_text(run(&["--cni-conf-name=../x.conf"], &[]));
        assert!(e.contains("--cni-conf-name"), "{e}");
    }

    #[test]
    fn legacy_owned_filename_alias_is_accepted_with_a_warning() {
        let c = run(
            &[],
            &[("ISTIO_OWNED_CNI_CONF_FILENAME", "01-mine.conflist")],
        )
        .expect("parses");
        assert_eq!(c.install.owned_filename, "01-mine.conflist");
        assert!(
            c.warnings
                .iter()
                .any(|w| w.contains("ISTIO_OWNED_CNI_CONF_FILENAME"))
        );
        let c = run(
            &[],
            &[
                ("ISTIO_OWNED_CNI_CONF_FILENAME", "01-mine.conflist"),
                ("ISTIO_OWNED_CNI_CONFIG_FILENAME", "03-right.conflist"),
            ],
        )
        .expect("parses");
        assert_eq!(c.install.owned_filename, "03-right.conflist");
    }

    #[test]
    fn owned_mode_needs_chained_and_ambient() {
        let c = run(&["--istio-owned-cni-config"], &[]).expect("parses");
        assert!(!c.install.owned_mode());
        assert!(!c.warnings.is_empty());
        let c = run(&["--istio-owned-cni-config", "--ambient-enabled"], &[]).expect("parses");
        assert!(c.install.owned_mode());
    }

    #[test]
    fn log_levels_keep_the_plugin_scope_independent() {
        let c = run(&["--log_output_level=cni-agent:warn,cni-plugin:debug"], &[]).expect("parses");
        assert_eq!(c.log.level_of("cni-agent"), LogLevel::Warn);
        assert_eq!(c.install.plugin_log_level, LogLevel::Debug);
        let c = run(&["--log_output_level=error"], &[]).expect("parses");
        assert_eq!(c.log.level_of("cni-agent"), LogLevel::Error);
        assert_eq!(c.install.plugin_log_level, LogLevel::Error);
        let c = run(&["--log_as_json"], &[("LOG_OUTPUT_LEVEL", "default:debug")]).expect("parses");
        assert!(c.log.as_json);
        assert_eq!(c.log.default_level, LogLevel::Debug);
    }

    #[test]
    fn selectors_from_yaml_and_json() {
        let yaml = "- podSelector:\n    matchLabels:\n      istio.io/dataplane-mode: ambient\n";
        let c = run(&[], &[("AMBIENT_ENABLEMENT_SELECTOR", yaml)]).expect("parses");
        assert_eq!(c.install.enablement_selectors.len(), 1);
        let json =
            r#"[{"namespaceSelector":{"matchExpressions":[{"key":"k","operator":"Exists"}]}}]"#;
        let c = run(&[], &[("AMBIENT_ENABLEMENT_SELECTOR", json)]).expect("parses");
        assert_eq!(
            serde_json::to_string(&c.install.enablement_selectors).expect("serializes"),
            json
        );
        assert!(
            parse_selectors(
                r#"[{"podSelector":{"matchExpressions":[{"key":"k","operator":"In"}]}}]"#
            )
            .is_err()
        );
        // The chart's `toYaml` form, with a plain scalar that looks like a bool.
        let chart = "- podSelector:\n    matchLabels:\n      istio.io/dataplane-mode: ambient\n\
                     - podSelector:\n    matchExpressions:\n    - key: istio.io/dataplane-mode\n      \
                     operator: NotIn\n      values:\n      - none\n  namespaceSelector:\n    \
                     matchLabels:\n      enabled: true\n";
        let parsed = parse_selectors(chart).expect("chart YAML parses");
        assert_eq!(parsed.len(), 2);
        assert_eq!(
            serde_json::to_value(&parsed[1]).expect("serializes")["namespaceSelector"]["matchLabels"]
                ["enabled"],
            "true"
        );
        assert!(parse_selectors("- podSelector: [unclosed").is_err());
    }

    #[test]
    fn help_lists_flags_with_env_names() {
        let argv = vec!["install-cni".to_string(), "--help".to_string()];
        match parse(&argv, &|_| None) {
            Ok(Parsed::Exit { text, code }) => {
                assert_eq!(code, 0);
                for needle in [
                    "--cni-bin-dirs",
                    "CNI_BIN_DIRS",
                    "--health-port",
                    "HEALTH_PORT",
                    "KUBECONFIG_MODE",
                ] {
                    assert!(text.contains(needle), "help lacks {needle}");
                }
            }
            other => panic!("expected help, got {other:?}"),
        }
    }

    #[test]
    fn unknown_flag_is_rejected() {
        let argv = vec!["install-cni".to_string(), "--no-such-flag=1".to_string()];
        match parse(&argv, &|_| None) {
            Ok(Parsed::Exit { code, .. }) => assert_ne!(code, 0),
            other => panic!("expected an error exit, got {other:?}"),
        }
    }
}
