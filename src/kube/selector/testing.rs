//! Test-only values shared by every room's selector tests (compiled with `cfg(test)` only).

use std::collections::BTreeMap;

use serde_json::json;

use super::enablement::EnablementSelector;

/// A label map from `(key, value)` pairs.
pub(crate) fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The chart's default `ambient.enablementSelectors`.
pub(crate) fn chart_default() -> Vec<EnablementSelector> {
    serde_json::from_value(json!([
        {"podSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}}},
        {"podSelector": {"matchExpressions": [{"key": "istio.io/dataplane-mode", "operator": "NotIn", "values": ["none"]}]},
         "namespaceSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}}}
    ]))
    .expect("the chart's enablement selectors")
}
