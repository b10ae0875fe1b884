//! Plugin logging. Records are JSON lines (`level`, `time`, `msg`, extra keys — the shape the
//! agent's log server re-emits). They always go to stderr (never stdout: that is the CNI result).
//! As soon as the agent run dir is known they are also appended to `istio-cni.log` there (10 MB,
//! one backup) and streamed, as they happen, to the agent's `log.sock`; records logged before that
//! point are replayed to both. A missing socket or unwritable file only disables that sink.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc::error::TryRecvError;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};

// The agent's log time format (RFC 3339 UTC, microseconds), tested with it.
use crate::telemetry::logging::rfc3339_micros;

/// Rotate the plugin log file past this size.
pub const MAX_LOG_FILE: u64 = 10 * 1024 * 1024;
/// Mode of `<run dir>/istio-cni.log` and its backup: root only.
pub const LOG_FILE_MODE: u32 = 0o600;
/// Largest body the agent's log sink accepts.
const MAX_BATCH_BYTES: usize = crate::wire::log::MAX_BATCH_BYTES;
/// How long process exit waits for queued records to reach the agent.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(1);

/// Level threshold: 0 none, 1 error, 2 warn, 3 info, 4 debug.
fn rank(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 1,
        Level::WARN => 2,
        Level::INFO => 3,
        _ => 4,
    }
}

/// Maps `plugin_log_level` to a threshold; unknown or empty values keep the default (info).
pub fn level_threshold(name: &str) -> Option<u8> {
    match name.to_ascii_lowercase().as_str() {
        "none" => Some(0),
        "error" => Some(1),
        "warn" | "warning" => Some(2),
        "info" => Some(3),
        "debug" => Some(4),
        _ => None,
    }
}

#[derive(Default)]
struct JsonVisitor {
    msg: String,
    fields: serde_json::Map<String, serde_json::Value>,
}

impl Visit for JsonVisitor {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.msg = value.to_string();
        } else {
            self.fields.insert(field.name().into(), value.into());
        }
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.fields.insert(field.name().into(), value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.fields.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.fields.insert(field.name().into(), value.into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.msg = text;
        } else {
            self.fields.insert(field.name().into(), text.into());
        }
    }
}

/// One record as a JSON line (without newline).
pub fn format_record(
    level: &Level,
    time: SystemTime,
    msg: &str,
    fields: &serde_json::Map<String, serde_json::Value>,
) -> String {
    let name = match *level {
        Level::ERROR => "error",
        Level::WARN => "warn",
        Level::INFO => "info",
        _ => "debug",
    };
    let obj = crate::wire::log::Record {
        level: name.into(),
        time: rfc3339_micros(time),
        msg: msg.into(),
        fields: fields.clone(),
    }
    .to_object();
    // JSON escapes C0 controls (newline, ESC); DEL and C1 are escaped as in the agent's logs,
    // in the values (escaping the serialized line would make it invalid JSON, and the sink
    // would drop the record).
    crate::telemetry::logging::escape_json_controls(serde_json::Value::Object(obj)).to_string()
}

/// A size-capped append-only file with one backup (`<name>.1`).
struct RollingFile {
    path: PathBuf,
    file: File,
    size: u64,
}

impl RollingFile {
    /// Opens (or creates) the log root-only: its records carry pod annotation values. A symlink
    /// at the path is refused (O_NOFOLLOW) rather than appended through; a file left wider by an
    /// older version is narrowed.
    fn open(path: &Path) -> std::io::Result<RollingFile> {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(LOG_FILE_MODE)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)?;
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(std::io::Error::other("not a regular file"));
        }
        if meta.permissions().mode() & 0o7777 != LOG_FILE_MODE {
            file.set_permissions(std::fs::Permissions::from_mode(LOG_FILE_MODE))?;
        }
        let size = meta.len();
        Ok(RollingFile {
            path: path.to_path_buf(),
            file,
            size,
        })
    }

    fn write_line(&mut self, line: &str) {
        self.write_record(&terminated(line));
    }

    /// Appends one record that already ends in a newline.
    fn write_record(&mut self, record: &[u8]) {
        if self.size + record.len() as u64 > MAX_LOG_FILE && self.size > 0 {
            let mut backup = self.path.clone().into_os_string();
            backup.push(".1");
            // Another plugin process may have rotated already; reopening covers both cases.
            let _ = std::fs::rename(&self.path, &backup);
            if let Ok(reopened) = RollingFile::open(&self.path) {
                *self = reopened;
            }
        }
        if self.file.write_all(record).is_ok() {
            self.size += record.len() as u64;
        }
    }
}

