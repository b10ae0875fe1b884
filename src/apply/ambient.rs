//! Ambient rules in one netns, all or nothing and idempotent: the in-pod redirect to ztunnel (and
//! its policy routing) and the host's probe SNAT rules.
//!
//! Every family is read through its [`Iptables`] backend and compared by the one
//! [`super::diff::ambient_difference`], whichever read answered.
//!
//! iptables-nft: each family's owned tables are read over netlink as typed rules
//! ([`super::nft_read`]) and compared with the plan; identical → nothing is written (counters
//! kept), no process. A new netns gets the encoded rules as one nf_tables transaction; a netns
//! that differs (drift) or whose rules are removed is healed by one nf_tables transaction for both
//! families, planned from that read ([`super::nft_heal::heal_messages`]: the stale jumps deleted
//! by handle, our chains flushed and refilled or deleted, a table left empty dropped), so still no
//! process. The kernel takes all of it or nothing.
//!
//! The `*-save` text path (iptables-legacy, and iptables-nft when the read failed or the netlink
//! encoding cannot say a rule, e.g. the host's SNAT to a set): each family's state is read with
//! `*-save`, decoded into the same typed rules and compared with the plan ([`plan_family`]);
//! identical → nothing is written;
//! otherwise one `*-restore --noflush` per family replaces exactly our chains and jumps
//! (declaring a chain flushes it; stale jumps are deleted, chains no longer planned removed). If a
//! later restore (or the heal transaction) fails, every touched table is put back from the
//! snapshot (the sidecar apply's rollback). Removing is the same plan with no rules.
//!
//! nftables: our tables are read back as typed rules and compared with what the plan's
//! transaction leaves ([`super::rule_backend::NativeNft`]); identical → nothing is written;
//! otherwise one nf_tables batch over netlink replaces our tables (and deletes those this pod no longer
//! needs), so the netns never holds half of them.

use std::collections::BTreeSet;

use super::cleanup::drop_emptied_tables;
use super::exec::{Executor, ProcessExecutor};
use super::iptables::{ApplyError, Binaries, ForceBinary, detect, run_checked, send_nft_messages};
use super::nft::apply_transaction;
use super::nft_heal::heal_messages;
use super::outcome::{RuleChange, Snapshot, holds_no_tables, restore_snapshots};
use super::owned::{HOST_CHAINS, INPOD_CHAINS, OwnedChains};
use super::rule_backend::{
    Diff, Iptables, NativeNft, Ownership, ReadBack, RuleBackend, TypedRead, kernel_read_tables,
    no_typed_read, read_saved,
};
use crate::netns::UsernsEntry;
use crate::rules::ambient::{AmbientConfig, PodOverrides};
use crate::rules::iptables_nft::NftMessage;
use crate::rules::iptables_state::IptablesState;
use crate::rules::nft_decode::{NativeState, expected};
use crate::rules::nft_encode::{NftStep, NftTransaction};
use crate::rules::nftables::NftTable;
use crate::rules::{Family, Rule, RuleSet, ambient};

/// Where and how to apply: the backend decided once ([`super::backend`]).
#[derive(Debug, Clone, Default)]
pub struct AmbientApply {
    pub nftables: bool,
    pub force_binary: Option<ForceBinary>,
    /// Environment for every iptables command (a pod-scoped `XTABLES_LOCKFILE`).
    pub env: Vec<(String, String)>,
    pub userns: Option<UsernsEntry>,
}

/// Applies (or, with an empty rule set, removes) ambient iptables rules in the calling thread's
/// netns. Families: IPv4, and IPv6 when it has rules or holds chains of ours.
pub fn apply_iptables_here(
    rules: &RuleSet,
    owned: OwnedChains,
    opts: &AmbientApply,
) -> Result<RuleChange, ApplyError> {
    let mut exec = ProcessExecutor::entering(opts.userns.clone());
    apply_iptables_reading(&mut exec, rules, owned, opts)
}

/// [`apply_iptables_here`] with any executor for the processes it may start (a test's that
/// refuses them all proves an iptables-nft heal starts none).
pub fn apply_iptables_reading(
    exec: &mut dyn Executor,
    rules: &RuleSet,
    owned: OwnedChains,
    opts: &AmbientApply,
) -> Result<RuleChange, ApplyError> {
    apply_iptables_with(exec, rules, owned, opts, &|b| {
        kernel_read_tables(b, owned.tables)
    })
}

