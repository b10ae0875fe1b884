//! The typed read-back (`apply::nft_read`, decoding with `rules::iptables_nft_decode`) against
//! iptables-nft-restore, the external oracle: for every rule set Istio's goldens produce (the
//! sidecar capture cases, the ambient in-pod and host cases) the rules are applied by
//! iptables-nft-restore itself in a fresh netns, and the reader must give back exactly the model
//! that produced them (spelt canonically: `rules::iptables_nft_decode::as_listed`). Nothing may
//! read back as foreign, and a rule changed behind our back must not read back as equal.

mod support;

#[path = "support/cases.rs"]
mod cases;

use std::collections::BTreeMap;

use istio_cni::apply::diff::ambient_difference;
use istio_cni::apply::nft_read::{KernelSets, read_owned};
use istio_cni::apply::owned::INPOD_CHAINS;
use istio_cni::rules::iptables_nft_decode::as_listed;
use istio_cni::rules::{Family, Rule, RuleSet, ambient, capture};
use support::{Netns, require_tool, restore_iptables_nft};

const TABLES: &[&str] = &["filter", "mangle", "nat", "raw"];

/// The rule model of a sidecar capture case, built in-process as `istio-iptables` builds it.
fn capture_rules(case: &serde_json::Value) -> RuleSet {
    capture::build(&cases::capture_config(case))
}

/// Every golden rule set: (name, rules, ipsets the host rules name).
fn golden_rule_sets() -> Vec<(String, RuleSet, Vec<String>)> {
    let mut sets = Vec::new();
    for case in cases::cases_under("tools/istio-iptables/pkg/capture/") {
        let name = case["case"].as_str().unwrap_or_default().to_string();
        sets.push((name, capture_rules(&case), vec![]));
    }
    assert!(sets.len() >= 14, "expected Istio's capture cases");
    for case in cases::ambient_iptables_cases() {
        let golden = case["golden"].as_str().unwrap_or_default().to_string();
        let cfg = cases::ambient_config(&case["config"]["AmbientConfig"]);
        if golden.ends_with("hostprobe.golden") {
            let mut names = vec![ambient::PROBE_SET_V4.to_string()];
            if cfg.enable_ipv6 {
                names.push(ambient::PROBE_SET_V6.to_string());
            }
            sets.push((golden, ambient::host_rules(&cfg), names));
        } else {
            let pod = cases::overrides(&case["config"]["PodLevelOverrides"]);
            sets.push((golden, ambient::inpod_rules(&cfg, &pod), vec![]));
        }
    }
    sets
}

/// What the reader gives back in `ns` for `family`: the decoded rules per chain, or the
/// foreign ones.
fn read_back(ns: &Netns, family: Family) -> Result<BTreeMap<(String, String), Vec<Rule>>, String> {
    let state = ns
        .spawn(move || read_owned(family, TABLES, &KernelSets))
        .join()
        .unwrap()
        .map_err(|e| format!("read: {e}"))?;
    let mut chains: BTreeMap<(String, String), Vec<Rule>> = BTreeMap::new();
    let mut foreign = Vec::new();
    for r in state.rules {
        match r.rule {
            Ok(rule) => chains.entry((r.table, r.chain)).or_default().push(rule),
            Err(e) => foreign.push(format!("{}/{} at {:?}: {e}", r.table, r.chain, r.at)),
        }
    }
    if foreign.is_empty() {
        Ok(chains)
    } else {
        Err(foreign.join("\n"))
    }
}

