//! Every `istio-iptables` setting, declared once under Istio's names (flag, short letter, env
//! vars, default, parser, doc; `cli::settings::declare_settings!` derives the argh flags, `--help`,
//! the typed values and docs/istio-iptables.md's table from it); the typed [`Settings`] they
//! resolve to and their parsers are in `values`, the resolution in `resolve`.

use std::sync::LazyLock;
use std::time::Duration;

use super::values::*;
use crate::cli::FlagShapes;
use crate::cli::settings::Setting;
use crate::rules::capture::{InboundPorts, InterceptionMode, IpRanges};

crate::cli::settings::declare_settings! {
    /// istio-iptables: set up (or check, or clean up) the traffic-capture rules of an Istio sidecar in
    /// the current network namespace. Every flag also reads the environment variable named in its
    /// description when the flag is absent; flags may be written --flag=value or --flag value, a
    /// repeated flag keeps its last value, lists are comma-separated (spaces around items ignored).
    /// Boolean variables must be true/false/1/0/t/f (any other value, even empty, is an error).
    #[argh(
        help_triggers("-h", "--help"),
        note = "Bad values (ports, UIDs, interface names, marks, reserved route tables 0/253/254/255) are refused before anything is changed. Environment only: ISTIO_OUTBOUND_OWNER_GROUPS, ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE, ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR, ENVOY_USER and DRY_RUN_FILE_PATH as in Istio; ISTIO_IPTABLES_LOG sets the log filter (default info); ISTIO_IPTABLES_RESTORE_ONLY=true always applies through iptables-restore (by default, with iptables-nft, the rules are sent to the kernel over netlink, encoded exactly as iptables-nft-restore would)."
    )]
    pub struct Flags {
        /// where logs go: stdout, stderr or a file path; repeat for several (default stderr)
        #[argh(option)]
        pub log_target: Vec<String>,
        /// print the version and exit
        #[argh(switch)]
        pub version: bool,
    }
    pub struct Values;
    pub mod decl;
    error SettingError;

    section "Capture" {
        /// port to which all outbound TCP traffic is redirected
        envoy_port: String { parse: text, short: 'p', default: "15001" }
        /// port to which all inbound TCP traffic is redirected (or the TPROXY target)
        inbound_capture_port: String {
            parse: text, short: 'z', env: "INBOUND_CAPTURE_PORT", default: "15006",
        }
        /// HBONE port that is never captured
        inbound_tunnel_port: String {
            parse: text, short: 'e', env: "INBOUND_TUNNEL_PORT", default: "15008",
        }
        /// comma-separated UIDs whose traffic is not redirected
        proxy_uid: Option<String> {
            parse: text, short: 'u', env: "PROXY_UID",
            unset: "the uid of $ENVOY_USER (istio-proxy), else 1337",
        }
        /// comma-separated GIDs whose traffic is not redirected
        proxy_gid: Option<String> {
            parse: text, short: 'g', env: "PROXY_GID", unset: "the proxy UIDs",
        }
        /// inbound capture mode: REDIRECT or TPROXY
        istio_inbound_interception_mode: InterceptionMode {
            parse: interception_mode, short: 'm', env: "ISTIO_INBOUND_INTERCEPTION_MODE",
            default: "REDIRECT",
        }
        /// comma-separated inbound ports to capture, '*' for all, empty for none
        istio_inbound_ports: InboundPorts {
            parse: inbound_ports, short: 'b', env: "ISTIO_INBOUND_PORTS", default: "",
        }
        /// comma-separated inbound ports not captured, only with -b '*'
        istio_local_exclude_ports: Vec<String> {
            parse: list, short: 'd', env: "ISTIO_LOCAL_EXCLUDE_PORTS", default: "",
        }
        /// comma-separated interfaces whose traffic is never captured
        istio_exclude_interfaces: Vec<String> {
            parse: list, short: 'c', env: "ISTIO_EXCLUDE_INTERFACES", default: "",
        }
        /// comma-separated outbound CIDRs to capture, '*' for all
        istio_service_cidr: IpRanges {
            parse: ip_ranges, short: 'i', env: "ISTIO_SERVICE_CIDR", default: "",
        }
        /// comma-separated outbound CIDRs never captured ('*' is invalid)
        istio_service_exclude_cidr: IpRanges {
            parse: excluded_ip_ranges, short: 'x', env: "ISTIO_SERVICE_EXCLUDE_CIDR", default: "",
        }
        /// comma-separated outbound ports always captured
        istio_outbound_ports: Vec<String> {
            parse: list, short: 'q', env: "ISTIO_OUTBOUND_PORTS", default: "",
        }
        /// comma-separated outbound ports never captured
        istio_local_outbound_ports_exclude: Vec<String> {
            parse: list, short: 'o', env: "ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE", default: "",
        }
        /// comma-separated virtual interfaces whose inbound traffic is treated as outbound
        kube_virt_interfaces: Vec<String> {
            parse: list, short: 'k', env: "KUBE_VIRT_INTERFACES", default: "",
        }
        /// TPROXY packet mark
        istio_inbound_tproxy_mark: String {
            parse: text, short: 't', env: "ISTIO_INBOUND_TPROXY_MARK", default: "1337",
        }
        /// routing table for TPROXY
        istio_inbound_tproxy_route_table: String {
            parse: text, short: 'r', env: "ISTIO_INBOUND_TPROXY_ROUTE_TABLE", default: "133",
        }
    }

    section "Validation" {
        /// port the validation probe pretends to connect to
        iptables_probe_port: u16 {
            parse: probe_port, env: "IPTABLES_PROBE_PORT", default: "15002",
        }
        /// how long validation waits, a Go duration
        probe_timeout: Duration {
            parse: duration, env: "PROBE_TIMEOUT", default: "5s",
        }
    }

    section "Where and how rules are applied" {
        /// network namespace path to apply in (with --cni-mode)
        network_namespace: Option<String> {
            parse: text, env: "NETWORK_NAMESPACE", unset: "the current one",
        }
        /// iptables flavour to use: legacy or nft (empty: detect)
        force_iptables_binary: Option<crate::apply::ForceBinary> {
            parse: force_binary, env: "FORCE_IPTABLES_BINARY", default: "",
        }
        /// ours: IPv6 rules: auto (detect from interface addresses, as Istio), true or false (reproducible runs)
        ipv6: Ipv6Choice { parse: ipv6, default: "auto" }
        /// ours: comma-separated DNS servers for --redirect-dns, printed as given (empty: none)
        dns_servers: Option<Vec<String>> { parse: dns_servers, unset: "read /etc/resolv.conf" }
    }

    section "Logging, accepted for compatibility" {
        /// accepted for compatibility and ignored; ISTIO_IPTABLES_LOG sets the level
        log_output_level: Option<String> { parse: text }
        /// accepted for compatibility and ignored
        log_stacktrace_level: Option<String> { parse: text }
        /// accepted for compatibility and ignored
        log_caller: Option<String> { parse: text }
    }

    switches "Switches" {
        /// print the commands and restore input that would run, change nothing; also written to $DRY_RUN_FILE_PATH
        dry_run: bool { parse: switch_value, short: 'n', env: "DRY_RUN", default: "false" }
        /// apply no rules (use with --run-validation)
        skip_rule_apply: bool { parse: switch_value, env: "SKIP_RULE_APPLY", default: "false" }
        /// check that redirection works; exit 126 when it does not
        run_validation: bool { parse: switch_value, env: "RUN_VALIDATION", default: "false" }
        /// capture DNS to the agent on 15053
        redirect_dns: bool {
            parse: switch_value, env: "REDIRECT_DNS", also: ["ISTIO_META_DNS_CAPTURE"],
            default: "false",
        }
        /// drop conntrack-INVALID packets
        drop_invalid: bool {
            parse: switch_value, env: "DROP_INVALID", also: ["INVALID_DROP"], default: "false",
        }
        /// detect IPv6 from any interface address, not only the first
        dual_stack: bool {
            parse: switch_value, env: "DUAL_STACK", also: ["ISTIO_DUAL_STACK"], default: "false",
        }
        /// capture all DNS traffic, not only to the resolv.conf servers
        capture_all_dns: bool { parse: switch_value, env: "CAPTURE_ALL_DNS", default: "false" }
        /// run from the node for a pod: apply inside --network-namespace with a pod-scoped xtables lock
        cni_mode: bool { parse: switch_value, env: "CNI_MODE", default: "false" }
        /// replace drifted existing ISTIO rules instead of failing
        reconcile: bool { parse: switch_value, env: "RECONCILE", default: "false" }
        /// only remove the ISTIO rules and chains
        cleanup_only: bool { parse: switch_value, env: "CLEANUP_ONLY", default: "false" }
        /// apply even if the rules look already applied
        force_apply: bool { parse: switch_value, env: "FORCE_APPLY", default: "false" }
        /// use nftables instead of iptables
        native_nftables: bool { parse: switch_value, env: "NATIVE_NFTABLES", default: "false" }
        /// log JSON lines instead of text
        log_as_json: bool { parse: switch_value, default: "false" }
    }

    env_only "Environment only" {
        /// user whose uid is the proxy's when --proxy-uid is not given
        envoy_user: String { parse: text, env: "ENVOY_USER", default: "istio-proxy" }
        /// ours: the log filter (tracing `EnvFilter` syntax), read before anything is logged
        istio_iptables_log: String { parse: text, env: "ISTIO_IPTABLES_LOG", default: "info" }
    }
    shared "Environment only" {
        istio_outbound_owner_groups: String { parse: text }
        istio_outbound_owner_groups_exclude: String { parse: text }
        istio_outbound_ipv4_loopback_cidr: String { parse: text }
        dry_run_file_path: String { parse: text }
        istio_iptables_restore_only: bool { parse: switch_value }
    }
}

/// How pflag forms map onto these flags (see [`crate::cli::normalise_args`]): the switches and
/// short letters come from the declarations.
pub static SHAPES: LazyLock<FlagShapes<'static>> = LazyLock::new(|| {
    // Built once per process, so leaking the few names keeps `FlagShapes` borrowed as elsewhere.
    let flag = |s: &Setting| -> &'static str { s.flag().expect("has a flag").leak() };
    let switches: Vec<&'static str> = decl::ALL
        .iter()
        .filter(|s| s.switch)
        .map(flag)
        .chain(["version"])
        .collect();
    let shorts: Vec<(char, &'static str)> = decl::ALL
        .iter()
        .filter_map(|s| Some((s.short?, flag(s))))
        .collect();
    FlagShapes {
        switches: switches.leak(),
        shorts: shorts.leak(),
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
    }
});

#[cfg(test)]
#[path = "flags_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "docs_tests.rs"]
mod docs_tests;
