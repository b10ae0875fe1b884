//! The plugin-event server: HTTP over `<run_dir>/pluginevent.sock`, `/cmdadd` (any
//! method, Istio's) and `/podadd` (ours: the plugin's one request, answered from the
//! stores with enrolled / not ambient with the pod / unknown; see [`handle_pod_add`]). Only a root peer (SO_PEERCRED uid 0, judged per connection by the listener,
//! `telemetry::serve`, and again here) is heard; anyone else gets 403 and a log line. The body is not believed: the netns and IPs it names are checked
//! (`trust`, through `mesh`) before anything is written, and every request is logged with the
//! caller's pid and uid, the netns path and its inode. 200 only once the pod is fully enrolled (rules in, ztunnel acked, annotation
//! written); a body that does not decode gets 400 naming the field and changes nothing; a pod
//! the store does not have (after the stale-cache retries) or that is not eligible gets 500, as
//! does a failed enrolment. An enrolment not done within `AgentTiming::plugin_answer_budget` (below
//! the plugin's own timeout) is answered 504 naming the step it is in (`progress`); the handler runs to completion
//! regardless, so a pod is never left half-enrolled by a dropped request.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Extension, State};
use axum::http::StatusCode;
use axum::routing::any;
use k8s_openapi::api::core::v1::Pod;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::mesh::{AddressOwners, MeshError, PluginAdd, classify};
use super::pod;
use super::progress::{AddStep, Progress};
use super::reconciler::{Core, PodEngine, Reconciled, Request};
use crate::kube::lookup::{self, NotYet, Query};
use crate::kube::stores::{self, PodStore, pod_key};
use crate::reconcile::{Class, Stopped};
use crate::telemetry::metrics::ResponseCodeLabel;
use crate::telemetry::serve::{self, ConnInfo, Limits, Serving, UnixServer};
use crate::telemetry::socket::{self, Peer, SocketError};
use crate::wire::event::{CMD_ADD_PATH, PLUGIN_EVENT_SOCKET, PluginAddEvent};
use crate::wire::pod::trim_for_plugin;
use crate::wire::pod_add::{AddFailure, FailureKind, POD_ADD_PATH, PodAddAnswer, PodAddRequest};

/// Largest body accepted (an event is a few hundred bytes).
const MAX_BODY: usize = 64 * 1024;

