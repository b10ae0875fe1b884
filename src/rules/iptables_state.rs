//! What an iptables family's tables hold, as typed rules: the one read-back form both readers
//! give, the nf_tables dump ([`super::iptables_nft_decode`]) and `*-save` text
//! ([`super::iptables_save_decode`]), so one comparison with a plan serves every flavour. A rule
//! the model cannot say is kept as a [`ForeignRule`]: it equals no planned rule. Pure.

use std::collections::{BTreeMap, BTreeSet};

use super::model::{ForeignRule, Rule};

/// How a read rule is named when it is deleted: the kernel's handle (an nf_tables dump), or its
/// arguments as `*-save` printed them (`-D CHAIN ARGS…`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleAt {
    Handle(u64),
    SavedArgs(String),
}

/// One rule as read: where it is, and what it says when the model can say it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedRule {
    pub table: String,
    pub chain: String,
    pub at: RuleAt,
    /// The chain its verdict jumps or goes to, read even when the rest is foreign (a foreign
    /// rule jumping into a chain of ours is ours to replace).
    pub jumps_to: Option<String>,
    /// Spelt canonically (as [`super::iptables_nft_decode::canonical`] spells a plan).
    pub rule: Result<Rule, ForeignRule>,
}

/// What one family's tables hold (the tables read: all four from `*-save`, the owned ones from
/// a dump).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IptablesState {
    /// `(table, chain)` of every chain in those tables (empty ones too).
    pub chains: BTreeSet<(String, String)>,
    /// Their rules, chain by chain in the kernel's order.
    pub rules: Vec<DecodedRule>,
    /// `(table, chain)` of the built-in chains whose policy is not accept: left without rules,
    /// they still decide packets, so a heal never deletes them or their table.
    pub not_accepting: BTreeSet<(String, String)>,
}

impl IptablesState {
    /// The rules of one chain, in order.
    pub fn chain<'a>(
        &'a self,
        table: &'a str,
        chain: &'a str,
    ) -> impl Iterator<Item = &'a DecodedRule> {
        self.rules
            .iter()
            .filter(move |r| r.table == table && r.chain == chain)
    }

    /// The rules grouped by `(table, chain)` in name order, each chain's in the kernel's order:
    /// one pass, so a comparison never scans every rule once per chain or per planned rule.
    pub fn by_chain(&self) -> BTreeMap<(&str, &str), Vec<&DecodedRule>> {
        let mut out: BTreeMap<(&str, &str), Vec<&DecodedRule>> = BTreeMap::new();
        for rule in &self.rules {
            out.entry((rule.table.as_str(), rule.chain.as_str()))
                .or_default()
                .push(rule);
        }
        out
    }

    /// The tables holding a chain.
    pub fn tables(&self) -> BTreeSet<&str> {
        self.chains.iter().map(|(t, _)| t.as_str()).collect()
    }

    /// Whether `table` holds the same chains and rules in both (policies and counters aside).
    pub fn same_table(&self, other: &IptablesState, table: &str) -> bool {
        let chains = |s: &IptablesState| -> Vec<(String, String)> {
            s.chains
                .iter()
                .filter(|(t, _)| t == table)
                .cloned()
                .collect()
        };
        let rules = |s: &IptablesState| -> Vec<DecodedRule> {
            s.rules
                .iter()
                .filter(|r| r.table == table)
                .cloned()
                .collect()
        };
        chains(self) == chains(other) && rules(self) == rules(other)
    }
}
