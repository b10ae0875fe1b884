//! Pod watches in Kubernetes' protobuf encoding, read as the JSON lines kube's watcher parses.
//!
//! A protobuf watch costs the API server less to encode than JSON and is smaller on the wire, and
//! decoding only the fields the pod store keeps (`messages`) skips the rest unread. kube speaks
//! JSON only, so this layer asks for protobuf on pod watch requests (and nothing else) and turns
//! a protobuf response back into one JSON line per event, `{"type":..,"object":{..}}`. The
//! watcher's list/watch/bookmark/410 handling is kube-runtime's, unchanged. A JSON response (a
//! server that ignores `Accept`) passes through untouched; so does every other request.
//!
//! The stream is frames of a 4-byte big-endian length and a meta/v1 WatchEvent whose object is
//! `k8s\0` + runtime Unknown (type, then the object's own protobuf). An error response to the
//! watch request is a protobuf Status, rewritten as its JSON so kube reads its code.
//!
//! Nothing read is trusted: a frame longer than [`MAX_FRAME`], a stream that ends inside a
//! frame, a missing `k8s\0`, a kind other than the event's, or invalid protobuf ends the body
//! with an error (the watcher re-watches with backoff); the buffer never holds more than one
//! frame and one chunk.

use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use futures::{Stream, StreamExt};
use http::header::{ACCEPT, CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderValue, Method, Request, Response};
use http_body_util::{BodyExt, BodyStream, StreamBody};
use prost::Message;

use super::gzip::DecodedBody;

mod messages;
#[cfg(feature = "test-hooks")]
pub mod observed;
#[cfg(test)]
mod tests;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a pod watch asks for, as client-go's protobuf clients do: protobuf, else JSON.
pub const ACCEPT_PROTOBUF: &str = "application/vnd.kubernetes.protobuf, application/json";

const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// The longest frame read: far above any pod, and a bound on what one frame may make us hold.
pub const MAX_FRAME: usize = 16 << 20;

/// The longest error body read.
const MAX_ERROR_BODY: usize = 1 << 20;

/// `k8s\0`: the start of every protobuf-encoded object.
const MAGIC: &[u8] = b"k8s\0";

/// A protobuf watch the transcoder refuses (the body ends with it).
#[derive(Debug, thiserror::Error)]
pub enum ProtobufError {
    #[error("pod watch (protobuf): a frame of {len} bytes is over the {MAX_FRAME}-byte bound")]
    Oversize { len: usize },
    #[error("pod watch (protobuf): the stream ended inside a frame ({held} bytes held)")]
    Truncated { held: usize },
    #[error("pod watch (protobuf): {what} is not protobuf: {source}")]
    Decode {
        what: &'static str,
        #[source]
        source: prost::DecodeError,
    },
    #[error("pod watch (protobuf): {what} does not start with the k8s magic")]
    Magic { what: &'static str },
    #[error(
        "pod watch (protobuf): a {event} event carries a {kind:?} ({encoding:?}), not a {want}"
    )]
    Kind {
        event: String,
        kind: String,
        encoding: String,
        want: &'static str,
    },
    #[error("pod watch (protobuf): unknown event type {0:?}")]
    EventType(String),
    #[error("pod watch (protobuf): the event cannot be written as JSON: {0}")]
    Json(#[source] serde_json::Error),
}

/// Wraps the client's HTTP stack (see [`Protobuf`]); installed outside [`super::gzip`], so it
/// reads decompressed bodies.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProtobufLayer;

impl<S> tower_layer::Layer<S> for ProtobufLayer {
    type Service = Protobuf<S>;

    fn layer(&self, inner: S) -> Protobuf<S> {
        Protobuf { inner }
    }
}

/// Asks for protobuf on pod watches and transcodes protobuf responses to JSON lines.
#[derive(Clone, Debug)]
pub struct Protobuf<S> {
    inner: S,
}

