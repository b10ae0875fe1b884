//! Gzip on every response the client receives, watch streams included.
//!
//! The API server compresses a watch stream as one gzip member per event. kube's own
//! decompression stops after the first member, so kube asks for watches uncompressed; a node's
//! pod events then cost several times their gzipped size. This layer asks for gzip on every
//! request (replacing kube's `identity` on watches) and decodes every member of a response, so
//! lists and watches both arrive compressed and leave this layer as plain bytes.

use std::task::{Context, Poll};

use async_compression::tokio::bufread::GzipDecoder;
use bytes::Bytes;
use futures::TryStreamExt;
use http::header::{ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_LENGTH};
use http::{HeaderValue, Request, Response};
use http_body_util::{BodyExt, BodyStream, StreamBody, combinators::UnsyncBoxBody};
use tokio_util::io::{ReaderStream, StreamReader};

/// The body every response leaves this layer with: decoded, whatever the server sent.
pub type DecodedBody = UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Marks a response whose body came gzipped (its encoding header is gone with the encoding), for
/// the test hook that counts pod watch encodings; the shipped build does not mark responses.
#[cfg(feature = "test-hooks")]
#[derive(Clone, Copy, Debug)]
pub struct Gunzipped;

/// Wraps the client's HTTP stack (see [`Gzip`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct GzipLayer;

impl<S> tower_layer::Layer<S> for GzipLayer {
    type Service = Gzip<S>;

    fn layer(&self, inner: S) -> Gzip<S> {
        Gzip { inner }
    }
}

/// Asks for gzip on every request and decodes every gzip member of every response.
#[derive(Clone, Debug)]
pub struct Gzip<S> {
    inner: S,
}

impl<S, ReqBody, ResBody> tower_service::Service<Request<ReqBody>> for Gzip<S>
where
    S: tower_service::Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<DecodedBody>;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        request
            .headers_mut()
            .insert(ACCEPT_ENCODING, HeaderValue::from_static("gzip"));
        let response = self.inner.call(request);
        Box::pin(async move { Ok(decode(response.await?)) })
    }
}

/// The response with its body decoded when the server gzipped it (every member), as it is
/// otherwise. The encoding and length headers go with the encoding.
pub fn decode<B>(response: Response<B>) -> Response<DecodedBody>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let gzipped = response
        .headers()
        .get(CONTENT_ENCODING)
        .is_some_and(|e| e.as_bytes().eq_ignore_ascii_case(b"gzip"));
    let (mut parts, body) = response.into_parts();
    if !gzipped {
        return Response::from_parts(parts, body.map_err(Into::into).boxed_unsync());
    }
    parts.headers.remove(CONTENT_ENCODING);
    parts.headers.remove(CONTENT_LENGTH);
    #[cfg(feature = "test-hooks")]
    parts.extensions.insert(Gunzipped);
    let compressed = BodyStream::new(body.map_err(|e| std::io::Error::other(e.into())))
        .try_filter_map(|frame| futures::future::ready(Ok(frame.into_data().ok())));
    let mut decoder = GzipDecoder::new(StreamReader::new(compressed));
    decoder.multiple_members(true);
    let plain = ReaderStream::new(decoder)
        .map_ok(http_body::Frame::data)
        .map_err(BoxError::from);
    Response::from_parts(parts, StreamBody::new(plain).boxed_unsync())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    async fn member(text: &str) -> Vec<u8> {
        let mut encoder = async_compression::tokio::bufread::GzipEncoder::new(text.as_bytes());
        let mut out = Vec::new();
        encoder.read_to_end(&mut out).await.unwrap();
        out
    }

    fn chunked(
        chunks: Vec<Vec<u8>>,
    ) -> StreamBody<impl futures::Stream<Item = Result<http_body::Frame<Bytes>, std::io::Error>>>
    {
        StreamBody::new(futures::stream::iter(
            chunks
                .into_iter()
                .map(|c| Ok(http_body::Frame::data(Bytes::from(c)))),
        ))
    }

    async fn text(response: Response<DecodedBody>) -> String {
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn every_member_of_a_watch_stream_is_decoded() {
        // One member per event, as the API server writes a watch; a chunk may split a member.
        let first = member("{\"type\":\"ADDED\"}\n").await;
        let second = member("{\"type\":\"DELETED\"}\n").await;
        let mut split = first.clone();
        split.extend_from_slice(&second[..5]);
        let response = Response::builder()
            .header(CONTENT_ENCODING, "gzip")
            .body(chunked(vec![split, second[5..].to_vec()]))
            .unwrap();
        let decoded = decode(response);
        assert!(decoded.headers().get(CONTENT_ENCODING).is_none());
        assert_eq!(
            text(decoded).await,
            "{\"type\":\"ADDED\"}\n{\"type\":\"DELETED\"}\n"
        );
    }

    #[tokio::test]
    async fn a_plain_response_passes_unchanged() {
        let response = Response::builder()
            .header(CONTENT_LENGTH, "2")
            .body(chunked(vec![b"{}".to_vec()]))
            .unwrap();
        let decoded = decode(response);
        assert_eq!(decoded.headers()[CONTENT_LENGTH], "2");
        assert_eq!(text(decoded).await, "{}");
    }

    #[tokio::test]
    async fn a_corrupt_member_is_an_error_not_a_short_body() {
        let mut bad = member("{\"type\":\"ADDED\"}\n").await;
        let last = bad.len() - 1;
        bad[last] ^= 0xff;
        let response = Response::builder()
            .header(CONTENT_ENCODING, "gzip")
            .body(chunked(vec![bad]))
            .unwrap();
        assert!(decode(response).into_body().collect().await.is_err());
    }
}