/// Binds the socket with the one binder (root only, 0600, only a stale socket replaced) and
/// serves it until `shutdown` with the listeners' bounds, supervised (`telemetry::serve`); the
/// socket file is removed when it stops, if it is still ours. Returns the serving task.
pub async fn serve(
    path: PathBuf,
    engine: PodEngine,
    serving: Serving,
    shutdown: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, SocketError> {
    let bound = serve::bind_unix(&path)?;
    let app = Router::new()
        .route(CMD_ADD_PATH, any(cmd_add))
        .route(POD_ADD_PATH, any(pod_add))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        .with_state(engine);
    info!(path = %path.display(), "plugin-event server listening");
    let limits = Limits::new(serve::MAX_PLUGIN_EVENT_CONNECTIONS, serving.idle_timeout);
    let server = UnixServer {
        name: PLUGIN_EVENT_SOCKET.to_string(),
        limits,
        readiness: Some(serving.readiness),
    };
    Ok(tokio::spawn(server.run(
        bound,
        serve::http(app, limits),
        shutdown,
    )))
}

async fn cmd_add(
    State(engine): State<PodEngine>,
    Extension(conn): Extension<ConnInfo>,
    body: Bytes,
) -> (StatusCode, String) {
    root_only(engine, conn, CMD_ADD_PATH, |engine, caller| {
        handle(engine, caller, body)
    })
    .await
}

async fn pod_add(
    State(engine): State<PodEngine>,
    Extension(conn): Extension<ConnInfo>,
    body: Bytes,
) -> (StatusCode, String) {
    root_only(engine, conn, POD_ADD_PATH, |engine, caller| {
        handle_pod_add(engine, caller, body)
    })
    .await
}

/// Runs `answer` for a root peer only, and counts the answer's status.
async fn root_only<F, Fut>(
    engine: PodEngine,
    conn: ConnInfo,
    route: &str,
    answer: F,
) -> (StatusCode, String)
where
    F: FnOnce(PodEngine, Peer) -> Fut,
    Fut: std::future::Future<Output = (StatusCode, String)>,
{
    // The listener already refused non-root peers; this is the second layer (and the caller's
    // identity for the log lines).
    let peer = conn
        .peer
        .ok_or_else(|| std::io::Error::other("not a Unix socket connection"));
    let core = engine.reconciler().clone();
    let (status, text) = match socket::root_only(peer) {
        Ok(caller) => answer(engine, caller).await,
        Err(refused) => {
            warn!("{route} {refused}");
            (StatusCode::FORBIDDEN, refused.to_string())
        }
    };
    core.metrics
        .plugin_requests
        .get_or_create(&ResponseCodeLabel {
            response_code: status.as_u16().to_string(),
        })
        .inc();
    (status, text)
}

async fn handle(engine: PodEngine, caller: Peer, body: Bytes) -> (StatusCode, String) {
    let core = engine.reconciler().clone();
    let event = match PluginAddEvent::decode(&body) {
        Ok(ev) => ev,
        Err(e) => {
            warn!("{e}");
            return (StatusCode::BAD_REQUEST, e.to_string());
        }
    };
    let pod = pod_key(&event.pod_namespace, &event.pod_name);
    info!(
        caller_pid = caller.pid,
        caller_uid = caller.uid,
        pod,
        netns = event.netns,
        "/cmdadd received"
    );
    // Run to the end even if the plugin hangs up: a half-done add would otherwise be left.
    let budget = core.timing.plugin_answer_budget;
    let progress = Arc::new(Progress::default());
    let watched = progress.clone();
    let task = tokio::spawn(async move {
        let result = enrol(&engine, &event, progress.clone()).await;
        // One line per /cmdadd with who asked and which netns it named (and what that was).
        let inode = progress.netns().map(|id| id.inode);
        match &result {
            Ok(()) => {
                info!(caller_pid = caller.pid, caller_uid = caller.uid, pod = %pod_key(&event.pod_namespace, &event.pod_name), netns = event.netns, inode, "/cmdadd done: pod enrolled")
            }
            Err(e) => {
                warn!(caller_pid = caller.pid, caller_uid = caller.uid, pod = %pod_key(&event.pod_namespace, &event.pod_name), netns = event.netns, inode, kind = e.kind().as_str(), "/cmdadd failed: {e}")
            }
        }
        result
    });
    answer_within(budget, &pod, &watched, task).await
}

/// Why a pod a plugin announced was not enrolled (answered 500, or 504 when late); each names
/// the pod and keeps its cause.
#[derive(Debug, thiserror::Error)]
pub enum AddError {
    #[error("failed to get pod {pod}: not in the agent's pod store")]
    PodNotStored { pod: String },
    #[error("failed to get namespace {namespace}: not in the agent's namespace store")]
    NamespaceNotStored { namespace: String },
    #[error("pod {pod} unexpectedly not eligible for ambient enrollment")]
    NotEligible { pod: String },
    #[error(transparent)]
    Mesh(Arc<MeshError>),
    #[error("pod {pod}: {source}")]
    Stopped {
        pod: String,
        #[source]
        source: Stopped,
    },
    #[error("pod {pod}: the add task failed: {source}")]
    Task {
        pod: String,
        #[source]
        source: tokio::task::JoinError,
    },
    #[error(
        "pod {pod} not enrolled within {budget:?} (still {step}); the agent finishes the \
         enrolment or marks the pod pending"
    )]
    Late {
        pod: String,
        budget: std::time::Duration,
        step: AddStep,
    },
}

