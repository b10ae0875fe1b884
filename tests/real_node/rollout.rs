//! A DaemonSet rollout on the real node while pods come and go: the image tag changes (a second
//! local tag of our image), the DaemonSet controller replaces the agent pod, and ambient pods
//! are created and deleted meanwhile. An ambient pod's ADD needs the agent, so a pod whose
//! sandbox is set up in the gap must wait (kubelet retries), never start uncaptured; a pod
//! deleted in the gap must still go.

use std::time::{Duration, Instant};

use istio_cni_testing::zds_peer::ZdsPeer;
use serde_json::json;

use crate::ambient::{ambient_pod, init_restarts, remove_host_rules, uid};
use crate::cluster::{Cluster, T, serial};

const SECOND_TAG: &str = "localhost/istio-cni-rs:image-rollout";

#[test]
fn a_rollout_of_the_daemonset_while_pods_come_and_go_leaves_none_stuck_or_uncaptured() {
    crate::support::require_root();
    let _one = serial();
    let c = Cluster::start_with_tags(&[SECOND_TAG]);
    let peer = ZdsPeer::start(std::path::Path::new("/var/run/ztunnel/ztunnel.sock"));
    let objects = c.install_chart(json!({"ambient": {"enabled": true}}));
    let old_agent = c.wait_agent_ready().metadata.name.expect("agent name");
    peer.wait_snapshots(1, T);
    let ns = "rollout-app";
    c.create_namespace(ns, &[("istio.io/dataplane-mode", "ambient")]);

    let t0 = Instant::now();
    let mut deleted = Vec::new();
    let mut rolled = None;
    let mut i: usize = 0;
    // Pods one after another, each deleted two rounds later, until the new agent has served a
    // few of them; the image changes right before the first deletion, so pods are deleted and
    // created while the old agent goes and the new one starts.
    loop {
        let name = format!("roll-{i}");
        c.create_pod(ambient_pod(ns, &name));
        if i == 2 {
            c.set_daemonset_image(SECOND_TAG);
            eprintln!("{:?}: DaemonSet image set to {SECOND_TAG}", t0.elapsed());
        }
        if i >= 2 {
            let old = format!("roll-{}", i - 2);
            c.delete_pod_nowait(ns, &old);
            deleted.push(old);
        }
        let pod = c
            .node
            .wait_pod_ready(&c.cp, ns, &name, T)
            .unwrap_or_else(|e| panic!("{name} during the rollout: {e}"));
        // Its init container's one connection was captured: it never ran outside the mesh.
        assert_eq!(init_restarts(&pod), 0, "{name} started uncaptured");
        assert!(
            peer.accepted(&uid(&pod)).unwrap_or(0) >= 1,
            "{name}: not at the peer"
        );
        eprintln!("{:?}: {name} ready, enrolled", t0.elapsed());
        if rolled.is_none() && new_agent_ready(&c, &old_agent) {
            rolled = Some(i);
            eprintln!("{:?}: the new agent is ready", t0.elapsed());
        }
        if rolled.is_some_and(|r| i >= r + 2) {
            break;
        }
        assert!(i < 40, "the rollout did not finish within 40 pods");
        i += 1;
    }
    // None stuck in Terminating: every pod deleted during the rollout is gone.
    for name in &deleted {
        let deadline = Instant::now() + T;
        while c.node.get_pod(&c.cp, ns, name).is_some() {
            assert!(Instant::now() < deadline, "{name} stuck after deletion");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    eprintln!(
        "{:?}: {} pods created, {} deleted during the rollout, none stuck",
        t0.elapsed(),
        i + 1,
        deleted.len()
    );
    for j in i.saturating_sub(1)..=i {
        c.node
            .delete_pod(&c.cp, ns, &format!("roll-{j}"), T)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    // The old agent closing its socket reads as zero bytes on a SOCK_SEQPACKET socket, which
    // the peer cannot tell from an empty datagram; anything else would be a protocol error.
    let violations = peer.violations();
    assert!(
        violations
            .iter()
            .all(|v| v.starts_with("an empty datagram")),
        "{violations:?}"
    );
    c.uninstall_chart(&objects);
    let deadline = Instant::now() + T;
    while !c.pods(crate::chart::NAMESPACE).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    // The uninstall took the host rules out (anything left is removed, then reported).
    let left = remove_host_rules();
    assert!(left.is_empty(), "host rules left after uninstall:\n{left}");
}

/// Whether an agent pod other than `old` runs the second tag and is ready (and `old` is gone).
fn new_agent_ready(c: &Cluster, old: &str) -> bool {
    let pods = c.pods(crate::chart::NAMESPACE);
    let old_gone = pods.iter().all(|p| p.metadata.name.as_deref() != Some(old));
    old_gone
        && pods.iter().any(|p| {
            let spec_image = p
                .spec
                .as_ref()
                .and_then(|s| s.containers.first())
                .and_then(|c| c.image.clone());
            let ready = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .is_some_and(|cs| cs.iter().all(|c| c.ready));
            spec_image.as_deref() == Some(SECOND_TAG) && ready
        })
}
