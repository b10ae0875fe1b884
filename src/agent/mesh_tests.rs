//! Unit tests of `mesh`: one pod's adds never interleave; a failed re-ADD of an enrolled pod
//! changes nothing; a netns the checks refuse is never programmed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use super::*;
use crate::agent::testing::{FakeAnnotator, FakeDataplane, FakeZtunnel};

/// The fake data plane, slow to program and counting programs in flight, per pod and in all.
#[derive(Default)]
struct Slow {
    inner: FakeDataplane,
    in_flight: HashMap<String, AtomicU32>,
    most: AtomicU32,
    overall: AtomicU32,
    most_overall: AtomicU32,
    /// A program alone in flight waits (up to a second) for a second one: two programs that can
    /// run side by side then surely overlap, however the runtime schedules them.
    rendezvous: AtomicBool,
}

impl DataplanePort for Slow {
    fn open_netns(&self, path: &str) -> Result<Netns, PortError> {
        self.inner.open_netns(path)
    }
    fn reserved_netns(&self) -> Vec<(String, crate::netns::NetnsId)> {
        self.inner.reserved_netns()
    }
    fn netns_addresses(
        &self,
        netns: &Netns,
        pod: &crate::agent::ports::PodNet,
    ) -> Result<Vec<IpAddr>, PortError> {
        self.inner.netns_addresses(netns, pod)
    }
    fn netns_alive(&self, netns: &Netns) -> bool {
        self.inner.netns_alive(netns)
    }
    fn find_netns(&self, wanted: &HashMap<String, Vec<IpAddr>>) -> HashMap<String, Netns> {
        self.inner.find_netns(wanted)
    }
    fn program_pod(
        &self,
        netns: &Netns,
        pod: &crate::agent::ports::PodNet,
    ) -> Result<crate::agent::ports::RuleChange, PortError> {
        let now = self.in_flight[&pod.uid].fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        let all = self.overall.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_overall.fetch_max(all, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(30));
        let deadline = Instant::now() + Duration::from_secs(1);
        while self.rendezvous.load(Ordering::SeqCst)
            && self.most_overall.load(Ordering::SeqCst) < 2
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.overall.fetch_sub(1, Ordering::SeqCst);
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
    let add = |name: &'static str, netns: Option<&'static str>| {
        let mesh = mesh.clone();
        // One IP per pod (a netns holding another pod's IP is refused).
        let ip: IpAddr = if name == "a" { "10.0.0.9" } else { "10.0.0.10" }
            .parse()
            .unwrap();
        tokio::spawn(async move {
            match netns {
                Some(path) => {
                    let add = PluginAdd {
                        netns: path.into(),
                        ..Default::default()
                    };
                    mesh.add_pod(&pod(name), &[ip], Via::Plugin(&add)).await
                }
                None => mesh.add_pod(&pod(name), &[ip], Via::Watch).await,
            }
        })
    };
    // The plugin's ADD (with its netns) and the informer's add of the same pod, at once.
    let (plugin, watch) = (add("a", Some("/proc/self/ns/net")), add("a", None));
    plugin.await.unwrap().unwrap();
    watch.await.unwrap().unwrap();
    assert_eq!(slow.most.load(Ordering::SeqCst), 1);
    assert!(mesh.locks.is_empty());
    assert_eq!(slow.most_overall.load(Ordering::SeqCst), 1);
    // Different pods are programmed side by side.
    slow.rendezvous.store(true, Ordering::SeqCst);
    let (a, b) = (add("a", None), add("b", Some("/proc/self/ns/net")));
    a.await.unwrap().unwrap();
    b.await.unwrap().unwrap();
    assert_eq!(slow.inner.count("program"), 4);
    assert_eq!(
        slow.most_overall.load(Ordering::SeqCst),
        2,
        "two pods' programs never overlapped"
    );
}

fn mesh_with(dp: Arc<FakeDataplane>, zt: Arc<FakeZtunnel>) -> Mesh {
    Mesh {
        dataplane: dp,
        ztunnel: zt,
        annotator: Arc::new(FakeAnnotator::default()),
        cache: Arc::new(PodCache::default()),
        locks: PodLocks::default(),
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
    let (dp, zt) = (
        Arc::new(FakeDataplane::default()),
        Arc::new(FakeZtunnel::default()),
    );
    let mesh = mesh_with(dp.clone(), zt.clone());
    let p = pod("a");
    let ip: IpAddr = "10.0.0.9".parse().unwrap();
    let good = plugin("/proc/self/ns/net", &["10.0.0.9"]);
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
    assert!(!err.is_retryable());
    assert_eq!(enrolled_state(&mesh, &zt, "uid-a"), before);
    dp.reserved.lock().clear();

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
    let (dp, zt) = (
        Arc::new(FakeDataplane::default()),
        Arc::new(FakeZtunnel::default()),
    );
    let mesh = mesh_with(dp.clone(), zt.clone());
    let ip: IpAddr = "10.0.0.9".parse().unwrap();
    dp.fail_program.store(true, Ordering::SeqCst);
    let add = plugin("/proc/self/ns/net", &["10.0.0.9"]);
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
    let (dp, zt) = (
        Arc::new(FakeDataplane::default()),
        Arc::new(FakeZtunnel::default()),
    );
    let mesh = mesh_with(dp.clone(), zt.clone());
    let ip: IpAddr = "10.0.0.9".parse().unwrap();
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

/// A mesh whose annotator is `annotator`, over the fake data plane and ztunnel.
fn mesh_annotated_by(annotator: Arc<FakeAnnotator>) -> Mesh {
    Mesh {
        annotator,
        ..mesh_with(
            Arc::new(FakeDataplane::default()),
            Arc::new(FakeZtunnel::default()),
        )
    }
}

const FAST_RETRY: RetryPolicy = RetryPolicy {
    first: Duration::from_millis(5),
    max: Duration::from_millis(20),
    max_attempts: None,
};

#[tokio::test]
async fn a_podadd_enrolment_answers_before_its_annotation_which_is_retried_until_written() {
    let annotator = Arc::new(FakeAnnotator::default());
    let mesh = mesh_annotated_by(annotator.clone());
    let p = pod("a");
    let ip: IpAddr = "10.0.0.9".parse().unwrap();
    let add = PluginAdd {
        annotate_after_answer: true,
        ..plugin("/proc/self/ns/net", &["10.0.0.9"])
    };
    mesh.add_pod(&p, &[ip], Via::Plugin(&add)).await.unwrap();
    // Enrolled (probe set included), but nothing written to the API server yet.
    assert_eq!(
        mesh.cache.probe_members().0,
        vec![("uid-a".into(), vec![ip])]
    );
    assert_eq!(annotator.patches(), vec![]);
    assert_eq!(add.progress.step(), AddStep::Done);
    assert!(mesh.cache.annotation_owed("uid-a"));

    // The first two patches fail: retried until written.
    annotator.failures.store(2, Ordering::SeqCst);
    let until = std::time::Instant::now() + Duration::from_secs(5);
    mesh.annotate_owed_with_retries(&p, FAST_RETRY, until).await;
    assert_eq!(annotator.failures.load(Ordering::SeqCst), 0);
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
    let annotator = Arc::new(FakeAnnotator::default());
    let mesh = mesh_annotated_by(annotator.clone());
    let p = pod("a");
    let ip: IpAddr = "10.0.0.9".parse().unwrap();
    let add = plugin("/proc/self/ns/net", &["10.0.0.9"]);
    mesh.add_pod(&p, &[ip], Via::Plugin(&add)).await.unwrap();
    assert_eq!(annotator.value("ns/a").as_deref(), Some("enabled"));
    assert!(!mesh.cache.annotation_owed("uid-a"));
}

#[tokio::test]
async fn a_pod_removed_before_its_owed_annotation_is_written_never_gets_it() {
    let annotator = Arc::new(FakeAnnotator::default());
    let mesh = mesh_annotated_by(annotator.clone());
    let p = pod("a");
    let ip: IpAddr = "10.0.0.9".parse().unwrap();
    let add = PluginAdd {
        annotate_after_answer: true,
        ..plugin("/proc/self/ns/net", &["10.0.0.9"])
    };
    mesh.add_pod(&p, &[ip], Via::Plugin(&add)).await.unwrap();
    mesh.remove_pod(&p, false, false).await.unwrap();
    let until = std::time::Instant::now() + Duration::from_secs(1);
    mesh.annotate_owed_with_retries(&p, FAST_RETRY, until).await;
    // Only the remove's clearing patch: a late `enabled` would mark a removed pod enrolled.
    assert_eq!(annotator.patches(), vec![("ns/a".to_string(), None)]);
}
