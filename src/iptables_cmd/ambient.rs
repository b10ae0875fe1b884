//! `istio-iptables ambient --dry-run`: prints what the ambient node agent programs, in Istio's
//! golden format — inside a pod (the default) or, with `--host`, on the node — for the iptables
//! backend (the recorded saves and restore lines) or, with `--native-nftables`, the nftables
//! transaction. The rules come from the same builders the agent applies ([`crate::rules::ambient`]).
//! Pure resolution ([`resolve`]) and rendering ([`render`]); only the kubelet lookup reads files.

use std::collections::HashSet;
use std::net::IpAddr;
use std::path::PathBuf;

use argh::FromArgs;

use crate::apply;
use crate::cli::{Env, FlagShapes, normalise_args, parse_go_bool};
use crate::rules::ambient::{self, AmbientConfig, PodDns, PodOverrides};
use crate::rules::nftables::{NftTable, render_transaction};

/// istio-iptables ambient: print the rules the ambient node agent programs inside a pod's network
/// namespace (or, with --host, on the node), in Istio's dry-run format. Nothing is changed.
#[derive(FromArgs, Debug, Default)]
#[argh(
    help_triggers("-h", "--help"),
    note = "A boolean flag is set by its name alone or --flag=true/false (also 1/0/t/f); `--flag true` with a space is refused, as pflag would read `--ipv6 false` as --ipv6 plus a stray argument. Pod-only flags (--ingress, --pod-dns, --reroute-virtual-interfaces, --redirect-dns) are refused with --host, and --kubelet-uid/--host-proc without --host --native-nftables: nothing given is ignored. Without --native-nftables the output is the iptables transcript (iptables-save, ip6tables-save, then the restore input per family); with it, the one nftables transaction. With --host and --native-nftables the kubelet UID is read from the host /proc (--host-proc, default /host/proc) unless --kubelet-uid is given."
)]
pub struct AmbientFlags {
    /// print the rules instead of applying them (required: the node agent applies them)
    #[argh(switch)]
    pub dry_run: bool,
    /// also IPv6 rules; --ipv6=false turns them off [AMBIENT_IPV6] (default false)
    #[argh(switch)]
    pub ipv6: bool,
    /// capture DNS to ztunnel's DNS proxy (in-pod rules only); --redirect-dns=false turns it off
    /// [AMBIENT_DNS_CAPTURE] (default false)
    #[argh(switch)]
    pub redirect_dns: bool,
    /// the pod's DNS override (ambient.istio.io/dns-capture): enabled, disabled or unset (default)
    #[argh(option)]
    pub pod_dns: Option<String>,
    /// the pod bypasses inbound capture (ambient.istio.io/bypass-inbound-capture)
    #[argh(switch)]
    pub ingress: bool,
    /// comma-separated interfaces whose inbound TCP is treated as outbound
    /// (istio.io/reroute-virtual-interfaces); an empty item is refused
    #[argh(option)]
    pub reroute_virtual_interfaces: Option<String>,
    /// IPv4 source address of SNATed kubelet probes [HOST_PROBE_SNAT_IP] (default 169.254.7.127)
    #[argh(option)]
    pub host_probe_snat_ip: Option<String>,
    /// IPv6 source address of SNATed kubelet probes [HOST_PROBE_SNAT_IPV6]
    /// (default fd16:9254:7127:1337:ffff:ffff:ffff:ffff)
    #[argh(option)]
    pub host_probe_snat_ipv6: Option<String>,
    /// the nftables backend instead of iptables [NATIVE_NFTABLES]
    #[argh(switch)]
    pub native_nftables: bool,
    /// the host-side rules (probe SNAT) instead of the in-pod rules
    #[argh(switch)]
    pub host: bool,
    /// kubelet's UID for the nftables host rule, 0-4294967294 (only with --host --native-nftables;
    /// default: found under --host-proc)
    #[argh(option)]
    pub kubelet_uid: Option<String>,
    /// where the host's /proc is mounted, to find kubelet's UID (only with --host
    /// --native-nftables; default /host/proc)
    #[argh(option)]
    pub host_proc: Option<String>,
}

pub const SHAPES: FlagShapes = FlagShapes {
    switches: &[
        "dry-run",
        "ingress",
        "native-nftables",
        "host",
        "ipv6",
        "redirect-dns",
    ],
    shorts: &[],
    underscore_longs: &[],
    all_underscores: true,
    bool_options: &[],
    repeatable: &[],
    positionals: false,
};

/// Where the kubelet UID comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeletUid {
    Given(String),
    FromProc(PathBuf),
}