/// A record as written to stderr and the file: the line and its newline, for one write each.
fn terminated(line: &str) -> Vec<u8> {
    let mut record = Vec::with_capacity(line.len() + 1);
    record.extend_from_slice(line.as_bytes());
    record.push(b'\n');
    record
}

/// `/log` bodies (JSON arrays of record strings) of at most `limit` bytes each, in order. A record
/// that alone would exceed the limit is replaced by a warning saying so (the agent would refuse
/// the whole body with 413).
fn batch_bodies(records: Vec<String>, limit: usize) -> Vec<Vec<u8>> {
    let mut bodies = Vec::new();
    let mut body = b"[".to_vec();
    for record in records {
        let mut encoded = serde_json::to_vec(&record).unwrap_or_default();
        if encoded.len() + 2 > limit {
            let note = format_record(
                &Level::WARN,
                SystemTime::now(),
                &format!(
                    "log record of {} bytes not sent to the node agent: larger than its log sink accepts",
                    record.len()
                ),
                &serde_json::Map::new(),
            );
            encoded = serde_json::to_vec(&note).unwrap_or_default();
        }
        if body.len() > 1 && body.len() + 1 + encoded.len() + 1 > limit {
            body.push(b']');
            bodies.push(std::mem::replace(&mut body, b"[".to_vec()));
        }
        if body.len() > 1 {
            body.push(b',');
        }
        body.extend_from_slice(&encoded);
    }
    if body.len() > 1 {
        body.push(b']');
        bodies.push(body);
    }
    bodies
}

/// Streams records to the agent's log socket: a task on the plugin's one runtime, so it runs while
/// ADD awaits and, for whatever is still queued, in [`PluginLog::finish`]. Batches sent while the
/// plugin runs wait for the agent's answer (so a slow agent holds records, never loses them); the
/// last one, once the plugin is done, is written on a connection of its own and not waited for:
/// the records are in the socket's queue, and the process's exit need not wait for the agent.
struct Shipper {
    tx: tokio::sync::mpsc::UnboundedSender<String>,
    task: tokio::task::JoinHandle<()>,
}

impl Shipper {
    fn start(socket: PathBuf) -> Option<Shipper> {
        // Only when the agent is there (a stale path is found out on connect).
        if !socket.exists() {
            return None;
        }
        let runtime = super::runtime::get().ok()?;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        let task = runtime.spawn(async move {
            let mut conn: Option<super::uds::Connection> = None;
            while let Some(first) = rx.recv().await {
                let mut batch = vec![first];
                let last = loop {
                    match rx.try_recv() {
                        Ok(more) => batch.push(more),
                        Err(TryRecvError::Empty) => break false,
                        Err(TryRecvError::Disconnected) => break true,
                    }
                };
                let mut bodies = batch_bodies(batch, MAX_BATCH_BYTES);
                let unanswered = if last { bodies.pop() } else { None };
                for body in bodies {
                    if conn.is_none() {
                        conn = super::uds::Connection::open(&socket).await.ok();
                    }
                    let Some(c) = conn.as_mut() else {
                        // Agent gone: drop records rather than stall the plugin.
                        break;
                    };
                    let sent = tokio::time::timeout(
                        FLUSH_TIMEOUT,
                        c.post_json(crate::wire::log::PATH, body),
                    )
                    .await;
                    if !matches!(sent, Ok(Ok(_))) {
                        conn = None;
                    }
                }
                if let Some(body) = unanswered {
                    let _ = tokio::time::timeout(
                        FLUSH_TIMEOUT,
                        super::uds::post_unanswered(&socket, crate::wire::log::PATH, &body),
                    )
                    .await;
                    return;
                }
            }
        });
        Some(Shipper { tx, task })
    }
}

