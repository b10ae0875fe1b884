use std::collections::{BTreeMap, BTreeSet};

use netlink_packet_core::{NLM_F_APPEND, NLM_F_EXCL};

use super::*;
use crate::apply::owned::{HOST_CHAINS, INPOD_CHAINS};
use crate::rules::ambient::{AmbientConfig, PodOverrides, host_rules, inpod_rules};
use crate::rules::iptables_nft::encode;
use crate::rules::iptables_nft_decode::{NoSets, decode_rule};
use crate::rules::iptables_state::{IptablesState, RuleAt};
use crate::rules::model::{ForeignRule, RuleSetBuilder};
use crate::rules::nf_kernel::{
    NFT_MSG_DELCHAIN, NFT_MSG_DELRULE, NFT_MSG_DELTABLE, NFT_MSG_NEWCHAIN, NFT_MSG_NEWRULE,
    NFT_MSG_NEWTABLE,
};
use crate::rules::nla::{AttrValue, to_bytes};
use crate::rules::{Table, Target};

/// One family's tables as the kernel would hold them: chains in creation order, rules in order.
#[derive(Debug, Clone, Default)]
struct Kernel {
    tables: BTreeMap<String, Vec<(String, Vec<DecodedRule>)>>,
    not_accepting: BTreeSet<(String, String)>,
    next_handle: u64,
}

/// Table, chain and its rules as the model says them.
type SeenChain = (String, String, Vec<Result<Rule, ForeignRule>>);

fn text_attr(m: &NftMessage, kind: u16) -> Option<String> {
    m.attrs
        .iter()
        .find(|a| a.kind == kind)
        .map(|a| match &a.value {
            AttrValue::Bytes(b) => String::from_utf8_lossy(b)
                .trim_end_matches('\0')
                .to_string(),
            AttrValue::Nested(..) => panic!("attribute {kind} of {} is nested", m.what),
        })
}

impl Kernel {
    fn chain_mut(&mut self, table: &str, chain: &str) -> &mut Vec<DecodedRule> {
        let chains = self.tables.get_mut(table).expect("table exists");
        let at = chains
            .iter()
            .position(|(c, _)| c == chain)
            .unwrap_or_else(|| panic!("no chain {table}/{chain}"));
        &mut chains[at].1
    }

    fn add_chain(&mut self, table: &str, chain: &str) {
        let chains = self.tables.entry(table.into()).or_default();
        if !chains.iter().any(|(c, _)| c == chain) {
            chains.push((chain.into(), Vec::new()));
        }
    }

    fn add_rule(&mut self, mut rule: DecodedRule, append: bool) {
        self.next_handle += 1;
        rule.at = RuleAt::Handle(self.next_handle);
        let (table, chain) = (rule.table.clone(), rule.chain.clone());
        let rules = self.chain_mut(&table, &chain);
        if append {
            rules.push(rule);
        } else {
            rules.insert(0, rule);
        }
    }

    /// A user's rule: foreign to the model; `jumps_to` when it jumps.
    fn user_rule(&mut self, table: &str, chain: &str, jumps_to: Option<&str>) {
        self.add_chain(table, chain);
        let rule = DecodedRule {
            table: table.into(),
            chain: chain.into(),
            at: RuleAt::Handle(0),
            jumps_to: jumps_to.map(String::from),
            rule: Err(ForeignRule(format!("a user's rule in {chain}"))),
        };
        self.add_rule(rule, true);
    }

    fn jumped_to(&self, table: &str, chain: &str) -> bool {
        self.tables[table]
            .iter()
            .flat_map(|(_, rules)| rules)
            .any(|r| r.jumps_to.as_deref() == Some(chain))
    }

