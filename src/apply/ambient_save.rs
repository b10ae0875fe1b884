//! The `*-save` text path of the ambient iptables apply: iptables-legacy, and iptables-nft when
//! the typed read failed or the netlink encoding cannot say a rule. The read is decoded into the
//! typed model and compared by [`super::diff::ambient_difference`], as the netlink read is; what
//! differs is rewritten with one `--noflush` restore. Pure.

use std::collections::BTreeSet;

use crate::apply::diff::ambient_difference;
use crate::apply::owned::OwnedChains;
use crate::rules::Rule;
use crate::rules::iptables::{rule_args, rule_line};
use crate::rules::iptables_state::{DecodedRule, IptablesState, RuleAt};
use crate::rules::model::is_builtin_chain;

/// Compares one family's state with its planned rules; `None` when they are the same, else
/// the `--noflush` restore input that makes them the same (only our chains and the jumps into
/// them change). Pure.
pub fn plan_family(state: &IptablesState, rules: &[Rule], owned: OwnedChains) -> Option<String> {
    ambient_difference(state, rules, owned).map(|_| restore_text(state, rules, owned))
}

/// A read rule's arguments for `-D`: as saved, or (a dumped rule) as the model renders it.
fn delete_args(rule: &DecodedRule) -> Option<String> {
    match &rule.at {
        RuleAt::SavedArgs(args) => Some(args.clone()),
        RuleAt::Handle(_) => rule.rule.as_ref().ok().map(|r| rule_args(r).join(" ")),
    }
}

/// The restore input that replaces our chains and the jumps into them with `rules`: per table we
/// plan rules in or that holds something of ours, our chains declared (which flushes them), every
/// built-in chain's jump into them deleted, the plan appended, our chains no longer planned
/// deleted.
pub(super) fn restore_text(state: &IptablesState, rules: &[Rule], owned: OwnedChains) -> String {
    let jumps_into_ours = |r: &DecodedRule| {
        r.jumps_to
            .as_deref()
            .is_some_and(|t| owned.owns(&r.table, t))
    };
    let tables = owned.tables.iter().copied().filter(|table| {
        rules.iter().any(|r| r.table.name() == *table)
            || state
                .chains
                .iter()
                .any(|(t, c)| t == table && owned.owns(table, c))
            || state
                .rules
                .iter()
                .any(|r| r.table == *table && jumps_into_ours(r))
    });
    let by_chain = state.by_chain();
    let mut text = String::new();
    for table in tables {
        let planned: Vec<&Rule> = rules.iter().filter(|r| r.table.name() == table).collect();
        let planned_chains = owned.planned_chains(&planned);
        let existing_chains = owned.present_in(state, table);
        text.push_str(&format!("*{table}\n"));
        let declared: BTreeSet<&str> = planned_chains
            .iter()
            .chain(&existing_chains)
            .copied()
            .collect();
        for chain in owned.chains.iter().filter(|c| declared.contains(*c)) {
            text.push_str(&format!(":{chain} - [0:0]\n"));
        }
        // Stale jumps into our chains from built-in chains (any copy).
        for ((_, chain), found) in by_chain
            .iter()
            .filter(|((t, c), _)| *t == table && is_builtin_chain(c))
        {
            for rule in found.iter().filter(|r| jumps_into_ours(r)) {
                if let Some(args) = delete_args(rule) {
                    text.push_str(&format!("-D {chain} {args}\n"));
                }
            }
        }
        for rule in &planned {
            text.push_str(&rule_line(rule));
            text.push('\n');
        }
        for chain in existing_chains
            .iter()
            .filter(|c| !planned_chains.contains(c))
        {
            text.push_str(&format!("-X {chain}\n"));
        }
        text.push_str("COMMIT\n");
    }
    text
}
