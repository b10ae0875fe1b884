//! Checking a netns's sidecar rules without writing, through the same
//! [`super::rule_backend::RuleBackend`] read and diff the apply uses: with iptables-nft the owned
//! tables read over netlink as typed rules (no process); with legacy one `*-save` per family in
//! use; either way naming the first difference. The drift verification calls it through [`super::pod::verify`].

use super::diff::Difference;
use super::exec::Executor;
use super::iptables::{ApplyError, Binaries, ForceBinary, detect, family_prefix};
use super::rule_backend::{Diff, TypedRead, for_family, kernel_read};
use super::sidecar::first_missing;
use crate::netns::UsernsEntry;
use crate::rules::iptables::rule_args;
use crate::rules::{Family, RuleSet};

/// What [`super::pod::verify`] and [`verify_sidecar_here`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetnsCheck {
    /// Exactly the rules [`super::pod::program`] would leave.
    InPlace,
    /// Rules of ours, but not those: `what` names the first difference.
    Drifted { what: String },
    /// Nothing of ours at all.
    Absent,
}

/// Whether the calling thread's netns holds exactly `rules`, read once per family in use; writes
/// nothing. `Absent`: no family holds anything of ours. `read`: the family's owned tables as
/// typed rules when the kernel can say so without a process (iptables-nft over netlink,
/// [`kernel_read`]); else one `*-save` (`iptables -C` only for a rule the kernel re-spelt beyond
/// its typed decoding). Read and compared through the one
/// [`super::rule_backend::RuleBackend`], as the apply does.
fn verify_sidecar_with(
    exec: &mut dyn Executor,
    bins: &[Binaries],
    rules: &RuleSet,
    env: &[(String, String)],
    read: TypedRead<'_>,
) -> Result<NetnsCheck, ApplyError> {
    let mut absent = true;
    let mut drift = None;
    for b in bins {
        let planned = rules.family(b.family);
        if planned.is_empty() {
            continue;
        }
        let prefix = family_prefix(b.family);
        let backend = for_family(b, read);
        let owned = backend.read_owned(exec, env)?;
        absent &= !owned.holds_any(planned);
        if drift.is_some() {
            continue;
        }
        drift = match backend.diff(planned, &owned) {
            Diff::Same => None,
            Diff::Differs(d) => Some(format!("{prefix}: {d}")),
            Diff::Unsure(unsure) => first_missing(exec, b, &unsure, env)?.map(|r| {
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
        None => NetnsCheck::InPlace,
        Some(_) if absent => NetnsCheck::Absent,
        Some(what) => NetnsCheck::Drifted { what },
    })
}

/// [`verify_sidecar_with`] with real processes in the calling thread's netns.
pub fn verify_sidecar_here(
    rules: &RuleSet,
    env: &[(String, String)],
    force: Option<ForceBinary>,
    userns: Option<&UsernsEntry>,
) -> Result<NetnsCheck, ApplyError> {
    let mut bins = Vec::new();
    for family in Family::ALL {
        if !rules.family(family).is_empty() {
            bins.push(detect(family, force)?);
        }
    }
    let mut exec = super::exec::ProcessExecutor::entering(userns.cloned());
    verify_sidecar_with(&mut exec, &bins, rules, env, &kernel_read)
}
