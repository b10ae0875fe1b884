//! Applying a sidecar rule set with iptables-restore.
//!
//! Fast path (the common case, a fresh pod netns): exactly one `iptables-restore --noflush` per
//! family, no probing processes. Only when that fails, or when reconcile/force is asked for, the
//! current state is read with `*-save` and compared with the plan the way Istio does (§3.5 of the
//! reference): identical → nothing to do; drifted → reconcile (guardrails, cleanup, apply) or a clear
//! error that says `--reconcile` is needed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::exec::{Cmd, CmdOutput, Executor, SpawnError};
use crate::netns::UsernsEntry;
use crate::rules::iptables::{render_restore, rule_args};
use crate::rules::model::is_builtin_chain;
use crate::rules::{Family, Rule, RuleSet};

/// Which iptables flavour to use when more than one is installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForceBinary {
    Legacy,
    Nft,
}

/// The resolved binaries of one family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binaries {
    pub family: Family,
    pub iptables: String,
    pub save: String,
    pub restore: String,
    /// Legacy iptables takes the xtables lock; nft does not need it.
    pub legacy: bool,
}

impl Binaries {
    /// Whether these are the `*-nft` binaries (the ones whose kernel encoding
    /// [`crate::rules::iptables_nft`] reproduces).
    pub fn is_nft_flavour(&self) -> bool {
        !self.legacy
            && Path::new(&self.restore)
                .file_name()
                .is_some_and(|n| n.to_string_lossy().ends_with("-nft-restore"))
    }

    /// Extra arguments for write commands (legacy only: wait for the xtables lock).
    fn lock_args(&self) -> Vec<String> {
        if self.legacy {
            vec!["--wait=30".to_string()]
        } else {
            vec![]
        }
    }
}

/// Errors of the apply step. Each names the command and what it said.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("{0}")]
    Spawn(#[from] SpawnError),
    #[error("no usable {family} binary: {reason} (install the iptables package)")]
    NoBinary {
        family: &'static str,
        reason: String,
    },
    #[error("{command} failed ({}): {stderr}", exit_text(*code))]
    Failed {
        command: String,
        code: Option<i32>,
        stderr: String,
    },
    #[error(
        "existing ISTIO rules in this network namespace differ from the requested ones ({family}); \
         rerun with --reconcile to replace them"
    )]
    Drift { family: &'static str },
}

fn family_prefix(family: Family) -> &'static str {
    match family {
        Family::V4 => "iptables",
        Family::V6 => "ip6tables",
    }
}

/// Finds `name` on $PATH.
pub fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")
        .unwrap_or_else(|| "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Whether legacy xtables already has tables in the current thread's network namespace. This is
/// what Istio learns by running `iptables-legacy-save` (it prints exactly these tables), read here
/// from procfs without starting a process.
pub fn legacy_has_tables(family: Family) -> bool {
    let file = match family {
        Family::V4 => "/proc/thread-self/net/ip_tables_names",
        Family::V6 => "/proc/thread-self/net/ip6_tables_names",
    };
    std::fs::read_to_string(file)
        .map(|s| !s.trim().is_empty())
        .unwrap_or(false)
}

/// Resolves the binaries for a family as Istio does: forced flavour if asked; else legacy when it
/// already holds rules here, else nft, else the plain name.
pub fn detect(family: Family, force: Option<ForceBinary>) -> Result<Binaries, ApplyError> {
    let prefix = family_prefix(family);
    // Absolute paths, resolved once (only for the flavour considered): each later spawn then skips
    // the $PATH walk. None when the flavour is not installed.
    let make = |suffix: &str, legacy: bool| -> Option<Binaries> {
        let resolve = |tail: &str| {
            find_on_path(&format!("{prefix}{suffix}{tail}"))
                .map(|p| p.to_string_lossy().into_owned())
        };
        Some(Binaries {
            family,
            iptables: resolve("")?,
            save: resolve("-save")?,
            restore: resolve("-restore")?,
            legacy,
        })
    };
    let missing = |suffix: &str| ApplyError::NoBinary {
        family: prefix,
        reason: format!(
            "{prefix}{suffix}, {prefix}{suffix}-save or {prefix}{suffix}-restore not found on PATH"
        ),
    };
    match force {
        Some(ForceBinary::Legacy) => {
            return make("-legacy", true).ok_or_else(|| missing("-legacy"));
        }
        Some(ForceBinary::Nft) => return make("-nft", false).ok_or_else(|| missing("-nft")),
        None => {}
    }
    if legacy_has_tables(family)
        && let Some(legacy) = make("-legacy", true)
    {
        return Ok(legacy);
    }
    if let Some(nft) = make("-nft", false) {
        return Ok(nft);
    }
    let plain = make("", false).ok_or_else(|| ApplyError::NoBinary {
        family: prefix,
        reason: format!("none of {prefix}-legacy, {prefix}-nft, {prefix} found on PATH"),
    })?;
    // Unknown flavour: ask it, so legacy still gets the lock flag.
    let version = std::process::Command::new(&plain.iptables)
        .arg("--version")
        .output();
    let is_nft = version
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("nf_tables"))
        .unwrap_or(false);
    Ok(Binaries {
        legacy: !is_nft,
        ..plain
    })
}

