//! `istio-iptables --cleanup-only` in real namespaces that also hold unrelated user rules, chains,
//! nft tables and policy routes: for a matrix of flag sets and both backends, apply then clean up
//! must give back exactly the state before (rules of both families, `nft list ruleset`, `ip rule`,
//! routes, `lo` addresses), and apply → cleanup → apply must equal one apply.

mod support;

use support::user_state::{
    Flavour, assert_same, namespace_with_user_state, observed, run, without_idle_legacy_tables,
};
use support::{Netns, bin, injector_args, require_tool};

/// The injector's arguments without the ones the cases set (`-m`, `-b`, `-i`).
fn base() -> Vec<&'static str> {
    injector_args(&["-m", "-b", "-i"], &[])
}

fn tools() {
    require_tool("iptables-restore", "iptables");
    require_tool("ip6tables-restore", "iptables");
    require_tool("iptables-legacy-save", "iptables");
    require_tool("nft", "nftables");
}

fn istio_iptables(ns: &Netns, flavour: Flavour, args: &[&str]) -> std::process::Output {
    let mut full = vec!["istio-iptables"];
    full.extend_from_slice(args);
    if flavour == Flavour::Legacy {
        full.extend_from_slice(&["--force-iptables-binary", "legacy"]);
    }
    ns.try_exec(bin(), &full)
}

