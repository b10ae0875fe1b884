//! nf_tables transactions over nfnetlink in the calling thread's network namespace. This module
//! owns the wire format: the netlink header, the nfnetlink header (`nfgenmsg`), sequence numbers
//! and the batch framing around the caller's messages (a message kind, flags, family and an
//! attribute list, e.g. what `rules::iptables_nft` describes), one socket per transaction, and
//! the kernel's answers, read with netlink-packet-core's buffers. The kernel applies a batch all
//! or nothing: a rejected message leaves every table as it was. For a netns owned by another user
//! namespace the batch goes out from a forked child that entered it
//! ([`Transaction::send_entering`]).

use std::time::Duration;

use netlink_packet_core::{
    DecodeError, DefaultNla, Emitable, ErrorBuffer, NLM_F_ACK, NLM_F_REQUEST, NLMSG_ERROR,
    NetlinkBuffer, NetlinkHeader, Nla,
};

use super::nf_kernel::{
    NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END, NFNL_SUBSYS_NFTABLES, NFT_MSG_DELCHAIN,
    NFT_MSG_DELTABLE, NFTA_CHAIN_NAME, NFTA_CHAIN_TABLE, NFTA_TABLE_NAME,
};

const NFNETLINK_V0: u8 = 0;
/// `struct nlmsghdr`.
pub(super) const HEADER_LEN: usize = 16;
/// `struct nfgenmsg`.
pub(super) const NFGENMSG_LEN: usize = 4;
/// The kernel answers while it handles the send; this only bounds a kernel that never does.
pub(super) const REPLY_TIMEOUT: Duration = Duration::from_secs(5);
const FIRST_SEQ: u32 = 1;
pub(super) const REPLY_BUFFER: usize = 65536;

/// Why a transaction did not go through.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    #[error("nfnetlink socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("netfilter refused to {what}: {source}")]
    Rejected {
        what: String,
        source: std::io::Error,
    },
    #[error("nf_tables closed the conversation without answering the transaction")]
    Unanswered,
    #[error("malformed nfnetlink reply")]
    Malformed(#[source] Option<DecodeError>),
    #[error(
        "cannot {what}: netlink attribute type {kind} would be {len} bytes long; \
         its length field holds at most 65535"
    )]
    AttrTooLong { what: String, kind: u16, len: usize },
    #[error(transparent)]
    Entry(#[from] crate::netns::NetnsError),
}