/// [`apply_iptables_here`] with any executor (tests script it): every family read with `*-save`.
pub fn apply_iptables(
    exec: &mut dyn Executor,
    rules: &RuleSet,
    owned: OwnedChains,
    opts: &AmbientApply,
) -> Result<RuleChange, ApplyError> {
    apply_iptables_with(exec, rules, owned, opts, &no_typed_read)
}

/// What one family needs written to hold its plan: the `*-save` text it was read from (the
/// snapshot), that text's decoding, and the restore input.
type RestoreWork = (String, IptablesState, String);

/// `read`: a family's tables as typed rules without a process where the kernel can say
/// ([`kernel_read_tables`]), read through the family's [`Iptables`] backend: an empty netns or an
/// iptables-nft one holding exactly the plan needs no process at all (a drift check's common
/// case); one read over netlink that differs is healed by one nf_tables transaction planned from
/// that read ([`heal_messages`]: both families in one batch, each message carrying its own nfgen
/// family), still no process. `*-save`/`*-restore` remain for legacy, a read that failed, and
/// rules the netlink encoding cannot say.
fn apply_iptables_with(
    exec: &mut dyn Executor,
    rules: &RuleSet,
    owned: OwnedChains,
    opts: &AmbientApply,
    read: TypedRead<'_>,
) -> Result<RuleChange, ApplyError> {
    let mut work: Vec<(Binaries, RestoreWork)> = Vec::new();
    let mut heal = Vec::new();
    for family in Family::ALL {
        let family_rules = rules.family(family);
        let bins = match detect(family, opts.force_binary) {
            Ok(b) => b,
            // No ip6tables and nothing to program in IPv6: nothing to check either.
            Err(_) if family == Family::V6 && family_rules.is_empty() => continue,
            Err(e) => return Err(e),
        };
        let backend = Iptables {
            bins: &bins,
            typed: Some(read),
            owned: Ownership::Ambient(owned),
        };
        let planned = plan_family_change(exec, &backend, family_rules, owned, opts, &mut heal)?;
        if let Some(restore) = planned {
            work.push((bins, restore));
        }
    }
    if work.is_empty() && heal.is_empty() {
        return Ok(RuleChange::AlreadyApplied);
    }
    // The restores first, the transaction last: if it is refused, the restores are undone too.
    let undo = |exec: &mut dyn Executor, upto: usize, cause: ApplyError| {
        let snapshots: Vec<Snapshot> = work[..upto]
            .iter()
            .map(|(bins, (text, state, _))| Snapshot {
                bins,
                text: text.clone(),
                state: state.clone(),
                chains: None,
            })
            .collect();
        let refs: Vec<&Snapshot> = snapshots.iter().collect();
        match restore_snapshots(exec, &refs, &opts.env) {
            Ok(()) => cause,
            Err(rollback) => ApplyError::RollbackFailed {
                cause: Box::new(cause),
                rollback: Box::new(rollback),
            },
        }
    };
    for (i, (bins, (_, _, restore))) in work.iter().enumerate() {
        let backend = Iptables {
            bins,
            typed: None,
            owned: Ownership::Ambient(owned),
        };
        if let Err(cause) = backend.apply_atomic(exec, restore.clone(), &opts.env) {
            return Err(undo(exec, i + 1, cause));
        }
    }
    if !heal.is_empty() {
        if let Err(source) = send_nft_messages(heal, opts.userns.as_ref()) {
            let what = "replace the ambient rules that differ from the plan".to_string();
            return Err(undo(exec, work.len(), ApplyError::Netlink { what, source }));
        }
        if work.is_empty() {
            return Ok(RuleChange::AppliedOverNetlink);
        }
    }
    // With iptables-nft, a table we emptied (e.g. raw once DNS capture is off) would stay behind
    // with idle built-in chains: dropped, so the netns ends as a fresh apply leaves it.
    for (bins, (_, _, restore)) in work.iter().filter(|w| w.1.2.contains("\n-X ")) {
        let touched: BTreeSet<String> = restore
            .lines()
            .filter_map(|l| l.strip_prefix('*'))
            .map(String::from)
            .collect();
        let (_, now) = read_saved(exec, bins, &opts.env)?;
        drop_emptied_tables(bins, &now, &touched);
    }
    Ok(RuleChange::Applied)
}

