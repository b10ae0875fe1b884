//! The flags of `istio-iptables`, as Istio names them, and their resolution (flag > env > default)
//! into typed [`Settings`]. Pure: the environment and the host facts come in as arguments.

use std::time::Duration;

use argh::FromArgs;

use crate::cli::{Env, FlagShapes, parse_go_bool, parse_go_duration};
use crate::rules::capture::{
    CaptureConfig, DEFAULT_LOOPBACK_V4, InboundPorts, InterceptionMode, IpRanges, OwnerGroups,
    split_list,
};

/// istio-iptables: set up (or check, or clean up) the traffic-capture rules of an Istio sidecar in
/// the current network namespace. Every flag also reads the environment variable named in its
/// description when the flag is absent; flags may be written --flag=value or --flag value.
#[derive(FromArgs, Debug, Default)]
#[argh(
    note = "Environment only: ISTIO_OUTBOUND_OWNER_GROUPS, ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE, ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR, ENVOY_USER and DRY_RUN_FILE_PATH as in Istio; ISTIO_IPTABLES_LOG sets the log filter (default info); ISTIO_IPTABLES_RESTORE_ONLY=true always applies through iptables-restore (by default, with iptables-nft, the rules are sent to the kernel over netlink, encoded exactly as iptables-nft-restore would)."
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
    /// accepted for compatibility with pilot-agent; logs go to stderr
    #[argh(option)]
    pub log_target: Option<String>,
    /// log as JSON (accepted for compatibility)
    #[argh(switch)]
    pub log_as_json: bool,
    /// log level, e.g. default:info (accepted for compatibility)
    #[argh(option)]
    pub log_output_level: Option<String>,
    /// accepted for compatibility
    #[argh(option)]
    pub log_stacktrace_level: Option<String>,
    /// accepted for compatibility
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
    value_shorts: &[
        'p', 'z', 'e', 'u', 'g', 'm', 'b', 'd', 'c', 'i', 'x', 'q', 'o', 'k', 't', 'r',
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

fn bad(name: &str, value: &str, reason: impl Into<String>) -> SettingError {
    SettingError {
        name: name.to_string(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

struct Resolver<'a> {
    env: &'a dyn Env,
    explicit_false: &'a std::collections::HashSet<String>,
    warnings: Vec<String>,
}

impl Resolver<'_> {
    /// flag > env > default. Set-but-empty env is the empty string, as upstream.
    fn string(&self, flag: &Option<String>, env: Option<&str>, default: &str) -> String {
        if let Some(v) = flag {
            return v.clone();
        }
        env.and_then(|e| self.env.get(e))
            .unwrap_or_else(|| default.to_string())
    }

    /// A switch: the flag wins (either way); else the env vars in order, the later winning;
    /// invalid env values are ignored with a warning, as upstream ignores them.
    fn switch(&mut self, long: &str, flag: bool, envs: &[&str]) -> bool {
        if flag {
            return true;
        }
        if self.explicit_false.contains(long) {
            return false;
        }
        let mut value = false;
        for name in envs {
            if let Some(raw) = self.env.get(name) {
                match parse_go_bool(&raw) {
                    Some(b) => value = b,
                    None => self
                        .warnings
                        .push(format!("ignoring {name}={raw:?}: not a boolean")),
                }
            }
        }
        value
    }
}

fn check_port(name: &str, value: &str) -> Result<(), SettingError> {
    match value.parse::<u32>() {
        Ok(p) if (1..=65535).contains(&p) => Ok(()),
        _ => Err(bad(name, value, "not a port number between 1 and 65535")),
    }
}

fn port_list(name: &str, value: &str) -> Result<Vec<String>, SettingError> {
    let ports = split_list(value);
    for p in &ports {
        check_port(name, p).map_err(|e| bad(name, value, format!("{:?} {}", p, e.reason)))?;
    }
    Ok(ports)
}

fn check_mark(name: &str, value: &str) -> Result<(), SettingError> {
    let parsed = match value.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => value.parse::<u32>().ok(),
    };
    parsed
        .map(|_| ())
        .ok_or_else(|| bad(name, value, "not a 32-bit number (decimal or 0x hex)"))
}

fn check_loopback_cidr(value: &str) -> Result<(), SettingError> {
    let name = "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR";
    let (addr, bits) = value
        .split_once('/')
        .ok_or_else(|| bad(name, value, "not a CIDR"))?;
    let addr: std::net::Ipv4Addr = addr
        .parse()
        .map_err(|_| bad(name, value, "not an IPv4 CIDR"))?;
    let bits: u8 = bits
        .parse()
        .map_err(|_| bad(name, value, "prefix length is not a number"))?;
    if !addr.is_loopback() {
        return Err(bad(name, value, "not a loopback address"));
    }
    if !(8..=32).contains(&bits) {
        return Err(bad(name, value, "prefix length must be between 8 and 32"));
    }
    Ok(())
}

impl Flags {
    /// Resolves flags + env into settings. Returns warnings to log alongside.
    pub fn resolve(
        &self,
        env: &dyn Env,
        explicit_false: &std::collections::HashSet<String>,
    ) -> Result<(Settings, Vec<String>), SettingError> {
        let mut r = Resolver {
            env,
            explicit_false,
            warnings: Vec::new(),
        };
        let mut c = CaptureConfig {
            proxy_port: r.string(&self.envoy_port, None, "15001"),
            inbound_capture_port: r.string(
                &self.inbound_capture_port,
                Some("INBOUND_CAPTURE_PORT"),
                "15006",
            ),
            inbound_tunnel_port: r.string(
                &self.inbound_tunnel_port,
                Some("INBOUND_TUNNEL_PORT"),
                "15008",
            ),
            ..CaptureConfig::default()
        };
        check_port("--envoy-port", &c.proxy_port)?;
        check_port("--inbound-capture-port", &c.inbound_capture_port)?;
        check_port("--inbound-tunnel-port", &c.inbound_tunnel_port)?;

        let uids = r.string(&self.proxy_uid, Some("PROXY_UID"), "");
        let gids = r.string(&self.proxy_gid, Some("PROXY_GID"), "");
        let proxy_uid_from_user = if uids.is_empty() {
            Some(
                env.get("ENVOY_USER")
                    .unwrap_or_else(|| "istio-proxy".to_string()),
            )
        } else {
            None
        };
        c.proxy_uids = split_list(&uids);
        c.proxy_gids = if gids.is_empty() {
            c.proxy_uids.clone()
        } else {
            split_list(&gids)
        };

        let mode = r.string(
            &self.istio_inbound_interception_mode,
            Some("ISTIO_INBOUND_INTERCEPTION_MODE"),
            "",
        );
        c.mode = match mode.as_str() {
            "TPROXY" => InterceptionMode::Tproxy,
            "" | "REDIRECT" | "NONE" => InterceptionMode::Redirect,
            other => {
                return Err(bad(
                    "--istio-inbound-interception-mode",
                    other,
                    "expected REDIRECT or TPROXY",
                ));
            }
        };
        let inbound = r.string(&self.istio_inbound_ports, Some("ISTIO_INBOUND_PORTS"), "");
        c.inbound_ports = match inbound.as_str() {
            "" => InboundPorts::None,
            "*" => InboundPorts::All,
            list => InboundPorts::List(port_list("--istio-inbound-ports", list)?),
        };
        let exclude_ports = r.string(
            &self.istio_local_exclude_ports,
            Some("ISTIO_LOCAL_EXCLUDE_PORTS"),
            "",
        );
        c.inbound_ports_exclude = port_list("--istio-local-exclude-ports", &exclude_ports)?;
        c.exclude_interfaces = split_list(&r.string(
            &self.istio_exclude_interfaces,
            Some("ISTIO_EXCLUDE_INTERFACES"),
            "",
        ));
        let include = r.string(&self.istio_service_cidr, Some("ISTIO_SERVICE_CIDR"), "");
        c.outbound_ranges_include = IpRanges::parse(&include)
            .map_err(|e| bad("--istio-service-cidr", &e.value, e.reason))?;
        let exclude = r.string(
            &self.istio_service_exclude_cidr,
            Some("ISTIO_SERVICE_EXCLUDE_CIDR"),
            "",
        );
        if exclude == "*" {
            return Err(bad(
                "--istio-service-exclude-cidr",
                &exclude,
                "'*' would exclude everything; list CIDRs",
            ));
        }
        c.outbound_ranges_exclude = IpRanges::parse(&exclude)
            .map_err(|e| bad("--istio-service-exclude-cidr", &e.value, e.reason))?;
        let out_ports = r.string(&self.istio_outbound_ports, Some("ISTIO_OUTBOUND_PORTS"), "");
        c.outbound_ports_include = port_list("--istio-outbound-ports", &out_ports)?;
        let out_exclude = r.string(
            &self.istio_local_outbound_ports_exclude,
            Some("ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE"),
            "",
        );
        c.outbound_ports_exclude = port_list("--istio-local-outbound-ports-exclude", &out_exclude)?;
        c.reroute_virtual_interfaces =
            split_list(&r.string(&self.kube_virt_interfaces, Some("KUBE_VIRT_INTERFACES"), ""));
        c.tproxy_mark = r.string(
            &self.istio_inbound_tproxy_mark,
            Some("ISTIO_INBOUND_TPROXY_MARK"),
            "1337",
        );
        check_mark("--istio-inbound-tproxy-mark", &c.tproxy_mark)?;
        c.tproxy_route_table = r.string(
            &self.istio_inbound_tproxy_route_table,
            Some("ISTIO_INBOUND_TPROXY_ROUTE_TABLE"),
            "133",
        );
        c.tproxy_route_table.parse::<u32>().map_err(|_| {
            bad(
                "--istio-inbound-tproxy-route-table",
                &c.tproxy_route_table,
                "not a table number",
            )
        })?;

        c.redirect_dns = r.switch(
            "redirect-dns",
            self.redirect_dns,
            &["REDIRECT_DNS", "ISTIO_META_DNS_CAPTURE"],
        );
        c.drop_invalid = r.switch(
            "drop-invalid",
            self.drop_invalid,
            &["DROP_INVALID", "INVALID_DROP"],
        );
        let dual_stack = r.switch(
            "dual-stack",
            self.dual_stack,
            &["DUAL_STACK", "ISTIO_DUAL_STACK"],
        );
        c.capture_all_dns = r.switch(
            "capture-all-dns",
            self.capture_all_dns,
            &["CAPTURE_ALL_DNS"],
        );

        // Env-only settings.
        let groups = env
            .get("ISTIO_OUTBOUND_OWNER_GROUPS")
            .unwrap_or_else(|| "*".to_string());
        let groups_exclude = env
            .get("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE")
            .unwrap_or_default();
        c.owner_groups = if groups == "*" {
            OwnerGroups::AllExcept(split_list(&groups_exclude))
        } else {
            let list = split_list(&groups);
            if list.len() > 64 {
                return Err(bad(
                    "ISTIO_OUTBOUND_OWNER_GROUPS",
                    &groups,
                    "at most 64 groups",
                ));
            }
            OwnerGroups::Only(list)
        };
        c.loopback_v4 = env
            .get("ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR")
            .unwrap_or_else(|| DEFAULT_LOOPBACK_V4.into());
        check_loopback_cidr(&c.loopback_v4)?;

        let ipv6 = match self.ipv6.as_deref() {
            None | Some("auto") => Ipv6Choice::Auto,
            Some(v) => match parse_go_bool(v) {
                Some(true) => Ipv6Choice::On,
                Some(false) => Ipv6Choice::Off,
                None => return Err(bad("--ipv6", v, "expected auto, true or false")),
            },
        };
        let dns = match &self.dns_servers {
            None => DnsSource::ResolvConf,
            Some(list) => DnsSource::Given(split_list(list)),
        };
        let probe = r.string(
            &self.iptables_probe_port,
            Some("IPTABLES_PROBE_PORT"),
            "15002",
        );
        let probe_port: u16 = probe
            .parse()
            .map_err(|_| bad("--iptables-probe-port", &probe, "not a port number"))?;
        let timeout = r.string(&self.probe_timeout, Some("PROBE_TIMEOUT"), "5s");
        let probe_timeout = parse_go_duration(&timeout)
            .ok_or_else(|| bad("--probe-timeout", &timeout, "not a duration like 5s"))?;
        let force = r.string(
            &self.force_iptables_binary,
            Some("FORCE_IPTABLES_BINARY"),
            "",
        );
        let force_binary = match force.as_str() {
            "" => None,
            "legacy" => Some(crate::apply::ForceBinary::Legacy),
            "nft" => Some(crate::apply::ForceBinary::Nft),
            other => {
                return Err(bad(
                    "--force-iptables-binary",
                    other,
                    "expected legacy or nft",
                ));
            }
        };
        let network_namespace =
            Some(r.string(&self.network_namespace, Some("NETWORK_NAMESPACE"), ""))
                .filter(|s| !s.is_empty());

        let settings = Settings {
            proxy_uid_from_user,
            proxy_gid_given: !gids.is_empty(),
            ipv6,
            dual_stack,
            dns,
            dry_run: r.switch("dry-run", self.dry_run, &["DRY_RUN"]),
            dry_run_file: env.get("DRY_RUN_FILE_PATH").filter(|s| !s.is_empty()),
            skip_rule_apply: r.switch(
                "skip-rule-apply",
                self.skip_rule_apply,
                &["SKIP_RULE_APPLY"],
            ),
            run_validation: r.switch("run-validation", self.run_validation, &["RUN_VALIDATION"]),
            probe_port,
            probe_timeout,
            network_namespace,
            cni_mode: r.switch("cni-mode", self.cni_mode, &["CNI_MODE"]),
            reconcile: r.switch("reconcile", self.reconcile, &["RECONCILE"]),
            cleanup_only: r.switch("cleanup-only", self.cleanup_only, &["CLEANUP_ONLY"]),
            force_apply: r.switch("force-apply", self.force_apply, &["FORCE_APPLY"]),
            native_nftables: r.switch(
                "native-nftables",
                self.native_nftables,
                &["NATIVE_NFTABLES"],
            ),
            force_binary,
            restore_only: r.switch("restore-only", false, &["ISTIO_IPTABLES_RESTORE_ONLY"]),
            capture: c,
        };
        Ok((settings, r.warnings))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};

    fn resolve(args: &[&str], env: &[(&str, &str)]) -> Result<Settings, SettingError> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let n = crate::cli::normalise_args(&args, &SHAPES).unwrap();
        let refs: Vec<&str> = n.args.iter().map(String::as_str).collect();
        let flags = Flags::from_args(&["istio-iptables"], &refs).unwrap();
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        flags.resolve(&env, &n.explicit_false).map(|(s, _)| s)
    }

    #[test]
    fn help_names_the_env_only_switches() {
        let help = Flags::from_args(&["istio-iptables"], &["--help"])
            .expect_err("--help exits early")
            .output;
        for var in [
            "ISTIO_IPTABLES_RESTORE_ONLY",
            "ISTIO_IPTABLES_LOG",
            "DRY_RUN_FILE_PATH",
        ] {
            assert!(help.contains(var), "{var} missing from --help");
        }
    }

    #[test]
    fn restore_only_comes_from_the_environment() {
        assert!(!resolve(&[], &[]).unwrap().restore_only);
        let s = resolve(&[], &[("ISTIO_IPTABLES_RESTORE_ONLY", "true")]).unwrap();
        assert!(s.restore_only);
    }

    #[test]
    fn flag_beats_env_beats_default() {
        let s = resolve(
            &["-z", "16006"],
            &[
                ("INBOUND_CAPTURE_PORT", "17006"),
                ("INBOUND_TUNNEL_PORT", "18008"),
            ],
        )
        .unwrap();
        assert_eq!(s.capture.inbound_capture_port, "16006");
        assert_eq!(s.capture.inbound_tunnel_port, "18008");
        assert_eq!(s.capture.proxy_port, "15001");
    }

    #[test]
    fn later_env_alias_wins_and_explicit_false_beats_env() {
        let s = resolve(
            &[],
            &[
                ("REDIRECT_DNS", "false"),
                ("ISTIO_META_DNS_CAPTURE", "true"),
            ],
        )
        .unwrap();
        assert!(s.capture.redirect_dns);
        let s = resolve(
            &["--redirect-dns=false"],
            &[("ISTIO_META_DNS_CAPTURE", "true")],
        )
        .unwrap();
        assert!(!s.capture.redirect_dns);
    }

    #[test]
    fn gid_defaults_to_uid_list() {
        let s = resolve(&["-u", "3,4"], &[]).unwrap();
        assert_eq!(s.capture.proxy_gids, vec!["3", "4"]);
        assert!(s.proxy_uid_from_user.is_none());
    }

    #[test]
    fn bad_values_name_flag_and_value() {
        let e = resolve(&["-x", "*"], &[]).unwrap_err();
        assert_eq!(e.name, "--istio-service-exclude-cidr");
        let e = resolve(&["-p", "70000"], &[]).unwrap_err();
        assert_eq!(
            (e.name.as_str(), e.value.as_str()),
            ("--envoy-port", "70000")
        );
        let e = resolve(&["-m", "BOGUS"], &[]).unwrap_err();
        assert_eq!(e.value, "BOGUS");
        let e = resolve(&["-i", "10.0.0.0/8,300.1.1.1/8"], &[]).unwrap_err();
        assert_eq!(e.value, "300.1.1.1/8");
        assert!(resolve(&["-b", "80,abc"], &[]).is_err());
        let e = resolve(&[], &[("ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", "10.0.0.1/32")]).unwrap_err();
        assert_eq!(e.name, "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR");
    }

    #[test]
    fn owner_groups_from_env() {
        let s = resolve(&[], &[("ISTIO_OUTBOUND_OWNER_GROUPS", "java,202")]).unwrap();
        assert_eq!(
            s.capture.owner_groups,
            OwnerGroups::Only(vec!["java".into(), "202".into()])
        );
        let s = resolve(&[], &[("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", "888,ftp")]).unwrap();
        assert_eq!(
            s.capture.owner_groups,
            OwnerGroups::AllExcept(vec!["888".into(), "ftp".into()])
        );
        let _ = HashSet::<String>::new();
    }
}
