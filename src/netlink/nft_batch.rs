//! Sends one nf_tables transaction — the messages `rules::iptables_nft` encodes — over an
//! nfnetlink socket in the calling thread's network namespace, and reports the kernel's answer.
//! The kernel applies a batch all or nothing: a rejected message leaves every table as it was.
//! For a netns owned by another user namespace the batch goes out from a forked child that
//! entered it ([`send_entering`]).

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
    #[error(transparent)]
    Entry(#[from] crate::netns::NetnsError),
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

/// Sends `messages` as one transaction from the calling thread's netns and waits for the
/// kernel's answer.
pub fn send(messages: &[Message]) -> Result<(), BatchError> {
    if messages.is_empty() {
        return Ok(());
    }
    let framed = frame(messages, FIRST_SEQ);
    let mut replies = vec![0u8; REPLY_BUFFER];
    let answer = exchange(&framed, last_seq(messages), &mut replies);
    answer.into_result(messages)
}

/// Sends `messages` as one transaction from a forked child that entered the netns's user
/// namespace first: the kernel checks `-m owner` matches against the sender's user namespace,
/// and only a single-threaded process may enter one.
pub fn send_entering(
    messages: &[Message],
    entry: &crate::netns::UsernsEntry,
) -> Result<(), BatchError> {
    if messages.is_empty() {
        return Ok(());
    }
    let framed = frame(messages, FIRST_SEQ);
    let mut replies = vec![0u8; REPLY_BUFFER];
    let last = last_seq(messages);
    // SAFETY: `exchange` only makes system calls on the buffers allocated above.
    let word = unsafe { entry.run_forked(|| exchange(&framed, last, &mut replies).to_word()) }?;
    Answer::from_word(word).into_result(messages)
}

const FIRST_SEQ: u32 = 1;
const REPLY_BUFFER: usize = 65536;

fn last_seq(messages: &[Message]) -> u32 {
    FIRST_SEQ + messages.len() as u32
}

/// The kernel's answer to a batch, small enough for a forked child to hand back as one word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Committed,
    /// The message with this sequence number failed with this errno.
    Rejected {
        seq: u32,
        errno: i32,
    },
    Unanswered,
    /// The socket itself failed.
    Io {
        errno: i32,
    },
    Malformed,
}

impl Answer {
    fn to_word(self) -> u64 {
        let (tag, seq, errno) = match self {
            Answer::Committed => (0u64, 0, 0),
            Answer::Rejected { seq, errno } => (1, seq, errno),
            Answer::Unanswered => (2, 0, 0),
            Answer::Io { errno } => (3, 0, errno),
            Answer::Malformed => (4, 0, 0),
        };
        (tag << 56) | ((errno as u64 & 0xff_ffff) << 32) | seq as u64
    }

    fn from_word(word: u64) -> Answer {
        let seq = word as u32;
        let errno = ((word >> 32) & 0xff_ffff) as i32;
        match word >> 56 {
            0 => Answer::Committed,
            1 => Answer::Rejected { seq, errno },
            2 => Answer::Unanswered,
            3 => Answer::Io { errno },
            _ => Answer::Malformed,
        }
    }

