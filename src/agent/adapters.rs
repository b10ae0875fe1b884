//! The real seams: the agent's traits (`ports`) implemented by its data plane and by the ZDS
//! server, and the pod cache offered to ZDS as the snapshot source. Errors pass through with
//! their own types (classified once, in `mesh`); every behaviour stays in its own module.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use super::dataplane::{Dataplane, DataplaneError};
use super::ports::{self, PodNet, PodWorkload, PortFuture};
use crate::netns::Netns;
use crate::netns::reserved::Reserved;
use crate::zds::{SnapshotEntry, SnapshotSource, ZdsError, ZdsHandle};

impl ports::DataplanePort for Dataplane {
    fn open_netns(&self, cni_netns_path: &str) -> Result<Netns, DataplaneError> {
        Dataplane::open_netns(self, cni_netns_path)
    }

    fn reserved_netns(&self) -> Reserved {
        Dataplane::reserved_netns(self)
    }

    fn netns_addresses(&self, netns: &Netns, pod: &PodNet) -> Result<Vec<IpAddr>, DataplaneError> {
        Dataplane::netns_addresses(self, netns, pod)
    }

    fn netns_alive(&self, netns: &Netns) -> bool {
        netns.still_named()
    }

    fn find_netns(&self, wanted: &HashMap<String, Vec<IpAddr>>) -> HashMap<String, Netns> {
        Dataplane::find_netns(self, wanted)
    }

    fn program_pod(
        &self,
        netns: &Netns,
        pod: &PodNet,
    ) -> Result<ports::RuleChange, DataplaneError> {
        Dataplane::program_pod(self, netns, pod)
    }

    fn unprogram_pod(&self, netns: &Netns, pod: &PodNet) -> Result<(), DataplaneError> {
        Dataplane::unprogram_pod(self, netns, pod)
    }

    fn probe_add(
        &self,
        uid: &str,
        ips: &[IpAddr],
        believed: Option<&ports::ProbeEntries>,
    ) -> Result<(), DataplaneError> {
        Dataplane::probe_add(self, uid, ips, believed)
    }

    fn probe_remove(
        &self,
        uid: &str,
        ips: &[IpAddr],
        believed: Option<&ports::ProbeEntries>,
    ) -> Result<(), DataplaneError> {
        Dataplane::probe_remove(self, uid, ips, believed)
    }

    fn probe_sync(
        &self,
        members: &[(String, Vec<IpAddr>)],
        prune: bool,
    ) -> Result<ports::ProbeSynced, DataplaneError> {
        Dataplane::probe_sync(self, members, prune)
    }

    fn verify_host(&self) -> Result<Option<String>, DataplaneError> {
        Dataplane::verify_host(self)
    }

    fn uninstall_host(&self) -> Result<(), DataplaneError> {
        Dataplane::uninstall_host(self)
    }
}

impl ports::Ztunnel for ZdsHandle {
    fn add_workload(&self, uid: String, info: PodWorkload, netns: Arc<Netns>) -> PortFuture<'_> {
        Box::pin(async move { ZdsHandle::add_workload(self, &uid, &info, &netns).await })
    }

    fn del_workload<'a>(&'a self, uid: &'a str) -> PortFuture<'a> {
        Box::pin(async move { ZdsHandle::del_workload(self, uid).await })
    }

    fn workload_states(&self) -> HashMap<String, ports::WorkloadState> {
        ZdsHandle::workload_states(self)
    }
}

/// ztunnel's state of the world is the pod cache: every cached pod, with its netns when known
/// (a Keep otherwise). A snapshot is asked for when a ztunnel (re)connects: then every pod still
/// awaiting ztunnel is triggered, so its add completes now instead of after its backoff.
pub struct ZtunnelWorld {
    pub engine: super::reconciler::PodEngine,
}

