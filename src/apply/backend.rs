//! The one rule-backend decision (iptables-legacy / iptables-nft / native nftables), used by the
//! plugin, `istio-iptables` and the ambient node agent. Roles state what they were asked for
//! ([`BackendRequest`]); [`decide`] turns it into a [`Decision`] that says why. The node agent adds
//! Istio's host fallbacks ([`decide_for_host`]): an existing iptables probe ipset means the node
//! still runs the iptables backend (reboot to finish a migration), and an `nft` without JSON
//! support cannot run the nftables backend. The iptables flavour itself is the sidecar detection
//! ([`super::iptables::detect`]), run once in the host netns and pinned for every pod.

use super::iptables::{ForceBinary, detect};
use super::pod::Backend;
use crate::rules::Family;
use crate::rules::ambient::{PROBE_SET_V4, PROBE_SET_V6};

/// What a role was configured with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BackendRequest {
    /// `NATIVE_NFTABLES` / `--native-nftables` / the plugin's `native_nftables`.
    pub native_nftables: bool,
    /// `ISTIO_IPTABLES_RESTORE_ONLY`: iptables rules only through iptables-restore.
    pub restore_only: bool,
    /// `FORCE_IPTABLES_BINARY`.
    pub force_binary: Option<ForceBinary>,
}

/// The backend to use and why (logged once by the caller).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub backend: Backend,
    /// The iptables flavour every apply uses (None: detected per netns).
    pub force_binary: Option<ForceBinary>,
    pub reason: String,
    /// Set when a fallback overrode the request: the operator should act on it.
    pub warning: Option<String>,
}

/// The decision from the configuration alone (plugin, `istio-iptables`).
pub fn decide(req: &BackendRequest) -> Decision {
    let (backend, reason) = match (req.native_nftables, req.restore_only) {
        (true, _) => (Backend::Nftables, "native nftables requested"),
        (false, true) => (
            Backend::IptablesRestore,
            "iptables requested, through iptables-restore only",
        ),
        (false, false) => (
            Backend::Iptables,
            "iptables (native nftables not requested)",
        ),
    };
    Decision {
        backend,
        force_binary: req.force_binary,
        reason: reason.to_string(),
        warning: None,
    }
}

/// What listing the nf_tables tables over netlink answered (where Istio asks `nft --json`; no
/// nft binary is needed or run here, so nft's build options and version do not matter).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NfTables {
    Supported,
    /// The kernel has no nf_tables (the subsystem is not there).
    NotInKernel(String),
    /// Any other failure: Istio stays on nftables.
    Unknown(String),
}

/// The host facts Istio's fallbacks look at (a seam: tests feed them).
pub trait HostArtifacts {
    /// Whether the ipset `name` exists in the host netns (Err: could not tell).
    fn ipset_exists(&self, name: &str) -> std::io::Result<bool>;
    fn nf_tables(&self) -> NfTables;
}

/// The node agent's decision, in the host netns: the request, then Istio's fallbacks from
/// nftables to iptables, then (iptables) the flavour detected once here and pinned.
pub fn decide_for_host(req: &BackendRequest, ipv6: bool, host: &dyn HostArtifacts) -> Decision {
    let mut decision = fallbacks(req, ipv6, host);
    if decision.backend != Backend::Nftables && decision.force_binary.is_none() {
        decision.force_binary = pinned_flavour();
    }
    decision
}

/// The pure part of [`decide_for_host`].
pub fn fallbacks(req: &BackendRequest, ipv6: bool, host: &dyn HostArtifacts) -> Decision {
    let mut decision = decide(req);
    if decision.backend != Backend::Nftables {
        return decision;
    }
    let sets: &[&str] = if ipv6 {
        &[PROBE_SET_V4, PROBE_SET_V6]
    } else {
        &[PROBE_SET_V4]
    };
    for set in sets {
        match host.ipset_exists(set) {
            Ok(true) => {
                return Decision {
                    reason: format!(
                        "native nftables requested, but the iptables probe set {set} exists on \
                         the host: staying on iptables"
                    ),
                    warning: Some(format!(
                        "ipset {set} from the iptables backend still exists; reboot the node to \
                         finish the migration to nftables"
                    )),
                    ..decide(&BackendRequest {
                        native_nftables: false,
                        ..*req
                    })
                };
            }
            Ok(false) => {}
            Err(e) => {
                decision.reason =
                    format!("{}; could not look for ipset {set} ({e})", decision.reason);
            }
        }
    }
    match host.nf_tables() {
        NfTables::Supported => {}
        NfTables::NotInKernel(e) => {
            return Decision {
                reason: format!(
                    "native nftables requested, but the kernel has no nf_tables ({e}): using \
                     iptables"
                ),
                warning: Some("the kernel lacks nf_tables; falling back to iptables".into()),
                ..decide(&BackendRequest {
                    native_nftables: false,
                    ..*req
                })
            };
        }
        NfTables::Unknown(e) => {
            decision.reason = format!("{}; nf_tables probe inconclusive ({e})", decision.reason);
        }
    }
    decision
}

