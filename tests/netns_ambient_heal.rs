//! The iptables-nft drift heal of the ambient in-pod rules for real, in uniquely named network
//! namespaces (removed on drop): rules damaged with `iptables-nft` are healed, and removed, by one
//! nf_tables transaction planned from the typed netlink read — with an executor that refuses
//! every command, so no `*-save`/`*-restore` ran — and the netns then lists (`iptables-nft-save`,
//! both families) exactly what a fresh netns programmed with `iptables-nft-restore` lists.

mod support;

use std::path::Path;
use std::sync::{Arc, Mutex};

use istio_cni::apply::RuleChange;
use istio_cni::apply::ambient::{AmbientApply, apply_iptables_reading};
use istio_cni::apply::exec::{Cmd, CmdOutput, Executor, SpawnError};
use istio_cni::apply::iptables::ForceBinary;
use istio_cni::apply::owned::{HOST_CHAINS, INPOD_CHAINS, OwnedChains};
use istio_cni::rules::RuleSet;
use istio_cni::rules::ambient::{
    AmbientConfig, PROBE_SET_V4, PodOverrides, host_rules, inpod_rules,
};
use support::{Netns, require_dataplane_tools, restore_iptables_nft};

/// Refuses to start anything, and remembers what it was asked to start.
struct NoProcess(Arc<Mutex<Vec<String>>>);

impl Executor for NoProcess {
    fn run(&mut self, cmd: &Cmd) -> Result<CmdOutput, SpawnError> {
        self.0.lock().unwrap().push(cmd.display());
        Err(SpawnError {
            command: cmd.display(),
            source: std::io::Error::other("no process may start in this test"),
        })
    }
}

/// Both families' `iptables-nft-save` without comments and counters (policies kept: a built-in
/// chain left behind shows).
fn saved(ns: &Netns) -> String {
    let mut out = String::new();
    for tool in ["iptables-nft-save", "ip6tables-nft-save"] {
        let text = ns.exec(tool, &[]).stdout;
        for line in String::from_utf8_lossy(&text).lines() {
            if line.starts_with('#') {
                continue;
            }
            out.push_str(line.split(" [").next().unwrap_or(line));
            out.push('\n');
        }
    }
    out
}

fn cfg(dns: bool) -> AmbientConfig {
    AmbientConfig {
        enable_ipv6: true,
        redirect_dns: dns,
        ..AmbientConfig::default()
    }
}

/// Heals `ns` towards `rules` with no process allowed; what it changed.
fn heal(ns: &Netns, rules: &RuleSet) -> RuleChange {
    heal_owned(ns, rules, INPOD_CHAINS)
}

fn heal_owned(ns: &Netns, rules: &RuleSet, owned: OwnedChains) -> RuleChange {
    let netns = istio_cni::netns::Netns::open(Path::new(&ns.path())).unwrap();
    let asked = Arc::new(Mutex::new(Vec::new()));
    let mut exec = NoProcess(asked.clone());
    let rules = rules.clone();
    let outcome = netns
        .run(move || {
            let opts = AmbientApply {
                force_binary: Some(ForceBinary::Nft),
                ..AmbientApply::default()
            };
            apply_iptables_reading(&mut exec, &rules, owned, &opts)
        })
        .expect("enter the netns");
    let asked = asked.lock().unwrap().clone();
    let outcome = outcome.unwrap_or_else(|e| panic!("heal: {e} (asked to run {asked:?})"));
    assert!(asked.is_empty(), "processes asked for: {asked:?}");
    outcome
}

/// A netns with `rules` restored by iptables-nft-restore, after `user` commands of someone else.
fn fresh(tag: &str, rules: &RuleSet, user: &[&[&str]]) -> Netns {
    let ns = Netns::new(tag);
    for args in user {
        ns.exec("iptables-nft", args);
    }
    restore_iptables_nft(&ns, rules).expect("iptables-nft-restore");
    ns
}

