//! The plugin's side of programming a pod: open its netns once and hand it to the shared entry
//! ([`crate::apply::pod::program`], which detects IPv6, applies and converges the routes, as for
//! `istio-iptables`), or, with `$DRY_RUN_FILE_PATH`, write what would be applied there instead.

use std::path::{Path, PathBuf};

use crate::apply::pod::{self, PodError, PodOptions, WhichNetns};
use crate::apply::{ForceBinary, RuleChange};
use crate::netns::Netns;
use crate::rules::capture::{CaptureConfig, build};
use crate::rules::iptables::render_restore;

pub use crate::apply::pod::Backend;

/// Why programming the namespace failed.
#[derive(Debug, thiserror::Error)]
pub enum ProgramError {
    #[error(transparent)]
    Netns(#[from] crate::netns::NetnsError),
    #[error("programming pod network namespace {netns}: {source}")]
    Apply {
        netns: String,
        #[source]
        source: PodError,
    },
    /// The runtime removed the netns while the ADD was programming it (sandbox torn down).
    #[error(
        "network namespace {netns} was removed while the ADD programmed it (the pod sandbox is \
         gone); its rules went with it"
    )]
    Gone { netns: String },
    #[error("cannot write dry-run output {path}: {source}")]
    DryRun {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What the plugin's redirect of a sidecar pod did (`outcome` is `None` for a dry run).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedirectDone {
    pub ipv6: bool,
    pub outcome: Option<RuleChange>,
    pub warnings: Vec<String>,
}

/// What a dry run records: for iptables the restore input Istio's dry run writes (IPv4, then IPv6
/// if enabled); for nftables the transaction (Istio has no nft dry run).
pub fn dry_run_text(cfg: &CaptureConfig, backend: Backend) -> String {
    if backend == Backend::Nftables {
        return pod::nft_transaction(cfg).render();
    }
    let rules = build(cfg);
    let mut text = render_restore(&rules.v4);
    if cfg.enable_ipv6 {
        text.push_str(&render_restore(&rules.v6));
    }
    text
}

/// Programs the pod netns through the shared entry (the work runs on a netns worker thread while
/// this task waits), or with `dry_run` writes what would be applied there.
pub async fn program(
    netns: &Path,
    cfg: CaptureConfig,
    dual_stack: bool,
    backend: Backend,
    force_binary: Option<ForceBinary>,
    dry_run: Option<PathBuf>,
) -> Result<RedirectDone, ProgramError> {
    if let Some(out) = dry_run {
        return write_dry_run(netns, cfg, dual_stack, backend, out);
    }
    let pod_netns = Netns::open(netns)?;
    pause_after_open();
    let opts = PodOptions {
        backend,
        force_binary,
        // A repeated ADD with changed settings converges: the pod is not running yet.
        reconcile_on_drift: true,
        detect_ipv6: Some(dual_stack),
        ..PodOptions::default()
    };
    let done = pod::program_pod(&pod_netns, &cfg, &opts)
        .await
        .map_err(|e| match e {
            PodError::Netns(e) => ProgramError::Netns(e),
            source => ProgramError::Apply {
                netns: netns.display().to_string(),
                source,
            },
        })?;
    // The open fd kept the namespace alive while it was programmed; if its path is gone now, the
    // runtime tore the sandbox down meanwhile, and success would report a pod that is not there.
    if !Netns::open(netns).is_ok_and(|now| now == pod_netns) {
        return Err(ProgramError::Gone {
            netns: netns.display().to_string(),
        });
    }
    Ok(RedirectDone {
        ipv6: done.ipv6,
        outcome: Some(done.outcome),
        warnings: done.warnings,
    })
}

/// Test builds (`test-hooks`) only: `ISTIO_CNI_RS_TEST_PAUSE_AFTER_NETNS_OPEN_MS=N` holds the
/// ADD for N ms between opening the netns and programming it, so a test can remove the netns
/// in the middle. Compiled out of the product.
#[cfg(feature = "test-hooks")]
fn pause_after_open() {
    let pause = std::env::var("ISTIO_CNI_RS_TEST_PAUSE_AFTER_NETNS_OPEN_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(ms) = pause {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

#[cfg(not(feature = "test-hooks"))]
#[inline(always)]
fn pause_after_open() {}

/// The dry run: IPv6 as the pod's addresses say, if its netns can be opened at all (it may be a
/// placeholder; then IPv4 only).
fn write_dry_run(
    netns: &Path,
    mut cfg: CaptureConfig,
    dual_stack: bool,
    backend: Backend,
    out: PathBuf,
) -> Result<RedirectDone, ProgramError> {
    let mut warnings = Vec::new();
    let detected = Netns::open(netns).and_then(|ns| {
        pod::in_target(WhichNetns::Pod(&ns), move |_| {
            let mut w = Vec::new();
            (pod::detect_ipv6(dual_stack, &mut w), w)
        })
    });
    cfg.enable_ipv6 = match detected {
        Ok((v6, w)) => {
            warnings.extend(w);
            v6
        }
        Err(e) => {
            warnings.push(format!("dry run: {e}; IPv4 rules only"));
            false
        }
    };
    std::fs::write(&out, dry_run_text(&cfg, backend))
        .map_err(|source| ProgramError::DryRun { path: out, source })?;
    Ok(RedirectDone {
        ipv6: cfg.enable_ipv6,
        outcome: None,
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
    fn rendered_rules_carry_the_trimmed_items() {
        use crate::sidecar::redirect::*;
        let mut p = crate::sidecar::PodInfo::default();
        p.containers.insert(crate::sidecar::pod::ISTIO_PROXY.into());
        p.annotations.insert(ANN_STATUS.into(), "true".into());
        for (k, v) in [
            (ANN_EXCLUDE_INBOUND_PORTS, "8080, 9090"),
            (ANN_EXCLUDE_OUTBOUND_PORTS, " 5432 "),
            (ANN_EXCLUDE_INTERFACES, "eth1, eth2"),
        ] {
            p.annotations.insert(k.into(), v.into());
        }
        let Ok(Redirect::Capture(c)) = redirect(&p, &EngineEnv::default()) else {
            panic!("expected capture")
        };
        for backend in [Backend::Iptables, Backend::Nftables] {
            let text = dry_run_text(&c.config, backend);
            for item in ["9090", "5432", "eth2"] {
                assert!(text.contains(item), "{item} missing:\n{text}");
            }
            assert!(
                !text.contains("  "),
                "an untrimmed item was rendered:\n{text}"
            );
        }
    }

    #[test]
    fn own_netns_is_recognised_by_identity_under_any_path() {
        assert!(is_own_netns(Path::new("/proc/self/ns/net")));
        assert!(is_own_netns(Path::new("/proc/thread-self/ns/net")));
        let file = tempfile::NamedTempFile::new().unwrap();
        assert!(!is_own_netns(file.path()));
        assert!(!is_own_netns(Path::new("/nonexistent/netns")));
    }
}
