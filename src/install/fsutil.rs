//! File effects: atomic writes (temp file in the same dir + fsync + rename + fsync dir, Istio bug
//! B6), binary copies that skip identical targets (L5), stale temp-file removal.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A file operation that failed, with the path it failed on.
#[derive(Debug, thiserror::Error)]
#[error("{op} {path}: {source}{hint}")]
pub struct FsError {
    pub op: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
    pub hint: &'static str,
}

impl FsError {
    pub fn new(op: &'static str, path: &Path, source: io::Error) -> Self {
        let source = unwrap_tempfile(source);
        // Written files are CNI configs (and the run dir's kubeconfig); binaries get their own
        // hint in `copy_atomic`.
        let hint = if is_erofs(&source) {
            " (read-only file system: the agent writes the CNI config dir; mount the host's CNI \
             config dir read-write (chart: cni.cniConfDir, here --mounted-cni-net-dir) and the \
             run dir (--cni-agent-run-dir))"
        } else if is_enospc(&source) {
            " (no space left on the file system holding it: the previous file is kept whole and \
             the write is retried; free space on the node)"
        } else {
            ""
        };
        Self {
            op,
            path: path.to_path_buf(),
            source,
            hint,
        }
    }

    pub fn is_read_only(&self) -> bool {
        is_erofs(&self.source)
    }

    /// Same hint as Istio for binaries: a read-only host bin dir usually means a platform that
    /// keeps CNI binaries elsewhere.
    fn about_binaries(mut self) -> Self {
        if self.is_read_only() {
            self.hint = " (read-only file system: this platform may keep CNI binaries elsewhere; \
                         set global.platform in the chart or point --cni-bin-dirs at a writable \
                         directory)";
        }
        self
    }
}

/// tempfile wraps OS errors with the temp file's path ("<error> (os error N) at path ..."), in a
/// private type that does not lend out the original; our messages name the file being replaced
/// instead, so the errno is read back from std's rendering of it.
fn unwrap_tempfile(e: io::Error) -> io::Error {
    if e.raw_os_error().is_some() {
        return e;
    }
    let text = e.to_string();
    let code = text
        .split_once("(os error ")
        .and_then(|(_, rest)| rest.split_once(')'))
        .and_then(|(n, _)| n.parse::<i32>().ok());
    code.map_or(e, io::Error::from_raw_os_error)
}

fn is_erofs(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EROFS) || e.kind() == io::ErrorKind::ReadOnlyFilesystem
}

/// A full file system, or the writer's quota on it.
fn is_enospc(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
        || e.kind() == io::ErrorKind::StorageFull
}

/// Test builds (`test-hooks`) only: `ISTIO_CNI_RS_TEST_KILL_AT_STEP=N` sends this process SIGKILL at
/// the N-th crash point of the file changes. Every change has one after it is done; a write also
/// has one after its temp file is complete but before the rename. Tests use it to show that a
/// kill at any step leaves the node usable. Compiled out of the product.
#[cfg(feature = "test-hooks")]
fn crash_point() {
    use std::sync::atomic::{AtomicU32, Ordering};
    static STEPS: AtomicU32 = AtomicU32::new(0);
    let step = STEPS.fetch_add(1, Ordering::SeqCst) + 1;
    let wanted = std::env::var("ISTIO_CNI_RS_TEST_KILL_AT_STEP")
        .ok()
        .and_then(|v| v.parse::<u32>().ok());
    if wanted == Some(step) {
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
}

#[cfg(not(feature = "test-hooks"))]
#[inline(always)]
fn crash_point() {}

fn temp_prefix(name: &str) -> String {
    format!("{name}.tmp.")
}

/// Removes leftover `<name>.tmp.*` files (from a crash mid-write) in `dir`.
pub fn remove_stale_temps(dir: &Path, name: &str) {
    let prefix = temp_prefix(name);
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// fsync a directory so a rename in it is durable.
pub fn sync_dir(dir: &Path) -> Result<(), FsError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| FsError::new("syncing directory", dir, e))
}

fn split(path: &Path) -> Result<(&Path, String), FsError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| FsError::new("writing", path, io::Error::other("path has no file name")))?;
    Ok((dir, name))
}

