//! `istio-iptables` command-line handling, run as the real binary: bad values are refused before
//! anything in the namespace changes, port lists as Istio's injector writes them (spaces after
//! commas) apply trimmed, flags parse as pflag does (last value wins, `-h`, no stray positionals,
//! `--log_as_json`/`--log_target` honoured) and unreadable boolean variables fail closed.

mod support;

use std::process::{Command, Output};

use support::{Netns, bin, require_tool};

use istio_cni::iptables_cmd::INJECTOR_DEFAULT_ARGS as INIT_ARGS;

/// Exit code of a command-line error (pilot-agent's on a cobra parse error).
const EXIT_USAGE: i32 = 255;

fn tools() {
    require_tool("iptables-restore", "iptables");
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `istio-iptables ARGS` inside `ns` with `env` added to the environment.
fn run_in(ns: &Netns, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new("ip")
        .args(["netns", "exec", &ns.name, bin(), "istio-iptables"])
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run istio-iptables")
}

/// A dry run on the host: nothing is changed, IPv6 detection is switched off.
fn dry_run(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(bin())
        .arg("istio-iptables")
        .args(["--dry-run", "--ipv6=false"])
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run istio-iptables")
}

/// Everything an apply could change: policy rules, routes of every table, both families' rules.
fn kernel_state(ns: &Netns) -> String {
    [
        ("ip", &["rule"][..]),
        ("ip", &["-6", "rule"]),
        ("ip", &["route", "show", "table", "all"]),
        ("ip", &["-6", "route", "show", "table", "all"]),
        ("ip", &["addr"]),
    ]
    .iter()
    .map(|(cmd, args)| text(&ns.exec(cmd, args).stdout))
    .chain([
        ns.iptables_state(),
        text(&ns.exec("ip6tables-save", &[]).stdout),
    ])
    .map(|s| {
        s.lines()
            .filter(|l| !l.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n")
    })
    .collect::<Vec<_>>()
    .join("\n---\n")
}

fn assert_refused(out: &Output, code: i32, names: &[&str]) {
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "stderr: {stderr}");
    for name in names {
        assert!(
            stderr.contains(name),
            "error does not name {name:?}: {stderr}"
        );
    }
}

#[test]
fn reserved_route_tables_and_bad_values_are_refused_before_anything_changes() {
    tools();
    let ns = Netns::new("rtab");
    // A pod-like namespace: an interface with an address and a default route.
    ns.exec(
        "ip",
        &["link", "add", "d0", "type", "veth", "peer", "name", "d1"],
    );
    // No IPv6 link-local addresses: their duplicate detection would change the state by itself.
    for dev in ["d0", "d1"] {
        ns.exec("ip", &["link", "set", dev, "addrgenmode", "none"]);
    }
    ns.exec("ip", &["addr", "add", "10.252.0.2/24", "dev", "d0"]);
    ns.exec("ip", &["link", "set", "d0", "up"]);
    ns.exec("ip", &["link", "set", "d1", "up"]);
    ns.exec("ip", &["route", "add", "default", "via", "10.252.0.1"]);
    let before = kernel_state(&ns);
    let tproxy = ["-m", "TPROXY", "-b", "*", "-u", "1337", "--ipv6=false"];
    let route_flag = "istio-inbound-tproxy-route-table";
    // The full table of refused values is the parser's unit test; one of each kind here.
    for table in ["253", "local", "-1", "99999999999"] {
        for base in [&tproxy[..], INIT_ARGS] {
            let mut args = base.to_vec();
            args.extend(["-r", table]);
            assert_refused(&run_in(&ns, &args, &[]), 1, &[route_flag, table]);
            assert_eq!(
                kernel_state(&ns),
                before,
                "-r {table} changed the namespace"
            );
        }
        let out = run_in(&ns, &tproxy, &[("ISTIO_INBOUND_TPROXY_ROUTE_TABLE", table)]);
        assert_refused(&out, 1, &["ISTIO_INBOUND_TPROXY_ROUTE_TABLE", table]);
        assert_eq!(kernel_state(&ns), before);
    }
    for (flag, value, name) in [
        ("-t", "0", "istio-inbound-tproxy-mark"),
        ("-t", "mark", "istio-inbound-tproxy-mark"),
        ("-p", "0", "envoy-port"),
        ("-z", "65536", "inbound-capture-port"),
        ("-u", "istio-proxy", "proxy-uid"),
        ("-g", "1337,wheel", "proxy-gid"),
        ("-c", "eth0,a/b", "istio-exclude-interfaces"),
        ("-k", "sixteen-chars-xx", "kube-virt-interfaces"),
        ("-q", "80,0", "istio-outbound-ports"),
    ] {
        let mut args = tproxy.to_vec();
        args.extend([flag, value]);
        let out = run_in(&ns, &args, &[]);
        let item = value.rsplit(',').next().unwrap_or(value);
        assert_refused(&out, 1, &[name, item]);
        assert_eq!(
            kernel_state(&ns),
            before,
            "{flag} {value} changed the namespace"
        );
    }
    // A good table still works.
    let mut args = tproxy.to_vec();
    args.extend(["-r", "252"]);
    let out = run_in(&ns, &args, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let rules = text(&ns.exec("ip", &["rule"]).stdout);
    assert!(rules.contains("lookup 252"), "{rules}");
}

#[test]
fn spaced_port_lists_apply_with_trimmed_ports() {
    tools();
    let out = dry_run(
        &[
            "-b",
            "*",
            "-u",
            "1337",
            "-d",
            "15090,15021,15020,8080, 9090",
        ],
        &[],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    for port in ["15090", "8080", "9090"] {
        let rule = format!("-A ISTIO_INBOUND -p tcp --dport {port} -j RETURN");
        assert!(stdout.contains(&rule), "missing {rule:?} in:\n{stdout}");
    }
    assert!(
        !stdout.contains("  "),
        "an untrimmed item reached the rules:\n{stdout}"
    );

    // For real, in a namespace, every list trimmed (ports, UIDs, interfaces, CIDRs).
    let ns = Netns::new("trim");
    let out = run_in(
        &ns,
        &[
            "-p",
            "15001",
            "-z",
            "15006",
            "-u",
            "1337, 1338",
            "-m",
            "REDIRECT",
            "-i",
            "10.0.0.0/8, 192.168.0.0/16",
            "-x",
            "",
            "-b",
            "*",
            "-d",
            "15090, 8080",
            "-c",
            "lo, d9",
            "-o",
            " 5432",
            "--ipv6=false",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let saved = ns.iptables_state();
    for rule in [
        "-A ISTIO_INBOUND -p tcp -m tcp --dport 8080 -j RETURN",
        "-A ISTIO_OUTPUT -m owner --uid-owner 1338 -j RETURN",
        "-A OUTPUT -o d9 -j RETURN",
        "-A ISTIO_OUTPUT -d 192.168.0.0/16 -j ISTIO_REDIRECT",
        "-A ISTIO_OUTPUT -p tcp -m tcp --dport 5432 -j RETURN",
    ] {
        assert!(saved.contains(rule), "missing {rule:?} in:\n{saved}");
    }
}

#[test]
fn a_repeated_flag_takes_its_last_value() {
    let out = dry_run(&["-u", "1337", "-p", "15001", "-p", "16000"], &[]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        stdout.contains("-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 16000"),
        "{stdout}"
    );
    assert!(!stdout.contains("15001"), "{stdout}");
    let out = dry_run(&["-u", "1337", "--envoy-port=15001", "-p16000"], &[]);
    assert!(text(&out.stdout).contains("--to-ports 16000"));
}

#[test]
fn dash_h_prints_the_same_help_as_double_dash_help() {
    let run = |flag: &str| {
        Command::new(bin())
            .args(["istio-iptables", flag])
            .output()
            .expect("run")
    };
    let (short, long) = (run("-h"), run("--help"));
    assert_eq!(short.status.code(), Some(0), "{}", text(&short.stderr));
    assert_eq!(text(&short.stdout), text(&long.stdout));
    let help = text(&short.stdout);
    for word in [
        "--istio-inbound-tproxy-route-table",
        "--log-target",
        "--log-as-json",
        "DRY_RUN",
    ] {
        assert!(help.contains(word), "{word} missing from help:\n{help}");
    }
    assert!(
        !help.contains("logs go to stderr"),
        "help still says log_target is ignored"
    );
}

#[test]
fn a_stray_positional_argument_is_a_usage_error() {
    for args in [
        &["-p", "15001", "stray"][..],
        &["--redirect-dns", "false"],
        &["-d", "15090,", "8080"],
        &["--", "x"],
    ] {
        let out = dry_run(args, &[]);
        let stray = args.last().copied().unwrap_or_default();
        assert_refused(&out, EXIT_USAGE, &[&format!("{stray:?}")]);
        assert!(
            out.stdout.is_empty(),
            "something was printed: {}",
            text(&out.stdout)
        );
    }
    let out = dry_run(&["--redirect-dns", "false"], &[]);
    assert!(text(&out.stderr).contains("--redirect-dns=false"));
}

#[test]
fn unreadable_dry_run_fails_closed_and_applies_nothing() {
    tools();
    let ns = Netns::new("dryrun");
    let before = kernel_state(&ns);
    let mut args = INIT_ARGS.to_vec();
    args.push("--ipv6=false");
    // Every boolean variable is the unit tests'; here the ones that would change what is applied.
    for var in ["DRY_RUN", "CLEANUP_ONLY", "RECONCILE", "SKIP_RULE_APPLY"] {
        for value in ["yes", "on", "", "enabled"] {
            let out = run_in(&ns, &args, &[(var, value)]);
            assert_refused(&out, 1, &[var, &format!("{value:?}")]);
            assert_eq!(
                kernel_state(&ns),
                before,
                "{var}={value:?} changed the namespace"
            );
        }
    }
    let out = run_in(&ns, &args, &[("DRY_RUN", "True")]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(kernel_state(&ns), before, "DRY_RUN=True applied rules");
}

#[test]
fn log_as_json_and_log_target_are_honoured() {
    let dir = std::env::temp_dir().join(format!("icrs-logtarget-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (first, second) = (dir.join("a.log"), dir.join("b.log"));
    let out = dry_run(
        &[
            "-r",
            "254",
            "--log_as_json",
            &format!("--log_target={}", first.display()),
            "--log_target",
            second.to_str().expect("utf-8 path"),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        out.stderr.is_empty(),
        "logged to stderr too: {}",
        text(&out.stderr)
    );
    for file in [&first, &second] {
        let log = std::fs::read_to_string(file).expect("log file written");
        let line = log.lines().next().expect("a log line");
        let record: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        assert_eq!(record["level"], "error", "{line}");
        assert!(
            record["msg"].as_str().is_some_and(|m| m.contains("254")),
            "{line}"
        );
    }
    let out = dry_run(&["-r", "254", "--log_target=stdout"], &[]);
    assert!(text(&out.stdout).contains("254") && out.stderr.is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ambient_virtual_interfaces_are_checked_like_the_sidecar_ones() {
    for bad in ["tun0:1", "eth0 -j ACCEPT", "sixteen-chars-xx"] {
        let flag = format!("--reroute-virtual-interfaces=ok0,{bad}");
        let out = Command::new(bin())
            .args(["istio-iptables", "ambient", "--dry-run", &flag])
            .output()
            .expect("run istio-iptables ambient");
        assert_refused(
            &out,
            1,
            &["--reroute-virtual-interfaces", &format!("{bad:?}")],
        );
        assert!(
            out.stdout.is_empty(),
            "printed rules: {}",
            text(&out.stdout)
        );
    }
    let out = Command::new(bin())
        .args(["istio-iptables", "ambient", "--dry-run"])
        .arg("--reroute-virtual-interfaces=tun0, veth+")
        .output()
        .expect("run istio-iptables ambient");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("-i veth+ -p tcp"));
}

/// `istio-iptables ambient` (issue 20 §10), the real binary in a namespace of its own: a boolean
/// in the space form, a pod-only flag with `--host`, an empty virtual-interface item and the uid
/// (uid_t)-1 are refused naming the flag, print no rules and change nothing; the usage shows the
/// booleans as the switches they are.
#[test]
fn ambient_refuses_flags_it_would_misread_or_ignore_and_changes_nothing() {
    tools();
    let ns = Netns::new("ambflags");
    let before = kernel_state(&ns);
    let ambient = |args: &[&str]| run_in(&ns, &[&["ambient", "--dry-run"][..], args].concat(), &[]);
    for (args, code, names) in [
        (
            vec!["--ipv6", "true"],
            EXIT_USAGE,
            vec!["\"true\"", "--ipv6=true"],
        ),
        (
            vec!["--ipv6", "false"],
            EXIT_USAGE,
            vec!["\"false\"", "--ipv6=false"],
        ),
        (vec!["--host", "--ingress"], 1, vec!["--ingress", "--host"]),
        (
            vec!["--host", "--pod-dns=disabled"],
            1,
            vec!["--pod-dns", "--host"],
        ),
        (
            vec!["--host", "--reroute-virtual-interfaces=tun0"],
            1,
            vec!["--reroute-virtual-interfaces", "--host"],
        ),
        (
            vec!["--host", "--redirect-dns"],
            1,
            vec!["--redirect-dns", "--host"],
        ),
        (
            vec!["--reroute-virtual-interfaces=tun+,,x"],
            1,
            vec!["--reroute-virtual-interfaces", "\"tun+,,x\"", "item 2"],
        ),
        (
            vec!["--host", "--native-nftables", "--kubelet-uid=4294967295"],
            1,
            vec!["--kubelet-uid", "\"4294967295\""],
        ),
        (
            vec!["--kubelet-uid=0"],
            1,
            vec!["--kubelet-uid", "--native-nftables"],
        ),
        (
            vec!["--host-probe-snat-ip=0.0.0.0"],
            1,
            vec!["--host-probe-snat-ip", "\"0.0.0.0\""],
        ),
    ] {
        let out = ambient(&args);
        assert_refused(&out, code, &names);
        assert!(
            out.stdout.is_empty(),
            "{args:?} printed: {}",
            text(&out.stdout)
        );
        assert_eq!(kernel_state(&ns), before, "{args:?} changed the namespace");
    }
    // What the usage shows is accepted.
    let help = text(&ambient(&["--help"]).stdout);
    assert!(
        help.contains("[--ipv6]") && !help.contains("--ipv6 <"),
        "{help}"
    );
    for args in [
        vec!["--ipv6"],
        vec!["--ipv6=false"],
        vec!["--host", "--native-nftables", "--kubelet-uid=0"],
    ] {
        let out = ambient(&args);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    }
    assert!(text(&ambient(&["--ipv6"]).stdout).contains("ip6tables"));
    assert_eq!(kernel_state(&ns), before);
}
