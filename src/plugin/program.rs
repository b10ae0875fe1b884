//! Effects in the pod's network namespace: detect its IPv6 state, build the sidecar rules with the
//! shared engine, and apply them with iptables-restore from a thread inside the netns — or, with
//! `$DRY_RUN_FILE_PATH`, write the restore input there instead.

use std::path::{Path, PathBuf};

use crate::apply::{Outcome, SidecarOptions, apply_sidecar_here};
use crate::netns::Netns;
use crate::rules::capture::{CaptureConfig, build};
use crate::rules::iptables::render_restore;

/// Why programming the namespace failed.
#[derive(Debug, thiserror::Error)]
pub enum ProgramError {
    #[error(transparent)]
    Netns(#[from] crate::netns::NetnsError),
    #[error("programming pod network namespace {netns}: {reason}")]
    Apply { netns: String, reason: String },
    #[error("cannot write dry-run output {path}: {source}")]
    DryRun {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What was done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Programmed {
    pub ipv6: bool,
    pub outcome: Option<Outcome>,
    pub warnings: Vec<String>,
}

/// IPv6 on/off for the pod: read from its addresses (the calling thread must be in its netns).
fn detect_ipv6(dual_stack: bool, warnings: &mut Vec<String>) -> bool {
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

/// Which rule backend programs the pod (`native_nftables` in the config picks nftables).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// iptables rules: sent over nfnetlink when the nft flavour is in use and the encoding covers
    /// them, else through iptables-restore.
    Iptables,
    /// iptables rules, always through iptables-restore (`ISTIO_IPTABLES_RESTORE_ONLY=true`).
    IptablesRestore,
    Nftables,
}

/// The nftables transaction replacing our sidecar tables.
fn nft_text(cfg: &CaptureConfig) -> String {
    use crate::rules::nftables::{NftTable, render_transaction};
    render_transaction(&crate::rules::nft_capture::build(cfg), &NftTable::SIDECAR)
}

/// What a dry run records: for iptables the restore input Istio's dry run writes (IPv4, then IPv6
/// if enabled); for nftables the transaction (Istio has no nft dry run).
pub fn dry_run_text(cfg: &CaptureConfig, backend: Backend) -> String {
    if backend == Backend::Nftables {
        return nft_text(cfg);
    }
    let rules = build(cfg);
    let mut text = render_restore(&rules.v4);
    if cfg.enable_ipv6 {
        text.push_str(&render_restore(&rules.v6));
    }
    text
}

/// Programs the pod netns (blocking: runs a dedicated thread inside it).
pub fn program(
    netns: &Path,
    mut cfg: CaptureConfig,
    dual_stack: bool,
    backend: Backend,
    dry_run: Option<PathBuf>,
) -> Result<Programmed, ProgramError> {
    if let Some(out) = dry_run {
        // The namespace may be a placeholder in a dry run; without it, IPv4 only.
        let mut warnings = Vec::new();
        cfg.enable_ipv6 = Netns::open(netns)
            .and_then(|ns| {
                ns.run(move || {
                    let mut w = Vec::new();
                    let v6 = detect_ipv6(dual_stack, &mut w);
                    (v6, w)
                })
            })
            .map(|(v6, w)| {
                warnings.extend(w);
                v6
            })
            .unwrap_or_else(|e| {
                warnings.push(format!("dry run: {e}; IPv4 rules only"));
                false
            });
        std::fs::write(&out, dry_run_text(&cfg, backend)).map_err(|source| {
            ProgramError::DryRun {
                path: out.clone(),
                source,
            }
        })?;
        return Ok(Programmed {
            ipv6: cfg.enable_ipv6,
            outcome: None,
            warnings,
        });
    }
    let pod_netns = Netns::open(netns)?;
    let userns = pod_netns.userns_entry().cloned();
    let opts = SidecarOptions {
        // The xtables lock is scoped to the pod, so concurrent ADDs of other pods do not queue.
        env: vec![("XTABLES_LOCKFILE".to_string(), netns.display().to_string())],
        restore_only: backend == Backend::IptablesRestore,
        userns: userns.clone(),
        ..Default::default()
    };
    let ns_name = netns.display().to_string();
    let (result, ipv6, warnings) = pod_netns.run(move || {
        let mut warnings = Vec::new();
        cfg.enable_ipv6 = detect_ipv6(dual_stack, &mut warnings);
        let applied = match backend {
            Backend::Iptables | Backend::IptablesRestore => {
                let rules = build(&cfg);
                match apply_sidecar_here(&rules, &opts, None) {
                    // A repeated ADD with changed settings (the refusal changed nothing): converge,
                    // the pod is not running yet. Rules of the other interception mode go too, so
                    // a changed interceptionMode ends with exactly the new plan.
                    Err(crate::apply::ApplyError::Drift { .. }) => {
                        let reconcile = SidecarOptions {
                            reconcile: true,
                            reconcile_also: crate::rules::capture::other_mode(&cfg),
                            ..opts.clone()
                        };
                        apply_sidecar_here(&rules, &reconcile, None)
                    }
                    other => other,
                }
            }
            Backend::Nftables => crate::apply::nft::apply_transaction(
                &mut crate::apply::ProcessExecutor::entering(userns),
                &nft_text(&cfg),
            )
            .map(|_| Outcome::Applied),
        }
        .map_err(|e| e.to_string())
        .and_then(|outcome| {
            // ::6 on lo (IPv6) and the TPROXY policy route, as Istio adds after the rules. From
            // this thread also for a user-namespaced pod: rtnetlink asks only for CAP_NET_ADMIN
            // over the netns's user namespace, which host root has. nftables replaces our tables
            // on every run: the routes follow the settings too.
            let replaced = outcome == Outcome::Reconciled || backend == Backend::Nftables;
            crate::netlink::routes::converge_sidecar_routes(&cfg, replaced)
                .map(|_| outcome)
                .map_err(|e| format!("routes: {e}"))
        });
        (applied, cfg.enable_ipv6, warnings)
    })?;
    let outcome = result.map_err(|reason| ProgramError::Apply {
        netns: ns_name,
        reason,
    })?;
    Ok(Programmed {
        ipv6,
        outcome: Some(outcome),
        warnings,
    })
}

/// Whether `netns` is the namespace this process runs in (never program that: it is the host).
/// A path that cannot be opened as a netns is not ours; programming it fails with its own error.
pub fn is_own_netns(netns: &Path) -> bool {
    match (Netns::open(netns), Netns::current()) {
        (Ok(theirs), Ok(ours)) => theirs == ours,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_netns_is_recognised_by_identity_under_any_path() {
        assert!(is_own_netns(Path::new("/proc/self/ns/net")));
        assert!(is_own_netns(Path::new("/proc/thread-self/ns/net")));
        let file = tempfile::NamedTempFile::new().unwrap();
        assert!(!is_own_netns(file.path()));
        assert!(!is_own_netns(Path::new("/nonexistent/netns")));
    }
}
