//! Logging setup: Istio's text format (`<RFC3339 UTC micros>\t<level>\t<scope>\t<msg>\t<k=v ...>`)
//! or JSON lines, per-scope levels, to stderr/stdout/a file.
//!
//! Scopes: events of this crate are `cni-agent`; events re-emitted for the plugin use the target
//! `cni-plugin`; everything else (libraries) is `default`. Re-emitted plugin records carry their
//! original time in the field [`TIME_FIELD`] and their extra keys as a JSON object in
//! [`FIELDS_FIELD`]; the formatter puts both back in place.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::SystemTime;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

/// Target (and scope) of re-emitted plugin records.
pub const PLUGIN_TARGET: &str = "cni-plugin";
/// Field holding a re-emitted record's original time.
pub const TIME_FIELD: &str = "orig_time";
/// Field holding a re-emitted record's extra keys (a JSON object).
pub const FIELDS_FIELD: &str = "orig_fields";

/// Minimum level per scope; `None` in the map = scope silenced.
#[derive(Debug, Clone)]
pub struct ScopeLevels {
    /// Level of scopes not listed.
    pub default: Option<Level>,
    pub scopes: BTreeMap<String, Option<Level>>,
}

impl ScopeLevels {
    fn allows(&self, scope: &str, level: &Level) -> bool {
        let min = self.scopes.get(scope).copied().unwrap_or(self.default);
        // tracing orders levels by verbosity: TRACE > DEBUG > INFO > WARN > ERROR.
        min.is_some_and(|m| level <= &m)
    }
}

/// Output format and destination.
#[derive(Debug, Clone)]
pub struct LogSettings {
    pub levels: ScopeLevels,
    pub json: bool,
    /// `None` = stderr.
    pub file: Option<PathBuf>,
    pub stdout: bool,
    /// Istio's `--log_rotate`: a rotating file that gets every record besides the target.
    pub rotate: Option<super::rotate::RotateSettings>,
}

/// The scope of an event target.
pub fn scope_of(target: &str) -> &'static str {
    if target == PLUGIN_TARGET {
        PLUGIN_TARGET
    } else if target.starts_with("istio_cni") {
        AGENT_SCOPE
    } else {
        "default"
    }
}