    /// Applies one transaction as the kernel would, all of it (a refusal panics: the test fails).
    fn apply(&mut self, messages: &[NftMessage]) {
        for m in messages {
            let table = text_attr(m, 1).expect("every message names its table");
            match m.kind {
                NFT_MSG_NEWTABLE => {
                    self.tables.entry(table).or_default();
                }
                NFT_MSG_NEWCHAIN => {
                    let chain = text_attr(m, 3).expect("chain name");
                    let exists = self.tables[&table].iter().any(|(c, _)| *c == chain);
                    assert!(!(exists && m.flags & NLM_F_EXCL != 0), "EEXIST: {}", m.what);
                    self.add_chain(&table, &chain);
                }
                NFT_MSG_NEWRULE => {
                    let rule = decode_rule(Family::V4, &to_bytes(&m.attrs), &NoSets);
                    if let Some(target) = &rule.jumps_to {
                        assert!(self.tables[&table].iter().any(|(c, _)| c == target));
                    }
                    self.add_rule(rule, m.flags & NLM_F_APPEND != 0);
                }
                NFT_MSG_DELRULE => {
                    let chain = text_attr(m, 2).expect("chain name");
                    let handle = m
                        .attrs
                        .iter()
                        .find(|a| a.kind == 3)
                        .map(|a| match &a.value {
                            AttrValue::Bytes(b) => {
                                u64::from_be_bytes(b.as_slice().try_into().unwrap())
                            }
                            AttrValue::Nested(..) => panic!("nested handle"),
                        });
                    let rules = self.chain_mut(&table, &chain);
                    match handle {
                        Some(h) => {
                            let at = rules.iter().position(|r| r.at == RuleAt::Handle(h));
                            rules.remove(at.unwrap_or_else(|| panic!("ENOENT: {}", m.what)));
                        }
                        None => rules.clear(),
                    }
                }
                NFT_MSG_DELCHAIN => {
                    let chain = text_attr(m, 3).expect("chain name");
                    assert!(self.chain_mut(&table, &chain).is_empty(), "{}", m.what);
                    assert!(!self.jumped_to(&table, &chain), "EBUSY: {}", m.what);
                    self.tables
                        .get_mut(&table)
                        .unwrap()
                        .retain(|(c, _)| *c != chain);
                }
                NFT_MSG_DELTABLE => {
                    self.tables.remove(&table).expect("ENOENT: table");
                }
                other => panic!("unexpected message {other}: {}", m.what),
            }
        }
    }

    /// What the typed read gives back.
    fn read(&self) -> IptablesState {
        let mut state = IptablesState {
            not_accepting: self.not_accepting.clone(),
            ..IptablesState::default()
        };
        for (table, chains) in &self.tables {
            for (chain, rules) in chains {
                state.chains.insert((table.clone(), chain.clone()));
                state.rules.extend(rules.iter().cloned());
            }
        }
        state
    }

    /// What `iptables-nft-save` would tell apart: names, chain order, rules in order (no handles).
    fn seen(&self) -> Vec<SeenChain> {
        let mut out = Vec::new();
        for (table, chains) in &self.tables {
            for (chain, rules) in chains {
                let rules = rules.iter().map(|r| r.rule.clone()).collect();
                out.push((table.clone(), chain.clone(), rules));
            }
        }
        out.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        out
    }
}

fn cfg(dns: bool) -> AmbientConfig {
    AmbientConfig {
        redirect_dns: dns,
        ..AmbientConfig::default()
    }
}

fn plan(dns: bool) -> Vec<Rule> {
    inpod_rules(&cfg(dns), &PodOverrides::default()).v4
}

/// `start` with `rules` applied fresh: what a heal must leave.
fn fresh_onto(start: &Kernel, rules: &[Rule]) -> Kernel {
    let mut k = start.clone();
    k.apply(&encode(Family::V4, rules).unwrap());
    k
}

/// Heals `k` towards `rules` and checks the result is `start` with `rules` applied fresh.
fn assert_heals(
    mut k: Kernel,
    rules: &[Rule],
    owned: OwnedChains,
    start: &Kernel,
) -> Vec<NftMessage> {
    let messages = heal_messages(Family::V4, &k.read(), rules, owned).unwrap();
    k.apply(&messages);
    assert_eq!(k.seen(), fresh_onto(start, rules).seen());
    // Healing again is the same.
    let again = heal_messages(Family::V4, &k.read(), rules, owned).unwrap();
    k.apply(&again);
    assert_eq!(k.seen(), fresh_onto(start, rules).seen());
    messages
}

#[test]
fn nothing_there_is_the_fresh_encoding() {
    let rules = plan(true);
    assert_eq!(
        heal_messages(Family::V4, &IptablesState::default(), &rules, INPOD_CHAINS).unwrap(),
        encode(Family::V4, &rules).unwrap()
    );
}

#[test]
fn drifted_chain_contents_are_replaced() {
    let rules = plan(false);
    let mut k = fresh_onto(&Kernel::default(), &rules);
    // One rule of ISTIO_OUTPUT gone, one of ISTIO_PRERT doubled.
    k.chain_mut("mangle", "ISTIO_OUTPUT").remove(0);
    let doubled = k.chain_mut("nat", "ISTIO_PRERT")[0].clone();
    k.add_rule(doubled, true);
    let messages = assert_heals(k, &rules, INPOD_CHAINS, &Kernel::default());
    assert!(messages.iter().any(|m| m.what.starts_with("flush chain")));
    assert!(!messages.iter().any(|m| m.kind == NFT_MSG_DELTABLE));
}

#[test]
fn a_foreign_rule_in_our_chain_goes() {
    let rules = plan(false);
    let mut k = fresh_onto(&Kernel::default(), &rules);
    k.user_rule("mangle", "ISTIO_OUTPUT", None);
    assert_heals(k, &rules, INPOD_CHAINS, &Kernel::default());
}