impl AddError {
    /// What the plugin is told of the failure: an enrolment's failure is what the engine makes
    /// of it (`mesh::classify`); stores that are behind, an agent stopping, restarting or slow
    /// may clear by the kubelet's next try, a pod not eligible will not.
    pub fn kind(&self) -> FailureKind {
        match self {
            AddError::Mesh(e) => match classify(e) {
                Class::GiveUp => FailureKind::Permanent,
                Class::Retry | Class::WaitFor => FailureKind::Transient,
            },
            AddError::NotEligible { .. } => FailureKind::Permanent,
            AddError::PodNotStored { .. }
            | AddError::NamespaceNotStored { .. }
            | AddError::Stopped { .. }
            | AddError::Task { .. }
            | AddError::Late { .. } => FailureKind::Transient,
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            AddError::Late { .. } => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The `/podadd` answer's body.
    pub fn failure(&self, pod: &str) -> AddFailure {
        AddFailure {
            kind: self.kind(),
            pod: pod.to_string(),
            message: self.to_string(),
        }
    }
}

/// The answer to the plugin: the enrolment's outcome, or, when it is not done within `budget`
/// (shorter than the plugin's own 5 s timeout, L23), a 504 naming the pod and the step it is in
/// while the enrolment runs on to its end (enrolled, or marked pending with its cleanup).
/// Without the budget the plugin would only ever report its own timeout, never why the agent
/// was slow.
async fn answer_within(
    budget: std::time::Duration,
    pod: &str,
    progress: &Progress,
    task: tokio::task::JoinHandle<Result<(), AddError>>,
) -> (StatusCode, String) {
    match outcome_within(budget, pod, progress, task).await {
        Ok(()) => (StatusCode::OK, String::new()),
        // Istio's wire: the reason as text.
        Err(e) => (e.status(), e.to_string()),
    }
}

/// [`answer_within`] for any outcome: `Ok` is the task's value, `Err` why there is none.
async fn outcome_within<T>(
    budget: std::time::Duration,
    pod: &str,
    progress: &Progress,
    mut task: tokio::task::JoinHandle<Result<T, AddError>>,
) -> Result<T, AddError> {
    match tokio::time::timeout(budget, &mut task).await {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(source)) => Err(AddError::Task {
            pod: pod.to_string(),
            source,
        }),
        Err(_) => {
            let late = AddError::Late {
                pod: pod.to_string(),
                budget,
                step: progress.step(),
            };
            warn!("/cmdadd: {late}");
            Err(late)
        }
    }
}

async fn enrol(
    engine: &PodEngine,
    event: &PluginAddEvent,
    progress: Arc<Progress>,
) -> Result<(), AddError> {
    let core = engine.reconciler();
    let key = pod_key(&event.pod_namespace, &event.pod_name);
    progress.enter(AddStep::WaitingForPodInStore);
    // The plugin may be faster than our watch (stale cache).
    let p = wait_in_stores(core, || {
        core.pods
            .get(&key)
            .ok_or_else(|| AddError::PodNotStored { pod: key.clone() })
    })
    .await?;
    let Some(ns_labels) = stores::namespace_labels(&core.namespaces, &event.pod_namespace) else {
        return Err(AddError::NamespaceNotStored {
            namespace: event.pod_namespace.clone(),
        });
    };
    if !core.policy.matches(&p, &ns_labels) {
        return Err(AddError::NotEligible { pod: key });
    }
    match add_to_mesh(engine, event, progress, false).await? {
        Reconciled::Enrolled => Ok(()),
        _ => Err(AddError::NotEligible { pod: key }),
    }
}

/// The mesh add of a pod the plugin announced (its netns and IPs still to be verified), as the
/// next run of the pod's key: it waits for any work on the pod in flight, and its answer is that
/// run's.
async fn add_to_mesh(
    engine: &PodEngine,
    event: &PluginAddEvent,
    progress: Arc<Progress>,
    annotate_after_answer: bool,
) -> Result<Reconciled, AddError> {
    let core = engine.reconciler();
    let key = pod_key(&event.pod_namespace, &event.pod_name);
    progress.enter(AddStep::WaitingForPodLock);
    let add = PluginAdd {
        netns: event.netns.clone(),
        event_ips: event.pod_ips(),
        others: Some(Arc::new(OtherPods(core.pods.clone()))),
        progress,
        annotate_after_answer,
    };
    let answer = engine.trigger_with_and_wait(key.clone(), Request::offer(add));
    match answer.await {
        Ok(Ok(done)) => Ok(done),
        Ok(Err(e)) => Err(AddError::Mesh(e)),
        Err(source) => Err(AddError::Stopped { pod: key, source }),
    }
}

/// `/podadd`: the one request of an ambient ADD, answered from the agent's stores:
/// enrolled (200 `enrolled`), not ambient (200 with the pod for the sidecar path), not known to
/// the stores (200 `unknown`: the plugin asks the API server), or the enrolment's failure (500,
/// or 504 naming the step within the budget, with an [`AddFailure`]: its kind, the pod, the
/// cause). The `enabled` annotation is written after the
/// answer, retried, and re-asserted by the drift pass while owed.
async fn handle_pod_add(engine: PodEngine, caller: Peer, body: Bytes) -> (StatusCode, String) {
    let core = engine.reconciler().clone();
    let request = match PodAddRequest::decode(&body) {
        Ok(r) => r,
        Err(e) => {
            warn!("{e}");
            let failure = AddFailure {
                kind: FailureKind::Permanent,
                pod: String::new(),
                message: e.to_string(),
            };
            return (StatusCode::BAD_REQUEST, failure.to_json());
        }
    };
    let pod = pod_key(&request.event.pod_namespace, &request.event.pod_name);
    info!(
        caller_pid = caller.pid,
        caller_uid = caller.uid,
        pod,
        netns = request.event.netns,
        "{POD_ADD_PATH} received"
    );
    let budget = core.timing.plugin_answer_budget;
    let progress = Arc::new(Progress::default());
    let watched = progress.clone();
    let received = std::time::Instant::now();
    // Run to the end even if the plugin hangs up: a half-done add would otherwise be left.
    let task = tokio::spawn(async move {
        progress.enter(AddStep::WaitingForPodInStore);
        let (p, ns_labels) = match stored_pod(&core, &request).await {
            Ok(found) => found,
            Err(reason) => {
                info!(pod = %pod_key(&request.event.pod_namespace, &request.event.pod_name), %reason, "{POD_ADD_PATH}: not answered from the stores");
                return Ok(PodAddAnswer::Unknown {
                    reason: reason.to_string(),
                });
            }
        };
        if !core.policy.matches(&p, &ns_labels) {
            return Ok(PodAddAnswer::NotAmbient {
                pod: Box::new(trim_for_plugin(&p)),
            });
        }
        let event = &request.event;
        let result = add_to_mesh(&engine, event, progress.clone(), true).await;
        let inode = progress.netns().map(|id| id.inode);
        let name = pod_key(&event.pod_namespace, &event.pod_name);
        match &result {
            Ok(Reconciled::Enrolled) => {
                let (took_us, steps_us) =
                    (received.elapsed().as_micros() as u64, progress.timings());
                info!(caller_pid = caller.pid, caller_uid = caller.uid, pod = %name, netns = event.netns, inode, took_us, steps_us, "{POD_ADD_PATH} done: pod enrolled");
                // The owed annotation, off the ADD's path: the pod's next run writes it (and
                // its retries, until written or no longer owed; the drift pass looks again).
                engine.trigger(name);
            }
            Ok(_) => {}
            Err(e) => {
                warn!(caller_pid = caller.pid, caller_uid = caller.uid, pod = %name, netns = event.netns, inode, kind = e.kind().as_str(), "{POD_ADD_PATH} failed: {e}")
            }
        }
        result.map(|done| match done {
            Reconciled::NotAmbient(p) => PodAddAnswer::NotAmbient {
                pod: Box::new(trim_for_plugin(&p)),
            },
            _ => PodAddAnswer::Enrolled,
        })
    });
    pod_add_answer(&pod, outcome_within(budget, &pod, &watched, task).await)
}

/// `/podadd`'s HTTP answer: 200 with the answer, else the failure typed.
fn pod_add_answer(pod: &str, outcome: Result<PodAddAnswer, AddError>) -> (StatusCode, String) {
    match outcome {
        Ok(answer) => (StatusCode::OK, answer.to_json()),
        Err(e) => (e.status(), e.failure(pod).to_json()),
    }
}

/// The pod as the stores hold it, by the pod-facts rule (live store, same uid), with its
/// namespace's labels (`wait_in_stores`).
async fn stored_pod(
    core: &Core,
    request: &PodAddRequest,
) -> Result<(Arc<Pod>, std::collections::BTreeMap<String, String>), NotYet> {
    let facts = Query {
        namespace: &request.event.pod_namespace,
        name: &request.event.pod_name,
        uid: &request.uid,
        namespace_labels: true,
    };
    wait_in_stores(core, || {
        match lookup::stored_pod(&facts, &core.pods, Some(&core.namespaces)) {
            Ok((p, Some(labels))) => Ok((p, labels)),
            Ok((_, None)) => Err(NotYet::NamespaceNotStored {
                namespace: facts.namespace.to_string(),
            }),
            Err(reason) => Err(reason),
        }
    })
    .await
}

/// `look` until it finds what it wants, for as long as the stale-cache retries allow (the
/// plugin may be faster than the watch), woken by each change of either store (no polling: the
/// wait is on the ADD's path). The last look's error when the time is up.
async fn wait_in_stores<T, E>(core: &Core, mut look: impl FnMut() -> Result<T, E>) -> Result<T, E> {
    let wait = core.timing.stale_cache_interval * core.timing.stale_cache_attempts;
    let until = tokio::time::Instant::now() + wait;
    // Taken before the first look, so a change between the look and the wait is not missed.
    let (mut pods, mut namespaces) = (core.pods.changes(), core.namespaces.changes());
    loop {
        pods.mark_unchanged();
        namespaces.mark_unchanged();
        let reason = match look() {
            Ok(found) => return Ok(found),
            Err(reason) => reason,
        };
        let changed = async {
            tokio::select! {
                r = pods.changed() => r.is_ok(),
                r = namespaces.changed() => r.is_ok(),
            }
        };
        match tokio::time::timeout_at(until, changed).await {
            Ok(true) => {}
            // The deadline, or a store that went away.
            Ok(false) | Err(_) => return Err(reason),
        }
    }
}

/// The node's other live pods with a netns of their own (host-network pods share the node's,
/// finished pods' IPs may be reused): a netns holding one of their IPs is not a new pod's.
struct OtherPods(PodStore);

impl AddressOwners for OtherPods {
    fn owners_of(&self, ips: &[IpAddr], except_uid: &str) -> Vec<(String, IpAddr)> {
        let mut owners = Vec::new();
        for &ip in ips {
            for p in self.0.at_address(ip) {
                if pod::uid(&p) == except_uid || pod::is_terminal(&p) || pod::is_host_network(&p) {
                    continue;
                }
                owners.push((pod_key(pod::namespace(&p), pod::name(&p)), ip));
            }
        }
        owners
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_slow_enrolment_is_answered_within_the_budget_naming_its_step_and_runs_on() {
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let progress = Arc::new(Progress::default());
        let (flag, steps) = (done.clone(), progress.clone());
        // An enrolment stuck opening the netns (a slow step other than ztunnel's ack).
        let task = tokio::spawn(async move {
            steps.enter(AddStep::OpeningNetns);
            tokio::time::sleep(Duration::from_millis(300)).await;
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        });
        let started = tokio::time::Instant::now();
        let (status, text) =
            answer_within(Duration::from_millis(100), "ns/p", &progress, task).await;
        assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
        assert!(
            text.contains("pod ns/p not enrolled within 100ms (still opening the pod's netns)"),
            "{text}"
        );
        assert!(!text.contains("ztunnel"), "{text}");
        assert!(started.elapsed() < Duration::from_millis(250));
        assert!(!done.load(std::sync::atomic::Ordering::SeqCst));
        // The enrolment was not cancelled with the answer.
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(done.load(std::sync::atomic::Ordering::SeqCst));
    }

    #[tokio::test]
    async fn each_step_is_named_in_the_504() {
        for (step, words) in [
            (AddStep::WaitingForPodLock, "waiting for the pod's lock"),
            (
                AddStep::WaitingForPodInStore,
                "waiting for the pod to appear",
            ),
            (AddStep::ProgrammingRules, "programming the in-pod rules"),
            (
                AddStep::WaitingForZtunnelAck,
                "waiting for ztunnel to acknowledge",
            ),
            (AddStep::UpdatingProbeSet, "host probe set"),
            (AddStep::WritingAnnotation, "redirection annotation"),
        ] {
            let progress = Progress::default();
            progress.enter(step);
            let task = tokio::spawn(async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                Ok(())
            });
            let (status, text) =
                answer_within(Duration::from_millis(10), "ns/p", &progress, task).await;
            assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
            assert!(text.contains(words), "{step:?}: {text}");
        }
    }