/// Flushes the log when dropped: hold it until the process is about to exit (records still
/// queued are written then, not lost).
#[must_use = "dropping the guard stops the log writer"]
pub struct LogGuard(#[allow(dead_code)] tracing_appender::non_blocking::WorkerGuard);

/// Installs the global subscriber for the long-running agent. Records are formatted on the
/// logging thread and written by a writer thread of their own (tracing-appender): a slow stderr
/// or log file never blocks the async runtime's workers. The queue is bounded (4096 records);
/// when it is full the logging thread waits rather than dropping a record.
pub fn init(settings: LogSettings) -> Result<LogGuard, LogError> {
    let target = match &settings.file {
        Some(path) => path.to_string_lossy().into_owned(),
        None if settings.stdout => "stdout".to_string(),
        None => "stderr".to_string(),
    };
    let mut tee = open_targets(&[target])?;
    if let Some(rotate) = &settings.rotate {
        let file =
            super::rotate::RotatingFile::open(rotate.clone()).map_err(|source| LogError::Open {
                path: rotate.path.display().to_string(),
                source,
            })?;
        tee = tee.with(Target::Rotating(Mutex::new(file)));
    }
    let (writer, guard) = non_blocking(tee);
    let levels = settings.levels.clone();
    let filter = tracing_subscriber::filter::filter_fn(move |meta| {
        levels.allows(scope_of(meta.target()), meta.level())
    });
    let layer = tracing_subscriber::fmt::layer()
        .event_format(IstioFormat {
            json: settings.json,
            scope: AGENT_SCOPE,
        })
        .with_writer(writer)
        .with_ansi(false);
    tracing_subscriber::registry()
        .with(tracing_subscriber::Layer::with_filter(layer, filter))
        .try_init()
        .map_err(LogError::Init)?;
    Ok(LogGuard(guard))
}

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("opening log file {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("setting up logging: {0}")]
    Init(#[source] tracing_subscriber::util::TryInitError),
}

/// Records the log writer may hold before a logging thread waits for it.
const LOG_QUEUE_LINES: usize = 4096;

/// `sink` behind a queue and a writer thread of its own, losing nothing (see [`init`]).
fn non_blocking<W: io::Write + Send + 'static>(
    sink: W,
) -> (
    tracing_appender::non_blocking::NonBlocking,
    tracing_appender::non_blocking::WorkerGuard,
) {
    tracing_appender::non_blocking::NonBlockingBuilder::default()
        // The queue's slots are allocated up front: the default queue length costs megabytes of RSS.
        .buffered_lines_limit(LOG_QUEUE_LINES)
        .lossy(false)
        .thread_name("log-writer")
        .finish(sink)
}

/// One log destination, as pilot-agent's `--log_target` names it.
enum Target {
    Stdout,
    Stderr,
    File(Mutex<std::fs::File>),
    Rotating(Mutex<super::rotate::RotatingFile>),
}

/// Writes each record to every target.
struct Tee(std::sync::Arc<Vec<Target>>);

impl io::Write for Tee {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        for target in self.0.iter() {
            match target {
                Target::Stdout => io::stdout().lock().write_all(buf)?,
                Target::Stderr => io::stderr().lock().write_all(buf)?,
                Target::File(f) => f
                    .lock()
                    .map_err(|_| io::Error::other("log file lock poisoned"))?
                    .write_all(buf)?,
                Target::Rotating(f) => f
                    .lock()
                    .map_err(|_| io::Error::other("rotating log file lock poisoned"))?
                    .write_all(buf)?,
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Tee {
    /// These targets and one more (before any writer shares them).
    fn with(self, extra: Target) -> Tee {
        let mut targets = std::sync::Arc::into_inner(self.0).unwrap_or_default();
        targets.push(extra);
        Tee(std::sync::Arc::new(targets))
    }
}

/// A writer for `--log_target` values: `stdout`, `stderr` or a file path (opened for append);
/// several targets each get every record; none means stderr. Blocking: for the short-lived
/// `istio-iptables` (the agent uses [`init`]'s non-blocking writer over the same targets).
pub fn targets_writer(targets: &[String]) -> Result<BoxMakeWriter, LogError> {
    let tee = open_targets(targets)?;
    Ok(BoxMakeWriter::new(move || Tee(tee.0.clone())))
}

/// The targets opened, as one writer.
fn open_targets(targets: &[String]) -> Result<Tee, LogError> {
    let mut opened = Vec::new();
    for target in targets {
        opened.push(match target.as_str() {
            "stdout" => Target::Stdout,
            "stderr" => Target::Stderr,
            path => {
                let f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|source| LogError::Open {
                        path: path.to_string(),
                        source,
                    })?;
                Target::File(Mutex::new(f))
            }
        });
    }
    if opened.is_empty() {
        opened.push(Target::Stderr);
    }
    Ok(Tee(std::sync::Arc::new(opened)))
}

/// The scope this crate's own events are logged under by the node agent.
pub const AGENT_SCOPE: &str = "cni-agent";

/// The formatter.
pub struct IstioFormat {
    pub json: bool,
    /// The scope printed for this crate's own events: each role names its own (the node agent
    /// [`AGENT_SCOPE`], `istio-iptables` `iptables` as Istio's does).
    pub scope: &'static str,
}

#[derive(Default)]
struct Collect {
    message: String,
    time: Option<String>,
    extra: Option<Map<String, Value>>,
    fields: Vec<(String, String)>,
}

impl Visit for Collect {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            TIME_FIELD => self.time = Some(value.to_string()),
            FIELDS_FIELD => self.extra = serde_json::from_str(value).ok(),
            "message" => self.message = value.to_string(),
            name => self.fields.push((name.to_string(), value.to_string())),
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        match field.name() {
            "message" => self.message = text,
            TIME_FIELD | FIELDS_FIELD => self.record_str(field, &text),
            name => self.fields.push((name.to_string(), text)),
        }
    }
}

fn level_name(level: &Level) -> &'static str {
    match *level {
        Level::ERROR => "error",
        Level::WARN => "warn",
        Level::INFO => "info",
        _ => "debug",
    }
}

impl<S, N> FormatEvent<S, N> for IstioFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut c = Collect::default();
        event.record(&mut c);
        let meta = event.metadata();
        let time = c
            .time
            .take()
            .filter(|t| !t.is_empty())
            .unwrap_or_else(|| rfc3339_micros(SystemTime::now()));
        let level = level_name(meta.level());
        let scope = match scope_of(meta.target()) {
            AGENT_SCOPE => self.scope,
            other => other,
        };
        let mut extra: Vec<(String, Value)> = c
            .fields
            .into_iter()
            .map(|(k, v)| (k, Value::String(v)))
            .collect();
        if let Some(map) = c.extra {
            extra.extend(map);
        }
        if self.json {
            // JSON escapes C0 controls itself; DEL and C1 (e.g. U+009B, a one-character CSI)
            // are escaped here.
            let esc = |s: &str| escape_controls(s, Controls::BeyondAscii).into_owned();
            let mut obj = Map::new();
            obj.insert("time".into(), Value::String(esc(&time)));
            obj.insert("level".into(), Value::String(level.into()));
            obj.insert("scope".into(), Value::String(scope.into()));
            obj.insert("msg".into(), Value::String(esc(&c.message)));
            for (k, v) in extra {
                obj.entry(esc(&k)).or_insert(escape_json_controls(v));
            }
            // Every string is escaped already: escaping the serialized line instead would put
            // `\u{9b}` into JSON text, an invalid escape that breaks the whole record.
            let line = serde_json::to_string(&Value::Object(obj)).map_err(|_| fmt::Error)?;
            writeln!(w, "{line}")
        } else {
            // One record, one line, no terminal escapes: every control character in every part
            // (forwarded plugin records included) is written escaped.
            let esc = |s: &str| escape_controls(s, Controls::All).into_owned();
            write!(w, "{}\t{level}\t{scope}\t{}", esc(&time), esc(&c.message))?;
            let mut first = true;
            for (k, v) in extra {
                w.write_char(if first { '\t' } else { ' ' })?;
                first = false;
                match v {
                    Value::String(s) => write!(w, "{}={}", esc(&k), esc(&s))?,
                    other => write!(w, "{}={}", esc(&k), esc(&other.to_string()))?,
                }
            }
            writeln!(w)
        }
    }
}

