//! Single nfnetlink requests outside an nf_tables batch, in the calling thread's network
//! namespace: one message answered by an ACK or an error (ipset changes, which have no batches),
//! and dumps (ipset `LIST`, nf_tables `GET*`), each record handed back as its attribute bytes.
//! One socket per request; every answer must carry the request's sequence number. The batch
//! framing of nf_tables transactions is [`super::nft_batch`]'s; the headers are shared with it.

use netlink_packet_core::{
    Emitable, ErrorBuffer, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR,
    NetlinkBuffer, Nla,
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_NETFILTER};

use super::nft_batch::{
    BatchError, HEADER_LEN, NFGENMSG_LEN, REPLY_BUFFER, REPLY_TIMEOUT, push_header,
};

/// `NFNL_SUBSYS_IPSET`.
pub const NFNL_SUBSYS_IPSET: u16 = 6;
/// `NFNL_SUBSYS_NFTABLES`.
pub const NFNL_SUBSYS_NFTABLES: u16 = super::nft_batch::NFNL_SUBSYS_NFTABLES;
const SEQ: u32 = 1;

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

/// Frames and sends one message; refuses an attribute its 16-bit length cannot say.
fn send<A: Nla>(
    socket: &Socket,
    subsys: u16,
    kind: u16,
    flags: u16,
    family: u8,
    attrs: &[A],
    what: &str,
) -> Result<(), BatchError> {
    if let Some(attr) = attrs
        .iter()
        .find(|a| a.value_len() + 4 > usize::from(u16::MAX))
    {
        return Err(BatchError::AttrTooLong {
            what: what.to_string(),
            kind: attr.kind(),
            len: attr.value_len() + 4,
        });
    }
    let attrs_len = attrs.buffer_len();
    let mut request = Vec::with_capacity(HEADER_LEN + NFGENMSG_LEN + attrs_len);
    push_header(
        &mut request,
        (subsys << 8) | kind,
        NLM_F_REQUEST | flags,
        SEQ,
        family,
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
    mut on_record: impl FnMut(&[u8]),
) -> Result<(), BatchError> {
    let mut buf = vec![0u8; REPLY_BUFFER];
    loop {
        let n = socket.recv(&mut &mut buf[..], 0)?;
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
    let socket = open()?;
    send(
        &socket,
        subsys,
        kind,
        NLM_F_ACK | flags,
        family,
        attrs,
        what,
    )?;
    read_replies(&socket, what, |_| {})
}

/// Like [`request`], keeping the records answered before the ACK (a `GET_BYINDEX`'s).
pub fn query<A: Nla>(
    subsys: u16,
    kind: u16,
    family: u8,
    attrs: &[A],
    what: &str,
) -> Result<Vec<Vec<u8>>, BatchError> {
    records(subsys, kind, NLM_F_ACK, family, attrs, what)
}

/// One dump request; every record's attribute bytes, in the kernel's order.
pub fn dump<A: Nla>(
    subsys: u16,
    kind: u16,
    family: u8,
    attrs: &[A],
    what: &str,
) -> Result<Vec<Vec<u8>>, BatchError> {
    records(subsys, kind, NLM_F_DUMP, family, attrs, what)
}

/// Sends one message with `flags` and collects every record answered until its end.
fn records<A: Nla>(
    subsys: u16,
    kind: u16,
    flags: u16,
    family: u8,
    attrs: &[A],
    what: &str,
) -> Result<Vec<Vec<u8>>, BatchError> {
    let socket = open()?;
    send(&socket, subsys, kind, flags, family, attrs, what)?;
    let mut records = Vec::new();
    read_replies(&socket, what, |record| records.push(record.to_vec()))?;
    Ok(records)
}
