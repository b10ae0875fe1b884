//! Removing a sidecar rule set: one plan, built from the rule model of the configuration and the
//! state `*-save` reports, that both `--cleanup-only` runs and `--cleanup-only --dry-run` prints —
//! so the dry run shows exactly the commands the real run performs.
//!
//! The plan, per family (IPv4, then IPv6 when IPv6 is enabled or ip6tables holds any of our
//! chains or planned rules):
//! 1. Istio's list: the planned rules in reverse as `-D` — every rule in a built-in chain, whatever
//!    its target, and the rules of our chains that jump to our chains;
//! 2. from the state: every other rule (in any chain) that still jumps into one of our chains,
//!    further copies of planned built-in-chain rules, and the built-in-chain rules of the same
//!    configuration in the other interception mode;
//! 3. `-F`/`-X` of each planned chain (reverse first-seen order, as Istio), then of every other chain
//!    of ours the state holds. "Ours" is [`owned_chains`]: the chains the rule model creates, in
//!    the tables it creates them in — never a user's chain that merely starts with `ISTIO`.
//!
//! Commands run one by one and a failing one is not fatal (as in Istio: a rule of the plan that is
//! not there cannot be deleted); the final `*-save` then tells whether any chain of ours is left.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use super::diff::{has_owned_chains, holds_any_of};
use super::exec::{Cmd, Executor};
use super::iptables::{
    ApplyError, Binaries, drop_created_tables, family_prefix, nf_family, run_checked, with_env,
};
use crate::rules::capture::{is_owned_chain, owned_chains};
use crate::rules::iptables::rule_args;
use crate::rules::iptables_nft_decode::canonical;
use crate::rules::iptables_save_decode::{decode_save, rule_words};
use crate::rules::iptables_state::{IptablesState, RuleAt};
use crate::rules::model::is_builtin_chain;
use crate::rules::{Family, Rule, Table};

/// One step of a cleanup plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CleanupStep {
    /// `<family>-save`: the state the plan is made from (first) or the final state (last).
    Save(Family),
    /// `<family> -t TABLE ARGS…`: one `-D`, `-F` or `-X`.
    Command {
        family: Family,
        table: String,
        args: Vec<String>,
    },
}

impl CleanupStep {
    fn command(family: Family, table: &str, args: Vec<String>) -> CleanupStep {
        CleanupStep::Command {
            family,
            table: table.to_string(),
            args,
        }
    }

    /// The step as Istio's dry-run transcript prints it.
    pub fn display(&self) -> String {
        match self {
            CleanupStep::Save(family) => format!("{}-save", family_prefix(*family)),
            CleanupStep::Command {
                family,
                table,
                args,
            } => format!("{} -t {table} {}", family_prefix(*family), args.join(" ")),
        }
    }

    /// The step as a process of the resolved binaries.
    fn to_cmd(&self, bins: &Binaries, env: &[(String, String)]) -> Cmd {
        match self {
            CleanupStep::Save(_) => with_env(Cmd::new(&bins.save, Vec::<String>::new()), env),
            CleanupStep::Command { table, args, .. } => {
                let mut full = vec!["-t".to_string(), table.clone()];
                full.extend(args.iter().cloned());
                full.extend(bins.lock_args());
                with_env(Cmd::new(&bins.iptables, full), env)
            }
        }
    }

    fn family(&self) -> Family {
        match self {
            CleanupStep::Save(family) | CleanupStep::Command { family, .. } => *family,
        }
    }
}