/// A resolved `ambient` command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmbientCommand {
    pub config: AmbientConfig,
    pub pod: PodOverrides,
    pub nftables: bool,
    pub host: bool,
    pub kubelet_uid: KubeletUid,
}

/// A boolean switch: set (`--flag`, `--flag=true`), explicitly off (`--flag=false`), else its
/// env var, else false.
fn switch_value(
    flag: &str,
    on: bool,
    env_name: &str,
    env: &dyn Env,
    explicit_false: &HashSet<String>,
) -> Result<bool, String> {
    if on {
        return Ok(true);
    }
    if explicit_false.contains(flag) {
        return Ok(false);
    }
    match env.get(env_name) {
        Some(raw) => parse_go_bool(&raw)
            .ok_or_else(|| format!("invalid value {raw:?} for {env_name}: expected true or false")),
        None => Ok(false),
    }
}

/// Whether `flag` (a switch) was written on the command line at all, on or off.
fn given(on: bool, flag: &str, explicit_false: &HashSet<String>) -> bool {
    on || explicit_false.contains(flag)
}

/// Flags that mean nothing with the other flags given: refused, naming them, instead of ignored.
fn meaningless_flags(
    flags: &AmbientFlags,
    explicit_false: &HashSet<String>,
    nftables: bool,
) -> Result<(), String> {
    if flags.host {
        let pod_only = [
            ("--ingress", given(flags.ingress, "ingress", explicit_false)),
            ("--pod-dns", flags.pod_dns.is_some()),
            (
                "--reroute-virtual-interfaces",
                flags.reroute_virtual_interfaces.is_some(),
            ),
            (
                "--redirect-dns",
                given(flags.redirect_dns, "redirect-dns", explicit_false),
            ),
        ];
        if let Some((flag, _)) = pod_only.iter().find(|(_, set)| *set) {
            return Err(format!(
                "{flag} is about the in-pod rules and means nothing with --host (the host rules only SNAT kubelet probes)"
            ));
        }
    }
    if !(flags.host && nftables) {
        for (flag, set) in [
            ("--kubelet-uid", flags.kubelet_uid.is_some()),
            ("--host-proc", flags.host_proc.is_some()),
        ] {
            if set {
                return Err(format!(
                    "{flag} is only used by the nftables host rule: give it with --host --native-nftables (or NATIVE_NFTABLES=true)"
                ));
            }
        }
    }
    Ok(())
}

/// `--reroute-virtual-interfaces`: the agent reads the pod annotation as Istio does (empty items
/// dropped), but on the command line an empty item is a typo that would silently lose a name.
fn virtual_interfaces(list: Option<&str>) -> Result<Vec<String>, String> {
    let Some(list) = list else {
        return Ok(Vec::new());
    };
    if list.trim().is_empty() {
        return Ok(Vec::new());
    }
    if let Some(at) = list.split(',').position(|item| item.trim().is_empty()) {
        return Err(format!(
            "invalid value {list:?} for --reroute-virtual-interfaces: item {} is empty",
            at + 1
        ));
    }
    Ok(ambient::split_interfaces(list))
}

/// `--kubelet-uid`: a uid_t, but not 4294967295 ((uid_t)-1, "no uid", never a process's).
fn kubelet_uid(raw: &str) -> Result<String, String> {
    match raw.trim().parse::<u32>() {
        Ok(uid) if uid != u32::MAX => Ok(uid.to_string()),
        _ => Err(format!(
            "invalid value {raw:?} for --kubelet-uid: expected a numeric UID 0-4294967294"
        )),
    }
}

fn address(
    flag: &str,
    value: &Option<String>,
    env_name: &str,
    env: &dyn Env,
    default: &str,
    v6: bool,
) -> Result<String, String> {
    let (source, raw) = match (value, env.get(env_name)) {
        (Some(v), _) => (format!("--{flag}"), v.clone()),
        (None, Some(v)) => (env_name.to_string(), v),
        (None, None) => return Ok(default.to_string()),
    };
    let family = if v6 { "IPv6" } else { "IPv4" };
    match raw.trim().parse::<IpAddr>() {
        Ok(ip) if ip.is_ipv6() == v6 => match crate::cli::unusable_source_ip(ip) {
            None => Ok(ip.to_string()),
            Some(why) => Err(format!(
                "invalid value {raw:?} for {source}: {why} cannot be the source of SNATed kubelet probes"
            )),
        },
        _ => Err(format!(
            "invalid value {raw:?} for {source}: expected an {family} address"
        )),
    }
}

