//! The install pass, its validity check and cleanup — the file effects around the pure logic in
//! `cniconf` and `kubeconfig`.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use tracing::{debug, info, warn};

use super::cniconf::{ConfError, IstioPlugin};
use super::config::{InstallConfig, PLUGIN_BINARY};
use super::fsutil::{self, FileStamp, FsError, Perms};
use super::kubeconfig::{self, KubeconfigError, KubeconfigInputs};

mod merge;
mod restore;
mod select;
#[cfg(test)]
mod tests;

use restore::RestoreRecord;

/// Name of the record that lets cleanup restore a primary `.conf` we converted (L8). It lives in
/// the run dir so a restarted agent still knows it.
pub const RESTORE_RECORD: &str = "istio-cni-restore.json";

/// Why an install pass failed; the variant is the `result` label of `istio_cni_installs_total`.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("copying the plugin binary: reading {}: {source}", path.display())]
    ReadSelf {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("copying the plugin binary: none of the CNI bin directories exists: {dirs}")]
    NoBinDir { dirs: String },
    #[error("copying the plugin binary: {0}")]
    CopyBinaries(#[source] FsError),
    #[error("writing the plugin kubeconfig: {0}")]
    KubeconfigInputs(#[source] KubeconfigError),
    #[error("writing the plugin kubeconfig: creating {}: {source}", path.display())]
    RunDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing the plugin kubeconfig: {0}")]
    WriteKubeconfig(#[source] FsError),
    #[error("writing the CNI config: {0}")]
    MergeConfig(#[source] ConfError),
    #[error("writing the CNI config: {0}")]
    WriteConfig(#[source] FsError),
}

impl InstallError {
    /// Istio's metric label for this failure.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::ReadSelf { .. } | Self::NoBinDir { .. } | Self::CopyBinaries(_) => {
                "COPY_BINARIES_FAILURE"
            }
            Self::KubeconfigInputs(_) | Self::RunDir { .. } | Self::WriteKubeconfig(_) => {
                "CREATE_KUBECONFIG_FAILURE"
            }
            Self::MergeConfig(_) | Self::WriteConfig(_) => "CREATE_CNI_CONFIG_FAILURE",
        }
    }
}

/// Result of a successful pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstallPass {
    /// Everything is in place.
    Installed,
    /// Chained mode and no usable primary config exists yet: wait for one.
    WaitingForPrimary(String),
}

/// See [`Installer::inputs_fingerprint`].
pub type Fingerprint = Vec<(String, Option<FileStamp>)>;

/// Installer state across passes.
pub struct Installer {
    cfg: InstallConfig,
    istio: IstioPlugin,
    self_exe: PathBuf,
    self_mode: u32,
    /// Name (in the conf dir) of the config file we last wrote.
    last_written: Option<String>,
    /// Every chained config we put our entry into during this run (the primary can change), so
    /// cleanup leaves no stale entry pointing at a removed binary.
    touched: BTreeSet<String>,
    /// The primary config remembered by the last failed check.
    primary_hint: Option<String>,
    restore: Option<RestoreRecord>,
    /// Binary targets verified identical to us, by file version.
    verified: HashMap<PathBuf, FileStamp>,
    warned_preempted: Option<String>,
    /// Candidate symlinks already reported as dangling (reported again once fixed and broken).
    dangling_logged: BTreeSet<String>,
    /// Candidates skipped (too large, unreadable, malformed) and already reported, with why.
    skipped_logged: std::collections::BTreeMap<String, String>,
}

/// Where the guard watches, and which names in each directory matter.
#[derive(Debug, Clone)]
pub struct WatchTarget {
    pub dir: PathBuf,
    /// `None` = every file in the directory.
    pub only: Option<String>,
}

