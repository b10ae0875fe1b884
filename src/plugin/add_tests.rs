//! Unit tests of the ADD flow (plugin/add.rs) against a fake Kubernetes reader.

use super::*;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Answers from fixed objects, failing the first `fail_first` pod reads with `code`.
struct FakeKube {
    pod: Option<Pod>,
    fail_first: usize,
    pod_calls: AtomicUsize,
    code: u16,
}

impl FakeKube {
    fn new(pod: Option<Pod>, fail_first: usize, code: u16) -> FakeKube {
        FakeKube {
            pod,
            fail_first,
            pod_calls: AtomicUsize::new(0),
            code,
        }
    }
}

fn api_error(code: u16) -> KubeCallError {
    KubeCallError::Api(crate::kube::KubeError::Api {
        call: crate::kube::Call::GetPod,
        object: "ns/p".into(),
        code,
        reason: "Boom".into(),
        message: "boom".into(),
    })
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
            _ => Err(api_error(self.code)),
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
    run_with(conf, args, kube, &EngineEnv::default())
}

fn run_with(
    conf: &NetConf,
    args: &CniArgs,
    kube: Option<FakeKube>,
    engine: &EngineEnv,
) -> Result<AddOutcome, CniError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let env = CniEnv::default();
    let deadline = Instant::now() + Duration::from_secs(60);
    rt.block_on(cmd_add(&env, conf, engine, args, deadline, || async move {
        kube.ok_or_else(|| KubeCallError::Client {
            source: crate::kube::KubeError::Kubeconfig {
                path: "kubeconfig".into(),
                source: kube::config::KubeconfigError::ReadConfig(
                    std::io::ErrorKind::NotFound.into(),
                    "kubeconfig".into(),
                ),
            },
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
    let kube = FakeKube::new(Some(plain.clone()), 2, 503);
    assert!(matches!(
        run(&c, &args("ns", "p"), Some(kube)),
        Ok(AddOutcome::Skipped(_))
    ));
    let kube = FakeKube::new(None, 0, 500);
    let e = run(&c, &args("ns", "p"), Some(kube)).unwrap_err();
    assert!(e.msg.contains("ns/p") && e.msg.contains("boom"), "{e}");
}

#[test]
fn dry_run_comes_from_the_injected_env() {
    let sidecar: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns",
                     "annotations": {"sidecar.istio.io/status": "{}"}},
        "spec": {"containers": [{"name": "app"}, {"name": "istio-proxy"}]}
    }))
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("rules");
    let engine = EngineEnv {
        dry_run: Some(out.clone()),
        ..EngineEnv::default()
    };
    // CniEnv's netns is empty: a dry run never opens it (IPv4 rules only).
    let kube = FakeKube::new(Some(sidecar), 0, 200);
    let outcome = run_with(&conf(), &args("ns", "p"), Some(kube), &engine).unwrap();
    assert_eq!(
        outcome,
        AddOutcome::DryRun {
            path: out.clone(),
            ipv6: false
        }
    );
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.contains("ISTIO_OUTPUT"), "{text}");
}

#[test]
fn permanent_errors_are_not_retried() {
    let c = conf();
    for code in [400, 401, 403, 404, 409, 422] {
        let kube = FakeKube::new(None, 0, code);
        let started = Instant::now();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let until = Instant::now() + Duration::from_secs(5);
        let err = rt
            .block_on(get_pod_with_retries(&kube, &c, &args("ns", "p"), until))
            .unwrap_err();
        assert!(!err.is_transient(), "{code}: {err}");
        assert_eq!(kube.pod_calls.load(Ordering::SeqCst), 1, "{code} retried");
        assert!(started.elapsed() < Duration::from_millis(100));
    }
}

#[test]
fn names_that_no_pod_can_have_fail_before_the_client() {
    let c = conf();
    for (ns, name, key) in [
        ("../../etc", "a/b", "K8S_POD_NAMESPACE"),
        ("ns", "a/b", "K8S_POD_NAME"),
        ("kube-system", "../x", "K8S_POD_NAME"),
        ("istio-system", "istio-cni-node-\n", "K8S_POD_NAME"),
    ] {
        let e = run(&c, &args(ns, name), None).unwrap_err();
        assert_eq!(e.code, code::INVALID_ENV, "{e}");
        assert!(e.msg.starts_with(&format!("CNI_ARGS {key}: ")), "{e}");
        assert!(!e.msg.contains("kubeconfig"), "client was built: {e}");
    }
}

#[test]
fn outcomes_display_without_debug_syntax() {
    let shown = [
        AddOutcome::Skipped("no istio-proxy"),
        AddOutcome::Redirected { ipv6: true },
        AddOutcome::DryRun {
            path: "/x".into(),
            ipv6: false,
        },
    ]
    .map(|o| o.to_string());
    assert_eq!(shown, ["skipped", "redirected", "dry run"]);
}

#[test]
fn own_pod_guard_predicate() {
    let c = conf();
    assert!(is_cni_pod(&c, &args("istio-system", "istio-cni-node-x")));
    assert!(!is_cni_pod(&c, &args("istio-system", "istio-cni-x")));
    assert!(!is_cni_pod(&c, &args("other", "istio-cni-node-x")));
}
