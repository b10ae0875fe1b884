//! Pod annotations (and the istio-proxy env and securityContext) -> the sidecar redirect the
//! plugin and the repair controller derive. Input: a pod as the API server sends it (JSON), or,
//! when it does not start with `{`, `key=value` lines taken as annotations (`env:NAME=value` as
//! istio-proxy env) so the fuzzer spends its time in the values. Properties: no panic; an
//! annotation error names an annotation the pod has; a derived capture passes the rule engine's
//! own validation and renders for both backends.
#![no_main]

use istio_cni::plugin::program::{Backend, dry_run_text};
use istio_cni::sidecar::PodInfo;
use istio_cni::sidecar::redirect::{self as sc, EngineEnv, Redirect, RedirectError};
use k8s_openapi::api::core::v1::Pod;
use libfuzzer_sys::fuzz_target;

fn from_lines(text: &str) -> PodInfo {
    let mut pod = PodInfo {
        containers: [sc_proxy(), "app".to_string()].into(),
        proxy_type: Some("sidecar".into()),
        ..PodInfo::default()
    };
    pod.annotations.insert(sc::ANN_STATUS.into(), "{}".into());
    for line in text.lines() {
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        match k.strip_prefix("env:") {
            Some(name) => pod.proxy_env.insert(name.into(), v.into()),
            None => pod.annotations.insert(k.into(), v.into()),
        };
    }
    pod
}

fn sc_proxy() -> String {
    istio_cni::sidecar::pod::ISTIO_PROXY.to_string()
}

fuzz_target!(|data: &[u8]| {
    let pod = if data.first() == Some(&b'{') {
        let Ok(pod) = serde_json::from_slice::<Pod>(data) else {
            return;
        };
        PodInfo::from_pod(&pod)
    } else {
        let Ok(text) = std::str::from_utf8(data) else {
            return;
        };
        from_lines(text)
    };
    let _ = sc::skip_reason(&pod);
    match sc::redirect(&pod, &EngineEnv::default()) {
        Ok(Redirect::Capture(settings)) => {
            assert_eq!(settings.config.validate(), Ok(()), "{pod:?}");
            for backend in [Backend::Iptables, Backend::Nftables] {
                let _ = dry_run_text(&settings.config, backend);
            }
        }
        Ok(Redirect::None) => {}
        Err(RedirectError::Annotation(e)) => {
            assert!(pod.annotations.contains_key(e.annotation), "{e}");
            assert!(e.to_string().contains(e.annotation), "{e}");
        }
        Err(RedirectError::Value(_)) => {}
    }
});
