//! The ADD flow. Cheap checks that need no Kubernetes access come first (not a Kubernetes pod,
//! excluded namespace, our own agent pod), so a missing kubeconfig cannot block those pods; every
//! API call has its own timeout and the whole flow runs under one deadline.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use super::ambient;
use super::args::CniArgs;
use super::cni::{CniEnv, CniError, code};
use super::config::NetConf;
use super::k8s::{KubeCallError, KubeReads};
use super::pod::PodInfo;
use super::result::CniResult;
use super::sidecar::{self, EngineEnv, Redirect};

/// Spacing of lookup retries.
const RETRY_SPACING: Duration = Duration::from_secs(1);
/// Timeout of the ambient event POST (the agent's own budget is about that).
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

/// Our own agent pod: starting it must never depend on the agent.
pub fn is_cni_pod(conf: &NetConf, args: &CniArgs) -> bool {
    args.pod_name.starts_with("istio-cni-node-") && args.pod_namespace == conf.pod_namespace
}

/// Steps before any Kubernetes access. `Some` = done, nothing to program.
pub fn precheck(conf: &NetConf, args: &CniArgs) -> Option<AddOutcome> {
    if !args.is_kubernetes_pod() {
        return Some(AddOutcome::NotKubernetes);
    }
    if conf.exclude_namespaces.contains(&args.pod_namespace) {
        return Some(AddOutcome::Excluded);
    }
    if is_cni_pod(conf, args) {
        return Some(AddOutcome::OwnPod);
    }
    None
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

/// GET pod with retries until `lookup_until` (Istio: 30 × 1 s). Between failures the own-pod
/// guard is re-checked as a degraded fail-safe (an identity we can prove without the API).
async fn get_pod_with_retries<K: KubeReads>(
    kube: &K,
    conf: &NetConf,
    args: &CniArgs,
    lookup_until: Instant,
) -> Result<Option<PodInfo>, KubeCallError> {
    loop {
        let timeout = conf.kube_call_timeout.min(left(lookup_until));
        match kube
            .get_pod(&args.pod_namespace, &args.pod_name, timeout)
            .await
        {
            Ok(pod) => return Ok(Some(PodInfo::from_pod(&pod))),
            Err(e) => {
                if is_cni_pod(conf, args) {
                    warn!(error = %e, "pod lookup failing; skipping our own agent pod (degraded)");
                    return Ok(None);
                }
                if Instant::now() + RETRY_SPACING >= lookup_until {
                    return Err(e);
                }
                debug!(error = %e, "pod lookup failed; retrying");
                tokio::time::sleep(RETRY_SPACING).await;
            }
        }
    }
}

/// Ambient check: GET pod and namespace (1 s apart, 2 attempts, or 31 with
/// `enable_ambient_detection_retry`), then the selectors.
async fn ambient_check<K: KubeReads>(
    kube: &K,
    conf: &NetConf,
    args: &CniArgs,
    deadline: Instant,
) -> Result<(PodInfo, bool), String> {
    let attempts = if conf.enable_ambient_detection_retry {
        31
    } else {
        2
    };
    let mut last = String::new();
    for attempt in 0..attempts {
        if attempt > 0 {
            if Instant::now() + RETRY_SPACING >= deadline {
                break;
            }
            tokio::time::sleep(RETRY_SPACING).await;
        }
        let t = conf.kube_call_timeout.min(left(deadline));
        let pod = kube.get_pod(&args.pod_namespace, &args.pod_name, t).await;
        let t = conf.kube_call_timeout.min(left(deadline));
        let ns = kube.get_namespace(&args.pod_namespace, t).await;
        match (pod, ns) {
            (Ok(pod), Ok(ns)) => {
                let info = PodInfo::from_pod(&pod);
                let ns_labels = ns.metadata.labels.unwrap_or_default();
                let ambient = ambient::is_ambient(&conf.enablement_selectors, &info, &ns_labels)
                    .map_err(|e| e.to_string())?;
                return Ok((info, ambient));
            }
            (Err(e), _) | (_, Err(e)) => last = e.to_string(),
        }
    }
    Err(last)
}

async fn send_ambient_event(conf: &NetConf, env: &CniEnv, args: &CniArgs) -> Result<(), CniError> {
    let prev = conf
        .prev_result
        .as_ref()
        .map(|v| CniResult::parse(v, super::result::source_version(v, &conf.cni_version)))
        .transpose()?;
    let event = ambient::add_event(
        &env.netns,
        &args.pod_name,
        &args.pod_namespace,
        prev.as_ref(),
    );
    let body = serde_json::to_vec(&event).map_err(internal)?;
    let sock = conf.event_socket_path();
    let fail = |detail: String| {
        CniError::internal(format!(
            "istio-cni cmdAdd failed to contact node Istio CNI agent: {detail}"
        ))
    };
    match super::uds::post_once(&sock, "/cmdadd", body, AMBIENT_EVENT_TIMEOUT).await {
        Ok((200, _)) => Ok(()),
        Ok((status, body)) => Err(fail(format!("status {status}: {body}"))),
        Err(e) => Err(fail(e.to_string())),
    }
}

/// Runs ADD after the config, args and logging are set up. `connect` builds the API client
/// (only called when a pod really needs a lookup).
pub async fn cmd_add<K, F, Fut>(
    env: &CniEnv,
    conf: &NetConf,
    args: &CniArgs,
    deadline: Instant,
    connect: F,
) -> Result<AddOutcome, CniError>
where
    K: KubeReads,
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<K, KubeCallError>>,
{
    let started = Instant::now();
    let pod_ref = format!("{}/{}", args.pod_namespace, args.pod_name);
    if let Some(done) = precheck(conf, args) {
        info!(pod = %pod_ref, outcome = ?done, "nothing to do for this pod");
        return Ok(done);
    }
    let dry_run = std::env::var_os("DRY_RUN_FILE_PATH")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from);
    let kube = tokio::time::timeout(conf.kube_call_timeout.min(left(deadline)), connect())
        .await
        .map_err(|_| CniError::internal("building the Kubernetes client timed out"))?
        .map_err(internal)?;
    debug!(
        took_ms = started.elapsed().as_millis() as u64,
        "Kubernetes client ready"
    );

    let mut known_pod: Option<PodInfo> = None;
    let mut ambient_decided = false;
    if conf.ambient_enabled {
        match ambient_check(&kube, conf, args, deadline).await {
            Ok((_, true)) => {
                info!(pod = %pod_ref, "pod is ambient; handing it to the node agent");
                send_ambient_event(conf, env, args).await?;
                return Ok(AddOutcome::Ambient);
            }
            Ok((pod, false)) => {
                known_pod = Some(pod);
                ambient_decided = true;
            }
            Err(e) if conf.enable_ambient_detection_retry => {
                return Err(CniError::new(
                    code::TRY_AGAIN_LATER,
                    format!("cannot tell whether pod {pod_ref} is ambient: {e}"),
                ));
            }
            Err(e) => {
                // Istio falls through to the sidecar path here; we do too, but re-check ambient
                // below before letting a non-sidecar pod start uncaptured.
                warn!(pod = %pod_ref, error = %e, "ambient check failed; trying the sidecar path");
            }
        }
    }

    let pod = match known_pod.take() {
        Some(p) => p,
        None => {
            let lookup_until = (Instant::now() + conf.pod_lookup_timeout).min(deadline);
            match get_pod_with_retries(&kube, conf, args, lookup_until).await {
                Ok(Some(p)) => p,
                Ok(None) => return Ok(AddOutcome::OwnPod),
                Err(e) => {
                    return Err(CniError::internal(format!(
                        "cannot read pod {pod_ref} from the Kubernetes API: {e}"
                    )));
                }
            }
        }
    };

    debug!(took_ms = started.elapsed().as_millis() as u64, "pod read");
    if let Some(skip) = sidecar::skip_reason(&pod) {
        if conf.ambient_enabled && !ambient_decided {
            // Reached after a failed ambient check: decide ambient with the pod we now have.
            let t = conf.kube_call_timeout.min(left(deadline));
            let ns = kube
                .get_namespace(&args.pod_namespace, t)
                .await
                .map_err(|e| {
                    CniError::new(
                        code::TRY_AGAIN_LATER,
                        format!("cannot tell whether pod {pod_ref} is ambient: {e}"),
                    )
                })?;
            let ns_labels = ns.metadata.labels.unwrap_or_default();
            if ambient::is_ambient(&conf.enablement_selectors, &pod, &ns_labels)
                .map_err(internal)?
            {
                send_ambient_event(conf, env, args).await?;
                return Ok(AddOutcome::Ambient);
            }
        }
        info!(pod = %pod_ref, reason = skip.reason(), "pod not redirected");
        return Ok(AddOutcome::Skipped(skip.reason()));
    }

    let engine_env = EngineEnv::from_process();
    let settings = match sidecar::redirect(&pod, &engine_env) {
        Ok(Redirect::None) => {
            info!(pod = %pod_ref, "interceptionMode NONE: no redirection");
            return Ok(AddOutcome::NoRedirection);
        }
        Ok(Redirect::Capture(s)) => s,
        Err(e) => {
            return Err(CniError::internal(format!("pod {pod_ref}: {e}")));
        }
    };
    for w in &settings.warnings {
        warn!(pod = %pod_ref, "{w}");
    }
    let netns = PathBuf::from(&env.netns);
    let dual_stack = settings.dual_stack;
    let backend = if conf.native_nftables {
        super::program::Backend::Nftables
    } else if engine_env.restore_only {
        super::program::Backend::IptablesRestore
    } else {
        super::program::Backend::Iptables
    };
    let cfg = settings.config;
    let dry_run_path = dry_run.clone();
    let work = tokio::task::spawn_blocking(move || {
        super::program::program(&netns, cfg, dual_stack, backend, dry_run_path)
    });
    let programmed = tokio::time::timeout(left(deadline), work)
        .await
        .map_err(|_| CniError::internal(format!("pod {pod_ref}: programming the network namespace did not finish before the ADD deadline")))?
        .map_err(|e| CniError::internal(format!("pod {pod_ref}: {e}")))?
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
                outcome = ?programmed.outcome,
                took_ms = started.elapsed().as_millis() as u64,
                "sidecar redirection programmed"
            );
            AddOutcome::Redirected {
                ipv6: programmed.ipv6,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Namespace, Pod};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Answers from fixed objects, failing the first `fail_first` pod reads.
    struct FakeKube {
        pod: Option<Pod>,
        fail_first: usize,
        pod_calls: AtomicUsize,
    }

    impl KubeReads for FakeKube {
        fn get_pod(
            &self,
            _namespace: &str,
            _name: &str,
            _timeout: Duration,
        ) -> impl std::future::Future<Output = Result<Pod, KubeCallError>> + Send {
            let n = self.pod_calls.fetch_add(1, Ordering::SeqCst);
            let result = match (&self.pod, n < self.fail_first) {
                (Some(p), false) => Ok(p.clone()),
                _ => Err(KubeCallError::Api("boom".into())),
            };
            async move { result }
        }

        async fn get_namespace(
            &self,
            _name: &str,
            _timeout: Duration,
        ) -> Result<Namespace, KubeCallError> {
            Ok(Namespace::default())
        }
    }

    fn conf() -> NetConf {
        let mut c = NetConf::parse(
            br#"{"name":"n","exclude_namespaces":["kube-system"],"pod_namespace":"istio-system"}"#,
        )
        .unwrap();
        c.pod_lookup_timeout = Duration::from_millis(2500);
        c
    }

    fn args(ns: &str, name: &str) -> CniArgs {
        CniArgs {
            pod_name: name.into(),
            pod_namespace: ns.into(),
            ..Default::default()
        }
    }

    fn run(conf: &NetConf, args: &CniArgs, kube: Option<FakeKube>) -> Result<AddOutcome, CniError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let env = CniEnv::default();
        let deadline = Instant::now() + Duration::from_secs(60);
        rt.block_on(cmd_add(&env, conf, args, deadline, || async move {
            kube.ok_or_else(|| KubeCallError::Client {
                path: "kubeconfig".into(),
                reason: "missing".into(),
            })
        }))
    }

    #[test]
    fn cheap_checks_come_before_the_client() {
        let c = conf();
        assert_eq!(run(&c, &args("", "p"), None), Ok(AddOutcome::NotKubernetes));
        assert_eq!(
            run(&c, &args("kube-system", "p"), None),
            Ok(AddOutcome::Excluded)
        );
        assert_eq!(
            run(&c, &args("istio-system", "istio-cni-node-abc"), None),
            Ok(AddOutcome::OwnPod)
        );
        // Same name elsewhere is not our pod.
        let e = run(&c, &args("default", "istio-cni-node-abc"), None).unwrap_err();
        assert!(e.msg.contains("kubeconfig"), "{e}");
    }

    #[test]
    fn pod_lookup_is_retried_then_fails_with_the_cause() {
        let c = conf();
        let plain: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "app"}]}
        }))
        .unwrap();
        let kube = FakeKube {
            pod: Some(plain.clone()),
            fail_first: 2,
            pod_calls: AtomicUsize::new(0),
        };
        assert!(matches!(
            run(&c, &args("ns", "p"), Some(kube)),
            Ok(AddOutcome::Skipped(_))
        ));
        let kube = FakeKube {
            pod: None,
            fail_first: 0,
            pod_calls: AtomicUsize::new(0),
        };
        let e = run(&c, &args("ns", "p"), Some(kube)).unwrap_err();
        assert!(e.msg.contains("ns/p") && e.msg.contains("boom"), "{e}");
    }

    #[test]
    fn own_pod_guard_predicate() {
        let c = conf();
        assert!(is_cni_pod(&c, &args("istio-system", "istio-cni-node-x")));
        assert!(!is_cni_pod(&c, &args("istio-system", "istio-cni-x")));
        assert!(!is_cni_pod(&c, &args("other", "istio-cni-node-x")));
    }
}