/// The flavour of the iptables binaries found here (legacy or nft), so every pod uses the same one
/// whatever its own netns holds. None when only unflavoured binaries exist.
fn pinned_flavour() -> Option<ForceBinary> {
    let bins = detect(Family::V4, None).ok()?;
    if bins.legacy && bins.iptables.ends_with("-legacy") {
        Some(ForceBinary::Legacy)
    } else if bins.is_nft_flavour() {
        Some(ForceBinary::Nft)
    } else {
        None
    }
}

/// The real host: `ipset list -n` and an nf_tables table listing over netlink, in the calling
/// thread's netns.
pub struct ProcessHost;

impl HostArtifacts for ProcessHost {
    fn ipset_exists(&self, name: &str) -> std::io::Result<bool> {
        let out = std::process::Command::new("ipset")
            .args(["list", "-n", name])
            .output()
            .map_err(|e| std::io::Error::new(e.kind(), format!("cannot run ipset: {e}")))?;
        if out.status.success() {
            return Ok(true);
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        if stderr.contains("does not exist") {
            Ok(false)
        } else {
            Err(std::io::Error::other(format!(
                "ipset list -n {name}: {}",
                stderr.trim()
            )))
        }
    }

    fn nf_tables(&self) -> NfTables {
        match super::nft::read_native_netlink("istio-") {
            Ok(_) => NfTables::Supported,
            Err(e) => match e.refused_with() {
                Some(libc::EOPNOTSUPP | libc::EPROTONOSUPPORT | libc::EAFNOSUPPORT) => {
                    NfTables::NotInKernel(e.to_string())
                }
                _ => NfTables::Unknown(e.to_string()),
            },
        }
    }
}

/// The backend decided at a node's first install, as recorded in the agent's run dir: reused by
/// every later start, so detection inputs that change under a running node (the other flavour's
/// tables appearing, an ipset left behind) cannot flip it and leave two rule sets (a
/// known Istio failure). Only a change of `NATIVE_NFTABLES` itself decides again (and migrates).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recorded {
    pub backend: Backend,
    pub force_binary: Option<ForceBinary>,
    /// The `NATIVE_NFTABLES` the decision was made under.
    pub native_nftables: bool,
}

/// The record's file name in the run dir.
pub const RECORD_FILE: &str = "ambient-backend";

impl Recorded {
    pub fn of(decision: &Decision, native_nftables: bool) -> Self {
        Recorded {
            backend: decision.backend,
            force_binary: decision.force_binary,
            native_nftables,
        }
    }

    /// The flavour this record pins for every role on the node (none under native nftables or
    /// when only unflavoured binaries exist).
    pub fn pinned(&self) -> Option<ForceBinary> {
        (self.backend != Backend::Nftables)
            .then_some(self.force_binary)
            .flatten()
    }

    /// [`Recorded::pinned`] as the plugin's config spells it (`legacy` | `nft`).
    pub fn iptables_flavour(&self) -> Option<&'static str> {
        match self.pinned()? {
            ForceBinary::Legacy => Some("legacy"),
            ForceBinary::Nft => Some("nft"),
        }
    }

    /// `key=value` lines (the file's content).
    pub fn render(&self) -> String {
        let backend = match self.backend {
            Backend::Iptables => "iptables",
            Backend::IptablesRestore => "iptables-restore",
            Backend::Nftables => "nftables",
        };
        let flavour = match self.force_binary {
            Some(ForceBinary::Legacy) => "legacy",
            Some(ForceBinary::Nft) => "nft",
            None => "auto",
        };
        format!(
            "backend={backend}\nflavour={flavour}\nnative_nftables={}\n",
            self.native_nftables
        )
    }

    /// Parses [`Recorded::render`]'s text; an error names the bad line.
    pub fn parse(text: &str) -> Result<Self, RecordError> {
        let (mut backend, mut flavour, mut native) = (None, None, None);
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let bad = || RecordError::Line(line.to_string());
            let (key, value) = line.split_once('=').ok_or_else(bad)?;
            match (key, value) {
                ("backend", "iptables") => backend = Some(Backend::Iptables),
                ("backend", "iptables-restore") => backend = Some(Backend::IptablesRestore),
                ("backend", "nftables") => backend = Some(Backend::Nftables),
                ("flavour", "legacy") => flavour = Some(Some(ForceBinary::Legacy)),
                ("flavour", "nft") => flavour = Some(Some(ForceBinary::Nft)),
                ("flavour", "auto") => flavour = Some(None),
                ("native_nftables", "true") => native = Some(true),
                ("native_nftables", "false") => native = Some(false),
                _ => return Err(bad()),
            }
        }
        match (backend, flavour, native) {
            (Some(backend), Some(force_binary), Some(native_nftables)) => Ok(Recorded {
                backend,
                force_binary,
                native_nftables,
            }),
            _ => Err(RecordError::Incomplete),
        }
    }
}