/// Writes `path` atomically: readers see the old content or the new, never a partial file. On
/// any error the temp file is removed (dropped) and `path` is untouched; errors name `path`.
pub fn write_atomic(path: &Path, data: &[u8], mode: u32) -> Result<(), FsError> {
    let (dir, name) = split(path)?;
    remove_stale_temps(dir, &name);
    let mut tmp = tempfile::Builder::new()
        .prefix(&temp_prefix(&name))
        .tempfile_in(dir)
        .map_err(|e| FsError::new("creating a temp file to replace", path, e))?;
    tmp.write_all(data)
        .map_err(|e| FsError::new("writing (to a temp file)", path, e))?;
    tmp.as_file()
        .set_permissions(fs::Permissions::from_mode(mode))
        .map_err(|e| FsError::new("setting mode of (a temp file for)", path, e))?;
    tmp.as_file()
        .sync_all()
        .map_err(|e| FsError::new("syncing (a temp file for)", path, e))?;
    crash_point();
    tmp.persist(path)
        .map_err(|e| FsError::new("renaming temp file onto", path, e.error))?;
    sync_dir(dir)?;
    crash_point();
    Ok(())
}

/// The file a config path stands for: the path itself, or, when it is a symlink, the file the
/// link chain ends at (libcni and Istio read through links, so that is the file that counts).
pub fn resolve_link(path: &Path) -> Result<PathBuf, FsError> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => {
            fs::canonicalize(path).map_err(|e| FsError::new("resolving symlink", path, e))
        }
        _ => Ok(path.to_path_buf()),
    }
}

/// [`write_atomic`] through a symlink: writes the file the link points to (temp file in the
/// target's directory + rename), so the link itself is kept. Returns the path written.
pub fn write_atomic_following(path: &Path, data: &[u8], mode: u32) -> Result<PathBuf, FsError> {
    let target = resolve_link(path)?;
    write_atomic(&target, data, mode)?;
    Ok(target)
}

/// Creates (or replaces) `link` as a symlink to `to`, atomically: the link is made under a temp
/// name in the same directory and renamed into place.
pub fn symlink_atomic(to: &Path, link: &Path) -> Result<(), FsError> {
    let (dir, name) = split(link)?;
    remove_stale_temps(dir, &name);
    let tmp = dir.join(format!("{}{}", temp_prefix(&name), std::process::id()));
    let _ = fs::remove_file(&tmp);
    std::os::unix::fs::symlink(to, &tmp).map_err(|e| FsError::new("creating symlink", &tmp, e))?;
    crash_point();
    if let Err(e) = fs::rename(&tmp, link) {
        let _ = fs::remove_file(&tmp);
        return Err(FsError::new("renaming symlink onto", link, e));
    }
    sync_dir(dir)?;
    crash_point();
    Ok(())
}

/// Removes a file; a missing file is fine.
pub fn remove_if_exists(path: &Path) -> Result<bool, FsError> {
    match fs::remove_file(path) {
        Ok(()) => {
            // Make the removal durable too; failing to sync is not worth failing the removal.
            if let Some(dir) = path.parent() {
                let _ = sync_dir(dir);
            }
            crash_point();
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(FsError::new("removing", path, e)),
    }
}

/// The mode bits of an existing file.
pub fn mode_of(path: &Path) -> Option<u32> {
    fs::metadata(path)
        .ok()
        .map(|m| m.permissions().mode() & 0o7777)
}

/// The most install-cni reads of any file it did not write itself in this run: CNI configs, the
/// service-account token and CA, the kubeconfig it checks, the records in its run dir. All of
/// them are kilobytes; a larger file is refused, naming it, instead of being held in memory.
pub const READ_LIMIT: u64 = 1 << 20;

/// Reads a regular file of at most [`READ_LIMIT`] bytes (following links, as libcni and Istio
/// read configs). Anything else is refused naming the file: a larger file, and a FIFO or device
/// (opened without blocking, so a FIFO cannot hang the caller). A missing file keeps its
/// `NotFound` kind.
pub fn read_bounded(path: &Path) -> Result<Vec<u8>, FsError> {
    read_bounded_to(path, READ_LIMIT)
}

/// [`read_bounded`] with a smaller `limit` (for many small files, such as a runtime's cache).
pub fn read_bounded_to(path: &Path, limit: u64) -> Result<Vec<u8>, FsError> {
    use std::os::unix::fs::OpenOptionsExt;
    let fail = |e| FsError::new("reading", path, e);
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(fail)?;
    let meta = file.metadata().map_err(fail)?;
    if !meta.is_file() {
        return Err(fail(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        )));
    }
    let too_large = |size: u64| {
        fail(io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!(
                "{size} bytes or more, over the {} KiB read limit for files from the node",
                limit / 1024
            ),
        ))
    };
    if meta.len() > limit {
        return Err(too_large(meta.len()));
    }
    // The file may grow between the size check and the read: read one byte past the limit.
    let mut data = Vec::with_capacity(meta.len() as usize);
    file.take(limit + 1).read_to_end(&mut data).map_err(fail)?;
    if data.len() as u64 > limit {
        return Err(too_large(data.len() as u64));
    }
    Ok(data)
}

