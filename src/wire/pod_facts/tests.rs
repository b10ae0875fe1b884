use super::*;

fn request(uid: &str) -> PodFactsRequest {
    PodFactsRequest {
        namespace: "ns".into(),
        name: "p".into(),
        uid: uid.into(),
        namespace_labels: true,
    }
}

#[test]
fn malformed_requests_are_named() {
    let error = |line: &[u8]| PodFactsRequest::decode(line).unwrap_err().to_string();
    assert!(error(b"not json\n").contains("not a pod-facts request"));
    assert!(
        error(br#"{"namespace":"ns","name":"p","uid":"u1","extra":1}"#).contains("unknown field")
    );
    assert!(error(br#"{"namespace":"ns","name":"p","uid":""}"#).contains("uid"));
    assert!(error(&vec![b' '; MAX_REQUEST_BYTES + 1]).contains("longer"));
}

/// The bytes both ends exchange: an older plugin or install-cni reads and writes exactly these.
#[test]
fn the_lines_on_the_wire_are_pinned() {
    let line = request("u1").encode();
    assert_eq!(
        String::from_utf8(line.clone()).unwrap(),
        "{\"namespace\":\"ns\",\"name\":\"p\",\"uid\":\"u1\",\"namespaceLabels\":true}\n"
    );
    assert_eq!(PodFactsRequest::decode(&line).unwrap(), request("u1"));
    // An older plugin leaves namespaceLabels out.
    let old = PodFactsRequest::decode(br#"{"namespace":"ns","name":"p","uid":"u1"}"#).unwrap();
    assert!(!old.namespace_labels);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1"}
    }))
    .unwrap();
    let answers = [
        (
            PodFactsAnswer::Pod {
                pod: Box::new(pod),
                namespace_labels: Some([("a".to_string(), "b".to_string())].into()),
            },
            r#"{"answer":"pod","pod":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"ns","uid":"u1"}},"namespaceLabels":{"a":"b"}}"#,
        ),
        (
            PodFactsAnswer::NotYet { reason: "r".into() },
            r#"{"answer":"notYet","reason":"r"}"#,
        ),
        (
            PodFactsAnswer::Error {
                message: "m".into(),
            },
            r#"{"answer":"error","message":"m"}"#,
        ),
    ];
    for (answer, json) in answers {
        assert_eq!(
            String::from_utf8(answer.encode()).unwrap(),
            format!("{json}\n")
        );
        assert_eq!(PodFactsAnswer::decode(json.as_bytes()).unwrap(), answer);
    }
}
