//! `istio-iptables ambient --dry-run`: prints what the ambient node agent programs, in Istio's
//! golden format — inside a pod (the default) or, with `--host`, on the node — for the iptables
//! backend (the recorded saves and restore lines) or, with `--native-nftables`, the nftables
//! transaction. The rules come from the same builders the agent applies ([`crate::rules::ambient`]).
//! Pure resolution ([`resolve`]) and rendering ([`render`]); only the kubelet lookup reads files.

use std::collections::HashSet;
use std::path::PathBuf;

use argh::FromArgs;

use super::ambient_flags::AmbientValues;
pub use super::ambient_flags::{AmbientFlags, SHAPES};
use super::error::CommandError;
use super::values::SettingError;
use crate::apply;
use crate::cli::{Env, normalise_args};
use crate::rules::ambient::{self, AmbientConfig, PodOverrides};
use crate::rules::nftables::{NftTable, render_transaction};

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

/// Whether `flag` (a switch) was written on the command line at all, on or off.
fn given(on: bool, flag: &str, explicit_false: &HashSet<String>) -> bool {
    on || explicit_false.contains(flag)
}

/// Flags that mean nothing with the other flags given: refused, naming them, instead of ignored.
fn meaningless_flags(
    flags: &AmbientFlags,
    explicit_false: &HashSet<String>,
    nftables: bool,
) -> Result<(), CommandError> {
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
            return Err(CommandError::PodFlagWithHost { flag });
        }
    }
    if !(flags.host && nftables) {
        for (flag, set) in [
            ("--kubelet-uid", flags.kubelet_uid.is_some()),
            ("--host-proc", flags.host_proc.is_some()),
        ] {
            if set {
                return Err(CommandError::HostNftFlagWithoutHostNft { flag });
            }
        }
    }
    Ok(())
}

/// Flags (then env, then Istio's defaults) into a command. Every value is checked here.
pub fn resolve(
    flags: &AmbientFlags,
    env: &dyn Env,
    explicit_false: &HashSet<String>,
) -> Result<AmbientCommand, CommandError> {
    if !flags.dry_run {
        return Err(CommandError::AmbientNeedsDryRun);
    }
    let v = AmbientValues::resolve(flags, &super::resolve::lookup(env, Some(explicit_false)))?;
    meaningless_flags(flags, explicit_false, v.native_nftables)?;
    let config = AmbientConfig {
        probe_snat_v4: v.host_probe_snat_ip,
        probe_snat_v6: v.host_probe_snat_ipv6,
        enable_ipv6: v.ipv6,
        redirect_dns: v.redirect_dns,
    };
    let pod = PodOverrides {
        ingress: v.ingress,
        virtual_interfaces: v.reroute_virtual_interfaces,
        dns: v.pod_dns,
    };
    // As the sidecar path checks --kube-virt-interfaces: refused before anything is rendered.
    pod.validate().map_err(|e| SettingError {
        name: "--reroute-virtual-interfaces".into(),
        value: flags.reroute_virtual_interfaces.clone().unwrap_or_default(),
        reason: e.to_string(),
    })?;
    let kubelet_uid = match v.kubelet_uid {
        Some(uid) => KubeletUid::Given(uid),
        None => KubeletUid::FromProc(v.host_proc),
    };
    Ok(AmbientCommand {
        config,
        pod,
        nftables: v.native_nftables,
        host: v.host,
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
    use crate::rules::ambient::PodDns;
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
        resolve(&flags, &env, &n.explicit_false).map_err(|e| e.to_string())
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
