//! The seams of the agent: what it needs from the data plane (in-pod rules, host probe set, netns
//! lookup), from ztunnel (ZDS) and from the API server (the redirection annotation). The shapes
//! follow `agent::dataplane::Dataplane` and `zds::ZdsHandle`; the state machine, the worker and
//! the plugin-event server are tested against fakes of these traits.
//!
//! Each seam fails with its own room's error: the data plane with [`DataplaneError`], ztunnel with
//! [`ZdsError`], the API server with [`KubeError`]. Whether trying again may help is decided once,
//! by the agent's classification of the step that failed (`mesh::classify`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;

use super::pod::ANN_REDIRECTION;
use crate::kube::{EventRecord, KubeClient, KubeError, MetadataPatch, PodPatchVia};
use crate::netns::Netns;
use crate::netns::reserved::Reserved;

/// The data plane's error (its own room's type).
pub use super::dataplane::DataplaneError;
/// The ZDS server's error (its own room's type).
pub use crate::zds::ZdsError;

/// Probe-set entries: IP -> the UID its comment names (the data plane's own type).
pub use crate::apply::probe_set::Entries as ProbeEntries;

/// What the data plane needs to program one pod (the data plane's own type).
pub use super::dataplane::PodNet;
/// What a probe-set reconcile changed (the data plane's own type).
pub use super::dataplane::ProbeSynced;
/// What programming a pod did: `AlreadyApplied` when the netns held exactly the rules (nothing
/// written), anything else when it had to write (the apply room's one outcome type).
pub use crate::apply::RuleChange;

/// In-pod rules, the host probe set and netns lookup. Blocking calls: the agent runs them on
/// the blocking pool.
pub trait DataplanePort: Send + Sync + 'static {
    /// Opens the netns the runtime named (`CNI_NETNS`), under the host prefix.
    fn open_netns(&self, cni_netns_path: &str) -> Result<Netns, DataplaneError>;
    /// The namespaces no pod may claim: the agent's own and the node's
    /// (`<HOST_PROC_DIR>/1/ns/net`); unidentified, every netns is refused.
    fn reserved_netns(&self) -> Reserved;
    /// The interface addresses inside `netns` (read over netlink there), offered as `pod`'s.
    fn netns_addresses(&self, netns: &Netns, pod: &PodNet) -> Result<Vec<IpAddr>, DataplaneError>;
    /// Whether `netns` still exists where it was found ([`Netns::still_named`]); a netns that
    /// does not is gone, and its pod may take another.
    fn netns_alive(&self, netns: &Netns) -> bool;
    /// The /proc scan: pod UID -> its netns, for the wanted pods (UID -> IPs).
    fn find_netns(&self, wanted: &HashMap<String, Vec<IpAddr>>) -> HashMap<String, Netns>;
    /// In-pod rules and routes; idempotent and atomic. Reads the netns first: an unchanged pod
    /// is not written (`RuleChange::AlreadyApplied`).
    fn program_pod(&self, netns: &Netns, pod: &PodNet) -> Result<RuleChange, DataplaneError>;
    fn unprogram_pod(&self, netns: &Netns, pod: &PodNet) -> Result<(), DataplaneError>;
    /// Adds (replacing other owners of the same IP) the pod's IPs to the probe set. `believed`:
    /// what the agent's cache says the set holds at these IPs and for `uid` (planned from it,
    /// the kernel asked only when it disagrees).
    fn probe_add(
        &self,
        uid: &str,
        ips: &[IpAddr],
        believed: Option<&ProbeEntries>,
    ) -> Result<(), DataplaneError>;
    /// Removes only entries owned by `uid` (`believed` as for [`DataplanePort::probe_add`]).
    fn probe_remove(
        &self,
        uid: &str,
        ips: &[IpAddr],
        believed: Option<&ProbeEntries>,
    ) -> Result<(), DataplaneError>;
    /// Makes the set hold `members` (read fresh from the kernel); with `prune`, entries of anyone
    /// else go. Returns what it had to change.
    fn probe_sync(
        &self,
        members: &[(String, Vec<IpAddr>)],
        prune: bool,
    ) -> Result<ProbeSynced, DataplaneError>;
    /// The host probe SNAT rules (iptables: `ISTIO_POSTRT` and its POSTROUTING jump; nftables:
    /// the host table) and the probe sets themselves, read and compared with the plan, written
    /// only where they differ: `None` when all was in place, else what was repaired. A data
    /// plane without host rules has nothing to check (the default).
    fn verify_host(&self) -> Result<Option<String>, DataplaneError> {
        Ok(None)
    }
    /// Removes the host probe SNAT rules and the probe sets (an uninstall, after the agent
    /// stopped). A data plane without host rules has nothing to remove (the default).
    fn uninstall_host(&self) -> Result<(), DataplaneError> {
        Ok(())
    }
}