fn ok(out: &std::process::Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Apply with `flags`, clean up with `cleanup_flags` (each a command line, split at white space):
/// the state before comes back; a second apply after the cleanup equals the first.
fn round_trip(tag: &str, flavour: Flavour, flags: &str, cleanup_flags: &str) {
    let (flags, cleanup_flags): (Vec<&str>, Vec<&str>) = (
        flags.split_whitespace().collect(),
        cleanup_flags.split_whitespace().collect(),
    );
    let ns = namespace_with_user_state(tag, flavour);
    let normal = |s: String| match flavour {
        Flavour::Nft => s,
        Flavour::Legacy => without_idle_legacy_tables(&s),
    };
    let pristine = normal(observed(&ns, flavour));
    let mut apply = base();
    apply.extend_from_slice(&flags);
    ok(&istio_iptables(&ns, flavour, &apply), "apply");
    let applied = normal(observed(&ns, flavour));
    assert_ne!(applied, pristine, "{flags:?} applied nothing");
    // The same flags again: nothing to do (the user's ISTIO_FW chain is not drift).
    ok(&istio_iptables(&ns, flavour, &apply), "second apply");
    assert_same(
        &normal(observed(&ns, flavour)),
        &applied,
        &format!("{flags:?}: a second apply changed the namespace"),
    );

    let mut cleanup = base();
    cleanup.extend_from_slice(&cleanup_flags);
    cleanup.push("--cleanup-only");
    ok(&istio_iptables(&ns, flavour, &cleanup), "cleanup");
    assert_same(
        &normal(observed(&ns, flavour)),
        &pristine,
        &format!("{flags:?}: cleanup did not give back the state before the apply"),
    );

    ok(&istio_iptables(&ns, flavour, &apply), "apply after cleanup");
    assert_same(
        &normal(observed(&ns, flavour)),
        &applied,
        &format!("{flags:?}: apply → cleanup → apply differs from one apply"),
    );
}

const V4: &str = "--ipv6=false";
const DUAL: &str = "--ipv6=true";

/// iptables-nft round trips: (tag, apply flags, cleanup flags, what the case shows).
const NFT_ROUND_TRIPS: &[(&str, &str, &str, &str)] = &[
    ("cr", "-i * -b * --ipv6=false", V4, "redirect, the defaults"),
    (
        "ct",
        "-i * -m TPROXY -b 80,8080 -c eth9 --ipv6=false",
        "-i * -m TPROXY -b 80,8080 -c eth9 --ipv6=false",
        "tproxy with an excluded interface",
    ),
    (
        "c6",
        "-i * -m TPROXY -b 80,8080 -c eth9 --ipv6=true",
        "-m TPROXY -b 80,8080 -c eth9 --ipv6=false",
        "dual-stack tproxy is cleaned in both families even when cleanup sees no IPv6",
    ),
    (
        "cd",
        "--redirect-dns --dns-servers 10.96.0.10,fd00::10 --ipv6=true",
        "--redirect-dns --dns-servers 10.96.0.10,fd00::10 --ipv6=true",
        "DNS capture in both families",
    ),
    (
        "ca",
        "--redirect-dns --capture-all-dns --ipv6=false",
        "--redirect-dns --capture-all-dns --ipv6=false",
        "all-DNS capture",
    ),
    (
        "ck",
        "-i * -b * -c eth9 -k veth9,veth8 --ipv6=true",
        "-i * -b * -c eth9 -k veth9,veth8 --ipv6=true",
        "excluded and virtual interfaces",
    ),
    (
        "cl",
        "-k veth9 -i 10.0.0.0/8 -m TPROXY -b * --ipv6=false",
        "-k veth9 -i 10.0.0.0/8 -m TPROXY -b * --ipv6=false",
        "listed ranges with a virtual interface",
    ),
    (
        "co",
        "-i * -m TPROXY -b 80 -c eth9 --ipv6=true",
        "-c eth9 --ipv6=false",
        "cleanup with the other mode's flags still removes the tproxy rules",
    ),
];

#[test]
fn nft_flag_variants_round_trip() {
    tools();
    for (tag, flags, cleanup, what) in NFT_ROUND_TRIPS {
        eprintln!("round trip {tag}: {what}");
        round_trip(tag, Flavour::Nft, flags, cleanup);
    }
}

#[test]
fn legacy_flavour_round_trips() {
    tools();
    let flags = "-m TPROXY -b 80 -c eth9 --redirect-dns --capture-all-dns --ipv6=true";
    round_trip("cg", Flavour::Legacy, flags, flags);
}

#[test]
fn native_nftables_cleanup_removes_only_our_tables_and_routes() {
    tools();
    for (tag, flags) in [
        ("cn", "--native-nftables -i * -b * --ipv6=false"),
        (
            "cm",
            "--native-nftables -m TPROXY -b 80 -c eth9 --ipv6=true",
        ),
        (
            "cq",
            "--native-nftables -i * -k veth9 --redirect-dns --capture-all-dns --ipv6=true",
        ),
    ] {
        round_trip(tag, Flavour::Nft, flags, flags);
    }
}

#[test]
fn cleanup_leaves_a_user_chain_named_istio_and_its_rules() {
    tools();
    let ns = namespace_with_user_state("cu", Flavour::Nft);
    ok(
        &istio_iptables(&ns, Flavour::Nft, &["--cleanup-only", V4]),
        "cleanup",
    );
    let save = run(&ns, "iptables-nft-save", &[]);
    assert!(
        save.contains("-A ISTIO_FW -p tcp -m tcp --dport 9 -j ACCEPT"),
        "{save}"
    );
    assert!(save.contains("-A INPUT -j ISTIO_FW"), "{save}");
}

#[test]
fn cleanup_dry_run_on_a_fresh_namespace_prints_istios_documented_list() {
    tools();
    let ns = Netns::new("cy");
    let dry_cleanup: Vec<&str> =
        "istio-iptables --dry-run --cleanup-only --proxy-uid=1337 --proxy-gid=1337 --ipv6=false"
            .split_whitespace()
            .collect();
    let out = ns.try_exec(bin(), &dry_cleanup);
    ok(&out, "the dry run");
    assert_eq!(String::from_utf8_lossy(&out.stdout), ISTIO_CLEANUP_EXAMPLE);
    // Without iptables installed the dry run still prints the plan, from an empty state.
    let out = std::process::Command::new(bin())
        .args(&dry_cleanup)
        .env("PATH", "/nonexistent")
        .output()
        .expect("run");
    ok(&out, "the dry run");
    assert_eq!(String::from_utf8_lossy(&out.stdout), ISTIO_CLEANUP_EXAMPLE);
}

/// The example of Istio's cleanup dry run (istio-rules.md §3.5).
const ISTIO_CLEANUP_EXAMPLE: &str = "iptables-save
ip6tables-save
iptables -t nat -D ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --gid-owner 1337 -j ISTIO_IN_REDIRECT
iptables -t nat -D ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner --uid-owner 1337 -j ISTIO_IN_REDIRECT
iptables -t nat -D OUTPUT -j ISTIO_OUTPUT
iptables -t nat -F ISTIO_OUTPUT
iptables -t nat -X ISTIO_OUTPUT
iptables -t nat -F ISTIO_IN_REDIRECT
iptables -t nat -X ISTIO_IN_REDIRECT
iptables -t nat -F ISTIO_REDIRECT
iptables -t nat -X ISTIO_REDIRECT
iptables -t nat -F ISTIO_INBOUND
iptables -t nat -X ISTIO_INBOUND
iptables-save
";

#[test]
fn cleanup_dry_run_prints_the_commands_the_real_run_then_performs() {
    tools();
    let ns = namespace_with_user_state("cz", Flavour::Nft);
    let mut apply = base();
    apply.extend_from_slice(&["-i", "*", "-m", "TPROXY", "-b", "80", DUAL]);
    ok(&istio_iptables(&ns, Flavour::Nft, &apply), "apply");
    // The cleanup is asked with other flags: leftovers of ours come from the state.
    let cleanup = ["--cleanup-only", V4];
    let mut dry = vec!["--dry-run"];
    dry.extend_from_slice(&cleanup);
    let printed = istio_iptables(&ns, Flavour::Nft, &dry);
    assert!(printed.status.success());
    let printed: Vec<String> = String::from_utf8_lossy(&printed.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert!(
        printed
            .iter()
            .any(|l| l.starts_with("ip6tables -t nat -D OUTPUT")),
        "{printed:#?}"
    );
    let real = std::process::Command::new("ip")
        .args(["netns", "exec", &ns.name, bin(), "istio-iptables"])
        .args(cleanup)
        .env("ISTIO_IPTABLES_LOG", "debug")
        .output()
        .expect("run");
    ok(&real, "the cleanup");
    let logged: Vec<String> = String::from_utf8_lossy(&real.stderr)
        .lines()
        .filter_map(|l| l.split("\tcleanup\tcommand=").nth(1))
        .map(str::to_string)
        .collect();
    assert_eq!(logged, printed);
}