/// Applies `rules` by sending the nf_tables messages `iptables-nft-restore --noflush` would send
/// ([`crate::rules::iptables_nft`]), both families in one transaction, from the calling thread's
/// netns. Err when the rules are not covered by that encoding or the kernel refused them; either
/// way nothing has changed, and the caller runs iptables-restore instead.
pub fn apply_nft_netlink(rules: &RuleSet) -> Result<(), String> {
    apply_nft_netlink_entering(rules, None)
}

/// [`apply_nft_netlink`]; with a [`UsernsEntry`] the transaction is sent from a forked child inside
/// the user namespace owning the netns (what `-m owner` matches need there).
pub fn apply_nft_netlink_entering(
    rules: &RuleSet,
    userns: Option<&UsernsEntry>,
) -> Result<(), String> {
    use crate::netlink::nft_batch;
    use crate::rules::iptables_nft::encode;
    let mut messages = encode(Family::V4, &rules.v4).map_err(|e| e.to_string())?;
    messages.extend(encode(Family::V6, &rules.v6).map_err(|e| e.to_string())?);
    match userns {
        Some(entry) => nft_batch::send_entering(&messages, entry),
        None => nft_batch::send(&messages),
    }
    .map_err(|e| e.to_string())
}

/// How a sidecar apply should treat existing state.
#[derive(Debug, Clone, Default)]
pub struct SidecarOptions {
    pub reconcile: bool,
    pub cleanup_only: bool,
    pub force_apply: bool,
    /// Environment for every command (e.g. a pod-scoped `XTABLES_LOCKFILE`).
    pub env: Vec<(String, String)>,
    /// Never send the nf_tables messages directly; always run iptables-restore.
    pub restore_only: bool,
    /// Set for a netns owned by another user namespace (`hostUsers: false`): every command and
    /// the nf_tables transaction run in a child that entered it.
    pub userns: Option<UsernsEntry>,
}

/// What an apply did, for logs and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Applied,
    AlreadyApplied,
    Reconciled,
    CleanedUp,
}

/// Logs name outcomes in words (`applied`), not Rust syntax (`Some(Applied)`).
impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Outcome::Applied => "applied",
            Outcome::AlreadyApplied => "already applied",
            Outcome::Reconciled => "reconciled",
            Outcome::CleanedUp => "cleaned up",
        })
    }
}

/// "exit 2", or "killed by a signal" when there is no exit code.
fn exit_text(code: Option<i32>) -> String {
    code.map_or_else(|| "killed by a signal".to_string(), |c| format!("exit {c}"))
}

