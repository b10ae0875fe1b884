use super::*;
use crate::wire::pod_facts::PodFactsRequest;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::Event;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

fn store() -> PodStore {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "3"},
        "spec": {"containers": [{"name": "app"}]}
    }))
    .unwrap();
    let store = PodStore::new();
    store.apply(Event::Init);
    store.apply(Event::InitApply(pod));
    store.apply(Event::InitDone);
    store
}

/// The server runs on the runtime's worker while the test talks to it with blocking sockets.
fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// Sends raw bytes on a blocking socket and reads the whole answer (std, so it can run on a
/// thread with other credentials).
fn exchange(path: &Path, bytes: &[u8]) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::os::unix::net::UnixStream::connect(path)?;
    // A refused peer's request is never read: its write may hit a closed socket; the answer
    // is still there to read.
    let _ = stream.write_all(bytes);
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

#[test]
fn root_only_socket_answers_and_malformed_requests_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = crate::wire::pod_facts::socket_path(dir.path());
    let rt = rt();
    let pods = store();
    let stop = CancellationToken::new();
    let task = {
        let _entered = rt.enter();
        start(&path, pods.clone(), None, &Serving::default(), stop.clone()).unwrap()
    };
    let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o777;
    assert_eq!(mode(&path), 0o600);
    assert_eq!(mode(path.parent().unwrap()), 0o700);
    let ask = |bytes: Vec<u8>| exchange(&path, &bytes).unwrap();
    let request = PodFactsRequest {
        namespace: "ns".into(),
        name: "p".into(),
        uid: "u1".into(),
        namespace_labels: false,
    };
    let ok = PodFactsAnswer::decode(ask(request.encode()).as_bytes()).unwrap();
    assert!(matches!(ok, PodFactsAnswer::Pod { .. }), "{ok:?}");
    for bad in [
        b"{\"namespace\":".to_vec(),
        b"\xff\xfe\n".to_vec(),
        vec![b'x'; MAX_REQUEST_BYTES + 10],
    ] {
        let answer = PodFactsAnswer::decode(ask(bad).as_bytes()).unwrap();
        assert!(matches!(answer, PodFactsAnswer::Error { .. }), "{answer:?}");
    }
    assert_eq!(pods.len(), 1);
    assert!(pods.is_live());
    let again = PodFactsAnswer::decode(ask(request.encode()).as_bytes()).unwrap();
    assert_eq!(again, ok);

    // A non-root peer is refused even when the file modes would let it in.
    std::fs::set_permissions(
        path.parent().unwrap(),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    let (p, line) = (path.clone(), request.encode());
    let refused = std::thread::spawn(move || {
        // Credentials are per thread at the syscall level (glibc's setresuid would change the
        // whole process): this thread alone becomes nobody.
        let nobody = 65534 as libc::uid_t;
        let rc = unsafe { libc::syscall(libc::SYS_setresuid, nobody, nobody, nobody) };
        assert_eq!(rc, 0, "setresuid: {}", std::io::Error::last_os_error());
        exchange(&p, &line)
    });
    let answer = refused.join().unwrap().unwrap();
    match PodFactsAnswer::decode(answer.as_bytes()).unwrap() {
        PodFactsAnswer::Error { message } => assert!(message.contains("not root"), "{message}"),
        other => panic!("non-root peer answered: {other:?}"),
    }

    stop.cancel();
    rt.block_on(task).unwrap();
    assert!(!path.exists(), "socket removed on stop");
}

#[test]
fn answers_the_trimmed_stored_pod_and_names_what_is_wrong_with_a_request() {
    let store = store();
    let error = |line: &[u8]| match answer_line(line, &store, None) {
        PodFactsAnswer::Error { message } => message,
        other => panic!("{other:?}"),
    };
    assert!(error(b"not json\n").contains("not a pod-facts request"));
    assert!(error(br#"{"namespace":"../x","name":"p","uid":"u1"}"#).contains("names no pod"));
    assert!(error(br#"{"namespace":"ns","name":"p/q","uid":"u1"}"#).contains("names no pod"));
    assert!(error(br#"{"namespace":"ns","name":"p","uid":""}"#).contains("uid"));
    let request = |uid: &str| PodFactsRequest {
        namespace: "ns".into(),
        name: "p".into(),
        uid: uid.into(),
        namespace_labels: false,
    };
    match answer_line(&request("u1").encode(), &store, None) {
        PodFactsAnswer::Pod { pod, .. } => {
            let stored = store.get("ns/p").unwrap();
            assert_eq!(*pod, trim_for_plugin(&stored));
        }
        other => panic!("{other:?}"),
    }
    match answer_line(&request("u2").encode(), &store, None) {
        PodFactsAnswer::NotYet { reason } => assert!(reason.contains("uid"), "{reason}"),
        other => panic!("{other:?}"),
    }
}
