//! Adding a pod to the mesh and removing it, with Istio's error classes: a pod whose
//! netns cannot be found or whose in-pod rules fail is not retried (nothing was written); a
//! ztunnel that is absent or refuses leaves the pod `pending` and is retried; probe-set and
//! annotation failures are retried.

use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use tracing::{debug, info, warn};

use super::cache::PodCache;
use super::cni_ips;
use super::dataplane::DataplaneError;
use super::pod::{self, Redirection};
use super::ports::{Annotator, DataplanePort, Ztunnel};
use super::progress::{self, AddStep, Progress};
use super::trust;
use crate::kube::KubeError;
use crate::netns::Netns;
use crate::reconcile::{Class, Classify};
use crate::zds::ZdsError;

/// Which step of an add or remove failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MeshStep {
    FindNetns,
    ProgramPod,
    ProbeSet,
    UnprogramPod,
}

/// A failed add/remove; names the pod and the step, keeps the cause.
#[derive(Debug, thiserror::Error)]
pub enum MeshError {
    #[error("pod {pod}: {step:?} failed: {source}")]
    Dataplane {
        pod: String,
        step: MeshStep,
        #[source]
        source: DataplaneError,
    },
    #[error("pod {pod}: Ztunnel failed: {source}")]
    Ztunnel {
        pod: String,
        #[source]
        source: ZdsError,
    },
    /// The blocking task running a data-plane call panicked or was cancelled.
    #[error("pod {pod}: {step:?} failed: data-plane task failed: {source}")]
    Task {
        pod: String,
        step: MeshStep,
        #[source]
        source: tokio::task::JoinError,
    },
    #[error("pod {pod}: writing the redirection annotation failed: {source}")]
    Annotate {
        pod: String,
        #[source]
        source: KubeError,
    },
    #[error("pod {pod}: no netns found (not announced by the plugin and not found in /proc)")]
    NoNetns { pod: String },
    #[error("pod {pod}: refused: {reason}")]
    Refused {
        pod: String,
        #[source]
        reason: trust::Refusal,
    },
    #[error("pod {pod}: its namespace is not in the agent's namespace store yet")]
    NamespaceMissing { pod: String },
    #[error("pod {pod}: gone from the agent's pod store before its add ran")]
    NotInStore { pod: String },
}

impl Classify for MeshError {
    fn class(&self) -> Class {
        classify(self)
    }
}

/// The one decision of what a failure means for the pod's key (and for the plugin waiting on
/// it). Nothing was written when the netns cannot be found, is refused or cannot be programmed:
/// trying again changes nothing (the next event or plugin ADD does). A missing namespace waits
/// for the namespace's add, which looks at its pods again. A data-plane task that panicked, an
/// absent ztunnel, a refused or slow ztunnel, the host probe set and an annotation patch of a
/// pod that still exists are retried; a handle that is not a netns and a pod whose own netns,
/// addresses or in-pod rules fail are not (Istio: NonRetryable).
pub fn classify(e: &MeshError) -> Class {
    match e {
        MeshError::Task { .. } => Class::Retry,
        MeshError::Dataplane {
            step: MeshStep::FindNetns | MeshStep::ProgramPod,
            ..
        } => Class::GiveUp,
        MeshError::Dataplane { source, .. } => match source {
            DataplaneError::OpenNetns { .. }
            | DataplaneError::Enter { .. }
            | DataplaneError::Addresses { .. }
            | DataplaneError::Inpod { .. } => Class::GiveUp,
            _ => Class::Retry,
        },
        MeshError::Ztunnel { source, .. } => match source {
            ZdsError::NotANetns { .. } | ZdsError::Bind { .. } => Class::GiveUp,
            _ => Class::Retry,
        },
        MeshError::Annotate { source, .. } if source.is_not_found() => Class::GiveUp,
        MeshError::Annotate { .. } => Class::Retry,
        MeshError::NoNetns { .. } | MeshError::Refused { .. } | MeshError::NotInStore { .. } => {
            Class::GiveUp
        }
        MeshError::NamespaceMissing { .. } => Class::WaitFor,
    }
}

/// How an add came: the watch (netns from the cache or the /proc scan) or a plugin's `/cmdadd`.
pub enum Via<'a> {
    Watch,
    Plugin(&'a PluginAdd),
}

impl Via<'_> {
    fn progress(&self) -> Option<&Progress> {
        match self {
            Via::Watch => None,
            Via::Plugin(add) => Some(&add.progress),
        }
    }
}