/// Flags (then env, then Istio's defaults) into a command. Every value is checked here.
pub fn resolve(
    flags: &AmbientFlags,
    env: &dyn Env,
    explicit_false: &HashSet<String>,
) -> Result<AmbientCommand, String> {
    if !flags.dry_run {
        return Err(
            "ambient: only --dry-run is supported (the node agent in install-cni \
                    programs pods and the host)"
                .into(),
        );
    }
    let nftables = switch_value(
        "native-nftables",
        flags.native_nftables,
        "NATIVE_NFTABLES",
        env,
        explicit_false,
    )?;
    meaningless_flags(flags, explicit_false, nftables)?;
    let config = AmbientConfig {
        probe_snat_v4: address(
            "host-probe-snat-ip",
            &flags.host_probe_snat_ip,
            "HOST_PROBE_SNAT_IP",
            env,
            ambient::DEFAULT_PROBE_SNAT_V4,
            false,
        )?,
        probe_snat_v6: address(
            "host-probe-snat-ipv6",
            &flags.host_probe_snat_ipv6,
            "HOST_PROBE_SNAT_IPV6",
            env,
            ambient::DEFAULT_PROBE_SNAT_V6,
            true,
        )?,
        enable_ipv6: switch_value("ipv6", flags.ipv6, "AMBIENT_IPV6", env, explicit_false)?,
        redirect_dns: switch_value(
            "redirect-dns",
            flags.redirect_dns,
            "AMBIENT_DNS_CAPTURE",
            env,
            explicit_false,
        )?,
    };
    let dns = match flags.pod_dns.as_deref().map(str::trim) {
        None | Some("unset") => PodDns::Unset,
        Some("enabled") => PodDns::Enabled,
        Some("disabled") => PodDns::Disabled,
        Some(other) => {
            return Err(format!(
                "invalid value {other:?} for --pod-dns: expected enabled, disabled or unset"
            ));
        }
    };
    let pod = PodOverrides {
        ingress: flags.ingress,
        virtual_interfaces: virtual_interfaces(flags.reroute_virtual_interfaces.as_deref())?,
        dns,
    };
    // As the sidecar path checks --kube-virt-interfaces: refused before anything is rendered.
    pod.validate().map_err(|e| {
        format!(
            "invalid value {:?} for --reroute-virtual-interfaces: {e}",
            flags
                .reroute_virtual_interfaces
                .as_deref()
                .unwrap_or_default()
        )
    })?;
    let kubelet_uid = match &flags.kubelet_uid {
        Some(uid) => KubeletUid::Given(kubelet_uid(uid)?),
        None => KubeletUid::FromProc(PathBuf::from(
            flags.host_proc.as_deref().unwrap_or("/host/proc"),
        )),
    };
    Ok(AmbientCommand {
        config,
        pod,
        nftables,
        host: flags.host,
        kubelet_uid,
    })
}

/// What the agent would program, in Istio's golden format. `kubelet_uid` is only used for the
/// nftables host rule.
pub fn render(cmd: &AmbientCommand, kubelet_uid: &str) -> String {
    let cfg = &cmd.config;
    match (cmd.nftables, cmd.host) {
        (false, false) => transcript(&ambient::inpod_rules(cfg, &cmd.pod), cfg.enable_ipv6),
        (false, true) => transcript(&ambient::host_rules(cfg), cfg.enable_ipv6),
        (true, false) => render_transaction(
            &ambient::inpod_nft_rules(cfg, &cmd.pod),
            &NftTable::AMBIENT_POD,
        ),
        (true, true) => render_transaction(
            &ambient::host_nft_rules(cfg, kubelet_uid),
            &[NftTable::AmbientHostNat],
        ),
    }
}

fn transcript(rules: &crate::rules::RuleSet, ipv6: bool) -> String {
    let mut text = apply::transcript::ambient(rules, ipv6).join("\n");
    text.push('\n');
    text
}

