//! The comparisons over what an nf_tables dump reads back (the encoder's messages, decoded).
use super::*;
use crate::apply::owned::INPOD_CHAINS;
use crate::rules::Family;
use crate::rules::ambient::{AmbientConfig, PodOverrides, inpod_rules};
use crate::rules::iptables_nft::encode;
use crate::rules::iptables_nft_decode::{NoSets, decode_rule};
use crate::rules::iptables_state::RuleAt;
use crate::rules::model::ForeignRule;
use crate::rules::nf_kernel::{NFT_MSG_NEWCHAIN, NFT_MSG_NEWRULE};
use crate::rules::nla::to_bytes;

/// The dumped read's sidecar question (never unsure).
fn sidecar_difference(state: &IptablesState, rules: &[Rule]) -> Option<Difference> {
    match sidecar_diff(state, rules, ReadKind::Dumped) {
        Diff::Same => None,
        Diff::Differs(d) => Some(d),
        Diff::Unsure(_) => panic!("a dumped read is never unsure"),
    }
}

/// The state a fresh netns holds once `rules` are applied: what the encoder sends, decoded.
fn applied(rules: &[Rule]) -> IptablesState {
    let mut state = IptablesState::default();
    for m in encode(Family::V4, rules).unwrap() {
        match m.kind {
            NFT_MSG_NEWCHAIN => {
                let (table, chain) = m.what.rsplit_once(' ').unwrap().1.split_once('/').unwrap();
                state.chains.insert((table.into(), chain.into()));
            }
            NFT_MSG_NEWRULE => {
                state
                    .rules
                    .push(decode_rule(Family::V4, &to_bytes(&m.attrs), &NoSets))
            }
            _ => {}
        }
    }
    // The kernel dumps chain by chain; within a chain the encoder's order is the kernel's.
    state
        .rules
        .sort_by(|a, b| (&a.table, &a.chain).cmp(&(&b.table, &b.chain)));
    state
}

fn plan() -> Vec<Rule> {
    inpod_rules(&AmbientConfig::default(), &PodOverrides::default()).v4
}

#[test]
fn the_planned_rules_read_back_are_no_difference() {
    let rules = plan();
    assert_eq!(
        ambient_difference(&applied(&rules), &rules, INPOD_CHAINS),
        None
    );
    // Nothing planned and nothing there.
    assert_eq!(
        ambient_difference(&IptablesState::default(), &[], INPOD_CHAINS),
        None
    );
}

#[test]
fn a_missing_changed_or_foreign_rule_is_a_difference() {
    let rules = plan();
    let good = applied(&rules);

    let mut missing = good.clone();
    let at = missing
        .rules
        .iter()
        .position(|r| r.chain == "ISTIO_OUTPUT")
        .unwrap();
    missing.rules.remove(at);
    assert!(ambient_difference(&missing, &rules, INPOD_CHAINS).is_some());

    let mut foreign = good.clone();
    foreign.rules[at].rule = Err(ForeignRule("limit expression".into()));
    let diff = ambient_difference(&foreign, &rules, INPOD_CHAINS).unwrap();
    assert!(diff.to_string().contains("limit"), "{diff}");

    // A second jump into our chain from a built-in chain (stacked), even one we cannot read.
    let mut stacked = good.clone();
    let jump = stacked
        .rules
        .iter()
        .find(|r| is_builtin_chain(&r.chain) && r.jumps_to.is_some())
        .unwrap()
        .clone();
    stacked.rules.push(DecodedRule {
        rule: Err(ForeignRule("xt match foo rev 0".into())),
        ..jump
    });
    assert!(ambient_difference(&stacked, &rules, INPOD_CHAINS).is_some());

    // Our chain left behind when nothing is planned.
    assert!(ambient_difference(&good, &[], INPOD_CHAINS).is_some());
    // A rule in someone else's chain is not ours to judge.
    let mut other = good.clone();
    other.rules.push(DecodedRule {
        table: "nat".into(),
        chain: "KUBE_X".into(),
        at: RuleAt::Handle(99),
        jumps_to: None,
        rule: Err(ForeignRule("limit expression".into())),
    });
    assert_eq!(ambient_difference(&other, &rules, INPOD_CHAINS), None);
}

