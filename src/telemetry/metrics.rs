//! Istio's CNI metrics (§2.12) in one registry, served as Prometheus/OpenMetrics text. Counters are
//! registered without `_total`; the encoder appends it, giving Istio's exact names.

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

/// Handles to every metric; clone-cheap (the metrics are shared).
#[derive(Clone, Default)]
pub struct Metrics {
    pub installs: Family<ResultLabel, Counter>,
    pub install_ready: Gauge,
    pub plugin_requests: Family<ResponseCodeLabel, Counter>,
    pub reconcile_events: Family<EventTypeLabel, Counter>,
    pub ztunnel_connected: Gauge,
    pub pods_repaired: Family<RepairLabels, Counter>,
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
        r
    }
}

/// Renders the registry as text.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, registry).is_err() {
        out.clear();
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
}