#[derive(Default)]
struct Sinks {
    attached: bool,
    /// Records logged before the run dir was known.
    early: Vec<String>,
    file: Option<RollingFile>,
    shipper: Option<Shipper>,
}

struct Inner {
    threshold: AtomicU8,
    sinks: Mutex<Sinks>,
}

impl Inner {
    fn emit(&self, line: String) {
        // One write per record and sink (stderr is unbuffered: `writeln!` would be two).
        let record = terminated(&line);
        let _ = std::io::stderr().lock().write_all(&record);
        let Ok(mut sinks) = self.sinks.lock() else {
            return;
        };
        if !sinks.attached {
            if sinks.early.len() < 1000 {
                sinks.early.push(line);
            }
            return;
        }
        if let Some(f) = sinks.file.as_mut() {
            f.write_record(&record);
        }
        if let Some(s) = &sinks.shipper {
            let _ = s.tx.send(line);
        }
    }
}

/// Handle to the plugin's logger.
#[derive(Clone)]
pub struct PluginLog {
    inner: Arc<Inner>,
}

/// The plugin's subscriber: events only. The plugin has no use for spans, so there is no span
/// registry (its slab is the largest allocation a plugin run would otherwise make).
struct PluginSubscriber {
    inner: Arc<Inner>,
}

impl PluginSubscriber {
    fn wanted(&self, meta: &tracing::Metadata<'_>) -> bool {
        let r = rank(meta.level());
        // Library chatter (hyper, kube) only when it is a warning or worse.
        r <= self.inner.threshold.load(Ordering::Relaxed)
            && (r <= 2 || meta.target().starts_with("istio_cni"))
    }
}

impl Subscriber for PluginSubscriber {
    fn register_callsite(
        &self,
        _meta: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        // The threshold changes once the config is read: ask every time.
        tracing::subscriber::Interest::sometimes()
    }

    fn enabled(&self, meta: &tracing::Metadata<'_>) -> bool {
        meta.is_event() && self.wanted(meta)
    }

    fn new_span(&self, _span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _span: &tracing::span::Id, _values: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _span: &tracing::span::Id, _follows: &tracing::span::Id) {}

    fn event(&self, event: &Event<'_>) {
        let meta = event.metadata();
        if !self.wanted(meta) {
            return;
        }
        let mut v = JsonVisitor::default();
        event.record(&mut v);
        let line = format_record(meta.level(), SystemTime::now(), &v.msg, &v.fields);
        self.inner.emit(line);
    }

    fn enter(&self, _span: &tracing::span::Id) {}

    fn exit(&self, _span: &tracing::span::Id) {}
}

impl PluginLog {
    /// Installs the logger as the process-wide subscriber (stderr only, level info).
    pub fn install() -> PluginLog {
        let inner = Arc::new(Inner {
            threshold: AtomicU8::new(3),
            sinks: Mutex::new(Sinks::default()),
        });
        let subscriber = PluginSubscriber {
            inner: inner.clone(),
        };
        // A second install (tests) keeps the first subscriber; records still reach stderr there.
        let _ = tracing::subscriber::set_global_default(subscriber);
        PluginLog { inner }
    }

    /// Applies `plugin_log_level` (empty keeps info).
    pub fn set_level(&self, name: &str) {
        if let Some(t) = level_threshold(name) {
            self.inner.threshold.store(t, Ordering::Relaxed);
        }
    }

    /// Starts the file and socket sinks in the agent run dir and replays earlier records.
    pub fn attach(&self, file: &Path, socket: &Path) {
        let Ok(mut sinks) = self.inner.sinks.lock() else {
            return;
        };
        if sinks.attached {
            return;
        }
        sinks.attached = true;
        sinks.file = RollingFile::open(file).ok();
        sinks.shipper = Shipper::start(socket.to_path_buf());
        let early = std::mem::take(&mut sinks.early);
        for line in early {
            if let Some(f) = sinks.file.as_mut() {
                f.write_line(&line);
            }
            if let Some(s) = &sinks.shipper {
                let _ = s.tx.send(line);
            }
        }
    }

