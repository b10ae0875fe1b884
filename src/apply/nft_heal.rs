//! The iptables-nft drift heal as one nf_tables transaction, planned from the typed read
//! ([`super::nft_read::read_owned`]) instead of `*-save` text: what `iptables-restore --noflush`
//! of the `*-save` plan's text ([`super::ambient`]), followed by `drop_emptied_tables`, would leave, with
//! no process. Pure: the messages are sent by the caller.

use std::collections::BTreeSet;

use super::owned::OwnedChains;
use crate::rules::iptables_nft::{
    EncodeError, NftMessage, Unsupported, delete_chain, delete_rule, delete_table, encode_onto,
    flush_chain,
};
use crate::rules::iptables_state::{DecodedRule, IptablesState, RuleAt};
use crate::rules::model::is_builtin_chain;
use crate::rules::{Family, Rule};

/// The messages that leave `family` holding exactly what a fresh apply of `rules` leaves in
/// `owned`'s tables, given what they hold now (`state`); an empty plan removes ours. In each owned
/// table: every built-in chain rule jumping into one of our chains is deleted by handle (a
/// foreign one too), our chains are flushed, those no longer planned deleted, a built-in chain
/// only our jumps were in is deleted; then the planned chains are created where missing and
/// filled, and the planned built-in chain rules added (appended, or first where the plan inserts
/// at 1), as the encoder does for a new netns.
/// A table we held something in that would end with no rule, no user chain and only accepting
/// built-in chains is deleted instead. Rules and chains that are not ours are never named.
pub fn heal_messages(
    family: Family,
    state: &IptablesState,
    rules: &[Rule],
    owned: OwnedChains,
) -> Result<Vec<NftMessage>, EncodeError> {
    let mut out = Vec::new();
    // Our chains that exist and are kept (flushed): the encoder must not create them again.
    let mut kept: BTreeSet<(&str, &str)> = BTreeSet::new();
    for &table in owned.tables {
        let planned: Vec<&Rule> = rules.iter().filter(|r| r.table.name() == table).collect();
        let planned_chains = owned.planned_chains(&planned);
        let present: Vec<&str> = state
            .chains
            .iter()
            .filter(|(t, _)| t == table)
            .map(|(_, c)| c.as_str())
            .collect();
        let ours_present = owned.present_in(state, table);
        let is_jump_into_ours = |r: &DecodedRule| {
            is_builtin_chain(&r.chain)
                && r.jumps_to
                    .as_deref()
                    .is_some_and(|c| owned.chains.contains(&c))
        };
        let in_table = || state.rules.iter().filter(|r| r.table == table);
        let jumps: Vec<&DecodedRule> = in_table().filter(|r| is_jump_into_ours(r)).collect();
        if ours_present.is_empty() && jumps.is_empty() {
            // Nothing of ours here: only what the plan adds.
            continue;
        }
        // What stays once ours is gone.
        let others: Vec<&DecodedRule> = in_table()
            .filter(|r| !owned.chains.contains(&r.chain.as_str()) && !is_jump_into_ours(r))
            .collect();
        let policy_kept = |chain: &str| {
            state
                .not_accepting
                .contains(&(table.to_string(), chain.to_string()))
        };
        let ends_empty = planned.is_empty()
            && others.is_empty()
            && present
                .iter()
                .all(|c| owned.chains.contains(c) || (is_builtin_chain(c) && !policy_kept(c)));
        if ends_empty {
            out.push(delete_table(family, table)?);
            continue;
        }
        for rule in &jumps {
            let RuleAt::Handle(handle) = rule.at else {
                return Err(EncodeError::Unsupported(Unsupported(format!(
                    "{table} chain {}: a rule read from *-save has no handle",
                    rule.chain
                ))));
            };
            out.push(delete_rule(family, table, &rule.chain, handle)?);
        }
        for &chain in &ours_present {
            out.push(flush_chain(family, table, chain)?);
        }
        for &chain in &ours_present {
            if planned_chains.contains(&chain) {
                kept.insert((table, chain));
            } else {
                out.push(delete_chain(family, table, chain)?);
            }
        }
        // A built-in chain the restore created for our jump goes with it (drop_emptied_tables).
        let emptied: BTreeSet<&str> = jumps.iter().map(|r| r.chain.as_str()).collect();
        for chain in emptied {
            let idle = !others.iter().any(|r| r.chain == chain)
                && !planned.iter().any(|r| r.chain == chain)
                && !policy_kept(chain);
            if idle {
                out.push(delete_chain(family, table, chain)?);
            }
        }
    }
    // As the `*-save` plan and the comparison: only rules in our tables are written.
    let planned: Vec<Rule> = rules
        .iter()
        .filter(|r| owned.tables.contains(&r.table.name()))
        .cloned()
        .collect();
    out.extend(encode_onto(family, &planned, &|table, chain| {
        kept.contains(&(table.name(), chain))
    })?);
    Ok(out)
}

#[cfg(test)]
#[path = "nft_heal_tests.rs"]
mod tests;