/// The commands that remove `planned` (one family) and, when the state is known, everything else of
/// ours it holds. Pure.
///
/// `also`: rules of related configurations (the other interception mode) whose built-in-chain
/// rules are removed too, but only where the state shows them.
pub fn family_steps(
    family: Family,
    planned: &[Rule],
    also: &[Rule],
    state: Option<&IptablesState>,
) -> Vec<CleanupStep> {
    let mut steps = Vec::new();
    // The rules the plan already deletes, per (table, chain), spelt as they read back, so the
    // state pass below does not delete them twice.
    let mut deleted: BTreeMap<(&str, &str), Vec<Rule>> = BTreeMap::new();
    for rule in planned.iter().rev() {
        let in_ours = !is_builtin_chain(&rule.chain);
        let jumps_to_ours = rule
            .target
            .jump_chain()
            .is_some_and(|t| !is_builtin_chain(t));
        if in_ours && !jumps_to_ours {
            continue;
        }
        deleted
            .entry((rule.table.name(), rule.chain.as_str()))
            .or_default()
            .push(canonical(rule));
        let mut cmd = vec!["-D".to_string(), rule.chain.clone()];
        cmd.extend(rule_args(rule));
        steps.push(CleanupStep::command(family, rule.table.name(), cmd));
    }
    if let Some(state) = state {
        steps.extend(leftover_deletes(family, state, &mut deleted, also));
    }
    let mut seen: BTreeSet<(Table, &str)> = BTreeSet::new();
    let flush_and_delete = |steps: &mut Vec<CleanupStep>, table: &str, chain: &str| {
        steps.push(CleanupStep::command(
            family,
            table,
            vec!["-F".into(), chain.into()],
        ));
        steps.push(CleanupStep::command(
            family,
            table,
            vec!["-X".into(), chain.into()],
        ));
    };
    for rule in planned.iter().rev() {
        if !is_builtin_chain(&rule.chain) && seen.insert((rule.table, rule.chain.as_str())) {
            flush_and_delete(&mut steps, rule.table.name(), &rule.chain);
        }
    }
    if let Some(state) = state {
        let owned = owned_chains();
        for (table, chain) in &state.chains {
            let planned_here = seen.iter().any(|(t, c)| t.name() == table && c == chain);
            if is_owned_chain(owned, table, chain) && !planned_here {
                flush_and_delete(&mut steps, table, chain);
            }
        }
    }
    steps
}

/// The state pass: every rule (in any chain) still jumping into one of our chains, and further
/// copies of planned built-in-chain rules (and of `also`'s), each `-D` by its saved arguments;
/// one already in `deleted` is taken off that list instead.
fn leftover_deletes<'a>(
    family: Family,
    state: &'a IptablesState,
    deleted: &mut BTreeMap<(&'a str, &'a str), Vec<Rule>>,
    also: &'a [Rule],
) -> Vec<CleanupStep> {
    let owned = owned_chains();
    // Planned rules of built-in chains, as they read back: extra copies in the state go too.
    let mut planned_builtin: HashSet<(&str, &str, Rule)> = deleted
        .iter()
        .filter(|((_, chain), _)| is_builtin_chain(chain))
        .flat_map(|((table, chain), rules)| rules.iter().map(|r| (*table, *chain, r.clone())))
        .collect();
    planned_builtin.extend(
        also.iter()
            .filter(|r| is_builtin_chain(&r.chain))
            .map(|r| (r.table.name(), r.chain.as_str(), canonical(r))),
    );
    let mut steps = Vec::new();
    for ((table, chain), rules) in state.by_chain() {
        for rule in rules {
            let jumps_to_ours = rule
                .jumps_to
                .as_deref()
                .is_some_and(|t| is_owned_chain(owned, table, t));
            let read = rule.rule.as_ref().ok();
            let planned_here =
                read.is_some_and(|r| planned_builtin.contains(&(table, chain, r.clone())));
            if !jumps_to_ours && !planned_here {
                continue;
            }
            if let Some(list) = deleted.get_mut(&(table, chain))
                && let Some(r) = read
                && let Some(i) = list.iter().position(|p| p == r)
            {
                list.swap_remove(i);
                continue;
            }
            let mut cmd = vec!["-D".to_string(), chain.to_string()];
            match &rule.at {
                RuleAt::SavedArgs(args) => cmd.extend(rule_words(args)),
                RuleAt::Handle(_) => match read {
                    Some(r) => cmd.extend(rule_args(r)),
                    None => continue,
                },
            }
            steps.push(CleanupStep::command(family, table, cmd));
        }
    }
    steps
}

/// A whole cleanup: the saves it was made from, each family's commands, the final saves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleanupPlan {
    pub steps: Vec<CleanupStep>,
}

/// The tables some command of `steps` works on.
pub(super) fn steps_tables(steps: &[CleanupStep]) -> BTreeSet<String> {
    steps
        .iter()
        .filter_map(|s| match s {
            CleanupStep::Command { table, .. } => Some(table.clone()),
            CleanupStep::Save(_) => None,
        })
        .collect()
}

impl CleanupPlan {
    /// The tables the plan has commands for in one family.
    fn tables_of(&self, family: Family) -> BTreeSet<String> {
        let of_family: Vec<CleanupStep> = self
            .steps
            .iter()
            .filter(|s| s.family() == family)
            .cloned()
            .collect();
        steps_tables(&of_family)
    }

