//! Single nfnetlink requests outside an nf_tables batch, in the calling thread's network
//! namespace: one message answered by an ACK or an error (ipset changes, which have no batches),
//! and dumps (ipset `LIST`, nf_tables `GET*`), each record handed back as its attribute bytes.
//! One socket per request, or one for all the requests of a [`with_session`] scope on the thread
//! (a drift check's dumps of one netns); every answer must carry the request's sequence number.
//! The batch framing of nf_tables transactions is [`super::nft_batch`]'s; the headers are shared
//! with it.

use std::cell::RefCell;

use netlink_packet_core::{
    Emitable, ErrorBuffer, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR,
    NetlinkBuffer, Nla,
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_NETFILTER};

use super::nft_batch::{
    BatchError, HEADER_LEN, NFGENMSG_LEN, REPLY_BUFFER, REPLY_TIMEOUT, push_header,
};

const SEQ: u32 = 1;

thread_local! {
    /// The open scope of [`with_session`] on this thread: `Some(socket once one was made)`.
    static SESSION: RefCell<Option<Option<Socket>>> = const { RefCell::new(None) };
}

/// Runs `work` with every nfnetlink request it makes on this thread sharing one socket (opened on
/// the first), closed when `work` returns. The scope is the caller's: a socket belongs to the netns
/// it was opened in, so a scope must not span a change of namespace (none is made on a thread that
/// stays where it is; [`crate::netns`] runs another namespace's work on another thread). A request
/// that fails drops the socket, so nothing unread from it is seen by the next one.
pub fn with_session<T>(work: impl FnOnce() -> T) -> T {
    struct Restore(Option<Option<Socket>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let outer = self.0.take();
            SESSION.with(|s| *s.borrow_mut() = outer);
        }
    }
    let _restore = Restore(SESSION.with(|s| s.borrow_mut().replace(None)));
    work()
}

/// The session's socket, or a new one.
fn take_socket() -> Result<Socket, BatchError> {
    match SESSION.with(|s| s.borrow_mut().as_mut().and_then(Option::take)) {
        Some(socket) => Ok(socket),
        None => open(),
    }
}

/// Hands a socket that answered cleanly back to the session (outside one it is closed).
fn give_back(socket: Socket) {
    SESSION.with(|s| {
        if let Some(slot) = s.borrow_mut().as_mut() {
            *slot = Some(socket);
        }
    });
}

fn open() -> Result<Socket, BatchError> {
    let mut socket = Socket::new(NETLINK_NETFILTER)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    nix::sys::socket::setsockopt(
        &socket,
        nix::sys::socket::sockopt::ReceiveTimeout,
        &nix::sys::time::TimeVal::new(REPLY_TIMEOUT.as_secs() as i64, 0),
    )
    .map_err(std::io::Error::from)?;
    Ok(socket)
}

/// One request: message `kind` of subsystem `subsys` with `NLM_F_*` `flags` (on top of
/// `NLM_F_REQUEST`), for address `family`, carrying `attrs`; `what` names it in a refusal.
pub(super) struct Message<'a, A> {
    pub subsys: u16,
    pub kind: u16,
    pub flags: u16,
    pub family: u8,
    pub attrs: &'a [A],
    pub what: &'a str,
}

/// Frames and sends one message; refuses an attribute its 16-bit length cannot say.
fn send<A: Nla>(socket: &Socket, message: &Message<'_, A>) -> Result<(), BatchError> {
    let attrs = message.attrs;
    if let Some(attr) = attrs
        .iter()
        .find(|a| a.value_len() + 4 > usize::from(u16::MAX))
    {
        return Err(BatchError::AttrTooLong {
            what: message.what.to_string(),
            kind: attr.kind(),
            len: attr.value_len() + 4,
        });
    }
    let attrs_len = attrs.buffer_len();
    let mut request = Vec::with_capacity(HEADER_LEN + NFGENMSG_LEN + attrs_len);
    push_header(
        &mut request,
        (message.subsys << 8) | message.kind,
        NLM_F_REQUEST | message.flags,
        SEQ,
        message.family,
        0,
        attrs_len,
    );
    let at = request.len();
    request.resize(at + attrs_len, 0);
    attrs.emit(&mut request[at..]);
    socket.send(&request, 0)?;
    Ok(())
}

/// What one reply message says.
enum Reply<'a> {
    /// An ACK (error code 0) or `NLMSG_DONE`.
    End,
    Failed(std::io::Error),
    /// A record: its attributes after the `nfgenmsg`.
    Record(&'a [u8]),
}

/// Reads replies until an ACK, an error or `NLMSG_DONE`, handing each record to `on_record`.
fn read_replies(
    socket: &Socket,
    what: &str,
    on_record: impl FnMut(&[u8]),
) -> Result<(), BatchError> {
    super::with_reply_buffer(REPLY_BUFFER, |buf| read_into(socket, buf, what, on_record))
}

