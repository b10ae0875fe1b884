use super::*;
use crate::kube::load_config_with;
use kube::config::{KubeConfigOptions, Kubeconfig};
use std::ffi::OsStr;

const KUBECONFIG_WITH_CA: &str = include_str!("../testdata/kubeconfig-with-ca.yaml");
const KUBECONFIG_SKIP_TLS: &str = include_str!("../testdata/kubeconfig-skip-tls.yaml");

async fn config_from_yaml(yaml: &str) -> kube::Config {
    let kubeconfig = Kubeconfig::from_yaml(yaml).expect("fixture parses");
    kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("fixture makes a config")
}

// Guards the rustls provider choice: with exactly one provider (ring) compiled in, building a
// client with a CA must not panic for want of a process-level CryptoProvider.
#[tokio::test]
async fn client_builds_from_config_with_ca() {
    let config = config_from_yaml(KUBECONFIG_WITH_CA).await;
    assert!(
        config
            .root_cert
            .as_ref()
            .is_some_and(|certs| certs.len() == 1)
    );
    assert!(!config.accept_invalid_certs);
    assert!(KubeClient::from_config(config).is_ok());
}

// Istio's SKIP_TLS_VERIFY kubeconfig has no CA; kube must fall back to bundled webpki roots
// instead of the (possibly empty) system store.
#[tokio::test]
async fn client_builds_from_skip_tls_config_without_ca() {
    let config = config_from_yaml(KUBECONFIG_SKIP_TLS).await;
    assert!(config.root_cert.is_none());
    assert!(config.accept_invalid_certs);
    assert!(KubeClient::from_config(config).is_ok());
}

#[tokio::test]
async fn explicit_path_wins_and_names_the_file_on_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = dir.path().join("kubeconfig");
    std::fs::write(&good, KUBECONFIG_SKIP_TLS).expect("write");
    let (config, source) = load_config(Some(&good)).await.expect("loads");
    assert_eq!(source, ConfigSource::File(good.clone()));
    assert_eq!(source.to_string(), good.display().to_string());
    assert_eq!(ConfigSource::InCluster.to_string(), "in-cluster");
    assert_eq!(config.cluster_url.to_string(), "https://10.96.0.1:443/");

    let missing = dir.path().join("absent");
    let err = load_config(Some(&missing)).await.expect_err("fails");
    assert!(err.to_string().contains("absent"), "{err}");
}

#[tokio::test]
async fn kubeconfig_env_is_used_when_no_path_is_given() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = dir.path().join("first");
    let second = dir.path().join("second");
    std::fs::write(&first, KUBECONFIG_WITH_CA).expect("write");
    std::fs::write(&second, KUBECONFIG_SKIP_TLS).expect("write");
    let list = std::env::join_paths([first.as_path(), Path::new(""), second.as_path()])
        .expect("path list");
    let (config, source) = load_config_with(None, Some(&list)).await.expect("loads");
    assert_eq!(source, ConfigSource::KubeconfigEnv);
    // The first file to define the cluster wins: it has the CA.
    assert!(config.root_cert.is_some());

    let explicit = load_config_with(Some(&second), Some(&list))
        .await
        .expect("loads");
    assert_eq!(explicit.1, ConfigSource::File(second.clone()));
}

#[tokio::test]
async fn without_path_or_env_it_is_in_cluster() {
    // Outside a pod the in-cluster attempt must fail with the in-cluster error, never
    // silently fall back to ~/.kube/config.
    assert!(
        std::env::var_os("KUBERNETES_SERVICE_HOST").is_none(),
        "run the tests outside a pod (KUBERNETES_SERVICE_HOST is set): this one checks that the \
         in-cluster attempt fails there"
    );
    let err = load_config_with(None, Some(OsStr::new("")))
        .await
        .expect_err("not in a pod");
    assert!(matches!(err, KubeError::InCluster(_)), "{err:?}");
}

#[test]
fn selectors_join_terms_and_skip_empty_ones() {
    let s = Selectors::on_node("n1")
        .and_fields("")
        .and_fields("status.phase=Running,");
    assert_eq!(
        s.fields.as_deref(),
        Some("spec.nodeName=n1,status.phase=Running")
    );
    let s = Selectors::default().and_labels("app=a").and_labels("!skip");
    assert_eq!(s.labels.as_deref(), Some("app=a,!skip"));
    assert_eq!(Selectors::default().and_fields(",").fields, None);
}

