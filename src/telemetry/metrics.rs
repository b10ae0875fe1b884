//! Istio's CNI metrics in one registry, served as OpenMetrics text or Prometheus' classic
//! text format 0.0.4 (what Istio serves), chosen by the scraper's `Accept` header. Counters are
//! registered without `_total`; the encoder appends it, giving Istio's exact names. The
//! `process_*` series of the Prometheus process collector come with every scrape (`process`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// `result` label of `istio_cni_installs_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

/// `response_code` label of `istio_cni_plugin_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResponseCodeLabel {
    pub response_code: String,
}

/// `type` label of `nodeagent_reconcile_events_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventTypeLabel {
    pub r#type: String,
}

/// Labels of `istio_cni_repair_pods_repaired_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RepairLabels {
    pub r#type: String,
    pub result: String,
}

/// `kind` label of the drift counters: `ambient_rules`, `probe_set`, `sidecar_rules`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DriftLabel {
    pub kind: String,
}

/// `setting` label of `istio_cni_settings_adjusted_total`: the env var (or flag).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SettingLabel {
    pub setting: String,
}

/// Handles to every metric; clone-cheap (the metrics are shared).
#[derive(Clone, Default)]
pub struct Metrics {
    pub installs: Family<ResultLabel, Counter>,
    pub install_ready: Gauge,
    pub plugin_requests: Family<ResponseCodeLabel, Counter>,
    pub reconcile_events: Family<EventTypeLabel, Counter>,
    pub ztunnel_connected: Gauge,
    pub pods_repaired: Family<RepairLabels, Counter>,
    /// Ours: drift found in a pod's netns (or the probe set) and healed.
    pub drift_repaired: Family<DriftLabel, Counter>,
    /// Ours: drift found and NOT healed (reported with an event; not retried until it changes).
    pub drift_unhealed: Family<DriftLabel, Counter>,
    /// Ours: settings given a value Istio accepts that was applied in its safe reading.
    pub settings_adjusted: Family<SettingLabel, Counter>,
}

impl Metrics {
    /// Counts one install pass.
    pub fn install_result(&self, result: &str) {
        self.installs
            .get_or_create(&ResultLabel {
                result: result.to_string(),
            })
            .inc();
    }

    /// Counts one drift healed (`healed`) or reported as not healable.
    pub fn drift(&self, kind: &str, healed: bool) {
        let family = if healed {
            &self.drift_repaired
        } else {
            &self.drift_unhealed
        };
        family
            .get_or_create(&DriftLabel {
                kind: kind.to_string(),
            })
            .inc();
    }

    /// Counts one setting whose value was given its safe reading at start.
    pub fn setting_adjusted(&self, setting: &str) {
        self.settings_adjusted
            .get_or_create(&SettingLabel {
                setting: setting.to_string(),
            })
            .inc();
    }

    /// Builds the registry holding all metrics.
    pub fn registry(&self) -> Registry {
        let mut r = Registry::default();
        r.register(
            "istio_cni_installs",
            "Total number of CNI plugin installs",
            self.installs.clone(),
        );
        r.register(
            "istio_cni_install_ready",
            "Whether the CNI plugin installation is ready or not",
            self.install_ready.clone(),
        );
        r.register(
            "istio_cni_plugin_requests",
            "Total number of CNI plugin requests handled by the node agent",
            self.plugin_requests.clone(),
        );
        r.register(
            "nodeagent_reconcile_events",
            "Total number of node agent reconcile events",
            self.reconcile_events.clone(),
        );
        r.register(
            "ztunnel_connected",
            "Number of connected ztunnels",
            self.ztunnel_connected.clone(),
        );
        r.register(
            "istio_cni_repair_pods_repaired",
            "Total number of pods repaired by the repair controller",
            self.pods_repaired.clone(),
        );
        r.register(
            "istio_cni_settings_adjusted",
            "Total number of settings whose given value was applied in its safe reading at start",
            self.settings_adjusted.clone(),
        );
        r.register(
            "istio_cni_drift_repaired",
            "Total number of drifted redirection rules (or probe set entries) found and healed",
            self.drift_repaired.clone(),
        );
        r.register(
            "istio_cni_drift_unhealed",
            "Total number of drifted pods found that could not be healed (reported)",
            self.drift_unhealed.clone(),
        );
        // Read at scrape time, as the Go client's process collector Istio's agent registers.
        r.register_collector(Box::new(super::process::ProcessCollector));
        r
    }
}

/// Renders the registry as OpenMetrics text.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, registry).is_err() {
        out.clear();
    }
    out
}

/// The two exposition formats `/metrics` speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0 text.
    OpenMetrics,
    /// Prometheus text format 0.0.4 (the classic format; what Istio's agent serves).
    Classic,
}

impl Format {
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Classic => "text/plain; version=0.0.4; charset=utf-8",
        }
    }

    /// Content negotiation on an `Accept` header: OpenMetrics when it is asked for with at least
    /// the weight of the classic text format; the classic format otherwise, also without a header
    /// (as Go's promhttp does).
    pub fn negotiate(accept: Option<&str>) -> Format {
        let mut openmetrics_q = 0.0f32;
        let mut text_q = 0.0f32;
        for range in accept.unwrap_or_default().split(',') {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or_default().to_ascii_lowercase();
            let q = parts
                .filter_map(|p| p.split_once('='))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("q"))
                .and_then(|(_, v)| v.trim().parse::<f32>().ok())
                .unwrap_or(1.0);
            match media.as_str() {
                "application/openmetrics-text" => openmetrics_q = openmetrics_q.max(q),
                "text/plain" | "text/*" | "*/*" => text_q = text_q.max(q),
                _ => {}
            }
        }
        if openmetrics_q > 0.0 && openmetrics_q >= text_q {
            Format::OpenMetrics
        } else {
            Format::Classic
        }
    }
}