fn run_checked(exec: &mut dyn Executor, cmd: &Cmd) -> Result<CmdOutput, ApplyError> {
    let out = exec.run(cmd)?;
    if out.success {
        Ok(out)
    } else {
        Err(ApplyError::Failed {
            command: cmd.display(),
            code: out.code,
            stderr: out.stderr.trim().to_string(),
        })
    }
}

fn with_env(mut cmd: Cmd, env: &[(String, String)]) -> Cmd {
    cmd.env.extend(env.iter().cloned());
    cmd
}

fn restore_cmd(bins: &Binaries, text: String, env: &[(String, String)]) -> Cmd {
    let mut args = vec!["--noflush".to_string()];
    args.extend(bins.lock_args());
    with_env(Cmd::new(&bins.restore, args).with_stdin(text), env)
}

/// Applies the sidecar rules for every family that has rules (`bins` lists the families in use).
pub fn apply_sidecar(
    exec: &mut dyn Executor,
    bins: &[Binaries],
    rules: &RuleSet,
    opts: &SidecarOptions,
) -> Result<Outcome, ApplyError> {
    if opts.cleanup_only {
        for b in bins {
            cleanup_from_state(exec, b, &opts.env)?;
        }
        return Ok(Outcome::CleanedUp);
    }
    let planned: Vec<(&Binaries, &[Rule])> = bins
        .iter()
        .map(|b| (b, rules.family(b.family)))
        .filter(|(_, r)| !r.is_empty())
        .collect();

    if !opts.reconcile && !opts.force_apply {
        let mut all_ok = true;
        for (b, family_rules) in &planned {
            let out = exec.run(&restore_cmd(b, render_restore(family_rules), &opts.env))?;
            all_ok &= out.success;
        }
        if all_ok {
            return Ok(Outcome::Applied);
        }
    }
    if opts.force_apply && !opts.reconcile {
        for (b, family_rules) in &planned {
            run_checked(
                exec,
                &restore_cmd(b, render_restore(family_rules), &opts.env),
            )?;
        }
        return Ok(Outcome::Applied);
    }

    // Slow path: compare the current state with the plan.
    let mut drifted = Vec::new();
    for (b, family_rules) in &planned {
        let current = run_checked(
            exec,
            &with_env(Cmd::new(&b.save, Vec::<String>::new()), &opts.env),
        )?;
        let current = parse_save(&current.stdout);
        let in_place = match compare_with_plan(&current, family_rules) {
            Comparison::Same => true,
            Comparison::Different => false,
            // The kernel re-spells some rules (marks in hex...): ask iptables itself.
            Comparison::Unsure(rules) => rules_present(exec, b, &rules, &opts.env)?,
        };
        if !in_place {
            drifted.push((*b, *family_rules, has_istio_chains(&current)));
        }
    }
    if drifted.is_empty() {
        return Ok(Outcome::AlreadyApplied);
    }
    let residue = drifted.iter().any(|(_, _, residue)| *residue);
    if residue && !opts.reconcile {
        return Err(ApplyError::Drift {
            family: family_prefix(drifted[0].0.family),
        });
    }
    for (b, family_rules, residue) in drifted {
        if residue {
            with_guardrails(exec, b, &opts.env, |exec| {
                cleanup_from_state(exec, b, &opts.env)?;
                run_checked(
                    exec,
                    &restore_cmd(b, render_restore(family_rules), &opts.env),
                )
                .map(|_| ())
            })?;
        } else {
            run_checked(
                exec,
                &restore_cmd(b, render_restore(family_rules), &opts.env),
            )?;
        }
    }
    Ok(if residue {
        Outcome::Reconciled
    } else {
        Outcome::Applied
    })
}

