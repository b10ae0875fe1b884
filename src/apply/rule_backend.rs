//! The one rule backend trait: how a family's owned rules are read back ([`RuleBackend::read_owned`]),
//! compared with a plan ([`RuleBackend::diff`], pure) and written ([`RuleBackend::apply_atomic`]).
//! The sidecar apply and its drift check both go through it, so there is one diff per read kind:
//! * [`IptablesNft`]: the owned tables dumped over nfnetlink and decoded to the typed rule model
//!   ([`super::nft_read`]), no process; `*-save` only when that read fails (or in tests that
//!   script the executor);
//! * [`IptablesLegacy`]: `*-save` text parsed by [`super::state`] (the only text reader left for
//!   the read-and-compare step).
//!
//! Writing is one `*-restore` per family for both (the sidecar apply wraps it in its snapshot
//! and rollback).

use super::exec::Executor;
use super::iptables::{ApplyError, Binaries, restore_cmd, run_checked, save_cmd};
use super::nft_read::{KernelSets, OwnedState, holds_any_sidecar, read_owned, sidecar_difference};
use super::state::{Comparison, Difference, State, compare_with_plan, holds_any_of, parse_save};
use crate::rules::Rule;

/// What a family holds, as its backend read it.
#[derive(Debug, Clone)]
pub enum Owned {
    /// `*-save` output and its parse (legacy, or iptables-nft when netlink could not tell).
    Saved { text: String, state: State },
    /// The owned tables as typed rules, read over netlink.
    Typed(OwnedState),
}

impl Owned {
    /// Whether this holds anything of `planned`: a chain of ours, or a planned built-in rule.
    pub fn holds_any(&self, planned: &[Rule]) -> bool {
        match self {
            Owned::Saved { state, .. } => holds_any_of(state, planned),
            Owned::Typed(state) => holds_any_sidecar(state, planned),
        }
    }
}

/// How what a family holds compares with its plan.
#[derive(Debug)]
pub enum Diff<'a> {
    Same,
    Differs(Difference),
    /// Text only: these rules did not match as saved; `iptables -C` decides.
    Unsure(Vec<&'a Rule>),
}

/// One family's rule backend.
pub trait RuleBackend {
    fn bins(&self) -> &Binaries;

    /// Reads the tables of ours in the calling thread's netns (or through `exec`).
    fn read_owned(
        &self,
        exec: &mut dyn Executor,
        env: &[(String, String)],
    ) -> Result<Owned, ApplyError>;

    /// How `owned` differs from holding exactly `planned` (sidecar semantics: order not compared,
    /// as in Istio). Pure.
    fn diff<'a>(&self, planned: &'a [Rule], owned: &Owned) -> Diff<'a> {
        match owned {
            Owned::Typed(state) => match sidecar_difference(state, planned) {
                None => Diff::Same,
                Some(d) => Diff::Differs(d),
            },
            Owned::Saved { state, .. } => match compare_with_plan(state, planned) {
                Comparison::Same => Diff::Same,
                Comparison::Different(d) => Diff::Differs(d),
                Comparison::Unsure(rules) => Diff::Unsure(rules),
            },
        }
    }

    /// Writes one family's restore input as one `*-restore --noflush`.
    fn apply_atomic(
        &self,
        exec: &mut dyn Executor,
        restore: String,
        env: &[(String, String)],
    ) -> Result<(), ApplyError> {
        run_checked(exec, &restore_cmd(self.bins(), restore, env)).map(|_| ())
    }
}

/// Reads a family's `*-save` text and its parse (the legacy read, and the sidecar apply's
/// snapshot of a family it is about to write).
pub fn read_saved(
    exec: &mut dyn Executor,
    bins: &Binaries,
    env: &[(String, String)],
) -> Result<(String, State), ApplyError> {
    let text = run_checked(exec, &save_cmd(bins, env))?.stdout;
    let state = parse_save(&text);
    Ok((text, state))
}

fn saved(
    exec: &mut dyn Executor,
    bins: &Binaries,
    env: &[(String, String)],
) -> Result<Owned, ApplyError> {
    read_saved(exec, bins, env).map(|(text, state)| Owned::Saved { text, state })
}

/// iptables-legacy: `*-save` / `*-restore` text.
pub struct IptablesLegacy<'b>(pub &'b Binaries);

impl RuleBackend for IptablesLegacy<'_> {
    fn bins(&self) -> &Binaries {
        self.0
    }

    fn read_owned(
        &self,
        exec: &mut dyn Executor,
        env: &[(String, String)],
    ) -> Result<Owned, ApplyError> {
        saved(exec, self.0, env)
    }
}

/// How an iptables-nft family is read as typed rules: the kernel ([`kernel_read`]) or a test's
/// answer; None falls back to `*-save`.
pub type TypedRead<'r> = &'r dyn Fn(&Binaries) -> Option<OwnedState>;

/// iptables-nft: read over netlink as typed rules, written with `*-restore`.
pub struct IptablesNft<'b, 'r> {
    pub bins: &'b Binaries,
    pub read: TypedRead<'r>,
}

impl RuleBackend for IptablesNft<'_, '_> {
    fn bins(&self) -> &Binaries {
        self.bins
    }

    fn read_owned(
        &self,
        exec: &mut dyn Executor,
        env: &[(String, String)],
    ) -> Result<Owned, ApplyError> {
        match (self.read)(self.bins) {
            Some(state) => Ok(Owned::Typed(state)),
            None => saved(exec, self.bins, env),
        }
    }
}

/// The backend of a family: legacy reads text; any other flavour reads through `read` first.
pub fn for_family<'a>(bins: &'a Binaries, read: TypedRead<'a>) -> Box<dyn RuleBackend + 'a> {
    if bins.legacy {
        Box::new(IptablesLegacy(bins))
    } else {
        Box::new(IptablesNft { bins, read })
    }
}

/// Never reads typed (scripted executors answer `*-save`).
pub fn no_typed_read(_: &Binaries) -> Option<OwnedState> {
    None
}

/// The nft flavour's tables of the calling thread's netns as typed rules, read over netlink; None
/// (read `*-save`) for legacy or when the read fails.
pub fn kernel_read(bins: &Binaries) -> Option<OwnedState> {
    const TABLES: &[&str] = &["filter", "mangle", "nat", "raw"];
    if !bins.is_nft_flavour() {
        return None;
    }
    read_owned(bins.family, TABLES, &KernelSets)
        .inspect_err(|e| tracing::debug!(error = %e, "reading the rules over netlink failed"))
        .ok()
}
