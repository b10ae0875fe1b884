//! Resolving `istio-iptables`'s flags (flag > env > default) into typed [`Settings`], every value
//! checked before anything is touched, and naming the flag or variable a bad capture value came
//! from. Pure: the environment comes in as an argument.

use std::collections::HashSet;
use std::net::IpAddr;

use super::flags::{DnsSource, Flags, Ipv6Choice, SettingError, Settings, bad};
use crate::cli::{Env, parse_go_bool, parse_go_duration};
use crate::rules::capture::{
    CaptureConfig, DEFAULT_LOOPBACK_V4, InboundPorts, InterceptionMode, IpRanges, OwnerGroups,
    split_list,
};
use crate::rules::capture_values::{Field, InvalidValue, parse_port};

struct Resolver<'a> {
    env: &'a dyn Env,
    explicit_false: &'a HashSet<String>,
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

    /// A switch: the flag wins (either way); else the env vars in order, the later winning.
    /// Unlike Istio, which ignores a value it cannot parse, a variable that is set but is not a Go
    /// boolean (`yes`, `on`, empty) is an error: these switches guard real changes, and a typo
    /// must not turn a dry run into an apply.
    fn switch(&self, long: &str, flag: bool, envs: &[&str]) -> Result<bool, SettingError> {
        if flag {
            return Ok(true);
        }
        if self.explicit_false.contains(long) {
            return Ok(false);
        }
        let mut value = false;
        for name in envs {
            if let Some(raw) = self.env.get(name) {
                value = parse_go_bool(&raw).ok_or_else(|| {
                    bad(
                        name,
                        &raw,
                        "not a boolean (use true/false, 1/0, t/f); refusing to guess",
                    )
                })?;
            }
        }
        Ok(value)
    }
}

/// The flag (or, when the flag is absent and the variable set, the environment variable) a capture
/// field comes from, and the value given there, for error messages.
fn source_of(flags: &Flags, env: &dyn Env, field: Field) -> (String, Option<String>) {
    let (flag, value, var): (&str, Option<&String>, Option<&str>) = match field {
        Field::ProxyPort => ("envoy-port", flags.envoy_port.as_ref(), None),
        Field::InboundCapturePort => (
            "inbound-capture-port",
            flags.inbound_capture_port.as_ref(),
            Some("INBOUND_CAPTURE_PORT"),
        ),
        Field::InboundTunnelPort => (
            "inbound-tunnel-port",
            flags.inbound_tunnel_port.as_ref(),
            Some("INBOUND_TUNNEL_PORT"),
        ),
        Field::ProxyUids => ("proxy-uid", flags.proxy_uid.as_ref(), Some("PROXY_UID")),
        Field::ProxyGids => ("proxy-gid", flags.proxy_gid.as_ref(), Some("PROXY_GID")),
        Field::InboundPorts => (
            "istio-inbound-ports",
            flags.istio_inbound_ports.as_ref(),
            Some("ISTIO_INBOUND_PORTS"),
        ),
        Field::InboundPortsExclude => (
            "istio-local-exclude-ports",
            flags.istio_local_exclude_ports.as_ref(),
            Some("ISTIO_LOCAL_EXCLUDE_PORTS"),
        ),
        Field::ExcludeInterfaces => (
            "istio-exclude-interfaces",
            flags.istio_exclude_interfaces.as_ref(),
            Some("ISTIO_EXCLUDE_INTERFACES"),
        ),
        Field::OutboundPortsInclude => (
            "istio-outbound-ports",
            flags.istio_outbound_ports.as_ref(),
            Some("ISTIO_OUTBOUND_PORTS"),
        ),
        Field::OutboundPortsExclude => (
            "istio-local-outbound-ports-exclude",
            flags.istio_local_outbound_ports_exclude.as_ref(),
            Some("ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE"),
        ),
        Field::RerouteVirtualInterfaces => (
            "kube-virt-interfaces",
            flags.kube_virt_interfaces.as_ref(),
            Some("KUBE_VIRT_INTERFACES"),
        ),
        Field::TproxyMark => (
            "istio-inbound-tproxy-mark",
            flags.istio_inbound_tproxy_mark.as_ref(),
            Some("ISTIO_INBOUND_TPROXY_MARK"),
        ),
        Field::TproxyRouteTable => (
            "istio-inbound-tproxy-route-table",
            flags.istio_inbound_tproxy_route_table.as_ref(),
            Some("ISTIO_INBOUND_TPROXY_ROUTE_TABLE"),
        ),
        Field::DnsServers => ("dns-servers", flags.dns_servers.as_ref(), None),
        Field::OwnerGroupsInclude => ("", None, Some("ISTIO_OUTBOUND_OWNER_GROUPS")),
        Field::OwnerGroupsExclude => ("", None, Some("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE")),
        Field::LoopbackV4 => ("", None, Some("ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR")),
    };
    match (value, var.and_then(|v| env.get(v).map(|raw| (v, raw)))) {
        (None, Some((var, raw))) => (var.to_string(), Some(raw)),
        (value, _) => (format!("--{flag}"), value.cloned()),
    }
}

/// Every value of the capture config that reaches the kernel, named by the flag or variable it
/// came from. Run once the settings are resolved and again once host facts are filled in.
pub fn check_capture(
    flags: &Flags,
    env: &dyn Env,
    capture: &CaptureConfig,
) -> Result<(), SettingError> {
    capture.validate().map_err(|e: InvalidValue| {
        let (name, given) = source_of(flags, env, e.field);
        match given.filter(|g| *g != e.value) {
            Some(list) => bad(&name, &e.value, format!("{} (in {list:?})", e.reason)),
            None => bad(&name, &e.value, e.reason),
        }
    })
}