    /// Waits (bounded) for queued records to be written to the agent's socket.
    pub fn finish(&self) {
        let shipper = self
            .inner
            .sinks
            .lock()
            .ok()
            .and_then(|mut s| s.shipper.take());
        if let Some(Shipper { tx, task }) = shipper {
            drop(tx);
            if let Ok(runtime) = super::runtime::get() {
                // The timer is made inside the runtime: `timeout` needs its context.
                let _ = runtime.block_on(async { tokio::time::timeout(FLUSH_TIMEOUT, task).await });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    #[test]
    fn record_shape() {
        let mut fields = serde_json::Map::new();
        fields.insert("pod".into(), "ns/p".into());
        let line = format_record(&Level::WARN, UNIX_EPOCH, "hello", &fields);
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["level"], "warn");
        assert_eq!(v["msg"], "hello");
        assert_eq!(v["pod"], "ns/p");
        assert_eq!(v["time"], "1970-01-01T00:00:00.000000Z");
        fields.insert("pod\n".into(), "a\u{1b}[31m\u{9b}".into());
        let line = format_record(&Level::INFO, UNIX_EPOCH, "x\ry\u{7f}", &fields);
        assert!(!line.chars().any(char::is_control), "{line:?}");
        // Still one JSON object, so the agent's log sink does not drop it.
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["msg"], "x\ry\\u{7f}");
        assert_eq!(v["pod\n"], "a\u{1b}[31m\\u{9b}");
    }

    #[test]
    fn batches_stay_under_the_sink_limit() {
        let records: Vec<String> = (0..10).map(|i| format!("record-{i}")).collect();
        let bodies = batch_bodies(records.clone(), 40);
        assert!(bodies.len() > 1);
        let mut seen = Vec::new();
        for body in &bodies {
            assert!(body.len() <= 40, "{}", String::from_utf8_lossy(body));
            seen.extend(serde_json::from_slice::<Vec<String>>(body).unwrap());
        }
        assert_eq!(seen, records);
        assert_eq!(batch_bodies(vec![], 40), Vec::<Vec<u8>>::new());

        let huge = "x".repeat(5000);
        let bodies = batch_bodies(vec!["a".into(), huge, "b".into()], 1000);
        let all: Vec<String> = bodies
            .iter()
            .flat_map(|b| serde_json::from_slice::<Vec<String>>(b).unwrap())
            .collect();
        assert_eq!(all.len(), 3);
        assert!(
            all[1].contains("log record of 5000 bytes not sent"),
            "{}",
            all[1]
        );
    }

    #[test]
    fn levels() {
        assert_eq!(level_threshold("DEBUG"), Some(4));
        assert_eq!(level_threshold("none"), Some(0));
        assert_eq!(level_threshold(""), None);
    }

    #[test]
    fn early_records_are_replayed_when_the_sinks_attach() {
        let log = PluginLog {
            inner: Arc::new(Inner {
                threshold: AtomicU8::new(3),
                sinks: Mutex::new(Sinks::default()),
            }),
        };
        log.inner.emit("early".into());
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("istio-cni.log");
        log.attach(&file, &dir.path().join("no.sock"));
        log.inner.emit("late".into());
        log.finish();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "early\nlate\n");
    }

    #[test]
    fn rolling_file_keeps_one_backup() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("istio-cni.log");
        let mut f = RollingFile::open(&path).unwrap();
        f.size = MAX_LOG_FILE - 2;
        f.write_line("after-rotation");
        assert!(dir.path().join("istio-cni.log.1").exists());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "after-rotation\n");
    }

    #[test]
    fn the_log_is_root_only_and_never_written_through_a_symlink() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("istio-cni.log");
        let mut f = RollingFile::open(&path).unwrap();
        f.write_line("annotation value");
        assert_eq!(mode(&path), LOG_FILE_MODE);
        // A file an older plugin left world-readable is narrowed; the backup it rotates to too.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut f = RollingFile::open(&path).unwrap();
        assert_eq!(mode(&path), LOG_FILE_MODE);
        f.size = MAX_LOG_FILE;
        f.write_line("rotated");
        assert_eq!(mode(&dir.path().join("istio-cni.log.1")), LOG_FILE_MODE);
        assert_eq!(mode(&path), LOG_FILE_MODE);
        // A symlink in its place is refused, its target untouched.
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, b"keep").unwrap();
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&target, &path).unwrap();
        assert!(RollingFile::open(&path).is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
    }
}