    /// The plan as the dry run prints it (Istio's recording-stub format), one line per step.
    pub fn transcript(&self) -> Vec<String> {
        self.steps.iter().map(CleanupStep::display).collect()
    }
}

/// The rules to remove per family, and whether IPv6 is enabled for this configuration.
pub struct CleanupInput<'a> {
    pub v4: &'a [Rule],
    /// The IPv6 rules of the configuration as if IPv6 were enabled: used when it is, or when
    /// ip6tables holds chains of ours.
    pub v6: &'a [Rule],
    pub ipv6_enabled: bool,
    /// Per family, rules of the same flags in the other interception mode: removed from built-in
    /// chains where the state shows them (an apply made with the other mode).
    pub also: [&'a [Rule]; 2],
}

/// Reads the state of each family (`bins[i]` for [`Family::ALL`]`[i]`; None when not installed)
/// and makes the plan. A save that fails counts as an empty state (as Istio's dry-run stub).
pub fn make_plan(
    exec: &mut dyn Executor,
    bins: [Option<&Binaries>; 2],
    input: &CleanupInput,
    env: &[(String, String)],
) -> Result<CleanupPlan, ApplyError> {
    let mut states = Vec::new();
    for b in bins.iter().flatten() {
        tracing::debug!(command = %CleanupStep::Save(b.family).display(), "cleanup");
        let out = exec.run(&CleanupStep::Save(b.family).to_cmd(b, env))?;
        states.push((b.family, out.success.then(|| decode_save(&out.stdout))));
    }
    Ok(plan_from_states(&states, input))
}

/// The plan for the states read (None: unreadable, planned as empty). Pure. Without any state it
/// is Istio's dry-run list: both saves, the IPv4 (and, when enabled, IPv6) commands, final saves.
pub fn plan_from_states(
    states: &[(Family, Option<IptablesState>)],
    input: &CleanupInput,
) -> CleanupPlan {
    let mut steps: Vec<CleanupStep> = states.iter().map(|(f, _)| CleanupStep::Save(*f)).collect();
    let mut families = Vec::new();
    for (family, state) in states {
        let wanted = match family {
            Family::V4 => true,
            Family::V6 => {
                input.ipv6_enabled || state.as_ref().is_some_and(|s| holds_any_of(s, input.v6))
            }
        };
        if wanted {
            let (planned, also) = match family {
                Family::V4 => (input.v4, input.also[0]),
                Family::V6 => (input.v6, input.also[1]),
            };
            steps.extend(family_steps(*family, planned, also, state.as_ref()));
            families.push(*family);
        }
    }
    steps.extend(families.into_iter().map(CleanupStep::Save));
    CleanupPlan { steps }
}

/// Runs a plan made by [`make_plan`] (its first saves already ran). Commands that fail are logged
/// and skipped; an error only when a chain of ours is still there at the end.
pub fn run_plan(
    exec: &mut dyn Executor,
    bins: [Option<&Binaries>; 2],
    plan: &CleanupPlan,
    env: &[(String, String)],
) -> Result<(), ApplyError> {
    let bins_of = |family: Family| bins.iter().flatten().find(|b| b.family == family).copied();
    let first_saves = plan
        .steps
        .iter()
        .take_while(|s| matches!(s, CleanupStep::Save(_)))
        .count();
    let mut left = Vec::new();
    for step in &plan.steps[first_saves..] {
        let Some(b) = bins_of(step.family()) else {
            continue;
        };
        let cmd = step.to_cmd(b, env);
        tracing::debug!(command = %step.display(), "cleanup");
        match step {
            CleanupStep::Save(family) => {
                let state = decode_save(&run_checked(exec, &cmd)?.stdout);
                if has_owned_chains(&state) {
                    left.push(family_prefix(*family));
                }
                drop_emptied_tables(b, &state, &plan.tables_of(*family));
            }
            CleanupStep::Command { .. } => run_command(exec, &cmd)?,
        }
    }
    match left.is_empty() {
        true => Ok(()),
        false => Err(ApplyError::CleanupIncomplete {
            family: left.join(", "),
        }),
    }
}

