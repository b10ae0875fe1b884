//! One ztunnel connection: hello within its deadline, the snapshot (Add + one verified netns fd per
//! pod with a netns, Keep for the others and for pods held back after a NACK, then exactly one
//! SnapshotSent), then queued updates one at a time in lock-step. Any send or ack failure, late
//! ack or unsolicited datagram closes the connection: ztunnel reconnects and the next snapshot
//! repairs, so no late ack can ever be taken for the answer to a later request.

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::ZdsError;
use super::proto::{self, Reply, Request};
use super::shared::{Op, Shared, Update};
use super::socket::{Idle, Packet, check_netns};

struct Session {
    packet: Packet,
    id: u64,
    shared: Arc<Shared>,
    buf: Vec<u8>,
}

/// Runs the connection to its end and logs how it ended.
pub(crate) async fn run(packet: Packet, id: u64, shared: Arc<Shared>, shutdown: CancellationToken) {
    match packet.peer() {
        Some(c) => info!(
            conn = id,
            peer_pid = c.pid(),
            peer_uid = c.uid(),
            peer_gid = c.gid(),
            "ztunnel connected"
        ),
        None => info!(
            conn = id,
            "ztunnel connected (peer credentials unavailable)"
        ),
    }
    let buf = vec![0; shared.cfg.recv_buffer.max(1024)];
    let mut session = Session {
        packet,
        id,
        shared: shared.clone(),
        buf,
    };
    let hello = tokio::select! {
        r = tokio::time::timeout(shared.cfg.hello_timeout, session.hello()) => r,
        _ = shutdown.cancelled() => return,
    };
    match hello {
        Ok(Ok(version)) if version == proto::Version::V1 as i32 => {
            info!(conn = id, version = "V1", "ztunnel hello")
        }
        Ok(Ok(version)) => warn!(
            conn = id,
            version, "ztunnel hello with an unknown protocol version; speaking V1"
        ),
        Ok(Err(e)) => {
            warn!(conn = id, error = %e, "ztunnel connection closed before the snapshot");
            return;
        }
        Err(_) => {
            warn!(
                conn = id,
                after = ?shared.cfg.hello_timeout,
                "no hello from ztunnel in time; connection closed"
            );
            return;
        }
    }
    let updates = shared.register(id);
    let ended = session.serve(updates, &shutdown).await;
    shared.unregister(id);
    match ended {
        Ok(why) => info!(conn = id, "ztunnel connection closed: {why}"),
        Err(e) => warn!(conn = id, error = %e, "ztunnel connection closed"),
    }
}

impl Session {
    async fn hello(&mut self) -> Result<i32, ZdsError> {
        let got = self
            .packet
            .recv(&mut self.buf)
            .await
            .map_err(|source| ZdsError::Transport {
                conn: self.id,
                what: "reading the hello".into(),
                source,
            })?;
        if got.len == 0 {
            return Err(self.closed("the hello"));
        }
        if got.truncated {
            return Err(self.protocol(format!("a hello longer than {} bytes", self.buf.len())));
        }
        proto::decode_hello(&self.buf[..got.len]).map_err(|e| self.protocol(e.to_string()))
    }