impl Installer {
    /// Creates the installer; `self_exe` is the binary installed as the plugin.
    pub fn new(cfg: InstallConfig, self_exe: PathBuf) -> Result<Self, InstallError> {
        let self_mode = fs::metadata(&self_exe)
            .map(|m| m.permissions().mode() & 0o7777)
            .map_err(|source| InstallError::ReadSelf {
                path: self_exe.clone(),
                source,
            })?;
        let istio = IstioPlugin::from_config(&cfg);
        let restore = RestoreRecord::read(&cfg.run_dir.join(RESTORE_RECORD));
        Ok(Self {
            cfg,
            istio,
            self_exe,
            self_mode,
            last_written: None,
            touched: BTreeSet::new(),
            primary_hint: None,
            restore,
            verified: HashMap::new(),
            warned_preempted: None,
            dangling_logged: BTreeSet::new(),
            skipped_logged: std::collections::BTreeMap::new(),
        })
    }

    /// Hands the node's iptables flavour to the plugin through our entry (before the first pass).
    pub fn set_iptables_flavour(&mut self, flavour: Option<String>) {
        self.istio.force_iptables_binary = flavour;
    }

    /// Full path of the config file we manage (last written), for messages.
    pub fn conf_path(&self) -> Option<PathBuf> {
        self.last_written
            .as_ref()
            .map(|n| self.cfg.mounted_cni_net_dir.join(n))
    }

    /// Directories to watch and what matters in each.
    pub fn watch_targets(&self) -> Vec<WatchTarget> {
        let mut t = vec![
            WatchTarget {
                dir: self.cfg.mounted_cni_net_dir.clone(),
                only: None,
            },
            WatchTarget {
                dir: self.cfg.service_account_dir.clone(),
                only: None,
            },
            // Istio does not watch the kubeconfig (L6); we do, so deleting it is repaired at once.
            WatchTarget {
                dir: self.cfg.run_dir.clone(),
                only: Some(super::config::KUBECONFIG_FILENAME.to_string()),
            },
        ];
        if let Some(ca_dir) = self.cfg.kube_ca_file.parent()
            && ca_dir != self.cfg.service_account_dir
        {
            t.push(WatchTarget {
                dir: ca_dir.to_path_buf(),
                only: None,
            });
        }
        for dir in &self.cfg.cni_bin_dirs {
            t.push(WatchTarget {
                dir: dir.clone(),
                only: Some(PLUGIN_BINARY.to_string()),
            });
        }
        t.extend(self.link_watch_targets());
        t
    }

