//! The node agent's settings: parsed by install-cni's config (flags and env under Istio's
//! names and defaults, `install::config::resolve`), gathered here for the agent, plus the agent's
//! own time budgets.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::kube::selector::enablement::EnablementSelector;
use crate::kube::{RetryPolicy, WatchBackoff};
use crate::retry::periodic::Periodic;

/// Ambient node-agent settings read from env/flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentConfig {
    /// `ZTUNNEL_UDS_ADDRESS` / `--ztunnel-uds-address`, default `/var/run/ztunnel/ztunnel.sock`.
    pub ztunnel_uds_address: PathBuf,
    /// `AMBIENT_DNS_CAPTURE`, code default false (chart: true).
    pub dns_capture: bool,
    /// `AMBIENT_IPV6`, code default false (chart: true).
    pub ipv6: bool,
    /// `AMBIENT_RECONCILE_POD_RULES_ON_STARTUP`, code default false (chart: true).
    pub reconcile_pod_rules_on_startup: bool,
    /// `SYSTEM_NAMESPACE`, default `istio-system`: where `app=ztunnel` pods are ztunnel.
    pub system_namespace: String,
    /// `POD_NAME` (read, unused, as Istio).
    pub pod_name: String,
    /// `NODE_NAME`: the pod store's `spec.nodeName` field selector.
    pub node_name: String,
    /// `HOST_PROBE_SNAT_IP`, default `169.254.7.127`.
    pub host_probe_snat_ip: IpAddr,
    /// `HOST_PROBE_SNAT_IPV6`, default `fd16:9254:7127:1337:ffff:ffff:ffff:ffff`.
    pub host_probe_snat_ipv6: IpAddr,
    /// `AMBIENT_USE_SCOPED_XTABLES_LOCKING`, default true.
    pub scoped_xtables_locking: bool,
    /// `AMBIENT_ENABLE_AWS_BRANCH_ENI_PROBE`, default true.
    pub aws_branch_eni_probe: bool,
    /// `FORCE_IPTABLES_BINARY` (`legacy` | `nft`).
    pub force_iptables_binary: Option<String>,
    /// `ALLOW_SWITCH_TO_HOST_NS`, default false.
    pub allow_switch_to_host_ns: bool,
}

/// Everything the agent runs with.
#[derive(Debug, Clone)]
pub struct Settings {
    pub config: AgentConfig,
    /// `CNI_AGENT_RUN_DIR`: `pluginevent.sock` lives here.
    pub run_dir: PathBuf,
    /// `EXCLUDE_NAMESPACES`.
    pub exclude_namespaces: Vec<String>,
    /// `AMBIENT_ENABLEMENT_SELECTOR`.
    pub enablement_selectors: Vec<EnablementSelector>,
    /// `NATIVE_NFTABLES`.
    pub native_nftables: bool,
    /// `--host-proc-dir` / `HOST_PROC_DIR` (default `/host/proc`): the /proc netns scan.
    pub host_proc_dir: PathBuf,
    /// `POD_NAMESPACE`.
    pub pod_namespace: String,
    pub timing: AgentTiming,
    /// `DRIFT_VERIFY_INTERVAL` and the kick of install-cni's guard: when the drift pass runs
    /// (`None`: never).
    pub drift: Option<Periodic>,
}

/// The agent's time budgets. Every wait has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentTiming {
    /// Initial sync of the pod and namespace stores (readiness); install-cni gives no deadline
    /// (`Duration::MAX`): it waits for the API server however long it is away.
    pub sync_timeout: Duration,
    /// The longest wait between retries of the namespace watch (`API_RETRY_MAX_DELAY`).
    pub watch_retry_max: Duration,
    /// Each Kubernetes call (annotation patches).
    pub kube_call_timeout: Duration,
    /// Retry spacing of failed events (Istio: 5 ms doubling to 5 s per item), jittered.
    pub retry: RetryPolicy,
    /// A /cmdadd pod missing from the store is looked up again this often ...
    pub stale_cache_interval: Duration,
    /// ... this many times (Istio: 10 × 10 ms).
    pub stale_cache_attempts: u32,
    /// How long a /cmdadd waits for its enrolment before answering 504 (the enrolment runs on).
    /// Below the plugin's 5 s exchange timeout, so the plugin reports the agent's reason (L23).
    pub plugin_answer_budget: Duration,
    /// Events handled at once across pods (one pod's events are always handled in order).
    pub max_concurrent_pods: usize,
}

impl Default for AgentTiming {
    fn default() -> Self {
        AgentTiming {
            sync_timeout: Duration::from_secs(60),
            watch_retry_max: WatchBackoff::default().max,
            kube_call_timeout: Duration::from_secs(5),
            retry: RetryPolicy {
                first: Duration::from_millis(5),
                max: Duration::from_secs(5),
                max_attempts: None,
            },
            stale_cache_interval: Duration::from_millis(10),
            stale_cache_attempts: 10,
            plugin_answer_budget: Duration::from_millis(4500),
            max_concurrent_pods: 16,
        }
    }
}

impl Settings {
    /// Path of the plugin-event socket.
    pub fn plugin_event_socket(&self) -> PathBuf {
        self.run_dir.join(crate::wire::event::PLUGIN_EVENT_SOCKET)
    }
}
