//! The install pass, its validity check and cleanup — the file effects around the pure logic in
//! `cniconf` and `kubeconfig`.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tracing::{debug, info, warn};

use super::cniconf::{self, Candidate, IstioPlugin, Kind};
use super::config::{DEFAULT_STANDALONE_FILENAME, InstallConfig, PLUGIN_BINARY};
use super::fsutil::{self, FileStamp, FsError};
use super::kubeconfig::{self, KubeconfigInputs};

/// Name of the record that lets cleanup restore a primary `.conf` we converted (L8). It lives in
/// the run dir so a restarted agent still knows it.
pub const RESTORE_RECORD: &str = "istio-cni-restore.json";

/// Why an install pass failed; the variant is the `result` label of `istio_cni_installs_total`.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("copying the plugin binary: {0}")]
    CopyBinaries(String),
    #[error("writing the plugin kubeconfig: {0}")]
    Kubeconfig(String),
    #[error("writing the CNI config: {0}")]
    CniConfig(String),
}

impl InstallError {
    /// Istio's metric label for this failure.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::CopyBinaries(_) => "COPY_BINARIES_FAILURE",
            Self::Kubeconfig(_) => "CREATE_KUBECONFIG_FAILURE",
            Self::CniConfig(_) => "CREATE_CNI_CONFIG_FAILURE",
        }
    }
}

/// Result of a successful pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Everything is in place.
    Installed,
    /// Chained mode and no usable primary config exists yet: wait for one.
    WaitingForPrimary(String),
}

