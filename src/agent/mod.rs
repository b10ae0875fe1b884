//! The ambient node agent, started by install-cni when `AMBIENT_ENABLED=true`.
//!
//! Owns: the agent's settings (`settings`), what it reads from pods (`pod`), the pure enrolment
//! state machine (`machine`), the pod cache that is ztunnel's state of the world (`cache`), the
//! record of the addresses a pod's ADD verified that no status holds, and what a restarted agent
//! believes of it (`cni_ips`: only what the pod's netns still holds; not the netns alone), the
//! add/remove steps and their error classes (`mesh`), what it believes of a plugin's `/cmdadd`
//! (`trust`, pure) and where an add is (`progress`, named in a 504), the reconcile of one pod over the
//! one engine (`crate::reconcile`), fed by the kube stores, the plugin and the drift pass
//! (`reconciler`), the plugin-event server (`server`), the startup sequence and ordered
//! shutdown (here), and the drift pass that verifies enrolled pods' rules and the probe set
//! periodically and heals them (`drift`), what that pass finds and last found per pod and for the
//! host rules (`findings`), served as `/debug/pods` (`status`) with the node's other pods and why
//! each is not enrolled (`node_pods`). The in-pod rules, host probe set, netns finder and backend decision are the
//! data plane's (`dataplane`), ZDS is the `zds` room's; the agent reaches both and the API server's annotation
//! patch through the traits in `ports` (fakes in `testing`, test-only).
//!
//! Inside the room files import downward only, never in a circle (the room test holds it): `pod`
//! (over `dataplane`'s types) below `ports`; `findings` below `reconciler`; the drift pass
//! (`drift`) and the answer (`status`, over `node_pods`) above it.
//!
//! May call: `cli`, `kube`, `retry`, `reconcile`, `rules`, `sidecar`, `apply`, `netns`, `netlink`, `telemetry`, `zds`, `wire`.

