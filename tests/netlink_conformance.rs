//! The in-process nf_tables encoding (`rules::iptables_nft`, framed by `netlink::nft_batch`) against iptables-nft-restore itself,
//! the external oracle: for every Istio capture case (and a few extra flag sets), the rules are
//! applied for real in two fresh namespaces — once with `ISTIO_IPTABLES_RESTORE_ONLY=true`
//! (iptables-nft-restore does it), once the default way (we send the messages) — and the kernel's
//! full view (`nft --debug=netlink list ruleset`: every table, chain, handle and expression) plus
//! `iptables-nft-save`/`ip6tables-nft-save` must be identical.

mod support;

#[path = "support/cases.rs"]
mod cases;

use std::process::Output;

use support::{Netns, bin, require_tool, restore_iptables_nft};

const CAPTURE: &str = "tools/istio-iptables/pkg/capture/testdata/";
const NETLINK_USED: &str = "applied over nfnetlink";

/// Flag sets beyond Istio's cases (on top of [`BASE`]): the
/// injector's defaults and the knobs operators set most.
const EXTRA: &[&[&str]] = &[
    &["-i", "*", "-x", "", "-b", "*", "-d", "15090,15021,15020"],
    &["-i", "10.96.0.0/12,172.16.0.0/16", "-b", "*"],
    &["-i", "*", "-x", "10.0.0.0/8,192.168.1.7/32", "-b", "*"],
    &["-i", "*", "-b", "8080,9090", "-d", "15020,15021,15090"],
    &["-i", "*", "-b", "*", "-o", "3306,6379", "-q", "8443"],
    &["-i", "*", "-b", "*", "-k", "eth1,net+"],
    &["-i", "*", "-b", "*", "-c", "eth9"],
    &["-i", "fd00:10::/56,10.96.0.0/12", "-b", "*", "--ipv6=true"],
];

/// The flags every extra run starts from.
const BASE: &[&str] = &["-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT"];

/// `BASE` plus `extra`, IPv4 only unless `extra` says otherwise (a fresh namespace has no address
/// to detect the family from).
fn injector_args(extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = BASE.iter().chain(extra).map(|s| s.to_string()).collect();
    if !args.iter().any(|a| a.starts_with("--ipv6")) {
        args.push("--ipv6=false".into());
    }
    args
}

/// A named run: its argv and environment.
type Run = (String, Vec<String>, Vec<(String, String)>);

struct Applied {
    ok: bool,
    ruleset: String,
    saves: String,
    native: bool,
}

