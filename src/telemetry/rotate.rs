//! The rotating log file of `--log_rotate`, as Istio's agent keeps it (lumberjack's rules): the
//! file is written until the next record would take it past its size limit, then renamed to
//! `<name>-<UTC time>.<ext>` beside it and started afresh; backups beyond the count limit and
//! backups older than the age limit are removed after each rotation (and once at open). A limit
//! of zero or less is no limit; a size of zero or less is lumberjack's 100 MB.
//!
//! Rotation renames within one directory (atomic), and the file is opened without following a
//! symlink planted at its path.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// lumberjack's size limit when none is given.
const DEFAULT_MAX_BYTES: u64 = 100 << 20;
/// Backups looked at per pruning: a directory holding more is pruned over several rotations.
const MAX_LISTED: usize = 100_000;

/// Istio's `--log_rotate*` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RotateSettings {
    pub path: PathBuf,
    /// Megabytes; zero or less = 100 MB.
    pub max_size_mb: i64,
    /// Days a backup is kept; zero or less = no limit.
    pub max_age_days: i64,
    /// Backups kept; zero or less = no limit.
    pub max_backups: i64,
}

/// The open rotating file.
pub struct RotatingFile {
    settings: RotateSettings,
    max_bytes: u64,
    file: File,
    size: u64,
}

impl RotatingFile {
    pub fn open(settings: RotateSettings) -> io::Result<RotatingFile> {
        let max_bytes = match u64::try_from(settings.max_size_mb) {
            Ok(mb) if mb > 0 => mb.saturating_mul(1 << 20),
            _ => DEFAULT_MAX_BYTES,
        };
        let file = open_append(&settings.path)?;
        let size = file.metadata()?.len();
        let rotating = RotatingFile {
            settings,
            max_bytes,
            file,
            size,
        };
        rotating.prune(SystemTime::now());
        Ok(rotating)
    }

    fn rotate(&mut self, now: SystemTime) -> io::Result<()> {
        let backup = free_backup_name(&self.settings.path, now);
        std::fs::rename(&self.settings.path, &backup).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "rotating log file {} to {}: {e}",
                    self.settings.path.display(),
                    backup.display()
                ),
            )
        })?;
        self.file = open_append(&self.settings.path)?;
        self.size = 0;
        self.prune(now);
        Ok(())
    }

    /// Removes the backups past the count limit (oldest first) and past the age limit.
    fn prune(&self, now: SystemTime) {
        let mut backups = list_backups(&self.settings.path);
        // Newest first, by the time in the name (as lumberjack orders them).
        backups.sort_by_key(|b| std::cmp::Reverse(b.0));
        let keep = usize::try_from(self.settings.max_backups)
            .ok()
            .filter(|n| *n > 0);
        let cutoff = u64::try_from(self.settings.max_age_days)
            .ok()
            .filter(|d| *d > 0)
            .and_then(|d| now.checked_sub(Duration::from_secs(d.saturating_mul(86_400))));
        for (i, (time, path)) in backups.iter().enumerate() {
            let too_many = keep.is_some_and(|k| i >= k);
            let too_old = cutoff.is_some_and(|c| *time < c);
            if too_many || too_old {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

impl Write for RotatingFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let len = buf.len() as u64;
        if self.size > 0 && self.size.saturating_add(len) > self.max_bytes {
            self.rotate(SystemTime::now())?;
        }
        self.file.write_all(buf)?;
        self.size = self.size.saturating_add(len);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

fn open_append(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("opening log file {}: {e}", path.display()),
            )
        })
}

/// `(prefix, extension)` of the backups of `path`: `app.log` -> (`app-`, `.log`).
fn backup_parts(path: &Path) -> (String, String) {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match name.rfind('.').filter(|i| *i > 0) {
        Some(i) => (format!("{}-", &name[..i]), name[i..].to_string()),
        None => (format!("{name}-"), String::new()),
    }
}

/// lumberjack's backup time format, in UTC: `2006-01-02T15-04-05.000`.
const STAMP: &str = "%Y-%m-%dT%H-%M-%S%.3f";

fn backup_stamp(t: SystemTime) -> String {
    match jiff::Timestamp::try_from(t) {
        Ok(ts) => ts.strftime(STAMP).to_string(),
        Err(_) => "1970-01-01T00-00-00.000".to_string(),
    }
}