/// Why a backend record cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("unexpected line {0:?}")]
    Line(String),
    #[error("backend, flavour and native_nftables are all required")]
    Incomplete,
    #[error("backend record {path}: {why}")]
    File {
        path: std::path::PathBuf,
        why: String,
    },
}

/// Size limit of the record (three short lines).
const RECORD_LIMIT: u64 = 4096;

/// Reads a record file as untrusted input: a regular file (opened without blocking) of at most
/// [`RECORD_LIMIT`] bytes that parses. `Ok(None)` when it does not exist; the error names the file.
pub fn read_record(path: &std::path::Path) -> Result<Option<Recorded>, RecordError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let fail = |why: String| RecordError::File {
        path: path.to_path_buf(),
        why,
    };
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(fail(e.to_string())),
    };
    if !file.metadata().is_ok_and(|m| m.is_file()) {
        return Err(fail("not a regular file".into()));
    }
    let mut text = String::new();
    file.take(RECORD_LIMIT + 1)
        .read_to_string(&mut text)
        .map_err(|e| fail(e.to_string()))?;
    if text.len() as u64 > RECORD_LIMIT {
        return Err(fail(format!("over {RECORD_LIMIT} bytes")));
    }
    Recorded::parse(&text)
        .map(Some)
        .map_err(|e| fail(e.to_string()))
}

