//! Real applies in fresh namespaces for the modes the chain test does not cover: TPROXY (mangle
//! rules plus the fwmark policy route), dual stack (ip6tables rules and `::6` on lo), DNS capture,
//! and a re-run of ADD on an already programmed pod.

mod cni_driver;

use cni_driver::*;
use serde_json::{Value, json};

fn conf(run_dir: &std::path::Path) -> Value {
    json!({
        "cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "istio-cni",
        "cni_agent_run_dir": run_dir.display().to_string(),
        "prevResult": {"cniVersion": "1.0.0", "ips": [{"address": "10.31.0.2/24"}], "dns": {}}
    })
}

/// Runs ADD for `pod` against a fake API server in a fresh netns prepared by `setup`.
fn apply(pod: Value, setup: impl Fn(&NetnsGuard)) -> NetnsGuard {
    require_tool("iptables-restore", "iptables");
    let (api, dir) = api_and_run_dir();
    let name = pod["metadata"]["name"].as_str().unwrap().to_string();
    api.put_pod(pod);
    let netns = NetnsGuard::new("app");
    setup(&netns);
    for _ in 0..2 {
        // The second ADD (a runtime retry) must succeed on the programmed namespace.
        let env = cni_env("ADD", &netns.path().display().to_string(), "ns1", &name);
        let run = run_plugin(&env, &conf(dir.path()).to_string());
        assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    }
    netns
}

#[test]
fn tproxy_programs_mangle_rules_and_policy_route() {
    let netns = apply(
        annotated_pod(
            "ns1",
            "tp",
            json!({"sidecar.istio.io/interceptionMode": "TPROXY"}),
        ),
        |_| {},
    );
    let save = netns.iptables_save();
    assert!(save.contains("-A ISTIO_DIVERT -j ACCEPT"), "{save}");
    assert!(save.contains("TPROXY"), "{save}");
    let rules = netns.stdout("ip", &["rule"]);
    assert_eq!(
        rules.matches("lookup 133").count(),
        1,
        "exactly one fwmark rule:\n{rules}"
    );
    let routes = netns.stdout("ip", &["route", "show", "table", "133"]);
    assert!(routes.contains("local default dev lo"), "{routes}");
}

#[test]
fn dual_stack_pod_gets_ipv6_rules() {
    let netns = apply(
        pod_with_proxy_env("ns1", "ds", "ISTIO_DUAL_STACK", "true"),
        |ns| {
            // A pod interface with IPv4 and IPv6 addresses.
            for line in [
                "link add eth0 type veth peer name veth1",
                "link set veth1 up",
                "link set eth0 up",
                "addr add 10.31.0.2/24 dev eth0",
                "addr add fd31::2/64 dev eth0 nodad",
            ] {
                ns.ip(line);
            }
        },
    );
    let v6 = netns.stdout("ip6tables-nft-save", &[]) + &netns.stdout("ip6tables-legacy-save", &[]);
    assert!(v6.contains("-A ISTIO_OUTPUT -d ::1/128 -j RETURN"), "{v6}");
    let lo = netns.stdout("ip", &["-6", "addr", "show", "dev", "lo"]);
    assert!(lo.contains("::6/128"), "{lo}");
}

#[test]
fn dns_capture_programs_raw_table() {
    let netns = apply(
        pod_with_proxy_env("ns1", "dns", "ISTIO_META_DNS_CAPTURE", "true"),
        |_| {},
    );
    let save = netns.iptables_save();
    assert!(save.contains("ISTIO_OUTPUT_DNS"), "{save}");
    assert!(save.contains("--to-ports 15053"), "{save}");
}

#[test]
fn repeated_add_with_changed_settings_converges() {
    require_tool("iptables-restore", "iptables");
    let (api, dir) = api_with_sidecar_pod("ns1", "re");
    let netns = NetnsGuard::new("re");
    let run = netns.add("ns1", "re", &conf(dir.path()));
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    api.put_pod(annotated_pod(
        "ns1",
        "re",
        json!({"traffic.sidecar.istio.io/excludeOutboundPorts": "7777"}),
    ));
    let run = netns.add("ns1", "re", &conf(dir.path()));
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let save = netns.iptables_save();
    assert!(save.contains("--dport 7777 -j RETURN"), "{save}");
    assert!(
        !save
            .lines()
            .any(|l| l.starts_with("-A ISTIO_OUTPUT") && l.contains("15020")),
        "old outbound exclusion left behind:\n{save}"
    );
    assert_eq!(
        save.matches("-A OUTPUT -j ISTIO_OUTPUT").count(),
        1,
        "{save}"
    );
}

