//! How the real plugin treats names and API errors: a namespace or pod name that is not a
//! Kubernetes name is refused before any request; permanent API errors (403, 404) fail ADD at
//! once naming the permission or the object; transient ones (503) are retried; the ambient check
//! with `enable_ambient_detection_retry` ends with code 11, also when the deadline cuts it.

mod cni_driver;

use std::path::Path;
use std::time::{Duration, Instant};

use cni_driver::*;
use istio_cni_testing::apiserver::Fault;
use serde_json::{Value, json};

fn conf(run_dir: &Path) -> Value {
    sidecar_conf(run_dir, "10.31.0.2/24")
}

fn add_with_args(netns: &NetnsGuard, cni_args: &str, conf: &Value) -> Run {
    let mut env = cni_env("ADD", &netns.path().display().to_string(), "x", "y");
    env.retain(|(k, _)| *k != "CNI_ARGS");
    env.push(("CNI_ARGS", cni_args.to_string()));
    run_plugin(&env, &conf.to_string())
}

#[test]
fn names_that_are_not_kubernetes_names_fail_at_once_without_a_request() {
    let (api, dir) = api_and_run_dir();
    let netns = NetnsGuard::new("names");
    let long = format!("a{}", "\u{1b}[31mX".repeat(200));
    let cases = [
        (
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=../../etc;K8S_POD_NAME=a/b".to_string(),
            "K8S_POD_NAMESPACE",
            "\"../../etc\"",
        ),
        (
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=a/b".to_string(),
            "K8S_POD_NAME",
            "\"a/b\"",
        ),
        (
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=..".to_string(),
            "K8S_POD_NAME",
            "\"..\"",
        ),
        (
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=a%2Fb;K8S_POD_NAME=p".to_string(),
            "K8S_POD_NAMESPACE",
            "\"a%2Fb\"",
        ),
        (
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=p q".to_string(),
            "K8S_POD_NAME",
            "\"p q\"",
        ),
        (
            format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME={long}"),
            "K8S_POD_NAME",
            "\"a\\u{1b}[31mX",
        ),
    ];
    for (cni_args, key, shown) in cases {
        let run = add_with_args(&netns, &cni_args, &conf(dir.path()));
        let took = run.took;
        assert_eq!(run.code, 1, "{cni_args}: {}{}", run.stdout, run.stderr);
        let out = run.json();
        assert_eq!(out["code"], 4, "{}", run.stdout);
        assert_eq!(out["details"], "CNI_ARGS", "{}", run.stdout);
        let text = run.msg();
        assert!(
            text.starts_with(&format!("CNI_ARGS {key}: {shown}")),
            "{cni_args}: {text}"
        );
        assert!(text.len() < 400, "echo not bounded: {text}");
        assert!(!text.contains('\u{1b}'), "control character echoed: {text}");
        assert!(took < Duration::from_secs(2), "took {took:?}");
    }
    assert_eq!(api.request_count(), 0, "{:?}", api.server.requests());
}

#[test]
fn forbidden_and_not_found_fail_at_once_naming_permission_and_object() {
    let (api, dir) = api_and_run_dir();
    let netns = NetnsGuard::new("perm");

    // The pod does not exist: 404, not retried for the lookup window.
    let run = netns.add("ns1", "gone", &conf(dir.path()));
    let took = run.took;
    // 404 must name the object.
    run.assert_failed_saying(&["get pod ns1/gone: not found"]);
    assert!(took < Duration::from_secs(1), "404 took {took:?}");
    assert_eq!(api.request_count(), 1, "404 was retried");

    // RBAC: 403, not retried, names verb, resource and namespace.
    api.put_pod(annotated_pod("ns1", "p", json!({})));
    api.fault(Fault::fail(403));
    api.server.clear_requests();
    let run = netns.add("ns1", "p", &conf(dir.path()));
    let took = run.took;
    // 403 must name the permission.
    run.assert_failed_saying(&["cannot get pods in namespace ns1", "ClusterRole"]);
    assert!(took < Duration::from_secs(1), "403 took {took:?}");
    assert_eq!(api.request_count(), 1, "403 was retried");
    let save = netns.iptables_save();
    assert!(!save.contains("ISTIO"), "netns was changed:\n{save}");
}

#[test]
fn transient_errors_then_ok_succeed_after_quick_retries() {
    let (api, dir) = api_with_sidecar_pod("ns1", "p");
    let netns = NetnsGuard::new("503");
    let out = dir.path().join("dry.txt");
    let mut env = cni_env("ADD", &netns.path().display().to_string(), "ns1", "p");
    env.push(("DRY_RUN_FILE_PATH", out.display().to_string()));
    // Two failures, then the pod: retried with a short jittered backoff (Istio sleeps 1 s each).
    for code in [500, 503] {
        api.server.clear_requests();
        api.fault(Fault::fail(code).times(2));
        let run = run_plugin(&env, &conf(dir.path()).to_string());
        let took = run.took;
        assert_eq!(run.code, 0, "{code}: {}{}", run.stdout, run.stderr);
        assert_eq!(api.request_count(), 3, "{code}: two failures, then success");
        assert!(took < Duration::from_millis(1500), "{code}: took {took:?}");
        assert!(file_text(&out).contains("ISTIO_REDIRECT"));
    }
}

#[test]
fn ambient_detection_retry_ends_with_code_11() {
    let (api, dir) = api_and_run_dir();
    api.put_pod(annotated_pod("ns1", "p", json!({})));
    api.put_namespace("ns1", json!({}));
    let netns = NetnsGuard::new("amb");
    let mut c = conf(dir.path());
    c["ambient_enabled"] = json!(true);
    c["enable_ambient_detection_retry"] = json!(true);

    // Permanent: at once, code 11, naming the permission.
    api.fault(Fault::fail(403).on_path("/api/v1/namespaces/ns1/pods"));
    let started = Instant::now();
    let run = netns.add("ns1", "p", &c);
    assert_eq!(run.json()["code"], 11, "{}", run.stdout);
    assert!(
        run.msg().contains("cannot get pods in namespace ns1"),
        "{}",
        run.stdout
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );

    // An API server that never answers: the ADD deadline (2 s, shorter than the 5 s call timeout)
    // cuts the lookup, still code 11 (the generic "did not finish" timeout, 999, used to win).
    api.fault(Fault::slow(Duration::from_secs(30)));
    c["add_timeout_seconds"] = json!(2);
    let started = Instant::now();
    let run = netns.add("ns1", "p", &c);
    assert_eq!(run.json()["code"], 11, "{}", run.stdout);
    assert!(run.msg().contains("ambient"), "{}", run.stdout);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
}
