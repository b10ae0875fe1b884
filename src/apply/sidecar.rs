//! Applying a sidecar rule set, all or nothing across tables and families.
//!
//! `iptables-restore` commits table by table, and each family is its own process, so a restore can
//! land half-way. Every path therefore knows what to undo before it writes:
//! * fresh (no chain of ours in a family, learnt without a process: an nf_tables chain dump or
//!   procfs for legacy): one `*-restore --noflush` per family, as before; if one fails, the tables
//!   that had committed (its error names the failing line) and the earlier families are undone
//!   from the rule model;
//! * otherwise the state is read with `*-save` first (the snapshot) and compared with the plan the
//!   way Istio does: identical → nothing to do; drifted without
//!   `--reconcile` → [`ApplyError::Drift`] before anything is written; with it → guardrails,
//!   cleanup, apply, and on any failure every touched table is put back from the snapshot.
//!
//! The nf_tables netlink path ([`apply_nft_netlink_entering`]) is one kernel transaction for both families.

use std::collections::BTreeSet;

use super::cleanup::{
    CleanupInput, CleanupPlan, drop_emptied_tables, family_steps, make_plan, run_commands,
    run_plan, steps_tables, undo_restore_text,
};
use super::exec::Executor;
use super::iptables::{
    ApplyError, Binaries, ForceBinary, apply_nft_netlink_entering, detect, drop_created_tables,
    family_prefix, nf_family, restore_cmd, run_checked, with_env,
};
use super::outcome::{Fresh, RuleChange, Snapshot, probe_fresh, restore_snapshots};
use super::rule_backend::{
    Diff, ReadBack, TypedRead, for_family, kernel_read, no_typed_read, read_saved,
};
use crate::apply::exec::Cmd;
use crate::netns::UsernsEntry;
use crate::rules::iptables::{render_restore, rule_args};
use crate::rules::{Family, Rule, RuleSet, Table};

/// How a sidecar apply should treat existing state.
#[derive(Debug, Clone, Default)]
pub struct SidecarOptions {
    pub reconcile: bool,
    pub force_apply: bool,
    /// Environment for every command (e.g. a pod-scoped `XTABLES_LOCKFILE`).
    pub env: Vec<(String, String)>,
    /// Never send the nf_tables messages directly; always run iptables-restore.
    pub restore_only: bool,
    /// Rules a reconcile also removes from built-in chains when present: those of the same
    /// configuration in the other interception mode (see [`crate::rules::capture::other_mode`]),
    /// so switching REDIRECT ↔ TPROXY converges to exactly the new plan.
    pub reconcile_also: RuleSet,
    /// Set for a netns owned by another user namespace (`hostUsers: false`): every command and
    /// the nf_tables transaction run in a child that entered it.
    pub userns: Option<UsernsEntry>,
}

/// Applies the sidecar rules for every family that has rules (`bins` lists the families in use),
/// reading every family through `exec`'s `*-save` (tests script it).
pub fn apply_sidecar(
    exec: &mut dyn Executor,
    bins: &[Binaries],
    rules: &RuleSet,
    opts: &SidecarOptions,
    fresh: &Fresh,
) -> Result<RuleChange, ApplyError> {
    apply_sidecar_with(exec, bins, rules, opts, fresh, &no_typed_read)
}