/// One family, read through its backend and compared with its plan there (the ambient
/// question, whichever read answered): None when it holds the plan or when a heal over netlink
/// was added to `heal`; else what a restore must write.
fn plan_family_change(
    exec: &mut dyn Executor,
    backend: &Iptables,
    rules: &[Rule],
    owned: OwnedChains,
    opts: &AmbientApply,
    heal: &mut Vec<NftMessage>,
) -> Result<Option<RestoreWork>, ApplyError> {
    let family = backend.bins.family;
    let read = backend.read_owned(exec, &opts.env)?;
    let how = match backend.diff(rules, &read) {
        Diff::Same => return Ok(None),
        Diff::Differs(how) => how.to_string(),
        // Not asked by the ambient question; a difference all the same.
        Diff::Unsure(rules) => format!("{} planned rules not found as read", rules.len()),
    };
    let (text, state) = match read {
        // No table at all (a new pod's netns): `*-save` would print nothing.
        ReadBack::Typed(state) if state.chains.is_empty() => (String::new(), state),
        ReadBack::Typed(state) => match heal_messages(family, &state, rules, owned) {
            Ok(messages) => {
                tracing::debug!(family = ?family, %how, "rules differ from the plan; healing them in one nf_tables transaction");
                heal.extend(messages);
                return Ok(None);
            }
            Err(e) => {
                tracing::debug!(family = ?family, %how, reason = %e, "rules differ from the plan; no netlink encoding for the heal, healing with *-save and *-restore");
                read_saved(exec, backend.bins, &opts.env)?
            }
        },
        ReadBack::Saved { text, state } => {
            tracing::debug!(family = ?family, %how, "rules differ from the plan");
            (text, state)
        }
    };
    let restore = restore_text(&state, rules, owned);
    Ok(Some((text, state, restore)))
}

/// The in-pod nftables transaction: our tables deleted (whatever they hold, a chain someone
/// added included) and the ones this pod uses created again, in one transaction; so a re-apply
/// after drift converges to exactly the planned tables.
pub fn inpod_nft_transaction(cfg: &AmbientConfig, pod: &PodOverrides) -> NftTransaction {
    NftTransaction::new(vec![
        NftStep::Remove(NftTable::AMBIENT_POD.to_vec()),
        NftStep::Replace {
            set: ambient::inpod_nft_rules(cfg, pod),
            tables: NftTable::AMBIENT_POD.to_vec(),
        },
    ])
}

/// Programs the in-pod rules for `pod` in the calling thread's netns (rules, then the policy
/// routing).
pub fn program_inpod_here(
    cfg: &AmbientConfig,
    pod: &PodOverrides,
    opts: &AmbientApply,
) -> Result<RuleChange, AmbientError> {
    // Only the virtual interfaces come from the pod unchecked (its annotation); refuse a bad
    // one before any rule is written.
    pod.validate()
        .map_err(|source| AmbientError::Invalid { source })?;
    let outcome = if opts.nftables {
        let mut exec = ProcessExecutor::entering(opts.userns.clone());
        if nft_already_holds(&mut exec, cfg, pod)? {
            RuleChange::AlreadyApplied
        } else {
            INPOD_NFT.apply_atomic(&mut exec, inpod_nft_transaction(cfg, pod), &[])?;
            RuleChange::Applied
        }
    } else {
        let rules = ambient::inpod_rules(cfg, pod);
        if apply_new_netns_over_netlink(&rules, opts) {
            RuleChange::AppliedOverNetlink
        } else {
            apply_iptables_here(&rules, INPOD_CHAINS, opts)?
        }
    };
    super::routes::ensure_ambient_routes(cfg.enable_ipv6)?;
    Ok(outcome)
}

/// The prefix of every nft table the agent owns.
pub const OUR_NFT_TABLES: &str = "istio-ambient-";

/// The in-pod native nftables backend: our `istio-ambient-*` tables.
const INPOD_NFT: NativeNft = NativeNft {
    prefix: OUR_NFT_TABLES,
};

/// What our in-pod tables hold once [`inpod_nft_transaction`] is applied, as typed rules.
pub fn inpod_nft_expected(cfg: &AmbientConfig, pod: &PodOverrides) -> NativeState {
    expected(
        &ambient::inpod_nft_rules(cfg, pod),
        &NftTable::AMBIENT_POD,
        &[],
    )
}