impl SnapshotSource for ZtunnelWorld {
    fn snapshot(&self) -> Vec<SnapshotEntry> {
        let cached = self.engine.reconciler().mesh.cache.snapshot();
        for (_, pod) in cached.iter().filter(|(_, p)| p.awaiting_ztunnel) {
            let key = crate::kube::stores::pod_key(&pod.info.namespace, &pod.info.name);
            self.engine.trigger(key);
        }
        cached
            .into_iter()
            .map(|(uid, pod)| SnapshotEntry {
                uid,
                info: pod.info,
                netns: pod.netns,
            })
            .collect()
    }
}

/// The data plane's settings from the agent's. The host's root is mounted where its /proc
/// mount's parent is (`/host/proc` -> `/host`, the chart's layout); plugin netns paths are opened
/// under it.
pub fn dataplane_settings(
    settings: &super::settings::Settings,
) -> super::dataplane::DataplaneSettings {
    let c = &settings.config;
    let host_prefix = settings
        .host_proc_dir
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_else(|| "/".into());
    super::dataplane::DataplaneSettings {
        ambient: crate::rules::ambient::AmbientConfig {
            probe_snat_v4: c.host_probe_snat_ip.to_string(),
            probe_snat_v6: c.host_probe_snat_ipv6.to_string(),
            enable_ipv6: c.ipv6,
            redirect_dns: c.dns_capture,
        },
        native_nftables: settings.native_nftables,
        // The install config accepts only these two values (anything else is refused there).
        force_iptables_binary: match c.force_iptables_binary.as_deref() {
            Some("legacy") => Some(crate::apply::ForceBinary::Legacy),
            Some("nft") => Some(crate::apply::ForceBinary::Nft),
            _ => None,
        },
        host_prefix,
        host_proc: settings.host_proc_dir.clone(),
        allow_switch_to_host_ns: c.allow_switch_to_host_ns,
        scoped_xtables_locking: c.scoped_xtables_locking,
        skip_host_rules: false,
        aws_branch_eni_probe: c.aws_branch_eni_probe,
        recorded: None,
    }
}

/// Why the real seams could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum AdapterError {
    #[error("ambient data plane: {0}")]
    Dataplane(#[from] DataplaneError),
    #[error("ambient data plane set-up task failed: {0}")]
    Task(#[source] tokio::task::JoinError),
    #[error("ZDS server: {0}")]
    Zds(#[from] ZdsError),
}

/// The backend decided at a node's first install, and its file in the run dir (the data plane's
/// decision, recorded by install-cni).
pub use crate::apply::backend::{RECORD_FILE, Recorded};

/// Builds the real data plane (backend decision, host rules, probe sets) off the async runtime;
/// `recorded` is the backend recorded at the node's first install. Returns the decision made
/// (the caller records it).
pub async fn real_dataplane(
    settings: &super::settings::Settings,
    recorded: Option<crate::apply::backend::Recorded>,
) -> Result<
    (
        Arc<dyn ports::DataplanePort>,
        crate::apply::backend::Decision,
    ),
    AdapterError,
> {
    let mut dp_settings = dataplane_settings(settings);
    dp_settings.recorded = recorded;
    let built = tokio::task::spawn_blocking(move || Dataplane::new(&dp_settings))
        .await
        .map_err(AdapterError::Task)??;
    let decision = built.decision().clone();
    Ok((Arc::new(built), decision))
}

/// Starts the ZDS server on `ZTUNNEL_UDS_ADDRESS` with the agent's pod cache as ztunnel's state
/// of the world, and binds it as the agent's ztunnel. Called after [`super::Agent::start`]: a
/// ztunnel connecting earlier would get a snapshot without the restored pods and drop them.
pub async fn serve_ztunnel(
    agent: &super::Agent,
    late: &ports::LateZtunnel,
    socket: std::path::PathBuf,
    metrics: crate::telemetry::metrics::Metrics,
    stop: tokio_util::sync::CancellationToken,
) -> Result<(), AdapterError> {
    let cfg = crate::zds::ZdsConfig {
        socket,
        metrics,
        ..Default::default()
    };
    let world = Arc::new(ZtunnelWorld {
        engine: agent.engine().clone(),
    });
    let handle = crate::zds::serve(cfg, world, stop).await?;
    late.bind(Arc::new(handle));
    Ok(())
}