/// [`apply_sidecar`]; `read`: an iptables-nft family as typed rules ([`kernel_read`]), so a
/// netns already holding the plan is checked with no process, and `*-save` runs only as the
/// snapshot of a family about to be written.
fn apply_sidecar_with(
    exec: &mut dyn Executor,
    bins: &[Binaries],
    rules: &RuleSet,
    opts: &SidecarOptions,
    fresh: &Fresh,
    read: TypedRead<'_>,
) -> Result<RuleChange, ApplyError> {
    let planned: Vec<(&Binaries, &[Rule])> = bins
        .iter()
        .map(|b| (b, rules.family(b.family)))
        .filter(|(_, r)| !r.is_empty())
        .collect();
    if !opts.reconcile && planned.iter().all(|(b, _)| fresh.contains_key(&b.family)) {
        apply_fresh(exec, &planned, fresh, &opts.env)?;
        return Ok(RuleChange::Applied);
    }

    let (drifted, snapshots) = read_and_compare(exec, &planned, opts, read)?;
    if drifted.is_empty() {
        return Ok(RuleChange::AlreadyApplied);
    }
    if let Some((b, _, _)) = drifted.iter().find(|(_, _, ours)| *ours)
        && !opts.reconcile
    {
        // Refused before anything was written.
        return Err(ApplyError::Drift {
            family: family_prefix(b.family),
        });
    }
    let residue = drifted.iter().any(|(_, _, ours)| *ours);
    // Families a reconcile cleaned: the guardrails' filter chains are dropped afterwards if idle.
    let mut cleaned: Vec<&Binaries> = Vec::new();
    let mut swap = |exec: &mut dyn Executor| -> Result<(), ApplyError> {
        for (b, family_rules, ours) in &drifted {
            if *ours {
                let state = snapshots
                    .iter()
                    .find(|s| s.bins.family == b.family)
                    .map(|s| &s.state);
                let also = opts.reconcile_also.family(b.family);
                let steps = family_steps(b.family, family_rules, also, state);
                run_commands(exec, b, &steps, &opts.env)?;
                // What the old rules' restore created implicitly goes before the new restore, so
                // the namespace ends as a fresh apply leaves it (same tables, same chain order).
                let (_, now) = read_saved(exec, b, &opts.env)?;
                drop_emptied_tables(b, &now, &steps_tables(&steps));
                cleaned.push(*b);
            }
            for_family(b, read).apply_atomic(exec, render_restore(family_rules), &opts.env)?;
        }
        Ok(())
    };
    let touched: Vec<&Binaries> = drifted.iter().map(|(b, _, _)| *b).collect();
    let result = if residue {
        with_guardrails(exec, &touched, &opts.env, swap)
    } else {
        swap(exec)
    };
    if let Err(cause) = result {
        let touched: Vec<&Snapshot> = snapshots
            .iter()
            .filter(|s| touched.iter().any(|b| b.family == s.bins.family))
            .collect();
        return Err(match restore_snapshots(exec, &touched, &opts.env) {
            Ok(()) => cause,
            Err(rollback) => ApplyError::RollbackFailed {
                cause: Box::new(cause),
                rollback: Box::new(rollback),
            },
        });
    }
    for b in cleaned {
        let (_, now) = read_saved(exec, b, &opts.env)?;
        drop_emptied_tables(b, &now, &BTreeSet::from([Table::Filter.name().to_string()]));
    }
    Ok(if residue {
        RuleChange::Reconciled
    } else {
        RuleChange::Applied
    })
}

/// A family whose rules differ from its plan: its binaries, its planned rules, and whether it
/// already holds any of ours (a reconcile's cleanup first).
type Drifted<'b> = (&'b Binaries, &'b [Rule], bool);

/// Reads each planned family and compares it with its plan: the families that differ, and a
/// snapshot of each (as `*-save` text, what a rollback restores) taken before anything is written.
fn read_and_compare<'b>(
    exec: &mut dyn Executor,
    planned: &[(&'b Binaries, &'b [Rule])],
    opts: &SidecarOptions,
    read: TypedRead<'_>,
) -> Result<(Vec<Drifted<'b>>, Vec<Snapshot<'b>>), ApplyError> {
    let mut snapshots = Vec::new();
    let mut drifted = Vec::new();
    for &(b, family_rules) in planned {
        let backend = for_family(b, read);
        let owned = backend.read_owned(exec, &opts.env)?;
        let in_place = match backend.diff(family_rules, &owned) {
            Diff::Same => true,
            Diff::Differs(_) => false,
            // The kernel re-spelt some rules beyond the text comparison: ask iptables itself.
            Diff::Unsure(rules) => rules_present(exec, b, &rules, &opts.env)?,
        };
        if in_place {
            continue;
        }
        drifted.push((b, family_rules, owned.holds_any(family_rules)));
        // What is about to be written is snapshotted as text: the rollback restores it.
        let (text, state) = match owned {
            ReadBack::Saved { text, state } => (text, state),
            ReadBack::Typed(_) => read_saved(exec, b, &opts.env)?,
        };
        let chains = b
            .is_nft_flavour()
            .then(|| crate::netlink::nft_dump::list_chains(nf_family(b.family)).ok())
            .flatten();
        snapshots.push(Snapshot {
            bins: b,
            text,
            state,
            chains,
        });
    }
    Ok((drifted, snapshots))
}

