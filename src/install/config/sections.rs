//! The resolved configuration, one struct per consumer (install pass, repair, agent, logs), the
//! `status` command's request, the values given their safe reading, and the error every parser
//! returns. Types only: the bottom of this folder, it imports no file beside it.

use std::collections::BTreeMap;
use std::path::PathBuf;

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
    Exit {
        text: String,
        code: i32,
    },
    /// `install-cni status`: ask the running agent.
    Status(StatusRequest),
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
    pub(super) fn parse(s: &str) -> Option<Self> {
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
    /// `--log_rotate` and its limits; `None` = no rotating file.
    pub rotate: Option<crate::telemetry::rotate::RotateSettings>,
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
pub use crate::kube::selector::enablement::EnablementSelector;

/// Settings of the install pass, the guard and cleanup.
#[derive(Debug, Clone, PartialEq)]
pub struct InstallConfig {
    pub mounted_cni_net_dir: PathBuf,
    pub cni_conf_name: Option<String>,
    pub chained: bool,
    pub istio_owned_cni_config: bool,
    pub owned_filename: String,
    pub cni_bin_dirs: Vec<PathBuf>,
    /// The runtime's cached CNI results (see `install::attachments`).
    pub results_dir: PathBuf,
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

    /// The settings of Istio's install tests (chained, not owned, no API address, debug plugin
    /// logs), writing into `net_dir`; tests change what they are about with `..`.
    #[cfg(test)]
    pub(crate) fn for_tests(net_dir: PathBuf) -> InstallConfig {
        InstallConfig {
            mounted_cni_net_dir: net_dir,
            cni_conf_name: None,
            chained: true,
            istio_owned_cni_config: false,
            owned_filename: "02-istio-cni.conflist".to_string(),
            cni_bin_dirs: vec![],
            results_dir: PathBuf::from("/nonexistent/cni/results"),
            run_dir: PathBuf::from("/path/to/kubeconfig"),
            kubeconfig_mode: 0o600,
            cni_conf_group_read: false,
            kube_ca_file: PathBuf::new(),
            skip_tls_verify: false,
            service_account_dir: PathBuf::new(),
            k8s_service_host: None,
            k8s_service_port: None,
            k8s_service_protocol: "https".to_string(),
            ambient_enabled: false,
            enable_ambient_detection_retry: false,
            native_nftables: false,
            exclude_namespaces: vec![],
            pod_namespace: "my-namespace".to_string(),
            enablement_selectors: vec![],
            plugin_log_level: LogLevel::Debug,
            ambient_disable_safe_upgrade: false,
            node_name: String::new(),
        }
    }
}

/// Repair controller settings (parsed and validated here; the repair room owns the type).
pub use crate::repair::RepairConfig;

/// Ambient node-agent settings (parsed and validated here; the agent room owns the type).
pub use crate::agent::settings::AgentConfig;

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
    /// Which flag or env var set `host_proc_dir` (for the procfs check's message).
    pub host_proc_setting: String,
    pub host_netns_dir: PathBuf,
    /// `DRIFT_VERIFY_INTERVAL`: the drift verification period (`None` = off). Ours, not Istio's.
    pub drift_verify_interval: Option<std::time::Duration>,
    /// `LISTENER_IDLE_TIMEOUT`: how long any listener waits for a request's headers (after the
    /// connection opened or the previous answer). Ours.
    pub listener_idle_timeout: std::time::Duration,
    /// `API_RETRY_MAX_DELAY`: the cap of the list/watch retries' doubling delay. Ours.
    pub api_retry_max_delay: std::time::Duration,
    /// Warnings found while parsing, logged once logging is up.
    pub warnings: Vec<String>,
    /// Values given their safe reading (each also among `warnings`), counted once metrics exist.
    pub adjusted: Vec<Adjustment>,
}

/// One value given its safe reading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adjustment {
    /// The env var or flag, as errors name it (`env KUBECONFIG_MODE`, `--kubeconfig-mode`).
    pub name: String,
    /// The setting's env var (the metric's label), else its flag.
    pub setting: String,
    pub given: String,
    pub applied: String,
}

impl Adjustment {
    pub fn warning(&self) -> String {
        format!(
            "{}={:?} is read as {:?} ({}); set {:?} to silence this warning",
            self.name,
            self.given,
            self.applied,
            self.why(),
            self.applied
        )
    }

    fn why(&self) -> &'static str {
        if self.setting == "KUBECONFIG_MODE" {
            "the plugin kubeconfig holds the service-account token: no access for other users, no special bits"
        } else if self.applied.starts_with('/') {
            "a relative path is taken from / as in Istio's image"
        } else {
            "not a Go boolean; the word's plain meaning is used"
        }
    }
}

/// `install-cni status`: where to ask the running agent and how to print its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusRequest {
    pub address: std::net::SocketAddr,
    pub json: bool,
    pub timeout: std::time::Duration,
}
