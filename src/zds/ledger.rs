//! What was last sent to ztunnel about each pod, on which connection, and its answer: the ZDS
//! state the agent's debug endpoint (`/debug/pods`) shows. Written by the connection tasks as
//! they send and hear back; a delete acked (or a pod leaving) forgets the pod.

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

/// Where one request about a pod stands.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Delivery {
    /// Sent, no answer yet.
    Sent,
    Acked,
    Nacked {
        message: String,
    },
    /// The connection closed before the answer.
    Lost,
}

/// The last request about one pod.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WorkloadState {
    /// The connection's id (the `conn` field of the agent's ZDS log lines).
    pub connection: u64,
    /// `add` (with the pod's netns) or `keep` (a snapshot entry without one).
    pub request: std::borrow::Cow<'static, str>,
    #[serde(flatten)]
    pub delivery: Delivery,
    /// When it was sent or answered, milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
    /// The netns an `add` handed over (`/debug/pods` shows the pod's own).
    #[serde(skip)]
    pub netns: Option<crate::netns::NetnsId>,
}

/// Pod UID -> its last request.
#[derive(Debug, Default)]
pub struct Ledger {
    pods: HashMap<String, WorkloadState>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Ledger {
    pub fn sent(
        &mut self,
        uid: &str,
        connection: u64,
        request: &'static str,
        netns: Option<crate::netns::NetnsId>,
    ) {
        self.pods.insert(
            uid.to_string(),
            WorkloadState {
                connection,
                request: request.into(),
                delivery: Delivery::Sent,
                at_unix_ms: now_ms(),
                netns,
            },
        );
    }

    /// Whether ztunnel on `connection` already acked an add of `uid` with this netns: sending it
    /// again would be a second Add of one uid on one connection.
    pub fn acked_add(&self, uid: &str, connection: u64, netns: crate::netns::NetnsId) -> bool {
        self.pods.get(uid).is_some_and(|s| {
            s.connection == connection
                && s.request == "add"
                && s.delivery == Delivery::Acked
                && s.netns == Some(netns)
        })
    }

    /// The answer to the pod's request on `connection` (ignored when a newer request about it
    /// went to another connection meanwhile).
    pub fn answered(&mut self, uid: &str, connection: u64, delivery: Delivery) {
        if let Some(s) = self.pods.get_mut(uid)
            && s.connection == connection
        {
            s.delivery = delivery;
            s.at_unix_ms = now_ms();
        }
    }

    /// Requests still unanswered on a connection that closed.
    pub fn closed(&mut self, connection: u64) {
        for s in self.pods.values_mut() {
            if s.connection == connection && s.delivery == Delivery::Sent {
                s.delivery = Delivery::Lost;
            }
        }
    }

    pub fn forget(&mut self, uid: &str) {
        self.pods.remove(uid);
    }

    pub fn snapshot(&self) -> HashMap<String, WorkloadState> {
        self.pods.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_land_on_the_request_of_their_connection() {
        let mut l = Ledger::default();
        let ns = crate::netns::NetnsId { dev: 1, inode: 7 };
        l.sent("u", 1, "add", Some(ns));
        assert!(!l.acked_add("u", 1, ns), "not acked yet");
        l.answered("u", 1, Delivery::Acked);
        assert_eq!(l.snapshot()["u"].delivery, Delivery::Acked);
        assert!(l.acked_add("u", 1, ns));
        assert!(!l.acked_add("u", 2, ns), "another connection");
        assert!(!l.acked_add("u", 1, crate::netns::NetnsId { dev: 1, inode: 8 }));
        l.sent("u", 2, "add", Some(ns));
        l.answered("u", 1, Delivery::Lost);
        assert_eq!(l.snapshot()["u"].delivery, Delivery::Sent, "a stale answer");
        l.closed(2);
        assert_eq!(l.snapshot()["u"].delivery, Delivery::Lost);
        let json = serde_json::to_value(&l.snapshot()["u"]).unwrap();
        assert_eq!(json["state"], "lost");
        assert_eq!(json["connection"], 2);
        l.forget("u");
        assert!(l.snapshot().is_empty());
    }
}
