//! Programming one network namespace with the sidecar capture: the one entry both the
//! `istio-iptables` role and the CNI plugin call, so they validate, lock, enter, pick the backend,
//! take a user-namespaced pod's user namespace and converge the routes the same way.
//!
//! [`program`] applies, [`cleanup`] removes, [`verify`] reads what is there and compares it with
//! what `program` would leave (the drift check; nothing written); dry runs stay with their
//! callers (they print or write a file and never program), using [`in_target`],
//! [`cleanup_rules`] and the transaction texts.

use super::exec::ProcessExecutor;
use super::iptables::{ApplyError, ForceBinary};
use super::outcome::RuleChange;
use super::rule_backend::{Diff, NativeNft, RuleBackend};
use super::sidecar::{SidecarOptions, apply_sidecar_here, cleanup_sidecar_here};
pub use super::verify::NetnsCheck;
use super::{CleanupInput, nft};
use crate::netns::{Netns, NetnsError, UsernsEntry};
use crate::rules::capture::{self, CaptureConfig};
use crate::rules::capture_values::InvalidValue;
use crate::rules::nft_decode::{NativeState, expected};
use crate::rules::nft_encode::{NftStep, NftTransaction};
use crate::rules::nftables::NftTable;
use crate::rules::{RuleSet, nft_capture};

/// Which network namespace the rules go in.
#[derive(Debug, Clone, Copy)]
pub enum WhichNetns<'a> {
    /// A pod's netns: entered on a fresh thread; its path scopes the xtables lock.
    Pod(&'a Netns),
    /// The netns this process runs in (istio-iptables in an init container).
    Here,
}

/// Which rule backend programs the netns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// iptables rules: sent over nfnetlink when the nft flavour is in use and the encoding covers
    /// them, else through iptables-restore.
    #[default]
    Iptables,
    /// iptables rules, always through iptables-restore (`ISTIO_IPTABLES_RESTORE_ONLY=true`).
    IptablesRestore,
    /// Our own nftables tables, replaced as a whole on every run.
    Nftables,
}

/// How [`program`] treats what is already there.
#[derive(Debug, Clone, Default)]
pub struct PodOptions {
    pub backend: Backend,
    /// Replace drifted rules of ours (istio-iptables `--reconcile`).
    pub reconcile: bool,
    /// When rules of ours differ, reconcile anyway (the plugin: a repeated ADD with changed
    /// settings, before the pod runs). The refused first attempt changed nothing.
    pub reconcile_on_drift: bool,
    pub force_apply: bool,
    pub force_binary: Option<ForceBinary>,
    /// `Some(dual_stack)`: IPv6 on/off from the netns's own addresses (the plugin), instead of
    /// the configuration's `enable_ipv6`.
    pub detect_ipv6: Option<bool>,
}

/// The prefix of our sidecar nftables tables (`istio-proxy-nat`, ...).
pub const SIDECAR_NFT_TABLES: &str = "istio-proxy-";

/// The sidecar's native nftables backend: our `istio-proxy-*` tables.
const SIDECAR_NFT: NativeNft = NativeNft {
    prefix: SIDECAR_NFT_TABLES,
};

/// How `actual` (our tables read back) differs from what [`program`] leaves for `cfg`, typed.
fn nft_difference(cfg: &CaptureConfig, actual: &NativeState) -> Option<String> {
    let planned = expected(&nft_capture::build(cfg), &NftTable::SIDECAR, &[]);
    match SIDECAR_NFT.diff(&planned, actual) {
        Diff::Same => None,
        Diff::Differs(what) => Some(what),
        Diff::Unsure(_) => Some("not compared".to_string()),
    }
}

/// What [`program`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Programmed {
    pub outcome: RuleChange,
    /// IPv6 rules were programmed.
    pub ipv6: bool,
    /// Things the operator should know that did not stop the apply.
    pub warnings: Vec<String>,
}

