//! A refused or failed `istio-iptables` apply changes nothing, in any table of either family;
//! `--reconcile` converges to exactly what a fresh apply of the new configuration gives.

mod support;

use support::user_state::{
    Flavour, assert_same, namespace_with_user_state, observed, run, without_idle_legacy_tables,
};
use support::{Netns, bin, injector_args, require_tool};

fn tools() {
    require_tool("iptables-restore", "iptables");
    require_tool("ip6tables-restore", "iptables");
    require_tool("iptables-legacy-save", "iptables");
    require_tool("nft", "nftables");
}

/// The injector's REDIRECT capture, dual-stack.
fn redirect_args() -> Vec<&'static str> {
    injector_args(&["-x"], &["--ipv6=true"])
}

/// TPROXY for port 80 only, dual-stack.
fn tproxy_args() -> Vec<&'static str> {
    injector_args(
        &["-x", "-m", "-b", "-d"],
        &["-m", "TPROXY", "-b", "80", "--ipv6=true"],
    )
}

/// Runs istio-iptables; legacy is picked the way an operator does, with FORCE_IPTABLES_BINARY.
fn istio_iptables(ns: &Netns, flavour: Flavour, args: &[&str]) -> std::process::Output {
    let mut full = match flavour {
        Flavour::Legacy => vec!["FORCE_IPTABLES_BINARY=legacy"],
        Flavour::Nft => vec!["-u", "FORCE_IPTABLES_BINARY"],
    };
    full.extend_from_slice(&[bin(), "istio-iptables"]);
    full.extend_from_slice(args);
    ns.try_exec("env", &full)
}

fn ok(out: std::process::Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// REDIRECT applied; TPROXY without `--reconcile` is refused and leaves everything as it was;
/// with it, the namespace ends exactly as a fresh TPROXY apply; and back again.
fn mode_change(tag: &str, flavour: Flavour) {
    let ns = namespace_with_user_state(tag, flavour);
    ok(
        istio_iptables(&ns, flavour, &redirect_args()),
        "REDIRECT apply",
    );
    let redirect = observed(&ns, flavour);

    let refused = istio_iptables(&ns, flavour, &tproxy_args());
    assert!(!refused.status.success(), "drifted rules must not be mixed");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("--reconcile"), "{stderr}");
    assert_same(
        &observed(&ns, flavour),
        &redirect,
        "a refused apply changed the namespace",
    );

    let mut reconcile = tproxy_args();
    reconcile.push("--reconcile");
    ok(istio_iptables(&ns, flavour, &reconcile), "TPROXY reconcile");
    let fresh = namespace_with_user_state(&format!("{tag}f"), flavour);
    ok(
        istio_iptables(&fresh, flavour, &tproxy_args()),
        "fresh TPROXY apply",
    );
    assert_same(
        &observed(&ns, flavour),
        &observed(&fresh, flavour),
        "reconcile must end exactly where a fresh apply of the new configuration does",
    );

    let mut back = redirect_args();
    back.push("--reconcile");
    ok(istio_iptables(&ns, flavour, &back), "REDIRECT reconcile");
    let ours_gone = observed(&ns, flavour);
    let save = run(&ns, &flavour.tool("iptables", "-save"), &[]);
    assert!(
        !save.contains("CONNMARK") && !save.contains("TPROXY"),
        "{save}"
    );
    if flavour == Flavour::Nft {
        assert_eq!(
            ours_gone, redirect,
            "switching back must not leave TPROXY rules"
        );
    }
}

#[test]
fn refused_mode_change_changes_nothing_and_reconcile_converges() {
    tools();
    mode_change("am", Flavour::Nft);
}

#[test]
fn refused_mode_change_changes_nothing_with_legacy_iptables() {
    tools();
    mode_change("al", Flavour::Legacy);
}