/// What a plugin's `/cmdadd` says, none of it believed until checked ([`trust::verify`]).
#[derive(Debug, Default)]
pub struct PluginAdd {
    /// `CNI_NETNS` (empty: the runtime gave none; found as the watch would).
    pub netns: String,
    /// The event's `IPs`.
    pub event_ips: Vec<IpAddr>,
    /// The node's other pods (the pod store), asked only about the addresses the netns holds.
    pub others: Option<Arc<dyn AddressOwners>>,
    pub progress: Arc<Progress>,
    /// `/podadd`: the `enabled` annotation is not written before the answer but owed (see
    /// [`Mesh::annotate_owed`]); Istio's `/cmdadd` writes it first.
    pub annotate_after_answer: bool,
}

/// Which other pods hold any of some addresses: asked with the few addresses a netns holds, so an
/// ADD costs a lookup, not a copy of every pod's name and IPs.
pub trait AddressOwners: Send + Sync {
    /// (`namespace/name` or UID, IP) of every pod other than `except_uid` holding one of `ips`.
    fn owners_of(&self, ips: &[IpAddr], except_uid: &str) -> Vec<(String, IpAddr)>;
}

impl std::fmt::Debug for dyn AddressOwners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AddressOwners")
    }
}

/// The add/remove steps over the seams. Callers run one pod's steps one at a time (the reconcile
/// engine never works a key twice at once).
pub struct Mesh {
    pub dataplane: Arc<dyn DataplanePort>,
    pub ztunnel: Arc<dyn Ztunnel>,
    pub annotator: Arc<dyn Annotator>,
    pub cache: Arc<PodCache>,
    /// Held by one probe-set change from reading what the cache believes the set holds to
    /// recording the change there, and by the drift pass's reconcile of the whole set: each
    /// change is planned against the cache (no dump of the set), so two may not interleave, and
    /// the members the drift pass reads are exactly what the set should hold. A change is one
    /// netlink message or a few, never a process.
    pub probe_gate: tokio::sync::Mutex<()>,
}

fn describe(p: &Pod) -> String {
    format!("{}/{}", pod::namespace(p), pod::name(p))
}