/// The node agent's decision with a record of the first install: the recorded backend when it was
/// made under the same `NATIVE_NFTABLES`, else a fresh [`decide_for_host`]. Returns the decision
/// and, when it differs from a recorded one, the backend to migrate from.
pub fn decide_recorded(
    req: &BackendRequest,
    ipv6: bool,
    host: &dyn HostArtifacts,
    recorded: Option<&Recorded>,
) -> (Decision, Option<Recorded>) {
    match recorded {
        Some(r) if r.native_nftables == req.native_nftables => (
            Decision {
                backend: r.backend,
                force_binary: req.force_binary.or(r.force_binary),
                reason: "decided at this node's first install (recorded in the run dir)".into(),
                warning: None,
            },
            None,
        ),
        Some(r) => {
            let mut fresh = decide(req);
            if fresh.backend != Backend::Nftables && fresh.force_binary.is_none() {
                fresh.force_binary = r.force_binary.or_else(pinned_flavour);
            }
            fresh.reason = format!(
                "NATIVE_NFTABLES changed to {} since the recorded decision: migrating",
                req.native_nftables
            );
            let old = (r.backend != fresh.backend).then_some(*r);
            (fresh, old)
        }
        None => (decide_for_host(req, ipv6, host), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake {
        sets: Vec<&'static str>,
        nft: NfTables,
    }

    impl HostArtifacts for Fake {
        fn ipset_exists(&self, name: &str) -> std::io::Result<bool> {
            Ok(self.sets.contains(&name))
        }
        fn nf_tables(&self) -> NfTables {
            self.nft.clone()
        }
    }

    const NFT: BackendRequest = BackendRequest {
        native_nftables: true,
        restore_only: false,
        force_binary: None,
    };

    #[test]
    fn the_request_alone_decides_for_the_plugin_and_istio_iptables() {
        assert_eq!(decide(&NFT).backend, Backend::Nftables);
        let restore = BackendRequest {
            restore_only: true,
            ..Default::default()
        };
        assert_eq!(decide(&restore).backend, Backend::IptablesRestore);
        assert_eq!(decide(&Default::default()).backend, Backend::Iptables);
    }

    #[test]
    fn an_existing_probe_ipset_keeps_the_agent_on_iptables_with_a_warning() {
        let host = Fake {
            sets: vec![PROBE_SET_V6],
            nft: NfTables::Supported,
        };
        // Only the v6 set exists: it counts only when IPv6 is on.
        assert_eq!(fallbacks(&NFT, false, &host).backend, Backend::Nftables);
        let d = fallbacks(&NFT, true, &host);
        assert_eq!(d.backend, Backend::Iptables);
        assert!(d.reason.contains(PROBE_SET_V6), "{}", d.reason);
        assert!(d.warning.unwrap().contains("reboot"));
    }

    #[test]
    fn a_kernel_without_nf_tables_falls_back_and_other_probe_failures_do_not() {
        let no_nf_tables = Fake {
            sets: vec![],
            nft: NfTables::NotInKernel("no nf_tables".into()),
        };
        let d = fallbacks(&NFT, false, &no_nf_tables);
        assert_eq!(d.backend, Backend::Iptables);
        assert!(d.reason.contains("no nf_tables"), "{}", d.reason);
        let unknown = Fake {
            sets: vec![],
            nft: NfTables::Unknown("timeout".into()),
        };
        let d = fallbacks(&NFT, false, &unknown);
        assert_eq!(d.backend, Backend::Nftables);
        assert!(d.reason.contains("timeout") && d.warning.is_none());
    }

    #[test]
    fn iptables_requests_never_probe_the_host() {
        struct Panics;
        impl HostArtifacts for Panics {
            fn ipset_exists(&self, _: &str) -> std::io::Result<bool> {
                panic!("probed")
            }
            fn nf_tables(&self) -> NfTables {
                panic!("probed")
            }
        }
        assert_eq!(
            fallbacks(&Default::default(), true, &Panics).backend,
            Backend::Iptables
        );
    }

    #[test]
    fn a_recorded_backend_is_reused_whatever_the_host_shows_until_native_nftables_changes() {
        let req = BackendRequest {
            native_nftables: true,
            ..Default::default()
        };
        // The host now shows a leftover ipset: fresh detection would say iptables.
        let host = Fake {
            sets: vec![PROBE_SET_V4],
            nft: NfTables::Supported,
        };
        assert_eq!(
            decide_for_host(&req, false, &host).backend,
            Backend::Iptables
        );
        let recorded = Recorded {
            backend: Backend::Nftables,
            force_binary: None,
            native_nftables: true,
        };
        let (d, migrate) = decide_recorded(&req, false, &host, Some(&recorded));
        assert_eq!((d.backend, migrate), (Backend::Nftables, None));
        assert!(d.reason.contains("recorded"), "{}", d.reason);
        // NATIVE_NFTABLES turned off: iptables, migrating from the recorded nftables.
        let off = BackendRequest::default();
        let (d, migrate) = decide_recorded(&off, false, &host, Some(&recorded));
        assert_eq!(d.backend, Backend::Iptables);
        assert_eq!(migrate, Some(recorded));
        assert_eq!(Recorded::parse(&recorded.render()), Ok(recorded));
        let legacy = Recorded {
            backend: Backend::Iptables,
            force_binary: Some(ForceBinary::Legacy),
            native_nftables: false,
        };
        assert_eq!(Recorded::parse(&legacy.render()), Ok(legacy));
        let bad = Recorded::parse("backend=ebpf\n").unwrap_err();
        assert!(bad.to_string().contains("backend=ebpf"), "{bad}");
        assert!(Recorded::parse("").is_err());
    }

    #[test]
    fn the_record_read_by_every_role_pins_one_flavour_and_is_read_as_untrusted_input() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(RECORD_FILE);
        assert_eq!(read_record(&path), Ok(None), "missing");
        std::fs::write(
            &path,
            "backend=iptables\nflavour=nft\nnative_nftables=false\n",
        )
        .expect("write");
        let r = read_record(&path).expect("good").expect("present");
        assert_eq!(r.pinned(), Some(ForceBinary::Nft));
        assert_eq!(r.iptables_flavour(), Some("nft"));
        std::fs::write(
            &path,
            "backend=nftables\nflavour=auto\nnative_nftables=true\n",
        )
        .expect("write");
        let r = read_record(&path).expect("good").expect("present");
        assert_eq!(r.pinned(), None, "native nftables pins no iptables flavour");
        std::fs::write(&path, vec![b'\n'; RECORD_LIMIT as usize + 1]).expect("write");
        let e = read_record(&path).unwrap_err().to_string();
        assert!(e.contains("over") && e.contains(RECORD_FILE), "{e}");
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        let e = read_record(&fifo).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        std::fs::write(&path, "flavour=sideways\n").expect("write");
        let e = read_record(&path).unwrap_err();
        assert!(e.to_string().contains("sideways"), "{e}");
    }
}