/// A leftover chain of ours in one table of one family blocks every table of both families: the
/// TPROXY restore must not commit mangle before nat refuses, and a dual-stack REDIRECT apply (one
/// netlink transaction) must not commit IPv4 when IPv6 holds the leftover.
#[test]
fn a_leftover_chain_in_one_table_blocks_every_table() {
    tools();
    let mut redirect_dual = redirect_args();
    redirect_dual.retain(|a| *a != "-m" && *a != "REDIRECT");
    for (tag, tool, chain, args) in [
        ("ac", "iptables-nft", "ISTIO_INBOUND", tproxy_args()),
        ("a6", "ip6tables-nft", "ISTIO_OUTPUT", redirect_dual),
    ] {
        let ns = namespace_with_user_state(tag, Flavour::Nft);
        run(&ns, tool, &["-t", "nat", "-N", chain]);
        let before = observed(&ns, Flavour::Nft);
        let out = istio_iptables(&ns, Flavour::Nft, &args);
        assert!(
            !out.status.success(),
            "{args:?} was applied over a leftover"
        );
        assert_same(
            &observed(&ns, Flavour::Nft),
            &before,
            &format!("{args:?}: the refusal changed something"),
        );
    }
}

/// A reconcile whose new rules fail after the old ones were removed puts every table back.
#[test]
fn a_failed_reconcile_puts_the_old_rules_back() {
    tools();
    for flavour in [Flavour::Nft, Flavour::Legacy] {
        let ns = namespace_with_user_state("ar", flavour);
        ok(
            istio_iptables(&ns, flavour, &redirect_args()),
            "REDIRECT apply",
        );
        let normal = |s: String| match flavour {
            Flavour::Nft => s,
            Flavour::Legacy => without_idle_legacy_tables(&s),
        };
        let before = normal(observed(&ns, flavour));
        let mut args = tproxy_args();
        args.extend_from_slice(&["-k", "averyveryverylonginterfacename", "--reconcile"]);
        let out = istio_iptables(&ns, flavour, &args);
        assert!(!out.status.success(), "the nat table was expected to fail");
        assert_same(
            &normal(observed(&ns, flavour)),
            &before,
            &format!("{flavour:?}: the failed reconcile was not rolled back"),
        );
    }
}

/// A fresh apply whose nat table fails after its mangle table committed: the mangle table is
/// undone, so the namespace is as before.
#[test]
fn a_restore_failing_after_an_earlier_table_committed_is_undone() {
    tools();
    for flavour in [Flavour::Nft, Flavour::Legacy] {
        let ns = namespace_with_user_state("af", flavour);
        let normal = |s: String| match flavour {
            Flavour::Nft => s,
            Flavour::Legacy => without_idle_legacy_tables(&s),
        };
        let before = normal(observed(&ns, flavour));
        // Interface names longer than the kernel's 15 characters fail in nat PREROUTING only.
        let mut args = tproxy_args();
        args.extend_from_slice(&["-k", "averyveryverylonginterfacename"]);
        let out = istio_iptables(&ns, flavour, &args);
        assert!(
            !out.status.success(),
            "the nat table was expected to fail: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_same(
            &normal(observed(&ns, flavour)),
            &before,
            &format!("{flavour:?}: the partial apply was not undone"),
        );
    }
}

/// Rules of ours stacked twice (as older cleanups left them) are drift, and a reconcile removes
/// every copy.
#[test]
fn stacked_copies_of_our_rules_are_drift_and_reconcile_removes_them() {
    tools();
    let ns = namespace_with_user_state("as", Flavour::Nft);
    ok(
        istio_iptables(&ns, Flavour::Nft, &tproxy_args()),
        "TPROXY apply",
    );
    let once = observed(&ns, Flavour::Nft);
    run(
        &ns,
        "iptables-nft",
        &[
            "-t",
            "mangle",
            "-A",
            "PREROUTING",
            "-p",
            "tcp",
            "-m",
            "mark",
            "--mark",
            "1337",
            "-j",
            "CONNMARK",
            "--save-mark",
        ],
    );
    let stacked = observed(&ns, Flavour::Nft);
    let again = istio_iptables(&ns, Flavour::Nft, &tproxy_args());
    assert!(!again.status.success(), "stacked rules were called applied");
    assert_same(
        &observed(&ns, Flavour::Nft),
        &stacked,
        "the refusal changed something",
    );
    let mut reconcile = tproxy_args();
    reconcile.push("--reconcile");
    ok(istio_iptables(&ns, Flavour::Nft, &reconcile), "reconcile");
    assert_same(&observed(&ns, Flavour::Nft), &once, "reconcile left a copy");
}