fn read_into(
    socket: &Socket,
    buf: &mut Vec<u8>,
    what: &str,
    mut on_record: impl FnMut(&[u8]),
) -> Result<(), BatchError> {
    loop {
        buf.clear();
        // Into the spare room: `n` is what was written (no MSG_TRUNC asked).
        socket.recv(buf, 0)?;
        let n = buf.len();
        if n == 0 {
            return Err(BatchError::Unanswered);
        }
        let mut offset = 0;
        while offset < n {
            let reply = NetlinkBuffer::new_checked(&buf[offset..n])
                .map_err(|e| BatchError::Malformed(Some(e)))?;
            if reply.sequence_number() != SEQ {
                return Err(BatchError::Malformed(None));
            }
            let body = reply.payload();
            let said = match reply.message_type() {
                NLMSG_DONE => Reply::End,
                NLMSG_ERROR if body.len() >= 4 => match ErrorBuffer::new(body).code() {
                    Some(code) => Reply::Failed(std::io::Error::from_raw_os_error(-code.get())),
                    None => Reply::End,
                },
                _ if body.len() >= NFGENMSG_LEN => Reply::Record(&body[NFGENMSG_LEN..]),
                _ => Reply::Record(&[]),
            };
            match said {
                Reply::End => return Ok(()),
                Reply::Failed(source) => {
                    return Err(BatchError::Rejected {
                        what: what.to_string(),
                        source,
                    });
                }
                Reply::Record(attrs) => on_record(attrs),
            }
            offset += (reply.length() as usize).next_multiple_of(4);
        }
    }
}

/// Sends one message (`kind` of subsystem `subsys`, `NLM_F_*` `flags` on top of
/// `NLM_F_REQUEST | NLM_F_ACK`) and waits for its ACK; records answered before it (a `HEADER`
/// request's) are ignored. `what` names the change in a refusal.
pub fn request<A: Nla>(
    subsys: u16,
    kind: u16,
    flags: u16,
    family: u8,
    attrs: &[A],
    what: &str,
) -> Result<(), BatchError> {
    let flags = NLM_F_ACK | flags;
    let message = Message {
        subsys,
        kind,
        flags,
        family,
        attrs,
        what,
    };
    exchange(&message, |_| {})
}

/// One dump request; every record's attribute bytes, in the kernel's order.
pub fn dump<A: Nla>(
    subsys: u16,
    kind: u16,
    family: u8,
    attrs: &[A],
    what: &str,
) -> Result<Vec<Vec<u8>>, BatchError> {
    records(&Message {
        subsys,
        kind,
        flags: NLM_F_DUMP,
        family,
        attrs,
        what,
    })
}

/// Sends `message` and collects every record answered until its end: a dump's
/// ([`NLM_F_DUMP`]), or with [`NLM_F_ACK`] the records answered before the ACK (a
/// `GET_BYINDEX`'s).
pub(super) fn records<A: Nla>(message: &Message<'_, A>) -> Result<Vec<Vec<u8>>, BatchError> {
    let mut records = Vec::new();
    exchange(message, |record| records.push(record.to_vec()))?;
    Ok(records)
}

/// The one exchange every request makes: send the message on the session's (or a new) socket,
/// hand each record answered to `on_record` until its end; a socket that answered cleanly goes
/// back to the session.
fn exchange<A: Nla>(
    message: &Message<'_, A>,
    on_record: impl FnMut(&[u8]),
) -> Result<(), BatchError> {
    let socket = take_socket()?;
    send(&socket, message)?;
    read_replies(&socket, message.what, on_record)?;
    give_back(socket);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::nf_kernel::{NFNL_SUBSYS_NFTABLES, NFT_MSG_GETCHAIN};

    fn session_socket() -> Option<Option<i32>> {
        use std::os::fd::AsRawFd;
        SESSION.with(|s| {
            s.borrow()
                .as_ref()
                .map(|o| o.as_ref().map(|s| s.as_raw_fd()))
        })
    }

    /// Needs root (an nf_tables dump of this process's netns; read only).
    #[test]
    fn a_session_reuses_one_socket_and_closes_it_at_its_end() {
        let list = || {
            dump::<netlink_packet_core::DefaultNla>(
                NFNL_SUBSYS_NFTABLES,
                NFT_MSG_GETCHAIN,
                0,
                &[],
                "t",
            )
        };
        assert_eq!(session_socket(), None);
        list().expect("chain dump (root?)");
        assert_eq!(session_socket(), None, "outside a session nothing is kept");
        with_session(|| {
            assert_eq!(session_socket(), Some(None), "opened on the first request");
            list().expect("chain dump");
            let first = session_socket().flatten().expect("kept");
            list().expect("chain dump");
            assert_eq!(session_socket().flatten(), Some(first), "the same socket");
            with_session(|| assert_eq!(session_socket(), Some(None), "a nested one is its own"));
            assert_eq!(session_socket().flatten(), Some(first));
        });
        assert_eq!(session_socket(), None, "closed with the session");
    }
}