/// Whether the calling thread's netns holds exactly the planned in-pod tables, read back as
/// typed rules ([`NativeNft`]). A netns without any table of ours is answered over netlink,
/// without a process; a read that fails is "no" (the transaction is applied, atomically).
fn nft_already_holds(
    exec: &mut dyn Executor,
    cfg: &AmbientConfig,
    pod: &PodOverrides,
) -> Result<bool, ApplyError> {
    let ours_exist = crate::netlink::nft_dump::list_chains(0)
        .map(|chains| chains.iter().any(|(t, _)| t.starts_with(OUR_NFT_TABLES)))
        .unwrap_or(true);
    if !ours_exist {
        return Ok(false);
    }
    let owned = match INPOD_NFT.read_owned(exec, &[]) {
        Ok(owned) => owned,
        Err(e) => {
            tracing::debug!(error = %e, "reading the in-pod nft tables failed; applying them");
            return Ok(false);
        }
    };
    let planned = inpod_nft_expected(cfg, pod);
    match INPOD_NFT.diff(&planned, &owned) {
        Diff::Same => Ok(true),
        Diff::Differs(what) => {
            tracing::debug!(%what, "the in-pod nft tables differ from the plan");
            Ok(false)
        }
        Diff::Unsure(_) => Ok(false),
    }
}

/// A new pod's netns (no table in any family) with the iptables-nft flavour gets the rules as one
/// nf_tables transaction encoded as iptables-nft-restore would send it: no process at all. False
/// when that does not apply or did not work (nothing changed then; the caller restores).
fn apply_new_netns_over_netlink(rules: &RuleSet, opts: &AmbientApply) -> bool {
    let mut families = 0;
    for family in Family::ALL {
        match detect(family, opts.force_binary) {
            Ok(bins) if bins.is_nft_flavour() && holds_no_tables(&bins) => families += 1,
            Err(_) if family == Family::V6 && rules.family(family).is_empty() => {}
            _ => return false,
        }
    }
    if families == 0 {
        return false;
    }
    match super::iptables::apply_nft_netlink_entering(rules, opts.userns.as_ref()) {
        Ok(()) => true,
        Err(e) if e.is_not_encodable() => {
            tracing::debug!(reason = %e, "applying the in-pod rules with iptables-restore instead");
            false
        }
        Err(e) => {
            tracing::info!(reason = %e, "nf_tables netlink transaction failed; applying the in-pod rules with iptables-restore instead");
            false
        }
    }
}

/// Removes the in-pod rules (both backends' objects, whichever is there) and the policy routing
/// from the calling thread's netns.
pub fn remove_inpod_here(opts: &AmbientApply) -> Result<(), AmbientError> {
    if opts.nftables {
        apply_transaction(
            &mut ProcessExecutor::entering(opts.userns.clone()),
            &NftTransaction::new(vec![NftStep::Remove(NftTable::AMBIENT_POD.to_vec())]),
        )?;
    } else {
        apply_iptables_here(&RuleSet::default(), INPOD_CHAINS, opts)?;
    }
    super::routes::remove_ambient_routes()?;
    Ok(())
}

/// The host's nftables transaction: our table's rules replaced, the probe sets declared (their
/// elements survive: a table flush keeps set elements).
pub fn host_nft_transaction(cfg: &AmbientConfig, kubelet_uid: &str) -> NftTransaction {
    // The sets first: the SNAT rule names them.
    NftTransaction::new(vec![
        NftStep::DeclareSets(super::probe_set::nft_named_sets(cfg.enable_ipv6)),
        NftStep::Replace {
            set: ambient::host_nft_rules(cfg, kubelet_uid),
            tables: vec![NftTable::AmbientHostNat],
        },
    ])
}

