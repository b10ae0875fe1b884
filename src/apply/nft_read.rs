//! The iptables-nft state of the calling thread's netns read as typed rules: the chains and rules
//! of the tables we own, dumped over nfnetlink (no `*-save` process) and decoded by
//! [`crate::rules::iptables_nft_decode`], the inverse of the encoder, into the same
//! [`IptablesState`] a `*-save` read gives; [`super::diff`] compares it with a plan. A rule the
//! decoder cannot read is foreign and counts as a difference, never as equal. A difference is
//! healed from this read, as one nf_tables transaction ([`super::nft_heal`]), rule handles and
//! chain policies included.

use std::collections::BTreeSet;

use super::iptables::nf_family;
use crate::netlink::nft_batch::BatchError;
use crate::netlink::nft_dump;
use crate::rules::Family;
use crate::rules::iptables_nft_decode::{SetNames, decode_rule};
use crate::rules::iptables_state::IptablesState;
use crate::rules::nf_kernel::NF_ACCEPT;

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
) -> Result<IptablesState, BatchError> {
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
) -> Result<IptablesState, BatchError> {
    let nf = nf_family(family);
    let mut chains = BTreeSet::new();
    let mut not_accepting = BTreeSet::new();
    for (table, chain, policy) in listed {
        if !tables.contains(&table.as_str()) {
            continue;
        }
        if policy.is_some_and(|p| i64::from(p) != i64::from(NF_ACCEPT)) {
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
    Ok(IptablesState {
        chains,
        rules,
        not_accepting,
    })
}
