//! Unit tests of `mesh`: a failed re-ADD of an enrolled pod
//! changes nothing; a netns the checks refuse is never programmed.

use std::sync::atomic::Ordering;

use serde_json::json;

use super::*;
use crate::agent::testing::{FakeAnnotator, FakeDataplane, FakeZtunnel};

fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
        "status": {"podIPs": [{"ip": "10.0.0.9"}]}
    }))
    .unwrap()
}

fn mesh_with(dp: Arc<FakeDataplane>, zt: Arc<FakeZtunnel>) -> Mesh {
    Mesh {
        dataplane: dp,
        ztunnel: zt,
        annotator: Arc::new(FakeAnnotator::default()),
        cache: Arc::new(PodCache::default()),
        probe_gate: Default::default(),
    }
}

fn plugin(netns: &str, ips: &[&str]) -> PluginAdd {
    PluginAdd {
        netns: netns.into(),
        event_ips: ips.iter().map(|s| s.parse().unwrap()).collect(),
        ..Default::default()
    }
}

/// The fake data plane and ztunnel, and a mesh over them.
fn rig() -> (Arc<FakeDataplane>, Arc<FakeZtunnel>, Mesh) {
    let (dp, zt) = (
        Arc::new(FakeDataplane::default()),
        Arc::new(FakeZtunnel::default()),
    );
    let mesh = mesh_with(dp.clone(), zt.clone());
    (dp, zt, mesh)
}

/// The IP of every test pod ([`pod`]).
fn pod_ip() -> IpAddr {
    "10.0.0.9".parse().unwrap()
}

/// A plugin's ADD of a test pod in this process's netns; `annotate_after_answer`: `/podadd`'s.
fn add_of_a(annotate_after_answer: bool) -> PluginAdd {
    PluginAdd {
        annotate_after_answer,
        ..plugin("/proc/self/ns/net", &["10.0.0.9"])
    }
}

/// What a failed re-ADD must leave as it was.
fn enrolled_state(
    mesh: &Mesh,
    zt: &FakeZtunnel,
    uid: &str,
) -> (bool, bool, Vec<(String, Vec<IpAddr>)>, bool) {
    (
        mesh.cache.contains(uid),
        mesh.cache.netns(uid).is_some(),
        mesh.cache.probe_members().0,
        zt.has(uid),
    )
}

#[tokio::test]
async fn a_failed_re_add_of_an_enrolled_pod_changes_nothing() {
    let (dp, zt, mesh) = rig();
    let p = pod("a");
    let ip = pod_ip();
    let good = add_of_a(false);
    mesh.add_pod(&p, &[ip], Via::Plugin(&good)).await.unwrap();
    let before = enrolled_state(&mesh, &zt, "uid-a");
    assert_eq!(before, (true, true, vec![("uid-a".into(), vec![ip])], true));
    let adds = zt.adds.load(Ordering::SeqCst);

    // A netns that cannot be opened (a regular file), one the checks refuse (the agent's own),
    // one not holding the pod's IP, and programming that fails: each leaves the pod as it was.
    let file = tempfile::NamedTempFile::new().unwrap();
    let not_netns = plugin(file.path().to_str().unwrap(), &["10.0.0.9"]);
    let err = mesh
        .add_pod(&p, &[ip], Via::Plugin(&not_netns))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not a network namespace"), "{err}");
    assert_eq!(enrolled_state(&mesh, &zt, "uid-a"), before);

    *dp.reserved.lock() = vec![(
        "the agent's own netns".into(),
        Netns::current().unwrap().id(),
    )];
    let err = mesh
        .add_pod(&p, &[ip], Via::Plugin(&good))
        .await
        .unwrap_err();
    assert!(matches!(err, MeshError::Refused { .. }), "{err}");
    assert_eq!(err.class(), Class::GiveUp);
    assert_eq!(enrolled_state(&mesh, &zt, "uid-a"), before);
    dp.reserved.lock().clear();
    // The node's netns unidentified: every offered netns is refused, saying why.
    *dp.reserved_unidentified.lock() = Some("cannot identify the node's netns".into());
    let err = mesh
        .add_pod(&p, &[ip], Via::Plugin(&good))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("is refused: cannot identify the node's netns"),
        "{err}"
    );
    assert_eq!(enrolled_state(&mesh, &zt, "uid-a"), before);
    *dp.reserved_unidentified.lock() = None;

    *dp.addresses.lock() = Some(vec!["10.0.0.77".parse().unwrap()]);
    let err = mesh
        .add_pod(&p, &[ip], Via::Plugin(&good))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("does not hold 10.0.0.9"), "{err}");
    assert_eq!(enrolled_state(&mesh, &zt, "uid-a"), before);
    *dp.addresses.lock() = None;

    dp.fail_program.store(true, Ordering::SeqCst);
    mesh.add_pod(&p, &[ip], Via::Plugin(&good))
        .await
        .unwrap_err();
    mesh.add_pod(&p, &[ip], Via::Watch).await.unwrap_err();
    assert_eq!(enrolled_state(&mesh, &zt, "uid-a"), before);
    assert_eq!(
        zt.adds.load(Ordering::SeqCst),
        adds,
        "ztunnel was told nothing"
    );
    assert_eq!(dp.probes.lock().get(&ip).map(String::as_str), Some("uid-a"));
}

