//! The repair controller: a sidecar pod that started before the CNI plugin was installed on
//! its node has no redirection, so its `istio-validation` init container fails (exit 126) and
//! crash-loops. The controller finds such pods in install-cni's node pod store and acts once per
//! pod UID: programs the sidecar rules in the pod's netns (`REPAIR_REPAIR_PODS`, so the
//! validation container succeeds on its next restart), deletes the pod (`REPAIR_DELETE_PODS`) or
//! labels it (`REPAIR_LABEL_PODS`); the first true mode wins, as in Istio.
//!
//! Files: `detect` (pure: is this pod broken), `controller` (the reconcile on the one engine,
//! triggered by the store's subscription and the drift pass: per-pod keyed, once per UID, the
//! error policy with jittered backoff), `effects` (what acting does: the API calls, and the netns
//! programming through the SAME derivation (`sidecar`) and entry (`apply::pod`) as the plugin; the
//! netns is found with `netns::procfs`), `heal` (what the drift pass brings for a pod's next run,
//! the engine's per-key payload, and the in-place heal that run does), `drift` (the sidecar drift
//! pass — running sidecar pods verified on a jittered period (`DRIFT_VERIFY_INTERVAL`) and when
//! the guard re-installed our entry; a drifted pod is a trigger of its key carrying the heal,
//! while its derivation is unchanged, else a hand-off to the controller's policy; it runs only
//! with the controller, i.e. with `REPAIR_ENABLED=true`). Every write to a pod — the policy's
//! and the drift heal — is a run of the pod's key on the one engine, so never two at once.
//! Files import downward only, never in a circle: `detect` and `effects` (with the `Effects`
//! seam the controller acts through) below `heal`, below `controller`, below `drift`.
//!
//! May call: `cli`, `kube`, `retry`, `reconcile`, `sidecar`, `apply`, `netns`, `netlink`, `telemetry`.

pub mod controller;
pub mod detect;
pub mod drift;
pub mod effects;
pub mod heal;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::kube::stores::PodStore;
use crate::kube::{KubeClient, RetryPolicy};
use crate::telemetry::metrics::Metrics;
use controller::Controller;
use detect::{Detection, FilterError};
use effects::KubeEffects;

/// Repair controller settings (flags/env parsed by install-cni's config under Istio's names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairConfig {
    pub enabled: bool,
    pub delete_pods: bool,
    pub label_pods: bool,
    pub repair_pods: bool,
    pub broken_pod_label_key: String,
    pub broken_pod_label_value: String,
    pub node_name: String,
    pub sidecar_annotation: String,
    pub init_container_name: String,
    pub init_container_termination_message: String,
    pub init_container_exit_code: i32,
    pub label_selectors: String,
    pub field_selectors: String,
}

/// What is done to a broken pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// Program the sidecar rules in the pod's netns. A pod that cannot run its init containers
    /// again (`restartPolicy: Never`) is deleted for its controller to recreate instead, or, with
    /// no controller, gets this broken-pod label (`detect::cannot_restart`).
    Repair {
        key: String,
        value: String,
    },
    Delete,
    Label {
        key: String,
        value: String,
    },
    /// No mode set: broken pods are only logged.
    Detect,
}

impl Mode {
    /// Istio's precedence: repair > delete > label.
    pub fn of(cfg: &RepairConfig) -> Mode {
        if cfg.repair_pods {
            Mode::Repair {
                key: cfg.broken_pod_label_key.clone(),
                value: cfg.broken_pod_label_value.clone(),
            }
        } else if cfg.delete_pods {
            Mode::Delete
        } else if cfg.label_pods {
            Mode::Label {
                key: cfg.broken_pod_label_key.clone(),
                value: cfg.broken_pod_label_value.clone(),
            }
        } else {
            Mode::Detect
        }
    }

    /// The metric's `type` label.
    pub fn as_str(&self) -> &'static str {
        match self {
            Mode::Repair { .. } => "repair",
            Mode::Delete => "delete",
            Mode::Label { .. } => "label",
            Mode::Detect => "detect",
        }
    }
}

/// What repair mode needs from the host (install-cni's settings).
#[derive(Debug, Clone)]
pub struct HostSettings {
    /// `HOST_PROC_DIR`: the netns of a pod is found by scanning it.
    pub host_proc_dir: PathBuf,
    /// `NATIVE_NFTABLES`.
    pub native_nftables: bool,
    /// `FORCE_IPTABLES_BINARY` (`legacy` | `nft`).
    pub force_iptables_binary: Option<String>,
    /// The node's backend record (ambient): without `FORCE_IPTABLES_BINARY`, its flavour is the
    /// one every repair and drift heal uses, as the agent and the plugin do. Read at each use:
    /// the agent may write it after this controller started.
    pub flavour_record: Option<PathBuf>,
}

