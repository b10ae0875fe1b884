//! Sends one nf_tables transaction — the messages `rules::iptables_nft` encodes — over an
//! nfnetlink socket in the calling thread's network namespace, and reports the kernel's answer.
//! The kernel applies a batch all or nothing: a rejected message leaves every table as it was.

use std::time::Duration;

use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_NETFILTER};

use crate::rules::iptables_nft::{Message, NLM_F_REQUEST};

const NFNL_MSG_BATCH_BEGIN: u16 = 16;
const NFNL_MSG_BATCH_END: u16 = 17;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NLM_F_ACK: u16 = 0x4;
const NLMSG_ERROR: u16 = 2;
const HEADER_LEN: usize = 16;
/// The kernel answers while it handles the send; this only bounds a kernel that never does.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a transaction did not go through.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    #[error("nfnetlink socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("nf_tables refused to {what}: {source}")]
    Rejected {
        what: String,
        source: std::io::Error,
    },
    #[error("nf_tables closed the conversation without answering the transaction")]
    Unanswered,
}

/// Appends one netlink message: header, `nfgenmsg` and the attributes.
fn push_message(buf: &mut Vec<u8>, kind: u16, flags: u16, seq: u32, family: u8, res_id: u16) {
    buf.extend_from_slice(&((HEADER_LEN + 4) as u32).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
    buf.push(family);
    buf.push(0);
    buf.extend_from_slice(&res_id.to_be_bytes());
}

/// The whole batch as one datagram: BATCH_BEGIN, the messages, BATCH_END. Only the last message
/// asks for an ACK: the kernel answers a failing message with its error whatever its flags, and
/// reports errors in message order, so "the last one acknowledged, nothing failed before it" is
/// the whole transaction committed — with one reply to read instead of one per message.
pub fn frame(messages: &[Message], first_seq: u32) -> Vec<u8> {
    let mut buf =
        Vec::with_capacity(64 + messages.iter().map(|m| 20 + m.attrs.len()).sum::<usize>());
    push_message(
        &mut buf,
        NFNL_MSG_BATCH_BEGIN,
        NLM_F_REQUEST,
        first_seq,
        0,
        NFNL_SUBSYS_NFTABLES,
    );
    for (i, m) in messages.iter().enumerate() {
        let start = buf.len();
        let ack = if i + 1 == messages.len() {
            NLM_F_ACK
        } else {
            0
        };
        push_message(
            &mut buf,
            (NFNL_SUBSYS_NFTABLES << 8) | m.kind,
            NLM_F_REQUEST | ack | m.flags,
            first_seq + 1 + i as u32,
            m.family,
            0,
        );
        buf.extend_from_slice(&m.attrs);
        let len = (buf.len() - start) as u32;
        buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
    }
    let seq = first_seq + 1 + messages.len() as u32;
    push_message(
        &mut buf,
        NFNL_MSG_BATCH_END,
        NLM_F_REQUEST,
        seq,
        0,
        NFNL_SUBSYS_NFTABLES,
    );
    buf
}

/// Sends `messages` as one transaction and waits for the kernel's answer to each.
pub fn send(messages: &[Message]) -> Result<(), BatchError> {
    if messages.is_empty() {
        return Ok(());
    }
    let mut socket = Socket::new(NETLINK_NETFILTER)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    nix::sys::socket::setsockopt(
        &socket,
        nix::sys::socket::sockopt::ReceiveTimeout,
        &nix::sys::time::TimeVal::new(REPLY_TIMEOUT.as_secs() as i64, 0),
    )
    .map_err(std::io::Error::from)?;
    const FIRST_SEQ: u32 = 1;
    socket.send(&frame(messages, FIRST_SEQ), 0)?;

    let last_seq = FIRST_SEQ + messages.len() as u32;
    let mut committed = false;
    let mut buf = vec![0u8; 65536];
    while !committed {
        let n = socket.recv(&mut &mut buf[..], 0)?;
        if n == 0 {
            break;
        }
        let mut offset = 0;
        while offset + HEADER_LEN <= n {
            let field = |at: usize| -> [u8; 4] {
                let mut word = [0; 4];
                word.copy_from_slice(&buf[offset + at..offset + at + 4]);
                word
            };
            let len = u32::from_ne_bytes(field(0)) as usize;
            let kind = u16::from_ne_bytes([buf[offset + 4], buf[offset + 5]]);
            let seq = u32::from_ne_bytes(field(8));
            if len < HEADER_LEN || offset + len > n {
                return Err(std::io::Error::other("malformed nfnetlink reply").into());
            }
            if kind == NLMSG_ERROR && len >= HEADER_LEN + 4 {
                let code = i32::from_ne_bytes(field(HEADER_LEN));
                if code == 0 {
                    committed |= seq == last_seq;
                } else {
                    let what = seq
                        .checked_sub(FIRST_SEQ + 1)
                        .and_then(|i| messages.get(i as usize))
                        .map(|m| m.what.clone())
                        .unwrap_or_else(|| "apply the batch".to_string());
                    return Err(BatchError::Rejected {
                        what,
                        source: std::io::Error::from_raw_os_error(-code),
                    });
                }
            }
            offset += len.next_multiple_of(4);
        }
    }
    if !committed {
        return Err(BatchError::Unanswered);
    }
    Ok(())
}

const NFT_MSG_GETCHAIN: u16 = 4;
const NFT_MSG_DELTABLE: u16 = 2;
const NFTA_TABLE_NAME: u16 = 1;

const NFT_MSG_DELCHAIN: u16 = 5;

/// Deletes one (empty) nf_tables chain of a family's table, as one transaction.
pub fn delete_chain(family: u8, table: &str, chain: &str) -> Result<(), BatchError> {
    use crate::rules::iptables_nft::Attrs;
    send(&[Message {
        kind: NFT_MSG_DELCHAIN,
        flags: 0,
        family,
        attrs: Attrs::new()
            .string(NFTA_CHAIN_TABLE, table)
            .string(NFTA_CHAIN_NAME, chain)
            .done(),
        what: format!("delete chain {chain} of table {table}"),
    }])
}

/// Deletes one nf_tables table of a family (with whatever it holds), as one transaction.
pub fn delete_table(family: u8, name: &str) -> Result<(), BatchError> {
    use crate::rules::iptables_nft::Attrs;
    send(&[Message {
        kind: NFT_MSG_DELTABLE,
        flags: 0,
        family,
        attrs: Attrs::new().string(NFTA_TABLE_NAME, name).done(),
        what: format!("delete table {name}"),
    }])
}

const NLM_F_DUMP: u16 = 0x300;
const NLMSG_DONE: u16 = 3;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;

/// The `(table, chain)` names of every nf_tables chain of one family (`AF_INET`/`AF_INET6`) in the
/// calling thread's network namespace: one netlink dump, no process. This is how an apply learns
/// cheaply whether iptables-nft already holds chains of ours.
pub fn list_chains(family: u8) -> Result<Vec<(String, String)>, BatchError> {
    let mut socket = Socket::new(NETLINK_NETFILTER)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    nix::sys::socket::setsockopt(
        &socket,
        nix::sys::socket::sockopt::ReceiveTimeout,
        &nix::sys::time::TimeVal::new(REPLY_TIMEOUT.as_secs() as i64, 0),
    )
    .map_err(std::io::Error::from)?;
    let mut request = Vec::with_capacity(HEADER_LEN + 4);
    push_message(
        &mut request,
        (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETCHAIN,
        NLM_F_REQUEST | NLM_F_DUMP,
        1,
        family,
        0,
    );
    socket.send(&request, 0)?;
    let mut chains = Vec::new();
    let mut buf = vec![0u8; 65536];
    loop {
        let n = socket.recv(&mut &mut buf[..], 0)?;
        if n == 0 {
            return Err(BatchError::Unanswered);
        }
        let mut offset = 0;
        while offset + HEADER_LEN <= n {
            let len = u32::from_ne_bytes([
                buf[offset],
                buf[offset + 1],
                buf[offset + 2],
                buf[offset + 3],
            ]) as usize;
            let kind = u16::from_ne_bytes([buf[offset + 4], buf[offset + 5]]);
            if len < HEADER_LEN || offset + len > n {
                return Err(std::io::Error::other("malformed nfnetlink reply").into());
            }
            let body = &buf[offset + HEADER_LEN..offset + len];
            match kind {
                NLMSG_DONE => return Ok(chains),
                NLMSG_ERROR if body.len() >= 4 => {
                    let code = i32::from_ne_bytes([body[0], body[1], body[2], body[3]]);
                    if code != 0 {
                        return Err(BatchError::Rejected {
                            what: "list chains".into(),
                            source: std::io::Error::from_raw_os_error(-code),
                        });
                    }
                }
                _ if body.len() >= 4 => chains.extend(chain_names(&body[4..])),
                _ => {}
            }
            offset += len.next_multiple_of(4);
        }
    }
}

/// Table and chain name from the attributes of one `NFT_MSG_NEWCHAIN` dump record.
fn chain_names(mut attrs: &[u8]) -> Option<(String, String)> {
    let (mut table, mut name) = (None, None);
    while attrs.len() >= 4 {
        let len = u16::from_ne_bytes([attrs[0], attrs[1]]) as usize;
        let kind = u16::from_ne_bytes([attrs[2], attrs[3]]) & 0x3fff;
        if len < 4 || len > attrs.len() {
            break;
        }
        let text = || {
            String::from_utf8_lossy(&attrs[4..len])
                .trim_end_matches('\0')
                .to_string()
        };
        match kind {
            NFTA_CHAIN_TABLE => table = Some(text()),
            NFTA_CHAIN_NAME => name = Some(text()),
            _ => {}
        }
        attrs = &attrs[len.next_multiple_of(4).min(attrs.len())..];
    }
    Some((table?, name?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::iptables_nft::{Attrs, NFT_MSG_NEWTABLE, NLM_F_CREATE};

    #[test]
    fn frames_a_batch_with_acks_and_lengths() {
        let msg = Message {
            kind: NFT_MSG_NEWTABLE,
            flags: NLM_F_CREATE,
            family: 2,
            attrs: Attrs::new().string(1, "nat").done(),
            what: "create table nat".into(),
        };
        let buf = frame(&[msg], 7);
        assert_eq!(buf.len(), 20 + 28 + 20);
        // BATCH_BEGIN: seq 7, res_id = nftables (big-endian 10).
        assert_eq!(&buf[4..6], &NFNL_MSG_BATCH_BEGIN.to_ne_bytes());
        assert_eq!(&buf[8..12], &7u32.to_ne_bytes());
        assert_eq!(&buf[18..20], &[0, 10]);
        // NEWTABLE (the last message, so it asks for the ACK): length 28, type 10<<8,
        // REQUEST|ACK|CREATE, seq 8, AF_INET.
        assert_eq!(&buf[20..24], &28u32.to_ne_bytes());
        assert_eq!(&buf[24..26], &(10u16 << 8).to_ne_bytes());
        assert_eq!(&buf[26..28], &(0x1u16 | 0x4 | 0x400).to_ne_bytes());
        assert_eq!(&buf[28..32], &8u32.to_ne_bytes());
        assert_eq!(buf[36], 2);
        assert_eq!(&buf[40..48], &[8, 0, 1, 0, b'n', b'a', b't', 0]);
        assert_eq!(&buf[52..54], &NFNL_MSG_BATCH_END.to_ne_bytes());
    }
}
