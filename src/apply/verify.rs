//! Checking a netns's sidecar rules without writing: with iptables-nft the owned tables read over
//! netlink as typed rules (`nft_read::sidecar_difference`, no process); else one `*-save` per
//! family in use, compared with the plan by the same comparison the apply uses
//! (`state::compare_with_plan`); either way naming the first difference. The drift verification calls it through [`super::pod::verify`].

use super::exec::Executor;
use super::iptables::{
    ApplyError, Binaries, ForceBinary, detect, family_prefix, run_checked, save_cmd,
};
use super::nft_read::{KernelSets, OwnedState, holds_any_sidecar, read_owned, sidecar_difference};
use super::pod::Verdict;
use super::sidecar::first_missing;
use super::state::{Comparison, Difference, compare_with_plan, holds_any_of, parse_save};
use crate::netns::UsernsEntry;
use crate::rules::iptables::rule_args;
use crate::rules::{Family, RuleSet};

/// Whether the calling thread's netns holds exactly `rules`, read once per family in use (one
/// `*-save`; `iptables -C` only for a rule the kernel re-spelt beyond [`super::state::normalise`]).
/// Writes nothing. `Absent`: no family holds anything of ours.
pub fn verify_sidecar(
    exec: &mut dyn Executor,
    bins: &[Binaries],
    rules: &RuleSet,
    env: &[(String, String)],
) -> Result<Verdict, ApplyError> {
    verify_sidecar_with(exec, bins, rules, env, &|_| None)
}

/// `read`: the family's owned tables as typed rules when the kernel can say so without a
/// process (iptables-nft over netlink, [`read_typed`]); else `*-save` as before.
fn verify_sidecar_with(
    exec: &mut dyn Executor,
    bins: &[Binaries],
    rules: &RuleSet,
    env: &[(String, String)],
    read: &dyn Fn(&Binaries) -> Option<OwnedState>,
) -> Result<Verdict, ApplyError> {
    let mut absent = true;
    let mut drift = None;
    for b in bins {
        let planned = rules.family(b.family);
        if planned.is_empty() {
            continue;
        }
        let prefix = family_prefix(b.family);
        if let Some(state) = read(b) {
            absent &= !holds_any_sidecar(&state, planned);
            if drift.is_none() {
                drift = sidecar_difference(&state, planned).map(|d| format!("{prefix}: {d}"));
            }
            continue;
        }
        let state = parse_save(&run_checked(exec, &save_cmd(b, env))?.stdout);
        absent &= !holds_any_of(&state, planned);
        if drift.is_some() {
            continue;
        }
        drift = match compare_with_plan(&state, planned) {
            Comparison::Same => None,
            Comparison::Different(d) => Some(format!("{prefix}: {d}")),
            Comparison::Unsure(unsure) => first_missing(exec, b, &unsure, env)?.map(|r| {
                let d = Difference::MissingRule {
                    table: r.table.name().to_string(),
                    chain: r.chain.clone(),
                    rule: rule_args(r).join(" "),
                };
                format!("{prefix}: {d}")
            }),
        };
    }
    Ok(match drift {
        None => Verdict::InPlace,
        Some(_) if absent => Verdict::Absent,
        Some(what) => Verdict::Drifted { what },
    })
}

/// [`verify_sidecar`] with real processes in the calling thread's netns.
pub fn verify_sidecar_here(
    rules: &RuleSet,
    env: &[(String, String)],
    force: Option<ForceBinary>,
    userns: Option<&UsernsEntry>,
) -> Result<Verdict, ApplyError> {
    let mut bins = Vec::new();
    for family in Family::ALL {
        if !rules.family(family).is_empty() {
            bins.push(detect(family, force)?);
        }
    }
    let mut exec = super::exec::ProcessExecutor::entering(userns.cloned());
    verify_sidecar_with(&mut exec, &bins, rules, env, &read_typed)
}

/// The nft flavour's tables as typed rules, read over netlink; None (read `*-save`) for legacy or
/// when the read fails.
fn read_typed(bins: &Binaries) -> Option<OwnedState> {
    const TABLES: &[&str] = &["filter", "mangle", "nat", "raw"];
    if !bins.is_nft_flavour() {
        return None;
    }
    read_owned(bins.family, TABLES, &KernelSets)
        .inspect_err(|e| tracing::debug!(error = %e, "reading the rules over netlink failed"))
        .ok()
}
