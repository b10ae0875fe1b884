//! The Grafana dashboard and the Prometheus alert rules in deploy/monitoring/ use only metrics the
//! binary exports: every metric name in their PromQL must be in the registry `/metrics` serves
//! (Prometheus' classic text format, which names counters with `_total`, as Istio's do).

use std::collections::BTreeSet;

use istio_cni::telemetry::metrics::{
    EventTypeLabel, Format, Metrics, RepairLabels, ResponseCodeLabel, render_as,
};
use serde_json::Value;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/monitoring");

/// Every `expr` string anywhere in `v` (panel targets, alert rules).
fn exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("expr", Value::String(e)) => out.push(e.clone()),
                    _ => exprs(x, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| exprs(x, out)),
        _ => {}
    }
}

/// The metric names a PromQL expression reads: identifiers outside label matchers, ranges,
/// strings and `by`/`without` lists that are neither functions (followed by `(`) nor keywords.
fn metric_names(expr: &str) -> BTreeSet<String> {
    const KEYWORDS: [&str; 11] = [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "and",
        "or",
        "unless",
        "offset",
    ];
    // Aggregations may put `by (...)` between their name and their argument.
    const AGGREGATIONS: [&str; 12] = [
        "sum",
        "min",
        "max",
        "avg",
        "count",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
        "quantile",
        "count_values",
        "group",
    ];
    let mut names = BTreeSet::new();
    let chars: Vec<char> = expr.chars().collect();
    let (mut i, mut depth_braces, mut depth_brackets, mut in_string) = (0, 0, 0, false);
    let mut after_grouping = false;
    while i < chars.len() {
        let c = chars[i];
        if in_string {
            in_string = c != '"';
            i += 1;
            continue;
        }
        match c {
            '"' => in_string = true,
            '{' => depth_braces += 1,
            '}' => depth_braces -= 1,
            '[' => depth_brackets += 1,
            ']' => depth_brackets -= 1,
            _ => {}
        }
        if (c.is_ascii_alphabetic() || c == '_' || c == ':')
            && depth_braces == 0
            && depth_brackets == 0
        {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let next = chars[i..].iter().find(|c| !c.is_whitespace());
            if KEYWORDS.contains(&word.as_str()) {
                after_grouping = matches!(word.as_str(), "by" | "without" | "on" | "ignoring");
            } else if next == Some(&'(')
                || AGGREGATIONS.contains(&word.as_str())
                || after_grouping
                || start > 0 && chars[start - 1] == '$'
            {
                // A function, a grouping label list, or a Grafana variable.
            } else {
                names.insert(word);
            }
            continue;
        }
        if c == ')' {
            after_grouping = false;
        }
        i += 1;
    }
    names
}

/// Every metric the binary registers. A family is rendered only once it has a sample (as in a
/// running install-cni), so each gets one here.
fn exported() -> BTreeSet<String> {
    let m = Metrics::default();
    let s = |v: &str| v.to_string();
    m.install_result("SUCCESS");
    m.install_ready.set(1);
    m.plugin_requests
        .get_or_create(&ResponseCodeLabel {
            response_code: s("200"),
        })
        .inc();
    m.reconcile_events
        .get_or_create(&EventTypeLabel { r#type: s("add") })
        .inc();
    m.ztunnel_connected.set(1);
    m.pods_repaired
        .get_or_create(&RepairLabels {
            r#type: s("repair"),
            result: s("success"),
        })
        .inc();
    m.drift("ambient_rules", true);
    m.drift("ambient_rules", false);
    let text = render_as(&m.registry(), Format::Classic);
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

fn check(file: &str, doc: &Value) {
    let mut all = Vec::new();
    exprs(doc, &mut all);
    assert!(!all.is_empty(), "{file}: no PromQL found");
    let exported = exported();
    for e in &all {
        let used = metric_names(e);
        assert!(!used.is_empty(), "{file}: {e:?} reads no metric");
        for name in used {
            assert!(
                exported.contains(&name),
                "{file}: {e:?} uses {name}, which the binary does not export; it exports {exported:?}"
            );
        }
    }
}

#[test]
fn the_dashboard_uses_only_exported_metrics() {
    let file = "istio-cni-rs-dashboard.json";
    let text = std::fs::read_to_string(format!("{DIR}/{file}")).expect("dashboard");
    let doc: Value = serde_json::from_str(&text).expect("dashboard JSON");
    assert_eq!(doc["uid"], "istio-cni-rs");
    check(file, &doc);
    // The instance variable's query names a metric too.
    let query = doc["templating"]["list"][1]["query"]
        .as_str()
        .expect("query");
    assert!(query.contains("istio_cni_install_ready"), "{query}");
    // The process collector's series, which dashboards made for Istio's agent chart too.
    let mut all = Vec::new();
    exprs(&doc, &mut all);
    let used: BTreeSet<String> = all.iter().flat_map(|e| metric_names(e)).collect();
    for wanted in [
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ] {
        assert!(used.contains(wanted), "no panel reads {wanted}: {used:?}");
    }
}

#[test]
fn the_alert_rules_use_only_exported_metrics_and_cover_the_named_failures() {
    let file = "istio-cni-rs-alerts.yaml";
    let text = std::fs::read_to_string(format!("{DIR}/{file}")).expect("rules");
    let doc: Value = serde_saphyr::from_str(&text).expect("rules YAML");
    check(file, &doc);
    let mut all = Vec::new();
    exprs(&doc, &mut all);
    let used: BTreeSet<String> = all.iter().flat_map(|e| metric_names(e)).collect();
    for wanted in [
        "istio_cni_drift_unhealed_total",
        "ztunnel_connected",
        "istio_cni_plugin_requests_total",
    ] {
        assert!(used.contains(wanted), "no alert on {wanted}: {used:?}");
    }
}

#[test]
fn metric_names_are_read_out_of_promql() {
    let got = metric_names(
        r#"sum by (instance, kind) (increase(a_total{x!="y z", k=~"$v"}[15m])) > 0 or max(b) == on(instance) c"#,
    );
    assert_eq!(got, ["a_total", "b", "c"].map(String::from).into());
    // A misspelt metric is caught.
    let exported = exported();
    assert!(
        !exported.contains("istio_cni_drift_unhealed"),
        "{exported:?}"
    );
    assert!(
        exported.contains("istio_cni_drift_unhealed_total"),
        "{exported:?}"
    );
}
