//! One subscriber's feed of store changes, merged per key so that a subscriber that reads slower
//! than the watch delivers never holds more than three pending changes per object: what it holds
//! is bounded by the objects, not by the events.
//!
//! Pending changes of one key merge as the subscriber would have read them: updates in a row are
//! one update from the first old to the last new object; an add stays an add (subscribers that
//! leave adds to others still see the updates after it); a delete replaces what was pending (its
//! object is the last known state), and deletes in a row keep the newest, as the reconcile engine
//! keeps the newest deleted object of a key. A delete followed by a new add under the same key
//! stays two changes: the subscriber must see the old object go. Keys come out in the order they
//! first had a change pending.

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::StoreEvent;

struct Queue<K> {
    /// Keys with changes pending, each once, oldest first.
    order: VecDeque<String>,
    /// A key's pending changes: one, or a delete and the add after it.
    pending: HashMap<String, Vec<StoreEvent<K>>>,
    /// The store is gone: nothing more comes after what is pending.
    closed: bool,
    /// The subscriber is gone: the store stops feeding this queue.
    dropped: bool,
}

struct Feed<K> {
    queue: Mutex<Queue<K>>,
    ready: tokio::sync::Notify,
}

/// The receiving end: [`Subscription::recv`] yields changes until the store is gone. Dropping
/// it unsubscribes.
pub struct Subscription<K> {
    feed: Arc<Feed<K>>,
}

/// The store's end of one subscription.
pub(super) struct Publisher<K> {
    feed: Arc<Feed<K>>,
}

/// A connected publisher and subscription.
pub(super) fn feed<K>() -> (Publisher<K>, Subscription<K>) {
    let feed = Arc::new(Feed {
        queue: Mutex::new(Queue {
            order: VecDeque::new(),
            pending: HashMap::new(),
            closed: false,
            dropped: false,
        }),
        ready: tokio::sync::Notify::new(),
    });
    (Publisher { feed: feed.clone() }, Subscription { feed })
}

/// Queues `next` after a key's pending `events`, merged: a delete ends what was pending (it is
/// the object's last state; deletes in a row keep the newest), updates fold into one, an add
/// stays apart from the delete before it and the updates after it. So a key holds at most a
/// delete, an add and an update.
fn push<K>(events: &mut Vec<StoreEvent<K>>, next: StoreEvent<K>) {
    use StoreEvent::{Added, Deleted, Updated};
    match (events.pop(), next) {
        (_, Deleted(gone)) => {
            events.clear();
            events.push(Deleted(gone));
        }
        (Some(Updated { old, .. }), Added(new) | Updated { new, .. }) => {
            events.push(Updated { old, new })
        }
        (Some(Added(_)), Added(new)) => events.push(Added(new)),
        (last, next) => events.extend(last.into_iter().chain([next])),
    }
}

impl<K> Publisher<K> {
    /// Queues `event` under `key`. False when the subscriber is gone (drop this publisher).
    pub(super) fn send(&self, key: &str, event: StoreEvent<K>) -> bool {
        let mut q = self.feed.queue.lock();
        if q.dropped {
            return false;
        }
        match q.pending.get_mut(key) {
            Some(events) => push(events, event),
            None => {
                q.pending.insert(key.to_string(), vec![event]);
                q.order.push_back(key.to_string());
            }
        }
        drop(q);
        self.feed.ready.notify_one();
        true
    }
}

impl<K> Drop for Publisher<K> {
    fn drop(&mut self) {
        self.feed.queue.lock().closed = true;
        self.feed.ready.notify_one();
    }
}

impl<K> Subscription<K> {
    /// The next change; None once the store is gone and nothing is pending.
    pub async fn recv(&mut self) -> Option<StoreEvent<K>> {
        loop {
            let notified = self.feed.ready.notified();
            if let Some(next) = self.try_recv() {
                return next;
            }
            notified.await;
        }
    }

    /// Some(change or end) when one is ready now.
    pub(super) fn try_recv(&self) -> Option<Option<StoreEvent<K>>> {
        let mut q = self.feed.queue.lock();
        while let Some(key) = q.order.pop_front() {
            let Some(events) = q.pending.get_mut(&key) else {
                continue;
            };
            let first = events.remove(0);
            if events.is_empty() {
                q.pending.remove(&key);
            } else {
                q.order.push_front(key);
            }
            return Some(Some(first));
        }
        q.closed.then_some(None)
    }

    /// How many changes are pending (for tests of the bound).
    #[cfg(test)]
    pub(super) fn pending(&self) -> usize {
        self.feed.queue.lock().pending.values().map(Vec::len).sum()
    }
}

impl<K> Drop for Subscription<K> {
    fn drop(&mut self) {
        let mut q = self.feed.queue.lock();
        q.dropped = true;
        q.order.clear();
        q.pending.clear();
    }
}
