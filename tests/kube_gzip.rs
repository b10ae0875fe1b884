//! The product's Kubernetes client against the real kube-apiserver: watch streams come gzipped
//! (the server writes one gzip member per event) and every event of the stream is decoded.
//! Measured on the wire through a relay that counts the bytes the server sends.

use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt;
use istio_cni::kube::{KubeClient, Selectors, WatchBackoff, WatchEvent};
use istio_cni_testing::controlplane::{self, Forwarder, pod_on_node, unique_name};

const PODS: usize = 20;
/// An annotation that compresses well, so a gzipped event is a fraction of its JSON.
const FILLER: usize = 4000;
const PATIENCE: Duration = Duration::from_secs(30);

#[test]
fn watch_events_arrive_gzipped_and_every_member_is_decoded() {
    let cp = controlplane::shared();
    let node = unique_name("gzip-node");
    let ns = unique_name("gzip");
    cp.create_namespace(&ns, &[]);
    // A counting relay in this test's own network namespace, in front of the API server.
    let relay = Forwarder::start_at(Path::new("/proc/self/ns/net"), cp.port(), 0).expect("relay");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let config = rt.block_on(cp.admin_config_via(relay.port()));
    // The client's request buffer runs as a task of the runtime it is built in.
    let _in_runtime = rt.enter();
    let client = KubeClient::from_config(config).expect("client");

    let backoff = WatchBackoff {
        min: Duration::from_millis(100),
        max: Duration::from_secs(1),
    };
    let mut stream = client.watch_pods(&Selectors::on_node(&node), backoff);
    // The initial (empty) list, then the watch request on the next poll.
    rt.block_on(async {
        loop {
            match tokio::time::timeout(PATIENCE, stream.next()).await {
                Ok(Some(Ok(WatchEvent::InitDone))) => break,
                Ok(Some(_)) => {}
                other => panic!("no initial sync: {other:?}"),
            }
        }
    });
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let watching = rt.spawn(async move {
        while let Some(event) = stream.next().await {
            if let Ok(WatchEvent::Apply(pod)) = event {
                let _ = tx.send(pod.metadata.name.unwrap_or_default());
            }
        }
    });
    std::thread::sleep(Duration::from_secs(1));
    let before = relay.bytes_received();

    let mut json_bytes = 0;
    for i in 0..PODS {
        let mut pod = pod_on_node(&ns, &format!("p{i}"), &node);
        pod.metadata.annotations = Some(
            [("filler".to_string(), "a".repeat(FILLER))]
                .into_iter()
                .collect(),
        );
        json_bytes += serde_json::to_vec(&cp.create_pod(&pod))
            .expect("json")
            .len();
    }
    let mut seen = std::collections::BTreeSet::new();
    let deadline = Instant::now() + PATIENCE;
    rt.block_on(async {
        while seen.len() < PODS && Instant::now() < deadline {
            if let Ok(Some(name)) =
                tokio::time::timeout(Duration::from_millis(200), rx.recv()).await
            {
                seen.insert(name);
            }
        }
    });
    let received = relay.bytes_received() - before;
    watching.abort();
    assert_eq!(seen.len(), PODS, "events decoded: {seen:?}");
    // Plain JSON would be at least `json_bytes`; gzipped events are a small part of it.
    assert!(
        (received as usize) < json_bytes / 4,
        "{received} bytes on the wire for {PODS} events of {json_bytes} bytes of JSON"
    );
}