fn parse_stamp(s: &str) -> Option<SystemTime> {
    // Exactly the written shape (the parser would also take fewer fraction digits).
    if s.len() != 23 || s.as_bytes()[19] != b'.' {
        return None;
    }
    let dt = jiff::civil::DateTime::strptime("%Y-%m-%dT%H-%M-%S%.f", s).ok()?;
    let ts = dt.to_zoned(jiff::tz::TimeZone::UTC).ok()?.timestamp();
    Some(SystemTime::from(ts))
}

/// A backup name not yet taken: the time, moved on by a millisecond while a backup holds it.
fn free_backup_name(path: &Path, now: SystemTime) -> PathBuf {
    let (prefix, ext) = backup_parts(path);
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut t = now;
    for _ in 0..1000 {
        let candidate = dir.join(format!("{prefix}{}{ext}", backup_stamp(t)));
        if !candidate.exists() {
            return candidate;
        }
        t += Duration::from_millis(1);
    }
    dir.join(format!("{prefix}{}{ext}", backup_stamp(t)))
}

/// The backups beside `path`, with the time in their names.
fn list_backups(path: &Path) -> Vec<(SystemTime, PathBuf)> {
    let (prefix, ext) = backup_parts(path);
    let dir = path.parent().unwrap_or(Path::new("."));
    let Ok(entries) = std::fs::read_dir(if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    }) else {
        return Vec::new();
    };
    entries
        .take(MAX_LISTED)
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let stamp = name.strip_prefix(&prefix)?.strip_suffix(ext.as_str())?;
            Some((parse_stamp(stamp)?, e.path()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(dir: &Path, size_mb: i64, age: i64, backups: i64) -> RotateSettings {
        RotateSettings {
            path: dir.join("agent.log"),
            max_size_mb: size_mb,
            max_age_days: age,
            max_backups: backups,
        }
    }

    fn backups(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with("agent-") && n.ends_with(".log"))
            .collect();
        names.sort();
        names
    }

    #[test]
    fn the_stamp_reads_back_as_written() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_767_225_600_123);
        let s = backup_stamp(t);
        assert_eq!(s, "2026-01-01T00-00-00.123");
        assert_eq!(parse_stamp(&s), Some(t));
        assert_eq!(parse_stamp("2026-01-01T00-00-00"), None);
        assert_eq!(
            backup_parts(Path::new("/x/a.b.log")),
            ("a.b-".into(), ".log".into())
        );
        assert_eq!(
            backup_parts(Path::new("/x/log")),
            ("log-".into(), "".into())
        );
    }

    #[test]
    fn past_the_size_limit_the_file_is_rotated_and_backups_pruned_to_the_count() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = RotatingFile::open(settings(dir.path(), 1, 0, 2)).unwrap();
        let line = vec![b'x'; 400 << 10];
        for _ in 0..12 {
            f.write_all(&line).unwrap();
        }
        // 1 MB holds two 400 KiB records: twelve make five rotations, two backups kept.
        let kept = backups(dir.path());
        assert_eq!(kept.len(), 2, "{kept:?}");
        let current = std::fs::metadata(dir.path().join("agent.log"))
            .unwrap()
            .len();
        assert_eq!(current, 2 * (400 << 10));
        for name in kept {
            let len = std::fs::metadata(dir.path().join(name)).unwrap().len();
            assert_eq!(len, 2 * (400 << 10));
        }
    }

    #[test]
    fn backups_older_than_the_age_limit_are_removed_and_zero_is_no_limit() {
        let dir = tempfile::tempdir().unwrap();
        let old = SystemTime::now() - Duration::from_secs(3 * 86_400);
        let recent = SystemTime::now() - Duration::from_secs(3600);
        for t in [old, recent] {
            std::fs::write(
                dir.path().join(format!("agent-{}.log", backup_stamp(t))),
                "x",
            )
            .unwrap();
        }
        std::fs::write(dir.path().join("agent-notatime.log"), "x").unwrap();
        drop(RotatingFile::open(settings(dir.path(), 0, 0, 0)).unwrap());
        assert_eq!(backups(dir.path()).len(), 3, "no limits: all stay");
        drop(RotatingFile::open(settings(dir.path(), 0, 2, 0)).unwrap());
        let kept = backups(dir.path());
        assert_eq!(
            kept,
            vec![
                format!("agent-{}.log", backup_stamp(recent)),
                "agent-notatime.log".to_string()
            ]
        );
    }

    #[test]
    fn a_symlink_at_the_path_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join("agent.log")).unwrap();
        assert!(RotatingFile::open(settings(dir.path(), 1, 0, 0)).is_err());
    }
}