/// Drops new TCP/UDP traffic while the rules are swapped, so nothing slips through uncaptured.
fn with_guardrails(
    exec: &mut dyn Executor,
    b: &Binaries,
    env: &[(String, String)],
    work: impl FnOnce(&mut dyn Executor) -> Result<(), ApplyError>,
) -> Result<(), ApplyError> {
    let guard_rules: Vec<[&str; 2]> = ["INPUT", "FORWARD", "OUTPUT"]
        .iter()
        .flat_map(|c| [[*c, "tcp"], [*c, "udp"]])
        .collect();
    let guard = |op: &str, chain: &str, proto: &str| {
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
    for [chain, proto] in &guard_rules {
        let _ = exec.run(&guard("-D", chain, proto));
        run_checked(exec, &guard("-I", chain, proto))?;
    }
    let result = work(exec);
    for [chain, proto] in &guard_rules {
        let _ = exec.run(&guard("-D", chain, proto));
    }
    result
}

/// Table -> chain -> rule argument strings, as read from `*-save` (or rendered from a plan).
pub type State = BTreeMap<String, BTreeMap<String, Vec<String>>>;

/// Parses `iptables-save` output: tables filter/nat/mangle/raw, chain declarations and rules.
pub fn parse_save(text: &str) -> State {
    let mut state = State::new();
    let mut table: Option<String> = None;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line == "COMMIT" {
            continue;
        }
        if let Some(name) = line.strip_prefix('*') {
            let name = name.trim();
            table = ["filter", "nat", "mangle", "raw"]
                .contains(&name)
                .then(|| name.to_string());
            if let Some(t) = &table {
                state.entry(t.clone()).or_default();
            }
            continue;
        }
        let Some(t) = &table else { continue };
        let chains = state.entry(t.clone()).or_default();
        if let Some(decl) = line.strip_prefix(':').or_else(|| line.strip_prefix("-N ")) {
            if let Some(chain) = decl.split_whitespace().next() {
                chains.entry(chain.to_string()).or_default();
            }
            continue;
        }
        let mut words = line.splitn(3, ' ');
        let (Some(op), Some(chain)) = (words.next(), words.next()) else {
            continue;
        };
        if op == "-A" || op == "-I" {
            let mut rest = words.next().unwrap_or("").to_string();
            if op == "-I" {
                // Drop the insert position, as the kernel reports rules without one.
                if let Some((pos, tail)) = rest.split_once(' ')
                    && pos.chars().all(|c| c.is_ascii_digit())
                {
                    rest = tail.to_string();
                }
            }
            chains.entry(chain.to_string()).or_default().push(rest);
        }
    }
    state
}

fn has_istio_chains(state: &State) -> bool {
    state
        .values()
        .any(|chains| chains.keys().any(|c| c.starts_with("ISTIO")))
}

/// Result of comparing the current state with a plan.
enum Comparison<'a> {
    Same,
    Different,
    /// Structure matches; these rules did not match textually and need an `iptables -C` check.
    Unsure(Vec<&'a Rule>),
}

/// Whether the current state already holds exactly the planned rules: every planned chain and rule
/// present, and ISTIO chains hold no more and no fewer rules than planned. Order is not compared
/// (as in Istio).
fn compare_with_plan<'a>(current: &State, plan: &'a [Rule]) -> Comparison<'a> {
    let mut planned: BTreeMap<(String, String), Vec<&Rule>> = BTreeMap::new();
    for rule in plan {
        planned
            .entry((rule.table.name().to_string(), rule.chain.clone()))
            .or_default()
            .push(rule);
    }
    let mut unsure = Vec::new();
    for ((table, chain), rules) in &planned {
        let Some(existing) = current.get(table).and_then(|c| c.get(chain)) else {
            return Comparison::Different;
        };
        if chain.starts_with("ISTIO") && existing.len() != rules.len() {
            return Comparison::Different;
        }
        let existing: BTreeSet<String> = existing.iter().map(|r| normalise(r)).collect();
        unsure.extend(
            rules
                .iter()
                .filter(|r| !existing.contains(&normalise(&rule_args(r).join(" ")))),
        );
    }
    // ISTIO chains we would not create are drift too.
    let foreign_chains = current.iter().any(|(table, chains)| {
        chains
            .keys()
            .filter(|c| c.starts_with("ISTIO"))
            .any(|c| !planned.contains_key(&(table.clone(), c.clone())))
    });
    if foreign_chains {
        Comparison::Different
    } else if unsure.is_empty() {
        Comparison::Same
    } else {
        Comparison::Unsure(unsure)
    }
}