    fn into_result(self, messages: &[Message]) -> Result<(), BatchError> {
        match self {
            Answer::Committed => Ok(()),
            Answer::Rejected { seq, errno } => Err(BatchError::Rejected {
                what: seq
                    .checked_sub(FIRST_SEQ + 1)
                    .and_then(|i| messages.get(i as usize))
                    .map(|m| m.what.clone())
                    .unwrap_or_else(|| "apply the batch".to_string()),
                source: std::io::Error::from_raw_os_error(errno),
            }),
            Answer::Unanswered => Err(BatchError::Unanswered),
            Answer::Io { errno } => Err(std::io::Error::from_raw_os_error(errno).into()),
            Answer::Malformed => Err(std::io::Error::other("malformed nfnetlink reply").into()),
        }
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Sends the framed batch and reads the kernel's replies until the last message is acknowledged
/// or one failed. Raw system calls on the given buffers only (no allocation), so a forked child of
/// a multi-threaded process may run it.
fn exchange(framed: &[u8], last_seq: u32, buf: &mut [u8]) -> Answer {
    // SAFETY: plain socket calls; every pointer and length comes from a live buffer or struct.
    unsafe {
        let fd = libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_NETFILTER,
        );
        if fd < 0 {
            return Answer::Io { errno: errno() };
        }
        let answer = exchange_on(fd, framed, last_seq, buf);
        libc::close(fd);
        answer
    }
}

/// [`exchange`] on an open socket.
unsafe fn exchange_on(fd: libc::c_int, framed: &[u8], last_seq: u32, buf: &mut [u8]) -> Answer {
    let timeout = libc::timeval {
        tv_sec: REPLY_TIMEOUT.as_secs() as libc::time_t,
        tv_usec: 0,
    };
    // SAFETY: (for the block) pointers and lengths of live values.
    unsafe {
        if libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const timeout).cast(),
            size_of::<libc::timeval>() as libc::socklen_t,
        ) != 0
        {
            return Answer::Io { errno: errno() };
        }
        let mut kernel: libc::sockaddr_nl = std::mem::zeroed();
        kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        let sent = libc::sendto(
            fd,
            framed.as_ptr().cast(),
            framed.len(),
            0,
            (&raw const kernel).cast(),
            size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        );
        if sent < 0 {
            return Answer::Io { errno: errno() };
        }
        loop {
            let n = libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0);
            if n < 0 {
                if errno() == libc::EINTR {
                    continue;
                }
                return Answer::Io { errno: errno() };
            }
            if n == 0 {
                return Answer::Unanswered;
            }
            match scan_replies(&buf[..n as usize], last_seq) {
                Some(answer) => return answer,
                None => continue,
            }
        }
    }
}

/// Reads one datagram of replies: Some(answer) once the batch is decided, None to read on.
fn scan_replies(buf: &[u8], last_seq: u32) -> Option<Answer> {
    let word = |at: usize| -> [u8; 4] { [buf[at], buf[at + 1], buf[at + 2], buf[at + 3]] };
    let mut offset = 0;
    while offset + HEADER_LEN <= buf.len() {
        let len = u32::from_ne_bytes(word(offset)) as usize;
        let kind = u16::from_ne_bytes([buf[offset + 4], buf[offset + 5]]);
        let seq = u32::from_ne_bytes(word(offset + 8));
        if len < HEADER_LEN || offset + len > buf.len() {
            return Some(Answer::Malformed);
        }
        if kind == NLMSG_ERROR && len >= HEADER_LEN + 4 {
            let code = i32::from_ne_bytes(word(offset + HEADER_LEN));
            if code != 0 {
                return Some(Answer::Rejected {
                    seq,
                    errno: code.saturating_neg(),
                });
            }
            if seq == last_seq {
                return Some(Answer::Committed);
            }
        }
        offset += len.next_multiple_of(4);
    }
    None
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

    #[test]
    fn answers_survive_the_trip_through_one_word() {
        for answer in [
            Answer::Committed,
            Answer::Rejected {
                seq: 4_000_000,
                errno: libc::EINVAL,
            },
            Answer::Unanswered,
            Answer::Io { errno: libc::EPERM },
            Answer::Malformed,
        ] {
            assert_eq!(Answer::from_word(answer.to_word()), answer);
        }
    }

    #[test]
    fn replies_decide_on_the_first_error_or_the_last_ack() {
        let reply = |seq: u32, code: i32| {
            let mut m = Vec::new();
            m.extend_from_slice(&36u32.to_ne_bytes());
            m.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
            m.extend_from_slice(&0u16.to_ne_bytes());
            m.extend_from_slice(&seq.to_ne_bytes());
            m.extend_from_slice(&0u32.to_ne_bytes());
            m.extend_from_slice(&code.to_ne_bytes());
            m.extend_from_slice(&[0; 16]);
            m
        };
        assert_eq!(scan_replies(&reply(3, 0), 3), Some(Answer::Committed));
        assert_eq!(scan_replies(&reply(2, 0), 3), None);
        assert_eq!(
            scan_replies(&reply(2, -libc::EINVAL), 3),
            Some(Answer::Rejected {
                seq: 2,
                errno: libc::EINVAL
            })
        );
        assert_eq!(scan_replies(&reply(3, 0)[..20], 3), Some(Answer::Malformed));
    }
}