impl BatchError {
    /// The errno the kernel refused a message with (ENOENT: no such table, set or element).
    pub fn refused_with(&self) -> Option<i32> {
        match self {
            BatchError::Rejected { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

/// One nf_tables transaction being framed: BATCH_BEGIN, then each message with its netlink and
/// nfnetlink headers and consecutive sequence numbers; BATCH_END when it is sent. Everything is
/// framed (and allocated) before anything is sent, so a forked child only makes system calls.
#[derive(Debug)]
pub struct Transaction {
    buf: Vec<u8>,
    /// What each message does, by position (for the kernel's refusals).
    whats: Vec<String>,
    /// Where the last message's header starts: it asks for the ACK.
    last_header: Option<usize>,
}

impl Default for Transaction {
    fn default() -> Self {
        Transaction::new()
    }
}

impl Transaction {
    pub fn new() -> Transaction {
        // A pod's sidecar or in-pod rules are 10-20 KiB of messages: room for them from the
        // start, instead of copying the batch at every doubling.
        let mut buf = Vec::with_capacity(32 * 1024);
        push_header(
            &mut buf,
            NFNL_MSG_BATCH_BEGIN,
            NLM_F_REQUEST,
            FIRST_SEQ,
            0,
            NFNL_SUBSYS_NFTABLES,
            0,
        );
        Transaction {
            buf,
            whats: Vec::new(),
            last_header: None,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.whats.is_empty()
    }

    /// Adds one nf_tables message: `NFT_MSG_*` `kind`, `NLM_F_*` `flags` on top of
    /// `NLM_F_REQUEST`, `AF_*` `family`, and its attributes. An attribute longer than its 16-bit
    /// length field can say is refused, never truncated.
    pub fn push<A: Nla>(
        &mut self,
        kind: u16,
        flags: u16,
        family: u8,
        attrs: &[A],
        what: String,
    ) -> Result<(), BatchError> {
        // A nest is at least as long as anything in it: checking the top level covers all.
        if let Some(attr) = attrs
            .iter()
            .find(|a| a.value_len() + 4 > usize::from(u16::MAX))
        {
            return Err(BatchError::AttrTooLong {
                what,
                kind: attr.kind(),
                len: attr.value_len() + 4,
            });
        }
        let attrs_len = attrs.buffer_len();
        let start = self.buf.len();
        let seq = FIRST_SEQ + 1 + self.whats.len() as u32;
        push_header(
            &mut self.buf,
            (NFNL_SUBSYS_NFTABLES << 8) | kind,
            NLM_F_REQUEST | flags,
            seq,
            family,
            0,
            attrs_len,
        );
        let at = self.buf.len();
        self.buf.resize(at + attrs_len, 0);
        attrs.emit(&mut self.buf[at..]);
        self.whats.push(what);
        self.last_header = Some(start);
        Ok(())
    }

    /// The whole batch as one datagram. Only the last message asks for an ACK: the kernel answers
    /// a failing message with its error whatever its flags, and reports errors in message order,
    /// so "the last one acknowledged, nothing failed before it" is the whole transaction committed
    /// — with one reply to read instead of one per message.
    fn framed(&mut self) -> Vec<u8> {
        let mut buf = std::mem::take(&mut self.buf);
        if let Some(at) = self.last_header {
            let mut header = NetlinkBuffer::new(&mut buf[at..]);
            let flags = header.flags();
            header.set_flags(flags | NLM_F_ACK);
        }
        push_header(
            &mut buf,
            NFNL_MSG_BATCH_END,
            NLM_F_REQUEST,
            self.last_seq() + 1,
            0,
            NFNL_SUBSYS_NFTABLES,
            0,
        );
        buf
    }

    fn last_seq(&self) -> u32 {
        FIRST_SEQ + self.whats.len() as u32
    }

    /// Sends the transaction from the calling thread's netns and waits for the kernel's answer.
    pub fn send(mut self) -> Result<(), BatchError> {
        if self.is_empty() {
            return Ok(());
        }
        let framed = self.framed();
        let last = self.last_seq();
        let answer =
            super::with_reply_buffer(REPLY_BUFFER, |replies| exchange(&framed, last, replies));
        answer.into_result(&self.whats)
    }

    /// Sends the transaction from a forked child that entered the netns's user namespace first:
    /// the kernel checks `-m owner` matches against the sender's user namespace, and only a
    /// single-threaded process may enter one.
    pub fn send_entering(mut self, entry: &crate::netns::UsernsEntry) -> Result<(), BatchError> {
        if self.is_empty() {
            return Ok(());
        }
        let framed = self.framed();
        let last = self.last_seq();
        let word = super::with_reply_buffer(REPLY_BUFFER, |replies| {
            // SAFETY: `exchange` only makes system calls on the buffers allocated before the
            // fork, and reads the replies through netlink-packet-core's borrowed views (no
            // allocation).
            unsafe { entry.run_forked(|| exchange(&framed, last, replies).to_word()) }
        })?;
        Answer::from_word(word).into_result(&self.whats)
    }
}

/// Appends a netlink header (its length covering `payload_len` more bytes) and an `nfgenmsg`.
pub(super) fn push_header(
    buf: &mut Vec<u8>,
    kind: u16,
    flags: u16,
    seq: u32,
    family: u8,
    res_id: u16,
    payload_len: usize,
) {
    let mut header = NetlinkHeader::default();
    header.length = (HEADER_LEN + NFGENMSG_LEN + payload_len) as u32;
    header.message_type = kind;
    header.flags = flags;
    header.sequence_number = seq;
    let at = buf.len();
    buf.resize(at + HEADER_LEN, 0);
    header.emit(&mut buf[at..]);
    buf.extend_from_slice(&[family, NFNETLINK_V0]);
    buf.extend_from_slice(&res_id.to_be_bytes());
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

    fn into_result(self, whats: &[String]) -> Result<(), BatchError> {
        match self {
            Answer::Committed => Ok(()),
            Answer::Rejected { seq, errno } => Err(BatchError::Rejected {
                what: seq
                    .checked_sub(FIRST_SEQ + 1)
                    .and_then(|i| whats.get(i as usize))
                    .cloned()
                    .unwrap_or_else(|| "apply the batch".to_string()),
                source: std::io::Error::from_raw_os_error(errno),
            }),
            Answer::Unanswered => Err(BatchError::Unanswered),
            Answer::Io { errno } => Err(std::io::Error::from_raw_os_error(errno).into()),
            Answer::Malformed => Err(BatchError::Malformed(None)),
        }
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Sends the framed batch and reads the kernel's replies until the last message is acknowledged
/// or one failed. Raw system calls on the given buffers only (no allocation), so a forked child of
/// a multi-threaded process may run it.
fn exchange(framed: &[u8], last_seq: u32, buf: &mut Vec<u8>) -> Answer {
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
/// `buf`'s spare room takes each read (its capacity is never changed: no allocation).
unsafe fn exchange_on(fd: libc::c_int, framed: &[u8], last_seq: u32, buf: &mut Vec<u8>) -> Answer {
    let timeout = libc::timeval {
        // `as _`: the field's own type (libc deprecates naming `time_t` on musl).
        tv_sec: REPLY_TIMEOUT.as_secs() as _,
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
        if let Err(errno) = fit_send_buffer(fd, framed.len()) {
            return Answer::Io { errno };
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
            buf.clear();
            let n = libc::recv(fd, buf.as_mut_ptr().cast(), buf.capacity(), 0);
            if n < 0 {
                if errno() == libc::EINTR {
                    continue;
                }
                return Answer::Io { errno: errno() };
            }
            if n == 0 {
                return Answer::Unanswered;
            }
            // The first `n` bytes were written by the kernel (no MSG_TRUNC asked: n <= capacity).
            buf.set_len(n as usize);
            match scan_replies(buf, last_seq) {
                Some(answer) => return answer,
                None => continue,
            }
        }
    }
}

/// Makes the socket's send buffer hold a `len`-byte datagram. The kernel reads an nf_tables
/// batch from one datagram only (BATCH_BEGIN and BATCH_END in two sends would be two batches,
/// the first aborted for want of its end), and refuses a datagram longer than the send buffer
/// (EMSGSIZE): a large rule set needs a larger buffer, not more sends. Raised past the
/// `wmem_max` cap with SO_SNDBUFFORCE (CAP_NET_ADMIN, which programming rules needs anyway),
/// else as far as SO_SNDBUF allows. System calls only (a forked child runs it).
unsafe fn fit_send_buffer(fd: libc::c_int, len: usize) -> Result<(), i32> {
    /// What the kernel keeps of the buffer for its own accounting.
    const OVERHEAD: usize = 32;
    let mut have: libc::c_int = 0;
    let mut size = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: (for the block) pointers and lengths of live values.
    unsafe {
        if libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&raw mut have).cast(),
            &raw mut size,
        ) != 0
        {
            return Err(errno());
        }
        if usize::try_from(have).is_ok_and(|have| len + OVERHEAD <= have) {
            return Ok(());
        }
        // The kernel doubles what it is given.
        let want = libc::c_int::try_from(len + OVERHEAD).unwrap_or(libc::c_int::MAX / 2);
        let set = |option| {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                option,
                (&raw const want).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            ) == 0
        };
        if set(libc::SO_SNDBUFFORCE) || set(libc::SO_SNDBUF) {
            Ok(())
        } else {
            Err(errno())
        }
    }
}

/// Reads one datagram of replies: Some(answer) once the batch is decided, None to read on. Only
/// borrowed views over `buf` (lengths checked first, so nothing here allocates or panics): a
/// forked child runs it.
fn scan_replies(buf: &[u8], last_seq: u32) -> Option<Answer> {
    let mut offset = 0;
    while offset + HEADER_LEN <= buf.len() {
        let rest = &buf[offset..];
        let reply = NetlinkBuffer::new(rest);
        let len = reply.length() as usize;
        if len < HEADER_LEN || len > rest.len() {
            return Some(Answer::Malformed);
        }
        let seq = reply.sequence_number();
        if !(FIRST_SEQ..=last_seq).contains(&seq) {
            // Not an answer to this transaction: a fresh socket gets no other.
            return Some(Answer::Malformed);
        }
        let payload = reply.payload();
        if reply.message_type() == NLMSG_ERROR && payload.len() >= 4 {
            match ErrorBuffer::new(payload).code() {
                Some(code) => {
                    return Some(Answer::Rejected {
                        seq,
                        errno: code.get().saturating_neg(),
                    });
                }
                None if seq == last_seq => return Some(Answer::Committed),
                None => {}
            }
        }
        offset += len.next_multiple_of(4);
    }
    None
}

/// Deletes one (empty) nf_tables chain of a family's table, as one transaction.
pub fn delete_chain(family: u8, table: &str, chain: &str) -> Result<(), BatchError> {
    let mut tx = Transaction::new();
    tx.push(
        NFT_MSG_DELCHAIN,
        0,
        family,
        &[
            name_attr(NFTA_CHAIN_TABLE, table),
            name_attr(NFTA_CHAIN_NAME, chain),
        ],
        format!("delete chain {chain} of table {table}"),
    )?;
    tx.send()
}

/// Deletes one nf_tables table of a family (with whatever it holds), as one transaction.
pub fn delete_table(family: u8, name: &str) -> Result<(), BatchError> {
    let mut tx = Transaction::new();
    tx.push(
        NFT_MSG_DELTABLE,
        0,
        family,
        &[name_attr(NFTA_TABLE_NAME, name)],
        format!("delete table {name}"),
    )?;
    tx.send()
}

/// A NUL-terminated name attribute.
pub(super) fn name_attr(kind: u16, name: &str) -> DefaultNla {
    let mut value = Vec::with_capacity(name.len() + 1);
    value.extend_from_slice(name.as_bytes());
    value.push(0);
    DefaultNla::new(kind, value)
}

#[cfg(test)]
#[path = "nft_batch_tests.rs"]
mod tests;