#[test]
fn a_users_extra_jump_into_ours_goes_and_the_users_other_rules_stay() {
    let rules = plan(false);
    let mut start = Kernel::default();
    start.user_rule("nat", "PREROUTING", Some("USER_CHAIN"));
    start.user_rule("nat", "USER_CHAIN", None);
    let mut k = fresh_onto(&start, &rules);
    k.user_rule("nat", "PREROUTING", Some("ISTIO_PRERT"));
    k.user_rule("mangle", "INPUT", Some("ISTIO_OUTPUT"));
    let messages = assert_heals(k, &rules, INPOD_CHAINS, &start);
    // The emptied INPUT chain went, by name; the user's chains were never named.
    assert!(
        messages
            .iter()
            .any(|m| m.what == "delete chain mangle/INPUT")
    );
    assert!(!messages.iter().any(|m| m.what.contains("USER_CHAIN")));
}

#[test]
fn a_chain_no_longer_planned_goes_with_its_emptied_table() {
    let old = plan(true);
    let rules = plan(false);
    assert!(old.iter().any(|r| r.table.name() == "raw"));
    let k = fresh_onto(&Kernel::default(), &old);
    let messages = assert_heals(k, &rules, INPOD_CHAINS, &Kernel::default());
    assert!(messages.iter().any(|m| m.what == "delete table raw"));
    // A table that keeps a user's chain keeps it; only ours go.
    let mut start = Kernel::default();
    start.add_chain("raw", "USER_CHAIN");
    let k = fresh_onto(&start, &old);
    let messages = assert_heals(k, &rules, INPOD_CHAINS, &start);
    assert!(!messages.iter().any(|m| m.kind == NFT_MSG_DELTABLE));
    assert!(
        messages
            .iter()
            .any(|m| m.what == "delete chain raw/ISTIO_OUTPUT")
    );
}

#[test]
fn removal_deletes_emptied_tables_and_keeps_a_users_chain_rule_or_policy() {
    let rules = plan(true);
    let k = fresh_onto(&Kernel::default(), &rules);
    let messages = assert_heals(k, &[], INPOD_CHAINS, &Kernel::default());
    assert!(
        messages.iter().all(|m| m.kind == NFT_MSG_DELTABLE),
        "{messages:?}"
    );
    assert_eq!(messages.len(), 3);

    let mut start = Kernel::default();
    start.add_chain("mangle", "USER_CHAIN");
    start.user_rule("nat", "POSTROUTING", None);
    let mut k = fresh_onto(&start, &rules);
    // raw's PREROUTING drops what it does not accept: the table stays, that chain too.
    k.not_accepting
        .insert(("raw".to_string(), "PREROUTING".to_string()));
    let mut expected = start.clone();
    expected.add_chain("raw", "PREROUTING");
    let messages = heal_messages(Family::V4, &k.read(), &[], INPOD_CHAINS).unwrap();
    k.apply(&messages);
    assert_eq!(k.seen(), expected.seen());
    assert!(!messages.iter().any(|m| m.what.contains("USER_CHAIN")));
    assert!(!messages.iter().any(|m| m.what.contains("POSTROUTING")));
}

#[test]
fn the_host_rule_is_inserted_before_a_users_postrouting_rules() {
    // The host's shape (its SNAT to a set has no encoding: the heal is left to *-restore).
    assert!(
        heal_messages(
            Family::V4,
            &IptablesState::default(),
            &host_rules(&AmbientConfig::default()).v4,
            HOST_CHAINS
        )
        .is_err()
    );
    let mut b = RuleSetBuilder::new(false);
    b.insert(
        Table::Nat,
        "POSTROUTING",
        1,
        vec![],
        Target::Jump("ISTIO_POSTRT".into()),
    );
    b.append(Table::Nat, "ISTIO_POSTRT", vec![], Target::Accept);
    let rules = b.build().v4;
    let mut start = Kernel::default();
    start.user_rule("nat", "POSTROUTING", None);
    let mut k = fresh_onto(&start, &rules);
    // Someone flushed our chain and added a second jump.
    k.chain_mut("nat", "ISTIO_POSTRT").clear();
    k.user_rule("nat", "POSTROUTING", Some("ISTIO_POSTRT"));
    assert_heals(k.clone(), &rules, HOST_CHAINS, &start);
    // Removing keeps the user's rule and its table.
    let messages = heal_messages(Family::V4, &k.read(), &[], HOST_CHAINS).unwrap();
    k.apply(&messages);
    assert_eq!(k.seen(), start.seen());
}

#[test]
fn nothing_of_ours_and_nothing_planned_is_no_message() {
    let mut k = Kernel::default();
    k.user_rule("nat", "PREROUTING", None);
    k.add_chain("raw", "OUTPUT");
    assert!(
        heal_messages(Family::V4, &k.read(), &[], INPOD_CHAINS)
            .unwrap()
            .is_empty()
    );
}