impl<S, ReqBody> tower_service::Service<Request<ReqBody>> for Protobuf<S>
where
    S: tower_service::Service<Request<ReqBody>, Response = Response<DecodedBody>>,
    S::Future: Send + 'static,
{
    type Response = Response<DecodedBody>;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        let pod_watch = is_pod_watch(request.method(), request.uri());
        if pod_watch {
            request
                .headers_mut()
                .insert(ACCEPT, HeaderValue::from_static(ACCEPT_PROTOBUF));
        }
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            #[cfg(feature = "test-hooks")]
            if pod_watch {
                observed::count(&response);
            }
            Ok(if pod_watch {
                transcode(response)
            } else {
                response
            })
        })
    }
}

/// A GET of `/api/v1/pods` or `/api/v1/namespaces/<ns>/pods` with `watch=true` (or `1`).
pub fn is_pod_watch(method: &Method, uri: &http::Uri) -> bool {
    let path = uri.path();
    let pods = path == "/api/v1/pods"
        || path
            .strip_prefix("/api/v1/namespaces/")
            .and_then(|rest| rest.strip_suffix("/pods"))
            .is_some_and(|ns| !ns.is_empty() && !ns.contains('/'));
    let watch = uri
        .query()
        .unwrap_or_default()
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    method == Method::GET && pods && watch
}

fn is_protobuf(response: &Response<DecodedBody>) -> bool {
    response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case(PROTOBUF))
}

/// The response as JSON: a protobuf watch stream as JSON lines, a protobuf error as its Status
/// JSON; anything else unchanged.
pub fn transcode(response: Response<DecodedBody>) -> Response<DecodedBody> {
    if !is_protobuf(&response) {
        return response;
    }
    let failed = !response.status().is_success();
    let (mut parts, body) = response.into_parts();
    parts.headers.remove(CONTENT_LENGTH);
    parts
        .headers
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let body = if failed {
        let code = parts.status.as_u16();
        futures::stream::once(error_body(body, code))
            .map(|json| Ok(http_body::Frame::data(json)))
            .boxed()
    } else {
        json_lines(body)
            .map(|line| line.map(http_body::Frame::data))
            .boxed()
    };
    Response::from_parts(parts, StreamBody::new(body).boxed_unsync())
}

/// A protobuf error body as Status JSON; one that cannot be read is a Status naming the HTTP
/// code, so kube still sees the code.
async fn error_body(body: DecodedBody, code: u16) -> Bytes {
    let status = read_bounded(body, MAX_ERROR_BODY)
        .await
        .and_then(|b| unknown(b, "the error body").ok())
        .filter(|u| kind_of(u) == "Status")
        .and_then(|u| messages::Status::decode(u.raw).ok())
        .map(|s| s.to_json())
        .unwrap_or_else(|| {
            serde_json::json!({
                "apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code,
                "message": format!("HTTP {code} with an unreadable protobuf error body"),
            })
        });
    Bytes::from(status.to_string())
}

/// The whole body, or `None` when it fails or is longer than `max`.
async fn read_bounded(mut body: DecodedBody, max: usize) -> Option<Bytes> {
    let mut held = BytesMut::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.ok()?.into_data() {
            if held.len() + data.len() > max {
                return None;
            }
            held.extend_from_slice(&data);
        }
    }
    Some(held.freeze())
}

/// The body's frames as JSON lines; the first error ends it.
fn json_lines(body: DecodedBody) -> impl Stream<Item = Result<Bytes, BoxError>> + Send {
    let chunks = BodyStream::new(body).filter_map(|frame| async move {
        match frame {
            Ok(frame) => frame.into_data().ok().map(Ok),
            Err(e) => Some(Err(e)),
        }
    });
    let state = (chunks.boxed(), Framer::default(), false);
    futures::stream::unfold(state, |(mut chunks, mut framer, mut done)| async move {
        loop {
            if done {
                return None;
            }
            match framer.next_frame() {
                Ok(Some(frame)) => {
                    let line = event_line(frame);
                    done = line.is_err();
                    return Some((line.map_err(BoxError::from), (chunks, framer, done)));
                }
                Ok(None) => {}
                Err(e) => return Some((Err(e.into()), (chunks, framer, true))),
            }
            match chunks.next().await {
                Some(Ok(chunk)) => framer.push(&chunk),
                Some(Err(e)) => return Some((Err(e), (chunks, framer, true))),
                None if framer.held() == 0 => return None,
                None => {
                    let e = ProtobufError::Truncated {
                        held: framer.held(),
                    };
                    return Some((Err(e.into()), (chunks, framer, true)));
                }
            }
        }
    })
}

