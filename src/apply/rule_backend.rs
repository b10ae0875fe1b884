//! The one rule backend trait: how a family's owned rules are read back ([`RuleBackend::read_owned`]),
//! compared with a plan ([`RuleBackend::diff`], pure) and written ([`RuleBackend::apply_atomic`]).
//! The sidecar apply, its drift check and the ambient iptables apply all read through it, and
//! every read is compared by the one [`super::diff`]:
//! * [`Iptables`] of the nft flavour: the owned tables dumped over nfnetlink and decoded to the
//!   typed rule model ([`super::nft_read`]), no process; `*-save` only when that read fails (or in
//!   tests that script the executor);
//! * [`Iptables`] of iptables-legacy: `*-save` text decoded into the same typed rules
//!   ([`crate::rules::iptables_save_decode`]);
//! * [`NativeNft`]: our own nftables tables dumped over nfnetlink and decoded to the typed
//!   [`crate::rules::nft_model`] statements ([`super::nft::read_native_netlink`], no process),
//!   compared with
//!   what the planned transaction leaves ([`crate::rules::nft_decode::expected`]); the ambient
//!   in-pod and host checks and the sidecar verify go through it.
//!
//! Writing is one `*-restore` per family for the iptables backends (the sidecar apply wraps it in
//! its snapshot and rollback), one nf_tables batch over netlink for native nftables (encoded by [`crate::rules::nft_encode`]).

pub use super::diff::Diff;
use super::diff::{Difference, ReadKind, ambient_difference, holds_any_of, sidecar_diff};
use super::exec::Executor;
use super::iptables::{ApplyError, Binaries, restore_cmd, run_checked, save_cmd};
use super::nft_read::{KernelSets, read_owned};
use super::owned::OwnedChains;
use crate::rules::Rule;
use crate::rules::iptables_save_decode::decode_save;
use crate::rules::iptables_state::IptablesState;
use crate::rules::nft_decode::{NativeState, difference};
use crate::rules::nft_encode::NftTransaction;

/// What an iptables family holds, as its backend read it back: typed rules either way.
#[derive(Debug, Clone)]
pub enum ReadBack {
    /// `*-save` output and its decoding (legacy, or iptables-nft when netlink could not tell).
    Saved { text: String, state: IptablesState },
    /// The tables as typed rules, read over netlink (or known empty without a process).
    Typed(IptablesState),
}

impl ReadBack {
    /// The typed rules read.
    pub fn state(&self) -> &IptablesState {
        match self {
            ReadBack::Saved { state, .. } | ReadBack::Typed(state) => state,
        }
    }

    /// How exactly the read says what the kernel holds.
    pub fn kind(&self) -> ReadKind {
        match self {
            ReadBack::Saved { .. } => ReadKind::Saved,
            ReadBack::Typed(_) => ReadKind::Dumped,
        }
    }

    /// Whether this holds anything of `planned`: a chain of ours, or a planned built-in rule.
    pub fn holds_any(&self, planned: &[Rule]) -> bool {
        holds_any_of(self.state(), planned)
    }
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

/// One family's restore input as one `*-restore --noflush`.
fn restore(
    exec: &mut dyn Executor,
    bins: &Binaries,
    input: String,
    env: &[(String, String)],
) -> Result<(), ApplyError> {
    run_checked(exec, &restore_cmd(bins, input, env)).map(|_| ())
}

/// Reads a family's `*-save` text and its decoding (the legacy read, and the snapshot of a
/// family an apply is about to write).
pub fn read_saved(
    exec: &mut dyn Executor,
    bins: &Binaries,
    env: &[(String, String)],
) -> Result<(String, IptablesState), ApplyError> {
    let text = run_checked(exec, &save_cmd(bins, env))?.stdout;
    let state = decode_save(&text);
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
pub type TypedRead<'r> = &'r dyn Fn(&Binaries) -> Option<IptablesState>;

/// Which chains of an iptables family a plan owns, and so which question its diff asks.
#[derive(Debug, Clone, Copy)]
pub enum Ownership {
    /// The sidecar capture's chains ([`crate::rules::capture::owned_chains`]): Istio's check,
    /// order not compared ([`super::diff::sidecar_diff`]).
    Sidecar,
    /// An ambient plan's chains: order compared, every jump into them accounted for
    /// ([`super::diff::ambient_difference`]).
    Ambient(OwnedChains),
}

/// An iptables family, written with one `*-restore`: iptables-legacy reads `*-save` text
/// (`typed: None`); the nft flavour reads over netlink as typed rules first, `*-save` when that
/// read cannot tell. Either read is compared by the one [`super::diff`], as `owned` says.
pub struct Iptables<'b, 'r> {
    pub bins: &'b Binaries,
    pub typed: Option<TypedRead<'r>>,
    pub owned: Ownership,
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
        match self.owned {
            Ownership::Sidecar => sidecar_diff(owned.state(), planned, owned.kind()),
            Ownership::Ambient(chains) => {
                match ambient_difference(owned.state(), planned, chains) {
                    None => Diff::Same,
                    Some(d) => Diff::Differs(d),
                }
            }
        }
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

/// The sidecar backend of a family: legacy reads text; any other flavour reads through `read`
/// first.
pub fn for_family<'a>(bins: &'a Binaries, read: TypedRead<'a>) -> Box<IptablesBackend<'a>> {
    let typed = (!bins.legacy).then_some(read);
    Box::new(Iptables {
        bins,
        typed,
        owned: Ownership::Sidecar,
    })
}

/// Never reads typed (scripted executors answer `*-save`).
pub fn no_typed_read(_: &Binaries) -> Option<IptablesState> {
    None
}

/// The nft flavour's tables of the calling thread's netns as typed rules, read over netlink; None
/// (read `*-save`) for legacy or when the read fails.
pub fn kernel_read(bins: &Binaries) -> Option<IptablesState> {
    const TABLES: &[&str] = &["filter", "mangle", "nat", "raw"];
    if !bins.is_nft_flavour() {
        return None;
    }
    read_owned(bins.family, TABLES, &KernelSets)
        .inspect_err(|e| tracing::debug!(error = %e, "reading the rules over netlink failed"))
        .ok()
}

/// What a family's `tables` hold, learnt without a process where the kernel can say: a netns
/// without any table (either flavour) holds nothing; the nft flavour's tables are read over
/// netlink (one chain dump, then one rule dump per table that exists). None: only `*-save` can
/// tell (legacy with tables, or the read failed).
pub fn kernel_read_tables(bins: &Binaries, tables: &[&str]) -> Option<IptablesState> {
    if bins.legacy && !super::iptables::legacy_has_tables(bins.family) {
        return Some(IptablesState::default());
    }
    if !bins.is_nft_flavour() {
        tracing::debug!(family = ?bins.family, "not the iptables-nft binaries (legacy): reading with *-save");
        return None;
    }
    let family = super::iptables::nf_family(bins.family);
    let listed = crate::netlink::nft_dump::list_chains_with_policy(family)
        .inspect_err(|e| tracing::debug!(error = %e, "listing the chains over netlink failed; reading *-save"))
        .ok()?;
    super::nft_read::read_owned_among(bins.family, tables, &KernelSets, listed)
        .inspect_err(|e| tracing::debug!(error = %e, "reading the rules over netlink failed; reading *-save"))
        .ok()
}