impl Mesh {
    /// Runs blocking data-plane work off the async threads; a failure names the pod and the step.
    pub(super) async fn blocking<T: Send + 'static>(
        &self,
        p: &Pod,
        step: MeshStep,
        work: impl FnOnce(&dyn DataplanePort) -> Result<T, DataplaneError> + Send + 'static,
    ) -> Result<T, MeshError> {
        let dp = self.dataplane.clone();
        match tokio::task::spawn_blocking(move || work(dp.as_ref())).await {
            Ok(result) => result.map_err(|source| MeshError::Dataplane {
                pod: describe(p),
                step,
                source,
            }),
            Err(source) => Err(MeshError::Task {
                pod: describe(p),
                step,
                source,
            }),
        }
    }

    /// Writes the annotation; any value written settles an owed `enabled` one.
    async fn annotate(&self, p: &Pod, value: Redirection) -> Result<(), MeshError> {
        self.annotator
            .set_redirection(p, value.as_str())
            .await
            .map_err(|source| MeshError::Annotate {
                pod: describe(p),
                source,
            })?;
        self.cache.set_annotation_owed(pod::uid(p), false);
        Ok(())
    }

    /// Istio's AddPodToMesh. `ips`: the pod's status IPs. A failed add of a pod already in the
    /// cache changes nothing (its entry, netns, probe entries, ztunnel's view and its rules stay
    /// as they were); only a new pod's placeholder is undone.
    pub async fn add_pod(&self, p: &Pod, ips: &[IpAddr], via: Via<'_>) -> Result<(), MeshError> {
        let progress = via.progress();
        let uid = pod::uid(p).to_string();
        let info = pod::workload_info(p);
        let was_cached = self.cache.contains(&uid);
        let undo = |e: MeshError| {
            if !was_cached {
                self.cache.take(&uid);
            }
            e
        };
        self.cache.ensure(&uid, info.clone());
        let (netns, ips) = self.netns_for(p, ips, &via).await.map_err(undo)?;
        progress::enter(progress, AddStep::ProgrammingRules);
        let pod_net = pod::pod_net(p, &ips);
        let ns = netns.clone();
        self.blocking(p, MeshStep::ProgramPod, move |dp| {
            dp.program_pod(&ns, &pod_net)
        })
        .await
        .map_err(undo)?;
        let netns = self.cache.upsert(&uid, info.clone(), netns);
        if let Via::Plugin(_) = via {
            // The ADD's own addresses, verified: the only evidence of one no status can hold
            // (kept for a pending pod too: its later add comes through the watch).
            let recorded = if cni_ips::beyond_status(&ips) {
                ips.clone()
            } else {
                vec![]
            };
            self.cache.set_cni_ips(&uid, recorded);
        }
        progress::enter(progress, AddStep::WaitingForZtunnelAck);
        if let Err(source) = self.ztunnel.add_workload(uid.clone(), info, netns).await {
            self.cache.set_awaiting_ztunnel(&uid, true);
            warn!(pod = %describe(p), "ztunnel did not take the pod yet, marking it pending: {source}");
            progress::enter(progress, AddStep::WritingAnnotation);
            self.annotate(p, Redirection::Pending).await?;
            return Err(MeshError::Ztunnel {
                pod: describe(p),
                source,
            });
        }
        self.cache.set_awaiting_ztunnel(&uid, false);
        // After ztunnel's ack, as in Istio: a pending pod has no probe-set entry.
        progress::enter(progress, AddStep::UpdatingProbeSet);
        self.probe_add(p, &uid, &ips).await?;
        if matches!(via, Via::Plugin(add) if add.annotate_after_answer) {
            // Off the ADD's critical path: the caller writes it after answering (annotate_owed),
            // and the drift pass re-asserts whatever is still owed.
            self.cache.set_annotation_owed(&uid, true);
            progress::enter(progress, AddStep::Done);
            info!(pod = %describe(p), uid, "pod enrolled in ambient (annotation follows)");
            return Ok(());
        }
        progress::enter(progress, AddStep::WritingAnnotation);
        self.annotate(p, Redirection::Enabled).await?;
        progress::enter(progress, AddStep::Done);
        info!(pod = %describe(p), uid, "pod enrolled in ambient");
        Ok(())
    }

    /// The pod's netns and the IPs verified with it. Not recorded in the cache here (only once
    /// its rules are in). The watch's add takes the cached netns while it lives (else the /proc
    /// scan, which checks ownership by IP); a plugin's netns, however it was found, must pass
    /// [`trust::verify`].
    async fn netns_for(
        &self,
        p: &Pod,
        ips: &[IpAddr],
        via: &Via<'_>,
    ) -> Result<(Arc<Netns>, Vec<IpAddr>), MeshError> {
        let uid = pod::uid(p).to_string();
        let cached = self.cache.netns(&uid);
        let alive = match cached.clone() {
            Some(ns) => {
                self.blocking(p, MeshStep::FindNetns, move |dp| Ok(dp.netns_alive(&ns)))
                    .await?
            }
            None => false,
        };
        let Via::Plugin(add) = via else {
            return match cached.filter(|_| alive) {
                Some(ns) => Ok((ns, ips.to_vec())),
                None => Ok((self.scan_netns(p, ips).await?, ips.to_vec())),
            };
        };
        add.progress.enter(AddStep::OpeningNetns);
        let offered = if add.netns.is_empty() {
            match cached.clone().filter(|_| alive) {
                Some(ns) => ns,
                None => {
                    let wanted: Vec<IpAddr> = ips.iter().chain(&add.event_ips).copied().collect();
                    self.scan_netns(p, &wanted).await?
                }
            }
        } else {
            let path = add.netns.clone();
            let opened = self
                .blocking(p, MeshStep::FindNetns, move |dp| dp.open_netns(&path))
                .await?;
            match &cached {
                // The same namespace: the handle already held is kept.
                Some(old) if old.id() == opened.id() => old.clone(),
                _ => Arc::new(opened),
            }
        };
        add.progress.opened(offered.id());
        add.progress.enter(AddStep::CheckingNetns);
        let claimed: Vec<IpAddr> = add.event_ips.iter().chain(ips).copied().collect();
        let (ns, pod_net) = (offered.clone(), pod::pod_net(p, &claimed));
        let (reserved, held) = self
            .blocking(p, MeshStep::FindNetns, move |dp| {
                Ok((dp.reserved_netns(), dp.netns_addresses(&ns, &pod_net)?))
            })
            .await?;
        let mut others = add
            .others
            .as_ref()
            .map(|o| o.owners_of(&held, &uid))
            .unwrap_or_default();
        others.extend(self.cache.owners_of(&held, &uid));
        let facts = trust::Offered {
            path: offered.path().display().to_string(),
            id: offered.id(),
            reserved,
            held,
            event_ips: add.event_ips.clone(),
            status_ips: ips.to_vec(),
            others,
            enrolled: cached.map(|old| trust::Enrolled {
                path: old.path().display().to_string(),
                id: old.id(),
                alive,
            }),
        };
        match trust::verify(&facts) {
            Ok(verified) => Ok((offered, verified)),
            Err(reason) => Err(MeshError::Refused {
                pod: describe(p),
                reason,
            }),
        }
    }

    /// The /proc scan for one pod (ownership checked by its IPs).
    async fn scan_netns(&self, p: &Pod, ips: &[IpAddr]) -> Result<Arc<Netns>, MeshError> {
        let uid = pod::uid(p).to_string();
        let wanted = std::collections::HashMap::from([(uid.clone(), ips.to_vec())]);
        let mut found = self
            .blocking(p, MeshStep::FindNetns, move |dp| Ok(dp.find_netns(&wanted)))
            .await?;
        match found.remove(&uid) {
            Some(ns) => Ok(Arc::new(ns)),
            None => Err(MeshError::NoNetns { pod: describe(p) }),
        }
    }

    /// Istio's RemovePodFromMesh. `deleted`: the pod is gone (or terminal) — its netns goes with
    /// it, so no in-pod cleanup; and a deleted pod's annotation is not patched (another pod
    /// may already carry the name).
    /// `ips`: the IPs the pod's probe entries were recorded with.
    pub async fn remove_pod(
        &self,
        p: &Pod,
        ips: &[IpAddr],
        deleted: bool,
        terminal: bool,
    ) -> Result<(), MeshError> {
        let uid = pod::uid(p).to_string();
        let ips = ips.to_vec();
        {
            let _gate = self.probe_gate.lock().await;
            let believed = self.cache.probe_believed(&uid, &ips);
            let (probe_uid, probe_ips) = (uid.clone(), ips.clone());
            self.blocking(p, MeshStep::ProbeSet, move |dp| {
                dp.probe_remove(&probe_uid, &probe_ips, believed.as_ref())
            })
            .await?;
            self.cache.set_probe_ips(&uid, Some(vec![]));
        }
        let cached = self.cache.take(&uid);
        if !deleted {
            match cached.as_ref().and_then(|c| c.netns.clone()) {
                Some(ns) => {
                    let pod_net = pod::pod_net(p, &pod::ips(p));
                    let result = self
                        .blocking(p, MeshStep::UnprogramPod, move |dp| {
                            dp.unprogram_pod(&ns, &pod_net)
                        })
                        .await;
                    if let Err(e) = result {
                        // Back in the cache, so the retry finds the netns again.
                        if let Some(c) = cached {
                            self.cache.restore(&uid, c);
                        }
                        return Err(e);
                    }
                }
                None => warn!(pod = %describe(p), "netns unknown, in-pod rules not removed"),
            }
        }
        self.ztunnel
            .del_workload(&uid)
            .await
            .map_err(|source| MeshError::Ztunnel {
                pod: describe(p),
                source,
            })?;
        if !deleted || terminal {
            match self.annotate(p, Redirection::None).await {
                Ok(()) => {}
                Err(MeshError::Annotate { source, .. }) if source.is_not_found() => {}
                Err(e) if deleted => debug!("clearing the annotation of a finished pod: {e}"),
                Err(e) => return Err(e),
            }
        }
        info!(pod = %describe(p), uid, deleted, "pod removed from ambient");
        Ok(())
    }

    /// Writes the `enabled` annotation a `/podadd` enrolment owes, only while it is still owed
    /// (a remove, a pending mark or a later add settles it meanwhile). `Ok(true)`: written now;
    /// `Ok(false)`: nothing owed.
    pub async fn annotate_owed(&self, p: &Pod) -> Result<bool, MeshError> {
        if !self.cache.annotation_owed(pod::uid(p)) {
            return Ok(false);
        }
        self.annotate(p, Redirection::Enabled).await.map(|()| true)
    }

    /// Puts an enrolled pod's (new) IPs in the probe set again.
    pub async fn reassert_probes(&self, p: &Pod, ips: &[IpAddr]) -> Result<(), MeshError> {
        self.probe_add(p, pod::uid(p), ips).await
    }

    /// Adds the pod's IPs to the probe set and records them in the cache (the drift pass's
    /// expected state), under the probe gate.
    async fn probe_add(&self, p: &Pod, uid: &str, ips: &[IpAddr]) -> Result<(), MeshError> {
        let _gate = self.probe_gate.lock().await;
        let believed = self.cache.probe_believed(uid, ips);
        let (probe_uid, probe_ips) = (uid.to_string(), ips.to_vec());
        self.blocking(p, MeshStep::ProbeSet, move |dp| {
            dp.probe_add(&probe_uid, &probe_ips, believed.as_ref())
        })
        .await?;
        self.cache.set_probe_ips(uid, Some(ips.to_vec()));
        Ok(())
    }
}

#[cfg(test)]
#[path = "mesh_tests.rs"]
mod tests;
