//! `istio-iptables` applied for real in network namespaces: redirection works both ways, the proxy
//! UID is exempt, re-apply is idempotent, cleanup removes everything, validation reports correctly,
//! and bad input changes nothing.

mod support;

use std::time::Duration;

use support::{PodAndServer, accept_within, assert_outbound_redirected, bin, require_tool};

use istio_cni::iptables_cmd::INJECTOR_DEFAULT_ARGS as INIT_ARGS;

fn tools() {
    require_tool("iptables-restore", "iptables");
    require_tool("setpriv", "util-linux");
}

/// A fresh pod/server pair with Istio's injector rules applied in the pod.
fn applied(tag: &str) -> PodAndServer {
    tools();
    let env = PodAndServer::new(tag);
    assert_ok(&apply(&env, &[]));
    env
}

fn apply(env: &PodAndServer, extra: &[&str]) -> std::process::Output {
    let mut args = vec![bin(), "istio-iptables"];
    args.extend_from_slice(INIT_ARGS);
    args.extend_from_slice(extra);
    env.pod.try_exec(args[0], &args[1..])
}

fn assert_ok(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "istio-iptables failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn outbound_lands_on_15001_with_original_destination() {
    let env = applied("out");
    assert_outbound_redirected(&env);
}

#[test]
fn inbound_lands_on_15006() {
    let env = applied("in");
    let inbound = env.pod.listen("0.0.0.0:15006");
    let target = format!("{}:8080", env.pod_ip);
    assert!(
        env.server.connect(&target),
        "inbound connect to {target} failed"
    );
    let orig = accept_within(&inbound, Duration::from_secs(2))
        .expect("no connection on the 15006 listener");
    assert_eq!(orig.to_string(), target);
}

#[test]
fn proxy_uid_traffic_is_not_redirected() {
    let env = applied("uid");
    let proxy = env.pod.listen("0.0.0.0:15001");
    let server = env.server.listen(&format!("{}:8080", env.server_ip));
    let script = format!("exec 3<>/dev/tcp/{}/8080", env.server_ip);
    let out = env.pod.try_exec(
        "setpriv",
        &[
            "--reuid=1337",
            "--regid=1337",
            "--clear-groups",
            "bash",
            "-c",
            &script,
        ],
    );
    assert!(
        out.status.success(),
        "connect as uid 1337 failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        accept_within(&server, Duration::from_secs(2)).is_some(),
        "the real server did not get the proxy's connection"
    );
    assert!(
        accept_within(&proxy, Duration::from_millis(200)).is_none(),
        "proxy-owned traffic was redirected"
    );
}

#[test]
fn reapply_is_idempotent_and_cleanup_removes_everything() {
    tools();
    let env = PodAndServer::new("idem");
    let before = env.pod.iptables_state();
    assert_ok(&apply(&env, &[]));
    let first = env.pod.iptables_state();
    assert!(
        first.contains("ISTIO_OUTPUT"),
        "rules were not applied:\n{first}"
    );
    assert_ok(&apply(&env, &[]));
    assert_eq!(
        env.pod.iptables_state(),
        first,
        "second apply changed the rules"
    );
    assert_ok(&apply(&env, &["--reconcile"]));
    assert_eq!(
        env.pod.iptables_state(),
        first,
        "reconcile of identical rules changed them"
    );

    // A different config on top: refused without --reconcile, replaces with it.
    let other = [
        "istio-iptables",
        "-p",
        "15001",
        "-u",
        "1337",
        "-i",
        "10.0.0.0/8",
    ];
    let out = env.pod.try_exec(bin(), &other);
    assert!(
        !out.status.success(),
        "drifted rules must not be silently mixed"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("--reconcile"));
    assert_eq!(env.pod.iptables_state(), first);
    assert_ok(
        &env.pod
            .try_exec(bin(), &[&other[..], &["--reconcile"]].concat()),
    );
    let reconciled = env.pod.iptables_state();
    assert!(
        reconciled.contains("-d 10.0.0.0/8 -j ISTIO_REDIRECT"),
        "{reconciled}"
    );
    assert!(
        !reconciled.contains("-A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT"),
        "{reconciled}"
    );

    assert_ok(
        &env.pod
            .try_exec(bin(), &["istio-iptables", "--cleanup-only"]),
    );
    let after = env.pod.iptables_state();
    assert!(
        !after.contains("ISTIO"),
        "cleanup left ISTIO chains:\n{after}"
    );
    assert!(
        !after.lines().any(|l| l.starts_with("-A")),
        "cleanup left rules behind:\n{after}"
    );
    assert!(!before.lines().any(|l| l.starts_with("-A")));
}

