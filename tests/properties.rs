//! Property tests of every parser of outside input (issue 13 §2): arbitrary bytes and strings,
//! plus structure-aware generators that produce near-valid inputs (valid JSON of the wrong type,
//! huge numbers, unicode, empty strings, duplicate keys). The properties: no panic, errors name
//! the field or key concerned, and round trips where an encoder exists. Case counts are bounded
//! so the file runs in seconds on a busy machine; see docs/reliability.md ("Inputs").

use proptest::prelude::*;
use serde_json::{Map, Value};

#[path = "properties/cniconf.rs"]
mod cniconf;
#[path = "properties/install.rs"]
mod install;
#[path = "properties/plugin.rs"]
mod plugin;
#[path = "properties/sidecar.rs"]
mod sidecar;
#[path = "properties/wire.rs"]
mod wire;

/// Cases per property: enough to find shape bugs, small enough for the normal test command.
pub fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 128,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Strings that stress parsers: empty, unicode, controls, separators, very long.
pub fn nasty_string() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-z0-9.-]{1,20}",
        "\\PC{0,24}",
        ".{0,8}",
        "[;=,/: \"\\\\]{0,6}",
        Just("é😀\u{0}\u{7f}\u{202e}".to_string()),
        Just("x".repeat(5000)),
    ]
}

/// Any JSON value, with the extremes decoders get wrong.
pub fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        Just(serde_json::json!(1e308)),
        Just(serde_json::json!(-0.0)),
        nasty_string().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map(nasty_string(), inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// An object over known keys (some in another case, as Go's decoder accepts) with any values.
pub fn object_over(keys: &'static [&'static str]) -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::vec(
        (prop::sample::select(keys), any::<bool>(), any_json()),
        0..keys.len() + 2,
    )
    .prop_map(|entries| {
        entries
            .into_iter()
            .map(|(k, upper, v)| {
                (
                    if upper {
                        k.to_uppercase()
                    } else {
                        k.to_string()
                    },
                    v,
                )
            })
            .collect()
    })
}

/// The object's JSON text with its first key repeated (a duplicate key, last one wins in serde).
pub fn with_duplicate_key(obj: &Map<String, Value>, dup: &Value) -> Vec<u8> {
    let body = serde_json::to_string(obj).expect("serialize");
    match obj.keys().next() {
        Some(k) => {
            let key = serde_json::to_string(k).expect("key");
            format!("{{{key}:{dup},{}", &body[1..]).into_bytes()
        }
        None => body.into_bytes(),
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn generators_produce_valid_json_with_duplicates(obj in object_over(&["a", "b"]), dup in any_json()) {
        let bytes = with_duplicate_key(&obj, &dup);
        prop_assert!(serde_json::from_slice::<Value>(&bytes).is_ok());
    }
}