/// Checks rules one by one with `iptables -C` (exact, but one process per rule).
fn rules_present(
    exec: &mut dyn Executor,
    b: &Binaries,
    rules: &[&Rule],
    env: &[(String, String)],
) -> Result<bool, ApplyError> {
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
            return Ok(false);
        }
    }
    Ok(true)
}

/// Canonical form of a rule for comparison: iptables-save re-orders and re-spells some matches
/// (`-p tcp` gains `-m tcp`, ports and prefixes are rewritten), so compare the sorted word multiset
/// without the implicit protocol modules.
fn normalise(rule: &str) -> String {
    let words: Vec<&str> = rule.split_whitespace().collect();
    let mut out: Vec<String> = Vec::with_capacity(words.len());
    let mut i = 0;
    while i < words.len() {
        if words[i] == "-m" && matches!(words.get(i + 1), Some(&"tcp") | Some(&"udp")) {
            i += 2;
            continue;
        }
        let w = words[i];
        let w = w.strip_suffix("/32").unwrap_or(w);
        let w = w.strip_suffix("/128").unwrap_or(w);
        out.push(w.to_string());
        i += 1;
    }
    out.sort();
    out.join(" ")
}

/// Removes everything of ours that the current state holds, whatever config created it: jumps from
/// built-in chains into ISTIO chains, then the ISTIO chains themselves. One restore per family.
pub fn cleanup_from_state(
    exec: &mut dyn Executor,
    b: &Binaries,
    env: &[(String, String)],
) -> Result<(), ApplyError> {
    let current = run_checked(
        exec,
        &with_env(Cmd::new(&b.save, Vec::<String>::new()), env),
    )?;
    let text = cleanup_restore_text(&parse_save(&current.stdout));
    if text.is_empty() {
        return Ok(());
    }
    run_checked(exec, &restore_cmd(b, text, env)).map(|_| ())
}

/// The restore text that deletes our rules and chains from a parsed state.
pub fn cleanup_restore_text(state: &State) -> String {
    let mut out = String::new();
    for (table, chains) in state {
        let mut lines = Vec::new();
        for (chain, rules) in chains.iter().filter(|(c, _)| !c.starts_with("ISTIO")) {
            for rule in rules {
                if jump_target(rule).is_some_and(|t| t.starts_with("ISTIO")) {
                    lines.push(format!("-D {chain} {rule}"));
                }
            }
        }
        let ours: Vec<&String> = chains.keys().filter(|c| c.starts_with("ISTIO")).collect();
        lines.extend(ours.iter().map(|c| format!("-F {c}")));
        lines.extend(ours.iter().map(|c| format!("-X {c}")));
        if !lines.is_empty() {
            out.push_str(&format!("*{table}\n{}\nCOMMIT\n", lines.join("\n")));
        }
    }
    out
}

fn jump_target(rule: &str) -> Option<&str> {
    let words: Vec<&str> = rule.split_whitespace().collect();
    words
        .iter()
        .position(|w| *w == "-j" || *w == "-g")
        .and_then(|i| words.get(i + 1).copied())
}

