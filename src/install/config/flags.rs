//! The flag table: every option under Istio's name, with the env var it falls back to.

use argh::FromArgs;

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
    /// how often every redirected pod's netns is checked against its expected rules and healed (a Go duration, jittered up to +25%; 0 disables); default 60s (env DRIFT_VERIFY_INTERVAL)
    #[argh(option)]
    pub drift_verify_interval: Option<String>,
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
    /// optional subcommand: `version`, or `status` (as the first argument; `install-cni status --help`) to print this node's pods as the running agent sees them
    #[argh(positional)]
    pub command: Vec<String>,
}

/// Flags that are booleans (dash form); the normaliser turns a bare one into `--flag true`.
pub(super) const BOOL_FLAGS: &[&str] = &[
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