impl Flags {
    /// Resolves flags + env into settings, every value checked (nothing is touched before).
    pub fn resolve(
        &self,
        env: &dyn Env,
        explicit_false: &HashSet<String>,
    ) -> Result<Settings, SettingError> {
        let r = Resolver {
            env,
            explicit_false,
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

        let uids = r.string(&self.proxy_uid, Some("PROXY_UID"), "");
        let gids = r.string(&self.proxy_gid, Some("PROXY_GID"), "");
        // A list with no items (empty, blank, ",") counts as not given: an empty UID list would
        // drop the proxy's exemption and loop its traffic back to itself.
        c.proxy_uids = split_list(&uids);
        let gid_list = split_list(&gids);
        let proxy_gid_given = !gid_list.is_empty();
        let proxy_uid_from_user = if c.proxy_uids.is_empty() {
            Some(
                env.get("ENVOY_USER")
                    .unwrap_or_else(|| "istio-proxy".to_string()),
            )
        } else {
            None
        };
        c.proxy_gids = if proxy_gid_given {
            gid_list
        } else {
            c.proxy_uids.clone()
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
        c.inbound_ports = match inbound.trim() {
            "" => InboundPorts::None,
            "*" => InboundPorts::All,
            list => InboundPorts::List(split_list(list)),
        };
        c.inbound_ports_exclude = split_list(&r.string(
            &self.istio_local_exclude_ports,
            Some("ISTIO_LOCAL_EXCLUDE_PORTS"),
            "",
        ));
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
        if exclude.trim() == "*" {
            return Err(bad(
                "--istio-service-exclude-cidr",
                &exclude,
                "'*' would exclude everything; list CIDRs",
            ));
        }
        c.outbound_ranges_exclude = IpRanges::parse(&exclude)
            .map_err(|e| bad("--istio-service-exclude-cidr", &e.value, e.reason))?;
        c.outbound_ports_include =
            split_list(&r.string(&self.istio_outbound_ports, Some("ISTIO_OUTBOUND_PORTS"), ""));
        c.outbound_ports_exclude = split_list(&r.string(
            &self.istio_local_outbound_ports_exclude,
            Some("ISTIO_LOCAL_OUTBOUND_PORTS_EXCLUDE"),
            "",
        ));
        c.reroute_virtual_interfaces =
            split_list(&r.string(&self.kube_virt_interfaces, Some("KUBE_VIRT_INTERFACES"), ""));
        c.tproxy_mark = r.string(
            &self.istio_inbound_tproxy_mark,
            Some("ISTIO_INBOUND_TPROXY_MARK"),
            "1337",
        );
        c.tproxy_route_table = r.string(
            &self.istio_inbound_tproxy_route_table,
            Some("ISTIO_INBOUND_TPROXY_ROUTE_TABLE"),
            "133",
        );

        c.redirect_dns = r.switch(
            "redirect-dns",
            self.redirect_dns,
            &["REDIRECT_DNS", "ISTIO_META_DNS_CAPTURE"],
        )?;
        c.drop_invalid = r.switch(
            "drop-invalid",
            self.drop_invalid,
            &["DROP_INVALID", "INVALID_DROP"],
        )?;
        let dual_stack = r.switch(
            "dual-stack",
            self.dual_stack,
            &["DUAL_STACK", "ISTIO_DUAL_STACK"],
        )?;
        c.capture_all_dns = r.switch(
            "capture-all-dns",
            self.capture_all_dns,
            &["CAPTURE_ALL_DNS"],
        )?;

        // Env-only settings.
        let groups = env
            .get("ISTIO_OUTBOUND_OWNER_GROUPS")
            .unwrap_or_else(|| "*".to_string());
        let groups_exclude = env
            .get("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE")
            .unwrap_or_default();
        c.owner_groups = if groups.trim() == "*" {
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
            Some(list) => {
                let servers = split_list(list);
                if let Some(s) = servers.iter().find(|s| s.parse::<IpAddr>().is_err()) {
                    return Err(bad("--dns-servers", s, "not an IP address"));
                }
                DnsSource::Given(servers)
            }
        };
        let probe = r.string(
            &self.iptables_probe_port,
            Some("IPTABLES_PROBE_PORT"),
            "15002",
        );
        let probe_port =
            parse_port(&probe).map_err(|reason| bad("--iptables-probe-port", &probe, reason))?;
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
            proxy_gid_given,
            ipv6,
            dual_stack,
            dns,
            dry_run: r.switch("dry-run", self.dry_run, &["DRY_RUN"])?,
            dry_run_file: env.get("DRY_RUN_FILE_PATH").filter(|s| !s.is_empty()),
            skip_rule_apply: r.switch(
                "skip-rule-apply",
                self.skip_rule_apply,
                &["SKIP_RULE_APPLY"],
            )?,
            run_validation: r.switch("run-validation", self.run_validation, &["RUN_VALIDATION"])?,
            probe_port,
            probe_timeout,
            network_namespace,
            cni_mode: r.switch("cni-mode", self.cni_mode, &["CNI_MODE"])?,
            reconcile: r.switch("reconcile", self.reconcile, &["RECONCILE"])?,
            cleanup_only: r.switch("cleanup-only", self.cleanup_only, &["CLEANUP_ONLY"])?,
            force_apply: r.switch("force-apply", self.force_apply, &["FORCE_APPLY"])?,
            native_nftables: r.switch(
                "native-nftables",
                self.native_nftables,
                &["NATIVE_NFTABLES"],
            )?,
            force_binary,
            restore_only: r.switch("restore-only", false, &["ISTIO_IPTABLES_RESTORE_ONLY"])?,
            capture: c,
        };
        check_capture(self, env, &settings.capture)?;
        Ok(settings)
    }
}
