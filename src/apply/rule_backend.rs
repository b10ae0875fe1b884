//! The one rule backend trait: how a family's owned rules are read back ([`RuleBackend::read_owned`]),
//! compared with a plan ([`RuleBackend::diff`], pure) and written ([`RuleBackend::apply_atomic`]).
//! The sidecar apply and its drift check both go through it, so there is one diff per read kind:
//! * [`Iptables`] of the nft flavour: the owned tables dumped over nfnetlink and decoded to the
//!   typed rule model ([`super::nft_read`]), no process; `*-save` only when that read fails (or in
//!   tests that script the executor);
//! * [`Iptables`] of iptables-legacy: `*-save` text parsed by [`super::state`] (the only text
//!   reader left for the read-and-compare step);
//! * [`NativeNft`]: our own nftables tables dumped over nfnetlink and decoded to the typed
//!   [`crate::rules::nft_model`] statements ([`super::nft::read_native_netlink`], no process),
//!   compared with
//!   what the planned transaction leaves ([`crate::rules::nft_decode::expected`]); the ambient
//!   in-pod and host checks and the sidecar verify go through it.
//!
//! Writing is one `*-restore` per family for the iptables backends (the sidecar apply wraps it in
//! its snapshot and rollback), one nf_tables batch over netlink for native nftables (encoded by [`crate::rules::nft_encode`]).

use super::exec::Executor;
use super::iptables::{ApplyError, Binaries, restore_cmd, run_checked, save_cmd};
use super::nft_read::{KernelSets, OwnedState, holds_any_sidecar, read_owned, sidecar_difference};
use super::state::{Comparison, Difference, State, compare_with_plan, holds_any_of, parse_save};
use crate::rules::Rule;
use crate::rules::nft_decode::{NativeState, difference};
use crate::rules::nft_encode::NftTransaction;

/// What an iptables family holds, as its backend read it back.
#[derive(Debug, Clone)]
pub enum ReadBack {
    /// `*-save` output and its parse (legacy, or iptables-nft when netlink could not tell).
    Saved { text: String, state: State },
    /// The owned tables as typed rules, read over netlink.
    Typed(OwnedState),
}

impl ReadBack {
    /// Whether this holds anything of `planned`: a chain of ours, or a planned built-in rule.
    pub fn holds_any(&self, planned: &[Rule]) -> bool {
        match self {
            ReadBack::Saved { state, .. } => holds_any_of(state, planned),
            ReadBack::Typed(state) => holds_any_sidecar(state, planned),
        }
    }
}

/// How what a backend read compares with its plan.
#[derive(Debug)]
pub enum Diff<'a, D = Difference> {
    Same,
    Differs(D),
    /// Text only (iptables `*-save`): these rules did not match as saved; `iptables -C` decides.
    Unsure(Vec<&'a Rule>),
}

/// One rule backend: how its owned rules are read, compared with a plan and written.
pub trait RuleBackend {
    /// What is compared with a read: the iptables rules of one family, or the native tables a
    /// transaction leaves.
    type Plan: ?Sized;
    /// What a read returns.
    type Owned;
    /// How a read differs from its plan.
    type Difference;
    /// What is written: a family's restore input, or a native nftables transaction.
    type Input;

    /// Reads the tables of ours in the calling thread's netns (or through `exec`).
    fn read_owned(
        &self,
        exec: &mut dyn Executor,
        env: &[(String, String)],
    ) -> Result<Self::Owned, ApplyError>;

    /// How `owned` differs from holding exactly `planned`. Pure.
    fn diff<'a>(&self, planned: &'a Self::Plan, owned: &Self::Owned) -> Diff<'a, Self::Difference>;

    /// Writes `input` (a family's restore input, or an nft transaction) all or nothing.
    fn apply_atomic(
        &self,
        exec: &mut dyn Executor,
        input: Self::Input,
        env: &[(String, String)],
    ) -> Result<(), ApplyError>;
}

/// The iptables backends, as the sidecar apply and verify hold them.
pub type IptablesBackend<'a> =
    dyn RuleBackend<Plan = [Rule], Owned = ReadBack, Difference = Difference, Input = String> + 'a;

