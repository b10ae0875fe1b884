//! Cleanup of a chained config and the record that restores a converted primary `.conf` (L8).
//!
//! The record stays valid as long as the list, minus any istio-cni entries, is exactly what
//! converting the original gave: the primary (or anyone) dropping our entry does not void it;
//! a change to the primary's own plugins does, and then cleanup keeps that content and says why.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tracing::{info, warn};

use super::{Installer, RESTORE_RECORD};
use crate::install::cniconf;
use crate::install::fsutil::{self, FsError};

/// What cleanup needs to put a converted primary `.conf` back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct RestoreRecord {
    /// The `.conflist` we wrote in place of the original.
    pub(super) conflist: String,
    /// The original file name.
    pub(super) original: String,
    /// The original content.
    pub(super) content: String,
    pub(super) mode: u32,
    /// The original was a symlink to this (as read from the link): cleanup puts the link back;
    /// the file it points to was never written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) link: Option<PathBuf>,
}

impl RestoreRecord {
    /// Reads the record back from the run dir. It names files cleanup writes, links and removes,
    /// so it is checked like input: one that cannot be read, is too large, or names anything
    /// but plain CNI config names in the conf dir is reported and ignored.
    pub(super) fn read(path: &Path) -> Option<RestoreRecord> {
        let bytes = match fsutil::read_bounded(path) {
            Ok(b) => b,
            Err(e) if e.source.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                warn!("ignoring the original-config record: {e}");
                return None;
            }
        };
        let checked = serde_json::from_slice::<RestoreRecord>(&bytes)
            .map_err(|e| e.to_string())
            .and_then(|r| r.check().map(|()| r));
        match checked {
            Ok(r) => Some(r),
            Err(cause) => {
                warn!(
                    path = %path.display(),
                    "ignoring the original-config record (cleanup will not restore from it): {cause}"
                );
                None
            }
        }
    }

    /// What a conversion can have written: `<stem>.conf` or `.json` turned into
    /// `<stem>.conflist`, both plain names, and plain permission bits.
    fn check(&self) -> Result<(), String> {
        let original = fsutil::plain_name(&self.original).map_err(|e| format!("original: {e}"))?;
        fsutil::plain_name(&self.conflist).map_err(|e| format!("conflist: {e}"))?;
        let stem = original
            .strip_suffix(".conf")
            .or_else(|| original.strip_suffix(".json"))
            .ok_or_else(|| format!("original: {original:?} is not a .conf or .json name"))?;
        if self.conflist != format!("{stem}.conflist") {
            return Err(format!(
                "conflist: {:?} is not what converting {original:?} writes",
                self.conflist
            ));
        }
        if self.mode & !0o777 != 0 {
            return Err(format!("mode: {:o} has special bits", self.mode));
        }
        // The link's target is only what the restored link will point to (it is never written
        // or removed), as the original's was; it must still be a path.
        if let Some(to) = &self.link
            && (to.as_os_str().is_empty() || to.as_os_str().len() > 4096)
        {
            return Err(format!("link: {:?} is not a link target", to.display()));
        }
        Ok(())
    }
}

impl Installer {
    pub(super) fn set_restore(&mut self, record: Option<RestoreRecord>) {
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

    pub(super) fn cleanup_conf(&mut self, name: &str) {
        let path = self.dir().join(name);
        let bytes = match fsutil::read_bounded(&path) {
            Ok(b) => b,
            Err(e) if e.source.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => {
                warn!("not cleaning up: {e}");
                return;
            }
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
        let stripped = match cniconf::remove(name, &value) {
            Ok(v) => v,
            Err(e) => {
                warn!("not cleaning up: {e}");
                return;
            }
        };
        if let Some(rec) = self.restore.clone().filter(|r| r.conflist == name) {
            if self.unchanged_since_conversion(&rec, stripped.as_ref().unwrap_or(&value)) {
                self.restore_original(&rec);
                return;
            }
            info!(
                path = %path.display(),
                original = %rec.original,
                "not restoring the original CNI config: its plugins were changed by another \
                 component since we converted it; keeping the current content"
            );
        }
        let Some(remaining) = stripped else {
            return;
        };
        let mode = fsutil::mode_of(&path).unwrap_or(0o600);
        match fsutil::write_atomic_following(&path, &cniconf::marshal(&remaining), mode) {
            Ok(written) => info!(
                path = %path.display(),
                written = %written.display(),
                "removed every istio-cni entry from the CNI config"
            ),
            Err(e) => warn!("{e}"),
        }
    }

    /// Puts the converted original back (its content, or the symlink it was), then removes the
    /// list we wrote in its place; the original comes first so there is always a config.
    fn restore_original(&self, rec: &RestoreRecord) {
        let original = self.dir().join(&rec.original);
        let put_back = match &rec.link {
            Some(to) => fsutil::symlink_atomic(to, &original),
            None => fsutil::write_atomic(&original, rec.content.as_bytes(), rec.mode),
        };
        match put_back.and_then(|_| fsutil::remove_if_exists(&self.dir().join(&rec.conflist))) {
            Ok(_) => info!(path = %original.display(), "restored the original CNI config"),
            Err(e) => warn!("restoring the original CNI config: {e}"),
        }
    }

    /// Whether `list` (without istio-cni entries) is still exactly what converting the original
    /// gave.
    pub(super) fn unchanged_since_conversion(&self, rec: &RestoreRecord, list: &Value) -> bool {
        let Ok(orig) = cniconf::classify(&rec.original, rec.content.as_bytes()) else {
            return false;
        };
        cniconf::insert(&rec.original, &orig.value, &self.istio)
            .ok()
            .and_then(|v| cniconf::remove(&rec.conflist, &v).ok().flatten())
            .is_some_and(|v| &v == list)
    }
}
