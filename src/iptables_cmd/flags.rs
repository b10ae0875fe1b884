//! The flags of `istio-iptables`, as Istio names them, and the typed [`Settings`] they resolve to
//! (`resolve`: flag > env > default).

use std::time::Duration;

use argh::FromArgs;

use crate::cli::FlagShapes;
use crate::rules::capture::CaptureConfig;

/// istio-iptables: set up (or check, or clean up) the traffic-capture rules of an Istio sidecar in
/// the current network namespace. Every flag also reads the environment variable named in its
/// description when the flag is absent; flags may be written --flag=value or --flag value, a
/// repeated flag keeps its last value, lists are comma-separated (spaces around items ignored).
/// Boolean variables must be true/false/1/0/t/f (any other value, even empty, is an error).
#[derive(FromArgs, Debug, Default)]
#[argh(
    help_triggers("-h", "--help"),
    note = "Bad values (ports, UIDs, interface names, marks, reserved route tables 0/253/254/255) are refused before anything is changed. Environment only: ISTIO_OUTBOUND_OWNER_GROUPS, ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE, ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR, ENVOY_USER and DRY_RUN_FILE_PATH as in Istio; ISTIO_IPTABLES_LOG sets the log filter (default info); ISTIO_IPTABLES_RESTORE_ONLY=true always applies through iptables-restore (by default, with iptables-nft, the rules are sent to the kernel over netlink, encoded exactly as iptables-nft-restore would)."
)]
pub struct Flags {
    /// port to which all outbound TCP traffic is redirected (default 15001)
    #[argh(option, short = 'p')]
    pub envoy_port: Option<String>,
    /// port to which all inbound TCP traffic is redirected [INBOUND_CAPTURE_PORT] (default 15006)
    #[argh(option, short = 'z')]
    pub inbound_capture_port: Option<String>,
    /// HBONE port that is never captured [INBOUND_TUNNEL_PORT] (default 15008)
    #[argh(option, short = 'e')]
    pub inbound_tunnel_port: Option<String>,
    /// comma-separated UIDs whose traffic is not redirected [PROXY_UID] (default: uid of $ENVOY_USER, else 1337)
    #[argh(option, short = 'u')]
    pub proxy_uid: Option<String>,
    /// comma-separated GIDs whose traffic is not redirected [PROXY_GID] (default: the proxy UIDs)
    #[argh(option, short = 'g')]
    pub proxy_gid: Option<String>,
    /// inbound capture mode: REDIRECT or TPROXY [ISTIO_INBOUND_INTERCEPTION_MODE] (default REDIRECT)
    #[argh(option, short = 'm')]
    pub istio_inbound_interception_mode: Option<String>,
    /// comma-separated inbound ports to capture, '*' for all, empty for none [ISTIO_INBOUND_PORTS]
    #[argh(option, short = 'b')]
    pub istio_inbound_ports: Option<String>,
    /// comma-separated inbound ports not captured, only with -b '*' [ISTIO_LOCAL_EXCLUDE_PORTS]
    #[argh(option, short = 'd')]
    pub istio_local_exclude_ports: Option<String>,
    /// comma-separated interfaces whose traffic is never captured [ISTIO_EXCLUDE_INTERFACES]
    #[argh(option, short = 'c')]
    pub istio_exclude_interfaces: Option<String>,
    /// comma-separated outbound CIDRs to capture, '*' for all [ISTIO_SERVICE_CIDR]
    #[argh(option, short = 'i')]
    pub istio_service_cidr: Option<String>,
    /// comma-separated outbound CIDRs never captured ('*' is invalid) [ISTIO_SERVICE_EXCLUDE_CIDR]
    #[argh(option, short = 'x')]
    pub istio_service_exclude_cidr: Option<String>,
    /// comma-separated outbound ports always captured [ISTIO_OUTBOUND_PORTS]
    #[argh(option, short = 'q')]
    pub istio_outbound_ports: Option<String>,
    /// comma-separated outbound ports never captured [ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE]
    #[argh(option, short = 'o')]
    pub istio_local_outbound_ports_exclude: Option<String>,
    /// comma-separated virtual interfaces whose inbound traffic is treated as outbound [KUBE_VIRT_INTERFACES]
    #[argh(option, short = 'k')]
    pub kube_virt_interfaces: Option<String>,
    /// TPROXY packet mark [ISTIO_INBOUND_TPROXY_MARK] (default 1337)
    #[argh(option, short = 't')]
    pub istio_inbound_tproxy_mark: Option<String>,
    /// routing table for TPROXY [ISTIO_INBOUND_TPROXY_ROUTE_TABLE] (default 133)
    #[argh(option, short = 'r')]
    pub istio_inbound_tproxy_route_table: Option<String>,
    /// print the commands and restore input that would run, change nothing [DRY_RUN]; also written to $DRY_RUN_FILE_PATH
    #[argh(switch, short = 'n')]
    pub dry_run: bool,
    /// port the validation probe pretends to connect to [IPTABLES_PROBE_PORT] (default 15002)
    #[argh(option)]
    pub iptables_probe_port: Option<String>,
    /// how long validation waits, Go duration [PROBE_TIMEOUT] (default 5s)
    #[argh(option)]
    pub probe_timeout: Option<String>,
    /// apply no rules (use with --run-validation) [SKIP_RULE_APPLY]
    #[argh(switch)]
    pub skip_rule_apply: bool,
    /// check that redirection works; exit 126 when it does not [RUN_VALIDATION]
    #[argh(switch)]
    pub run_validation: bool,
    /// capture DNS to the agent on 15053 [REDIRECT_DNS, ISTIO_META_DNS_CAPTURE]
    #[argh(switch)]
    pub redirect_dns: bool,
    /// drop conntrack-INVALID packets [DROP_INVALID, INVALID_DROP]
    #[argh(switch)]
    pub drop_invalid: bool,
    /// detect IPv6 from any interface address, not only the first [DUAL_STACK, ISTIO_DUAL_STACK]
    #[argh(switch)]
    pub dual_stack: bool,
    /// capture all DNS traffic, not only to the resolv.conf servers [CAPTURE_ALL_DNS]
    #[argh(switch)]
    pub capture_all_dns: bool,
    /// network namespace path to apply in (with --cni-mode) [NETWORK_NAMESPACE]
    #[argh(option)]
    pub network_namespace: Option<String>,
    /// run from the node for a pod: apply inside --network-namespace with a pod-scoped xtables lock [CNI_MODE]
    #[argh(switch)]
    pub cni_mode: bool,
    /// replace drifted existing ISTIO rules instead of failing [RECONCILE]
    #[argh(switch)]
    pub reconcile: bool,
    /// only remove the ISTIO rules and chains [CLEANUP_ONLY]
    #[argh(switch)]
    pub cleanup_only: bool,
    /// apply even if the rules look already applied [FORCE_APPLY]
    #[argh(switch)]
    pub force_apply: bool,
    /// use nftables instead of iptables [NATIVE_NFTABLES]
    #[argh(switch)]
    pub native_nftables: bool,
    /// iptables flavour to use: legacy or nft (default: detect) [FORCE_IPTABLES_BINARY]
    #[argh(option)]
    pub force_iptables_binary: Option<String>,
    /// IPv6 rules: auto (detect from interface addresses, as Istio), true or false (reproducible runs)
    #[argh(option)]
    pub ipv6: Option<String>,
    /// comma-separated DNS servers for --redirect-dns, printed as given (default: /etc/resolv.conf; empty: none)
    #[argh(option)]
    pub dns_servers: Option<String>,
    /// where logs go: stdout, stderr or a file path; repeat for several (default stderr)
    #[argh(option)]
    pub log_target: Vec<String>,
    /// log JSON lines instead of text
    #[argh(switch)]
    pub log_as_json: bool,
    /// accepted for compatibility and ignored; ISTIO_IPTABLES_LOG sets the level
    #[argh(option)]
    pub log_output_level: Option<String>,
    /// accepted for compatibility and ignored
    #[argh(option)]
    pub log_stacktrace_level: Option<String>,
    /// accepted for compatibility and ignored
    #[argh(option)]
    pub log_caller: Option<String>,
    /// print the version and exit
    #[argh(switch)]
    pub version: bool,
}