/// Istio's cleanup command list for a plan (used for the `--cleanup-only --dry-run` transcript):
/// the planned rules in reverse as `-D` (skipping rules inside ISTIO chains unless they jump to one),
/// then `-F`/`-X` of each user chain in reverse first-seen order.
pub fn planned_cleanup_commands(family: Family, rules: &[Rule]) -> Vec<String> {
    let bin = family_prefix(family);
    let mut out = Vec::new();
    for rule in rules.iter().rev() {
        let in_ours = rule.chain.starts_with("ISTIO_");
        let jumps_to_ours = rule
            .target
            .jump_chain()
            .is_some_and(|t| t.starts_with("ISTIO_"));
        if in_ours && !jumps_to_ours {
            continue;
        }
        out.push(format!(
            "{bin} -t {} -D {} {}",
            rule.table,
            rule.chain,
            rule_args(rule).join(" ")
        ));
    }
    let mut seen = BTreeSet::new();
    for rule in rules.iter().rev() {
        if is_builtin_chain(&rule.chain) || !seen.insert((rule.table, rule.chain.clone())) {
            continue;
        }
        out.push(format!("{bin} -t {} -F {}", rule.table, rule.chain));
        out.push(format!("{bin} -t {} -X {}", rule.table, rule.chain));
    }
    out
}

/// Detects the binaries for every family the rule set uses and applies it with real processes in
/// the calling thread's network namespace (run it inside [`crate::netns::run_in`] for a pod).
pub fn apply_sidecar_here(
    rules: &RuleSet,
    opts: &SidecarOptions,
    force: Option<ForceBinary>,
) -> Result<Outcome, ApplyError> {
    let mut bins = Vec::new();
    for family in Family::ALL {
        if !rules.family(family).is_empty() || (opts.cleanup_only && family == Family::V4) {
            bins.push(detect(family, force)?);
        }
    }
    // The common case — plain apply with the nft flavour — needs no process at all.
    let plain = !opts.reconcile && !opts.force_apply && !opts.cleanup_only && !opts.restore_only;
    if plain && !bins.is_empty() && bins.iter().all(Binaries::is_nft_flavour) {
        match apply_nft_netlink_entering(rules, opts.userns.as_ref()) {
            Ok(()) => {
                tracing::debug!("applied over nfnetlink, encoded as iptables-nft does");
                return Ok(Outcome::Applied);
            }
            Err(reason) => tracing::debug!(%reason, "applying with iptables-restore instead"),
        }
    }
    let mut exec = super::exec::ProcessExecutor::entering(opts.userns.clone());
    apply_sidecar(&mut exec, &bins, rules, opts)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAVED: &str = "# Generated by iptables-nft-save v1.8.9\n*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:ISTIO_OUTPUT - [0:0]\n:ISTIO_REDIRECT - [0:0]\n-A OUTPUT -j ISTIO_OUTPUT\n-A OUTPUT -p tcp -j RETURN\n-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN\n-A ISTIO_OUTPUT -j ISTIO_REDIRECT\n-A ISTIO_REDIRECT -p tcp -m tcp -j REDIRECT --to-ports 15001\nCOMMIT\n";

    #[test]
    fn parses_save_output() {
        let state = parse_save(SAVED);
        assert_eq!(
            state["nat"]["ISTIO_OUTPUT"],
            vec!["-d 127.0.0.1/32 -j RETURN", "-j ISTIO_REDIRECT"]
        );
        assert!(state["nat"]["PREROUTING"].is_empty());
    }

    #[test]
    fn cleanup_removes_only_our_jumps_and_chains() {
        let text = cleanup_restore_text(&parse_save(SAVED));
        assert_eq!(
            text,
            "*nat\n-D OUTPUT -j ISTIO_OUTPUT\n-F ISTIO_OUTPUT\n-F ISTIO_REDIRECT\n-X ISTIO_OUTPUT\n-X ISTIO_REDIRECT\nCOMMIT\n"
        );
    }

    #[test]
    fn normalise_ignores_implicit_modules_and_host_prefixes() {
        assert_eq!(
            normalise("-p tcp -m tcp --dport 15008 -j RETURN"),
            normalise("-p tcp --dport 15008 -j RETURN")
        );
        assert_eq!(
            normalise("-d 127.0.0.1 -j RETURN"),
            normalise("-d 127.0.0.1/32 -j RETURN")
        );
    }
}
