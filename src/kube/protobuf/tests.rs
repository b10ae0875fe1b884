use super::messages::{self as pb, RawExtension, TypeMeta, Unknown};
use super::*;
use k8s_openapi::api::core::v1::Pod;
use kube::core::WatchEvent as KubeEvent;
use serde_json::json;
use std::time::Duration;

const WATCH_TYPE: &str = "application/vnd.kubernetes.protobuf;stream=watch";

/// `k8s\0` + Unknown{kind, raw}.
fn envelope(kind: &str, raw: Vec<u8>) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    Unknown {
        type_meta: Some(TypeMeta {
            api_version: "v1".into(),
            kind: kind.into(),
        }),
        raw: raw.into(),
        ..Default::default()
    }
    .encode(&mut out)
    .unwrap();
    out
}

/// One length-delimited frame of a WatchEvent whose object is `object`.
fn frame_of(event_type: &str, object: Vec<u8>) -> Vec<u8> {
    let event = pb::WatchEvent {
        r#type: event_type.into(),
        object: Some(RawExtension { raw: object.into() }),
    }
    .encode_to_vec();
    let mut out = (event.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&event);
    out
}

fn pod_frame(event_type: &str, name: &str, rv: &str) -> Vec<u8> {
    let pod = pb::Pod {
        metadata: Some(pb::ObjectMeta {
            name: name.into(),
            namespace: "ns".into(),
            resource_version: rv.into(),
            ..Default::default()
        }),
        spec: Some(pb::PodSpec::default()),
        status: Some(pb::PodStatus::default()),
    };
    frame_of(event_type, envelope("Pod", pod.encode_to_vec()))
}

fn response(content_type: &str, chunks: Vec<Vec<u8>>) -> Response<DecodedBody> {
    let frames = chunks
        .into_iter()
        .map(|c| Ok::<_, BoxError>(http_body::Frame::data(Bytes::from(c))));
    Response::builder()
        .header(CONTENT_TYPE, content_type)
        .body(StreamBody::new(futures::stream::iter(frames)).boxed_unsync())
        .unwrap()
}

/// The transcoded body's lines, or the error it ended with (after the lines before it).
async fn lines(response: Response<DecodedBody>) -> (Vec<String>, Option<String>) {
    let mut stream = BodyStream::new(transcode(response).into_body());
    let mut text = Vec::new();
    while let Some(frame) = stream.next().await {
        match frame {
            Ok(frame) => text.extend_from_slice(&frame.into_data().unwrap()),
            Err(e) => return (split(&text), Some(e.to_string())),
        }
    }
    (split(&text), None)
}