#[test]
fn every_golden_rule_reads_back_as_the_model_that_produced_it() {
    require_tool("iptables-nft-restore", "iptables");
    require_tool("ipset", "ipset");
    let mut failures = Vec::new();
    let mut checked = Vec::new();
    let mut not_applicable = Vec::new();
    for (name, rules, ipsets) in golden_rule_sets() {
        let ns = Netns::new("nlread");
        for set in &ipsets {
            let family = if set.ends_with("v6") { "inet6" } else { "inet" };
            ns.exec("ipset", &["create", set, "hash:ip", "family", family]);
        }
        if let Err(refused) = restore_iptables_nft(&ns, &rules) {
            // E.g. an owner group this host does not have.
            not_applicable.push(format!("{name}: {}", refused.trim()));
            continue;
        }
        for family in Family::ALL {
            let want: BTreeMap<(String, String), Vec<Rule>> = as_listed(rules.family(family))
                .into_iter()
                .map(|((t, c), r)| ((t.name().to_string(), c), r))
                .collect();
            match read_back(&ns, family) {
                Ok(got) if got == want => {}
                Ok(got) => failures.push(format!(
                    "{name} {family:?}:\n--- planned\n{want:#?}\n--- read back\n{got:#?}"
                )),
                Err(e) => failures.push(format!("{name} {family:?}:\n{e}")),
            }
        }
        checked.push(name);
    }
    eprintln!(
        "read back {} golden rule sets; not applicable on this host: {not_applicable:?}",
        checked.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(
        checked.len() >= 18,
        "too few golden rule sets were applied: {checked:?}; not applicable: {not_applicable:?}"
    );
}

/// A rule changed behind our back (another port, a rule someone appended, a native nft
/// expression in our chain) is a difference, never equal.
#[test]
fn a_changed_rule_reads_back_as_a_difference() {
    require_tool("iptables-nft-restore", "iptables");
    require_tool("nft", "nftables");
    let cfg = ambient::AmbientConfig::default();
    let rules = ambient::inpod_rules(&cfg, &ambient::PodOverrides::default());
    let diff = |ns: &Netns| {
        let planned = rules.v4.clone();
        ns.spawn(move || {
            let state = read_owned(Family::V4, TABLES, &KernelSets).expect("read");
            ambient_difference(&state, &planned, INPOD_CHAINS)
        })
        .join()
        .unwrap()
    };
    let ns = Netns::new("nlreaddiff");
    restore_iptables_nft(&ns, &rules).expect("restore");
    assert_eq!(diff(&ns), None, "as applied");

    ns.exec(
        "iptables-nft",
        &[
            "-t",
            "nat",
            "-A",
            "ISTIO_OUTPUT",
            "-p",
            "tcp",
            "-j",
            "ACCEPT",
        ],
    );
    assert!(diff(&ns).is_some(), "an appended rule");
    ns.exec(
        "iptables-nft",
        &[
            "-t",
            "nat",
            "-D",
            "ISTIO_OUTPUT",
            "-p",
            "tcp",
            "-j",
            "ACCEPT",
        ],
    );
    assert_eq!(diff(&ns), None, "the appended rule deleted again");

    // A native expression iptables-nft never writes, in our chain.
    ns.exec(
        "nft",
        &[
            "add",
            "rule",
            "ip",
            "nat",
            "ISTIO_OUTPUT",
            "limit",
            "rate",
            "10/second",
            "accept",
        ],
    );
    let d = diff(&ns).expect("a foreign rule in our chain");
    assert!(d.to_string().contains("foreign"), "{d}");
}

/// ipset names over netlink, as the reader uses them: by kernel index (what a `-m set` match
/// keeps). Whether a set exists (the host check) is `probe_set_netlink`'s.
#[test]
fn ipsets_are_found_over_netlink() {
    require_tool("ipset", "ipset");
    use istio_cni::netlink::ipset::set_name;
    let ns = Netns::new("nlipset");
    ns.exec("ipset", &["create", "istio-test-a", "hash:ip"]);
    ns.exec(
        "ipset",
        &["create", "istio-test-b", "hash:ip", "family", "inet6"],
    );
    let found = ns
        .spawn(|| {
            (
                set_name(0).unwrap(),
                set_name(1).unwrap(),
                set_name(7).unwrap(),
            )
        })
        .join()
        .unwrap();
    assert_eq!(
        found,
        (
            Some("istio-test-a".to_string()),
            Some("istio-test-b".to_string()),
            None
        )
    );
}