/// Workload identity sent to ztunnel (the ZDS room's own type).
pub use crate::zds::PodWorkload;

/// What a ztunnel seam call returns.
pub type PortFuture<'a> = BoxFuture<'a, Result<(), ZdsError>>;

/// The ZDS server as the agent uses it. The add takes its arguments owned: the future may
/// outlive the caller's borrows, and every implementation states one short signature.
pub trait Ztunnel: Send + Sync + 'static {
    /// Sends the pod to the newest ztunnel connection; returns after its ack.
    fn add_workload(&self, uid: String, info: PodWorkload, netns: Arc<Netns>) -> PortFuture<'_>;
    /// Tells every connection the pod is gone (no connection: Ok).
    fn del_workload<'a>(&'a self, uid: &'a str) -> PortFuture<'a>;
    /// What was last sent about each pod (UID), on which connection, and ztunnel's answer
    /// (the debug endpoint's ZDS state). Empty where nothing is recorded (the default).
    fn workload_states(&self) -> HashMap<String, WorkloadState> {
        HashMap::new()
    }
}

/// What was last sent to ztunnel about a pod (the ZDS room's own type).
pub use crate::zds::ledger::{Delivery, WorkloadState};

/// What an annotator call returns.
pub type KubeFuture<'a> = BoxFuture<'a, Result<(), KubeError>>;

/// What the agent writes to the API server about a pod: the `ambient.istio.io/redirection`
/// annotation (`None` removes it) and events (the drift pass's heals and failures).
pub trait Annotator: Send + Sync + 'static {
    fn set_redirection<'a>(&'a self, pod: &'a Pod, value: Option<&'a str>) -> KubeFuture<'a>;
    /// Records an event about the pod (source component [`EVENT_COMPONENT`]).
    fn event<'a>(&'a self, pod: &'a Pod, event: EventRecord) -> KubeFuture<'a>;
}

/// The source component of the agent's events.
pub const EVENT_COMPONENT: &str = "istio-cni-node";

/// The real thing: a JSON merge patch on `pods/status` (needs less privilege than the pod).
pub struct KubeAnnotator {
    pub client: KubeClient,
    pub timeout: std::time::Duration,
}

impl Annotator for KubeAnnotator {
    fn set_redirection<'a>(&'a self, pod: &'a Pod, value: Option<&'a str>) -> KubeFuture<'a> {
        let (namespace, name) = (super::pod::namespace(pod), super::pod::name(pod));
        Box::pin(async move {
            let patch = match value {
                Some(v) => MetadataPatch::default().set_annotation(ANN_REDIRECTION, v),
                None => MetadataPatch::default().remove_annotation(ANN_REDIRECTION),
            };
            self.client
                .patch_pod_metadata(PodPatchVia::Status, namespace, name, &patch, self.timeout)
                .await
                .map(|_| ())
        })
    }

    fn event<'a>(&'a self, pod: &'a Pod, event: EventRecord) -> KubeFuture<'a> {
        Box::pin(async move {
            self.client
                .create_pod_event(pod, &event, self.timeout)
                .await
        })
    }
}

/// A ztunnel seam bound after the agent has started: the ZDS server must only accept ztunnel
/// once the startup snapshot is in the pod cache (a ztunnel drops whatever its first snapshot
/// lacks), while the agent's add path exists from the start. Until bound, an add fails as
/// [`ZdsError::NotRunning`] (retried).
#[derive(Default)]
pub struct LateZtunnel {
    inner: std::sync::OnceLock<Arc<dyn Ztunnel>>,
}

impl LateZtunnel {
    /// Binds the real seam (the first bind wins).
    pub fn bind(&self, ztunnel: Arc<dyn Ztunnel>) {
        let _ = self.inner.set(ztunnel);
    }
}

impl Ztunnel for LateZtunnel {
    fn add_workload(&self, uid: String, info: PodWorkload, netns: Arc<Netns>) -> PortFuture<'_> {
        match self.inner.get() {
            Some(z) => z.add_workload(uid, info, netns),
            None => Box::pin(async { Err(ZdsError::NotRunning) }),
        }
    }

    fn del_workload<'a>(&'a self, uid: &'a str) -> PortFuture<'a> {
        match self.inner.get() {
            Some(z) => z.del_workload(uid),
            // Nobody connected can hold the pod: nothing to tell.
            None => Box::pin(async { Ok(()) }),
        }
    }

    fn workload_states(&self) -> HashMap<String, WorkloadState> {
        self.inner
            .get()
            .map(|z| z.workload_states())
            .unwrap_or_default()
    }
}
