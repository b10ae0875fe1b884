//! Every `istio-iptables ambient` setting, declared once (flag, env fallback, default, parser,
//! doc; `cli::settings::declare_settings!` derives the argh flags, `--help`, the typed values and
//! docs/istio-iptables.md's ambient table from it). The env fallbacks are the node agent's own
//! settings under install-cni's names and defaults (a test holds the two declarations together),
//! so that the printed rules are the ones the agent on this node programs.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::LazyLock;

use super::values::{SettingError, bad};
use crate::cli::settings::{Raw, Setting};
use crate::cli::{FlagShapes, parse_go_bool};
use crate::rules::ambient::{self, PodDns};

crate::cli::settings::declare_settings! {
    /// istio-iptables ambient: print the rules the ambient node agent programs inside a pod's network
    /// namespace (or, with --host, on the node), in Istio's dry-run format. Nothing is changed.
    #[argh(
        help_triggers("-h", "--help"),
        note = "A boolean flag is set by its name alone or --flag=true/false (also 1/0/t/f); `--flag true` with a space is refused, as pflag would read `--ipv6 false` as --ipv6 plus a stray argument. Pod-only flags (--ingress, --pod-dns, --reroute-virtual-interfaces, --redirect-dns) are refused with --host, and --kubelet-uid/--host-proc without --host --native-nftables: nothing given is ignored. Without --native-nftables the output is the iptables transcript (iptables-save, ip6tables-save, then the restore input per family); with it, the one nftables transaction. With --host and --native-nftables the kubelet UID is read from the host /proc (--host-proc) unless --kubelet-uid is given."
    )]
    pub struct AmbientFlags {}
    pub struct AmbientValues;
    pub mod decl;
    error SettingError;

    section "The pod (in-pod rules only)" {
        /// the pod's DNS override (ambient.istio.io/dns-capture): enabled, disabled or unset
        pod_dns: PodDns { parse: pod_dns, default: "unset" }
        /// comma-separated interfaces whose inbound TCP is treated as outbound (istio.io/reroute-virtual-interfaces); an empty item is refused
        reroute_virtual_interfaces: Vec<String> { parse: virtual_interfaces, default: "" }
    }

    section "The node" {
        /// IPv4 source address of SNATed kubelet probes (a usable source)
        host_probe_snat_ip: String {
            parse: |raw| probe_snat(raw, false), env: "HOST_PROBE_SNAT_IP",
            default: "169.254.7.127",
        }
        /// IPv6 source address of SNATed kubelet probes (a usable source)
        host_probe_snat_ipv6: String {
            parse: |raw| probe_snat(raw, true), env: "HOST_PROBE_SNAT_IPV6",
            default: "fd16:9254:7127:1337:ffff:ffff:ffff:ffff",
        }
        /// kubelet's UID for the nftables host rule, 0-4294967294 (only with --host --native-nftables)
        kubelet_uid: Option<String> { parse: kubelet_uid, unset: "found under --host-proc" }
        /// where the host's /proc is mounted, to find kubelet's UID (only with --host --native-nftables)
        host_proc: PathBuf { parse: path, default: "/host/proc" }
    }

    switches "Switches" {
        /// print the rules instead of applying them (required: the node agent applies them)
        dry_run: bool { parse: on, default: "false" }
        /// also IPv6 rules; --ipv6=false turns them off
        ipv6: bool { parse: on, env: "AMBIENT_IPV6", default: "false" }
        /// capture DNS to ztunnel's DNS proxy (in-pod rules only); --redirect-dns=false turns it off
        redirect_dns: bool { parse: on, env: "AMBIENT_DNS_CAPTURE", default: "false" }
        /// the pod bypasses inbound capture (ambient.istio.io/bypass-inbound-capture)
        ingress: bool { parse: on, default: "false" }
        /// the nftables backend instead of iptables
        native_nftables: bool { parse: on, env: "NATIVE_NFTABLES", default: "false" }
        /// the host-side rules (probe SNAT) instead of the in-pod rules
        host: bool { parse: on, default: "false" }
    }

    env_only "Environment only" {}
}

/// The command's pflag shape: its switches come from the declarations.
pub static SHAPES: LazyLock<FlagShapes<'static>> = LazyLock::new(|| {
    // Built once per process, so leaking the few names keeps `FlagShapes` borrowed as elsewhere.
    let switches: Vec<&'static str> = decl::ALL
        .iter()
        .filter(|s| s.switch)
        .filter_map(Setting::flag)
        .map(|f| &*f.leak())
        .collect();
    FlagShapes::switches_only(switches.leak())
});

fn on(raw: &Raw) -> Result<bool, SettingError> {
    parse_go_bool(&raw.value).ok_or_else(|| bad(&raw.name, &raw.value, "expected true or false"))
}

fn path(raw: &Raw) -> Result<PathBuf, SettingError> {
    Ok(PathBuf::from(&raw.value))
}

fn pod_dns(raw: &Raw) -> Result<PodDns, SettingError> {
    match raw.value.trim() {
        "unset" => Ok(PodDns::Unset),
        "enabled" => Ok(PodDns::Enabled),
        "disabled" => Ok(PodDns::Disabled),
        other => Err(bad(&raw.name, other, "expected enabled, disabled or unset")),
    }
}

/// The agent reads the pod annotation as Istio does (empty items dropped), but on the command
/// line an empty item is a typo that would silently lose a name.
fn virtual_interfaces(raw: &Raw) -> Result<Vec<String>, SettingError> {
    let list = raw.value.as_str();
    if list.trim().is_empty() {
        return Ok(Vec::new());
    }
    if let Some(at) = list.split(',').position(|item| item.trim().is_empty()) {
        return Err(bad(&raw.name, list, format!("item {} is empty", at + 1)));
    }
    Ok(ambient::split_interfaces(list))
}

/// A uid_t, but not 4294967295 ((uid_t)-1, "no uid", never a process's).
fn kubelet_uid(raw: &Raw) -> Result<String, SettingError> {
    match raw.value.trim().parse::<u32>() {
        Ok(uid) if uid != u32::MAX => Ok(uid.to_string()),
        _ => Err(bad(
            &raw.name,
            &raw.value,
            "expected a numeric UID 0-4294967294",
        )),
    }
}

/// An address of the family asked that can be the source of a packet sent to a pod.
fn probe_snat(raw: &Raw, v6: bool) -> Result<String, SettingError> {
    let family = if v6 { "IPv6" } else { "IPv4" };
    match raw.value.trim().parse::<IpAddr>() {
        Ok(ip) if ip.is_ipv6() == v6 => match crate::cli::unusable_source_ip(ip) {
            None => Ok(ip.to_string()),
            Some(why) => Err(bad(
                &raw.name,
                &raw.value,
                format!("{why} cannot be the source of SNATed kubelet probes"),
            )),
        },
        _ => Err(bad(
            &raw.name,
            &raw.value,
            format!("expected an {family} address"),
        )),
    }
}
