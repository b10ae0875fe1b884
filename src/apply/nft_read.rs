//! The iptables-nft state of the calling thread's netns read as typed rules: the chains and rules
//! of the tables we own, dumped over nfnetlink (no `*-save` process) and decoded by
//! [`crate::rules::iptables_nft_decode`], the inverse of the encoder. Comparing that with a plan
//! ([`ambient_difference`]) is pure; a rule the decoder cannot read is foreign and counts as a
//! difference, never as equal. A difference is healed from this read, as one nf_tables
//! transaction ([`super::nft_heal`]), rule handles and chain policies included.
//! iptables-legacy keeps the `*-save` text path ([`super::state`]).

use std::collections::{BTreeSet, HashMap, HashSet};

use super::iptables::nf_family;
use super::owned::OwnedChains;
use super::state::Difference;
use crate::netlink::nft_batch::BatchError;
use crate::netlink::nft_dump;
use crate::rules::capture::{is_owned_chain, owned_chains};
use crate::rules::iptables_nft_decode::{DecodedRule, SetNames, as_listed, decode_rule};
use crate::rules::model::is_builtin_chain;
use crate::rules::{Family, Rule};

/// What one family's owned tables hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnedState {
    /// `(table, chain)` of every chain in those tables (empty ones too).
    pub chains: BTreeSet<(String, String)>,
    /// Their rules, chain by chain in the kernel's order.
    pub rules: Vec<DecodedRule>,
    /// `(table, chain)` of the built-in chains whose policy is not accept: left without rules,
    /// they still decide packets, so a heal never deletes them or their table.
    pub not_accepting: BTreeSet<(String, String)>,
}

impl OwnedState {
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
}

/// The set names of the calling thread's netns, looked up over netlink as a rule names one.
pub struct KernelSets;

impl SetNames for KernelSets {
    fn name_of(&self, index: u16) -> Option<String> {
        crate::netlink::ipset::set_name(index).ok().flatten()
    }
}

/// Reads `tables` of `family` in the calling thread's netns: one chain dump, then one rule dump
/// per table that exists.
pub fn read_owned(
    family: Family,
    tables: &[&str],
    sets: &dyn SetNames,
) -> Result<OwnedState, BatchError> {
    let listed = nft_dump::list_chains_with_policy(nf_family(family))?;
    read_owned_among(family, tables, sets, listed)
}

/// [`read_owned`] from a chain dump the caller already made (`(table, chain, policy)` of every
/// chain of the family): one rule dump per owned table that exists.
pub fn read_owned_among(
    family: Family,
    tables: &[&str],
    sets: &dyn SetNames,
    listed: Vec<(String, String, Option<u32>)>,
) -> Result<OwnedState, BatchError> {
    const NF_ACCEPT: u32 = 1;
    let nf = nf_family(family);
    let mut chains = BTreeSet::new();
    let mut not_accepting = BTreeSet::new();
    for (table, chain, policy) in listed {
        if !tables.contains(&table.as_str()) {
            continue;
        }
        if policy.is_some_and(|p| p != NF_ACCEPT) {
            not_accepting.insert((table.clone(), chain.clone()));
        }
        chains.insert((table, chain));
    }
    let present: BTreeSet<&str> = chains.iter().map(|(t, _)| t.as_str()).collect();
    let mut rules = Vec::new();
    for table in present {
        for record in nft_dump::dump_rules(nf, table)? {
            rules.push(decode_rule(family, &record, sets));
        }
    }
    Ok(OwnedState {
        chains,
        rules,
        not_accepting,
    })
}

/// How `state` differs from holding exactly `rules` in `owned`'s chains — the same question the
/// `*-save` comparison ([`super::ambient::plan_family`]) answers: our chains exist exactly when
/// planned, hold exactly the planned rules in order, and the built-in chains hold each planned
/// rule and no other rule jumping into ours. None when nothing differs. Pure.
pub fn ambient_difference(
    state: &OwnedState,
    rules: &[Rule],
    owned: OwnedChains,
) -> Option<String> {
    let listed = as_listed(rules);
    for &table in owned.tables {
        let planned: Vec<&Rule> = rules.iter().filter(|r| r.table.name() == table).collect();
        let planned_chains = owned.planned_chains(&planned);
        let existing_chains: Vec<&str> = owned
            .chains
            .iter()
            .copied()
            .filter(|c| state.chains.contains(&(table.to_string(), c.to_string())))
            .collect();
        if planned_chains != existing_chains {
            return Some(format!(
                "{table}: chains {existing_chains:?} where {planned_chains:?} are planned"
            ));
        }
        for &chain in &planned_chains {
            let want = listed
                .iter()
                .find(|((t, c), _)| t.name() == table && c == chain)
                .map(|(_, r)| r.as_slice())
                .unwrap_or_default();
            let have: Vec<&DecodedRule> = state.chain(table, chain).collect();
            if let Some(foreign) = have.iter().find_map(|r| r.rule.as_ref().err()) {
                return Some(format!("{table} chain {chain}: {foreign}"));
            }
            let same = have.len() == want.len()
                && have.iter().zip(want).all(|(h, w)| h.rule.as_ref() == Ok(w));
            if !same {
                return Some(format!(
                    "{table} chain {chain} holds {} rules that differ from the {} planned",
                    have.len(),
                    want.len()
                ));
            }
        }
        // Built-in chains: every rule jumping into ours, against the planned built-in rules.
        let mut want: Vec<String> = listed
            .iter()
            .filter(|((t, c), _)| t.name() == table && is_builtin_chain(c))
            .flat_map(|(_, rules)| rules.iter().map(|r| format!("{r:?}")))
            .collect();
        let mut have = Vec::new();
        for r in state.rules.iter().filter(|r| {
            r.table == table
                && is_builtin_chain(&r.chain)
                && r.jumps_to
                    .as_deref()
                    .is_some_and(|t| owned.chains.contains(&t))
        }) {
            match &r.rule {
                Ok(rule) => have.push(format!("{rule:?}")),
                Err(foreign) => return Some(format!("{table} chain {}: {foreign}", r.chain)),
            }
        }
        want.sort();
        have.sort();
        if want != have {
            return Some(format!(
                "{table}: the built-in chains' jumps into our chains differ from the plan"
            ));
        }
    }
    None
}

