//! Every install-cni setting, declared once under Istio's names: flag, env var, default, parser and
//! doc line. The argh flags (and `--help`), the typed [`Values`], the env fallback and the table
//! in docs/configuration.md all come from this list (`cli::settings::declare_settings!`).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::checks::*;
use super::sections::*;
use super::values::*;
use crate::kube::names::NameRule;

crate::cli::settings::declare_settings! {
    /// install-cni: installs the Istio CNI plugin on this node, guards its config, serves health/metrics.
    /// Every option can also be set through the env var named in its description (flag > env >
    /// default); `--flag=value`, bare boolean flags and underscore names are accepted.
    pub struct Flags {
        /// print the version and exit
        #[argh(switch)]
        pub version: bool,
        /// optional subcommand: `version`, or `status` (as the first argument; `install-cni status --help`) to print this node's pods as the running agent sees them
        #[argh(positional)]
        pub command: Vec<String>,
    }
    pub struct Values;
    pub mod decl;
    error ConfigError;

    section "Installer" {
        /// primary CNI config file name (chained) or our file name (standalone)
        cni_conf_name: Option<String> {
            parse: file_name_only, env: "CNI_CONF_NAME",
            unset: "empty = auto-detect the highest-priority valid file",
        }
        /// chain istio-cni into the primary config (true) or write a standalone config (false)
        chained_cni_plugin: bool {
            parse: parse_bool, env: "CHAINED_CNI_PLUGIN", default: "true", marks: [Bool],
        }
        /// write a separate Istio-owned conflist (only effective with chained and ambient)
        istio_owned_cni_config: bool {
            parse: parse_bool, env: "ISTIO_OWNED_CNI_CONFIG", default: "false", marks: [Bool],
        }
        /// file name of the Istio-owned conflist (the chart writes the misspelt legacy name)
        istio_owned_cni_config_filename: String {
            parse: owned_file_name, env: "ISTIO_OWNED_CNI_CONFIG_FILENAME",
            legacy: "ISTIO_OWNED_CNI_CONF_FILENAME", default: "02-istio-cni.conflist",
        }
        /// directory holding the node's CNI configs as seen here
        mounted_cni_net_dir: PathBuf {
            parse: absolute_path, env: "MOUNTED_CNI_NET_DIR", default: "/host/etc/cni/net.d",
        }
        /// comma-separated directories the plugin binary is installed into (missing ones are skipped)
        cni_bin_dirs: Vec<PathBuf> {
            parse: path_list, env: "CNI_BIN_DIRS",
            default: "/host/opt/cni/bin,/host/secondary-bin-dir",
        }
        /// ours: the container runtime's cache of CNI results (libcni's `<cache dir>/results`) as seen here; while an entry there still names istio-cni, an uninstall leaves the plugin binary in place so the pod's DEL finds it (missing = no cached attachments)
        cni_results_dir: PathBuf {
            parse: absolute_path, env: "CNI_RESULTS_DIR", default: "/host/var/lib/cni/results",
        }
        /// agent run directory (sockets, plugin kubeconfig, plugin log, restore record); same path on host and here
        cni_agent_run_dir: PathBuf {
            parse: |raw| socket_path(raw, LONGEST_RUN_DIR_SOCKET), env: "CNI_AGENT_RUN_DIR",
            default: "/var/run/istio-cni",
        }
        /// file mode of the plugin kubeconfig (Go integer syntax: 0600 octal, 384 decimal, 0o600)
        kubeconfig_mode: u32 {
            parse: kubeconfig_mode, env: "KUBECONFIG_MODE", default: "0600",
        }
        /// write CNI config files 0640 instead of 0600 when not keeping an existing mode
        cni_conf_group_read: bool {
            parse: parse_bool, env: "CNI_CONF_GROUP_READ", default: "false", marks: [Bool],
        }
        /// CA file embedded in the plugin kubeconfig
        kube_ca_file: Option<PathBuf> {
            parse: absolute_path, env: "KUBE_CA_FILE", unset: "`<service-account-dir>/ca.crt`",
        }
        /// write insecure-skip-tls-verify into the plugin kubeconfig instead of a CA
        skip_tls_verify: bool {
            parse: parse_bool, env: "SKIP_TLS_VERIFY", default: "false", marks: [Bool],
        }
        /// service-account directory holding token and ca.crt (watched for token rotation)
        service_account_dir: PathBuf {
            parse: absolute_path, env: "SERVICE_ACCOUNT_DIR",
            default: "/var/run/secrets/kubernetes.io/serviceaccount",
        }
        /// host procfs mount (for the node agent and repair)
        host_proc_dir: PathBuf {
            parse: absolute_path, env: "HOST_PROC_DIR", default: "/host/proc",
        }
        /// host netns directory mount (for the node agent)
        host_netns_dir: PathBuf {
            parse: absolute_path, env: "HOST_NETNS_DIR", default: "/host/var/run/netns",
        }
        /// ours: how often every redirected pod's netns is checked against its expected rules and healed (a Go duration of at least 1s, jittered up to +25%; 0 disables)
        drift_verify_interval: Option<Duration> {
            parse: drift_interval, env: "DRIFT_VERIFY_INTERVAL", default: "60s",
        }
        /// port of /healthz and /readyz (0 = any free port; the bound address is logged)
        health_port: u16 {
            parse: port, env: "HEALTH_PORT", default: "8000",
        }
        /// port of the Prometheus /metrics endpoint, <= 0 disables it
        monitoring_port: Option<u16> {
            parse: monitoring_port, env: "MONITORING_PORT", default: "15014",
        }
    }

    section "Ambient and the plugin's config entry" {
        /// enable ambient mode (node agent, plugin ambient branch)
        ambient_enabled: bool {
            parse: parse_bool, env: "AMBIENT_ENABLED", default: "false", marks: [Bool],
        }
        /// plugin retries ambient pod detection and fails ADD on API errors
        enable_ambient_detection_retry: bool {
            parse: parse_bool, env: "ENABLE_AMBIENT_DETECTION_RETRY", default: "false",
            marks: [Bool],
        }
        /// ZDS socket ztunnel connects to (docs/zds.md)
        ztunnel_uds_address: PathBuf {
            parse: |raw| socket_path(raw, ""), env: "ZTUNNEL_UDS_ADDRESS",
            default: "/var/run/ztunnel/ztunnel.sock",
        }
    }

    section "Repair controller" {
        /// run the repair controller
        repair_enabled: bool {
            parse: parse_bool, env: "REPAIR_ENABLED", default: "true", marks: [Bool],
        }
        /// repair by deleting broken pods
        repair_delete_pods: bool {
            parse: parse_bool, env: "REPAIR_DELETE_PODS", default: "false", marks: [Bool],
        }
        /// repair by labelling broken pods
        repair_label_pods: bool {
            parse: parse_bool, env: "REPAIR_LABEL_PODS", default: "false", marks: [Bool],
        }
        /// label key put on broken pods
        repair_broken_pod_label_key: String {
            parse: |raw| kube_name(raw, NameRule::QualifiedName), env: "REPAIR_BROKEN_POD_LABEL_KEY",
            default: "cni.istio.io/uninitialized",
        }
        /// label value put on broken pods
        repair_broken_pod_label_value: String {
            parse: |raw| empty_or_name(raw, NameRule::LabelValue), env: "REPAIR_BROKEN_POD_LABEL_VALUE",
            default: "true",
        }
        /// node whose pods are repaired (required while repair is on)
        repair_node_name: String {
            parse: |raw| empty_or_name(raw, NameRule::StrictSubdomain), env: "REPAIR_NODE_NAME",
            default: "",
        }
        /// annotation marking injected pods (empty = no annotation check)
        repair_sidecar_annotation: String {
            parse: |raw| empty_or_name(raw, NameRule::QualifiedName), env: "REPAIR_SIDECAR_ANNOTATION",
            default: "sidecar.istio.io/status",
        }
        /// validation init container name (empty = any)
        repair_init_container_name: String {
            parse: |raw| empty_or_name(raw, NameRule::StrictLabel), env: "REPAIR_INIT_CONTAINER_NAME",
            default: "istio-validation",
        }
        /// termination message identifying broken pods (empty = any)
        repair_init_container_termination_message: String {
            parse: text, env: "REPAIR_INIT_CONTAINER_TERMINATION_MESSAGE", default: "",
        }
        /// exit code identifying broken pods (0 = any)
        repair_init_container_exit_code: i32 {
            parse: exit_code, env: "REPAIR_INIT_CONTAINER_EXIT_CODE", default: "126",
        }
        /// extra label selectors for the repair informer
        repair_label_selectors: String {
            parse: text, env: "REPAIR_LABEL_SELECTORS", default: "",
        }
        /// extra field selectors for the repair informer
        repair_field_selectors: String {
            parse: text, env: "REPAIR_FIELD_SELECTORS", default: "",
        }
    }

    section "Logging" {
        /// per-scope log levels, `<level>` or `<scope>:<level>,...` (scopes: all, default, cni-agent, cni-plugin; levels: debug, info, warn, error, fatal, none); the cni-plugin scope is the plugin's own level
        log_output_level: (LogLevel, BTreeMap<String, LogLevel>) {
            parse: log_levels, env: "LOG_OUTPUT_LEVEL", default: "info",
        }
        /// log as JSON lines instead of Istio's tab-separated text
        log_as_json: bool {
            parse: parse_bool, env: "LOG_AS_JSON", default: "false", marks: [Bool],
        }
        /// where logs go: stdout (Istio's default), stderr or a file path (appended)
        log_target: LogTarget {
            parse: log_target, env: "LOG_TARGET", default: "stdout",
        }
        /// a rotating log file that gets every record besides LOG_TARGET's (Istio's lumberjack rules: renamed to `<name>-<UTC time>.<ext>` when the next record would pass the size limit)
        log_rotate: Option<PathBuf> {
            parse: log_rotate_path, env: "LOG_ROTATE", unset: "empty = no rotating file",
        }
        /// days a rotated backup of LOG_ROTATE is kept (0 = no limit)
        log_rotate_max_age: i64 {
            parse: go_int, env: "LOG_ROTATE_MAX_AGE", default: "30",
        }
        /// backups of LOG_ROTATE kept, the oldest removed first (0 = no limit)
        log_rotate_max_backups: i64 {
            parse: go_int, env: "LOG_ROTATE_MAX_BACKUPS", default: "1000",
        }
        /// size in megabytes at which LOG_ROTATE is rotated (0 or less = 100); Istio's default, 104857600, in effect never rotates
        log_rotate_max_size: i64 {
            parse: go_int, env: "LOG_ROTATE_MAX_SIZE", default: "104857600",
        }
    }

    section "Accepted for compatibility" {
        /// accepted and ignored, as in Istio; use --log_output_level
        log_level: Option<String> { parse: text, env: "LOG_LEVEL", marks: [WarnIfSet] }
        /// accepted and ignored (legacy template mechanism)
        cni_network_config: Option<String> {
            parse: text, env: "CNI_NETWORK_CONFIG", marks: [WarnIfSet],
        }
        /// accepted and ignored (legacy template mechanism)
        cni_network_config_file: Option<String> {
            parse: text, env: "CNI_NETWORK_CONFIG_FILE", marks: [WarnIfSet],
        }
        /// accepted and ignored (logged once at start); stack traces are not emitted
        log_stacktrace_level: Option<String> {
            parse: text, env: "LOG_STACKTRACE_LEVEL", marks: [WarnIfSet],
        }
        /// accepted and ignored (logged once at start); caller info is not emitted
        log_caller: Option<String> { parse: text, env: "LOG_CALLER", marks: [Bool, WarnIfSet] }
        /// accepted and ignored (logged once at start): there is no ControlZ
        ctrlz_port: Option<String> { parse: text, env: "CTRLZ_PORT", marks: [WarnIfSet] }
        /// accepted and ignored (logged once at start): there is no ControlZ
        ctrlz_address: Option<String> { parse: text, env: "CTRLZ_ADDRESS", marks: [WarnIfSet] }
    }

    env_only "Environment only" {
        /// kubeconfig server host, an IP or a host name (set by the kubelet; required)
        kubernetes_service_host: Option<String> {
            parse: service_host, env: "KUBERNETES_SERVICE_HOST", unset: "set by the kubelet",
        }
        /// kubeconfig server port, 1-65535 (set by the kubelet; required)
        kubernetes_service_port: Option<String> {
            parse: service_port, env: "KUBERNETES_SERVICE_PORT", unset: "set by the kubelet",
        }
        /// kubeconfig server scheme, `https` or `http`
        kubernetes_service_protocol: String {
            parse: service_protocol, env: "KUBERNETES_SERVICE_PROTOCOL", default: "https",
        }
        /// always clean up on shutdown, never keep the config for an upgrade
        ambient_disable_safe_upgrade: bool {
            parse: parse_bool, env: "AMBIENT_DISABLE_SAFE_UPGRADE", default: "false",
        }
        /// plugin entry `exclude_namespaces`: comma-separated namespaces (`null` when empty)
        exclude_namespaces: Vec<String> {
            parse: namespace_list, env: "EXCLUDE_NAMESPACES", default: "",
        }
        /// plugin entry `pod_namespace`: this pod's namespace
        pod_namespace: Option<String> {
            parse: |raw| kube_name(raw, NameRule::StrictLabel), env: "POD_NAMESPACE", unset: "empty",
        }
        /// plugin entry `native_nftables`: program nftables instead of iptables
        native_nftables: bool {
            parse: parse_bool, env: "NATIVE_NFTABLES", default: "false",
        }
        /// plugin entry `enablement_selectors`: which pods are ambient (the chart's YAML, or JSON; operators In, NotIn, Exists, DoesNotExist are checked); with AMBIENT_ENABLED=true and none, install-cni warns that no pod will ever be enrolled
        ambient_enablement_selector: Vec<EnablementSelector> {
            parse: selectors, env: "AMBIENT_ENABLEMENT_SELECTOR", default: "",
        }
        /// this node, for the agent's pod watch (required with ambient)
        node_name: Option<String> {
            parse: |raw| kube_name(raw, NameRule::StrictSubdomain), env: "NODE_NAME", unset: "empty",
        }
        /// this pod's name (read, unused)
        pod_name: Option<String> {
            parse: |raw| kube_name(raw, NameRule::StrictSubdomain), env: "POD_NAME", unset: "empty",
        }
        /// Istio's namespace
        system_namespace: String {
            parse: |raw| kube_name(raw, NameRule::StrictLabel), env: "SYSTEM_NAMESPACE",
            default: "istio-system",
        }
        /// repair by fixing broken pods' rules in place
        repair_repair_pods: bool {
            parse: parse_bool, env: "REPAIR_REPAIR_PODS", default: "false",
        }
        /// ambient: capture pods' DNS to ztunnel
        ambient_dns_capture: bool {
            parse: parse_bool, env: "AMBIENT_DNS_CAPTURE", default: "false",
        }
        /// ambient: IPv6 rules too
        ambient_ipv6: bool {
            parse: parse_bool, env: "AMBIENT_IPV6", default: "false",
        }
        /// ambient: rewrite enrolled pods' rules at startup
        ambient_reconcile_pod_rules_on_startup: bool {
            parse: parse_bool, env: "AMBIENT_RECONCILE_POD_RULES_ON_STARTUP", default: "false",
        }
        /// ambient: source address kubelet probes are SNATed to (a usable IPv4 source)
        host_probe_snat_ip: IpAddr {
            parse: |raw| probe_snat_ip(raw, false), env: "HOST_PROBE_SNAT_IP",
            default: "169.254.7.127",
        }
        /// ambient: the IPv6 one (a usable IPv6 source)
        host_probe_snat_ipv6: IpAddr {
            parse: |raw| probe_snat_ip(raw, true), env: "HOST_PROBE_SNAT_IPV6",
            default: "fd16:9254:7127:1337:ffff:ffff:ffff:ffff",
        }
        /// ambient: the node's own addresses (the chart's `status.hostIPs`); when set, probes are SNATed to the node's address of each family instead (for datapaths that drop replies to the link-local default, e.g. Cilium's kube-proxy replacement)
        host_probe_snat_node_ips: Vec<IpAddr> {
            parse: node_ip_list, env: "HOST_PROBE_SNAT_NODE_IPS", default: "",
        }
        /// ambient: take the xtables lock per pod netns, not host-wide
        ambient_use_scoped_xtables_locking: bool {
            parse: parse_bool, env: "AMBIENT_USE_SCOPED_XTABLES_LOCKING", default: "true",
        }
        /// ambient: route probes of pods with an AWS branch ENI (install-cni.md)
        ambient_enable_aws_branch_eni_probe: bool {
            parse: parse_bool, env: "AMBIENT_ENABLE_AWS_BRANCH_ENI_PROBE", default: "true",
        }
        /// ambient: the iptables flavour, `legacy` or `nft`
        force_iptables_binary: Option<String> {
            parse: iptables_flavour, env: "FORCE_IPTABLES_BINARY", unset: "detect",
        }
        /// ambient: allow entering the host netns from the agent
        allow_switch_to_host_ns: bool {
            parse: parse_bool, env: "ALLOW_SWITCH_TO_HOST_NS", default: "false",
        }
        /// ours: every listener closes a connection that sends no request headers within this long of opening or of its previous answer (a Go duration of at least 100ms)
        listener_idle_timeout: Duration {
            parse: idle_timeout, env: "LISTENER_IDLE_TIMEOUT", default: "10s",
        }
        /// ours: the longest wait between retries of the API server's pod and namespace list/watch, jittered (client-go's reflector: 30s); install-cni waits at start however long the API server is away, and proceeds within this long of its return (a Go duration, 1s to 5m)
        api_retry_max_delay: Duration {
            parse: retry_max_delay, env: "API_RETRY_MAX_DELAY", default: "30s",
        }
    }
}

/// Default owned conflist name (Istio's), as declared for `ISTIO_OWNED_CNI_CONFIG_FILENAME`.
pub const DEFAULT_OWNED_FILENAME: &str = match decl::istio_owned_cni_config_filename.default {
    Some(d) => d,
    None => panic!("ISTIO_OWNED_CNI_CONFIG_FILENAME has a default"),
};
