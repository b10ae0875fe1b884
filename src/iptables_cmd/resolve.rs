//! Resolving `istio-iptables`'s declared settings (`flags`; flag > env > default) into typed
//! [`Settings`], every value checked before anything is touched, naming the flag or variable a
//! bad value came from (the parsers the declarations name are in `values`). Pure: the
//! environment comes in as an argument.

use std::collections::HashSet;

use super::flags::{Flags, Values, decl};
use super::values::{DnsSource, SettingError, Settings, bad};
use crate::cli::Env;
use crate::cli::settings::{EmptyEnv, Lookup, Setting};
use crate::rules::capture::{CaptureConfig, OwnerGroups, split_list};
use crate::rules::capture_values::{Field, InvalidValue};

/// istio-iptables's env rule: a set-but-empty variable is the empty value, as upstream, and
/// errors name a variable bare; `--switch=false` beats the env.
pub(super) fn lookup<'a>(
    env: &'a dyn Env,
    explicit_false: Option<&'a HashSet<String>>,
) -> Lookup<'a> {
    Lookup {
        env,
        empty_env: EmptyEnv::Empty,
        env_label: "",
        switched_off: explicit_false,
    }
}

/// The setting a capture field comes from.
fn setting_of(field: Field) -> &'static Setting {
    match field {
        Field::ProxyPort => &decl::envoy_port,
        Field::InboundCapturePort => &decl::inbound_capture_port,
        Field::InboundTunnelPort => &decl::inbound_tunnel_port,
        Field::ProxyUids => &decl::proxy_uid,
        Field::ProxyGids => &decl::proxy_gid,
        Field::InboundPorts => &decl::istio_inbound_ports,
        Field::InboundPortsExclude => &decl::istio_local_exclude_ports,
        Field::ExcludeInterfaces => &decl::istio_exclude_interfaces,
        Field::OutboundPortsInclude => &decl::istio_outbound_ports,
        Field::OutboundPortsExclude => &decl::istio_local_outbound_ports_exclude,
        Field::RerouteVirtualInterfaces => &decl::kube_virt_interfaces,
        Field::TproxyMark => &decl::istio_inbound_tproxy_mark,
        Field::TproxyRouteTable => &decl::istio_inbound_tproxy_route_table,
        Field::DnsServers => &decl::dns_servers,
        Field::OwnerGroupsInclude => &decl::istio_outbound_owner_groups,
        Field::OwnerGroupsExclude => &decl::istio_outbound_owner_groups_exclude,
        Field::LoopbackV4 => &decl::istio_outbound_ipv4_loopback_cidr,
    }
}

/// The flag (or, when the flag is absent and the variable set, the environment variable) a capture
/// field comes from, and the value given there, for error messages.
fn source_of(flags: &Flags, env: &dyn Env, field: Field) -> (String, Option<String>) {
    let s = setting_of(field);
    match lookup(env, None).raw(s, flags.given(s)) {
        Some(raw) => (raw.name, Some(raw.value)),
        None => match s.flag() {
            Some(flag) => (format!("--{flag}"), None),
            None => (s.env.unwrap_or(s.key).to_string(), None),
        },
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
        let v = Values::resolve(self, &lookup(env, Some(explicit_false)))?;
        let mut c = CaptureConfig {
            proxy_port: v.envoy_port,
            inbound_capture_port: v.inbound_capture_port,
            inbound_tunnel_port: v.inbound_tunnel_port,
            ..CaptureConfig::default()
        };
        // A list with no items (empty, blank, ",") counts as not given: an empty UID list would
        // drop the proxy's exemption and loop its traffic back to itself.
        c.proxy_uids = split_list(&v.proxy_uid.unwrap_or_default());
        let gid_list = split_list(&v.proxy_gid.unwrap_or_default());
        let proxy_gid_given = !gid_list.is_empty();
        let proxy_uid_from_user = c.proxy_uids.is_empty().then_some(v.envoy_user);
        c.proxy_gids = if proxy_gid_given {
            gid_list
        } else {
            c.proxy_uids.clone()
        };
        c.mode = v.istio_inbound_interception_mode;
        c.inbound_ports = v.istio_inbound_ports;
        c.inbound_ports_exclude = v.istio_local_exclude_ports;
        c.exclude_interfaces = v.istio_exclude_interfaces;
        c.outbound_ranges_include = v.istio_service_cidr;
        c.outbound_ranges_exclude = v.istio_service_exclude_cidr;
        c.outbound_ports_include = v.istio_outbound_ports;
        c.outbound_ports_exclude = v.istio_local_outbound_ports_exclude;
        c.reroute_virtual_interfaces = v.kube_virt_interfaces;
        c.tproxy_mark = v.istio_inbound_tproxy_mark;
        c.tproxy_route_table = v.istio_inbound_tproxy_route_table;
        c.redirect_dns = v.redirect_dns;
        c.drop_invalid = v.drop_invalid;
        c.capture_all_dns = v.capture_all_dns;

        let groups = v.istio_outbound_owner_groups;
        c.owner_groups = if groups.trim() == "*" {
            OwnerGroups::AllExcept(split_list(&v.istio_outbound_owner_groups_exclude))
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
        c.loopback_v4 = v.istio_outbound_ipv4_loopback_cidr;

        let settings = Settings {
            proxy_uid_from_user,
            proxy_gid_given,
            ipv6: v.ipv6,
            dual_stack: v.dual_stack,
            dns: v
                .dns_servers
                .map_or(DnsSource::ResolvConf, DnsSource::Given),
            dry_run: v.dry_run,
            dry_run_file: Some(v.dry_run_file_path).filter(|s| !s.is_empty()),
            skip_rule_apply: v.skip_rule_apply,
            run_validation: v.run_validation,
            probe_port: v.iptables_probe_port,
            probe_timeout: v.probe_timeout,
            network_namespace: v.network_namespace.filter(|s| !s.is_empty()),
            cni_mode: v.cni_mode,
            reconcile: v.reconcile,
            cleanup_only: v.cleanup_only,
            force_apply: v.force_apply,
            native_nftables: v.native_nftables,
            force_binary: v.force_iptables_binary,
            restore_only: v.istio_iptables_restore_only,
            capture: c,
        };
        check_capture(self, env, &settings.capture)?;
        Ok(settings)
    }
}