/// How pflag forms map onto these flags (see [`crate::cli::normalise_args`]).
pub const SHAPES: FlagShapes = FlagShapes {
    switches: &[
        "dry-run",
        "skip-rule-apply",
        "run-validation",
        "redirect-dns",
        "drop-invalid",
        "dual-stack",
        "capture-all-dns",
        "cni-mode",
        "reconcile",
        "cleanup-only",
        "force-apply",
        "native-nftables",
        "log-as-json",
        "version",
    ],
    shorts: &[
        ('p', "envoy-port"),
        ('z', "inbound-capture-port"),
        ('e', "inbound-tunnel-port"),
        ('u', "proxy-uid"),
        ('g', "proxy-gid"),
        ('m', "istio-inbound-interception-mode"),
        ('b', "istio-inbound-ports"),
        ('d', "istio-local-exclude-ports"),
        ('c', "istio-exclude-interfaces"),
        ('i', "istio-service-cidr"),
        ('x', "istio-service-exclude-cidr"),
        ('q', "istio-outbound-ports"),
        ('o', "istio-local-outbound-ports-exclude"),
        ('k', "kube-virt-interfaces"),
        ('t', "istio-inbound-tproxy-mark"),
        ('r', "istio-inbound-tproxy-route-table"),
        ('n', "dry-run"),
    ],
    underscore_longs: &[
        "log_target",
        "log_as_json",
        "log_output_level",
        "log_stacktrace_level",
        "log_caller",
    ],
    all_underscores: false,
    bool_options: &[],
    // pilot-agent's --log_target is a string array.
    repeatable: &["log-target"],
    positionals: false,
};

