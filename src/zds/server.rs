//! The accept loop (rate limited), the set of live connections in connect order, and the handle
//! the agent drives: adds go to the newest connection, deletes to all of them.

use parking_lot::Mutex;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::backoff::NackBook;
use super::shared::{Op, Shared, Update};
use super::socket::{Listener, check_netns};
use super::{PodWorkload, SnapshotSource, ZdsConfig, ZdsError};
use crate::netns::Netns;

/// The agent's side of the server. Clone-cheap.
#[derive(Clone)]
pub struct ZdsHandle {
    shared: Arc<Shared>,
}

/// Binds the socket (see [`ZdsConfig`]), then runs the accept loop in a task until `shutdown`;
/// the socket file is removed when it ends. Each connection runs in its own task.
pub async fn serve(
    cfg: ZdsConfig,
    source: Arc<dyn SnapshotSource>,
    shutdown: CancellationToken,
) -> Result<ZdsHandle, ZdsError> {
    let listener = Listener::bind(&cfg)?;
    info!(
        path = %cfg.socket.display(),
        mode = format!("{:o}", crate::telemetry::socket::SOCKET_MODE),
        "ZDS server listening for ztunnel"
    );
    cfg.metrics.ztunnel_connected.set(0);
    let shared = Arc::new(Shared {
        nacks: Mutex::new(NackBook::new(cfg.nack_backoff_first, cfg.nack_backoff_max)),
        ledger: Mutex::default(),
        cfg,
        source,
        conns: Mutex::new(Vec::new()),
        next_id: AtomicU64::new(1),
    });
    tokio::spawn(accept_loop(listener, shared.clone(), shutdown));
    Ok(ZdsHandle { shared })
}

/// Accepts at most one connection per `accept_interval`, so a ztunnel stuck reconnecting cannot
/// spin the agent (or itself).
async fn accept_loop(listener: Listener, shared: Arc<Shared>, shutdown: CancellationToken) {
    let mut last: Option<tokio::time::Instant> = None;
    loop {
        if let Some(at) = last {
            tokio::select! {
                _ = tokio::time::sleep_until(at + shared.cfg.accept_interval) => {}
                _ = shutdown.cancelled() => break,
            }
        }
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = shutdown.cancelled() => break,
        };
        last = Some(tokio::time::Instant::now());
        match accepted {
            Ok(packet) => {
                let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(super::conn::run(
                    packet,
                    id,
                    shared.clone(),
                    shutdown.child_token(),
                ));
            }
            Err(e) => {
                // E.g. out of fds: back off a little instead of spinning on the error.
                warn!(error = %e, "ZDS accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    info!(path = %shared.cfg.socket.display(), "ZDS server stopped");
}

impl ZdsHandle {
    /// Sends `uid` with its netns to the newest connection and returns after ztunnel acked it (a
    /// connection still sending its snapshot queues it until that is done). Refused without
    /// sending: a handle that is not a network namespace, a pod held back after a NACK.
    pub async fn add_workload(
        &self,
        uid: &str,
        info: &PodWorkload,
        netns: &Arc<Netns>,
    ) -> Result<(), ZdsError> {
        if let Err(reason) = check_netns(netns.as_fd()) {
            return Err(ZdsError::NotANetns {
                uid: uid.to_string(),
                path: netns.path().to_path_buf(),
                reason,
            });
        }
        if let Some((retry_in, message)) = self.shared.nacks.lock().held(uid, Instant::now()) {
            return Err(ZdsError::Backoff {
                uid: uid.to_string(),
                retry_in,
                message: message.to_string(),
            });
        }
        let timeout = self.shared.cfg.update_timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let Some((conn, tx)) = self.shared.newest() else {
            return Err(ZdsError::NoConnection);
        };
        let op = Op::Add {
            uid: uid.to_string(),
            info: info.clone(),
            netns: netns.clone(),
        };
        let answer = send(conn, &tx, op, deadline).await;
        match answer {
            Answer::Done(result) => result,
            Answer::Closed => Err(ZdsError::ConnectionClosed {
                conn,
                what: format!("add {uid}"),
            }),
            Answer::TimedOut => Err(ZdsError::UpdateTimeout {
                uid: uid.to_string(),
                what: "add",
                after: timeout,
            }),
        }
    }

    /// Sends a delete for `uid` to every connection and waits for them. A connection that closes
    /// first counts as done: ztunnel reconnects and gets a snapshot, which must no longer list
    /// the pod (remove it from the [`SnapshotSource`] before calling this). No connection = done.
    pub async fn del_workload(&self, uid: &str) -> Result<(), ZdsError> {
        self.shared.nacks.lock().clear(uid);
        self.shared.ledger.lock().forget(uid);
        let timeout = self.shared.cfg.update_timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let sends = self.shared.all().into_iter().map(|(conn, tx)| async move {
            let op = Op::Del {
                uid: uid.to_string(),
            };
            (conn, send(conn, &tx, op, deadline).await)
        });
        let mut first_error = None;
        for (conn, answer) in futures::future::join_all(sends).await {
            match answer {
                Answer::Done(Ok(())) | Answer::Closed => {}
                Answer::Done(Err(e @ ZdsError::Nack { .. })) => {
                    first_error.get_or_insert(e);
                }
                // The connection closed itself over it; its reconnect snapshot repairs.
                Answer::Done(Err(e)) => {
                    info!(conn, uid, error = %e, "delete ended with its connection");
                }
                Answer::TimedOut => {
                    first_error.get_or_insert(ZdsError::UpdateTimeout {
                        uid: uid.to_string(),
                        what: "delete",
                        after: timeout,
                    });
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// What was last sent to ztunnel about each pod (UID), on which connection, and its answer.
    pub fn workload_states(
        &self,
    ) -> std::collections::HashMap<String, super::ledger::WorkloadState> {
        self.shared.ledger.lock().snapshot()
    }

    /// Live connections (past their hello).
    #[cfg(any(test, feature = "test-hooks"))]
    pub fn connections(&self) -> usize {
        self.shared.conns.lock().len()
    }
}

enum Answer {
    Done(Result<(), ZdsError>),
    Closed,
    TimedOut,
}

/// Queues `op` on one connection and waits for its answer until `deadline`.
async fn send(
    conn: u64,
    tx: &mpsc::Sender<Update>,
    op: Op,
    deadline: tokio::time::Instant,
) -> Answer {
    let (reply, answer) = oneshot::channel();
    let queued = tokio::time::timeout_at(deadline, tx.send(Update { op, reply })).await;
    match queued {
        Err(_) => return Answer::TimedOut,
        Ok(Err(_)) => return Answer::Closed,
        Ok(Ok(())) => {}
    }
    match tokio::time::timeout_at(deadline, answer).await {
        Err(_) => {
            tracing::debug!(conn, "update not answered before its deadline");
            Answer::TimedOut
        }
        Ok(Err(_)) => Answer::Closed,
        Ok(Ok(result)) => Answer::Done(result),
    }
}