#[tokio::test]
async fn a_failed_add_of_a_new_pod_leaves_nothing_behind() {
    let (dp, zt, mesh) = rig();
    let ip = pod_ip();
    dp.fail_program.store(true, Ordering::SeqCst);
    let add = add_of_a(false);
    mesh.add_pod(&pod("a"), &[ip], Via::Plugin(&add))
        .await
        .unwrap_err();
    assert!(mesh.cache.is_empty());
    // Loopback in the event: refused before anything is programmed.
    dp.fail_program.store(false, Ordering::SeqCst);
    let lo = plugin("/proc/self/ns/net", &["127.0.0.1"]);
    let err = mesh
        .add_pod(&pod("a"), &[], Via::Plugin(&lo))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("127.0.0.1 is not a pod address (loopback)"),
        "{err}"
    );
    assert!(mesh.cache.is_empty() && dp.probes.lock().is_empty());
    assert_eq!(dp.count("program"), 1);
    assert_eq!(zt.adds.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_cached_netns_that_is_gone_is_found_again_by_the_watch() {
    let (dp, _, mesh) = rig();
    let ip = pod_ip();
    mesh.add_pod(&pod("a"), &[ip], Via::Watch).await.unwrap();
    assert_eq!(dp.count("find"), 1);
    // Alive: the cached one is used.
    mesh.add_pod(&pod("a"), &[ip], Via::Watch).await.unwrap();
    assert_eq!(dp.count("find"), 1);
    // Gone: the /proc scan finds it again.
    dp.netns_gone.store(true, Ordering::SeqCst);
    mesh.add_pod(&pod("a"), &[ip], Via::Watch).await.unwrap();
    assert_eq!(dp.count("find"), 2);
}

/// Pod `a` enrolled by a plugin's ADD ([`add_of_a`]) in a mesh annotated by a fake, over the
/// fake data plane and ztunnel: (the annotator, the mesh, the pod, the ADD).
async fn enrolled_a(annotate_after_answer: bool) -> (Arc<FakeAnnotator>, Mesh, Pod, PluginAdd) {
    let annotator = Arc::new(FakeAnnotator::default());
    let mesh = Mesh {
        annotator: annotator.clone(),
        ..rig().2
    };
    let p = pod("a");
    let add = add_of_a(annotate_after_answer);
    mesh.add_pod(&p, &[pod_ip()], Via::Plugin(&add))
        .await
        .unwrap();
    (annotator, mesh, p, add)
}

#[tokio::test]
async fn a_podadd_enrolment_answers_before_its_annotation_which_is_retried_until_written() {
    let (annotator, mesh, p, add) = enrolled_a(true).await;
    let ip = pod_ip();
    // Enrolled (probe set included), but nothing written to the API server yet.
    assert_eq!(
        mesh.cache.probe_members().0,
        vec![("uid-a".into(), vec![ip])]
    );
    assert_eq!(annotator.patches(), vec![]);
    assert_eq!(add.progress.step(), AddStep::Done);
    assert!(mesh.cache.annotation_owed("uid-a"));

    // A failed patch stays owed (the pod's key is retried: reconciler_tests), then is written.
    annotator.failures.store(1, Ordering::SeqCst);
    let err = mesh.annotate_owed(&p).await.unwrap_err();
    assert_eq!(err.class(), Class::Retry);
    assert!(mesh.cache.annotation_owed("uid-a"));
    assert!(mesh.annotate_owed(&p).await.unwrap());
    assert_eq!(
        annotator.patches(),
        vec![("ns/a".to_string(), Some("enabled".to_string()))]
    );
    assert!(!mesh.cache.annotation_owed("uid-a"));
    // Paid: nothing more to write.
    assert!(!mesh.annotate_owed(&p).await.unwrap());
    assert_eq!(annotator.patches().len(), 1);
}

#[tokio::test]
async fn istio_s_cmdadd_still_writes_the_annotation_before_answering() {
    let (annotator, mesh, ..) = enrolled_a(false).await;
    assert_eq!(annotator.value("ns/a").as_deref(), Some("enabled"));
    assert!(!mesh.cache.annotation_owed("uid-a"));
}

#[tokio::test]
async fn a_pod_removed_before_its_owed_annotation_is_written_never_gets_it() {
    let (annotator, mesh, p, _) = enrolled_a(true).await;
    mesh.remove_pod(&p, &[pod_ip()], false, false)
        .await
        .unwrap();
    assert!(!mesh.annotate_owed(&p).await.unwrap());
    // Only the remove's clearing patch: a late `enabled` would mark a removed pod enrolled.
    assert_eq!(annotator.patches(), vec![("ns/a".to_string(), None)]);
}

/// The one classification, as a table: (what failed, what the pod's key does). The step rule
/// (nothing written when the netns or its rules fail) wins over the cause, except a task that
/// panicked, which is always retried.
#[tokio::test]
async fn every_failure_is_classified_once_by_step_and_cause() {
    use crate::agent::testing::{inpod_failure, probe_set_failure};
    use crate::kube::{ApiRefusal, Call};
    use crate::netns::NetnsError;
    let cancelled = || {
        let task = tokio::spawn(std::future::pending::<()>());
        task.abort();
        task
    };
    let not_netns = || NetnsError::NotNetns {
        path: "/var/run/netns/x".into(),
        what: "is a regular file".into(),
    };
    let dataplane = |step, source| MeshError::Dataplane {
        pod: "ns/p".into(),
        step,
        source,
    };
    let ztunnel = |source| MeshError::Ztunnel {
        pod: "ns/p".into(),
        source,
    };
    let task = |step, source| MeshError::Task {
        pod: "ns/p".into(),
        step,
        source,
    };
    let kube = |call| KubeError::Timeout {
        call,
        object: "ns/p".into(),
        timeout: std::time::Duration::from_secs(1),
    };
    let pod = || "ns/p".to_string();
    use Class::*;
    use MeshStep::*;
    let table: Vec<(MeshError, Class)> = vec![
        // Nothing written: the next event or ADD tries again, not the backoff.
        (dataplane(FindNetns, probe_set_failure("x")), GiveUp),
        (dataplane(ProgramPod, probe_set_failure("x")), GiveUp),
        (
            dataplane(
                FindNetns,
                DataplaneError::OpenNetns {
                    path: "/var/run/netns/x".into(),
                    source: not_netns(),
                },
            ),
            GiveUp,
        ),
        (task(ProgramPod, cancelled().await.unwrap_err()), Retry),
        (task(ProbeSet, cancelled().await.unwrap_err()), Retry),
        // ztunnel: absent, refusing or slow is transient; a handle that is not a netns is not.
        (ztunnel(ZdsError::NotRunning), Retry),
        (ztunnel(ZdsError::NoConnection), Retry),
        (
            ztunnel(ZdsError::Nack {
                uid: "u".into(),
                message: "AddrInUse".into(),
            }),
            Retry,
        ),
        (
            ztunnel(ZdsError::NotANetns {
                uid: "u".into(),
                path: "/x".into(),
                reason: crate::zds::NotANetns::OtherType(0),
            }),
            GiveUp,
        ),
        // The data plane: the pod's own netns is permanent, the host's probe set transient.
        (
            dataplane(
                UnprogramPod,
                DataplaneError::Enter {
                    pod: pod(),
                    source: not_netns(),
                },
            ),
            GiveUp,
        ),
        (
            dataplane(
                ProbeSet,
                DataplaneError::HostNetns {
                    path: "/proc/1/ns/net".into(),
                    source: not_netns(),
                },
            ),
            Retry,
        ),
        (dataplane(ProbeSet, probe_set_failure("x")), Retry),
        (dataplane(ProbeSet, inpod_failure("ns/p", "x")), GiveUp),
        // The API server: a pod that is gone is not patched again.
        (
            MeshError::Annotate {
                pod: pod(),
                source: kube(Call::PatchPod),
            },
            Retry,
        ),
        (
            MeshError::Annotate {
                pod: pod(),
                source: KubeError::NotFound(ApiRefusal {
                    call: Call::PatchPod,
                    object: pod(),
                    message: "pods \"p\" not found".into(),
                }),
            },
            GiveUp,
        ),
        (MeshError::NoNetns { pod: pod() }, GiveUp),
        (MeshError::NotInStore { pod: pod() }, GiveUp),
        (
            MeshError::Refused {
                pod: pod(),
                reason: trust::Refusal::Unidentified {
                    path: "/x".into(),
                    why: "no reserved netns".into(),
                },
            },
            GiveUp,
        ),
        (MeshError::NamespaceMissing { pod: pod() }, WaitFor),
    ];
    for (error, class) in &table {
        assert_eq!(classify(error), *class, "{error}");
        assert_eq!(error.class(), *class, "{error}");
    }
}