/// Whether IPv6 rules are wanted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ipv6Choice {
    Auto,
    On,
    Off,
}

/// Where DNS servers come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DnsSource {
    ResolvConf,
    Given(Vec<String>),
}

/// Everything `istio-iptables` needs, resolved and validated, before any host fact is read.
#[derive(Debug, Clone)]
pub struct Settings {
    pub capture: CaptureConfig,
    /// UIDs were not given: look up $ENVOY_USER.
    pub proxy_uid_from_user: Option<String>,
    pub proxy_gid_given: bool,
    pub ipv6: Ipv6Choice,
    pub dual_stack: bool,
    pub dns: DnsSource,
    pub dry_run: bool,
    pub dry_run_file: Option<String>,
    pub skip_rule_apply: bool,
    pub run_validation: bool,
    pub probe_port: u16,
    pub probe_timeout: Duration,
    pub network_namespace: Option<String>,
    pub cni_mode: bool,
    pub reconcile: bool,
    pub cleanup_only: bool,
    pub force_apply: bool,
    pub native_nftables: bool,
    pub force_binary: Option<crate::apply::ForceBinary>,
    /// Always apply through iptables-restore, never by sending its nf_tables messages directly
    /// [ISTIO_IPTABLES_RESTORE_ONLY].
    pub restore_only: bool,
}

/// A flag or variable with a bad value. The message names both.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid value {value:?} for {name}: {reason}")]
pub struct SettingError {
    pub name: String,
    pub value: String,
    pub reason: String,
}

pub(super) fn bad(name: &str, value: &str, reason: impl Into<String>) -> SettingError {
    SettingError {
        name: name.to_string(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

#[cfg(test)]
#[path = "flags_tests.rs"]
mod tests;