#[test]
fn the_sidecar_plan_read_back_is_no_difference_and_each_change_is_named() {
    let rules = crate::rules::capture::build(&Default::default()).v4;
    let good = applied(&rules);
    assert_eq!(sidecar_difference(&good, &rules), None);
    assert!(holds_any_of(&good, &rules));
    assert!(!holds_any_of(&IptablesState::default(), &rules));
    assert!(matches!(
        sidecar_difference(&IptablesState::default(), &rules),
        Some(Difference::MissingChain { .. })
    ));

    // A rule of ours read as foreign: the chain still holds as many rules, one planned is gone.
    let mut foreign = good.clone();
    let at = foreign
        .rules
        .iter()
        .position(|r| r.chain == "ISTIO_OUTPUT")
        .unwrap();
    foreign.rules[at].rule = Err(ForeignRule("limit expression".into()));
    assert!(matches!(
        sidecar_difference(&foreign, &rules),
        Some(Difference::MissingRule { .. })
    ));

    // A built-in chain's jump applied twice.
    let mut stacked = good.clone();
    let jump = stacked
        .rules
        .iter()
        .find(|r| is_builtin_chain(&r.chain))
        .unwrap()
        .clone();
    stacked.rules.push(jump);
    assert!(matches!(
        sidecar_difference(&stacked, &rules),
        Some(Difference::Stacked { .. })
    ));

    // A chain of ours this plan does not create.
    let mut extra = good.clone();
    extra
        .chains
        .insert(("mangle".into(), "ISTIO_DIVERT".into()));
    assert!(matches!(
        sidecar_difference(&extra, &rules),
        Some(Difference::ExtraChain { .. })
    ));
}

/// A plan of `n` distinct rules in one chain of ours (excluded outbound ranges).
fn wide_plan(n: u32) -> Vec<Rule> {
    let ranges: Vec<String> = (0..n)
        .map(|i| format!("10.{}.{}.0/24", i / 256 % 256, i % 256))
        .collect();
    let cfg = crate::rules::capture::CaptureConfig {
        outbound_ranges_exclude: crate::rules::capture::IpRanges::parse(&ranges.join(",")).unwrap(),
        ..Default::default()
    };
    crate::rules::capture::build(&cfg).v4
}

/// Scanning every found rule once per planned rule would take on the order of n² rule
/// comparisons (10⁹ here, minutes); counting by value takes a moment. The bound is generous.
#[test]
fn comparing_a_wide_plan_is_linear_in_its_rules() {
    let rules = wide_plan(40_000);
    assert!(rules.len() > 40_000, "{}", rules.len());
    let good = applied(&rules);
    let started = std::time::Instant::now();
    assert_eq!(sidecar_difference(&good, &rules), None);
    assert!(holds_any_of(&good, &rules));
    let mut missing = good.clone();
    missing.rules.pop();
    assert!(sidecar_difference(&missing, &rules).is_some());
    let took = started.elapsed();
    assert!(took < std::time::Duration::from_secs(10), "{took:?}");
}

/// The same rule planned and found many times: each copy counted, none re-scanned.
#[test]
fn one_rule_repeated_is_counted_not_rescanned() {
    let base = wide_plan(1);
    let one = base
        .iter()
        .find(|r| {
            r.chain == "ISTIO_OUTPUT"
                && r.matches
                    .iter()
                    .any(|m| matches!(m, crate::rules::model::Match::Dst { .. }))
        })
        .unwrap()
        .clone();
    let mut rules: Vec<Rule> = base.iter().filter(|r| **r != one).cloned().collect();
    rules.extend(std::iter::repeat_n(one, 40_000));
    let good = applied(&rules);
    let started = std::time::Instant::now();
    assert_eq!(sidecar_difference(&good, &rules), None);
    let mut stacked = good.clone();
    let copy = stacked
        .rules
        .iter()
        .find(|r| r.chain == "ISTIO_OUTPUT")
        .unwrap()
        .clone();
    stacked.rules.push(copy);
    assert!(sidecar_difference(&stacked, &rules).is_some());
    let took = started.elapsed();
    assert!(took < std::time::Duration::from_secs(10), "{took:?}");
}
