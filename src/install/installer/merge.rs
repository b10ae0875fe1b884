//! Writing our entry: finding the primary and merging into it.

use std::fs;

use tracing::info;

use super::{InstallError, InstallPass, Installer, RestoreRecord};
use crate::install::cniconf::{self, Candidate, Kind};
use crate::install::config::DEFAULT_STANDALONE_FILENAME;
use crate::install::fsutil;

impl Installer {
    pub(super) fn conf_mode(&self) -> u32 {
        if self.cfg.cni_conf_group_read {
            0o640
        } else {
            0o600
        }
    }

    /// Finds the primary to merge into: the configured name, the remembered one, or the first
    /// valid file; `.conf` and `.conflist` stand in for each other.
    pub(super) fn find_primary(&self, cands: &[Candidate]) -> Option<Candidate> {
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

    pub(super) fn create_conf(&mut self, cands: &[Candidate]) -> Result<InstallPass, InstallError> {
        if !self.cfg.chained {
            let name = self
                .cfg
                .cni_conf_name
                .clone()
                .unwrap_or_else(|| DEFAULT_STANDALONE_FILENAME.to_string());
            let path = self.dir().join(&name);
            fsutil::write_atomic_following(&path, &self.istio.standalone_bytes(), self.conf_mode())
                .map_err(InstallError::WriteConfig)?;
            info!(path = %path.display(), "wrote the standalone istio-cni config");
            self.last_written = Some(name);
            return Ok(InstallPass::Installed);
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
            return Ok(InstallPass::WaitingForPrimary(what));
        };
        let merged = cniconf::insert(&primary.name, &primary.value, &self.istio)
            .map_err(InstallError::MergeConfig)?;
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
        // A symlinked config is written where the link points (the link is kept). A converted
        // `.conf` link is different: a list cannot live under a `.conf` name, so our `.conflist`
        // is a file of its own, the link is removed (its target untouched) and comes back on
        // cleanup.
        let primary_link = fs::symlink_metadata(&primary_path)
            .is_ok_and(|m| m.file_type().is_symlink())
            .then(|| fs::read_link(&primary_path).ok())
            .flatten();
        // A conversion is recorded before anything changes: killed at any later step, the next
        // install-cni still knows which `.conf` to give back (tests/install_crash.rs).
        if converts {
            self.set_restore(Some(RestoreRecord {
                conflist: target_name.clone(),
                original: primary.name.clone(),
                content: String::from_utf8_lossy(&primary.bytes).into_owned(),
                mode,
                link: primary_link,
            }));
        }
        let written = fsutil::write_atomic_following(&target, &bytes, mode)
            .map_err(InstallError::WriteConfig)?;
        if converts {
            // Written first, removed second: there is never a moment without a config.
            fsutil::remove_if_exists(&primary_path).map_err(InstallError::WriteConfig)?;
        }
        // A list we converted that lost our entry keeps its restore record: whether the `.conf`
        // comes back is decided at cleanup, from the list's content then (see `restore`).
        if written == target {
            info!(path = %target.display(), primary = %primary.name, "wrote the istio-cni entry into the CNI config");
        } else {
            info!(path = %target.display(), written = %written.display(), primary = %primary.name, "wrote the istio-cni entry into the CNI config (through its symlink)");
        }
        if !owned {
            self.touched.insert(target_name.clone());
        }
        self.last_written = Some(target_name);
        Ok(InstallPass::Installed)
    }
}