/// What cleanup needs to put a converted primary `.conf` back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct RestoreRecord {
    /// The `.conflist` we wrote in place of the original.
    conflist: String,
    /// The original file name.
    original: String,
    /// The original content.
    content: String,
    mode: u32,
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
            .map_err(|e| {
                InstallError::CopyBinaries(format!("reading {}: {e}", self_exe.display()))
            })?;
        let istio = IstioPlugin::from_config(&cfg);
        let restore = fs::read(cfg.run_dir.join(RESTORE_RECORD))
            .ok()
            .and_then(|b| serde_json::from_slice::<RestoreRecord>(&b).ok());
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
        })
    }

    /// The config this installer works with.
    pub fn config(&self) -> &InstallConfig {
        &self.cfg
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
        t
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
            return Err(InstallError::CopyBinaries(format!(
                "none of the CNI bin directories exists: {}",
                join_paths(&self.cfg.cni_bin_dirs)
            )));
        }
        for target in targets {
            if self.binary_ok(&target) {
                continue;
            }
            fsutil::copy_atomic(&self.self_exe, &target, self.self_mode)
                .map_err(|e| InstallError::CopyBinaries(e.to_string()))?;
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
        .map_err(|e| InstallError::Kubeconfig(e.to_string()))?;
        kubeconfig::read_inputs(
            server,
            c.skip_tls_verify,
            &c.kube_ca_file,
            &c.service_account_dir.join("token"),
        )
        .map_err(|e| InstallError::Kubeconfig(e.to_string()))
    }

    fn kubeconfig_ok(&self, expected: &str) -> bool {
        let path = self.cfg.kubeconfig_path();
        fs::read(&path).is_ok_and(|b| b == expected.as_bytes())
            && fsutil::mode_of(&path) == Some(self.cfg.kubeconfig_mode)
    }

    fn write_kubeconfig(&self) -> Result<(), InstallError> {
        let inputs = self.kubeconfig_inputs()?;
        let text = kubeconfig::render(&inputs);
        if self.kubeconfig_ok(&text) {
            return Ok(());
        }
        fs::create_dir_all(&self.cfg.run_dir).map_err(|e| {
            InstallError::Kubeconfig(format!("creating {}: {e}", self.cfg.run_dir.display()))
        })?;
        let path = self.cfg.kubeconfig_path();
        fsutil::write_atomic(&path, text.as_bytes(), self.cfg.kubeconfig_mode)
            .map_err(|e| InstallError::Kubeconfig(e.to_string()))?;
        info!(path = %path.display(), "wrote the plugin kubeconfig");
        debug!(kubeconfig = %kubeconfig::redacted(&inputs), "plugin kubeconfig content");
        Ok(())
    }

    // ---- CNI config ----

    fn dir(&self) -> &Path {
        &self.cfg.mounted_cni_net_dir
    }

    /// Valid candidates, highest priority first (one read per file, so checks and merges see
    /// the same bytes).
    fn scan(&self) -> Vec<Candidate> {
        let Ok(entries) = fs::read_dir(self.dir()) else {
            return Vec::new();
        };
        let mut names: Vec<String> = entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| cniconf::is_candidate_name(n))
            .collect();
        names.sort();
        names
            .into_iter()
            .filter_map(|name| {
                let bytes = fs::read(self.dir().join(&name)).ok()?;
                match cniconf::classify(&name, &bytes) {
                    Ok(c) => Some(c),
                    Err(e) => {
                        debug!("skipping CNI config: {e}");
                        None
                    }
                }
            })
            .collect()
    }

    /// Reads one named file for an explicitly configured primary (any name works then).
    fn read_named(&self, name: &str) -> Option<Candidate> {
        let bytes = fs::read(self.dir().join(name)).ok()?;
        cniconf::classify(name, &bytes).ok().or_else(|| {
            // A name without a CNI extension: decide by content.
            let v: Value = serde_json::from_slice(&bytes).ok()?;
            let kind = if v.get("plugins").is_some() {
                Kind::List
            } else if v.get("type").is_some() {
                Kind::Single
            } else {
                return None;
            };
            Some(Candidate {
                name: name.to_string(),
                kind,
                value: v,
                bytes,
            })
        })
    }

    /// §2.4 steps 1-3: is the highest-priority file ours? Remembers the primary when it is not.
    fn check_priority(
        &mut self,
        cands: &[Candidate],
        first: &Candidate,
        ours: Option<&str>,
    ) -> Result<(), String> {
        let owned = self.cfg.owned_mode();
        if owned && first.name != self.cfg.owned_filename {
            if self.cfg.owned_filename > first.name {
                warn!(
                    "{} sorts before our owned config {}: pods could bypass istio-cni; \
                     choose an owned file name that sorts first",
                    first.name, self.cfg.owned_filename
                );
            }
            if self.cfg.cni_conf_name.is_none() {
                self.primary_hint = Some(first.name.clone());
            }
            return Err(format!(
                "{} has priority over {}",
                first.name, self.cfg.owned_filename
            ));
        }
        if ours == Some(first.name.as_str()) {
            return Ok(());
        }
        if self.cfg.cni_conf_name.is_some() || !self.cfg.chained {
            if ours.is_some() && self.warned_preempted.as_deref() != Some(first.name.as_str()) {
                warn!(
                    "CNI config {} has priority over ours (intentional preemption?)",
                    first.name
                );
                self.warned_preempted = Some(first.name.clone());
            }
            return Ok(());
        }
        let primary = if owned && first.name == self.cfg.owned_filename {
            cands.get(1)
        } else {
            Some(first)
        };
        self.primary_hint = primary.map(|c| c.name.clone());
        Err(format!(
            "{} is the highest-priority config, not ours",
            first.name
        ))
    }

    /// §2.4 check. Remembers the primary when the answer is "invalid".
    fn check_conf(&mut self, cands: &[Candidate]) -> Result<(), String> {
        let owned = self.cfg.owned_mode();
        let ours = self.last_written.clone();
        match cands.first() {
            // An explicitly named file may have any name (not a candidate): check it directly.
            None if self.cfg.cni_conf_name.is_some() && !owned => {}
            None => {
                return Err(format!(
                    "no valid networks found in {}",
                    self.dir().display()
                ));
            }
            Some(first) => self.check_priority(cands, first, ours.as_deref())?,
        }
        let Some(ours) = ours else {
            return Err("our config is not written yet".to_string());
        };
        let our = match cands.iter().find(|c| c.name == ours) {
            Some(c) => c.clone(),
            None => self
                .read_named(&ours)
                .ok_or_else(|| format!("our config {ours} is missing or invalid"))?,
        };
        if !self.cfg.chained {
            return cniconf::check_standalone(&our.value, &self.istio);
        }
        cniconf::check_chained(&our.value, &self.istio)?;
        if owned {
            let primary_name = self
                .cfg
                .cni_conf_name
                .clone()
                .or_else(|| self.primary_hint.clone())
                .or_else(|| cands.get(1).map(|c| c.name.clone()))
                .ok_or("the primary config is gone")?;
            self.primary_hint = Some(primary_name.clone());
            let primary = cands
                .iter()
                .find(|c| c.name == primary_name)
                .cloned()
                .or_else(|| self.read_named(&primary_name))
                .ok_or_else(|| format!("the primary config {primary_name} is gone"))?;
            cniconf::check_owned_copy(&our.value, &primary)?;
        }
        Ok(())
    }

    fn conf_mode(&self) -> u32 {
        if self.cfg.cni_conf_group_read {
            0o640
        } else {
            0o600
        }
    }

    /// Finds the primary to merge into: the configured name, the remembered one, or the first
    /// valid file; `.conf` and `.conflist` stand in for each other.
    fn find_primary(&self, cands: &[Candidate]) -> Option<Candidate> {
        let owned_name = &self.cfg.owned_filename;
        let wanted = self.cfg.cni_conf_name.clone().or_else(|| {
            self.primary_hint
                .clone()
                .filter(|h| cands.iter().any(|c| &c.name == h))
                .or_else(|| {
                    cands
                        .iter()
                        .find(|c| !(self.cfg.owned_mode() && &c.name == owned_name))
                        .map(|c| c.name.clone())
                })
        })?;
        let lookup = |name: &str| {
            cands
                .iter()
                .find(|c| c.name == name)
                .cloned()
                .or_else(|| self.read_named(name))
        };
        if let Some(c) = lookup(&wanted) {
            return Some(c);
        }
        let swapped = if let Some(stem) = wanted.strip_suffix(".conflist") {
            format!("{stem}.conf")
        } else if let Some(stem) = wanted.strip_suffix(".conf") {
            format!("{stem}.conflist")
        } else {
            return None;
        };
        lookup(&swapped)
    }

    fn create_conf(&mut self, cands: &[Candidate]) -> Result<Outcome, InstallError> {
        let err = |e: String| InstallError::CniConfig(e);
        if !self.cfg.chained {
            let name = self
                .cfg
                .cni_conf_name
                .clone()
                .unwrap_or_else(|| DEFAULT_STANDALONE_FILENAME.to_string());
            let path = self.dir().join(&name);
            fsutil::write_atomic(&path, &self.istio.standalone_bytes(), self.conf_mode())
                .map_err(|e| err(e.to_string()))?;
            info!(path = %path.display(), "wrote the standalone istio-cni config");
            self.last_written = Some(name);
            return Ok(Outcome::Installed);
        }
        let Some(primary) = self.find_primary(cands) else {
            let what = match &self.cfg.cni_conf_name {
                Some(n) => format!(
                    "waiting for the primary CNI config {n} in {}",
                    self.dir().display()
                ),
                None => format!(
                    "waiting for a valid primary CNI config in {}",
                    self.dir().display()
                ),
            };
            return Ok(Outcome::WaitingForPrimary(what));
        };
        let merged = cniconf::insert(&primary.name, &primary.value, &self.istio)
            .map_err(|e| err(e.to_string()))?;
        let bytes = cniconf::marshal(&merged);
        let owned = self.cfg.owned_mode();
        let primary_path = self.dir().join(&primary.name);
        let converts = !owned
            && primary.kind == Kind::Single
            && (primary.name.ends_with(".conf") || primary.name.ends_with(".json"));
        let target_name = if owned {
            self.cfg.owned_filename.clone()
        } else if converts {
            let stem = primary
                .name
                .rsplit_once('.')
                .map_or(primary.name.as_str(), |(s, _)| s);
            format!("{stem}.conflist")
        } else {
            primary.name.clone()
        };
        let target = self.dir().join(&target_name);
        let mode = if owned {
            self.conf_mode()
        } else {
            fsutil::mode_of(&primary_path).unwrap_or(self.conf_mode())
        };
        fsutil::write_atomic(&target, &bytes, mode).map_err(|e| err(e.to_string()))?;
        if converts {
            // Written first, removed second: there is never a moment without a config.
            fsutil::remove_if_exists(&primary_path).map_err(|e| err(e.to_string()))?;
            self.set_restore(Some(RestoreRecord {
                conflist: target_name.clone(),
                original: primary.name.clone(),
                content: String::from_utf8_lossy(&primary.bytes).into_owned(),
                mode,
            }));
        } else if !owned
            && primary.kind == Kind::List
            && self
                .restore
                .as_ref()
                .is_some_and(|r| r.conflist == primary.name)
            && cniconf::remove(&primary.name, &primary.value)
                .ok()
                .flatten()
                .is_none()
        {
            // The owner rewrote the list itself: there is no `.conf` to restore any more.
            self.set_restore(None);
        }
        info!(path = %target.display(), primary = %primary.name, "wrote the istio-cni entry into the CNI config");
        if !owned {
            self.touched.insert(target_name.clone());
        }
        self.last_written = Some(target_name);
        Ok(Outcome::Installed)
    }

    fn set_restore(&mut self, record: Option<RestoreRecord>) {
        if self.restore == record {
            return;
        }
        let path = self.cfg.run_dir.join(RESTORE_RECORD);
        let res = match &record {
            Some(r) => fs::create_dir_all(&self.cfg.run_dir)
                .map_err(|e| FsError::new("creating", &self.cfg.run_dir, e))
                .and_then(|_| {
                    let bytes = serde_json::to_vec(r).unwrap_or_default();
                    fsutil::write_atomic(&path, &bytes, 0o600)
                }),
            None => fsutil::remove_if_exists(&path).map(|_| ()),
        };
        if let Err(e) = res {
            warn!("keeping the original-config record failed (cleanup may not restore it): {e}");
        }
        self.restore = record;
    }

    // ---- passes ----

    /// Checks everything without writing. `Err` says what is wrong.
    pub fn validate(&mut self) -> Result<(), String> {
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

    /// One install pass (§2.3): binaries, kubeconfig, then the CNI config if it is not valid.
    pub fn install_all(&mut self) -> Result<Outcome, InstallError> {
        self.copy_binaries()?;
        self.write_kubeconfig()?;
        let cands = self.scan();
        match self.check_conf(&cands) {
            Ok(()) => Ok(Outcome::Installed),
            Err(reason) => {
                debug!("CNI config needs (re)writing: {reason}");
                self.create_conf(&cands)
            }
        }
    }

    /// Removes what we installed (§2.10), deleting only files we created (B2) and restoring a
    /// converted primary `.conf` (L8).
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
        for dir in &self.cfg.cni_bin_dirs {
            let bin = dir.join(PLUGIN_BINARY);
            match fsutil::remove_if_exists(&bin) {
                Ok(true) => info!(path = %bin.display(), "removed the CNI plugin binary"),
                Ok(false) => {}
                Err(e) => warn!("{e}"),
            }
        }
        self.set_restore(None);
    }

    fn cleanup_conf(&mut self, name: &str) {
        let path = self.dir().join(name);
        let Ok(bytes) = fs::read(&path) else {
            return;
        };
        let Ok(value) = serde_json::from_slice::<Value>(&bytes) else {
            warn!(path = %path.display(), "not cleaning up: the file is not valid JSON");
            return;
        };
        let created_by_us = if !self.cfg.chained {
            value.get("type").and_then(Value::as_str) == Some(cniconf::ISTIO_TYPE)
        } else if self.cfg.owned_mode() {
            // The owned file is ours by name; an edited entry must not leave it behind.
            name == self.cfg.owned_filename && cniconf::has_istio_entry(&value)
        } else {
            false
        };
        if !self.cfg.chained || self.cfg.owned_mode() {
            if created_by_us {
                match fsutil::remove_if_exists(&path) {
                    Ok(_) => info!(path = %path.display(), "removed our CNI config"),
                    Err(e) => warn!("{e}"),
                }
            } else {
                warn!(path = %path.display(), "not removing a CNI config we did not create");
            }
            return;
        }
        let remaining = match cniconf::remove(name, &value) {
            Ok(Some(v)) => v,
            Ok(None) => return,
            Err(e) => {
                warn!("not cleaning up: {e}");
                return;
            }
        };
        if let Some(rec) = self.restore.clone().filter(|r| r.conflist == name)
            && self.unchanged_since_conversion(&rec, &remaining)
        {
            let original = self.dir().join(&rec.original);
            match fsutil::write_atomic(&original, rec.content.as_bytes(), rec.mode)
                .and_then(|_| fsutil::remove_if_exists(&path).map(|_| ()))
            {
                Ok(()) => info!(path = %original.display(), "restored the original CNI config"),
                Err(e) => warn!("restoring the original CNI config: {e}"),
            }
            return;
        }
        let mode = fsutil::mode_of(&path).unwrap_or(0o600);
        match fsutil::write_atomic(&path, &cniconf::marshal(&remaining), mode) {
            Ok(()) => {
                info!(path = %path.display(), "removed the istio-cni entry from the CNI config")
            }
            Err(e) => warn!("{e}"),
        }
    }

    /// Whether the list (without our entry) is still exactly what converting the original gave.
    fn unchanged_since_conversion(&self, rec: &RestoreRecord, remaining: &Value) -> bool {
        let Ok(orig) = cniconf::classify(&rec.original, rec.content.as_bytes()) else {
            return false;
        };
        cniconf::insert(&rec.original, &orig.value, &self.istio)
            .ok()
            .and_then(|v| cniconf::remove(&rec.conflist, &v).ok().flatten())
            .is_some_and(|v| &v == remaining)
    }
}