/// One restore per family; when one fails, what already committed is undone.
fn apply_fresh(
    exec: &mut dyn Executor,
    planned: &[(&Binaries, &[Rule])],
    fresh: &Fresh,
    env: &[(String, String)],
) -> Result<(), ApplyError> {
    for (i, (b, rules)) in planned.iter().enumerate() {
        let text = render_restore(rules);
        let cmd = restore_cmd(b, text.clone(), env);
        let (cause, committed) = match exec.run(&cmd) {
            Ok(out) if out.success => continue,
            Ok(out) => (
                ApplyError::Failed {
                    command: cmd.display(),
                    code: out.code,
                    stderr: out.stderr.trim().to_string(),
                },
                committed_tables(&text, &out.stderr),
            ),
            Err(e) => (e.into(), BTreeSet::new()),
        };
        let mut undo = planned[..i]
            .iter()
            .map(|(b, rules)| (*b, *rules, rules.iter().map(|r| r.table).collect()))
            .collect::<Vec<(&Binaries, &[Rule], BTreeSet<Table>)>>();
        undo.push((b, rules, committed));
        let mut rollback = Ok(());
        for (b, rules, tables) in undo {
            let text = undo_restore_text(rules, &tables);
            if !text.is_empty()
                && let Err(e) = run_checked(exec, &restore_cmd(b, text, env))
            {
                rollback = Err(e);
                continue;
            }
            let before = fresh.get(&b.family).cloned().unwrap_or_default();
            let created = tables
                .iter()
                .map(|t| t.name().to_string())
                .filter(|t| !before.contains(t));
            drop_created_tables(b, created.collect());
        }
        return Err(match rollback {
            Ok(()) => cause,
            Err(rollback) => ApplyError::RollbackFailed {
                cause: Box::new(cause),
                rollback: Box::new(rollback),
            },
        });
    }
    Ok(())
}

/// The tables of a restore `text` that committed before it failed: iptables-restore stops at the
/// first failing line and names it (`line N failed`, `Error occurred at line: N`); every table whose
/// `COMMIT` comes before that line has landed. Unnamed → every table counts as committed.
fn committed_tables(text: &str, stderr: &str) -> BTreeSet<Table> {
    let failed_line = stderr.split("line").skip(1).find_map(|rest| {
        let digits: String = rest
            .trim_start_matches([':', ' '])
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse::<usize>().ok()
    });
    let mut committed = BTreeSet::new();
    let mut current = None;
    for (i, line) in text.lines().enumerate() {
        if let Some(name) = line.strip_prefix('*') {
            current = [Table::Filter, Table::Mangle, Table::Nat, Table::Raw]
                .into_iter()
                .find(|t| t.name() == name.trim());
        } else if line == "COMMIT"
            && let Some(table) = current
            && failed_line.is_none_or(|n| i + 1 < n)
        {
            committed.insert(table);
        }
    }
    committed
}

/// Drops new TCP/UDP traffic in every touched family while the rules are swapped, so nothing slips
/// through uncaptured.
fn with_guardrails(
    exec: &mut dyn Executor,
    bins: &[&Binaries],
    env: &[(String, String)],
    work: impl FnOnce(&mut dyn Executor) -> Result<(), ApplyError>,
) -> Result<(), ApplyError> {
    let guard_rules: Vec<[&str; 2]> = ["INPUT", "FORWARD", "OUTPUT"]
        .iter()
        .flat_map(|c| [[*c, "tcp"], [*c, "udp"]])
        .collect();
    let guard = |b: &Binaries, op: &str, chain: &str, proto: &str| {
        let mut args: Vec<String> = ["-t", "filter", op, chain]
            .iter()
            .map(|s| s.to_string())
            .collect();
        if op == "-I" {
            args.push("1".into());
        }
        args.extend(["-p", proto, "-j", "DROP"].iter().map(|s| s.to_string()));
        args.extend(b.lock_args());
        with_env(Cmd::new(&b.iptables, args), env)
    };
    let remove = |exec: &mut dyn Executor| {
        for b in bins {
            for [chain, proto] in &guard_rules {
                let _ = exec.run(&guard(b, "-D", chain, proto));
            }
        }
    };
    let mut installed = Ok(());
    'install: for b in bins {
        for [chain, proto] in &guard_rules {
            let _ = exec.run(&guard(b, "-D", chain, proto));
            if let Err(e) = run_checked(exec, &guard(b, "-I", chain, proto)) {
                installed = Err(e);
                break 'install;
            }
        }
    }
    let result = installed.and_then(|()| work(exec));
    remove(exec);
    result
}

/// Checks rules one by one with `iptables -C` (exact, but one process per rule).
fn rules_present(
    exec: &mut dyn Executor,
    b: &Binaries,
    rules: &[&Rule],
    env: &[(String, String)],
) -> Result<bool, ApplyError> {
    Ok(first_missing(exec, b, rules, env)?.is_none())
}