/// Splits a byte stream into length-delimited frames, holding at most one frame and one chunk.
#[derive(Default)]
struct Framer {
    buf: BytesMut,
}

impl Framer {
    fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    fn held(&self) -> usize {
        self.buf.len()
    }

    /// The next whole frame, `None` until one is held; a length over [`MAX_FRAME`] is refused
    /// before its bytes are waited for.
    fn next_frame(&mut self) -> Result<Option<Bytes>, ProtobufError> {
        let Some(header) = self.buf.first_chunk::<4>() else {
            return Ok(None);
        };
        let len = u32::from_be_bytes(*header) as usize;
        if len > MAX_FRAME {
            return Err(ProtobufError::Oversize { len });
        }
        // No room reserved for the frame ahead of its bytes: a length alone never allocates.
        if self.buf.len() < 4 + len {
            return Ok(None);
        }
        self.buf.advance(4);
        Ok(Some(self.buf.split_to(len).freeze()))
    }
}

fn decode_error(what: &'static str) -> impl FnOnce(prost::DecodeError) -> ProtobufError {
    move |source| ProtobufError::Decode { what, source }
}

/// `k8s\0` + Unknown, the envelope of every protobuf object.
fn unknown(raw: Bytes, what: &'static str) -> Result<messages::Unknown, ProtobufError> {
    let Some(inner) = raw.strip_prefix(MAGIC) else {
        return Err(ProtobufError::Magic { what });
    };
    let inner = raw.slice_ref(inner);
    messages::Unknown::decode(inner).map_err(decode_error(what))
}

fn kind_of(u: &messages::Unknown) -> &str {
    // An object in another encoding than raw protobuf is no kind this reads.
    if !u.content_encoding.is_empty() || !u.content_type.is_empty() {
        return "";
    }
    u.type_meta.as_ref().map_or("", |t| t.kind.as_str())
}

/// One frame as its JSON line, `{"type":..,"object":{..}}\n`.
fn event_line(frame: Bytes) -> Result<Bytes, ProtobufError> {
    let event = messages::WatchEvent::decode(frame).map_err(decode_error("a watch event"))?;
    let raw = event.object.map(|o| o.raw).unwrap_or_default();
    let object = unknown(raw, "a watch event's object")?;
    let want = match event.r#type.as_str() {
        "ADDED" | "MODIFIED" | "DELETED" | "BOOKMARK" => "Pod",
        "ERROR" => "Status",
        _ => return Err(ProtobufError::EventType(event.r#type)),
    };
    if kind_of(&object) != want {
        return Err(ProtobufError::Kind {
            kind: object.type_meta.map(|t| t.kind).unwrap_or_default(),
            encoding: format!("{}{}", object.content_encoding, object.content_type),
            event: event.r#type,
            want,
        });
    }
    let mut line = if want == "Pod" {
        let pod = messages::Pod::decode(object.raw).map_err(decode_error("a pod"))?;
        let pod = k8s_openapi::api::core::v1::Pod::from(pod);
        serde_json::to_vec(&Line {
            r#type: &event.r#type,
            object: &pod,
        })
    } else {
        let status = messages::Status::decode(object.raw).map_err(decode_error("a status"))?;
        serde_json::to_vec(&Line {
            r#type: &event.r#type,
            object: &status.to_json(),
        })
    }
    .map_err(ProtobufError::Json)?;
    line.push(b'\n');
    Ok(Bytes::from(line))
}

/// A watch event as kube's watch reader parses it.
#[derive(serde::Serialize)]
struct Line<'a, T: serde::Serialize> {
    r#type: &'a str,
    object: &'a T,
}
