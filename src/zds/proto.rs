//! The ZDS messages: the prost types generated from `zds.proto` (committed; regenerate with
//! tools/protogen) and the few typed helpers the server needs on top of them. Every request the
//! agent can send has a payload, so none encodes to zero bytes (ztunnel reads an empty datagram
//! as EOF).

use prost::Message;

/// The generated messages of package `istio.workload.zds`.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    include!("istio.workload.zds.rs");
}

pub use pb::{
    Ack, AddWorkload, DelWorkload, KeepWorkload, SnapshotSent, Version, WorkloadRequest,
    WorkloadResponse, ZdsHello,
};

use super::PodWorkload;

/// The one request kind per variant the agent sends; `encode` always yields a payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    Add { uid: &'a str, info: &'a PodWorkload },
    Keep { uid: &'a str },
    Del { uid: &'a str },
    SnapshotSent,
}

impl Request<'_> {
    /// Protobuf bytes of the `WorkloadRequest`.
    pub fn encode(&self) -> Vec<u8> {
        use pb::workload_request::Payload;
        let payload = match self {
            Request::Add { uid, info } => Payload::Add(AddWorkload {
                uid: uid.to_string(),
                // Mandatory: ztunnel (1.24+) exits when it is missing.
                workload_info: Some(pb::WorkloadInfo {
                    name: info.name.clone(),
                    namespace: info.namespace.clone(),
                    service_account: info.service_account.clone(),
                }),
            }),
            Request::Keep { uid } => Payload::Keep(KeepWorkload {
                uid: uid.to_string(),
            }),
            Request::Del { uid } => Payload::Del(DelWorkload {
                uid: uid.to_string(),
            }),
            Request::SnapshotSent => Payload::SnapshotSent(SnapshotSent {}),
        };
        WorkloadRequest {
            payload: Some(payload),
        }
        .encode_to_vec()
    }

    /// A short name for logs and errors.
    pub fn kind(&self) -> &'static str {
        match self {
            Request::Add { .. } => "add",
            Request::Keep { .. } => "keep",
            Request::Del { .. } => "del",
            Request::SnapshotSent => "snapshot_sent",
        }
    }

    pub fn uid(&self) -> Option<&str> {
        match self {
            Request::Add { uid, .. } | Request::Keep { uid } | Request::Del { uid } => Some(uid),
            Request::SnapshotSent => None,
        }
    }
}

/// What ztunnel answered to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Ack,
    /// A non-empty `Ack.error`; `truncated` when the datagram was longer than the receive buffer
    /// and the text is only its beginning.
    Nack {
        message: String,
        truncated: bool,
    },
}

/// Why a datagram from ztunnel was not a valid message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("undecodable {what}: {reason} (first bytes {head})")]
    Malformed {
        what: &'static str,
        reason: String,
        head: String,
    },
    #[error("a WorkloadResponse without an ack")]
    NoAck,
}

fn hex_head(bytes: &[u8]) -> String {
    let mut s: String = bytes.iter().take(16).map(|b| format!("{b:02x}")).collect();
    if bytes.len() > 16 {
        s.push('…');
    }
    s
}

/// Decodes the hello: the version number ztunnel announced (only `V1` exists).
pub fn decode_hello(bytes: &[u8]) -> Result<i32, DecodeError> {
    ZdsHello::decode(bytes)
        .map(|h| h.version)
        .map_err(|e| DecodeError::Malformed {
            what: "hello",
            reason: e.to_string(),
            head: hex_head(bytes),
        })
}

/// Decodes an ack. `truncated` says the datagram did not fit: its beginning is then read leniently
/// as the start of an error ack, so ztunnel's long (backtrace-laden) NACKs still count as NACKs
/// with their text, rather than as a broken connection.
pub fn decode_reply(bytes: &[u8], truncated: bool) -> Result<Reply, DecodeError> {
    if truncated {
        return partial_error_text(bytes)
            .map(|message| Reply::Nack {
                message,
                truncated: true,
            })
            .ok_or_else(|| DecodeError::Malformed {
                what: "truncated ack",
                reason: "not the start of an Ack with an error".into(),
                head: hex_head(bytes),
            });
    }
    let response = WorkloadResponse::decode(bytes).map_err(|e| DecodeError::Malformed {
        what: "ack",
        reason: e.to_string(),
        head: hex_head(bytes),
    })?;
    match response.payload {
        Some(pb::workload_response::Payload::Ack(Ack { error })) if error.is_empty() => {
            Ok(Reply::Ack)
        }
        Some(pb::workload_response::Payload::Ack(Ack { error })) => Ok(Reply::Nack {
            message: error,
            truncated: false,
        }),
        None => Err(DecodeError::NoAck),
    }
}

/// Reads a protobuf varint; returns it and the bytes after it.
fn varint(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let mut value = 0u64;
    for (i, b) in bytes.iter().enumerate().take(10) {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((value, &bytes[i + 1..]));
        }
    }
    None
}

