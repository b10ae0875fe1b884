//! Which file is the primary, and is what we wrote still valid?

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

use serde_json::Value;
use tracing::{debug, warn};

use super::Installer;
use crate::install::cniconf::{self, Candidate, Kind};
use crate::install::fsutil::{self, Perms};

impl Installer {
    // ---- CNI config ----

    pub(super) fn dir(&self) -> &Path {
        &self.cfg.mounted_cni_net_dir
    }

    /// Valid candidates, highest priority first (one read per file, so checks and merges see
    /// the same bytes). Symlinks count as the file they point to, as for libcni; a dangling one
    /// is skipped and named in a warning (once while it stays dangling).
    pub(super) fn scan(&mut self) -> Vec<Candidate> {
        let Ok(entries) = fs::read_dir(self.dir()) else {
            return Vec::new();
        };
        let mut names = Vec::new();
        let mut dangling = BTreeSet::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !cniconf::is_candidate_name(&name) {
                continue;
            }
            match entry.file_type() {
                Ok(t) if t.is_file() => names.push(name),
                Ok(t) if t.is_symlink() => match fs::metadata(entry.path()) {
                    Ok(m) if m.is_file() => names.push(name),
                    Ok(_) => debug!("skipping CNI config symlink {name}: not a file"),
                    Err(e) => {
                        if !self.dangling_logged.contains(&name) {
                            let to = fs::read_link(entry.path()).unwrap_or_default();
                            warn!(
                                path = %entry.path().display(),
                                "skipping dangling CNI config symlink {name} -> {}: {e}",
                                to.display()
                            );
                        }
                        dangling.insert(name);
                    }
                },
                _ => {}
            }
        }
        self.dangling_logged = dangling;
        names.sort();
        let mut skipped = BTreeMap::new();
        let cands = names
            .into_iter()
            .filter_map(|name| {
                let read = fsutil::read_bounded(&self.dir().join(&name))
                    .map_err(|e| e.to_string())
                    .and_then(|bytes| cniconf::classify(&name, &bytes).map_err(|e| e.to_string()));
                read.map_err(|cause| skipped.insert(name, cause)).ok()
            })
            .collect();
        // Each skipped file is named once while it stays skipped for the same reason.
        for (name, cause) in &skipped {
            if self.skipped_logged.get(name) != Some(cause) {
                warn!(path = %self.dir().join(name).display(), "skipping CNI config: {cause}");
            }
        }
        self.skipped_logged = skipped;
        cands
    }

    /// Reads one named file for an explicitly configured primary (any name works then).
    pub(super) fn read_named(&self, name: &str) -> Option<Candidate> {
        let bytes = match fsutil::read_bounded(&self.dir().join(name)) {
            Ok(b) => b,
            Err(e) => {
                debug!("not reading CNI config {name}: {e}");
                return None;
            }
        };
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

    /// Is the highest-priority file ours? Remembers the primary when it is not.
    pub(super) fn check_priority(
        &mut self,
        cands: &[Candidate],
        first: &Candidate,
        ours: Option<&str>,
    ) -> Result<(), String> {
        let owned = self.cfg.owned_mode();
        if owned && first.name != self.cfg.owned_filename {
            // Our file's name is fixed, so rewriting it cannot give it priority: a file sorting
            // first is named once and taken as the primary (a rewrite would only loop). Our
            // file itself, when missing or stale, is found by the checks that follow.
            if self.warned_preempted.as_deref() != Some(first.name.as_str()) {
                if self.cfg.owned_filename > first.name {
                    warn!(
                        "{} sorts before our owned config {}: pods could bypass istio-cni; \
                         choose an owned file name that sorts first",
                        first.name, self.cfg.owned_filename
                    );
                }
                self.warned_preempted = Some(first.name.clone());
            }
            if self.cfg.cni_conf_name.is_none() {
                self.primary_hint = Some(first.name.clone());
            }
            return Ok(());
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

    /// Is what we wrote still valid? Remembers the primary when the answer is "invalid".
    pub(super) fn check_conf(&mut self, cands: &[Candidate]) -> Result<(), String> {
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
        if !self.cfg.chained || owned {
            // A file that is ours alone keeps the mode and owner we gave it.
            let file = fsutil::resolve_link(&self.dir().join(&ours)).map_err(|e| e.to_string())?;
            if !Perms::are_ours(&file, self.conf_mode()) {
                return Err(format!("the mode or owner of our config {ours} changed"));
            }
        }
        if !self.cfg.chained {
            return cniconf::check_standalone(&our.value, &self.istio).map_err(|e| e.to_string());
        }
        cniconf::check_chained(&our.value, &self.istio).map_err(|e| e.to_string())?;
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
            cniconf::check_owned_copy(&our.value, &primary).map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}