/// Checks that a name read back from disk (a record in the run dir) is a plain file name: joined
/// to its directory it stays inside it. Empty, `.`, `..`, a `/` or a NUL are refused.
pub(super) fn plain_name(name: &str) -> Result<&str, String> {
    if name.is_empty() || name == "." || name == ".." || name.len() > 255 {
        return Err(format!("{name:?} is not a file name"));
    }
    if name.contains('/') || name.contains('\0') {
        return Err(format!(
            "{name:?} is not a plain file name (it names a path)"
        ));
    }
    Ok(name)
}

/// Who may read or change a file: its mode bits and owner (following links).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Perms {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

impl Perms {
    pub fn of(path: &Path) -> Option<Self> {
        let m = fs::metadata(path).ok()?;
        Some(Self {
            mode: m.permissions().mode() & 0o7777,
            uid: m.uid(),
            gid: m.gid(),
        })
    }

    /// What a file this process writes into `dir` with `mode` gets: our effective user, and our
    /// effective group unless the directory is set-group-ID (then the directory's group).
    pub fn ours_in(dir: &Path, mode: u32) -> Self {
        let gid = match fs::metadata(dir) {
            Ok(d) if d.permissions().mode() & 0o2000 != 0 => d.gid(),
            _ => nix::unistd::getegid().as_raw(),
        };
        Self {
            mode,
            uid: nix::unistd::geteuid().as_raw(),
            gid,
        }
    }

    /// Whether the file at `path` has exactly the mode and owner a write of ours gives it.
    pub fn are_ours(path: &Path, mode: u32) -> bool {
        let dir = path.parent().unwrap_or(Path::new("."));
        Self::of(path) == Some(Self::ours_in(dir, mode))
    }
}

/// Identity of a file version: if none of these changed, its content did not either.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct FileStamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl FileStamp {
    pub fn of(path: &Path) -> Option<Self> {
        let m = fs::metadata(path).ok()?;
        Some(Self {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
            ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
        })
    }
}

/// Whether two files have the same size and content.
pub fn same_content(a: &Path, b: &Path) -> io::Result<bool> {
    let (ma, mb) = (fs::metadata(a)?, fs::metadata(b)?);
    if ma.len() != mb.len() {
        return Ok(false);
    }
    let (mut fa, mut fb) = (File::open(a)?, File::open(b)?);
    let mut ba = vec![0u8; 1 << 16];
    let mut bb = vec![0u8; 1 << 16];
    loop {
        let n = read_full(&mut fa, &mut ba)?;
        let m = read_full(&mut fb, &mut bb)?;
        if n != m || ba[..n] != bb[..m] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
    }
}