/// Programs the host side in the calling thread's netns: the probe sets (created, never flushed)
/// and the probe SNAT rules. `kubelet_uid` is needed with nftables. Reads first and writes only
/// what differs: `None` when everything was in place, else what was missing or different (the
/// drift pass's heal report). With nftables our table is read back as typed rules and compared
/// with what [`host_nft_transaction`] leaves (the probe sets declared, not their elements); a
/// table that cannot be read is written and reported as such.
pub fn program_host_here(
    cfg: &AmbientConfig,
    kubelet_uid: &str,
    opts: &AmbientApply,
) -> Result<Option<String>, AmbientError> {
    use super::probe_set::{Ipsets, NFT_TABLE, ProbeSets};
    let mut exec = ProcessExecutor::entering(opts.userns.clone());
    if opts.nftables {
        let host = NativeNft { prefix: NFT_TABLE };
        let planned = expected(
            &ambient::host_nft_rules(cfg, kubelet_uid),
            &[NftTable::AmbientHostNat],
            &super::probe_set::nft_sets(cfg.enable_ipv6),
        );
        let difference = match host.read_owned(&mut exec, &[]) {
            Ok(owned) => match host.diff(&planned, &owned) {
                Diff::Same => None,
                Diff::Differs(what) => Some(what),
                Diff::Unsure(_) => Some(format!("table inet {NFT_TABLE} not compared")),
            },
            Err(e) => Some(format!("table inet {NFT_TABLE} could not be read: {e}")),
        };
        if difference.is_some() {
            host.apply_atomic(&mut exec, host_nft_transaction(cfg, kubelet_uid), &[])?;
        }
        return Ok(difference);
    }
    // The SNAT rule names the sets, so they exist first.
    let missing = Ipsets.missing(cfg.enable_ipv6)?;
    if !missing.is_empty() {
        Ipsets.ensure(&mut exec, cfg.enable_ipv6)?;
    }
    let rules = apply_iptables_reading(&mut exec, &ambient::host_rules(cfg), HOST_CHAINS, opts)?;
    let mut what: Vec<String> = missing
        .iter()
        .map(|s| format!("ipset {s} missing"))
        .collect();
    if rules != RuleChange::AlreadyApplied {
        what.push("nat chain ISTIO_POSTRT or its POSTROUTING jump differed".to_string());
    }
    Ok((!what.is_empty()).then(|| what.join("; ")))
}

/// Removes the host probe SNAT rules and the probe sets of one backend (`opts.nftables`) from the
/// calling thread's netns: a `NATIVE_NFTABLES` migration, before the other backend's are
/// programmed, or an uninstall. Absent objects are fine.
pub fn remove_host_here(opts: &AmbientApply, ipv6: bool) -> Result<(), AmbientError> {
    use super::probe_set::Ipsets;
    use crate::rules::ambient::{PROBE_SET_V4, PROBE_SET_V6};
    let mut exec = ProcessExecutor::entering(opts.userns.clone());
    if opts.nftables {
        let remove = NftStep::Remove(vec![NftTable::AmbientHostNat]);
        apply_transaction(&mut exec, &NftTransaction::new(vec![remove]))?;
        return Ok(());
    }
    apply_iptables_reading(&mut exec, &RuleSet::default(), HOST_CHAINS, opts)?;
    // The SNAT rule named the sets; with it gone they can go.
    let sets: &[&str] = if ipv6 {
        &[PROBE_SET_V4, PROBE_SET_V6]
    } else {
        &[PROBE_SET_V4]
    };
    let missing = Ipsets.missing(ipv6)?;
    for set in sets.iter().filter(|s| !missing.contains(s)) {
        run_checked(&mut exec, &super::exec::Cmd::new("ipset", ["destroy", set]))?;
    }
    Ok(())
}

/// Why ambient rules could not be applied or removed.
#[derive(Debug, thiserror::Error)]
pub enum AmbientError {
    /// A pod override that must not reach the kernel; nothing was programmed.
    #[error("pod annotation {annotation}: {source}", annotation = crate::rules::ambient::ANN_REROUTE_VIRTUAL_INTERFACES)]
    Invalid {
        #[source]
        source: crate::rules::capture_values::InvalidValue,
    },
    #[error(transparent)]
    Apply(#[from] ApplyError),
    #[error("policy routing: {0}")]
    Routes(#[from] super::routes::RoutesError),
    #[error("host probe set: {0}")]
    ProbeSet(#[from] super::probe_set::ProbeSetError),
}

// The text model's plan, in its own file.
#[path = "ambient_save.rs"]
mod save;
pub use save::plan_family;
use save::restore_text;

#[cfg(test)]
#[path = "ambient_tests.rs"]
mod tests;