    /// A config that is a symlink changes where its target lives, which the conf dir watch does
    /// not see: watch the target's directory for that one name (for a dangling link, where the
    /// target would appear, if that directory exists).
    fn link_watch_targets(&self) -> Vec<WatchTarget> {
        let Ok(entries) = fs::read_dir(self.dir()) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let wanted = super::cniconf::is_candidate_name(&name)
                || self.cfg.cni_conf_name.as_deref() == Some(name.as_str());
            if !wanted || !entry.file_type().is_ok_and(|t| t.is_symlink()) {
                continue;
            }
            let path = entry.path();
            let to = fs::canonicalize(&path)
                .or_else(|_| fs::read_link(&path).map(|l| self.dir().join(l)))
                .ok();
            if let Some((dir, file)) = to
                .as_deref()
                .and_then(|p| Some((p.parent()?, p.file_name()?)))
                && dir != self.dir()
            {
                out.push(WatchTarget {
                    dir: dir.to_path_buf(),
                    only: Some(file.to_string_lossy().into_owned()),
                });
            }
        }
        out
    }

    /// A cheap fingerprint of everything `validate` looks at (conf dir entries, token, CA,
    /// kubeconfig, installed binaries): if it is unchanged, a pass would end the same way again.
    pub fn inputs_fingerprint(&self) -> Fingerprint {
        let mut v: Vec<(String, Option<FileStamp>)> = fs::read_dir(self.dir())
            .map(|r| {
                r.flatten()
                    .map(|e| {
                        (
                            e.file_name().to_string_lossy().into_owned(),
                            FileStamp::of(&e.path()),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        let mut others = vec![
            self.cfg.service_account_dir.join("token"),
            self.cfg.kube_ca_file.clone(),
            self.cfg.kubeconfig_path(),
        ];
        others.extend(self.bin_targets());
        for p in others {
            v.push((p.display().to_string(), FileStamp::of(&p)));
        }
        v
    }

    // ---- binaries ----

    fn binary_ok(&mut self, target: &Path) -> bool {
        // A mode or owner change leaves the content alone, but an installed plugin writable by
        // others is a root exploit: it is replaced like a changed binary.
        if !Perms::are_ours(target, self.self_mode) {
            return false;
        }
        let Some(stamp) = FileStamp::of(target) else {
            return false;
        };
        if self.verified.get(target) == Some(&stamp) {
            return true;
        }
        match fsutil::same_content(&self.self_exe, target) {
            Ok(true) => {
                self.verified.insert(target.to_path_buf(), stamp);
                true
            }
            _ => false,
        }
    }

    fn bin_targets(&self) -> Vec<PathBuf> {
        self.cfg
            .cni_bin_dirs
            .iter()
            .filter(|d| d.is_dir())
            .map(|d| d.join(PLUGIN_BINARY))
            .collect()
    }

    fn copy_binaries(&mut self) -> Result<(), InstallError> {
        let targets = self.bin_targets();
        if targets.is_empty() {
            return Err(InstallError::NoBinDir {
                dirs: join_paths(&self.cfg.cni_bin_dirs),
            });
        }
        for target in targets {
            if self.binary_ok(&target) {
                continue;
            }
            fsutil::copy_atomic(&self.self_exe, &target, self.self_mode)
                .map_err(InstallError::CopyBinaries)?;
            info!(path = %target.display(), "installed the CNI plugin binary");
            if let Some(stamp) = FileStamp::of(&target) {
                self.verified.insert(target, stamp);
            }
        }
        Ok(())
    }

    // ---- kubeconfig ----

    fn kubeconfig_inputs(&self) -> Result<KubeconfigInputs, InstallError> {
        let c = &self.cfg;
        let server = kubeconfig::server_url(
            &c.k8s_service_protocol,
            c.k8s_service_host.as_deref(),
            c.k8s_service_port.as_deref(),
        )
        .map_err(InstallError::KubeconfigInputs)?;
        kubeconfig::read_inputs(
            server,
            c.skip_tls_verify,
            &c.kube_ca_file,
            &c.service_account_dir.join("token"),
        )
        .map_err(InstallError::KubeconfigInputs)
    }

    fn kubeconfig_ok(&self, expected: &str) -> bool {
        let path = self.cfg.kubeconfig_path();
        fsutil::read_bounded(&path).is_ok_and(|b| b == expected.as_bytes())
            && Perms::are_ours(&path, self.cfg.kubeconfig_mode)
    }

    fn write_kubeconfig(&self) -> Result<(), InstallError> {
        let inputs = self.kubeconfig_inputs()?;
        let text = kubeconfig::render(&inputs);
        if self.kubeconfig_ok(&text) {
            return Ok(());
        }
        fs::create_dir_all(&self.cfg.run_dir).map_err(|source| InstallError::RunDir {
            path: self.cfg.run_dir.clone(),
            source,
        })?;
        let path = self.cfg.kubeconfig_path();
        fsutil::write_atomic(&path, text.as_bytes(), self.cfg.kubeconfig_mode)
            .map_err(InstallError::WriteKubeconfig)?;
        info!(path = %path.display(), "wrote the plugin kubeconfig");
        debug!(kubeconfig = %kubeconfig::redacted(&inputs), "plugin kubeconfig content");
        Ok(())
    }

    // ---- passes ----

    /// Checks everything without writing. `Err` says what is wrong.
    pub(super) fn validate(&mut self) -> Result<(), String> {
        for target in self.bin_targets() {
            if !self.binary_ok(&target) {
                return Err(format!("{} is missing or differs", target.display()));
            }
        }
        let inputs = self.kubeconfig_inputs().map_err(|e| e.to_string())?;
        if !self.kubeconfig_ok(&kubeconfig::render(&inputs)) {
            return Err("the plugin kubeconfig is missing or stale".to_string());
        }
        let cands = self.scan();
        self.check_conf(&cands)
    }

    /// One install pass: binaries, kubeconfig, then the CNI config if it is not valid.
    pub fn install_all(&mut self) -> Result<InstallPass, InstallError> {
        self.copy_binaries()?;
        self.write_kubeconfig()?;
        let cands = self.scan();
        match self.check_conf(&cands) {
            Ok(()) => Ok(InstallPass::Installed),
            Err(reason) => {
                debug!("CNI config needs (re)writing: {reason}");
                self.create_conf(&cands)
            }
        }
    }

    /// Removes what we installed, deleting only files we created (B2) and restoring a
    /// converted primary `.conf` (L8). The configs go first; the binary only when no network
    /// attachment on the node still names it (`attachments`).
    pub fn cleanup(&mut self) {
        if let Some(name) = self.last_written.clone() {
            self.cleanup_conf(&name);
        }
        let others: Vec<String> = self
            .touched
            .iter()
            .filter(|n| Some(*n) != self.last_written.as_ref())
            .cloned()
            .collect();
        for name in others {
            self.cleanup_conf(&name);
        }
        let kc = self.cfg.kubeconfig_path();
        match fsutil::remove_if_exists(&kc) {
            Ok(true) => info!(path = %kc.display(), "removed the plugin kubeconfig"),
            Ok(false) => {}
            Err(e) => warn!("{e}"),
        }
        self.remove_binaries();
        self.set_restore(None);
    }

    /// The plugin binaries, unless a network attachment on the node still names the plugin.
    fn remove_binaries(&self) {
        // Our entries are gone from every config, so no new sandbox is set up with the plugin;
        // a sandbox set up earlier still gets its DEL through the runtime's cached config, and
        // that DEL fails (the pod stays Terminating) if the binary is gone.
        if let Some(why) =
            super::attachments::binary_still_needed(&self.cfg.results_dir, self.dir())
        {
            info!(
                "leaving the CNI plugin binary in place ({why}): the runtime still calls it for \
                 DEL; no CNI config of ours names it any more"
            );
            return;
        }
        for dir in &self.cfg.cni_bin_dirs {
            let bin = dir.join(PLUGIN_BINARY);
            match fsutil::remove_if_exists(&bin) {
                Ok(true) => info!(path = %bin.display(), "removed the CNI plugin binary"),
                Ok(false) => {}
                Err(e) => warn!("{e}"),
            }
        }
    }
}

/// The plugin's log files in the run dir. They hold pod annotation values, so an uninstall
/// removes them with the rest; an upgrade (the node's config kept) keeps them.
pub const PLUGIN_LOGS: [&str; 2] = ["istio-cni.log", "istio-cni.log.1"];

/// What an uninstall leaves in the run dir once every server has stopped: the plugin's log files,
/// and the pod-facts socket's directory when it is empty (its socket went with its server).
pub fn remove_run_dir_leftovers(run_dir: &Path) {
    for name in PLUGIN_LOGS {
        let path = run_dir.join(name);
        match fsutil::remove_if_exists(&path) {
            Ok(true) => info!(path = %path.display(), "removed the plugin log"),
            Ok(false) => {}
            Err(e) => warn!("{e}"),
        }
    }
    let sockets = crate::wire::pod_facts::socket_path(run_dir);
    if let Some(dir) = sockets.parent()
        && fs::remove_dir(dir).is_ok()
    {
        info!(path = %dir.display(), "removed the pod-facts socket directory");
    }
}

fn join_paths(p: &[PathBuf]) -> String {
    p.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