#[test]
fn damaged_inpod_rules_are_healed_and_removed_in_one_transaction_without_a_process() {
    require_dataplane_tools();
    let with_dns = inpod_rules(&cfg(true), &PodOverrides::default());
    let pod = fresh("ahp", &with_dns, &[]);
    let reference = fresh("ahr", &with_dns, &[]);
    assert_eq!(saved(&pod), saved(&reference));

    // A rule deleted, a foreign rule in ISTIO_OUTPUT, extra jumps (one in a chain we do not use).
    pod.exec("iptables-nft", &["-t", "nat", "-D", "ISTIO_PRERT", "1"]);
    pod.exec(
        "iptables-nft",
        &[
            "-t",
            "nat",
            "-A",
            "ISTIO_OUTPUT",
            "-p",
            "tcp",
            "--dport",
            "9999",
            "-m",
            "comment",
            "--comment",
            "not ours",
            "-j",
            "ACCEPT",
        ],
    );
    pod.exec(
        "iptables-nft",
        &["-t", "mangle", "-I", "PREROUTING", "-j", "ISTIO_PRERT"],
    );
    pod.exec(
        "iptables-nft",
        &["-t", "mangle", "-A", "INPUT", "-j", "ISTIO_OUTPUT"],
    );
    pod.exec("ip6tables-nft", &["-t", "raw", "-F", "ISTIO_OUTPUT"]);
    assert_ne!(saved(&pod), saved(&reference));
    assert_eq!(heal(&pod, &with_dns), RuleChange::AppliedOverNetlink);
    assert_eq!(saved(&pod), saved(&reference));
    assert_eq!(heal(&pod, &with_dns), RuleChange::AlreadyApplied);

    // DNS capture off: the raw table goes as a fresh apply never creates it.
    let without_dns = inpod_rules(&cfg(false), &PodOverrides::default());
    assert_eq!(heal(&pod, &without_dns), RuleChange::AppliedOverNetlink);
    assert_eq!(saved(&pod), saved(&fresh("ahn", &without_dns, &[])));

    // Removal keeps a user's rule (and its table), and leaves what a netns with only it has.
    let user: &[&str] = &[
        "-t",
        "nat",
        "-A",
        "POSTROUTING",
        "-d",
        "10.9.9.9/32",
        "-j",
        "ACCEPT",
    ];
    pod.exec("iptables-nft", user);
    assert_eq!(
        heal(&pod, &RuleSet::default()),
        RuleChange::AppliedOverNetlink
    );
    assert_eq!(
        saved(&pod),
        saved(&fresh("ahu", &RuleSet::default(), &[user]))
    );
    assert_eq!(heal(&pod, &RuleSet::default()), RuleChange::AlreadyApplied);
}

#[test]
fn removal_leaves_what_a_fresh_netns_has() {
    require_dataplane_tools();
    let rules = inpod_rules(&cfg(true), &PodOverrides::default());
    let pod = fresh("ahx", &rules, &[]);
    pod.exec(
        "iptables-nft",
        &["-t", "mangle", "-A", "ISTIO_OUTPUT", "-j", "RETURN"],
    );
    assert_eq!(
        heal(&pod, &RuleSet::default()),
        RuleChange::AppliedOverNetlink
    );
    assert_eq!(saved(&pod), saved(&Netns::new("ahe")));
    assert_eq!(saved(&pod), "");
}

#[test]
fn a_heal_the_kernel_refuses_changes_nothing_and_names_what_was_refused() {
    require_dataplane_tools();
    let rules = inpod_rules(&cfg(false), &PodOverrides::default());
    let pod = fresh("ahf", &rules, &[]);
    // A user's chain jumps into ours: ours cannot be deleted, so the removal is refused whole.
    pod.exec("iptables-nft", &["-t", "mangle", "-N", "USER_CHAIN"]);
    pod.exec(
        "iptables-nft",
        &["-t", "mangle", "-A", "USER_CHAIN", "-j", "ISTIO_OUTPUT"],
    );
    pod.exec("iptables-nft", &["-t", "nat", "-D", "ISTIO_PRERT", "1"]);
    let before = saved(&pod);
    let netns = istio_cni::netns::Netns::open(Path::new(&pod.path())).unwrap();
    let asked = Arc::new(Mutex::new(Vec::new()));
    let mut exec = NoProcess(asked.clone());
    let err = netns
        .run(move || {
            let opts = AmbientApply {
                force_binary: Some(ForceBinary::Nft),
                ..AmbientApply::default()
            };
            apply_iptables_reading(&mut exec, &RuleSet::default(), INPOD_CHAINS, &opts)
        })
        .expect("enter the netns")
        .expect_err("ISTIO_OUTPUT is still jumped to");
    assert!(asked.lock().unwrap().is_empty());
    let text = err.to_string();
    assert!(text.contains("mangle/ISTIO_OUTPUT"), "{text}");
    assert_eq!(saved(&pod), before);
}

#[test]
fn the_host_rules_are_removed_without_a_process() {
    require_dataplane_tools();
    let host = Netns::new("ahh");
    host.exec("ipset", &["create", PROBE_SET_V4, "hash:ip"]);
    let user: &[&str] = &[
        "-t",
        "nat",
        "-A",
        "POSTROUTING",
        "-o",
        "eth9",
        "-j",
        "MASQUERADE",
    ];
    host.exec("iptables-nft", user);
    restore_iptables_nft(&host, &host_rules(&AmbientConfig::default())).expect("restore");
    assert!(saved(&host).contains("ISTIO_POSTRT"));
    let removed = heal_owned(&host, &RuleSet::default(), HOST_CHAINS);
    assert_eq!(removed, RuleChange::AppliedOverNetlink);
    assert_eq!(
        saved(&host),
        saved(&fresh("ahg", &RuleSet::default(), &[user]))
    );
}