/// With iptables-nft, what the apply's restore created implicitly goes too, so the namespace looks
/// as before: a touched table left with nothing but idle built-in chains (no rule, policy ACCEPT)
/// is deleted, and in a table that keeps other content, each idle built-in chain is. These are
/// netlink requests, not commands (they do not show in the dry run), and change no packet's fate.
/// Anything with a rule, a user chain, another policy or a native nft chain stays. Legacy tables
/// and chains cannot be unloaded and stay.
pub(super) fn drop_emptied_tables(
    bins: &Binaries,
    state: &IptablesState,
    touched: &BTreeSet<String>,
) {
    if !bins.is_nft_flavour() {
        return;
    }
    let Ok(chains) = crate::netlink::nft_dump::list_chains(nf_family(bins.family)) else {
        return;
    };
    let mut empty_tables = Vec::new();
    for table in touched {
        let declared: Vec<&str> = state
            .chains
            .iter()
            .filter(|(t, _)| t == table)
            .map(|(_, c)| c.as_str())
            .collect();
        if declared.is_empty() {
            continue;
        }
        let holds_rules = |chain: &str| state.chain(table, chain).next().is_some();
        // Idle: a built-in chain without rules whose policy accepts.
        let idle: Vec<&str> = declared
            .iter()
            .copied()
            .filter(|c| {
                is_builtin_chain(c)
                    && !holds_rules(c)
                    && !state
                        .not_accepting
                        .contains(&(table.clone(), c.to_string()))
            })
            .collect();
        let busy = idle.len() < declared.len();
        let in_kernel: Vec<&str> = chains
            .iter()
            .filter(|(t, _)| t == table)
            .map(|(_, c)| c.as_str())
            .collect();
        let native = in_kernel
            .iter()
            .any(|c| !is_builtin_chain(c) && !declared.contains(c));
        if !busy && !native {
            empty_tables.push(table.clone());
            continue;
        }
        for chain in idle.into_iter().filter(|c| in_kernel.contains(c)) {
            if let Err(e) =
                crate::netlink::nft_batch::delete_chain(nf_family(bins.family), table, chain)
            {
                tracing::debug!(%table, %chain, error = %e, "idle chain not deleted");
            }
        }
    }
    drop_created_tables(bins, empty_tables);
}

/// Runs `-D`/`-F`/`-X` steps of one family; a command that fails is logged, not fatal.
pub(super) fn run_commands(
    exec: &mut dyn Executor,
    bins: &Binaries,
    steps: &[CleanupStep],
    env: &[(String, String)],
) -> Result<(), ApplyError> {
    for step in steps
        .iter()
        .filter(|s| matches!(s, CleanupStep::Command { .. }))
    {
        tracing::debug!(command = %step.display(), "cleanup");
        run_command(exec, &step.to_cmd(bins, env))?;
    }
    Ok(())
}

fn run_command(exec: &mut dyn Executor, cmd: &Cmd) -> Result<(), ApplyError> {
    let out = exec.run(cmd)?;
    if !out.success {
        tracing::debug!(command = %cmd.display(), stderr = %out.stderr.trim(), "not applicable");
    }
    Ok(())
}

/// The restore text that undoes a restore of `rules` that committed `tables` in a family that held
/// none of our chains before: the planned rules of built-in chains deleted, our chains flushed and
/// deleted. Pure.
pub fn undo_restore_text(rules: &[Rule], tables: &BTreeSet<Table>) -> String {
    let mut out = String::new();
    for table in tables {
        let mut deletes = Vec::new();
        let mut chains: Vec<&str> = Vec::new();
        for rule in rules.iter().rev().filter(|r| r.table == *table) {
            if is_builtin_chain(&rule.chain) {
                deletes.push(format!("-D {} {}", rule.chain, rule_args(rule).join(" ")));
            } else if !chains.contains(&rule.chain.as_str()) {
                chains.push(&rule.chain);
            }
            if let Some(target) = rule.target.jump_chain()
                && !is_builtin_chain(target)
                && !chains.contains(&target)
            {
                chains.push(target);
            }
        }
        if deletes.is_empty() && chains.is_empty() {
            continue;
        }
        out.push_str(&format!("*{table}\n"));
        for line in deletes
            .iter()
            .cloned()
            .chain(chains.iter().map(|c| format!("-F {c}")))
            .chain(chains.iter().map(|c| format!("-X {c}")))
        {
            out.push_str(&line);
            out.push('\n');
        }
        out.push_str("COMMIT\n");
    }
    out
}

#[cfg(test)]
#[path = "cleanup_tests.rs"]
mod tests;