/// Which control characters [`escape_controls`] rewrites.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Controls {
    /// Every control character (C0 incl. tab/newline/ESC, DEL, C1): for the text format.
    All,
    /// DEL and C1 only: for text already JSON-encoded, where C0 is escaped by the encoder.
    BeyondAscii,
}

/// `s` with control characters written as escapes (`\n`, `\r`, `\t`, `\u{1b}`, ...), so a
/// logged value can neither start a forged line nor drive the terminal.
pub fn escape_controls(s: &str, which: Controls) -> std::borrow::Cow<'_, str> {
    let hit = |c: char| match which {
        Controls::All => c.is_control(),
        Controls::BeyondAscii => c.is_control() && !c.is_ascii_control() || c == '\u{7f}',
    };
    if !s.chars().any(hit) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if hit(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `v` with DEL and C1 escaped ([`Controls::BeyondAscii`]) in every string and key, at any
/// depth. JSON output must be escaped this way, before serializing: the escapes are then plain
/// text inside JSON strings, so the line stays valid JSON and carries no raw control character.
pub fn escape_json_controls(v: Value) -> Value {
    let esc = |s: &str| escape_controls(s, Controls::BeyondAscii).into_owned();
    match v {
        Value::String(s) => Value::String(esc(&s)),
        Value::Array(items) => Value::Array(items.into_iter().map(escape_json_controls).collect()),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (esc(&k), escape_json_controls(v)))
                .collect(),
        ),
        other => other,
    }
}

