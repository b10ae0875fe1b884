//! log.sock batches: the body the plugin POSTs to `/log` (a JSON array of strings, each one JSON
//! record), re-emitted through the agent's formatter in both its JSON and text forms.
//! Properties: no panic; every emitted line is one line with no raw control character (the text
//! form's tab separators aside: a record cannot forge lines or send terminal escapes), and in JSON
//! form is valid JSON.
#![no_main]

use std::sync::{Arc, Mutex};

use istio_cni::telemetry::logging::IstioFormat;
use istio_cni::telemetry::logsink::emit_batch;
use libfuzzer_sys::fuzz_target;

struct SharedBuf(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for SharedBuf {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn emitted(lines: &[String], json: bool) -> String {
    let out = Arc::new(Mutex::new(Vec::new()));
    let sink = out.clone();
    let sub = tracing_subscriber::fmt()
        .event_format(IstioFormat { json })
        .with_writer(move || SharedBuf(sink.clone()))
        .with_max_level(tracing::Level::TRACE)
        .finish();
    tracing::subscriber::with_default(sub, || emit_batch(lines));
    let bytes = out.lock().unwrap().clone();
    String::from_utf8(bytes).expect("the log is UTF-8")
}

fuzz_target!(|body: &[u8]| {
    // What the sink does with a body: anything but an array of strings is dropped.
    let Ok(lines) = serde_json::from_slice::<Vec<String>>(body) else {
        return;
    };
    let records = lines.len();
    for json in [true, false] {
        let text = emitted(&lines, json);
        assert!(text.is_empty() || text.ends_with('\n'));
        let out: Vec<&str> = text.lines().collect();
        assert!(
            out.len() <= records,
            "{records} records became {} lines",
            out.len()
        );
        for line in out {
            // The text form separates its columns with tabs; a tab inside a value is escaped.
            let raw = |c: char| c.is_control() && !(c == '\t' && !json);
            assert!(!line.chars().any(raw), "raw control in {line:?}");
            if json {
                assert!(
                    serde_json::from_str::<serde_json::Value>(line).is_ok(),
                    "not JSON: {line}"
                );
            }
        }
    }
});