/// How `state` differs from the sidecar plan `rules` — the question
/// [`super::state::compare_with_plan`] answers from `*-save` text, asked of typed rules (so
/// never "unsure"): every planned chain there; our chains hold as many rules as planned; no
/// planned rule more often than planned; every planned rule there (order not compared, as in
/// Istio); no chain of ours the plan does not create. A foreign rule equals no planned one.
/// Linear in the rules planned and found: each is counted once, by value.
pub fn sidecar_difference(state: &OwnedState, rules: &[Rule]) -> Option<Difference> {
    let owned = owned_chains();
    let listed = as_listed(rules);
    let found = by_chain(state);
    for ((table, chain), planned) in &listed {
        let (table, chain) = (table.name(), chain.as_str());
        let names = || (table.to_string(), chain.to_string());
        if !state.chains.contains(&names()) {
            let (table, chain) = names();
            return Some(Difference::MissingChain { table, chain });
        }
        let have = found.get(&(table, chain)).map_or(&[][..], Vec::as_slice);
        if is_owned_chain(owned, table, chain) && have.len() != planned.len() {
            let (table, chain) = names();
            return Some(Difference::RuleCount {
                table,
                chain,
                found: have.len(),
                planned: planned.len(),
            });
        }
        // Planned rule -> (times planned, times found).
        let mut counts: HashMap<&Rule, (usize, usize)> = HashMap::with_capacity(planned.len());
        for rule in planned {
            counts.entry(rule).or_default().0 += 1;
        }
        for rule in have.iter().filter_map(|h| h.rule.as_ref().ok()) {
            if let Some((_, seen)) = counts.get_mut(rule) {
                *seen += 1;
            }
        }
        if counts.values().any(|(want, seen)| seen > want) {
            let (table, chain) = names();
            return Some(Difference::Stacked { table, chain });
        }
        if let Some(missing) = planned.iter().find(|r| counts[r].1 == 0) {
            let (table, chain) = names();
            let rule = crate::rules::iptables::rule_args(missing).join(" ");
            return Some(Difference::MissingRule { table, chain, rule });
        }
    }
    let planned_chains: HashSet<(&str, &str)> =
        listed.keys().map(|(t, c)| (t.name(), c.as_str())).collect();
    state
        .chains
        .iter()
        .find(|(t, c)| {
            is_owned_chain(owned, t, c) && !planned_chains.contains(&(t.as_str(), c.as_str()))
        })
        .map(|(table, chain)| Difference::ExtraChain {
            table: table.clone(),
            chain: chain.clone(),
        })
}

/// The rules of `state` grouped by `(table, chain)`, each chain's in the kernel's order: one
/// pass, so a comparison never scans every rule once per chain or per planned rule.
fn by_chain(state: &OwnedState) -> HashMap<(&str, &str), Vec<&DecodedRule>> {
    let mut out: HashMap<(&str, &str), Vec<&DecodedRule>> = HashMap::new();
    for rule in &state.rules {
        out.entry((rule.table.as_str(), rule.chain.as_str()))
            .or_default()
            .push(rule);
    }
    out
}

/// Whether `state` holds anything of the sidecar plan: a chain of ours, or a planned built-in
/// chain rule (the typed [`super::state::holds_any_of`]). One pass over the rules found.
pub fn holds_any_sidecar(state: &OwnedState, rules: &[Rule]) -> bool {
    let owned = owned_chains();
    if state
        .chains
        .iter()
        .any(|(t, c)| is_owned_chain(owned, t, c))
    {
        return true;
    }
    let listed = as_listed(rules);
    let planned: HashSet<(&str, &str, &Rule)> = listed
        .iter()
        .filter(|((_, c), _)| is_builtin_chain(c))
        .flat_map(|((t, c), planned)| planned.iter().map(|r| (t.name(), c.as_str(), r)))
        .collect();
    state.rules.iter().any(|h| {
        h.rule
            .as_ref()
            .is_ok_and(|r| planned.contains(&(h.table.as_str(), h.chain.as_str(), r)))
    })
}

#[cfg(test)]
#[path = "nft_read_tests.rs"]
mod tests;