/// `2024-01-02T03:04:05.123456Z`.
pub fn rfc3339_micros(t: SystemTime) -> String {
    match jiff::Timestamp::try_from(t) {
        Ok(ts) => ts.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string(),
        Err(_) => "1970-01-01T00:00:00.000000Z".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use std::time::UNIX_EPOCH;

    #[test]
    fn json_escapes_stay_valid_json_at_any_depth() {
        let forged = serde_json::json!({"k\u{7f}": ["a\u{9b}2J", {"n": "\u{85}"}], "n": 1});
        let escaped = escape_json_controls(forged);
        let line = serde_json::to_string(&escaped).unwrap();
        assert!(!line.chars().any(char::is_control), "{line}");
        let back: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(back["k\\u{7f}"][0], "a\\u{9b}2J");
        assert_eq!(back["k\\u{7f}"][1]["n"], "\\u{85}");
        assert_eq!(back["n"], 1);
    }

    /// A sink that blocks until the test lets it go, keeping what it was given.
    struct Stuck {
        release: std::sync::mpsc::Receiver<()>,
        got: std::sync::Arc<Mutex<Vec<u8>>>,
    }

    impl io::Write for Stuck {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let _ = self.release.recv();
            self.got.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stuck_log_destination_blocks_no_caller_and_loses_no_record() {
        use io::Write;
        use tracing_subscriber::fmt::MakeWriter;
        let (release, rx) = std::sync::mpsc::channel();
        let got = std::sync::Arc::new(Mutex::new(Vec::new()));
        let (writer, guard) = non_blocking(Stuck {
            release: rx,
            got: got.clone(),
        });
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for i in 0..3 {
                // One write per record, as the fmt layer makes it (it formats the line first).
                let line = format!("record {i}\n");
                writer.make_writer().write_all(line.as_bytes()).unwrap();
            }
            done.send(()).unwrap();
        });
        // The destination has not taken one byte yet, and the callers are already through.
        finished
            .recv_timeout(Duration::from_secs(5))
            .expect("a caller waited for the stuck destination");
        for _ in 0..3 {
            release.send(()).unwrap();
        }
        drop(guard);
        assert_eq!(
            String::from_utf8(got.lock().unwrap().clone()).unwrap(),
            "record 0\nrecord 1\nrecord 2\n"
        );
    }

    #[test]
    fn time_format() {
        assert_eq!(rfc3339_micros(UNIX_EPOCH), "1970-01-01T00:00:00.000000Z");
        let t = UNIX_EPOCH + Duration::from_micros(1_709_251_199_123_456);
        assert_eq!(rfc3339_micros(t), "2024-02-29T23:59:59.123456Z");
    }

    #[test]
    fn control_characters_are_escaped() {
        let forged =
            "ok\n2024-01-01T00:00:00Z\terror\tcni-agent\tforged \u{1b}[31mred\r\u{9b}x\u{7f}";
        let text = escape_controls(forged, Controls::All);
        assert_eq!(
            text,
            "ok\\n2024-01-01T00:00:00Z\\terror\\tcni-agent\\tforged \\u{1b}[31mred\\r\\u{9b}x\\u{7f}"
        );
        assert!(!text.chars().any(char::is_control));
        let json = escape_controls(forged, Controls::BeyondAscii);
        assert!(json.contains('\n') && json.contains("\\u{9b}") && json.contains("\\u{7f}"));
        assert!(matches!(
            escape_controls("plain é", Controls::All),
            std::borrow::Cow::Borrowed(_)
        ));
    }

    #[test]
    fn scope_filter() {
        let mut scopes = BTreeMap::new();
        scopes.insert("cni-plugin".to_string(), Some(Level::DEBUG));
        scopes.insert("default".to_string(), None);
        let l = ScopeLevels {
            default: Some(Level::WARN),
            scopes,
        };
        assert!(l.allows("cni-plugin", &Level::DEBUG));
        assert!(!l.allows("cni-agent", &Level::INFO));
        assert!(l.allows("cni-agent", &Level::ERROR));
        assert!(!l.allows("default", &Level::ERROR));
        assert_eq!(scope_of("istio_cni::install::guard"), "cni-agent");
        assert_eq!(scope_of("notify::inotify"), "default");
    }
}
