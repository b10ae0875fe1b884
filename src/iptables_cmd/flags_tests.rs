//! Unit tests of [`super`]: flag/env resolution and value checks.
use super::*;
use crate::rules::capture::{InboundPorts, OwnerGroups};
use argh::FromArgs;
use std::collections::HashMap;

fn resolve(args: &[&str], env: &[(&str, &str)]) -> Result<Settings, SettingError> {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let n = crate::cli::normalise_args(&args, &SHAPES).unwrap();
    let refs: Vec<&str> = n.args.iter().map(String::as_str).collect();
    let flags = Flags::from_args(&["istio-iptables"], &refs).unwrap();
    let env: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    flags.resolve(&env, &n.explicit_false)
}

fn error(args: &[&str], env: &[(&str, &str)]) -> (String, String) {
    let e = resolve(args, env).expect_err("must be refused");
    (e.name, e.value)
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
fn a_proxy_uid_list_without_items_counts_as_not_given() {
    for blank in ["", " ", ",", " , "] {
        let s = resolve(&["-u", blank, "-g", blank], &[("ENVOY_USER", "envoy")]).unwrap();
        assert_eq!(s.proxy_uid_from_user.as_deref(), Some("envoy"), "{blank:?}");
        assert!(!s.proxy_gid_given, "{blank:?}");
    }
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
    assert_eq!(
        error(&["-p", "70000"], &[]),
        ("--envoy-port".into(), "70000".into())
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
}

#[test]
fn reserved_or_unusable_route_tables_are_refused_naming_flag_or_variable() {
    let flag = "--istio-inbound-tproxy-route-table";
    // Which values are refused is `parse_route_table`'s (tested in rules::capture_values); here,
    // that a refusal names the flag or variable and the value, for a few kinds of bad value.
    for table in ["0", "254", "main", "", "4294967296"] {
        assert_eq!(error(&["-r", table], &[]), (flag.into(), table.into()));
        assert_eq!(
            error(&["-m", "TPROXY", "-b", "*", "-r", table], &[]).0,
            flag
        );
    }
    let env = "ISTIO_INBOUND_TPROXY_ROUTE_TABLE";
    assert_eq!(error(&[], &[(env, "254")]), (env.into(), "254".into()));
    assert_eq!(
        resolve(&["-r", "252"], &[])
            .unwrap()
            .capture
            .tproxy_route_table,
        "252"
    );
}

#[test]
fn values_that_reach_the_kernel_are_checked_as_a_class() {
    for (args, name, value) in [
        (&["-t", "0"][..], "--istio-inbound-tproxy-mark", "0"),
        (&["-t", "abc"], "--istio-inbound-tproxy-mark", "abc"),
        (&["-t", "1338"], "--istio-inbound-tproxy-mark", "1338"),
        (&["-p", "0"], "--envoy-port", "0"),
        (&["-z", "65536"], "--inbound-capture-port", "65536"),
        (&["-e", "x"], "--inbound-tunnel-port", "x"),
        (&["-b", "80,0"], "--istio-inbound-ports", "0"),
        (
            &["-b", "*", "-d", "15090,70000"],
            "--istio-local-exclude-ports",
            "70000",
        ),
        (&["-q", "-5"], "--istio-outbound-ports", "-5"),
        (
            &["-o", "1,http"],
            "--istio-local-outbound-ports-exclude",
            "http",
        ),
        (&["-u", "istio-proxy"], "--proxy-uid", "istio-proxy"),
        (&["-u", "1337", "-g", "1337,x"], "--proxy-gid", "x"),
        (&["-c", "eth0,a/b"], "--istio-exclude-interfaces", "a/b"),
        (
            &["-c", "abcdefghijklmnop"],
            "--istio-exclude-interfaces",
            "abcdefghijklmnop",
        ),
        (&["-k", "../x"], "--kube-virt-interfaces", "../x"),
        (
            &["--iptables-probe-port", "0"],
            "--iptables-probe-port",
            "0",
        ),
        (&["--dns-servers", "10.0.0.1,nope"], "--dns-servers", "nope"),
    ] {
        assert_eq!(error(args, &[]), (name.into(), value.into()), "{args:?}");
    }
    assert_eq!(
        error(&[], &[("ISTIO_OUTBOUND_OWNER_GROUPS", "java,a b")]),
        ("ISTIO_OUTBOUND_OWNER_GROUPS".into(), "a b".into())
    );
    assert_eq!(
        error(&[], &[("PROXY_UID", "root")]),
        ("PROXY_UID".into(), "root".into())
    );
}

#[test]
fn list_items_are_trimmed_everywhere() {
    let s = resolve(
        &[
            "-b",
            "*",
            "-d",
            "15090,15021,15020,8080, 9090",
            "-u",
            " 1337 , 1338",
            "-c",
            "eth1, eth2",
            "-o",
            " 53",
            "-i",
            "10.0.0.0/8, 192.168.0.0/16",
            "-k",
            "k0 ,k1",
        ],
        &[("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", "888, ftp")],
    )
    .unwrap();
    let c = &s.capture;
    assert_eq!(
        c.inbound_ports_exclude,
        vec!["15090", "15021", "15020", "8080", "9090"]
    );
    assert_eq!(c.proxy_uids, vec!["1337", "1338"]);
    assert_eq!(c.exclude_interfaces, vec!["eth1", "eth2"]);
    assert_eq!(c.outbound_ports_exclude, vec!["53"]);
    assert_eq!(
        c.outbound_ranges_include.v4,
        vec!["10.0.0.0/8", "192.168.0.0/16"]
    );
    assert_eq!(c.reroute_virtual_interfaces, vec!["k0", "k1"]);
    assert_eq!(
        c.owner_groups,
        OwnerGroups::AllExcept(vec!["888".into(), "ftp".into()])
    );
    // Empty items are dropped, as istio-iptables does.
    let s = resolve(&["-b", "80,,443,", "-q", " "], &[]).unwrap();
    assert_eq!(
        s.capture.inbound_ports,
        InboundPorts::List(vec!["80".into(), "443".into()])
    );
    assert!(s.capture.outbound_ports_include.is_empty());
}

#[test]
fn a_repeated_flag_takes_its_last_value() {
    let s = resolve(
        &[
            "-p",
            "15001",
            "-p",
            "16000",
            "--envoy-port=17000",
            "-p18000",
        ],
        &[],
    );
    assert_eq!(s.unwrap().capture.proxy_port, "18000");
    let s = resolve(&["-n", "--dry-run=false"], &[("DRY_RUN", "true")]).unwrap();
    assert!(
        !s.dry_run,
        "the last explicit setting beats the environment"
    );
}

#[test]
fn unreadable_booleans_fail_closed() {
    for var in [
        "DRY_RUN",
        "CLEANUP_ONLY",
        "RECONCILE",
        "FORCE_APPLY",
        "SKIP_RULE_APPLY",
        "RUN_VALIDATION",
        "CNI_MODE",
        "NATIVE_NFTABLES",
        "REDIRECT_DNS",
        "ISTIO_META_DNS_CAPTURE",
        "DROP_INVALID",
        "INVALID_DROP",
        "DUAL_STACK",
        "ISTIO_DUAL_STACK",
        "CAPTURE_ALL_DNS",
        "ISTIO_IPTABLES_RESTORE_ONLY",
    ] {
        for value in ["yes", "on", "", " true", "2"] {
            assert_eq!(
                error(&[], &[(var, value)]),
                (var.into(), value.into()),
                "{var}={value:?}"
            );
        }
    }
    for (value, on) in [
        ("1", true),
        ("t", true),
        ("True", true),
        ("F", false),
        ("0", false),
    ] {
        assert_eq!(resolve(&[], &[("DRY_RUN", value)]).unwrap().dry_run, on);
    }
    // An explicit flag decides; the variable is not read.
    assert!(
        resolve(&["--dry-run"], &[("DRY_RUN", "yes")])
            .unwrap()
            .dry_run
    );
}

/// `istio-iptables ambient`: what the usage shows is what is accepted, and nothing
/// given is silently ignored.
mod ambient_flags {
    use std::collections::BTreeSet;

    use crate::iptables_cmd::ambient::tests::parse;
    use crate::iptables_cmd::ambient::{AmbientCommand, AmbientFlags, KubeletUid};
    use crate::iptables_cmd::ambient_flags::decl;
    use argh::FromArgs;

    #[test]
    fn booleans_are_switches_as_the_usage_shows_and_the_space_form_is_refused_naming_the_flag() {
        for (args, ipv6) in [
            (vec!["--dry-run", "--ipv6"], true),
            (vec!["--dry-run", "--ipv6=true"], true),
            (vec!["--dry-run", "--ipv6=1"], true),
            (vec!["--dry-run", "--ipv6=false"], false),
            (vec!["--dry-run"], false),
        ] {
            assert_eq!(
                parse(&args, &[]).unwrap().config.enable_ipv6,
                ipv6,
                "{args:?}"
            );
        }
        // An explicit false beats the environment; the environment fills an absent flag.
        assert!(
            !parse(&["--dry-run", "--ipv6=false"], &[("AMBIENT_IPV6", "true")])
                .unwrap()
                .config
                .enable_ipv6
        );
        assert!(
            parse(&["--dry-run"], &[("AMBIENT_IPV6", "true")])
                .unwrap()
                .config
                .enable_ipv6
        );
        // pflag would read `--ipv6 false` as --ipv6 (on) and a stray "false": refused instead.
        for (args, flag) in [
            (vec!["--dry-run", "--ipv6", "true"], "--ipv6=true"),
            (vec!["--dry-run", "--ipv6", "false"], "--ipv6=false"),
            (
                vec!["--dry-run", "--redirect-dns", "false"],
                "--redirect-dns=false",
            ),
        ] {
            let err = parse(&args, &[]).unwrap_err();
            assert!(err.contains(flag), "{args:?}: {err}");
        }
        let help = AmbientFlags::from_args(&["ambient"], &["--help"])
            .unwrap_err()
            .output;
        assert!(
            help.contains("[--ipv6]") && help.contains("[--redirect-dns]"),
            "{help}"
        );
        assert!(
            !help.contains("--ipv6 <"),
            "usage still shows a value: {help}"
        );
    }

    #[test]
    fn pod_only_flags_are_refused_with_host() {
        for flag in [
            "--ingress",
            "--ingress=false",
            "--pod-dns=enabled",
            "--reroute-virtual-interfaces=tun0",
            "--redirect-dns",
            "--redirect-dns=false",
        ] {
            let err = parse(&["--dry-run", "--host", flag], &[]).unwrap_err();
            let name = flag.split('=').next().unwrap();
            assert!(
                err.contains(name) && err.contains("--host"),
                "{flag}: {err}"
            );
        }
        // The environment is not a flag: AMBIENT_DNS_CAPTURE set for the agent is fine.
        assert!(parse(&["--dry-run", "--host"], &[("AMBIENT_DNS_CAPTURE", "true")]).is_ok());
    }

    #[test]
    fn host_nftables_only_flags_are_refused_elsewhere() {
        for args in [
            vec!["--dry-run", "--kubelet-uid=0"],
            vec!["--dry-run", "--host", "--kubelet-uid=0"],
            vec!["--dry-run", "--native-nftables", "--host-proc=/proc"],
        ] {
            let err = parse(&args, &[]).unwrap_err();
            assert!(
                err.contains("only used by the nftables host rule"),
                "{args:?}: {err}"
            );
        }
        let cmd = parse(
            &["--dry-run", "--host", "--kubelet-uid=0"],
            &[("NATIVE_NFTABLES", "1")],
        )
        .unwrap();
        assert_eq!(cmd.kubelet_uid, KubeletUid::Given("0".into()));
    }

    #[test]
    fn kubelet_uid_is_a_real_uid_and_rendered_as_parsed() {
        let host = ["--dry-run", "--host", "--native-nftables"];
        for bad in ["4294967295", "4294967296", "-1", "kubelet", ""] {
            let flag = format!("--kubelet-uid={bad}");
            let err = parse(&[&host[..], &[flag.as_str()]].concat(), &[]).unwrap_err();
            assert!(
                err.contains("--kubelet-uid") && err.contains(&format!("{bad:?}")),
                "{err}"
            );
        }
        let cmd = parse(&[&host[..], &["--kubelet-uid=+0042"]].concat(), &[]).unwrap();
        assert_eq!(cmd.kubelet_uid, KubeletUid::Given("42".into()));
        let cmd = parse(&[&host[..], &["--kubelet-uid=4294967294"]].concat(), &[]).unwrap();
        assert_eq!(cmd.kubelet_uid, KubeletUid::Given("4294967294".into()));
    }

    #[test]
    fn empty_virtual_interface_items_are_refused_naming_the_item() {
        for (list, item) in [
            ("tun+,,x", "item 2"),
            ("tun0,", "item 2"),
            (",a", "item 1"),
            ("a, ,b", "item 2"),
        ] {
            let flag = format!("--reroute-virtual-interfaces={list}");
            let err = parse(&["--dry-run", &flag], &[]).unwrap_err();
            assert!(
                err.contains("--reroute-virtual-interfaces")
                    && err.contains(item)
                    && err.contains(&format!("{list:?}")),
                "{list:?}: {err}"
            );
        }
        // No list at all (or an empty one) is no interfaces, as Istio's default "".
        for flag in [
            "--reroute-virtual-interfaces=",
            "--reroute-virtual-interfaces= ",
        ] {
            assert!(
                parse(&["--dry-run", flag], &[])
                    .unwrap()
                    .pod
                    .virtual_interfaces
                    .is_empty()
            );
        }
        let cmd = parse(&["--dry-run", "--reroute-virtual-interfaces= tun+ ,x"], &[]).unwrap();
        assert_eq!(cmd.pod.virtual_interfaces, ["tun+", "x"]);
    }

    /// Each env fallback the declaration names, fed through the env seam, changes what is
    /// printed; a declared env var without a row here fails, so none goes unchecked.
    #[test]
    fn every_declared_env_fallback_is_honoured() {
        type Row = (&'static str, &'static str, fn(&AmbientCommand) -> bool);
        let rows: [Row; 5] = [
            ("AMBIENT_IPV6", "true", |c| c.config.enable_ipv6),
            ("AMBIENT_DNS_CAPTURE", "1", |c| c.config.redirect_dns),
            ("NATIVE_NFTABLES", "t", |c| c.nftables),
            ("HOST_PROBE_SNAT_IP", "169.254.9.9", |c| {
                c.config.probe_snat_v4 == "169.254.9.9"
            }),
            ("HOST_PROBE_SNAT_IPV6", "fd00::9", |c| {
                c.config.probe_snat_v6 == "fd00::9"
            }),
        ];
        let declared: BTreeSet<&str> = decl::ALL
            .iter()
            .flat_map(|s| s.env.iter().chain(s.also_env).copied())
            .collect();
        let tested: BTreeSet<&str> = rows.iter().map(|(env, _, _)| *env).collect();
        assert_eq!(declared, tested, "every declared env fallback has a row");
        for (env, value, honoured) in rows {
            assert!(
                !honoured(&parse(&["--dry-run"], &[]).unwrap()),
                "{env} unset"
            );
            let cmd = parse(&["--dry-run"], &[(env, value)]).unwrap();
            assert!(honoured(&cmd), "{env}={value} is not honoured: {cmd:?}");
        }
    }

    #[test]
    fn probe_snat_addresses_must_be_usable_sources() {
        for (flag, why) in [
            ("--host-probe-snat-ip=0.0.0.0", "unspecified"),
            ("--host-probe-snat-ip=127.0.0.1", "loopback"),
            ("--host-probe-snat-ip=255.255.255.255", "broadcast"),
            ("--host-probe-snat-ipv6=::", "unspecified"),
            ("--host-probe-snat-ipv6=ff02::1", "multicast"),
            ("--host-probe-snat-ipv6=::ffff:1.2.3.4", "IPv4-mapped"),
            ("--host-probe-snat-ipv6=10.0.0.1", "IPv6"),
        ] {
            let err = parse(&["--dry-run", flag], &[]).unwrap_err();
            let name = flag.split('=').next().unwrap();
            assert!(err.contains(name) && err.contains(why), "{flag}: {err}");
        }
    }
}
