//! Test hook: the pod watch responses every client of this process received, by encoding, so a
//! test against a real API server can tell what came over the wire.

use std::sync::atomic::{AtomicU64, Ordering};

use http::Response;

use super::super::gzip::{DecodedBody, Gunzipped};

/// Successful pod watch responses so far, by how their body came.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodWatchEncodings {
    pub protobuf_gzipped: u64,
    pub protobuf_plain: u64,
    pub not_protobuf: u64,
}

static PROTOBUF_GZIPPED: AtomicU64 = AtomicU64::new(0);
static PROTOBUF_PLAIN: AtomicU64 = AtomicU64::new(0);
static NOT_PROTOBUF: AtomicU64 = AtomicU64::new(0);

pub(super) fn count(response: &Response<DecodedBody>) {
    if !response.status().is_success() {
        return;
    }
    let gzipped = response.extensions().get::<Gunzipped>().is_some();
    let counter = match (super::is_protobuf(response), gzipped) {
        (true, true) => &PROTOBUF_GZIPPED,
        (true, false) => &PROTOBUF_PLAIN,
        (false, _) => &NOT_PROTOBUF,
    };
    counter.fetch_add(1, Ordering::Relaxed);
}

/// The counts so far.
pub fn pod_watch_encodings() -> PodWatchEncodings {
    PodWatchEncodings {
        protobuf_gzipped: PROTOBUF_GZIPPED.load(Ordering::Relaxed),
        protobuf_plain: PROTOBUF_PLAIN.load(Ordering::Relaxed),
        not_protobuf: NOT_PROTOBUF.load(Ordering::Relaxed),
    }
}