fn split(text: &[u8]) -> Vec<String> {
    String::from_utf8(text.to_vec())
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

fn parse(line: &str) -> KubeEvent<Pod> {
    serde_json::from_str(line).unwrap()
}

#[tokio::test]
async fn frames_split_across_chunks_and_several_in_one_chunk_each_become_a_line() {
    let mut all = pod_frame("ADDED", "a", "1");
    all.extend(pod_frame("MODIFIED", "a", "2"));
    all.extend(pod_frame("DELETED", "b", "3"));
    // A chunk ends inside the length of the second frame, another inside the third's body.
    let cut1 = pod_frame("ADDED", "a", "1").len() + 2;
    let cut2 = all.len() - 5;
    let chunks = vec![
        all[..cut1].to_vec(),
        all[cut1..cut2].to_vec(),
        all[cut2..].to_vec(),
    ];
    let (lines, error) = lines(response(WATCH_TYPE, chunks)).await;
    assert_eq!(error, None);
    assert_eq!(lines.len(), 3, "{lines:?}");
    let names: Vec<_> = lines
        .iter()
        .map(|l| match parse(l) {
            KubeEvent::Added(p) | KubeEvent::Modified(p) | KubeEvent::Deleted(p) => (
                p.metadata.name.unwrap(),
                p.metadata.resource_version.unwrap(),
            ),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        names,
        [
            ("a".into(), "1".into()),
            ("a".into(), "2".into()),
            ("b".into(), "3".into())
        ]
    );
    assert!(matches!(parse(&lines[2]), KubeEvent::Deleted(_)));
}

#[tokio::test]
async fn an_error_event_carries_its_status() {
    let status = pb::Status {
        status: "Failure".into(),
        message: "too old resource version: 1 (5)".into(),
        reason: "Expired".into(),
        code: 410,
    };
    let frame = frame_of("ERROR", envelope("Status", status.encode_to_vec()));
    let (lines, error) = lines(response(WATCH_TYPE, vec![frame])).await;
    assert_eq!(error, None);
    let KubeEvent::Error(status) = parse(&lines[0]) else {
        panic!("{lines:?}")
    };
    assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
    assert!(status.is_failure());
}

#[tokio::test]
async fn a_bookmark_keeps_its_resource_version_and_annotations() {
    let pod = pb::Pod {
        metadata: Some(pb::ObjectMeta {
            resource_version: "42".into(),
            annotations: [("k8s.io/initial-events-end".into(), "true".into())].into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let frame = frame_of("BOOKMARK", envelope("Pod", pod.encode_to_vec()));
    let (lines, error) = lines(response(WATCH_TYPE, vec![frame])).await;
    assert_eq!(error, None);
    let KubeEvent::Bookmark(bookmark) = parse(&lines[0]) else {
        panic!("{lines:?}")
    };
    assert_eq!(bookmark.metadata.resource_version, "42");
    assert_eq!(
        bookmark.metadata.annotations["k8s.io/initial-events-end"],
        "true"
    );
    assert_eq!(bookmark.types.kind, "Pod");
}

#[tokio::test]
async fn an_oversize_length_is_refused_before_its_bytes_are_waited_for() {
    let header = ((MAX_FRAME + 1) as u32).to_be_bytes().to_vec();
    let body = futures::stream::iter([Ok::<_, BoxError>(http_body::Frame::data(Bytes::from(
        header,
    )))])
    .chain(futures::stream::pending());
    let response = Response::builder()
        .header(CONTENT_TYPE, WATCH_TYPE)
        .body(StreamBody::new(body).boxed_unsync())
        .unwrap();
    let mut stream = BodyStream::new(transcode(response).into_body());
    let first = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("refused at once, not waited for");
    let err = first.unwrap().unwrap_err().to_string();
    assert!(err.contains("over the"), "{err}");
    assert!(
        stream.next().await.is_none(),
        "the body ends with the error"
    );
}

#[tokio::test]
async fn a_body_ending_inside_a_frame_is_an_error_after_the_whole_frames() {
    let mut all = pod_frame("ADDED", "a", "1");
    let second = pod_frame("ADDED", "b", "2");
    all.extend_from_slice(&second[..second.len() - 3]);
    let (lines, error) = lines(response(WATCH_TYPE, vec![all])).await;
    assert_eq!(lines.len(), 1);
    assert!(error.unwrap().contains("ended inside a frame"));
}

#[tokio::test]
async fn bad_magic_unknown_kinds_and_invalid_protobuf_are_errors() {
    let pod = pb::Pod::default().encode_to_vec();
    let mut no_magic = envelope("Pod", pod.clone());
    no_magic[3] = b'!';
    let cases = [
        (frame_of("ADDED", no_magic), "k8s magic"),
        (
            frame_of("ADDED", envelope("Secret", pod.clone())),
            "\"Secret\"",
        ),
        (
            frame_of("ERROR", envelope("Pod", pod.clone())),
            "not a Status",
        ),
        (
            frame_of("SOMETHING", envelope("Pod", pod)),
            "unknown event type",
        ),
        (
            frame_of("ADDED", envelope("Pod", vec![0x0a, 0xff, 0x01])),
            "a pod is not protobuf",
        ),
        (
            vec![0, 0, 0, 2, 0xff, 0xff],
            "a watch event is not protobuf",
        ),
    ];
    for (frame, want) in cases {
        let (lines, error) = lines(response(WATCH_TYPE, vec![frame])).await;
        assert!(lines.is_empty());
        let error = error.unwrap_or_default();
        assert!(error.contains(want), "{want}: {error}");
    }
}

#[tokio::test]
async fn a_json_response_passes_unchanged() {
    let text = b"{\"type\":\"ADDED\",\"object\":{}}\n".to_vec();
    let (lines, error) = lines(response("application/json", vec![text])).await;
    assert_eq!(
        (lines, error),
        (vec![r#"{"type":"ADDED","object":{}}"#.to_string()], None)
    );
}

#[tokio::test]
async fn a_protobuf_error_response_becomes_its_status_json() {
    let status = pb::Status {
        status: "Failure".into(),
        message: "pods is forbidden".into(),
        reason: "Forbidden".into(),
        code: 403,
    };
    let mut refused = response(
        "application/vnd.kubernetes.protobuf",
        vec![envelope("Status", status.encode_to_vec())],
    );
    *refused.status_mut() = http::StatusCode::FORBIDDEN;
    let body = transcode(refused).into_body().collect().await.unwrap();
    let status: kube::core::Status = serde_json::from_slice(&body.to_bytes()).unwrap();
    assert_eq!((status.code, status.reason.as_str()), (403, "Forbidden"));
    // An unreadable one still names the code.
    let mut junk = response(
        "application/vnd.kubernetes.protobuf",
        vec![b"junk".to_vec()],
    );
    *junk.status_mut() = http::StatusCode::FORBIDDEN;
    let body = transcode(junk).into_body().collect().await.unwrap();
    let status: kube::core::Status = serde_json::from_slice(&body.to_bytes()).unwrap();
    assert_eq!(status.code, 403);
}

#[test]
fn only_pod_watches_ask_for_protobuf() {
    let get = Method::GET;
    let watch = |uri: &str| is_pod_watch(&get, &uri.parse().unwrap());
    assert!(watch(
        "/api/v1/pods?fieldSelector=spec.nodeName%3Dn&watch=true"
    ));
    assert!(watch(
        "/api/v1/namespaces/ns/pods?watch=1&resourceVersion=5"
    ));
    assert!(!watch("/api/v1/pods?fieldSelector=x"), "a list");
    assert!(!watch("/api/v1/namespaces?watch=true"));
    assert!(!watch("/api/v1/namespaces/ns/pods/p?watch=true"));
    assert!(!watch("/api/v1/namespaces/a/b/pods?watch=true"));
    assert!(!watch("/api/v1/pods?watch=false"));
    assert!(!is_pod_watch(
        &Method::POST,
        &"/api/v1/pods?watch=true".parse().unwrap()
    ));
}

/// A pod with every kept field and others beside: what the protobuf path decodes is what the
/// store keeps of the same pod read as JSON.
#[test]
fn a_decoded_pod_is_the_stored_subset_of_its_json() {
    let json_pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "9",
            "generation": 3, "labels": {"app": "a"}, "annotations": {"x": "y"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                                  "uid": "o", "controller": true}]},
        "spec": {"nodeName": "n1", "restartPolicy": "Never", "schedulerName": "default-scheduler",
            "serviceAccountName": "sa", "hostNetwork": true,
            "initContainers": [{"name": "istio-validation", "image": "i"}],
            "containers": [{"name": "istio-proxy", "image": "i", "args": ["proxy", "sidecar"],
                "env": [{"name": "A", "value": "1"}, {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}],
                "securityContext": {"runAsUser": 1337, "runAsGroup": 1337, "privileged": true}}]},
        "status": {"phase": "Running", "podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}],
            "nominatedNodeName": "n2", "hostIP": "1.1.1.1",
            "initContainerStatuses": [{"name": "istio-validation", "ready": false, "restartCount": 1,
                "image": "i", "imageID": "d",
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 126, "reason": "Error", "message": "m"}}}]}
    }))
    .unwrap();
    let container = |name: &str, args: Vec<String>, env, sc| pb::Container {
        name: name.into(),
        args,
        env,
        security_context: sc,
    };
    let state = |terminated| Some(pb::ContainerState { terminated });
    let proto = pb::Pod {
        metadata: Some(pb::ObjectMeta {
            name: "p".into(),
            namespace: "ns".into(),
            uid: "u".into(),
            resource_version: "9".into(),
            labels: [("app".into(), "a".into())].into(),
            annotations: [("x".into(), "y".into())].into(),
            owner_references: vec![pb::OwnerReference {
                kind: "ReplicaSet".into(),
                name: "rs".into(),
                controller: Some(true),
            }],
        }),
        spec: Some(pb::PodSpec {
            containers: vec![container(
                "istio-proxy",
                vec!["proxy".into(), "sidecar".into()],
                vec![
                    pb::EnvVar {
                        name: "A".into(),
                        value: "1".into(),
                    },
                    pb::EnvVar {
                        name: "B".into(),
                        value: String::new(),
                    },
                ],
                Some(pb::SecurityContext {
                    run_as_user: Some(1337),
                    run_as_group: Some(1337),
                }),
            )],
            init_containers: vec![container("istio-validation", vec![], vec![], None)],
            restart_policy: "Never".into(),
            service_account_name: "sa".into(),
            node_name: "n1".into(),
            host_network: true,
            scheduler_name: "default-scheduler".into(),
        }),
        status: Some(pb::PodStatus {
            phase: "Running".into(),
            pod_ip: "10.0.0.1".into(),
            pod_ips: vec![pb::PodIp {
                ip: "10.0.0.1".into(),
            }],
            nominated_node_name: "n2".into(),
            init_container_statuses: vec![pb::ContainerStatus {
                name: "istio-validation".into(),
                state: state(None),
                last_state: state(Some(pb::ContainerStateTerminated {
                    exit_code: 126,
                    reason: "Error".into(),
                    message: "m".into(),
                })),
            }],
        }),
    };
    // Fields this does not keep, as a newer server might send: skipped unread.
    let mut bytes = proto.encode_to_vec();
    bytes.extend([0x98, 0x06, 0x01, 0x92, 0x06, 0x02, b'z', b'z']);
    let decoded = Pod::from(pb::Pod::decode(bytes.as_slice()).unwrap());
    let stored = crate::kube::stores::kept::pod(json_pod);
    assert_eq!(decoded, stored);
    // The subset is all the decoded pod holds: keeping it again changes nothing.
    assert_eq!(crate::kube::stores::kept::pod(decoded.clone()), decoded);
}