// Each watch stream asks for its own timeoutSeconds in [min, 2 * min], so the agents of many
// nodes do not re-open their watches in step (kube-runtime's default is one fixed 290 s).
#[test]
fn watch_timeouts_are_drawn_from_the_band_and_vary() {
    let min = WATCH_TIMEOUT_MIN.as_secs() as u32;
    let drawn: Vec<u32> = (0..64)
        .map(|_| {
            Selectors::on_node("n1")
                .watcher_config(watcher::InitialListStrategy::StreamingList)
                .timeout
                .expect("a timeout is set")
        })
        .collect();
    assert!(
        drawn.iter().all(|t| (min..=2 * min).contains(t)),
        "{drawn:?}"
    );
    assert!(drawn.iter().any(|t| *t != drawn[0]), "{drawn:?}");
}

#[test]
fn metadata_patch_sets_and_removes_keys() {
    let patch = MetadataPatch::default()
        .set_annotation("ambient.istio.io/redirection", "enabled")
        .remove_label("old");
    assert_eq!(
        patch.to_merge_patch(),
        serde_json::json!({"metadata": {
            "labels": {"old": null},
            "annotations": {"ambient.istio.io/redirection": "enabled"}
        }})
    );
}

#[test]
fn pod_event_refers_to_the_pod() {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "7"}
    }))
    .expect("pod");
    let event = EventRecord {
        event_type: EventType::Warning,
        reason: "DeleteBrokenPod".into(),
        message: "pod detected as broken, deleted".into(),
        component: "cni-repair".into(),
    };
    let now = Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).expect("time"));
    let built = event.to_event(&pod, now);
    assert_eq!(built.metadata.name.as_deref(), Some("p.17979cfe362a0000"));
    assert_eq!(built.metadata.namespace.as_deref(), Some("ns"));
    assert_eq!(built.involved_object.uid.as_deref(), Some("u1"));
    assert_eq!(built.involved_object.kind.as_deref(), Some("Pod"));
    assert_eq!(built.type_.as_deref(), Some("Warning"));
    assert_eq!(
        built.source.and_then(|s| s.component).as_deref(),
        Some("cni-repair")
    );
}

#[tokio::test(start_paused = true)]
async fn watch_backoff_doubles_to_max_jittered_and_resets_only_on_progress() {
    use watcher::Event;
    let settings = WatchBackoff {
        min: Duration::from_millis(100),
        max: Duration::from_millis(350),
    };
    // Equal jitter: each delay in [base/2, base] (a millisecond allowed for the clock's steps).
    let in_band = |d: Duration, base: u64| {
        let (base, slack) = (Duration::from_millis(base), Duration::from_millis(1));
        d + slack >= base / 2 && d <= base + slack
    };
    let err = || Err(watcher::Error::NoResourceVersion);
    // A failing first list yields Init before each attempt: no reset. InitDone is progress.
    let items: Vec<Result<Event<Pod>, watcher::Error>> = vec![
        Ok(Event::Init),
        err(),
        Ok(Event::Init),
        err(),
        Ok(Event::Init),
        err(),
        Ok(Event::Init),
        err(),
        Ok(Event::Init),
        Ok(Event::InitDone),
        err(),
        Ok(Event::Init),
    ];
    let mut stream = backed_off(futures::stream::iter(items).boxed(), settings);
    let mut pauses = Vec::new();
    let mut last = tokio::time::Instant::now();
    while let Some(item) = stream.next().await {
        let now = tokio::time::Instant::now();
        pauses.push(now - last);
        last = now;
        drop(item);
    }
    // The pause before each item (an error's delay shows on the item after it).
    let after_errors: Vec<Duration> = [2, 4, 6, 8, 11].iter().map(|&i| pauses[i]).collect();
    for (d, base) in after_errors.iter().zip([100, 200, 350, 350, 100]) {
        assert!(in_band(*d, base), "{d:?} vs {base} ms: {pauses:?}");
    }
    for i in [0, 1, 3, 5, 7, 9, 10] {
        assert_eq!(pauses[i], Duration::ZERO, "item {i}: {pauses:?}");
    }
}