#[test]
fn cni_mode_applies_inside_the_given_namespace() {
    tools();
    let env = PodAndServer::new("cni");
    let ns = env.pod.path();
    let mut args = vec!["istio-iptables", "--cni-mode", "--network-namespace", &ns];
    args.extend_from_slice(INIT_ARGS);
    let out = std::process::Command::new(bin())
        .args(&args)
        .output()
        .expect("run");
    assert_ok(&out);
    assert!(env.pod.iptables_state().contains("ISTIO_OUTPUT"));
}

#[test]
fn validation_passes_with_rules_and_fails_with_126_without() {
    tools();
    let env = PodAndServer::new("val");
    let validate = |env: &PodAndServer| {
        env.pod.try_exec(
            "setpriv",
            &[
                "--reuid=1337",
                "--regid=1337",
                "--clear-groups",
                bin(),
                "istio-iptables",
                "--run-validation",
                "--skip-rule-apply",
                "--probe-timeout=3s",
            ],
        )
    };
    let without = validate(&env);
    assert_eq!(
        without.status.code(),
        Some(126),
        "validation without rules must exit 126: {}",
        String::from_utf8_lossy(&without.stderr)
    );
    assert_ok(&apply(&env, &[]));
    let with = validate(&env);
    assert_eq!(
        with.status.code(),
        Some(0),
        "validation with rules failed: {}",
        String::from_utf8_lossy(&with.stderr)
    );
}

#[test]
fn bad_input_changes_nothing() {
    let env = applied("bad");
    let before = env.pod.iptables_state();
    for bad in [
        vec!["-x", "*"],
        vec!["-p", "70000"],
        vec!["-i", "10.0.0.0/33"],
        vec!["-m", "BOGUS"],
        vec!["--no-such-flag"],
        vec!["-b", "80,http"],
        vec!["--force-iptables-binary", "weird"],
    ] {
        let mut args = vec!["istio-iptables", "--reconcile"];
        args.extend_from_slice(&bad);
        let out = env.pod.try_exec(bin(), &args);
        assert!(!out.status.success(), "{bad:?} was accepted");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let value = bad.get(1).copied().unwrap_or(bad[0]);
        assert!(
            stderr.contains(value.trim_start_matches('-')),
            "error for {bad:?} does not name the value: {stderr}"
        );
        assert_eq!(
            env.pod.iptables_state(),
            before,
            "{bad:?} changed the rules"
        );
    }
}

#[test]
fn ipv6_and_tproxy_routes_are_set_up_idempotently() {
    tools();
    let env = PodAndServer::new("v6");
    let args = [
        "istio-iptables",
        "-m",
        "TPROXY",
        "-b",
        "*",
        "-u",
        "1337",
        "--ipv6=true",
    ];
    assert_ok(&env.pod.try_exec(bin(), &args));
    let v6 = String::from_utf8_lossy(&env.pod.exec("ip6tables-save", &[]).stdout).to_string();
    assert!(
        v6.contains("-j TPROXY") && v6.contains("::6/128"),
        "IPv6 TPROXY rules missing:\n{v6}"
    );
    let lo = String::from_utf8_lossy(
        &env.pod
            .exec("ip", &["-6", "addr", "show", "dev", "lo"])
            .stdout,
    )
    .to_string();
    assert!(lo.contains("::6/128"), "::6/128 not on lo:\n{lo}");
    let rules = String::from_utf8_lossy(&env.pod.exec("ip", &["rule"]).stdout).to_string();
    assert!(rules.contains("fwmark 0x539 lookup 133"), "{rules}");
    let route = String::from_utf8_lossy(
        &env.pod
            .exec("ip", &["route", "show", "table", "133"])
            .stdout,
    )
    .to_string();
    assert!(route.contains("local default dev lo"), "{route}");
    // Re-run: nothing fails, nothing is duplicated.
    let v4_before = env.pod.iptables_state();
    assert_ok(&env.pod.try_exec(bin(), &args));
    assert_eq!(env.pod.iptables_state(), v4_before);
    let rules_again = String::from_utf8_lossy(&env.pod.exec("ip", &["rule"]).stdout).to_string();
    assert_eq!(
        rules_again.matches("fwmark 0x539").count(),
        1,
        "{rules_again}"
    );
}