    /// Snapshot, then updates until the connection or the server ends. `Ok` carries why it ended
    /// normally.
    async fn serve(
        &mut self,
        mut updates: mpsc::Receiver<Update>,
        shutdown: &CancellationToken,
    ) -> Result<&'static str, ZdsError> {
        tokio::select! {
            r = self.snapshot() => r?,
            _ = shutdown.cancelled() => return Ok("the agent is shutting down"),
        }
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return Ok("the agent is shutting down"),
                update = updates.recv() => {
                    let Some(update) = update else {
                        return Ok("the server dropped it");
                    };
                    self.update(update).await?;
                }
                idle = self.packet.idle_event() => return match idle {
                    Idle::Eof => Ok("ztunnel closed it"),
                    Idle::Data(n) => Err(self.protocol(format!(
                        "an unsolicited datagram ({n}+ bytes) while no request was in flight"
                    ))),
                    Idle::Error(source) => Err(ZdsError::Transport {
                        conn: self.id,
                        what: "waiting for work".into(),
                        source,
                    }),
                },
            }
        }
    }

    async fn snapshot(&mut self) -> Result<(), ZdsError> {
        let entries = self.shared.source.snapshot();
        let started = Instant::now();
        info!(conn = self.id, pods = entries.len(), "sending snapshot");
        let (mut adds, mut keeps, mut held, mut refused, mut nacked) = (0, 0, 0, 0, 0);
        for entry in &entries {
            let uid = entry.uid.as_str();
            let mut netns = entry.netns.as_deref();
            if netns.is_some()
                && let Some((left, message)) = self.shared.nacks.lock().held(uid, Instant::now())
            {
                debug!(conn = self.id, uid, retry_in = ?left, last_nack = message,
                    "pod held back after a NACK: sending Keep instead of Add");
                held += 1;
                netns = None;
            }
            if let Some(ns) = netns
                && let Err(reason) = check_netns(ns.as_fd())
            {
                // An agent bug; a Keep still spares whatever ztunnel runs for the pod.
                warn!(conn = self.id, uid, path = %ns.path().display(), %reason,
                    "not a network namespace: sending Keep instead of Add");
                refused += 1;
                netns = None;
            }
            let request = if netns.is_some() { "add" } else { "keep" };
            let id = netns.as_ref().map(|n| n.id());
            self.shared.ledger.lock().sent(uid, self.id, request, id);
            let reply = match netns {
                Some(ns) => {
                    adds += 1;
                    let request = Request::Add {
                        uid,
                        info: &entry.info,
                    };
                    self.exchange(&request, Some(ns.as_fd())).await?
                }
                None => {
                    keeps += 1;
                    self.exchange(&Request::Keep { uid }, None).await?
                }
            };
            self.answered(uid, &reply);
            match reply {
                Reply::Ack if netns.is_some() => self.shared.nacks.lock().clear(uid),
                Reply::Ack => {}
                Reply::Nack { message, truncated } => {
                    nacked += 1;
                    self.nacked(uid, netns.is_some(), &message, truncated);
                }
            }
        }
        match self.exchange(&Request::SnapshotSent, None).await? {
            Reply::Ack => {}
            Reply::Nack { message, .. } => {
                return Err(self.protocol(format!("ztunnel rejected SnapshotSent: {message}")));
            }
        }
        info!(
            conn = self.id,
            adds,
            keeps,
            held_back = held,
            refused,
            nacked,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "snapshot sent and acked"
        );
        Ok(())
    }

    /// Sends one queued update and answers its caller. Errors that close the connection are
    /// returned as well.
    async fn update(&mut self, update: Update) -> Result<(), ZdsError> {
        let started = Instant::now();
        let (result, uid) = match &update.op {
            Op::Add { uid, info, netns } => {
                // Already in ztunnel on this connection (its snapshot, or an earlier attempt the
                // caller gave up on): acked again, not sent twice.
                if self
                    .shared
                    .ledger
                    .lock()
                    .acked_add(uid, self.id, netns.id())
                {
                    debug!(conn = self.id, uid, "already acked on this connection");
                    let _ = update.reply.send(Ok(()));
                    return Ok(());
                }
                self.shared
                    .ledger
                    .lock()
                    .sent(uid, self.id, "add", Some(netns.id()));
                let request = Request::Add { uid, info };
                let result = self.exchange(&request, Some(netns.as_fd())).await;
                if let Ok(reply) = &result {
                    self.answered(uid, reply);
                }
                (result, uid)
            }
            Op::Del { uid } => {
                let result = self.exchange(&Request::Del { uid }, None).await;
                if matches!(result, Ok(Reply::Ack)) {
                    self.shared.ledger.lock().forget(uid);
                }
                (result, uid)
            }
        };
        let is_add = matches!(update.op, Op::Add { .. });
        let kind = if is_add { "add" } else { "delete" };
        let elapsed_ms = started.elapsed().as_millis() as u64;
        let answer = match result {
            Ok(Reply::Ack) => {
                info!(conn = self.id, uid, elapsed_ms, "ztunnel acked {kind}");
                self.shared.nacks.lock().clear(uid);
                Ok(())
            }
            Ok(Reply::Nack { message, truncated }) => {
                self.nacked(uid, is_add, &message, truncated);
                Err(ZdsError::Nack {
                    uid: uid.clone(),
                    message: if truncated {
                        format!("{message}… (truncated)")
                    } else {
                        message
                    },
                })
            }
            Err(e) => {
                // The connection closes over it; the caller hears the same.
                let _ = update.reply.send(Err(copy(&e)));
                return Err(e);
            }
        };
        let _ = update.reply.send(answer);
        Ok(())
    }

    /// Records ztunnel's answer about `uid` in the ledger.
    fn answered(&self, uid: &str, reply: &Reply) {
        let delivery = match reply {
            Reply::Ack => super::ledger::Delivery::Acked,
            Reply::Nack { message, .. } => super::ledger::Delivery::Nacked {
                message: message.clone(),
            },
        };
        self.shared.ledger.lock().answered(uid, self.id, delivery);
    }

    /// Logs a NACK; a NACKed Add holds the pod back.
    fn nacked(&self, uid: &str, add: bool, message: &str, truncated: bool) {
        if add {
            let retry_in = self
                .shared
                .nacks
                .lock()
                .record(uid, message, Instant::now());
            warn!(conn = self.id, uid, truncated, retry_in = ?retry_in,
                "ztunnel NACKed add: {message}");
        } else {
            warn!(conn = self.id, uid, truncated, "ztunnel NACKed: {message}");
        }
    }

    /// One request, one reply: the send and the ack each within `ack_timeout`.
    async fn exchange(
        &mut self,
        request: &Request<'_>,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<Reply, ZdsError> {
        let what = match request.uid() {
            Some(uid) => format!("{} {uid}", request.kind()),
            None => request.kind().to_string(),
        };
        let limit = self.shared.cfg.ack_timeout;
        let bytes = request.encode();
        let sent = tokio::time::timeout(limit, self.packet.send(&bytes, fd)).await;
        match sent {
            Err(_) => {
                return Err(ZdsError::AckTimeout {
                    conn: self.id,
                    what: format!("{what} (send blocked)"),
                    after: limit,
                });
            }
            Ok(Err(source)) => {
                return Err(ZdsError::Transport {
                    conn: self.id,
                    what: format!("sending {what}"),
                    source,
                });
            }
            Ok(Ok(())) => {}
        }
        let got = match tokio::time::timeout(limit, self.packet.recv(&mut self.buf)).await {
            Err(_) => {
                return Err(ZdsError::AckTimeout {
                    conn: self.id,
                    what,
                    after: limit,
                });
            }
            Ok(Err(source)) => {
                return Err(ZdsError::Transport {
                    conn: self.id,
                    what: format!("reading the ack of {what}"),
                    source,
                });
            }
            Ok(Ok(got)) => got,
        };
        if got.len == 0 && !got.truncated {
            return Err(self.closed(&what));
        }
        let reply = proto::decode_reply(&self.buf[..got.len], got.truncated)
            .map_err(|e| self.protocol(format!("answer to {what}: {e}")))?;
        debug!(conn = self.id, request = what, ?reply, "ztunnel answered");
        Ok(reply)
    }

    fn protocol(&self, what: String) -> ZdsError {
        ZdsError::Protocol {
            conn: self.id,
            what,
        }
    }

    fn closed(&self, what: &str) -> ZdsError {
        ZdsError::ConnectionClosed {
            conn: self.id,
            what: what.to_string(),
        }
    }
}

/// The same error for a second reader (`io::Error` is not `Clone`: keep its kind and text).
fn copy(e: &ZdsError) -> ZdsError {
    match e {
        ZdsError::Transport { conn, what, source } => ZdsError::Transport {
            conn: *conn,
            what: what.clone(),
            source: std::io::Error::new(source.kind(), source.to_string()),
        },
        ZdsError::AckTimeout { conn, what, after } => ZdsError::AckTimeout {
            conn: *conn,
            what: what.clone(),
            after: *after,
        },
        ZdsError::ConnectionClosed { conn, what } => ZdsError::ConnectionClosed {
            conn: *conn,
            what: what.clone(),
        },
        ZdsError::Protocol { conn, what } => ZdsError::Protocol {
            conn: *conn,
            what: what.clone(),
        },
        other => ZdsError::Protocol {
            conn: 0,
            what: other.to_string(),
        },
    }
}