pub mod adapters;
pub mod cache;
pub mod cni_ips;
pub mod dataplane;
pub mod drift;
pub mod findings;
pub mod machine;
pub mod mesh;
pub mod node_pods;
pub mod pod;
pub mod ports;
pub mod progress;
pub mod reconciler;
pub mod server;
pub mod settings;
pub mod status;
#[cfg(any(test, feature = "test-hooks"))]
pub mod testing;
pub mod trust;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::kube::stores::{self, PodStore, SyncError};
use crate::kube::{KubeClient, WatchBackoff};
use crate::telemetry::health::NotReady;
use cache::PodCache;
use machine::EnrolmentPolicy;
use mesh::Mesh;
use ports::{Annotator, DataplanePort, Ztunnel};
use reconciler::{Core, PodEngine};
use settings::Settings;

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("NODE_NAME is empty: the agent watches the pods of its own node only")]
    NoNodeName,
    #[error("AMBIENT_ENABLEMENT_SELECTOR: {0}")]
    Selectors(#[source] crate::kube::selector::SelectorError),
    #[error("plugin-event socket {path}: {source}")]
    Socket {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Sync(#[from] SyncError),
}

/// The agent's seams.
pub struct Deps {
    pub dataplane: Arc<dyn DataplanePort>,
    pub ztunnel: Arc<dyn Ztunnel>,
    pub annotator: Arc<dyn Annotator>,
    /// Where the agent's counters go (install-cni's registry).
    pub metrics: crate::telemetry::metrics::Metrics,
    /// The readiness `pluginevent.sock` reports to and the listeners' idle timeout.
    pub serving: crate::telemetry::serve::Serving,
}

/// A running agent.
pub struct Agent {
    engine: PodEngine,
    shutdown: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Agent {
    /// Startup: the namespace store and the plugin-event server first (requests wait for the store
    /// through the stale-cache retry); then the initial sync (with its deadline), the startup
    /// snapshot, and the queue. Returns when ready.
    ///
    /// `pods` is install-cni's one node-scoped pod store (`spec.nodeName=<NODE_NAME>`, shared with
    /// the repair controller); the caller owns its watch, the agent only subscribes.
    pub async fn start(
        settings: &Settings,
        client: &KubeClient,
        pods: PodStore,
        deps: Deps,
        parent: &CancellationToken,
    ) -> Result<Agent, AgentError> {
        if settings.config.node_name.is_empty() {
            return Err(AgentError::NoNodeName);
        }
        let policy = EnrolmentPolicy::new(
            &settings.enablement_selectors,
            &settings.exclude_namespaces,
            &settings.config.system_namespace,
        )
        .map_err(AgentError::Selectors)?;
        let shutdown = parent.child_token();
        let cache = PodCache::default();
        cache.record_cni_ips_in(settings.run_dir.clone());
        let backoff = WatchBackoff {
            max: settings.timing.watch_retry_max,
            ..WatchBackoff::default()
        };
        let readiness = deps.serving.readiness.clone();
        let namespaces = stores::spawn_namespace_store(client, backoff, shutdown.clone());
        let core = Arc::new(Core {
            pods,
            namespaces,
            policy,
            mesh: Mesh {
                dataplane: deps.dataplane,
                ztunnel: deps.ztunnel,
                annotator: deps.annotator,
                cache: Arc::new(cache),
                probe_gate: Default::default(),
            },
            timing: settings.timing,
            metrics: deps.metrics,
            status: Default::default(),
        });
        let engine = reconciler::engine(core.clone(), shutdown.clone());
        let path = settings.plugin_event_socket();
        let server = server::serve(path.clone(), engine.clone(), deps.serving, shutdown.clone())
            .await
            .map_err(|e| AgentError::Socket {
                path,
                source: e.source,
            })?;
        if let Err(e) = wait_for_stores(&core, settings.timing.sync_timeout, &readiness).await {
            shutdown.cancel();
            return Err(e.into());
        }
        info!(
            pods = core.pods.len(),
            namespaces = core.namespaces.len(),
            "pod and namespace stores synced"
        );
        restore_enrolled(
            &core,
            settings.config.reconcile_pod_rules_on_startup,
            &settings.run_dir,
        )
        .await;
        let pump = tokio::spawn(reconciler::pump(engine.clone(), shutdown.clone()));
        let namespaces = core.namespaces.clone();
        let (stop, ready) = (shutdown.clone(), readiness.clone());
        // Listed but no longer watched (RBAC without `watch`): not ready, naming the refusal.
        let refusals = tokio::spawn(async move {
            namespaces
                .follow_watch_refusals(stop, |why| {
                    ready.set_state(
                        NAMESPACE_WATCH,
                        why.map_or(Ok(()), |why| Err(NotReady::WatchRefused(why))),
                    );
                })
                .await
        });
        let mut tasks = vec![server, pump, refusals];
        match settings.drift.clone() {
            Some(schedule) => tasks.push(tokio::spawn(drift::run(
                engine.clone(),
                schedule,
                shutdown.clone(),
            ))),
            None => info!("drift verification off (DRIFT_VERIFY_INTERVAL=0)"),
        }
        Ok(Agent {
            engine,
            shutdown,
            tasks,
        })
    }

    pub fn core(&self) -> &Arc<Core> {
        self.engine.reconciler()
    }

    /// The engine running the agent's pod work.
    pub fn engine(&self) -> &PodEngine {
        &self.engine
    }

    /// Ordered shutdown: stop taking plugin events (the socket goes, so the plugin fails ADD
    /// fast instead of waiting), stop the queue and the watches; in-flight data-plane work
    /// finishes on its own threads. Waits at most `grace`.
    pub async fn stop(self, grace: Duration) {
        self.shutdown.cancel();
        let all = futures::future::join_all(self.tasks);
        if tokio::time::timeout(grace, all).await.is_err() {
            warn!("agent tasks did not stop within {grace:?}");
        }
        info!("ambient agent stopped");
    }
}

/// Waits for the pod and namespace stores' first lists (at most `deadline`), keeping the
/// `api-server` readiness component on why it still waits; ready once both synced.
async fn wait_for_stores(
    core: &Core,
    deadline: Duration,
    readiness: &crate::telemetry::health::Readiness,
) -> Result<(), SyncError> {
    use crate::telemetry::health::API_SERVER;
    let report = |why: &str| {
        warn!("waiting for the API server: {why}; retrying");
        readiness.set_state(API_SERVER, Err(NotReady::ApiServer(why.to_string())));
    };
    let both = async {
        core.pods.wait_until_synced(STORE_POLL, report).await;
        core.namespaces.wait_until_synced(STORE_POLL, report).await;
    };
    match tokio::time::timeout(deadline, both).await {
        Ok(_) => {
            readiness.set_state(API_SERVER, Ok(()));
            Ok(())
        }
        Err(_) => {
            let what = if core.pods.is_synced() {
                "namespace"
            } else {
                "pod"
            };
            Err(SyncError::Timeout {
                what,
                timeout: deadline,
            })
        }
    }
}

/// Readiness component of the namespace watch after its first list (not ready while refused).
const NAMESPACE_WATCH: &str = "namespace-watch";

/// How often a store waiting for its first list looks again (the watcher's own retries are
/// jittered and capped apart from this).
const STORE_POLL: Duration = Duration::from_millis(200);

/// The pods already enrolled (annotation `enabled`, not terminal, not ztunnel) are
/// ztunnel's state of the world after a restart. Their netns are found by one /proc scan, the
/// second addresses recorded at their ADD are believed again where that netns still holds them
/// (`cni_ips`), and their IPs go back into the probe set (pruning strangers only when every one
/// has an IP; the set is never flushed, B8); with `reconcile` their in-pod rules are re-applied
/// (drift repaired; errors only logged). A probe-set failure is logged, not fatal: unplugging
/// every pod (B17) would be worse than a stale set.
async fn restore_enrolled(core: &Arc<Core>, reconcile: bool, run_dir: &std::path::Path) {
    let snapshot: Vec<_> = core
        .pods
        .list()
        .into_iter()
        .filter(|p| machine::in_snapshot(p, &core.policy))
        .collect();
    let cache = &core.mesh.cache;
    let wanted: HashMap<String, Vec<std::net::IpAddr>> = snapshot
        .iter()
        .map(|p| {
            cache.ensure(pod::uid(p), pod::workload_info(p));
            (pod::uid(p).to_string(), pod::ips(p))
        })
        .collect();
    let dp = core.mesh.dataplane.clone();
    let found = if wanted.is_empty() {
        HashMap::new()
    } else {
        let scan = tokio::task::spawn_blocking(move || dp.find_netns(&wanted)).await;
        scan.unwrap_or_else(|_| {
            warn!("the startup /proc scan failed");
            HashMap::new()
        })
    };
    let mut found = found;
    let mut to_reconcile = Vec::new();
    for p in &snapshot {
        let uid = pod::uid(p);
        match found.remove(uid) {
            Some(ns) => {
                let ns = cache.upsert(uid, pod::workload_info(p), ns);
                to_reconcile.push((ns, pod::pod_net(p, &pod::ips(p))));
            }
            None => {
                warn!(pod = %format!("{}/{}", pod::namespace(p), pod::name(p)), "enrolled pod's netns not found; ztunnel keeps it without a netns")
            }
        }
    }
    let learnt = relearn_cni_ips(core, &snapshot, run_dir).await;
    let members: Vec<(String, Vec<std::net::IpAddr>)> = snapshot
        .iter()
        .map(|p| {
            let recorded = learnt
                .get(pod::uid(p))
                .map(Vec::as_slice)
                .unwrap_or_default();
            let ips = cni_ips::union(&pod::ips(p), recorded);
            (pod::uid(p).to_string(), ips)
        })
        .collect();
    let prune = members.iter().all(|(_, ips)| !ips.is_empty());
    if !prune {
        warn!("an enrolled pod has no IP yet; the probe set is not pruned this time");
    }
    for (uid, ips) in &members {
        // What the sync below puts in the set: the drift pass's expected entries (unknown
        // without an IP, and then it does not prune either).
        cache.set_probe_ips(uid, (!ips.is_empty()).then(|| ips.clone()));
        if let Some(recorded) = learnt.get(uid) {
            cache.set_cni_ips(uid, recorded.clone());
        }
    }
    // The record now holds exactly the pods believed (gone ones and refused addresses left out).
    cache.persist_cni_ips();
    let dp = core.mesh.dataplane.clone();
    let synced = tokio::task::spawn_blocking(move || dp.probe_sync(&members, prune)).await;
    match synced {
        Ok(Ok(_)) => cache.probe_set_synced(prune),
        Ok(Err(e)) => warn!("syncing the host probe set at startup failed (kept as it was): {e}"),
        Err(_) => warn!("the startup probe-set sync task failed"),
    }
    info!(
        enrolled = snapshot.len(),
        with_netns = to_reconcile.len(),
        "startup snapshot restored"
    );
    if reconcile && !to_reconcile.is_empty() {
        let dp = core.mesh.dataplane.clone();
        let _ = tokio::task::spawn_blocking(move || {
            for (ns, pod) in to_reconcile {
                if let Err(e) = dp.program_pod(&ns, &pod) {
                    warn!(pod = %format!("{}/{}", pod.namespace, pod.name), "reconciling in-pod rules failed: {e}");
                }
            }
        })
        .await;
    }
}

/// The second addresses recorded at the ADD of each enrolled pod (`cni_ips`), each believed only
/// when the netns the /proc scan found for the pod by its status IP still holds it, it is a pod
/// address, and no other pod of the node has it. UID -> the addresses believed.
async fn relearn_cni_ips(
    core: &Arc<Core>,
    snapshot: &[Arc<k8s_openapi::api::core::v1::Pod>],
    run_dir: &std::path::Path,
) -> HashMap<String, Vec<std::net::IpAddr>> {
    let record = cni_ips::read(run_dir).unwrap_or_else(|e| {
        warn!("{e}; no pod's second address is learnt again");
        cni_ips::Record::new()
    });
    let mut learnt = HashMap::new();
    if record.is_empty() {
        return learnt;
    }
    let owners: HashMap<std::net::IpAddr, (String, String)> = core
        .pods
        .list()
        .iter()
        .flat_map(|p| {
            let owner = (
                pod::uid(p).to_string(),
                format!("{}/{}", pod::namespace(p), pod::name(p)),
            );
            pod::ips(p)
                .into_iter()
                .map(move |ip| (ip.to_canonical(), owner.clone()))
        })
        .collect();
    for p in snapshot {
        let (uid, who) = (
            pod::uid(p),
            format!("{}/{}", pod::namespace(p), pod::name(p)),
        );
        let (Some(recorded), Some(ns)) = (record.get(uid), core.mesh.cache.netns(uid)) else {
            continue;
        };
        let (dp, pod_net) = (core.mesh.dataplane.clone(), pod::pod_net(p, &[]));
        let held = tokio::task::spawn_blocking(move || dp.netns_addresses(&ns, &pod_net)).await;
        let held = match held {
            Ok(Ok(held)) => held,
            Ok(Err(e)) => {
                warn!(pod = %who, "its recorded second addresses are not believed: {e}");
                continue;
            }
            Err(_) => continue,
        };
        let owner_of = |ip: std::net::IpAddr| {
            owners
                .get(&ip)
                .filter(|(other, _)| other != uid)
                .map(|(_, name)| name.clone())
        };
        let (kept, dropped) = cni_ips::validate(recorded, &held, owner_of);
        for d in dropped {
            warn!(pod = %who, ip = %d.ip, "a recorded address is not believed: {}", d.why);
        }
        if !kept.is_empty() {
            learnt.insert(uid.to_string(), kept);
        }
    }
    learnt
}
