//! What the accept loop, the connection tasks (`conn`) and the agent's handle (`server`) share:
//! the live connections in connect order with their update queues, the NACK book and the ledger,
//! and the update a connection is sent. Below both `conn` and `server`, which use it.

use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use tokio::sync::{mpsc, oneshot};

use super::backoff::NackBook;
use super::{PodWorkload, SnapshotSource, ZdsConfig, ZdsError};
use crate::netns::Netns;

/// A change for one connection, answered once its ack (or failure) is in.
pub(crate) struct Update {
    pub op: Op,
    pub reply: oneshot::Sender<Result<(), ZdsError>>,
}

pub(crate) enum Op {
    Add {
        uid: String,
        info: PodWorkload,
        netns: Arc<Netns>,
    },
    Del {
        uid: String,
    },
}

pub(super) struct ConnEntry {
    pub(super) id: u64,
    pub(super) tx: mpsc::Sender<Update>,
}

/// State shared by the accept loop, the connection tasks and the handles.
pub(crate) struct Shared {
    pub cfg: ZdsConfig,
    pub source: Arc<dyn SnapshotSource>,
    pub nacks: Mutex<NackBook>,
    /// What was last sent about each pod, and its answer.
    pub ledger: Mutex<super::ledger::Ledger>,
    pub(super) conns: Mutex<Vec<ConnEntry>>,
    pub(super) next_id: AtomicU64,
}

impl Shared {
    /// Adds a connection that said hello; it becomes the newest. Returns its update queue.
    pub(crate) fn register(&self, id: u64) -> mpsc::Receiver<Update> {
        let (tx, rx) = mpsc::channel(self.cfg.queue_depth.max(1));
        let mut conns = self.conns.lock();
        conns.push(ConnEntry { id, tx });
        self.cfg.metrics.ztunnel_connected.set(conns.len() as i64);
        rx
    }

    pub(crate) fn unregister(&self, id: u64) {
        let mut conns = self.conns.lock();
        conns.retain(|c| c.id != id);
        self.cfg.metrics.ztunnel_connected.set(conns.len() as i64);
        self.ledger.lock().closed(id);
    }

    pub(super) fn newest(&self) -> Option<(u64, mpsc::Sender<Update>)> {
        self.conns.lock().last().map(|c| (c.id, c.tx.clone()))
    }

    pub(super) fn all(&self) -> Vec<(u64, mpsc::Sender<Update>)> {
        self.conns
            .lock()
            .iter()
            .map(|c| (c.id, c.tx.clone()))
            .collect()
    }
}
