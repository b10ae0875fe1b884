//! How a watch stream gets its objects' initial state: streamed over the watch itself, or listed
//! first and then watched.
//!
//! Streamed (`sendInitialEvents`) is one request instead of two, and the API server gzips the
//! whole stream, so the initial state and every later event arrive compressed (see `gzip`).
//! Listing is what every server supports: a server that cannot stream refuses the request (the
//! WatchList feature off: `sendInitialEvents` is refused; an older server refuses
//! `resourceVersionMatch` on a watch), and one that ignored the parameters would never end its
//! initial events. Either way the stream lists, then watches, from then on.

use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use kube::runtime::watcher;
use tokio::time::Instant;

type Events<K> = BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>;

/// How long a started streaming watch may take to end its initial events before the stream
/// lists instead (a node's pods and the cluster's namespaces stream in well under this).
pub const STREAMING_DEADLINE: Duration = Duration::from_secs(60);

/// Whether `err` is the server refusing the streaming request itself (400 or 422), as opposed
/// to a failure worth retrying the same way (transport, 5xx, 403, 429, 410).
pub fn refuses_streaming(err: &watcher::Error) -> bool {
    let status = match err {
        watcher::Error::WatchStartFailed(kube::Error::Api(status)) => status.code,
        watcher::Error::WatchError(status) => status.code,
        _ => return false,
    };
    matches!(status, 400 | 422)
}

enum Phase<K> {
    /// Streaming; switches to `listed()` on a refusal or when `deadline` passes unsynced.
    Streaming {
        events: Events<K>,
        listed: Box<dyn FnOnce() -> Events<K> + Send>,
        deadline: Instant,
    },
    /// Synced once by streaming, or listing: events pass through.
    Settled(Events<K>),
}

/// `streaming` until its first initial sync; `listed()` instead if the server refuses the
/// streaming request, or a started one has not ended its initial events within `patience`.
pub fn streaming_or_listed<K: Send + 'static>(
    streaming: Events<K>,
    listed: impl FnOnce() -> Events<K> + Send + 'static,
    patience: Duration,
) -> Events<K> {
    let start = Phase::Streaming {
        events: streaming,
        listed: Box::new(listed),
        deadline: Instant::now() + patience,
    };
    futures::stream::unfold(start, move |phase| async move {
        let (mut events, listed, mut deadline) = match phase {
            Phase::Settled(mut events) => {
                let item = events.next().await?;
                return Some((item, Phase::Settled(events)));
            }
            Phase::Streaming {
                events,
                listed,
                deadline,
            } => (events, listed, deadline),
        };
        let next = tokio::time::timeout_at(deadline, events.next()).await;
        let item = match next {
            Ok(item) => item?,
            Err(_) => return fall_back(listed, "its initial events did not end in time").await,
        };
        match &item {
            Ok(watcher::Event::InitDone) => return Some((item, Phase::Settled(events))),
            Err(err) if refuses_streaming(err) => {
                let cause = err.to_string();
                return fall_back(listed, &cause).await;
            }
            // Each attempt (and each failed one) gets the whole deadline.
            Ok(watcher::Event::Init) | Err(_) => deadline = Instant::now() + patience,
            Ok(_) => {}
        }
        Some((
            item,
            Phase::Streaming {
                events,
                listed,
                deadline,
            },
        ))
    })
    .boxed()
}

async fn fall_back<K: Send + 'static>(
    listed: Box<dyn FnOnce() -> Events<K> + Send>,
    cause: &str,
) -> Option<(Result<watcher::Event<K>, watcher::Error>, Phase<K>)> {
    tracing::info!(
        cause,
        "the API server does not stream a watch's initial state; listing, then watching"
    );
    let mut events = listed();
    let item = events.next().await?;
    Some((item, Phase::Settled(events)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use watcher::Event;

    fn names(events: Vec<Result<Event<String>, watcher::Error>>) -> Vec<String> {
        events
            .into_iter()
            .map(|e| match e {
                Ok(Event::Init) => "init".to_string(),
                Ok(Event::InitApply(s)) => format!("init:{s}"),
                Ok(Event::InitDone) => "done".to_string(),
                Ok(Event::Apply(s)) => s,
                Ok(Event::Delete(s)) => format!("-{s}"),
                Err(_) => "error".to_string(),
            })
            .collect()
    }

    fn listed() -> Events<String> {
        futures::stream::iter([
            Ok(Event::Init),
            Ok(Event::InitApply("a".to_string())),
            Ok(Event::InitDone),
            Ok(Event::Apply("b".to_string())),
        ])
        .boxed()
    }

    fn refused(code: u16) -> watcher::Error {
        let status = kube::core::Status::failure("refused", "Invalid").with_code(code);
        watcher::Error::WatchStartFailed(kube::Error::Api(Box::new(status)))
    }

    #[tokio::test]
    async fn a_streamed_sync_is_kept() {
        let streaming = futures::stream::iter([
            Ok(Event::Init),
            Ok(Event::InitApply("s".to_string())),
            Ok(Event::InitDone),
            Err(refused(422)),
            Ok(Event::Apply("t".to_string())),
        ])
        .boxed();
        let events = streaming_or_listed(streaming, listed, Duration::from_secs(5));
        // A refusal after the first sync is an error like any other, not a reason to list.
        assert_eq!(
            names(events.collect().await),
            ["init", "init:s", "done", "error", "t"]
        );
    }

    #[tokio::test]
    async fn a_refused_stream_lists_instead() {
        for code in [400, 422] {
            let streaming = futures::stream::iter([Err(refused(code))]).boxed();
            let events = streaming_or_listed(streaming, listed, Duration::from_secs(5));
            assert_eq!(
                names(events.collect().await),
                ["init", "init:a", "done", "b"]
            );
        }
    }

    #[tokio::test]
    async fn other_failures_keep_streaming() {
        let streaming =
            futures::stream::iter([Err(refused(503)), Ok(Event::Init), Ok(Event::InitDone)])
                .boxed();
        let events = streaming_or_listed(streaming, listed, Duration::from_secs(5));
        assert_eq!(names(events.collect().await).len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn initial_events_that_never_end_are_listed_instead() {
        // A server that ignored the streaming parameters: objects, then nothing.
        let streaming =
            futures::stream::iter([Ok(Event::Init), Ok(Event::InitApply("s".to_string()))])
                .chain(futures::stream::pending())
                .boxed();
        let events = streaming_or_listed(streaming, listed, STREAMING_DEADLINE);
        assert_eq!(
            names(events.take(6).collect().await),
            ["init", "init:s", "init", "init:a", "done", "b"]
        );
    }
}