#[test]
fn first_add_is_programmed_over_netlink_and_reruns_keep_the_rules() {
    require_tool("iptables-restore", "iptables");
    let (_api, dir) = api_with_sidecar_pod("ns1", "warm");
    let netns = NetnsGuard::new("warm");
    let env = cni_env("ADD", &netns.path().display().to_string(), "ns1", "warm");
    let mut conf = conf(dir.path());
    conf["plugin_log_level"] = json!("debug");
    let first = run_plugin(&env, &conf.to_string());
    assert_eq!(first.code, 0, "{}{}", first.stdout, first.stderr);
    assert!(
        first.stderr.contains("applied over nfnetlink"),
        "a fresh namespace should be programmed without iptables-restore: {}",
        first.stderr
    );
    let rules_only = |save: String| {
        save.lines()
            .filter(|l| !l.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let programmed = rules_only(netns.iptables_save());
    let second = run_plugin(&env, &conf.to_string());
    assert_eq!(second.code, 0, "{}{}", second.stdout, second.stderr);
    assert!(
        !second.stderr.contains("applied over nfnetlink"),
        "{}",
        second.stderr
    );
    assert_eq!(
        rules_only(netns.iptables_save()),
        programmed,
        "a repeated ADD must not change the rules"
    );
    // The same pod through iptables-restore (the operator's opt-out) ends up with the same rules.
    let other = NetnsGuard::new("restore");
    let mut env = cni_env("ADD", &other.path().display().to_string(), "ns1", "warm");
    env.push(("ISTIO_IPTABLES_RESTORE_ONLY", "true".to_string()));
    let via_restore = run_plugin(&env, &conf.to_string());
    assert_eq!(via_restore.code, 0, "{}", via_restore.stderr);
    assert!(!via_restore.stderr.contains("applied over nfnetlink"));
    assert_eq!(rules_only(other.iptables_save()), programmed);
    // Nothing is left running in this namespace.
    let name = netns
        .path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let pids = std::process::Command::new("ip")
        .args(["netns", "pids", &name])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&pids.stdout).trim().is_empty(),
        "processes left in the pod netns"
    );
}

/// `iptables-save` of both families and flavours, without comments and counters.
fn rules_of(netns: &NetnsGuard) -> String {
    let mut all = String::new();
    for tool in [
        "iptables-nft-save",
        "ip6tables-nft-save",
        "iptables-legacy-save",
        "ip6tables-legacy-save",
    ] {
        let out = netns.exec(tool, &[]);
        assert!(out.status.success(), "{tool}");
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if line.starts_with('#') {
                continue;
            }
            all.push_str(line.split(" [").next().unwrap_or(line));
            all.push('\n');
        }
    }
    all
}

#[test]
fn readd_with_changed_interception_mode_converges_to_a_fresh_apply() {
    require_tool("iptables-restore", "iptables");
    let (api, dir) = api_and_run_dir();
    let pod = |mode: &str| {
        annotated_pod(
            "ns1",
            "mode",
            json!({"sidecar.istio.io/interceptionMode": mode}),
        )
    };
    let add = |netns: &NetnsGuard| {
        let env = cni_env("ADD", &netns.path().display().to_string(), "ns1", "mode");
        let run = run_plugin(&env, &conf(dir.path()).to_string());
        assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    };
    let fresh = |mode: &str| {
        api.put_pod(pod(mode));
        let netns = NetnsGuard::new("fresh");
        add(&netns);
        rules_of(&netns)
    };
    let (redirect, tproxy) = (fresh("REDIRECT"), fresh("TPROXY"));

    let netns = NetnsGuard::new("mode");
    api.put_pod(pod("REDIRECT"));
    add(&netns);
    for (mode, expected) in [("TPROXY", &tproxy), ("REDIRECT", &redirect)] {
        api.put_pod(pod(mode));
        add(&netns);
        let now = rules_of(&netns);
        let mut rule_lines: Vec<&str> = now.lines().filter(|l| l.starts_with("-A")).collect();
        let total = rule_lines.len();
        rule_lines.sort();
        rule_lines.dedup();
        assert_eq!(
            rule_lines.len(),
            total,
            "duplicate rules after re-ADD:\n{now}"
        );
        assert_eq!(
            &now, expected,
            "re-ADD as {mode} must end as a fresh {mode} ADD does"
        );
    }
    let rules = netns.stdout("ip", &["rule"]);
    assert!(
        !rules.contains("lookup 133"),
        "TPROXY policy route left behind:\n{rules}"
    );
}
