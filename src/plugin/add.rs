//! The ADD flow. Cheap checks that need no Kubernetes access come first (not a Kubernetes pod,
//! excluded namespace, our own agent pod), so a missing kubeconfig cannot block those pods; every
//! API call has its own timeout and the whole flow runs under one deadline.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use super::ambient::{self, SelectorError};
use super::args::{ArgsError, CniArgs};
use super::cni::{CniEnv, CniError, code};
use super::config::NetConf;
use super::k8s::{KubeCallError, KubeReads};
use super::result::CniResult;
use crate::retry::{RetryPolicy, retry_transient};
use crate::sidecar::PodInfo;
use crate::sidecar::redirect::{self as sidecar, EngineEnv, Redirect};

/// Spacing of lookup retries (transient failures only): 200 ms doubling to 1 s, jittered.
/// Istio waits a constant 1 s; starting shorter gets a pod through an API blip sooner.
const LOOKUP_RETRY: RetryPolicy = RetryPolicy {
    first: Duration::from_millis(200),
    max: Duration::from_secs(1),
    max_attempts: None,
};
/// Attempts of the ambient check without `enable_ambient_detection_retry` (Istio: 1 + 1 retry).
const AMBIENT_ATTEMPTS: u32 = 2;
/// Timeout of the ambient event POST. The agent answers within its `plugin_answer_budget`
/// (4.5 s, agent/settings.rs), so a slow enrolment is reported with the agent's reason (L23).
const AMBIENT_EVENT_TIMEOUT: Duration = Duration::from_secs(5);

/// What ADD decided (for logs and tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddOutcome {
    NotKubernetes,
    Excluded,
    OwnPod,
    Skipped(&'static str),
    NoRedirection,
    Ambient,
    Redirected { ipv6: bool },
    DryRun { path: PathBuf, ipv6: bool },
}

/// How logs name the outcome (the reason of a skip and the dry-run path are separate fields).
impl std::fmt::Display for AddOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AddOutcome::NotKubernetes => "not a kubernetes pod",
            AddOutcome::Excluded => "excluded namespace",
            AddOutcome::OwnPod => "own agent pod",
            AddOutcome::Skipped(_) => "skipped",
            AddOutcome::NoRedirection => "no redirection",
            AddOutcome::Ambient => "ambient",
            AddOutcome::Redirected { .. } => "redirected",
            AddOutcome::DryRun { .. } => "dry run",
        })
    }
}

