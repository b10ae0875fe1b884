//! The `*-save` text path of the ambient iptables apply: iptables-legacy, and iptables-nft when
//! the typed read failed or the netlink encoding cannot say a rule. Pure.

use std::collections::BTreeSet;

use crate::apply::owned::OwnedChains;
use crate::apply::state::{State, jump_target, normalise};
use crate::rules::Rule;
use crate::rules::iptables::{rule_args, rule_line};
use crate::rules::model::is_builtin_chain;

/// Compares one family's saved state with its planned rules; `None` when they are the same, else
/// the `--noflush` restore input that makes them the same (only our chains and the jumps into
/// them change). Pure.
pub fn plan_family(state: &State, rules: &[Rule], owned: OwnedChains) -> Option<String> {
    plan_family_with(state, rules, owned, false)
}

/// [`plan_family`]; `force`: the restore input even when the text compares equal (the typed read
/// found a difference the text does not show, e.g. a rule the decoder calls foreign).
pub(super) fn plan_family_with(
    state: &State,
    rules: &[Rule],
    owned: OwnedChains,
    force: bool,
) -> Option<String> {
    let mut text = String::new();
    let mut same = true;
    // Tables we plan rules in, or that hold a chain of ours or a jump into one.
    let tables: Vec<&str> = owned
        .tables
        .iter()
        .copied()
        .filter(|table| {
            rules.iter().any(|r| r.table.name() == *table)
                || state.get(*table).is_some_and(|chains| {
                    chains.iter().any(|(chain, saved)| {
                        owned.owns(table, chain)
                            || saved
                                .iter()
                                .any(|r| jump_target(r).is_some_and(|t| owned.owns(table, t)))
                    })
                })
        })
        .collect();
    for table in tables {
        let planned: Vec<&Rule> = rules.iter().filter(|r| r.table.name() == table).collect();
        let current = state.get(table);
        let planned_chains = owned.planned_chains(&planned);
        let existing_chains: Vec<&str> = owned
            .chains
            .iter()
            .copied()
            .filter(|c| current.is_some_and(|t| t.contains_key(*c)))
            .collect();
        // Stale jumps into our chains from built-in chains (any copy).
        let mut deletes = Vec::new();
        let mut builtin_saved: Vec<(&str, String)> = Vec::new();
        if let Some(current) = current {
            for (chain, saved) in current {
                if !is_builtin_chain(chain) {
                    continue;
                }
                for rule in saved {
                    if jump_target(rule).is_some_and(|t| owned.owns(table, t)) {
                        deletes.push(format!("-D {chain} {rule}"));
                        builtin_saved.push((chain, normalise(rule)));
                    }
                }
            }
        }
        if same {
            same = table_is_same(
                &planned,
                current,
                &planned_chains,
                &existing_chains,
                &builtin_saved,
            );
        }
        text.push_str(&format!("*{table}\n"));
        let declared: BTreeSet<&str> = planned_chains
            .iter()
            .chain(&existing_chains)
            .copied()
            .collect();
        for chain in owned.chains.iter().filter(|c| declared.contains(*c)) {
            text.push_str(&format!(":{chain} - [0:0]\n"));
        }
        for d in deletes {
            text.push_str(&d);
            text.push('\n');
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
    (!same || force).then_some(text)
}

fn table_is_same(
    planned: &[&Rule],
    current: Option<&std::collections::BTreeMap<String, Vec<String>>>,
    planned_chains: &[&str],
    existing_chains: &[&str],
    builtin_saved: &[(&str, String)],
) -> bool {
    if planned_chains != existing_chains {
        return false;
    }
    let key = |r: &Rule| normalise(&rule_args(r).join(" "));
    for chain in planned_chains {
        let want: Vec<String> = planned
            .iter()
            .filter(|r| r.chain == *chain)
            .map(|r| key(r))
            .collect();
        let have: Vec<String> = current
            .and_then(|t| t.get(*chain))
            .map(|rules| rules.iter().map(|r| normalise(r)).collect())
            .unwrap_or_default();
        if want != have {
            return false;
        }
    }
    // Each planned built-in rule exactly once, and no other jump into our chains.
    let mut want: Vec<(&str, String)> = planned
        .iter()
        .filter(|r| is_builtin_chain(&r.chain))
        .map(|r| (r.chain.as_str(), key(r)))
        .collect();
    let mut have = builtin_saved.to_vec();
    want.sort();
    have.sort();
    want == have
}