fn join_paths(p: &[PathBuf]) -> String {
    p.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::install::config::LogLevel;

    const TD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/testdata/install/");

    struct Env {
        _tmp: tempfile::TempDir,
        net: PathBuf,
        bin: PathBuf,
        cfg: InstallConfig,
        exe: PathBuf,
    }

    fn env() -> Env {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().to_path_buf();
        let (net, bin, sa) = (root.join("net"), root.join("bin"), root.join("sa"));
        for d in [&net, &bin, &sa] {
            fs::create_dir_all(d).expect("mkdir");
        }
        fs::copy(format!("{TD}kube-ca.crt"), sa.join("ca.crt")).expect("ca");
        fs::write(sa.join("token"), "service_account_token_string").expect("token");
        let exe = root.join("exe");
        fs::write(&exe, b"#!/bin/true\n").expect("exe");
        fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).expect("chmod");
        let cfg = InstallConfig {
            mounted_cni_net_dir: net.clone(),
            cni_conf_name: None,
            chained: true,
            istio_owned_cni_config: false,
            owned_filename: "02-istio-conf.conflist".to_string(),
            cni_bin_dirs: vec![bin.clone(), root.join("missing-bin")],
            run_dir: PathBuf::from("/path/to/kubeconfig"),
            kubeconfig_mode: 0o600,
            cni_conf_group_read: false,
            kube_ca_file: sa.join("ca.crt"),
            skip_tls_verify: false,
            service_account_dir: sa,
            k8s_service_host: Some("10.96.0.1".to_string()),
            k8s_service_port: Some("443".to_string()),
            k8s_service_protocol: "https".to_string(),
            ambient_enabled: false,
            enable_ambient_detection_retry: false,
            native_nftables: false,
            exclude_namespaces: vec![],
            pod_namespace: "my-namespace".to_string(),
            enablement_selectors: vec![],
            plugin_log_level: LogLevel::Debug,
            ambient_disable_safe_upgrade: false,
            node_name: String::new(),
        };
        Env {
            _tmp: tmp,
            net,
            bin,
            cfg,
            exe,
        }
    }

    /// The goldens embed `cni_agent_run_dir: /path/to/kubeconfig`; the kubeconfig itself must go
    /// somewhere writable, so the run dir is swapped after building the plugin entry.
    fn installer(e: &Env) -> Installer {
        let mut i = Installer::new(e.cfg.clone(), e.exe.clone()).expect("installer");
        i.cfg.run_dir = e.net.parent().expect("root").join("run");
        i
    }

    fn golden(name: &str) -> String {
        fs::read_to_string(format!("{TD}{name}")).expect("golden")
    }

    fn put(e: &Env, name: &str, src: &str) {
        fs::copy(format!("{TD}{src}"), e.net.join(name)).expect("copy input");
    }

    fn read(e: &Env, name: &str) -> String {
        fs::read_to_string(e.net.join(name)).unwrap_or_else(|err| panic!("{name}: {err}"))
    }

    #[test]
    fn merges_into_the_first_list_and_installs_everything() {
        let e = env();
        put(&e, "10-list.conflist", "list.conflist");
        put(&e, "20-bridge.conf", "bridge.conf");
        let mut i = installer(&e);
        assert_eq!(i.install_all().expect("installs"), Outcome::Installed);
        pretty_assertions::assert_eq!(read(&e, "10-list.conflist"), golden("list.conflist.golden"));
        assert!(fsutil::same_content(&e.exe, &e.bin.join("istio-cni")).expect("cmp"));
        let kc = fs::read_to_string(i.cfg.kubeconfig_path()).expect("kubeconfig");
        pretty_assertions::assert_eq!(kc, golden("kubeconfig-tls"));
        assert_eq!(i.validate(), Ok(()));
    }

    #[test]
    fn single_conf_becomes_conflist_and_is_restored() {
        let e = env();
        put(&e, "10-bridge.conf", "bridge.conf");
        let mut i = installer(&e);
        i.install_all().expect("installs");
        assert!(!e.net.join("10-bridge.conf").exists());
        pretty_assertions::assert_eq!(read(&e, "10-bridge.conflist"), golden("bridge.conf.golden"));
        assert_eq!(i.validate(), Ok(()));
        i.cleanup();
        assert!(!e.net.join("10-bridge.conflist").exists());
        assert_eq!(read(&e, "10-bridge.conf"), golden("bridge.conf"));
        assert!(!e.bin.join("istio-cni").exists());
        assert!(!i.cfg.kubeconfig_path().exists());
    }

    #[test]
    fn named_primary_variants() {
        for (name, src) in [
            ("list.conflist", "list.conflist"),
            ("list.conf", "list.conflist"),
            ("undetectable.file", "list.conflist"),
        ] {
            let e = env();
            let file = if name == "list.conf" {
                "list.conflist"
            } else {
                name
            };
            put(&e, file, src);
            let mut cfg = e.cfg.clone();
            cfg.cni_conf_name = Some(name.to_string());
            let mut i = Installer::new(cfg, e.exe.clone()).expect("installer");
            i.cfg.run_dir = e.net.parent().expect("root").join("run");
            i.install_all().expect("installs");
            pretty_assertions::assert_eq!(
                read(&e, file),
                golden("list.conflist.golden"),
                "case {name}"
            );
            assert_eq!(
                i.validate(),
                Ok(()),
                "case {name}: the result must validate"
            );
        }
    }

    #[test]
    fn named_bridge_conflist_falls_back_to_conf() {
        let e = env();
        put(&e, "bridge.conf", "bridge.conf");
        let mut cfg = e.cfg.clone();
        cfg.cni_conf_name = Some("bridge.conflist".to_string());
        let mut i = Installer::new(cfg, e.exe.clone()).expect("installer");
        i.cfg.run_dir = e.net.parent().expect("root").join("run");
        i.install_all().expect("installs");
        pretty_assertions::assert_eq!(read(&e, "bridge.conflist"), golden("bridge.conf.golden"));
    }

    #[test]
    fn replaces_an_old_entry_and_cleanup_matches_golden() {
        let e = env();
        put(&e, "10-list.conflist", "list-with-istio.conflist");
        let mut i = installer(&e);
        i.install_all().expect("installs");
        pretty_assertions::assert_eq!(
            read(&e, "10-list.conflist"),
            golden("list-with-istio.conflist.golden")
        );
        i.cleanup();
        pretty_assertions::assert_eq!(
            read(&e, "10-list.conflist"),
            golden("list-no-istio.conflist")
        );
    }

    #[test]
    fn owned_mode_writes_a_separate_file_and_deletes_only_it() {
        for (src, golden_name) in [
            ("list.conflist", "istio-owned.conflist.golden"),
            ("bridge.conf", "istio-owned-bridge.conflist.golden"),
        ] {
            let e = env();
            put(&e, &format!("10-{src}"), src);
            let mut cfg = e.cfg.clone();
            cfg.istio_owned_cni_config = true;
            cfg.ambient_enabled = true;
            let mut i = Installer::new(cfg, e.exe.clone()).expect("installer");
            i.cfg.run_dir = e.net.parent().expect("root").join("run");
            i.install_all().expect("installs");
            pretty_assertions::assert_eq!(read(&e, "02-istio-conf.conflist"), golden(golden_name));
            assert_eq!(
                read(&e, &format!("10-{src}")),
                golden(src),
                "primary untouched"
            );
            assert_eq!(i.validate(), Ok(()));
            // L9: a content change in the primary invalidates our copy.
            let changed = golden(src).replace("cni0", "cni1");
            fs::write(e.net.join(format!("10-{src}")), changed).expect("edit");
            assert!(i.validate().is_err());
            i.install_all().expect("reinstalls");
            assert!(read(&e, "02-istio-conf.conflist").contains("cni1"));
            i.cleanup();
            assert!(!e.net.join("02-istio-conf.conflist").exists());
            assert!(e.net.join(format!("10-{src}")).exists());
        }
    }

    #[test]
    fn owned_flag_without_ambient_never_deletes_the_primary() {
        // Istio bug B2: cleanup deleted the primary here.
        let e = env();
        put(&e, "10-list.conflist", "list.conflist");
        let mut cfg = e.cfg.clone();
        cfg.istio_owned_cni_config = true;
        let mut i = Installer::new(cfg, e.exe.clone()).expect("installer");
        i.cfg.run_dir = e.net.parent().expect("root").join("run");
        i.install_all().expect("installs");
        pretty_assertions::assert_eq!(read(&e, "10-list.conflist"), golden("list.conflist.golden"));
        i.cleanup();
        pretty_assertions::assert_eq!(
            read(&e, "10-list.conflist"),
            String::from_utf8(cniconf::marshal(
                &serde_json::from_str::<Value>(&golden("list.conflist")).expect("json")
            ))
            .expect("utf8")
        );
    }

    #[test]
    fn standalone_default_and_named() {
        for name in [None, Some("specific-name.conf")] {
            let e = env();
            let mut cfg = e.cfg.clone();
            cfg.chained = false;
            cfg.cni_conf_name = name.map(str::to_string);
            let mut i = Installer::new(cfg, e.exe.clone()).expect("installer");
            i.cfg.run_dir = e.net.parent().expect("root").join("run");
            i.install_all().expect("installs");
            let file = name.unwrap_or("YYY-istio-cni.conf");
            pretty_assertions::assert_eq!(read(&e, file), golden("istio-cni.conf"));
            assert_eq!(i.validate(), Ok(()));
            i.cleanup();
            assert!(!e.net.join(file).exists());
        }
    }

    #[test]
    fn waits_without_a_primary_and_detects_preemption() {
        let e = env();
        let mut i = installer(&e);
        assert!(matches!(i.install_all(), Ok(Outcome::WaitingForPrimary(_))));
        put(&e, "10-list.conflist", "list.conflist");
        i.install_all().expect("installs");
        assert_eq!(i.validate(), Ok(()));
        put(&e, "05-other.conflist", "list.conflist");
        assert!(i.validate().is_err(), "a higher-priority file preempts us");
        i.install_all().expect("reinstalls");
        assert_eq!(i.validate(), Ok(()));
        pretty_assertions::assert_eq!(
            read(&e, "05-other.conflist"),
            golden("list.conflist.golden")
        );
    }

    #[test]
    fn cleanup_removes_our_entry_from_every_primary_we_used() {
        let e = env();
        put(&e, "10-list.conflist", "list.conflist");
        let mut i = installer(&e);
        i.install_all().expect("installs");
        put(&e, "05-other.conflist", "list.conflist");
        assert!(i.validate().is_err());
        i.install_all().expect("moves to the new primary");
        assert!(
            read(&e, "10-list.conflist").contains("istio-cni"),
            "the old one keeps its entry meanwhile"
        );
        i.cleanup();
        for f in ["05-other.conflist", "10-list.conflist"] {
            pretty_assertions::assert_eq!(read(&e, f), golden("list-no-istio.conflist"), "{f}");
        }
    }

    #[test]
    fn invalid_files_sorting_first_are_skipped() {
        let e = env();
        fs::write(e.net.join("00-garbage.conf"), "not json").expect("w");
        fs::write(e.net.join("01-empty.conflist"), "").expect("w");
        fs::write(e.net.join("02-notype.conf"), r#"{"name":"x"}"#).expect("w");
        fs::write(
            e.net.join("03-noname.conflist"),
            r#"{"plugins":[{"type":"x"}]}"#,
        )
        .expect("w");
        fs::write(e.net.join("04-noplugins.conflist"), r#"{"name":"x"}"#).expect("w");
        fs::write(e.net.join("05-ignored.txt"), r#"{"type":"x"}"#).expect("w");
        put(&e, "10-list.conflist", "list.conflist");
        let mut i = installer(&e);
        i.install_all().expect("installs");
        pretty_assertions::assert_eq!(read(&e, "10-list.conflist"), golden("list.conflist.golden"));
        assert_eq!(read(&e, "00-garbage.conf"), "not json", "never touched");
        assert_eq!(i.validate(), Ok(()));
    }

    #[test]
    fn a_named_primary_that_appears_later_is_waited_for() {
        let e = env();
        put(&e, "05-other.conflist", "list.conflist");
        let mut cfg = e.cfg.clone();
        cfg.cni_conf_name = Some("10-list.conflist".to_string());
        let mut i = Installer::new(cfg, e.exe.clone()).expect("installer");
        i.cfg.run_dir = e.net.parent().expect("root").join("run");
        assert!(
            matches!(i.install_all(), Ok(Outcome::WaitingForPrimary(w)) if w.contains("10-list.conflist"))
        );
        put(&e, "10-list.conf", "list.conflist");
        // The .conf variant stands in for the named .conflist.
        i.install_all().expect("installs");
        assert!(read(&e, "10-list.conf").contains("istio-cni"));
        assert_eq!(
            read(&e, "05-other.conflist"),
            golden("list.conflist"),
            "intentionally preempting file untouched"
        );
        assert_eq!(i.validate(), Ok(()));
    }

    #[test]
    fn missing_or_empty_conf_dir_waits() {
        let e = env();
        let mut i = installer(&e);
        fs::remove_dir(&e.net).expect("rm dir");
        assert!(matches!(i.install_all(), Ok(Outcome::WaitingForPrimary(_))));
        fs::create_dir(&e.net).expect("mkdir");
        assert!(matches!(i.install_all(), Ok(Outcome::WaitingForPrimary(_))));
    }

    #[test]
    fn token_rotation_and_binary_changes_invalidate() {
        let e = env();
        put(&e, "10-list.conflist", "list.conflist");
        let mut i = installer(&e);
        i.install_all().expect("installs");
        fs::write(e.cfg.service_account_dir.join("token"), "bar").expect("rotate");
        assert!(i.validate().is_err());
        i.install_all().expect("reinstalls");
        assert!(
            fs::read_to_string(i.cfg.kubeconfig_path())
                .expect("kc")
                .contains("token: bar\n")
        );
        fs::write(e.bin.join("istio-cni"), b"other").expect("tamper");
        assert!(i.validate().is_err());
        i.install_all().expect("reinstalls");
        assert_eq!(i.validate(), Ok(()));
    }

    #[test]
    fn json_files_count_in_priority_order() {
        let e = env();
        fs::write(
            e.net.join("05-first.json"),
            r#"{"cniVersion":"0.4.0","name":"n","type":"bridge"}"#,
        )
        .expect("json");
        put(&e, "10-list.conflist", "list.conflist");
        let mut i = installer(&e);
        i.install_all().expect("installs");
        assert!(!e.net.join("05-first.json").exists());
        assert!(read(&e, "05-first.conflist").contains("istio-cni"));
        assert_eq!(read(&e, "10-list.conflist"), golden("list.conflist"));
        i.cleanup();
        assert!(e.net.join("05-first.json").exists());
        assert!(!e.net.join("05-first.conflist").exists());
    }
}
