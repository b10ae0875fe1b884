//! `apply::pod::verify` in real network namespaces, both backends: in place right after
//! `apply::pod::program`, drifted (naming what) after a rule is removed, absent after cleanup —
//! and it never writes (rule counters and nft handles unchanged). IPv6 rules are read only when
//! the pod has an IPv6 address.

mod support;

use std::path::Path;

use istio_cni::apply::pod::{
    self, Backend, NetnsCheck, PodOptions, SIDECAR_NFT_TABLES, WhichNetns,
};
use istio_cni::netns::Netns as NetnsHandle;
use istio_cni::rules::capture::{CaptureConfig, IpRanges};
use support::{Netns, require_tool};

fn handle(ns: &Netns) -> NetnsHandle {
    NetnsHandle::open(Path::new(&ns.path())).expect("open netns")
}

fn opts(backend: Backend) -> PodOptions {
    PodOptions {
        backend,
        reconcile_on_drift: true,
        detect_ipv6: Some(true),
        ..PodOptions::default()
    }
}

fn verify(ns: &Netns, o: &PodOptions) -> NetnsCheck {
    pod::verify(WhichNetns::Pod(&handle(ns)), &CaptureConfig::default(), o).expect("verify")
}

fn stdout(ns: &Netns, program: &str, args: &[&str]) -> String {
    String::from_utf8_lossy(&ns.exec(program, args).stdout)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn iptables_in_place_drifted_absent_and_nothing_written() {
    require_tool("iptables-save", "iptables");
    let ns = Netns::new("vfy4");
    ns.exec("ip", &["addr", "add", "10.254.1.2/24", "dev", "lo"]);
    let o = opts(Backend::Iptables);
    assert_eq!(verify(&ns, &o), NetnsCheck::Absent);
    pod::program(WhichNetns::Pod(&handle(&ns)), &CaptureConfig::default(), &o).expect("program");
    let before = stdout(&ns, "iptables-save", &["-c"]);
    assert_eq!(verify(&ns, &o), NetnsCheck::InPlace);
    assert_eq!(
        stdout(&ns, "iptables-save", &["-c"]),
        before,
        "verify wrote"
    );
    // No IPv6 address: ip6tables is not read, so drift there is not ours to see.
    assert!(!stdout(&ns, "ip6tables-save", &[]).contains("ISTIO"));

    ns.exec("iptables", &["-t", "nat", "-D", "ISTIO_OUTPUT", "1"]);
    match verify(&ns, &o) {
        NetnsCheck::Drifted { what } => {
            assert!(
                what.starts_with("iptables: ") && what.contains("ISTIO_OUTPUT"),
                "{what}"
            )
        }
        other => panic!("{other:?}"),
    }
    // The jump re-pointed at another chain of ours.
    ns.exec("iptables", &["-t", "nat", "-F", "PREROUTING"]);
    ns.exec(
        "iptables",
        &[
            "-t",
            "nat",
            "-A",
            "PREROUTING",
            "-p",
            "tcp",
            "-j",
            "ISTIO_REDIRECT",
        ],
    );
    assert!(matches!(verify(&ns, &o), NetnsCheck::Drifted { .. }));
    pod::cleanup(
        WhichNetns::Pod(&handle(&ns)),
        &CaptureConfig::default(),
        Backend::Iptables,
        None,
    )
    .expect("cleanup");
    assert!(!stdout(&ns, "iptables-save", &[]).contains("ISTIO"));
    assert_eq!(verify(&ns, &o), NetnsCheck::Absent);
}

#[test]
fn ip6tables_is_read_when_the_pod_has_ipv6() {
    require_tool("ip6tables-save", "iptables");
    let ns = Netns::new("vfy6");
    ns.exec("ip", &["addr", "add", "10.254.2.2/24", "dev", "lo"]);
    ns.exec(
        "ip",
        &["addr", "add", "fd00:254:2::2/64", "dev", "lo", "nodad"],
    );
    let o = opts(Backend::Iptables);
    pod::program(WhichNetns::Pod(&handle(&ns)), &CaptureConfig::default(), &o).expect("program");
    assert!(stdout(&ns, "ip6tables-save", &[]).contains("ISTIO_OUTPUT"));
    assert_eq!(verify(&ns, &o), NetnsCheck::InPlace);
    ns.exec("ip6tables", &["-t", "nat", "-F", "ISTIO_REDIRECT"]);
    match verify(&ns, &o) {
        NetnsCheck::Drifted { what } => {
            assert!(
                what.starts_with("ip6tables: ") && what.contains("ISTIO_REDIRECT"),
                "{what}"
            )
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn nftables_in_place_drifted_absent_and_handles_kept() {
    require_tool("nft", "nftables");
    let ns = Netns::new("vfynft");
    ns.exec("ip", &["addr", "add", "10.254.3.2/24", "dev", "lo"]);
    let o = opts(Backend::Nftables);
    assert_eq!(verify(&ns, &o), NetnsCheck::Absent);
    pod::program(WhichNetns::Pod(&handle(&ns)), &CaptureConfig::default(), &o).expect("program");
    let before = stdout(&ns, "nft", &["-a", "list", "ruleset"]);
    assert_eq!(verify(&ns, &o), NetnsCheck::InPlace);
    // Asked again (nothing is learnt or cached: the plan's typed rules): same answer.
    let uncached = o.clone();
    assert_eq!(verify(&ns, &uncached), NetnsCheck::InPlace);
    assert_eq!(
        stdout(&ns, "nft", &["-a", "list", "ruleset"]),
        before,
        "verify wrote"
    );
    assert!(
        stdout(&ns, "nft", &["list", "tables"]).contains(SIDECAR_NFT_TABLES),
        "program created our tables"
    );

    ns.exec(
        "nft",
        &["flush", "chain", "inet", "istio-proxy-nat", "istio-output"],
    );
    match verify(&ns, &o) {
        NetnsCheck::Drifted { what } => assert!(what.contains("istio-output"), "{what}"),
        other => panic!("{other:?}"),
    }
    pod::cleanup(
        WhichNetns::Pod(&handle(&ns)),
        &CaptureConfig::default(),
        Backend::Nftables,
        None,
    )
    .expect("cleanup");
    assert_eq!(verify(&ns, &o), NetnsCheck::Absent);
}

/// Interface wildcards (`tun+`, `eth+` from the annotations or flags) are programmed as nft's
/// `tun*` and read back over netlink as the plan says: in place, not drifted.
#[test]
fn nftables_interface_wildcards_read_back_in_place() {
    require_tool("nft", "nftables");
    let ns = Netns::new("vfywild");
    ns.exec("ip", &["addr", "add", "10.254.4.2/24", "dev", "lo"]);
    let o = opts(Backend::Nftables);
    let cfg = CaptureConfig {
        exclude_interfaces: vec!["eth+".into()],
        reroute_virtual_interfaces: vec!["tun+".into()],
        ..CaptureConfig::default()
    };
    pod::program(WhichNetns::Pod(&handle(&ns)), &cfg, &o).expect("program");
    let listed = stdout(&ns, "nft", &["list", "ruleset"]);
    assert!(
        listed.contains("iifname \"tun*\"") && listed.contains("iifname \"eth*\""),
        "{listed}"
    );
    assert_eq!(
        pod::verify(WhichNetns::Pod(&handle(&ns)), &cfg, &o).expect("verify"),
        NetnsCheck::InPlace
    );
}

/// A /0 in the outbound exclusions (`excludeOutboundIPRanges: 0.0.0.0/0`) is written over
/// netlink as nft writes it (the whole address masked to nothing) and reads back in place.
#[test]
fn nftables_zero_prefix_applies_and_reads_back_in_place() {
    require_tool("nft", "nftables");
    let ns = Netns::new("vfyzero");
    ns.exec("ip", &["addr", "add", "10.254.5.2/24", "dev", "lo"]);
    let o = opts(Backend::Nftables);
    let cfg = CaptureConfig {
        outbound_ranges_exclude: IpRanges::parse("0.0.0.0/0").expect("ranges"),
        ..CaptureConfig::default()
    };
    pod::program(WhichNetns::Pod(&handle(&ns)), &cfg, &o).expect("program");
    let listed = stdout(&ns, "nft", &["list", "ruleset"]);
    assert!(listed.contains("ip daddr 0.0.0.0/0"), "{listed}");
    assert_eq!(
        pod::verify(WhichNetns::Pod(&handle(&ns)), &cfg, &o).expect("verify"),
        NetnsCheck::InPlace
    );
}