fn read_full(f: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match f.read(&mut buf[filled..])? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

/// Copies `src` to `dst` atomically with `mode` (temp + fsync + rename + fsync dir).
pub fn copy_atomic(src: &Path, dst: &Path, mode: u32) -> Result<(), FsError> {
    copy_atomic_in(src, dst, mode).map_err(FsError::about_binaries)
}

fn copy_atomic_in(src: &Path, dst: &Path, mode: u32) -> Result<(), FsError> {
    let (dir, name) = split(dst)?;
    remove_stale_temps(dir, &name);
    let mut input = File::open(src).map_err(|e| FsError::new("opening", src, e))?;
    let tmp = tempfile::Builder::new()
        .prefix(&temp_prefix(&name))
        .tempfile_in(dir)
        .map_err(|e| FsError::new("creating temp file in", dir, e))?;
    // No write handle may outlive the copy: exec of a file open for writing fails (ETXTBSY), and
    // the runtime may exec the plugin the moment the rename lands.
    let tmp = tmp.into_temp_path();
    let tmp_path = tmp.to_path_buf();
    {
        let mut out = OpenOptions::new()
            .write(true)
            .open(&tmp_path)
            .map_err(|e| FsError::new("opening", &tmp_path, e))?;
        io::copy(&mut input, &mut out).map_err(|e| FsError::new("copying into", &tmp_path, e))?;
        out.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(|e| FsError::new("setting mode of", &tmp_path, e))?;
        out.sync_all()
            .map_err(|e| FsError::new("syncing", &tmp_path, e))?;
    }
    crash_point();
    tmp.persist(dst)
        .map_err(|e| FsError::new("renaming temp file onto", dst, e.error))?;
    sync_dir(dir)?;
    crash_point();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_and_sets_mode() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("a.conflist");
        write_atomic(&p, b"one", 0o640).expect("write");
        write_atomic(&p, b"two", 0o600).expect("rewrite");
        assert_eq!(fs::read(&p).expect("read"), b"two");
        assert_eq!(mode_of(&p), Some(0o600));
        let names: Vec<_> = fs::read_dir(dir.path()).expect("ls").flatten().collect();
        assert_eq!(names.len(), 1, "no temp files left");
    }

    #[test]
    fn writes_through_links_keep_the_link() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = dir.path().join("store");
        fs::create_dir(&store).expect("store");
        fs::write(store.join("real.conflist"), b"old").expect("real");
        let link = dir.path().join("10.conflist");
        std::os::unix::fs::symlink("store/real.conflist", &link).expect("link");
        let written = write_atomic_following(&link, b"new", 0o600).expect("write");
        assert_eq!(
            written,
            fs::canonicalize(store.join("real.conflist")).expect("abs")
        );
        assert!(
            fs::symlink_metadata(&link)
                .expect("lstat")
                .file_type()
                .is_symlink()
        );
        assert_eq!(fs::read(&link).expect("read"), b"new");
        assert_eq!(fs::read_dir(&store).expect("ls").count(), 1, "no temp left");
        let dangling = dir.path().join("05.conflist");
        std::os::unix::fs::symlink("gone", &dangling).expect("dangling");
        let e = write_atomic_following(&dangling, b"x", 0o600).expect_err("dangling");
        assert!(e.to_string().contains("05.conflist"), "{e}");
        fs::remove_file(&link).expect("rm link");
        symlink_atomic(Path::new("store/real.conflist"), &link).expect("relink");
        assert_eq!(
            fs::read_link(&link).expect("readlink"),
            Path::new("store/real.conflist")
        );
        symlink_atomic(Path::new("store/other"), &link).expect("replace link");
        assert_eq!(
            fs::read_link(&link).expect("readlink"),
            Path::new("store/other")
        );
    }

    #[test]
    fn a_full_file_system_is_named_with_the_file_replaced_and_the_old_one_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = FsError::new(
            "writing (to a temp file)",
            &dir.path().join("10-x.conflist"),
            io::Error::from_raw_os_error(libc::ENOSPC),
        );
        let text = e.to_string();
        assert!(
            text.contains("10-x.conflist: ") && text.contains("no space left"),
            "{text}"
        );
        // tempfile's wrapper ("... at path <temp>") is taken off: the errno is kept.
        let wrapped = tempfile::Builder::new()
            .tempfile_in(dir.path().join("missing"))
            .unwrap_err();
        assert!(wrapped.raw_os_error().is_none() && wrapped.to_string().contains("at path"));
        let e = FsError::new("creating", dir.path(), wrapped);
        assert_eq!(e.source.raw_os_error(), Some(libc::ENOENT));
        assert!(!e.to_string().contains("at path"), "{e}");
    }

    #[test]
    fn read_only_errors_carry_the_platform_hint() {
        let e = FsError::new(
            "creating temp file in",
            Path::new("/host/opt/cni/bin"),
            io::Error::from_raw_os_error(libc::EROFS),
        )
        .about_binaries();
        assert!(e.is_read_only());
        let text = e.to_string();
        assert!(
            text.contains("/host/opt/cni/bin") && text.contains("global.platform"),
            "{text}"
        );
        let other = FsError::new(
            "writing",
            Path::new("/x"),
            io::Error::from_raw_os_error(libc::EACCES),
        );
        assert!(!other.to_string().contains("global.platform"));
    }

    #[test]
    fn a_read_only_conf_dir_hint_talks_about_the_conf_dir() {
        let dir = tempfile::tempdir().expect("tempdir");
        let conf = FsError::new(
            "creating temp file in",
            Path::new("/host/etc/cni/net.d"),
            io::Error::from_raw_os_error(libc::EROFS),
        );
        let text = conf.to_string();
        assert!(
            text.contains("CNI config dir") && text.contains("--mounted-cni-net-dir"),
            "{text}"
        );
        assert!(
            !text.contains("binaries") && !text.contains("global.platform"),
            "{text}"
        );
        // Only a read-only file system gets a hint.
        let missing = dir.path().join("absent").join("x");
        let err = copy_atomic(&missing, &dir.path().join("y"), 0o755).expect_err("no source");
        assert!(!err.to_string().contains("global.platform"), "{err}");
    }

    #[test]
    fn copy_clears_stale_temps_and_compares_content() {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = dir.path().join("src");
        fs::write(&src, b"binary").expect("src");
        let bin = dir.path().join("bin");
        fs::create_dir(&bin).expect("bin");
        fs::write(bin.join("istio-cni.tmp.stale"), b"x").expect("stale");
        let dst = bin.join("istio-cni");
        copy_atomic(&src, &dst, 0o755).expect("copy");
        assert!(same_content(&src, &dst).expect("compare"));
        assert_eq!(mode_of(&dst), Some(0o755));
        assert!(!bin.join("istio-cni.tmp.stale").exists());
        fs::write(&dst, b"binarz").expect("corrupt");
        assert!(!same_content(&src, &dst).expect("compare"));
    }
}