/// The text of `WorkloadResponse{ack: Ack{error}}` whose tail is cut off: tag 1 (length-delimited)
/// of the response, then tag 1 of the ack, then as much of the string as arrived.
fn partial_error_text(bytes: &[u8]) -> Option<String> {
    let rest = bytes.strip_prefix(&[0x0a])?;
    let (_, rest) = varint(rest)?;
    let rest = rest.strip_prefix(&[0x0a])?;
    let (_, text) = varint(rest)?;
    Some(String::from_utf8_lossy(text).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> PodWorkload {
        PodWorkload {
            name: "n".into(),
            namespace: "ns".into(),
            service_account: "sa".into(),
        }
    }

    fn unhex(s: &str) -> Vec<u8> {
        s.split_whitespace()
            .map(|b| u8::from_str_radix(b, 16).unwrap())
            .collect()
    }

    // The byte strings of docs/zds.md (checked there against protoc and a live ztunnel).
    #[test]
    fn requests_encode_to_the_documented_bytes() {
        let info = info();
        let cases = [
            (
                Request::Add {
                    uid: "u1",
                    info: &info,
                },
                "0a 11 0a 02 75 31 12 0b 0a 01 6e 12 02 6e 73 1a 02 73 61",
            ),
            (Request::Keep { uid: "u1" }, "2a 04 0a 02 75 31"),
            (Request::Del { uid: "u1" }, "12 04 12 02 75 31"),
            (Request::SnapshotSent, "1a 00"),
        ];
        for (request, bytes) in cases {
            assert_eq!(request.encode(), unhex(bytes), "{request:?}");
        }
    }

    #[test]
    fn requests_decode_back_from_the_documented_bytes() {
        use pb::workload_request::Payload;
        let add = WorkloadRequest::decode(
            &unhex("0a 11 0a 02 75 31 12 0b 0a 01 6e 12 02 6e 73 1a 02 73 61")[..],
        )
        .unwrap();
        let Some(Payload::Add(add)) = add.payload else {
            panic!("{add:?}")
        };
        assert_eq!(add.uid, "u1");
        let wi = add.workload_info.unwrap();
        assert_eq!(
            (&*wi.name, &*wi.namespace, &*wi.service_account),
            ("n", "ns", "sa")
        );
        let del = WorkloadRequest::decode(&unhex("12 04 12 02 75 31")[..]).unwrap();
        assert_eq!(
            del.payload,
            Some(Payload::Del(DelWorkload { uid: "u1".into() }))
        );
    }

    #[test]
    fn no_request_encodes_to_nothing() {
        let info = PodWorkload::default();
        for request in [
            Request::Add {
                uid: "",
                info: &info,
            },
            Request::Keep { uid: "" },
            Request::Del { uid: "" },
            Request::SnapshotSent,
        ] {
            assert!(!request.encode().is_empty(), "{request:?}");
        }
    }

    #[test]
    fn hello_and_acks_decode_from_the_documented_bytes() {
        assert_eq!(decode_hello(&unhex("08 01")), Ok(Version::V1 as i32));
        assert_eq!(ZdsHello { version: 1 }.encode_to_vec(), unhex("08 01"));
        assert_eq!(decode_reply(&unhex("0a 00"), false), Ok(Reply::Ack));
        assert_eq!(
            decode_reply(&unhex("0a 03 0a 01 78"), false),
            Ok(Reply::Nack {
                message: "x".into(),
                truncated: false
            })
        );
        let ack = WorkloadResponse {
            payload: Some(pb::workload_response::Payload::Ack(Ack {
                error: "x".into(),
            })),
        };
        assert_eq!(ack.encode_to_vec(), unhex("0a 03 0a 01 78"));
    }

    #[test]
    fn a_truncated_error_ack_is_a_nack_with_its_beginning() {
        let text = "failure to read message : ".to_string() + &"x".repeat(12_000);
        let full = WorkloadResponse {
            payload: Some(pb::workload_response::Payload::Ack(Ack {
                error: text.clone(),
            })),
        }
        .encode_to_vec();
        assert_eq!(
            decode_reply(&full[..1000], true),
            Ok(Reply::Nack {
                message: text[..1000 - 6].to_string(),
                truncated: true
            })
        );
        // Untruncated, the whole text comes back.
        assert_eq!(
            decode_reply(&full, false),
            Ok(Reply::Nack {
                message: text,
                truncated: false
            })
        );
    }

    #[test]
    fn garbage_is_an_error_naming_its_first_bytes() {
        let err = decode_reply(&[0xff, 0xff, 0xff], false).unwrap_err();
        assert!(err.to_string().contains("ffffff"), "{err}");
        assert!(decode_reply(&[0xff, 0x01], true).is_err());
        assert!(decode_hello(&[0x0a]).is_err());
        // A response with no payload (an empty datagram never gets here: it is EOF).
        assert_eq!(decode_reply(&[0x12, 0x00], false), Err(DecodeError::NoAck));
    }
}
