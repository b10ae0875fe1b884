//! What an apply reports ([`RuleChange`]) and what it learns before writing so that it can undo
//! itself: which families hold none of our chains ([`Fresh`], learnt without a process) and the
//! `*-save` text of a family about to be written (`Snapshot`), put back by
//! `restore_snapshots`. The sidecar and the ambient iptables applies both use these; this module
//! calls only the backend's read and the iptables commands below it.

use std::collections::{BTreeMap, BTreeSet};

use super::exec::Executor;
use super::iptables::{
    ApplyError, Binaries, drop_created_tables, legacy_has_tables, nf_family, replace_tables_cmd,
    run_checked,
};
use super::rule_backend::read_saved;
use crate::rules::Family;
use crate::rules::capture::{is_owned_chain, owned_chains};
use crate::rules::iptables_save_decode::table_section;
use crate::rules::iptables_state::IptablesState;
use crate::rules::model::is_builtin_chain;

/// What an apply did, for logs and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleChange {
    Applied,
    /// Applied as one nf_tables transaction sent by us (no iptables process).
    AppliedOverNetlink,
    AlreadyApplied,
    Reconciled,
    CleanedUp,
}

/// Logs name outcomes in words (`applied`), not Rust syntax (`Some(Applied)`).
impl std::fmt::Display for RuleChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RuleChange::Applied => "applied",
            RuleChange::AppliedOverNetlink => "applied over nfnetlink",
            RuleChange::AlreadyApplied => "already applied",
            RuleChange::Reconciled => "reconciled",
            RuleChange::CleanedUp => "cleaned up",
        })
    }
}

/// Families known to hold none of our chains, each with the tables that existed before the apply.
pub type Fresh = BTreeMap<Family, BTreeSet<String>>;

/// What one family held before anything was written.
pub(super) struct Snapshot<'a> {
    pub(super) bins: &'a Binaries,
    pub(super) text: String,
    pub(super) state: IptablesState,
    /// With iptables-nft, the chains the kernel held (`*-save` also lists absent built-in chains).
    pub(super) chains: Option<Vec<(String, String)>>,
}

/// Puts every table that changed since its snapshot back as it was (`*-restore` without
/// `--noflush` replaces just the tables in its input); a table that did not exist is emptied and,
/// with iptables-nft, deleted again.
pub(super) fn restore_snapshots(
    exec: &mut dyn Executor,
    snapshots: &[&Snapshot],
    env: &[(String, String)],
) -> Result<(), ApplyError> {
    for snap in snapshots {
        let (_, now) = read_saved(exec, snap.bins, env)?;
        let mut text = String::new();
        let mut created = Vec::new();
        let tables: BTreeSet<&str> = now.tables().union(&snap.state.tables()).copied().collect();
        for table in tables {
            if snap.state.same_table(&now, table) {
                continue;
            }
            match table_section(&snap.text, table) {
                Some(section) => text.push_str(&section),
                None => {
                    text.push_str(&format!("*{table}\nCOMMIT\n"));
                    created.push(table.to_string());
                }
            }
        }
        if !text.is_empty() {
            run_checked(exec, &replace_tables_cmd(snap.bins, text, env))?;
        }
        drop_created_tables(snap.bins, created);
        if let Some(before) = &snap.chains {
            drop_created_builtin_chains(snap.bins, before);
        }
    }
    Ok(())
}

/// Deletes the built-in chains iptables-nft created since `before` (the guardrails', or the ones a
/// replaced table declares); best effort: a chain that holds rules stays.
fn drop_created_builtin_chains(bins: &Binaries, before: &[(String, String)]) {
    let family = nf_family(bins.family);
    let Ok(now) = crate::netlink::nft_dump::list_chains(family) else {
        return;
    };
    for (table, chain) in now {
        if is_builtin_chain(&chain) && !before.contains(&(table.clone(), chain.clone())) {
            let _ = crate::netlink::nft_batch::delete_chain(family, &table, &chain);
        }
    }
}

/// Whether a family holds none of our chains, learnt without starting a process; Some(tables that
/// exist) when so. Legacy: no table loaded at all. iptables-nft: an nf_tables chain dump.
pub(super) fn probe_fresh(bins: &Binaries) -> Option<BTreeSet<String>> {
    if bins.legacy {
        return (!legacy_has_tables(bins.family)).then(BTreeSet::new);
    }
    if !bins.is_nft_flavour() {
        return None;
    }
    let chains = crate::netlink::nft_dump::list_chains(nf_family(bins.family)).ok()?;
    let owned = owned_chains();
    if chains.iter().any(|(t, c)| is_owned_chain(owned, t, c)) {
        return None;
    }
    Some(chains.into_iter().map(|(table, _)| table).collect())
}

/// Whether a family holds no table at all in the calling thread's netns (a new pod's), learnt
/// without a process; then `*-save` would print nothing and need not run.
pub fn holds_no_tables(bins: &Binaries) -> bool {
    probe_fresh(bins).is_some_and(|tables| tables.is_empty())
}
