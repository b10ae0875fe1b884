//! The plugin's log records to the agent's log sink: `POST /log` on `<run dir>/log.sock`, the
//! body a JSON array of strings, each string one record — a JSON object with `level` (`error`,
//! `warn`, `info`, `debug`), `time`, `msg` and the record's own keys (Istio's shape). The plugin
//! writes records with [`Record::to_object`], the sink reads them with [`Record::parse`].

use serde_json::{Map, Value};

/// File name of the sink socket in the agent's run dir.
pub const SOCKET_NAME: &str = "log.sock";

/// The sink's path.
pub const PATH: &str = "/log";

/// Largest body the sink accepts (the plugin splits its batches below this).
pub const MAX_BATCH_BYTES: usize = 2 * 1024 * 1024;

/// One log record.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Record {
    pub level: String,
    pub time: String,
    pub msg: String,
    /// The record's own keys.
    pub fields: Map<String, Value>,
}

impl Record {
    /// The JSON object the plugin sends; a field named like a fixed key does not replace it.
    pub fn to_object(&self) -> Map<String, Value> {
        let mut obj = Map::new();
        obj.insert("level".into(), self.level.clone().into());
        obj.insert("time".into(), self.time.clone().into());
        obj.insert("msg".into(), self.msg.clone().into());
        for (k, v) in &self.fields {
            obj.entry(k.clone()).or_insert_with(|| v.clone());
        }
        obj
    }

    /// A record string as the sink reads it, or `None` when it is not a JSON object. A fixed key
    /// that is not a string is taken as its JSON text; `scope` is dropped (the sink sets its own).
    pub fn parse(line: &str) -> Option<Record> {
        let Ok(Value::Object(mut obj)) = serde_json::from_str::<Value>(line) else {
            return None;
        };
        let mut text = |key: &str| match obj.remove(key) {
            Some(Value::String(s)) => s,
            Some(other) => other.to_string(),
            None => String::new(),
        };
        let (level, time, msg) = (text("level"), text("time"), text("msg"));
        obj.remove("scope");
        Some(Record {
            level,
            time,
            msg,
            fields: obj,
        })
    }
}

/// A `/log` body's records, or `None` when it is not a JSON array of strings.
pub fn decode_batch(body: &[u8]) -> Option<Vec<String>> {
    serde_json::from_slice(body).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_record_is_pinned_and_reads_back() {
        let record = Record {
            level: "warn".into(),
            time: "1970-01-01T00:00:00.000000Z".into(),
            msg: "hello".into(),
            fields: [
                ("pod".to_string(), json!("ns/p")),
                ("msg".to_string(), json!("x")),
            ]
            .into_iter()
            .collect(),
        };
        let line = Value::Object(record.to_object()).to_string();
        assert_eq!(
            line,
            r#"{"level":"warn","msg":"hello","pod":"ns/p","time":"1970-01-01T00:00:00.000000Z"}"#
        );
        let back = Record::parse(&line).unwrap();
        assert_eq!((back.level.as_str(), back.msg.as_str()), ("warn", "hello"));
        assert_eq!(
            back.fields,
            [("pod".to_string(), json!("ns/p"))].into_iter().collect()
        );
        let odd = Record::parse(r#"{"level":3,"scope":"x","k":1}"#).unwrap();
        assert_eq!((odd.level.as_str(), odd.msg.as_str()), ("3", ""));
        assert_eq!(
            odd.fields,
            [("k".to_string(), json!(1))].into_iter().collect()
        );
        assert_eq!(Record::parse("[1]"), None);
        assert_eq!(
            decode_batch(br#"["a","b"]"#),
            Some(vec!["a".to_string(), "b".to_string()])
        );
        assert_eq!(decode_batch(br#"[1]"#), None);
    }
}