/// Why the ambient check could not decide.
#[derive(Debug, thiserror::Error)]
enum AmbientCheckError {
    #[error(transparent)]
    Lookup(#[from] KubeCallError),
    #[error("invalid enablement selector: {0}")]
    Selector(#[from] SelectorError),
}

/// Our own agent pod: starting it must never depend on the agent.
pub fn is_cni_pod(conf: &NetConf, args: &CniArgs) -> bool {
    args.pod_name.starts_with("istio-cni-node-") && args.pod_namespace == conf.pod_namespace
}

/// Steps before any Kubernetes access. `Some` = done, nothing to program. A pod namespace or
/// name that is not a Kubernetes name fails here, before any request: no pod can carry it, it
/// must not become an API path, and ADD fails closed (the pod may need capture).
pub fn precheck(conf: &NetConf, args: &CniArgs) -> Result<Option<AddOutcome>, CniError> {
    if !args.is_kubernetes_pod() {
        return Ok(Some(AddOutcome::NotKubernetes));
    }
    args.check_kubernetes_names().map_err(invalid_name)?;
    if conf.exclude_namespaces.contains(&args.pod_namespace) {
        return Ok(Some(AddOutcome::Excluded));
    }
    if is_cni_pod(conf, args) {
        return Ok(Some(AddOutcome::OwnPod));
    }
    Ok(None)
}

fn invalid_name(e: ArgsError) -> CniError {
    CniError::new(
        code::INVALID_ENV,
        format!("{e}; no Kubernetes pod can have this name, so it is not looked up and ADD fails"),
    )
    .with_details("CNI_ARGS")
}

fn internal(e: impl std::fmt::Display) -> CniError {
    CniError::internal(e.to_string())
}

/// The time left before `deadline`, never zero (zero would make every timeout fire at once).
fn left(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

/// GET pod, retrying transient failures until `lookup_until` (Istio: 30 × 1 s, every error).
/// Permanent failures (403, 404, ...) end at once. Before failing, the own-pod guard is checked
/// again as a degraded fail-safe (an identity we can prove without the API).
async fn get_pod_with_retries<K: KubeReads>(
    kube: &K,
    conf: &NetConf,
    args: &CniArgs,
    lookup_until: Instant,
) -> Result<Option<PodInfo>, KubeCallError> {
    let result = retry_transient(
        LOOKUP_RETRY,
        lookup_until,
        KubeCallError::is_transient,
        |e, delay| debug!(error = %e, retry_in_ms = delay.as_millis() as u64, "pod lookup failed; retrying"),
        || {
            let timeout = conf.kube_call_timeout.min(left(lookup_until));
            kube.get_pod(&args.pod_namespace, &args.pod_name, timeout)
        },
    )
    .await;
    match result {
        Ok(pod) => Ok(Some(PodInfo::from_pod(&pod))),
        Err(e) if is_cni_pod(conf, args) => {
            warn!(error = %e, "pod lookup failing; skipping our own agent pod (degraded)");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Ambient check: GET pod and namespace, then the selectors. Transient failures are retried once
/// (Istio's 2 attempts), or for `pod_lookup_timeout` with `enable_ambient_detection_retry`
/// (Istio: 31 attempts 1 s apart); permanent ones end the check at once. Never past `deadline`.
async fn ambient_check<K: KubeReads>(
    kube: &K,
    conf: &NetConf,
    args: &CniArgs,
    deadline: Instant,
) -> Result<(PodInfo, bool), AmbientCheckError> {
    let (policy, until) = if conf.enable_ambient_detection_retry {
        (
            LOOKUP_RETRY,
            (Instant::now() + conf.pod_lookup_timeout).min(deadline),
        )
    } else {
        let policy = RetryPolicy {
            max_attempts: Some(AMBIENT_ATTEMPTS),
            ..LOOKUP_RETRY
        };
        (policy, deadline)
    };
    let (pod, ns) = retry_transient(
        policy,
        until,
        KubeCallError::is_transient,
        |e, delay| debug!(error = %e, retry_in_ms = delay.as_millis() as u64, "ambient lookup failed; retrying"),
        || async {
            let t = conf.kube_call_timeout.min(left(until));
            let pod = kube.get_pod(&args.pod_namespace, &args.pod_name, t).await?;
            let t = conf.kube_call_timeout.min(left(until));
            let ns = kube.get_namespace(&args.pod_namespace, t).await?;
            Ok::<_, KubeCallError>((pod, ns))
        },
    )
    .await?;
    let info = PodInfo::from_pod(&pod);
    let ns_labels = ns.metadata.labels.unwrap_or_default();
    let ambient = ambient::is_ambient(&conf.enablement_selectors, &info, &ns_labels)?;
    Ok((info, ambient))
}

async fn send_ambient_event(conf: &NetConf, env: &CniEnv, args: &CniArgs) -> Result<(), CniError> {
    let body = event_for(conf, env, args)?.to_json();
    let sock = conf.event_socket_path();
    match super::uds::post_once(
        &sock,
        crate::wire::event::CMD_ADD_PATH,
        body,
        AMBIENT_EVENT_TIMEOUT,
    )
    .await
    {
        Ok((200, _)) => Ok(()),
        Ok((status, body)) => Err(agent_refused(status, &body, args)),
        Err(e) => Err(agent_failed(&e.to_string(), args)),
    }
}

/// What the node agent said to `/podadd`.
enum AgentAnswer {
    Enrolled,
    NotAmbient(Box<k8s_openapi::api::core::v1::Pod>),
    /// No agent, an agent without `/podadd` (Istio's), or stores that cannot answer for this pod
    /// (`stores_asked`): the ADD goes on as without it (pod facts, then the API server).
    Unavailable {
        stores_asked: bool,
    },
}

/// The one request of an ambient ADD: the `/cmdadd` event with the pod's uid to `/podadd`. The
/// agent decides with its own selectors and stores (the ones it enrols with), so an answer is
/// final: enrolled, or not ambient with the pod for the sidecar path. A failed enrolment fails
/// the ADD as `/cmdadd`'s would.
async fn ask_agent(
    conf: &NetConf,
    env: &CniEnv,
    args: &CniArgs,
    deadline: Instant,
) -> Result<AgentAnswer, CniError> {
    use crate::wire::pod_add::{POD_ADD_PATH, PodAddAnswer, PodAddRequest};
    let request = PodAddRequest {
        event: event_for(conf, env, args)?,
        uid: args.pod_uid.clone(),
    };
    let sock = conf.event_socket_path();
    let timeout = AMBIENT_EVENT_TIMEOUT.min(left(deadline));
    let unavailable = |stores_asked, reason: &dyn std::fmt::Display| {
        debug!(%reason, "{POD_ADD_PATH} not answered; the ADD goes on without it");
        Ok(AgentAnswer::Unavailable { stores_asked })
    };
    match super::uds::post_once(&sock, POD_ADD_PATH, request.to_json(), timeout).await {
        Ok((200, body)) => match PodAddAnswer::decode(&body) {
            Ok(PodAddAnswer::Enrolled) => Ok(AgentAnswer::Enrolled),
            Ok(PodAddAnswer::NotAmbient { pod }) => Ok(AgentAnswer::NotAmbient(pod)),
            Ok(PodAddAnswer::Unknown { reason }) => unavailable(true, &reason),
            Err(e) => Err(agent_failed(
                &format!("unreadable {POD_ADD_PATH} answer: {e}"),
                args,
            )),
        },
        Ok((404, _)) => unavailable(false, &"the agent has no such path"),
        Ok((status, body)) => Err(agent_refused(status, &body, args)),
        Err(e @ super::uds::UdsError::Connect { .. }) => unavailable(false, &e),
        Err(e) => Err(agent_failed(&e.to_string(), args)),
    }
}

/// The agent was reached and answered with an error: say so, with its status, the pod, the
/// kind of failure (when the agent says: an older agent and `/cmdadd` answer text) and its
/// words. The code stays Istio's for this failure (a plain error, 999): the kind is told in
/// the message, where the operator reads it.
fn agent_refused(status: u16, body: &str, args: &CniArgs) -> CniError {
    use crate::wire::pod_add::{AddFailure, FailureKind};
    let failure = AddFailure::read(body, &pod_ref(args));
    let kind = match failure.kind {
        FailureKind::Transient => " (transient: the kubelet's next try of the ADD may succeed)",
        FailureKind::Permanent => {
            " (permanent: each try of the ADD fails so until the cause named is fixed)"
        }
        FailureKind::Unknown => "",
    };
    CniError::internal(format!(
        "istio-cni cmdAdd: the node Istio CNI agent answered status {status}: pod {} not \
         enrolled{kind}: {}",
        failure.pod, failure.message
    ))
}

fn agent_failed(detail: &str, args: &CniArgs) -> CniError {
    CniError::internal(format!(
        "istio-cni cmdAdd failed to contact node Istio CNI agent: pod {} not enrolled: {detail}",
        pod_ref(args)
    ))
}

fn pod_ref(args: &CniArgs) -> String {
    format!("{}/{}", args.pod_namespace, args.pod_name)
}

/// The `/cmdadd` event: the netns and the addresses of the previous plugin's result.
fn event_for(
    conf: &NetConf,
    env: &CniEnv,
    args: &CniArgs,
) -> Result<crate::wire::event::PluginAddEvent, CniError> {
    let prev = conf
        .prev_result
        .as_ref()
        .map(|v| CniResult::parse(v, super::result::source_version(v, &conf.cni_version)))
        .transpose()?;
    Ok(ambient::add_event(
        &env.netns,
        &args.pod_name,
        &args.pod_namespace,
        prev.as_ref(),
    ))
}

/// One ADD's inputs, carried down its steps.
struct Add<'a> {
    env: &'a CniEnv,
    conf: &'a NetConf,
    engine_env: &'a EngineEnv,
    args: &'a CniArgs,
    started: Instant,
    deadline: Instant,
}

/// What the API server said about ambient.
enum ApiAmbient {
    /// Ambient, and handed to the node agent.
    Enrolled,
    NotAmbient(PodInfo),
    /// The check failed; the sidecar path checks again before it lets the pod start uncaptured.
    Undecided,
}

/// Runs ADD after the config, args and logging are set up. `engine_env` is what the plugin's
/// environment says (read by the caller through the injected `Env`); `connect` builds the API
/// client (only called when a pod really needs a lookup). The pod is decided by the first source
/// that can: the node agent, then the node pod store, then the API server.
pub async fn cmd_add<K, F, Fut>(
    env: &CniEnv,
    conf: &NetConf,
    engine_env: &EngineEnv,
    args: &CniArgs,
    deadline: Instant,
    connect: F,
) -> Result<AddOutcome, CniError>
where
    K: KubeReads,
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<K, KubeCallError>>,
{
    let add = Add {
        env,
        conf,
        engine_env,
        args,
        started: Instant::now(),
        deadline,
    };
    if let Some(done) = precheck(conf, args)? {
        info!(pod = %pod_ref(args), outcome = %done, "nothing to do for this pod");
        return Ok(done);
    }
    // Ambient: one request to the node agent, answered from its stores.
    let mut stores_asked = false;
    if conf.ambient_enabled && !args.pod_uid.is_empty() {
        match add.by_agent::<K>().await? {
            Ok(done) => return Ok(done),
            Err(asked) => stores_asked = asked,
        }
    }
    // Not when the agent just said its stores cannot answer: the pod-facts socket reads the same.
    if !stores_asked && let Some(done) = add.by_node_store::<K>().await? {
        return Ok(done);
    }
    add.by_api(connect).await
}

impl Add<'_> {
    /// The node agent's answer to `/podadd`: the outcome when it decided the pod, else whether
    /// it asked its stores (`Err(stores_asked)`) and the ADD goes on without it.
    async fn by_agent<K: KubeReads>(&self) -> Result<Result<AddOutcome, bool>, CniError> {
        let asked = Instant::now();
        match ask_agent(self.conf, self.env, self.args, self.deadline).await? {
            AgentAnswer::Enrolled => {
                let (took_us, agent_us) = (
                    self.started.elapsed().as_micros() as u64,
                    asked.elapsed().as_micros() as u64,
                );
                info!(pod = %pod_ref(self.args), took_us, agent_us, "pod is ambient; enrolled by the node agent");
                Ok(Ok(AddOutcome::Ambient))
            }
            AgentAnswer::NotAmbient(pod) => {
                debug!(
                    took_ms = self.started.elapsed().as_millis() as u64,
                    "pod not ambient (node agent); taking the sidecar path"
                );
                let pod = PodInfo::from_pod(&pod);
                self.redirect_pod::<K>(pod, None).await.map(Ok)
            }
            AgentAnswer::Unavailable { stores_asked } => Ok(Err(stores_asked)),
        }
    }

    /// The node pod store (no client, no TLS handshake, no API request; see k8s::cached_pod).
    /// `None`: it does not know the pod, or the enablement selectors do not compile, and the API
    /// path decides as it always has.
    async fn by_node_store<K: KubeReads>(&self) -> Result<Option<AddOutcome>, CniError> {
        let (conf, args) = (self.conf, self.args);
        let Some(cached) = super::k8s::cached_pod(
            &conf.cni_agent_run_dir,
            &args.pod_namespace,
            &args.pod_name,
            &args.pod_uid,
            conf.ambient_enabled,
            conf.pod_facts_timeout,
        )
        .await
        else {
            return Ok(None);
        };
        debug!(
            took_ms = self.started.elapsed().as_millis() as u64,
            "pod read from the node pod store"
        );
        let pod = PodInfo::from_pod(&cached.pod);
        let ambient = if conf.ambient_enabled {
            let ns_labels = cached.namespace_labels.unwrap_or_default();
            ambient::is_ambient(&conf.enablement_selectors, &pod, &ns_labels).ok()
        } else {
            Some(false)
        };
        match ambient {
            Some(true) => self.hand_to_agent().await.map(Some),
            Some(false) => self.redirect_pod::<K>(pod, None).await.map(Some),
            None => {
                debug!("enablement selectors invalid; taking the API path");
                Ok(None)
            }
        }
    }

    /// The API server decides: the ambient check, then the pod itself when that did not read it.
    async fn by_api<K, F, Fut>(&self, connect: F) -> Result<AddOutcome, CniError>
    where
        K: KubeReads,
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<K, KubeCallError>>,
    {
        let timeout = self.conf.kube_call_timeout.min(left(self.deadline));
        let kube = tokio::time::timeout(timeout, connect())
            .await
            .map_err(|_| CniError::internal("building the Kubernetes client timed out"))?
            .map_err(internal)?;
        debug!(
            took_ms = self.started.elapsed().as_millis() as u64,
            "Kubernetes client ready"
        );
        let known_pod = if self.conf.ambient_enabled {
            match self.ambient_by_api(&kube).await? {
                ApiAmbient::Enrolled => return Ok(AddOutcome::Ambient),
                ApiAmbient::NotAmbient(pod) => Some(pod),
                ApiAmbient::Undecided => None,
            }
        } else {
            None
        };
        let ambient_decided = known_pod.is_some();
        let pod = match known_pod {
            Some(pod) => pod,
            None => match self.read_pod(&kube).await? {
                Some(pod) => pod,
                None => return Ok(AddOutcome::OwnPod),
            },
        };
        debug!(
            took_ms = self.started.elapsed().as_millis() as u64,
            "pod read"
        );
        let recheck = (self.conf.ambient_enabled && !ambient_decided).then_some(&kube);
        self.redirect_pod(pod, recheck).await
    }

    /// The ambient check through the API. A failure ends the ADD with "try again later" under
    /// `enable_ambient_detection_retry`; otherwise the ADD goes on undecided.
    async fn ambient_by_api<K: KubeReads>(&self, kube: &K) -> Result<ApiAmbient, CniError> {
        match ambient_check(kube, self.conf, self.args, self.deadline).await {
            Ok((_, true)) => {
                self.hand_to_agent().await?;
                Ok(ApiAmbient::Enrolled)
            }
            Ok((pod, false)) => Ok(ApiAmbient::NotAmbient(pod)),
            Err(e) if self.conf.enable_ambient_detection_retry => Err(CniError::new(
                code::TRY_AGAIN_LATER,
                format!(
                    "cannot tell whether pod {} is ambient: {e}",
                    pod_ref(self.args)
                ),
            )),
            Err(e) => {
                // Istio falls through to the sidecar path here; we do too, but re-check ambient
                // before letting a non-sidecar pod start uncaptured.
                warn!(pod = %pod_ref(self.args), error = %e, "ambient check failed; trying the sidecar path");
                Ok(ApiAmbient::Undecided)
            }
        }
    }

    /// GET pod with retries until `pod_lookup_timeout`; `None` is our own agent pod (degraded).
    async fn read_pod<K: KubeReads>(&self, kube: &K) -> Result<Option<PodInfo>, CniError> {
        let lookup_until = (Instant::now() + self.conf.pod_lookup_timeout).min(self.deadline);
        get_pod_with_retries(kube, self.conf, self.args, lookup_until)
            .await
            .map_err(|e| {
                CniError::internal(format!(
                    "cannot read pod {} from the Kubernetes API: {e}",
                    pod_ref(self.args)
                ))
            })
    }

    /// An ambient pod: the `/cmdadd` event to the node agent, which enrols it.
    async fn hand_to_agent(&self) -> Result<AddOutcome, CniError> {
        info!(pod = %pod_ref(self.args), "pod is ambient; handing it to the node agent");
        send_ambient_event(self.conf, self.env, self.args).await?;
        Ok(AddOutcome::Ambient)
    }

    /// The sidecar part of ADD once the pod is known: skip, no redirection, or program the
    /// netns. `ambient_recheck` is the client when the ambient check failed earlier: a pod the
    /// sidecar path skips is then checked for ambient again before it may start uncaptured.
    async fn redirect_pod<K: KubeReads>(
        &self,
        pod: PodInfo,
        ambient_recheck: Option<&K>,
    ) -> Result<AddOutcome, CniError> {
        let pod_ref = pod_ref(self.args);
        if let Some(skip) = sidecar::skip_reason(&pod) {
            if let Some(kube) = ambient_recheck
                && self.ambient_after_all(kube, &pod).await?
            {
                send_ambient_event(self.conf, self.env, self.args).await?;
                return Ok(AddOutcome::Ambient);
            }
            info!(pod = %pod_ref, reason = skip.reason(), "pod not redirected");
            return Ok(AddOutcome::Skipped(skip.reason()));
        }
        match sidecar::redirect(&pod, self.engine_env) {
            Ok(Redirect::None) => {
                info!(pod = %pod_ref, "interceptionMode NONE: no redirection");
                Ok(AddOutcome::NoRedirection)
            }
            Ok(Redirect::Capture(settings)) => self.program_netns(settings).await,
            Err(e) => Err(CniError::internal(format!("pod {pod_ref}: {e}"))),
        }
    }

    /// Reached after a failed ambient check with a pod the sidecar path skips: decide ambient
    /// with the pod we now have.
    async fn ambient_after_all<K: KubeReads>(
        &self,
        kube: &K,
        pod: &PodInfo,
    ) -> Result<bool, CniError> {
        let (conf, args) = (self.conf, self.args);
        let t = conf.kube_call_timeout.min(left(self.deadline));
        let ns = kube
            .get_namespace(&args.pod_namespace, t)
            .await
            .map_err(|e| {
                CniError::new(
                    code::TRY_AGAIN_LATER,
                    format!("cannot tell whether pod {} is ambient: {e}", pod_ref(args)),
                )
            })?;
        let ns_labels = ns.metadata.labels.unwrap_or_default();
        ambient::is_ambient(&conf.enablement_selectors, pod, &ns_labels).map_err(internal)
    }

    /// Programs the pod's netns with its capture settings (or writes the rules, in a dry run).
    async fn program_netns(
        &self,
        settings: Box<sidecar::CaptureSettings>,
    ) -> Result<AddOutcome, CniError> {
        let pod_ref = pod_ref(self.args);
        for w in &settings.warnings {
            warn!(pod = %pod_ref, "{w}");
        }
        let dry_run = self.engine_env.dry_run.clone();
        let backend = crate::apply::backend::decide(&crate::apply::backend::BackendRequest {
            native_nftables: self.conf.native_nftables,
            restore_only: self.engine_env.restore_only,
            force_binary: None,
        })
        .backend;
        // The work runs on a netns worker thread; this task only waits, so the deadline still
        // cuts a programming that hangs (a stuck iptables-restore) and the process may exit past
        // it.
        let netns = PathBuf::from(&self.env.netns);
        let work = super::program::program(
            &netns,
            settings.config,
            settings.dual_stack,
            backend,
            node_flavour(self.conf)?,
            dry_run.clone(),
        );
        let programmed = tokio::time::timeout(left(self.deadline), work)
            .await
            .map_err(|_| CniError::internal(format!("pod {pod_ref}: programming the network namespace did not finish before the ADD deadline")))?
            .map_err(|e| CniError::internal(format!("pod {pod_ref}: {e}")))?;
        for w in &programmed.warnings {
            warn!(pod = %pod_ref, "{w}");
        }
        Ok(match dry_run {
            Some(path) => {
                info!(pod = %pod_ref, path = %path.display(), "dry run: rules written");
                AddOutcome::DryRun {
                    path,
                    ipv6: programmed.ipv6,
                }
            }
            None => {
                info!(
                    pod = %pod_ref,
                    ipv6 = programmed.ipv6,
                    outcome = %programmed.outcome.as_ref().map_or_else(|| "unknown".to_string(), ToString::to_string),
                    took_ms = self.started.elapsed().as_millis() as u64,
                    "sidecar redirection programmed"
                );
                AddOutcome::Redirected {
                    ipv6: programmed.ipv6,
                }
            }
        })
    }
}

#[cfg(test)]
#[path = "add_tests.rs"]
mod tests;

/// The iptables flavour install-cni decided for the node, when its config entry carries one.
fn node_flavour(conf: &NetConf) -> Result<Option<crate::apply::ForceBinary>, CniError> {
    match conf.force_iptables_binary.as_deref() {
        None | Some("") => Ok(None),
        Some("legacy") => Ok(Some(crate::apply::ForceBinary::Legacy)),
        Some("nft") => Ok(Some(crate::apply::ForceBinary::Nft)),
        Some(other) => Err(CniError::new(
            code::INVALID_NETWORK_CONFIG,
            format!(
                "force_iptables_binary {other:?} in the plugin's config: expected legacy or nft"
            ),
        )),
    }
}