/// The controller's time budgets. Every wait has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepairTiming {
    /// Each Kubernetes call.
    pub kube_call_timeout: Duration,
    /// Spacing of retries of one pod (jittered); `max_attempts` attempts in all (Istio: 5).
    pub retry: RetryPolicy,
}

impl Default for RepairTiming {
    fn default() -> Self {
        RepairTiming {
            kube_call_timeout: Duration::from_secs(5),
            // client-go's per-item limiter starts at 5 ms; a broken pod's netns may appear a
            // little later than its status, so start at 100 ms and give it ~10 s in all.
            retry: RetryPolicy {
                first: Duration::from_millis(100),
                max: Duration::from_secs(5),
                max_attempts: Some(5),
            },
        }
    }
}

/// Why the controller did not start (install-cni exits 1 naming the variable).
#[derive(Debug, thiserror::Error)]
pub enum RepairError {
    #[error("repair controller: {0}")]
    Filter(#[from] FilterError),
    #[error("repair controller: FORCE_IPTABLES_BINARY={0:?}: expected legacy or nft")]
    ForceBinary(String),
}

/// A running controller (stops with the token it was started with).
pub struct Repair {
    pub task: tokio::task::JoinHandle<()>,
    /// The sidecar drift pass, when `DRIFT_VERIFY_INTERVAL` is not 0.
    pub drift: Option<tokio::task::JoinHandle<()>>,
    /// Why the work that enters pods' netns (repair mode, the drift pass) is refused: the node's
    /// netns could not be identified (fail closed). For readiness.
    pub netns_refused: Option<String>,
}

/// Starts the controller on install-cni's node pod store, and with `drift` the sidecar drift pass
/// next to it. Returns at once: readiness (the store's initial sync) is awaited by the caller,
/// which owns the store.
pub fn start(
    cfg: &RepairConfig,
    host: HostSettings,
    client: KubeClient,
    pods: PodStore,
    metrics: Metrics,
    drift: Option<drift::DriftSettings>,
    stop: &CancellationToken,
) -> Result<Repair, RepairError> {
    let drift = drift.filter(|_| match drift::unusable_proc(&host.host_proc_dir) {
        Some(why) => {
            tracing::warn!("sidecar drift check off: {why}");
            false
        }
        None => true,
    });
    let detection = Detection::new(cfg)?;
    let mode = Mode::of(cfg);
    let timing = RepairTiming::default();
    let effects = KubeEffects::new(client, host, timing.kube_call_timeout)?;
    info!(
        mode = mode.as_str(),
        node = %cfg.node_name,
        init_container = %cfg.init_container_name,
        exit_code = cfg.init_container_exit_code,
        "starting the repair controller"
    );
    // Only the work that enters pods' netns needs the node's identified.
    let netns_refused = effects
        .netns_refused()
        .filter(|_| matches!(mode, Mode::Repair { .. }) || drift.is_some());
    let drift = match &netns_refused {
        Some(why) => {
            if matches!(mode, Mode::Repair { .. }) {
                tracing::warn!("repair mode refuses every broken pod (fail closed): {why}");
            }
            if drift.is_some() {
                tracing::warn!("sidecar drift check off (fail closed): {why}");
            }
            None
        }
        None => drift,
    };
    let env = effects.engine();
    let controller = Controller {
        pods,
        detection,
        mode,
        effects: Arc::new(effects),
        metrics,
        timing,
    };
    let repairs = controller.engine(stop.child_token());
    let drift = drift.map(|d| {
        let pass = drift::DriftPass {
            env,
            exclude_namespaces: d.exclude_namespaces,
            repairs: repairs.clone(),
            memory: drift::DriftMemory::default(),
        };
        let schedule = crate::retry::periodic::Periodic::new(d.period, d.kick);
        tokio::spawn(pass.run(schedule, stop.child_token()))
    });
    let task = tokio::spawn(controller::pump(repairs, stop.child_token()));
    Ok(Repair {
        task,
        drift,
        netns_refused,
    })
}

/// Istio's defaults with repair on for node `n1` (the unit tests' starting point).
#[cfg(test)]
pub(crate) fn test_config() -> RepairConfig {
    RepairConfig {
        enabled: true,
        delete_pods: false,
        label_pods: false,
        repair_pods: true,
        broken_pod_label_key: "cni.istio.io/uninitialized".into(),
        broken_pod_label_value: "true".into(),
        node_name: "n1".into(),
        sidecar_annotation: "sidecar.istio.io/status".into(),
        init_container_name: "istio-validation".into(),
        init_container_termination_message: String::new(),
        init_container_exit_code: 126,
        label_selectors: String::new(),
        field_selectors: String::new(),
    }
}