/// The iptables diff (sidecar semantics: order not compared, as in Istio). Pure.
fn iptables_diff<'a>(planned: &'a [Rule], owned: &ReadBack) -> Diff<'a> {
    match owned {
        ReadBack::Typed(state) => match sidecar_difference(state, planned) {
            None => Diff::Same,
            Some(d) => Diff::Differs(d),
        },
        ReadBack::Saved { state, .. } => match compare_with_plan(state, planned) {
            Comparison::Same => Diff::Same,
            Comparison::Different(d) => Diff::Differs(d),
            Comparison::Unsure(rules) => Diff::Unsure(rules),
        },
    }
}

/// One family's restore input as one `*-restore --noflush`.
fn restore(
    exec: &mut dyn Executor,
    bins: &Binaries,
    input: String,
    env: &[(String, String)],
) -> Result<(), ApplyError> {
    run_checked(exec, &restore_cmd(bins, input, env)).map(|_| ())
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
) -> Result<ReadBack, ApplyError> {
    read_saved(exec, bins, env).map(|(text, state)| ReadBack::Saved { text, state })
}

/// How an iptables-nft family is read as typed rules: the kernel ([`kernel_read`]) or a test's
/// answer; None falls back to `*-save`.
pub type TypedRead<'r> = &'r dyn Fn(&Binaries) -> Option<OwnedState>;

/// An iptables family, written with one `*-restore`: iptables-legacy reads `*-save` text
/// (`typed: None`); the nft flavour reads over netlink as typed rules first, `*-save` when that
/// read cannot tell.
pub struct Iptables<'b, 'r> {
    pub bins: &'b Binaries,
    pub typed: Option<TypedRead<'r>>,
}

impl RuleBackend for Iptables<'_, '_> {
    type Plan = [Rule];
    type Owned = ReadBack;
    type Difference = Difference;
    type Input = String;

    fn read_owned(
        &self,
        exec: &mut dyn Executor,
        env: &[(String, String)],
    ) -> Result<ReadBack, ApplyError> {
        match self.typed.and_then(|read| read(self.bins)) {
            Some(state) => Ok(ReadBack::Typed(state)),
            None => saved(exec, self.bins, env),
        }
    }

    fn diff<'a>(&self, planned: &'a [Rule], owned: &ReadBack) -> Diff<'a> {
        iptables_diff(planned, owned)
    }

    fn apply_atomic(
        &self,
        exec: &mut dyn Executor,
        input: String,
        env: &[(String, String)],
    ) -> Result<(), ApplyError> {
        restore(exec, self.bins, input, env)
    }
}

/// Native nftables: our tables named `<prefix>*` (`istio-ambient-`, `istio-proxy-`) read as
/// typed rules over nfnetlink ([`super::nft::read_native_netlink`]), the plan being what the
/// transaction leaves ([`crate::rules::nft_decode::expected`]); written as one nf_tables batch
/// ([`super::nft::apply_transaction`]). No `nft` process either way. Rule order is compared (nft
/// runs a chain in order); the difference names the first table, chain or rule that differs.
pub struct NativeNft {
    pub prefix: &'static str,
}

impl RuleBackend for NativeNft {
    type Plan = NativeState;
    type Owned = NativeState;
    type Difference = String;
    type Input = NftTransaction;

    fn read_owned(
        &self,
        _exec: &mut dyn Executor,
        _env: &[(String, String)],
    ) -> Result<NativeState, ApplyError> {
        super::nft::read_native_netlink(self.prefix).map_err(|source| ApplyError::Netlink {
            what: format!("read the nftables tables {}*", self.prefix),
            source,
        })
    }

    fn diff<'a>(&self, planned: &'a NativeState, owned: &NativeState) -> Diff<'a, String> {
        match difference(planned, owned) {
            None => Diff::Same,
            Some(what) => Diff::Differs(what),
        }
    }

    fn apply_atomic(
        &self,
        exec: &mut dyn Executor,
        input: NftTransaction,
        _env: &[(String, String)],
    ) -> Result<(), ApplyError> {
        super::nft::apply_transaction(exec, &input)
    }
}

/// The backend of a family: legacy reads text; any other flavour reads through `read` first.
pub fn for_family<'a>(bins: &'a Binaries, read: TypedRead<'a>) -> Box<IptablesBackend<'a>> {
    let typed = (!bins.legacy).then_some(read);
    Box::new(Iptables { bins, typed })
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