#[test]
fn native_nftables_redirects_and_cleans_up() {
    tools();
    require_tool("nft", "nftables");
    let env = PodAndServer::new("nft");
    let mut args = vec!["istio-iptables", "--native-nftables"];
    args.extend_from_slice(INIT_ARGS);
    assert_ok(&env.pod.try_exec(bin(), &args));
    let ruleset = |env: &PodAndServer| {
        String::from_utf8_lossy(&env.pod.exec("nft", &["list", "ruleset"]).stdout).to_string()
    };
    let first = ruleset(&env);
    assert!(first.contains("table inet istio-proxy-nat"), "{first}");
    assert_ok(&env.pod.try_exec(bin(), &args));
    assert_eq!(ruleset(&env), first, "re-apply must replace, not stack");

    assert_outbound_redirected(&env);

    assert_ok(&env.pod.try_exec(
        bin(),
        &["istio-iptables", "--native-nftables", "--cleanup-only"],
    ));
    assert!(
        !ruleset(&env).contains("istio-proxy"),
        "cleanup left tables"
    );
}

#[test]
fn fresh_namespace_is_programmed_over_netlink_and_reruns_still_verify() {
    tools();
    let env = PodAndServer::new("exec");
    let tables = |env: &PodAndServer| {
        String::from_utf8_lossy(&env.pod.exec("nft", &["list", "tables"]).stdout)
            .lines()
            .count()
    };
    assert_eq!(tables(&env), 0, "a fresh namespace has no nftables tables");
    let mut args = vec![bin(), "istio-iptables"];
    args.extend_from_slice(INIT_ARGS);
    let run = |env: &PodAndServer| {
        std::process::Command::new("ip")
            .args(["netns", "exec", &env.pod.name])
            .args(&args)
            .env("ISTIO_IPTABLES_LOG", "debug")
            .output()
            .expect("run")
    };
    let first = run(&env);
    assert_ok(&first);
    assert!(
        String::from_utf8_lossy(&first.stderr).contains("applied over nfnetlink"),
        "a fresh namespace should be programmed over netlink, without iptables-restore: {}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert!(tables(&env) > 0);
    let applied = env.pod.iptables_state();
    let second = run(&env);
    assert_ok(&second);
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        !stderr.contains("applied over nfnetlink") && stderr.contains("outcome=already applied"),
        "{stderr}"
    );
    assert_eq!(env.pod.iptables_state(), applied);
    assert_outbound_redirected(&env);
}

/// A FIFO as `--network-namespace` fails at once naming the path and what it is (a blocking
/// open would wait for a writer forever; issue 20 §2).
#[test]
fn cni_mode_with_a_fifo_as_the_namespace_fails_fast_naming_it() {
    tools();
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("netns-fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let ns = fifo.display().to_string();
    let mut args = vec!["istio-iptables", "--cni-mode", "--network-namespace", &ns];
    args.extend_from_slice(INIT_ARGS);
    let started = std::time::Instant::now();
    let out = std::process::Command::new(bin())
        .args(&args)
        .output()
        .expect("run");
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "istio-iptables took {took:?}"
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("{ns} is a FIFO, not a network namespace")),
        "{stderr}"
    );
}