/// Renders the registry in `format`.
pub fn render_as(registry: &Registry, format: Format) -> String {
    let openmetrics = render(registry);
    match format {
        Format::OpenMetrics => openmetrics,
        Format::Classic => openmetrics_to_classic(&openmetrics),
    }
}

/// Rewrites OpenMetrics text as text format 0.0.4: a counter family is named after its samples
/// (`x_total` in `# HELP`/`# TYPE`), `_created` samples, `# UNIT`, exemplars and `# EOF` go,
/// and types 0.0.4 lacks become `untyped`.
pub fn openmetrics_to_classic(text: &str) -> String {
    // HELP precedes TYPE, so learn every family's type first.
    let types: std::collections::HashMap<&str, &str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_once(' '))
        .collect();
    let is_counter = |family: &str| types.get(family) == Some(&"counter");
    let family_name = |family: &str| {
        if is_counter(family) {
            format!("{family}_total")
        } else {
            family.to_string()
        }
    };
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (family, kind) = rest.split_once(' ').unwrap_or((rest, "unknown"));
            let kind = match kind {
                "counter" | "gauge" | "histogram" | "summary" => kind,
                _ => "untyped",
            };
            out.push_str(&format!("# TYPE {} {kind}\n", family_name(family)));
        } else if let Some(rest) = line.strip_prefix("# HELP ") {
            let (family, help) = rest.split_once(' ').unwrap_or((rest, ""));
            out.push_str(&format!("# HELP {} {help}\n", family_name(family)));
        } else if line.starts_with("# UNIT ") || line == "# EOF" {
            // Not part of 0.0.4.
        } else if line.starts_with('#') || line.is_empty() {
            out.push_str(line);
            out.push('\n');
        } else {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            let created = name.strip_suffix("_created").is_some_and(is_counter);
            if !created {
                // An exemplar follows " # " after the value; 0.0.4 has none.
                out.push_str(line.split(" # ").next().unwrap_or(line));
                out.push('\n');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_labels_match_istio() {
        let m = Metrics::default();
        m.install_result("SUCCESS");
        m.install_result("CREATE_CNI_CONFIG_FAILURE");
        m.install_ready.set(1);
        let text = render(&m.registry());
        assert!(
            text.contains("istio_cni_installs_total{result=\"SUCCESS\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("istio_cni_installs_total{result=\"CREATE_CNI_CONFIG_FAILURE\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("istio_cni_install_ready 1\n"), "{text}");
        assert!(text.contains("# TYPE ztunnel_connected gauge"), "{text}");
    }

    #[test]
    fn classic_format_names_counters_after_their_samples_and_has_no_eof() {
        let m = Metrics::default();
        m.install_result("SUCCESS");
        m.install_ready.set(1);
        let text = render_as(&m.registry(), Format::Classic);
        for want in [
            "# HELP istio_cni_installs_total Total number of CNI plugin installs.\n",
            "# TYPE istio_cni_installs_total counter\n",
            "istio_cni_installs_total{result=\"SUCCESS\"} 1\n",
            "# TYPE istio_cni_install_ready gauge\n",
            "istio_cni_install_ready 1\n",
        ] {
            assert!(text.contains(want), "{want:?} missing:\n{text}");
        }
        assert!(!text.contains("# EOF"), "{text}");
        assert!(
            !text.contains("# TYPE istio_cni_installs counter"),
            "{text}"
        );
        assert!(text.ends_with('\n'));
        let openmetrics = render_as(&m.registry(), Format::OpenMetrics);
        assert!(openmetrics.ends_with("# EOF\n"), "{openmetrics}");
    }

    #[test]
    fn classic_conversion_drops_what_0_0_4_lacks() {
        let om = "# HELP c A counter.\n# TYPE c counter\n# UNIT c seconds\nc_total 3 # {id=\"x\"} 1\nc_created 1.7e9\n# TYPE i info\ni_info{v=\"1\"} 1\n# EOF\n";
        assert_eq!(
            openmetrics_to_classic(om),
            "# HELP c_total A counter.\n# TYPE c_total counter\nc_total 3\n# TYPE i untyped\ni_info{v=\"1\"} 1\n"
        );
    }

    #[test]
    fn accept_header_negotiation() {
        let cases = [
            (None, Format::Classic),
            (Some(""), Format::Classic),
            (Some("*/*"), Format::Classic),
            (Some("text/plain;version=0.0.4"), Format::Classic),
            (Some("text/plain; version=0.0.4; q=1.0"), Format::Classic),
            (
                Some("application/openmetrics-text; version=1.0.0"),
                Format::OpenMetrics,
            ),
            (
                Some(
                    "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
                ),
                Format::OpenMetrics,
            ),
            (
                Some("application/openmetrics-text;q=0.2,text/plain;version=0.0.4;q=0.9"),
                Format::Classic,
            ),
            (Some("application/openmetrics-text;q=0"), Format::Classic),
            (Some("application/json"), Format::Classic),
        ];
        for (accept, want) in cases {
            assert_eq!(Format::negotiate(accept), want, "{accept:?}");
        }
    }
}