/// The first of `rules` that `iptables -C` does not find.
pub(super) fn first_missing<'a>(
    exec: &mut dyn Executor,
    b: &Binaries,
    rules: &[&'a Rule],
    env: &[(String, String)],
) -> Result<Option<&'a Rule>, ApplyError> {
    for rule in rules {
        let mut args = vec![
            "-t".to_string(),
            rule.table.name().to_string(),
            "-C".to_string(),
            rule.chain.clone(),
        ];
        args.extend(rule_args(rule));
        args.extend(b.lock_args());
        if !exec
            .run(&with_env(Cmd::new(&b.iptables, args), env))?
            .success
        {
            return Ok(Some(rule));
        }
    }
    Ok(None)
}

/// Detects the binaries for every family the rule set uses and applies it with real processes in
/// the calling thread's network namespace (run it inside [`crate::netns::Netns::run`] for a pod).
pub fn apply_sidecar_here(
    rules: &RuleSet,
    opts: &SidecarOptions,
    force: Option<ForceBinary>,
) -> Result<RuleChange, ApplyError> {
    let mut bins = Vec::new();
    for family in Family::ALL {
        if !rules.family(family).is_empty() {
            bins.push(detect(family, force)?);
        }
    }
    // Read before writing: which families hold no chain of ours (one chain dump each, no
    // process). A netns that holds some is compared with the plan below, never sent a
    // transaction that creates what is already there.
    let fresh: Fresh = if opts.reconcile {
        Fresh::new()
    } else {
        bins.iter()
            .filter_map(|b| probe_fresh(b).map(|tables| (b.family, tables)))
            .collect()
    };
    // The common case — plain apply with the nft flavour on a fresh netns — needs no process.
    let plain = !opts.reconcile && !opts.force_apply && !opts.restore_only;
    if plain
        && !bins.is_empty()
        && bins
            .iter()
            .all(|b| b.is_nft_flavour() && fresh.contains_key(&b.family))
    {
        match apply_nft_netlink_entering(rules, opts.userns.as_ref()) {
            Ok(()) => {
                tracing::debug!("applied over nfnetlink, encoded as iptables-nft does");
                return Ok(RuleChange::Applied);
            }
            // Outside the encoding is routine; a failed transaction is worth a look.
            Err(e) if e.is_not_encodable() => {
                tracing::debug!(reason = %e, "applying with iptables-restore instead")
            }
            Err(e) => tracing::info!(
                reason = %e,
                "nf_tables netlink transaction failed; applying with iptables-restore instead"
            ),
        }
    }
    apply_sidecar_with(
        &mut super::exec::ProcessExecutor::entering(opts.userns.clone()),
        &bins,
        rules,
        opts,
        &fresh,
        &kernel_read,
    )
}

/// The binaries a cleanup uses: IPv4 always, IPv6 when installed.
fn cleanup_bins(force: Option<ForceBinary>) -> Result<[Option<Binaries>; 2], ApplyError> {
    Ok([
        Some(detect(Family::V4, force)?),
        detect(Family::V6, force).ok(),
    ])
}

/// The cleanup plan for the calling thread's network namespace (what `--cleanup-only --dry-run`
/// prints): reads the state of both families (read only).
pub fn cleanup_plan_here(
    input: &CleanupInput,
    env: &[(String, String)],
    force: Option<ForceBinary>,
    userns: Option<&UsernsEntry>,
) -> Result<CleanupPlan, ApplyError> {
    let bins = cleanup_bins(force)?;
    make_plan(
        &mut super::exec::ProcessExecutor::entering(userns.cloned()),
        [bins[0].as_ref(), bins[1].as_ref()],
        input,
        env,
    )
}

/// Makes the cleanup plan in the calling thread's network namespace and runs it.
pub fn cleanup_sidecar_here(
    input: &CleanupInput,
    env: &[(String, String)],
    force: Option<ForceBinary>,
    userns: Option<&UsernsEntry>,
) -> Result<RuleChange, ApplyError> {
    let bins = cleanup_bins(force)?;
    let by_family = [bins[0].as_ref(), bins[1].as_ref()];
    let mut exec = super::exec::ProcessExecutor::entering(userns.cloned());
    let plan = make_plan(&mut exec, by_family, input, env)?;
    run_plan(&mut exec, by_family, &plan, env)?;
    Ok(RuleChange::CleanedUp)
}

#[cfg(test)]
#[path = "sidecar_tests.rs"]
mod tests;