/// Entry point of `istio-iptables ambient` (`args`: what follows `ambient`).
pub fn main(args: &[String], env: &dyn Env) -> i32 {
    let normalised = match normalise_args(args, &SHAPES) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("istio-iptables ambient: {e}");
            return super::EXIT_USAGE;
        }
    };
    let refs: Vec<&str> = normalised.args.iter().map(String::as_str).collect();
    let flags = match AmbientFlags::from_args(&["istio-iptables ambient"], &refs) {
        Ok(f) => f,
        Err(early) => {
            return if early.status.is_ok() {
                print!("{}", early.output);
                0
            } else {
                eprintln!("istio-iptables ambient: {}", early.output.trim_end());
                eprintln!("Run istio-iptables ambient --help for usage.");
                super::EXIT_USAGE
            };
        }
    };
    let cmd = match resolve(&flags, env, &normalised.explicit_false) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("istio-iptables ambient: {e}");
            return super::EXIT_FAILURE;
        }
    };
    let uid = match (&cmd.kubelet_uid, cmd.nftables && cmd.host) {
        (_, false) => String::new(),
        (KubeletUid::Given(uid), true) => uid.clone(),
        (KubeletUid::FromProc(root), true) => match apply::hostproc::kubelet_uid(root) {
            Ok(uid) => uid,
            Err(e) => {
                eprintln!("istio-iptables ambient: {e} (or pass --kubelet-uid)");
                return super::EXIT_FAILURE;
            }
        },
    };
    print!("{}", render(&cmd, &uid));
    0
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::HashMap;

    /// `istio-iptables ambient` argv and env as `main` parses them (shared with `flags_tests`).
    pub(crate) fn parse(args: &[&str], env: &[(&str, &str)]) -> Result<AmbientCommand, String> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let n = normalise_args(&args, &SHAPES).map_err(|e| e.to_string())?;
        let refs: Vec<&str> = n.args.iter().map(String::as_str).collect();
        let flags = AmbientFlags::from_args(&["ambient"], &refs).map_err(|e| e.output)?;
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        resolve(&flags, &env, &n.explicit_false)
    }

    #[test]
    fn flags_win_over_env_and_env_over_defaults() {
        let cmd = parse(
            &["--dry-run", "--ipv6=false", "--pod-dns=enabled"],
            &[("AMBIENT_IPV6", "true"), ("AMBIENT_DNS_CAPTURE", "true")],
        )
        .unwrap();
        assert!(!cmd.config.enable_ipv6 && cmd.config.redirect_dns);
        assert_eq!(cmd.pod.dns, PodDns::Enabled);
        let cmd = parse(&["--dry-run", "--ipv6"], &[]).unwrap();
        assert!(cmd.config.enable_ipv6 && !cmd.config.redirect_dns);
        assert_eq!(cmd.config.probe_snat_v4, ambient::DEFAULT_PROBE_SNAT_V4);
        // An explicit false is not turned back on by the environment.
        let cmd = parse(
            &["--dry-run", "--native-nftables=false"],
            &[("NATIVE_NFTABLES", "true")],
        )
        .unwrap();
        assert!(!cmd.nftables);
        assert!(
            parse(&["--dry-run"], &[("NATIVE_NFTABLES", "1")])
                .unwrap()
                .nftables
        );
    }

    #[test]
    fn bad_values_are_named() {
        for (args, needle) in [
            (vec!["--dry-run", "--ipv6=maybe"], "--ipv6"),
            (vec!["--dry-run", "--pod-dns=on"], "--pod-dns"),
            (vec!["--dry-run", "--host-probe-snat-ip=::1"], "IPv4"),
            (vec!["--dry-run", "--host-probe-snat-ipv6=1.2.3.4"], "IPv6"),
            (vec!["--dry-run", "--kubelet-uid=kubelet"], "--kubelet-uid"),
            (vec![], "--dry-run"),
        ] {
            let err = parse(&args, &[]).unwrap_err();
            assert!(err.contains(needle), "{args:?}: {err}");
        }
        let err = parse(&["--dry-run"], &[("HOST_PROBE_SNAT_IP", "x")]).unwrap_err();
        assert!(err.contains("HOST_PROBE_SNAT_IP"), "{err}");
    }

    #[test]
    fn virtual_interfaces_are_trimmed_and_empties_dropped() {
        assert_eq!(ambient::split_interfaces(" a, ,b ,"), vec!["a", "b"]);
        let cmd = parse(&["--dry-run", "--reroute-virtual-interfaces=x,y"], &[]).unwrap();
        assert!(render(&cmd, "").contains("-A ISTIO_PRERT -i y -p tcp -j RETURN"));
    }

    #[test]
    fn bad_virtual_interface_names_are_refused_naming_the_flag_and_the_value() {
        for bad in [
            "eth0 -j ACCEPT",
            "a/b",
            "waytoolonginterface0",
            "-x",
            "tun0,eth:1",
        ] {
            let flag = format!("--reroute-virtual-interfaces={bad}");
            let err = parse(&["--dry-run", &flag], &[]).unwrap_err();
            assert!(
                err.contains("--reroute-virtual-interfaces") && err.contains("virtual interface"),
                "{bad:?}: {err}"
            );
        }
        let err = parse(
            &["--dry-run", "--reroute-virtual-interfaces=ok0, bad name"],
            &[],
        )
        .unwrap_err();
        assert!(err.contains("\"bad name\""), "{err}");
        // iptables' trailing wildcard is an interface pattern, as on the sidecar path.
        assert!(parse(&["--dry-run", "--reroute-virtual-interfaces=veth+"], &[]).is_ok());
    }
}