/// Why programming or cleaning a netns failed.
#[derive(Debug, thiserror::Error)]
pub enum PodError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error(transparent)]
    Invalid(#[from] InvalidValue),
    #[error(transparent)]
    Apply(#[from] ApplyError),
    #[error("routes: {0}")]
    Routes(#[source] super::routes::RoutesError),
}

/// Applies the sidecar capture for `cfg` in `target`, then its routes (`::6` on lo, TPROXY
/// policy routing). Blocking: a pod's netns is entered on a dedicated thread.
pub fn program(
    target: WhichNetns<'_>,
    cfg: &CaptureConfig,
    opts: &PodOptions,
) -> Result<Programmed, PodError> {
    in_target(target, program_work(target, cfg, opts)?)?
}

/// [`program`] for a pod's netns from async code (the plugin): the task awaits the netns
/// worker, no blocking-pool thread waits for it.
pub async fn program_pod(
    netns: &Netns,
    cfg: &CaptureConfig,
    opts: &PodOptions,
) -> Result<Programmed, PodError> {
    let work = program_work(WhichNetns::Pod(netns), cfg, opts)?;
    let userns = netns.userns_entry().cloned();
    netns.run_async(move || work(userns)).await?
}

/// What [`program`] runs where the rules live, once `cfg` is valid.
fn program_work(
    target: WhichNetns<'_>,
    cfg: &CaptureConfig,
    opts: &PodOptions,
) -> Result<
    impl FnOnce(Option<UsernsEntry>) -> Result<Programmed, PodError> + Send + 'static,
    PodError,
> {
    cfg.validate()?;
    let mut cfg = cfg.clone();
    let opts = opts.clone();
    let lock = lock_env(target);
    Ok(move |userns: Option<UsernsEntry>| {
        let mut warnings = Vec::new();
        if let Some(dual_stack) = opts.detect_ipv6 {
            cfg.enable_ipv6 = detect_ipv6(dual_stack, &mut warnings);
        }
        let outcome = match opts.backend {
            Backend::Iptables | Backend::IptablesRestore => {
                apply_iptables(&cfg, &opts, lock, userns)?
            }
            Backend::Nftables => {
                SIDECAR_NFT.apply_atomic(
                    &mut ProcessExecutor::entering(userns),
                    nft_transaction(&cfg),
                    &[],
                )?;
                RuleChange::Applied
            }
        };
        // From this thread also for a user-namespaced pod: rtnetlink asks only for CAP_NET_ADMIN
        // over the netns's user namespace, which host root has. nftables replaces our tables on
        // every run, so the routes follow the settings of this run too.
        let replaced = outcome == RuleChange::Reconciled || opts.backend == Backend::Nftables;
        routes(&cfg, RouteStep::Converge { replaced })?;
        Ok(Programmed {
            outcome,
            ipv6: cfg.enable_ipv6,
            warnings,
        })
    })
}

/// Whether `target` holds exactly what [`program`] would leave there for `cfg` (the rules; the
/// routes are not read), reading the kernel once: one `*-save` per family in use (ip6tables only
/// when the pod has IPv6, decided as `program` decides), or our nftables tables read back as
/// typed rules ([`NativeNft`]) and compared with what the transaction leaves. Writes nothing.
/// Blocking, like [`program`].
pub fn verify(
    target: WhichNetns<'_>,
    cfg: &CaptureConfig,
    opts: &PodOptions,
) -> Result<NetnsCheck, PodError> {
    cfg.validate()?;
    let mut cfg = cfg.clone();
    let opts = opts.clone();
    let lock = lock_env(target);
    in_target(target, move |userns| {
        if let Some(dual_stack) = opts.detect_ipv6 {
            cfg.enable_ipv6 = detect_ipv6(dual_stack, &mut Vec::new());
        }
        let verdict = match opts.backend {
            Backend::Iptables | Backend::IptablesRestore => super::verify::verify_sidecar_here(
                &capture::build(&cfg),
                &lock,
                opts.force_binary,
                userns.as_ref(),
            )?,
            Backend::Nftables => {
                let mut exec = ProcessExecutor::entering(userns);
                let actual = SIDECAR_NFT.read_owned(&mut exec, &[])?;
                match nft_difference(&cfg, &actual) {
                    None => NetnsCheck::InPlace,
                    Some(_) if actual.is_empty() => NetnsCheck::Absent,
                    Some(what) => NetnsCheck::Drifted { what },
                }
            }
        };
        Ok(verdict)
    })?
}

/// The iptables apply, with the plugin's one retry as a reconcile when rules of ours drifted.
fn apply_iptables(
    cfg: &CaptureConfig,
    opts: &PodOptions,
    lock: Vec<(String, String)>,
    userns: Option<UsernsEntry>,
) -> Result<RuleChange, ApplyError> {
    let rules = capture::build(cfg);
    let sidecar = SidecarOptions {
        reconcile: opts.reconcile,
        force_apply: opts.force_apply,
        env: lock,
        restore_only: opts.backend == Backend::IptablesRestore,
        userns,
        // Rules of the other interception mode go too, so a changed interceptionMode ends with
        // exactly the new plan (only a reconcile uses them: built when one may run).
        reconcile_also: if opts.reconcile {
            capture::other_mode(cfg)
        } else {
            RuleSet::default()
        },
    };
    match apply_sidecar_here(&rules, &sidecar, opts.force_binary) {
        Err(ApplyError::Drift { .. }) if opts.reconcile_on_drift => {
            let reconcile = SidecarOptions {
                reconcile: true,
                reconcile_also: capture::other_mode(cfg),
                ..sidecar
            };
            apply_sidecar_here(&rules, &reconcile, opts.force_binary)
        }
        other => other,
    }
}

/// Removes what `cfg` creates from `target`: our rules and chains (in every family that holds
/// any, in either interception mode) or our nftables tables, then its TPROXY routes and `::6`.
pub fn cleanup(
    target: WhichNetns<'_>,
    cfg: &CaptureConfig,
    backend: Backend,
    force_binary: Option<ForceBinary>,
) -> Result<RuleChange, PodError> {
    cfg.validate()?;
    let cfg = cfg.clone();
    let lock = lock_env(target);
    in_target(target, move |userns| {
        let outcome = match backend {
            Backend::Iptables | Backend::IptablesRestore => {
                let [rules, other] = cleanup_rules(&cfg);
                let input = CleanupInput {
                    v4: &rules.v4,
                    v6: &rules.v6,
                    ipv6_enabled: cfg.enable_ipv6,
                    also: [&other.v4, &other.v6],
                };
                cleanup_sidecar_here(&input, &lock, force_binary, userns.as_ref())?
            }
            Backend::Nftables => {
                nft::apply_transaction(
                    &mut ProcessExecutor::entering(userns),
                    &nft_cleanup_transaction(),
                )?;
                RuleChange::CleanedUp
            }
        };
        routes(&cfg, RouteStep::Remove)?;
        Ok(outcome)
    })?
}

/// Runs `work` where the rules live: on a fresh thread inside a pod's netns, or right here.
/// `work` gets the user-namespace entry its tools must take when that netns is owned by another
/// user namespace (`hostUsers: false` pods). Our own netns is only inspected: without procfs we
/// work as before.
pub fn in_target<T: Send + 'static>(
    target: WhichNetns<'_>,
    work: impl FnOnce(Option<UsernsEntry>) -> T + Send + 'static,
) -> Result<T, NetnsError> {
    match target {
        WhichNetns::Pod(netns) => {
            let userns = netns.userns_entry().cloned();
            netns.run(move || work(userns))
        }
        WhichNetns::Here => {
            let here = Netns::current().ok();
            Ok(work(here.and_then(|ns| ns.userns_entry().cloned())))
        }
    }
}

/// A pod-scoped xtables lock: concurrent pods never wait on each other's lock.
fn lock_env(target: WhichNetns<'_>) -> Vec<(String, String)> {
    match target {
        WhichNetns::Pod(netns) => vec![(
            "XTABLES_LOCKFILE".to_string(),
            netns.path().display().to_string(),
        )],
        WhichNetns::Here => Vec::new(),
    }
}

/// IPv6 on/off from the netns's addresses (the calling thread must be in it).
pub fn detect_ipv6(dual_stack: bool, warnings: &mut Vec<String>) -> bool {
    match crate::netlink::detect_host_ip(dual_stack) {
        Ok(Some(host)) => host.ipv6,
        Ok(None) => {
            warnings.push("pod network namespace has no usable address; IPv4 rules only".into());
            false
        }
        Err(e) => {
            warnings.push(format!("cannot read pod addresses ({e}); IPv4 rules only"));
            false
        }
    }
}

/// The rule lists a cleanup removes: the configuration's, with IPv6 rules even when IPv6 is off
/// (used when ip6tables holds chains of ours), and the same in the other interception mode (its
/// built-in-chain rules go where present).
pub fn cleanup_rules(cfg: &CaptureConfig) -> [RuleSet; 2] {
    let mut planned = capture::build(cfg);
    let with_v6 = CaptureConfig {
        enable_ipv6: true,
        ..cfg.clone()
    };
    planned.v6 = capture::build(&with_v6).v6;
    [planned, capture::other_mode(&with_v6)]
}

/// The nftables transaction replacing our sidecar tables.
pub fn nft_transaction(cfg: &CaptureConfig) -> NftTransaction {
    NftTransaction::new(vec![NftStep::Replace {
        set: nft_capture::build(cfg),
        tables: NftTable::SIDECAR.to_vec(),
    }])
}

/// The nftables transaction removing our sidecar tables.
pub fn nft_cleanup_transaction() -> NftTransaction {
    NftTransaction::new(vec![NftStep::Remove(NftTable::SIDECAR.to_vec())])
}

enum RouteStep {
    /// After an apply; `replaced`: the rules were replaced, so stale TPROXY routing goes.
    Converge {
        replaced: bool,
    },
    Remove,
}

/// The one place the route decisions are called from.
fn routes(cfg: &CaptureConfig, step: RouteStep) -> Result<(), PodError> {
    match step {
        RouteStep::Converge { replaced } => super::routes::converge_sidecar_routes(cfg, replaced),
        RouteStep::Remove => super::routes::remove_sidecar_routes(cfg),
    }
    .map_err(PodError::Routes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_entries_refuse_an_invalid_configuration_before_any_effect() {
        let cfg = CaptureConfig {
            loopback_v4: "10.0.0.0/8".into(),
            ..CaptureConfig::default()
        };
        let err = program(WhichNetns::Here, &cfg, &PodOptions::default()).unwrap_err();
        assert!(matches!(err, PodError::Invalid(_)), "{err}");
        assert!(err.to_string().contains("10.0.0.0/8"), "{err}");
        let err = cleanup(WhichNetns::Here, &cfg, Backend::Nftables, None).unwrap_err();
        assert!(matches!(err, PodError::Invalid(_)), "{err}");
    }

    #[test]
    fn only_a_pod_target_scopes_the_xtables_lock() {
        let here = Netns::current().unwrap();
        assert_eq!(
            lock_env(WhichNetns::Pod(&here)),
            vec![(
                "XTABLES_LOCKFILE".to_string(),
                "/proc/thread-self/ns/net".to_string()
            )]
        );
        assert!(lock_env(WhichNetns::Here).is_empty());
    }

    #[test]
    fn every_sidecar_nft_table_carries_the_verified_prefix() {
        for table in NftTable::SIDECAR {
            assert!(table.name().starts_with(SIDECAR_NFT_TABLES), "{table:?}");
        }
        for table in NftTable::AMBIENT_POD {
            assert!(!table.name().starts_with(SIDECAR_NFT_TABLES), "{table:?}");
        }
    }

    #[test]
    fn cleanup_covers_ipv6_and_the_other_mode() {
        let cfg = CaptureConfig::default();
        let [planned, other] = cleanup_rules(&cfg);
        assert!(!cfg.enable_ipv6 && !planned.v6.is_empty());
        assert_eq!(
            other,
            capture::other_mode(&CaptureConfig {
                enable_ipv6: true,
                ..cfg
            })
        );
    }
}