fn apply_in_fresh_netns(args: &[String], env: &[(String, String)], restore_only: bool) -> Applied {
    let ns = Netns::new("nlconf");
    let mut cmd = std::process::Command::new("ip");
    cmd.args(["netns", "exec", &ns.name, bin(), "istio-iptables"])
        .args(args)
        .envs(env.iter().cloned())
        .env("ISTIO_IPTABLES_LOG", "debug");
    if restore_only {
        cmd.env("ISTIO_IPTABLES_RESTORE_ONLY", "true");
    }
    let out = cmd.output().expect("run istio-iptables");
    let text = |o: Output| String::from_utf8_lossy(&o.stdout).to_string();
    let saves = ["iptables-nft-save", "ip6tables-nft-save"]
        .iter()
        .map(|tool| {
            text(ns.exec(tool, &[]))
                .lines()
                .filter(|l| !l.starts_with('#'))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .collect::<Vec<_>>()
        .join("\n--\n");
    Applied {
        ok: out.status.success(),
        ruleset: text(ns.exec("nft", &["--debug=netlink", "list", "ruleset"])),
        saves,
        native: String::from_utf8_lossy(&out.stderr).contains(NETLINK_USED),
    }
}

#[test]
fn netlink_encoding_leaves_the_kernel_exactly_as_iptables_nft_restore_does() {
    require_tool("iptables-nft-restore", "iptables");
    require_tool("nft", "nftables");
    let mut runs: Vec<Run> = Vec::new();
    for case in cases::cases_under(CAPTURE) {
        let args: Vec<String> = cases::case_args(&case)
            .into_iter()
            .filter(|a| a != "--dry-run")
            .collect();
        let name = case["case"].as_str().unwrap_or_default().to_string();
        runs.push((name, args, cases::case_env(&case)));
    }
    assert!(runs.len() >= 14, "expected Istio's capture cases");
    for extra in EXTRA {
        runs.push((format!("injector {extra:?}"), injector_args(extra), vec![]));
    }

    // Owner groups by number (Istio's own cases name a group this host may not have).
    for (var, groups) in [
        ("ISTIO_OUTBOUND_OWNER_GROUPS", "202,1000"),
        ("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", "202"),
    ] {
        let env = vec![(var.to_string(), groups.to_string())];
        runs.push((
            format!("injector with {var}={groups}"),
            injector_args(EXTRA[0]),
            env,
        ));
    }

    let mut failures = Vec::new();
    let mut native = Vec::new();
    let mut fallback = Vec::new();
    for (name, args, env) in &runs {
        let oracle = apply_in_fresh_netns(args, env, true);
        assert!(!oracle.native, "{name}: restore-only run used netlink");
        let ours = apply_in_fresh_netns(args, env, false);
        if !oracle.ok {
            // E.g. an owner group this host does not have: we must fail the same way.
            assert!(
                !ours.ok,
                "{name}: iptables-nft-restore failed but we succeeded"
            );
            fallback.push(format!("{name} (not applicable on this host)"));
            continue;
        }
        assert!(
            ours.ok,
            "{name}: failed where iptables-nft-restore succeeded"
        );
        if ours.native {
            native.push(name.clone());
        } else {
            fallback.push(name.clone());
        }
        if ours.ruleset != oracle.ruleset || ours.saves != oracle.saves {
            failures.push(format!(
                "{name} ({args:?}):\n--- iptables-nft-restore\n{}\n{}\n--- ours\n{}\n{}",
                oracle.ruleset, oracle.saves, ours.ruleset, ours.saves
            ));
        }
    }
    eprintln!(
        "netlink encoding used for {} of {} rule sets; iptables-restore for: {fallback:?}",
        native.len(),
        runs.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    // The common shapes must not silently fall back: the injector defaults, plain IPv4/IPv6, DNS.
    let injector = format!("injector {:?}", EXTRA[0]);
    for must in [
        injector.as_str(),
        "empty",
        "ipv6-empty-inbound-ports",
        "ipnets",
        "dns-uid-gid",
    ] {
        assert!(
            native.iter().any(|n| n == must),
            "{must} fell back to iptables-restore"
        );
    }
}

#[test]
fn a_refused_transaction_names_the_message_and_changes_nothing() {
    require_tool("nft", "nftables");
    let ns = Netns::new("nlrefuse");
    let mut b = istio_cni::rules::model::RuleSetBuilder::new(false);
    b.append(
        istio_cni::rules::Table::Nat,
        "OUTPUT",
        vec![],
        istio_cni::rules::Target::Jump("ISTIO_OUTPUT".into()),
    );
    b.append(
        istio_cni::rules::Table::Nat,
        "ISTIO_OUTPUT",
        vec![],
        istio_cni::rules::Target::Return,
    );
    let rules = b.build();
    let send = {
        let rules = rules.clone();
        // The rule engine describes the messages, the netlink transport frames and sends them.
        move || istio_cni::apply::iptables::apply_nft_netlink(&rules)
    };
    ns.spawn(send.clone())
        .join()
        .unwrap()
        .expect("first transaction");
    let before = String::from_utf8_lossy(&ns.exec("nft", &["list", "ruleset"]).stdout).to_string();
    let err = ns
        .spawn(send)
        .join()
        .unwrap()
        .expect_err("ISTIO_OUTPUT exists already");
    // A refusal is a transaction failure, not a rule set outside the encoding.
    assert!(!err.is_not_encodable(), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("create chain nat/ISTIO_OUTPUT") && text.contains("exists"),
        "{text}"
    );
    let after = String::from_utf8_lossy(&ns.exec("nft", &["list", "ruleset"]).stdout).to_string();
    assert_eq!(before, after, "a refused transaction must change nothing");
    assert_eq!(after.matches("jump ISTIO_OUTPUT").count(), 1);
}

/// Every shape the encoding covers, in both families, against iptables-nft-restore fed the same
/// rules as restore text.
#[test]
fn every_covered_rule_shape_matches_iptables_nft_restore() {
    use istio_cni::rules::model::{Match as M, Proto, RuleSetBuilder, Table, Target as T};
    require_tool("iptables-nft-restore", "iptables");
    require_tool("nft", "nftables");
    let s = |v: &str| v.to_string();
    let mut b = RuleSetBuilder::new(true);
    // Header parts in a different order than iptables emits them (it puts interfaces, protocol,
    // source, destination first, whatever the command line says).
    let all_header = |src: &str, dst: &str| {
        vec![
            M::Dst {
                addr: s(dst),
                negate: true,
            },
            M::Src {
                addr: s(src),
                negate: false,
            },
            M::OutIface {
                name: s("lo"),
                negate: true,
            },
            M::Proto(Proto::Tcp),
            M::DstPort {
                port: s("80"),
                negate: true,
                module: Some(Proto::Tcp),
            },
            M::GidOwner {
                id: s("7"),
                negate: false,
            },
            M::InIface {
                name: s("veth+"),
                negate: false,
            },
        ]
    };
    use istio_cni::rules::Family;
    b.append_to(
        Family::V4,
        Table::Nat,
        "ISTIO_ZOO",
        all_header("10.1.0.0/20", "192.168.0.0/16"),
        T::Return,
    );
    b.append_to(
        Family::V6,
        Table::Nat,
        "ISTIO_ZOO",
        all_header("fd00::/7", "2001:db8:1::/48"),
        T::Return,
    );
    b.append_to(
        Family::V6,
        Table::Nat,
        "ISTIO_ZOO",
        all_header("2001:db8::1", "2001:db8:1:2::/63"),
        T::Accept,
    );
    b.append(
        Table::Nat,
        "ISTIO_ZOO",
        vec![
            M::Proto(Proto::Udp),
            M::SrcPort {
                port: s("53"),
                negate: false,
                module: None,
            },
            M::UidOwner {
                id: s("1337"),
                negate: true,
            },
        ],
        T::Redirect {
            port: s("15053"),
            plural: false,
        },
    );
    b.append(
        Table::Nat,
        "ISTIO_ZOO",
        vec![
            M::Proto(Proto::Tcp),
            M::DstPorts {
                ports: vec![s("1"), s("65535"), s("8080")],
                negate: false,
            },
        ],
        T::Jump(s("ISTIO_TARGET")),
    );
    b.append(Table::Nat, "OUTPUT", vec![], T::Jump(s("ISTIO_ZOO")));
    b.append(Table::Nat, "POSTROUTING", vec![], T::Accept);
    b.insert(
        Table::Nat,
        "PREROUTING",
        1,
        vec![M::InIface {
            name: s("eth0"),
            negate: false,
        }],
        T::Return,
    );
    b.append(Table::Nat, "INPUT", vec![], T::Return);
    b.append(
        Table::Raw,
        "PREROUTING",
        vec![M::Proto(Proto::Udp)],
        T::CtZone(65535),
    );
    let rules = b.build();

    let oracle = Netns::new("zooref");
    restore_iptables_nft(&oracle, &rules)
        .unwrap_or_else(|refused| panic!("iptables-nft-restore refused: {refused}"));
    let ours = Netns::new("zoo");
    let applied = apply_over_netlink(&ours, &rules);
    applied.expect("covered shapes are encoded and accepted");
    let listing = |ns: &Netns| {
        String::from_utf8_lossy(
            &ns.exec("nft", &["--debug=netlink", "list", "ruleset"])
                .stdout,
        )
        .to_string()
    };
    assert_eq!(listing(&ours), listing(&oracle));
}

/// A built-in chain that exists already keeps its owner's policy, as with iptables-nft-restore.
#[test]
fn an_existing_builtin_chain_keeps_its_policy() {
    use istio_cni::rules::model::{Proto, RuleSetBuilder, Table, Target};
    require_tool("iptables-nft", "iptables");
    let ns = Netns::new("nlpolicy");
    ns.exec("iptables-nft", &["-t", "raw", "-P", "PREROUTING", "DROP"]);
    let mut b = RuleSetBuilder::new(false);
    b.append(
        Table::Raw,
        "PREROUTING",
        vec![istio_cni::rules::Match::Proto(Proto::Udp)],
        Target::CtZone(1),
    );
    let rules = b.build();
    ns.spawn(move || istio_cni::apply::iptables::apply_nft_netlink(&rules))
        .join()
        .unwrap()
        .expect("applied");
    let listing = String::from_utf8_lossy(
        &ns.exec("iptables-nft", &["-t", "raw", "-S", "PREROUTING"])
            .stdout,
    )
    .to_string();
    assert!(listing.contains("-P PREROUTING DROP"), "{listing}");
    assert!(listing.contains("-j CT --zone 1"), "{listing}");
}

/// The ambient in-pod rules (mangle marks and CONNMARK, nat redirects, raw conntrack zones with
/// DNS capture) for the shapes a pod can ask for: the netlink encoding leaves the kernel exactly
/// as iptables-nft-restore does, expressions and xtables structs included.
#[test]
fn ambient_inpod_rules_match_iptables_nft_restore() {
    use istio_cni::rules::ambient::{AmbientConfig, PodDns, PodOverrides, inpod_rules};
    require_tool("iptables-nft-restore", "iptables");
    require_tool("nft", "nftables");
    let cases = [
        (AmbientConfig::default(), PodOverrides::default()),
        (
            AmbientConfig {
                enable_ipv6: true,
                redirect_dns: true,
                ..Default::default()
            },
            PodOverrides::default(),
        ),
        (
            AmbientConfig {
                enable_ipv6: true,
                ..Default::default()
            },
            PodOverrides {
                ingress: true,
                virtual_interfaces: vec!["tap0".into(), "veth9".into()],
                dns: PodDns::Enabled,
            },
        ),
    ];
    for (i, (cfg, pod)) in cases.into_iter().enumerate() {
        let rules = inpod_rules(&cfg, &pod);
        let oracle = Netns::new("inpodref");
        restore_iptables_nft(&oracle, &rules)
            .unwrap_or_else(|refused| panic!("iptables-nft-restore refused: {refused}"));
        let ours = Netns::new("inpod");
        let applied = apply_over_netlink(&ours, &rules);
        applied.unwrap_or_else(|e| panic!("case {i}: in-pod rules are encoded and accepted: {e}"));
        let view = |ns: &Netns| {
            let listing = ns
                .exec("nft", &["--debug=netlink", "list", "ruleset"])
                .stdout;
            let v4 = ns.exec("iptables-nft-save", &[]).stdout;
            let v6 = ns.exec("ip6tables-nft-save", &[]).stdout;
            let text = |b: Vec<u8>| String::from_utf8_lossy(&b).to_string();
            // Save headers carry a timestamp.
            let strip = |t: String| {
                t.lines()
                    .filter(|l| !l.starts_with('#'))
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            (text(listing), strip(text(v4)), strip(text(v6)))
        };
        assert_eq!(view(&ours), view(&oracle), "case {i}");
    }
}

/// `rules` applied in `ns` through our nf_tables encoding (no process).
fn apply_over_netlink(
    ns: &Netns,
    rules: &istio_cni::rules::RuleSet,
) -> Result<(), istio_cni::apply::iptables::NftNetlinkError> {
    let rules = rules.clone();
    ns.spawn(move || istio_cni::apply::iptables::apply_nft_netlink(&rules))
        .join()
        .unwrap()
}