/// A rule set far larger than a socket's default send buffer (about 98,000 rules: excluded
/// interfaces, outbound ports and ranges, each list near the kernel's 128 KiB argument limit)
/// goes out as one nf_tables transaction, with no "Message too long" and no iptables-restore;
/// a second run reads what is there first and finds it in place, so it never sends a create
/// that fails with "File exists".
#[test]
fn a_large_rule_set_is_one_netlink_transaction_and_a_rerun_writes_nothing() {
    tools();
    let env = PodAndServer::new("large");
    let digits = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let ifaces: Vec<String> = (0..25_000usize)
        .map(|i| {
            let d = |n: usize| char::from(digits[n % 36]);
            format!("e{}{}{}", d(i / 1296), d(i / 36), d(i))
        })
        .collect();
    let ports: Vec<String> = (1000..21_000).map(|p: u32| p.to_string()).collect();
    let ranges: Vec<String> = (0..8000u32)
        .map(|i| format!("10.{}.{}.0/24", i / 256, i % 256))
        .collect();
    let (ifaces, ports, ranges) = (ifaces.join(","), ports.join(","), ranges.join(","));
    let args = [
        bin(),
        "istio-iptables",
        "-p",
        "15001",
        "-z",
        "15006",
        "-u",
        "1337",
        "-m",
        "REDIRECT",
        "-i",
        "*",
        "-b",
        "*",
        "-c",
        &ifaces,
        "-o",
        &ports,
        "-x",
        &ranges,
    ];
    let run = || {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &env.pod.name])
            .args(args)
            .env("ISTIO_IPTABLES_LOG", "debug")
            .output()
            .expect("run");
        assert_ok(&out);
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let first = run();
    for refused in [
        "Message too long",
        "iptables-restore instead",
        "File exists",
    ] {
        assert!(!first.contains(refused), "{refused}: {first}");
    }
    assert!(first.contains("applied over nfnetlink"), "{first}");
    let rules = env
        .pod
        .iptables_state()
        .lines()
        .filter(|l| l.starts_with("-A"))
        .count();
    assert!(rules > 95_000, "{rules} rules applied");
    let second = run();
    for refused in [
        "File exists",
        "transaction failed",
        "applied over nfnetlink",
    ] {
        assert!(!second.contains(refused), "{refused}: {second}");
    }
    assert!(second.contains("outcome=already applied"), "{second}");
}

/// An iptables-style interface wildcard (`-k tun+`, `-c eth+`) in nftables mode: nft refuses
/// `tun+`, so it is written as nft's `tun*` (the read-back: tests/netns_verify.rs).
#[test]
fn native_nftables_interface_wildcards_apply_and_read_back() {
    tools();
    require_tool("nft", "nftables");
    let env = PodAndServer::new("nftwild");
    let mut args = vec![bin(), "istio-iptables", "--native-nftables"];
    args.extend_from_slice(INIT_ARGS);
    args.extend_from_slice(&["-k", "tun+", "-c", "eth+"]);
    let run = |env: &PodAndServer| {
        std::process::Command::new("ip")
            .args(["netns", "exec", &env.pod.name])
            .args(&args)
            .output()
            .expect("run")
    };
    assert_ok(&run(&env));
    let ruleset =
        String::from_utf8_lossy(&env.pod.exec("nft", &["list", "ruleset"]).stdout).to_string();
    assert!(ruleset.contains("iifname \"tun*\""), "{ruleset}");
    assert!(ruleset.contains("iifname \"eth*\""), "{ruleset}");
    assert_ok(&run(&env));
    assert_outbound_redirected(&env);
}

// DNS capture where every listed server is IPv6 on a pod without IPv6: the DNS chains get no rule,
// yet the output chains jump to them (as Istio writes it). Istio's nftables apply fails there
// ("No such file or directory": a jump to a chain that does not exist); ours declares the chain
// and applies, in both flavours.
#[test]
fn dns_capture_with_only_ipv6_servers_on_an_ipv4_pod_applies() {
    tools();
    require_tool("nft", "nftables");
    for native in [true, false] {
        let env = PodAndServer::new(if native { "dns6nft" } else { "dns6ipt" });
        let mut args = vec!["istio-iptables"];
        if native {
            args.push("--native-nftables");
        }
        args.extend_from_slice(INIT_ARGS);
        args.extend_from_slice(&[
            "--redirect-dns",
            "--dns-servers",
            "fd00::1",
            "--ipv6",
            "false",
        ]);
        assert_ok(&env.pod.try_exec(bin(), &args));
        if native {
            let ruleset =
                String::from_utf8_lossy(&env.pod.exec("nft", &["list", "ruleset"]).stdout)
                    .to_string();
            assert!(ruleset.contains("chain istio-output-dns"), "{ruleset}");
        }
        assert_outbound_redirected(&env);
    }
}