    #[tokio::test]
    async fn outcomes_within_the_budget_pass_through() {
        let progress = Progress::default();
        let ok = tokio::spawn(async { Ok(()) });
        assert_eq!(
            answer_within(Duration::from_secs(1), "ns/p", &progress, ok)
                .await
                .0,
            StatusCode::OK
        );
        let failed = tokio::spawn(async {
            Err(AddError::Mesh(Arc::new(MeshError::NoNetns {
                pod: "ns/p".into(),
            })))
        });
        assert_eq!(
            answer_within(Duration::from_secs(1), "ns/p", &progress, failed).await,
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "pod ns/p: no netns found (not announced by the plugin and not found in /proc)"
                    .to_string()
            )
        );
    }

    #[tokio::test]
    async fn a_failed_pod_add_is_answered_typed_with_its_kind_the_pod_and_the_cause() {
        use crate::zds::ZdsError;
        let answer = |e: AddError| {
            let (status, body) = pod_add_answer("ns/p", Err(e));
            (status, AddFailure::read(&body, "?"))
        };
        let absent = MeshError::Ztunnel {
            pod: "ns/p".into(),
            source: ZdsError::NoConnection,
        };
        let (status, failure) = answer(AddError::Mesh(Arc::new(absent)));
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(failure.kind, FailureKind::Transient);
        assert_eq!(failure.pod, "ns/p");
        assert!(
            failure.message.contains("ztunnel is not connected"),
            "{failure:?}"
        );
        let (_, failure) = answer(AddError::Mesh(Arc::new(MeshError::NoNetns {
            pod: "ns/p".into(),
        })));
        assert_eq!(failure.kind, FailureKind::Permanent);
        assert!(
            failure.message.contains("pod ns/p: no netns found"),
            "{failure:?}"
        );
        let (_, failure) = answer(AddError::NotEligible { pod: "ns/p".into() });
        assert_eq!(failure.kind, FailureKind::Permanent);
        let (status, failure) = answer(AddError::Late {
            pod: "ns/p".into(),
            budget: Duration::from_millis(10),
            step: AddStep::WaitingForZtunnelAck,
        });
        assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(failure.kind, FailureKind::Transient);
        assert!(
            failure.message.contains("waiting for ztunnel"),
            "{failure:?}"
        );
    }
}
