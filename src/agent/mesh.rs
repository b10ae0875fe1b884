//! Adding a pod to the mesh and removing it (§3.6), with Istio's error classes: a pod whose
//! netns cannot be found or whose in-pod rules fail is not retried (nothing was written); a
//! ztunnel that is absent or refuses leaves the pod `pending` and is retried; probe-set and
//! annotation failures are retried.

use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use tracing::{debug, info, warn};

use super::cache::PodCache;
use super::locks::PodLocks;
use super::pod::{self, Redirection};
use super::ports::{Annotator, Dataplane, PortError, Ztunnel};
use crate::kube::KubeError;
use crate::netns::Netns;

/// Which step of an add or remove failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    FindNetns,
    ProgramPod,
    Ztunnel,
    ProbeSet,
    Annotate,
    UnprogramPod,
    Blocking,
}

/// A failed add/remove; names the pod and the step, keeps the cause.
#[derive(Debug, thiserror::Error)]
pub enum MeshError {
    #[error("pod {pod}: {step:?} failed: {source}")]
    Port {
        pod: String,
        step: Step,
        #[source]
        source: PortError,
    },
    #[error("pod {pod}: writing the redirection annotation failed: {source}")]
    Annotate {
        pod: String,
        #[source]
        source: KubeError,
    },
    #[error("pod {pod}: no netns found (not announced by the plugin and not found in /proc)")]
    NoNetns { pod: String },
}

impl MeshError {
    /// Whether the worker should try again later.
    pub fn is_retryable(&self) -> bool {
        match self {
            MeshError::Port { step, source, .. } => match step {
                Step::FindNetns | Step::ProgramPod => false,
                _ => source.retryable,
            },
            MeshError::Annotate { .. } => true,
            MeshError::NoNetns { .. } => false,
        }
    }
}

/// The add/remove steps over the seams.
pub struct Mesh {
    pub dataplane: Arc<dyn Dataplane>,
    pub ztunnel: Arc<dyn Ztunnel>,
    pub annotator: Arc<dyn Annotator>,
    pub cache: Arc<PodCache>,
    /// Serialises the adds and removes of one pod (plugin requests and watch events).
    pub locks: PodLocks,
    /// Held shared by one pod's probe-set change and its record in the cache, exclusively by
    /// the drift pass's reconcile of the whole set: the members it reads from the cache are then
    /// exactly what the set should hold (no add or remove half done).
    pub probe_gate: tokio::sync::RwLock<()>,
}

fn describe(p: &Pod) -> String {
    format!("{}/{}", pod::namespace(p), pod::name(p))
}

impl Mesh {
    /// Runs blocking data-plane work off the async threads.
    async fn blocking<T: Send + 'static>(
        &self,
        p: &Pod,
        step: Step,
        work: impl FnOnce(&dyn Dataplane) -> Result<T, PortError> + Send + 'static,
    ) -> Result<T, MeshError> {
        let dp = self.dataplane.clone();
        let port = |step, source| MeshError::Port {
            pod: describe(p),
            step,
            source,
        };
        match tokio::task::spawn_blocking(move || work(dp.as_ref())).await {
            Ok(result) => result.map_err(|e| port(step, e)),
            Err(join) => Err(port(
                Step::Blocking,
                PortError::retryable(format!("data-plane task failed: {join}")),
            )),
        }
    }

    async fn annotate(&self, p: &Pod, value: Redirection) -> Result<(), MeshError> {
        self.annotator
            .set_redirection(p, value.as_str())
            .await
            .map_err(|source| MeshError::Annotate {
                pod: describe(p),
                source,
            })
    }

    /// §3.6 AddPodToMesh. `netns_path`: the plugin's `CNI_NETNS` (None: informer path).
    pub async fn add_pod(
        &self,
        p: &Pod,
        ips: &[IpAddr],
        netns_path: Option<&str>,
    ) -> Result<(), MeshError> {
        let _one_at_a_time = self.locks.lock(&describe(p)).await;
        let uid = pod::uid(p).to_string();
        let info = pod::workload_info(p);
        self.cache.ensure(&uid, info.clone());
        let netns = match self.netns_for(p, ips, netns_path).await {
            Ok(ns) => ns,
            Err(e) => {
                self.cache.take(&uid);
                return Err(e);
            }
        };
        let pod_net = pod::pod_net(p, ips);
        let ns = netns.clone();
        if let Err(e) = self
            .blocking(p, Step::ProgramPod, move |dp| dp.program_pod(&ns, &pod_net))
            .await
        {
            self.cache.take(&uid);
            return Err(e);
        }
        if let Err(source) = self.ztunnel.add_workload(uid.clone(), info, netns).await {
            warn!(pod = %describe(p), "ztunnel did not take the pod yet, marking it pending: {source}");
            self.annotate(p, Redirection::Pending).await?;
            return Err(MeshError::Port {
                pod: describe(p),
                step: Step::Ztunnel,
                source,
            });
        }
        // After ztunnel's ack, as in Istio: a pending pod has no probe-set entry.
        self.probe_add(p, &uid, ips).await?;
        self.annotate(p, Redirection::Enabled).await?;
        info!(pod = %describe(p), uid, "pod enrolled in ambient");
        Ok(())
    }

    async fn netns_for(
        &self,
        p: &Pod,
        ips: &[IpAddr],
        netns_path: Option<&str>,
    ) -> Result<Arc<Netns>, MeshError> {
        let uid = pod::uid(p).to_string();
        if let Some(path) = netns_path.filter(|p| !p.is_empty()) {
            let path = path.to_string();
            let ns = self
                .blocking(p, Step::FindNetns, move |dp| dp.open_netns(&path))
                .await?;
            return Ok(self.cache.upsert(&uid, pod::workload_info(p), ns));
        }
        if let Some(ns) = self.cache.netns(&uid) {
            return Ok(ns);
        }
        let wanted = std::collections::HashMap::from([(uid.clone(), ips.to_vec())]);
        let mut found = self
            .blocking(p, Step::FindNetns, move |dp| Ok(dp.find_netns(&wanted)))
            .await?;
        match found.remove(&uid) {
            Some(ns) => Ok(self.cache.upsert(&uid, pod::workload_info(p), ns)),
            None => Err(MeshError::NoNetns { pod: describe(p) }),
        }
    }

    /// §3.6 RemovePodFromMesh. `deleted`: the pod is gone (or terminal) — its netns goes with
    /// it, so no in-pod cleanup; and a deleted pod's annotation is not patched (another pod
    /// may already carry the name).
    pub async fn remove_pod(
        &self,
        p: &Pod,
        deleted: bool,
        terminal: bool,
    ) -> Result<(), MeshError> {
        let _one_at_a_time = self.locks.lock(&describe(p)).await;
        let uid = pod::uid(p).to_string();
        let ips = pod::ips(p);
        {
            let _gate = self.probe_gate.read().await;
            let (probe_uid, probe_ips) = (uid.clone(), ips.clone());
            self.blocking(p, Step::ProbeSet, move |dp| {
                dp.probe_remove(&probe_uid, &probe_ips)
            })
            .await?;
            self.cache.set_probe_ips(&uid, Some(vec![]));
        }
        let cached = self.cache.take(&uid);
        if !deleted {
            match cached.as_ref().and_then(|c| c.netns.clone()) {
                Some(ns) => {
                    let pod_net = pod::pod_net(p, &ips);
                    let result = self
                        .blocking(p, Step::UnprogramPod, move |dp| {
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
            .map_err(|source| MeshError::Port {
                pod: describe(p),
                step: Step::Ztunnel,
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

    /// Puts an enrolled pod's (new) IPs in the probe set again.
    pub async fn reassert_probes(&self, p: &Pod, ips: &[IpAddr]) -> Result<(), MeshError> {
        let _one_at_a_time = self.locks.lock(&describe(p)).await;
        self.probe_add(p, pod::uid(p), ips).await
    }

    /// Adds the pod's IPs to the probe set and records them in the cache (the drift pass's
    /// expected state), under the probe gate.
    async fn probe_add(&self, p: &Pod, uid: &str, ips: &[IpAddr]) -> Result<(), MeshError> {
        let _gate = self.probe_gate.read().await;
        let (probe_uid, probe_ips) = (uid.to_string(), ips.to_vec());
        self.blocking(p, Step::ProbeSet, move |dp| {
            dp.probe_add(&probe_uid, &probe_ips)
        })
        .await?;
        self.cache.set_probe_ips(uid, Some(ips.to_vec()));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::agent::testing::{FakeAnnotator, FakeDataplane, FakeZtunnel};

    /// The fake data plane, slow to program and counting programs in flight per pod.
    #[derive(Default)]
    struct Slow {
        inner: FakeDataplane,
        in_flight: HashMap<String, AtomicU32>,
        most: AtomicU32,
    }

    impl Dataplane for Slow {
        fn open_netns(&self, path: &str) -> Result<Netns, PortError> {
            self.inner.open_netns(path)
        }
        fn find_netns(&self, wanted: &HashMap<String, Vec<IpAddr>>) -> HashMap<String, Netns> {
            self.inner.find_netns(wanted)
        }
        fn program_pod(
            &self,
            netns: &Netns,
            pod: &crate::agent::ports::PodNet,
        ) -> Result<crate::agent::ports::Outcome, PortError> {
            let now = self.in_flight[&pod.uid].fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(30));
            self.in_flight[&pod.uid].fetch_sub(1, Ordering::SeqCst);
            self.inner.program_pod(netns, pod)
        }
        fn unprogram_pod(
            &self,
            netns: &Netns,
            pod: &crate::agent::ports::PodNet,
        ) -> Result<(), PortError> {
            self.inner.unprogram_pod(netns, pod)
        }
        fn probe_add(&self, uid: &str, ips: &[IpAddr]) -> Result<(), PortError> {
            self.inner.probe_add(uid, ips)
        }
        fn probe_remove(&self, uid: &str, ips: &[IpAddr]) -> Result<(), PortError> {
            self.inner.probe_remove(uid, ips)
        }
        fn probe_sync(
            &self,
            m: &[(String, Vec<IpAddr>)],
            prune: bool,
        ) -> Result<crate::agent::ports::ProbeSynced, PortError> {
            self.inner.probe_sync(m, prune)
        }
    }

    fn pod(name: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
            "status": {"podIPs": [{"ip": "10.0.0.9"}]}
        }))
        .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_plugin_add_and_a_watch_add_of_one_pod_never_interleave() {
        let slow = Arc::new(Slow {
            in_flight: ["uid-a", "uid-b"]
                .map(|u| (u.to_string(), AtomicU32::new(0)))
                .into(),
            ..Default::default()
        });
        let mesh = Arc::new(Mesh {
            dataplane: slow.clone(),
            ztunnel: Arc::new(FakeZtunnel::default()),
            annotator: Arc::new(FakeAnnotator::default()),
            cache: Arc::new(PodCache::default()),
            locks: PodLocks::default(),
            probe_gate: Default::default(),
        });
        let ip: IpAddr = "10.0.0.9".parse().unwrap();
        let add = |name: &'static str, netns: Option<&'static str>| {
            let mesh = mesh.clone();
            tokio::spawn(async move { mesh.add_pod(&pod(name), &[ip], netns).await })
        };
        // The plugin's ADD (with its netns) and the informer's add of the same pod, at once.
        let (plugin, watch) = (add("a", Some("/proc/self/ns/net")), add("a", None));
        plugin.await.unwrap().unwrap();
        watch.await.unwrap().unwrap();
        assert_eq!(slow.most.load(Ordering::SeqCst), 1);
        assert!(mesh.locks.is_empty());
        // Different pods are programmed side by side.
        let (a, b) = (add("a", None), add("b", Some("/proc/self/ns/net")));
        a.await.unwrap().unwrap();
        b.await.unwrap().unwrap();
        assert_eq!(slow.inner.count("program"), 4);
    }
}
