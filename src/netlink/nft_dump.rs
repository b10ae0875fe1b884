//! Reading nf_tables state over nfnetlink in the calling thread's network namespace: one dump
//! request (`NFT_MSG_GETCHAIN`, `NFT_MSG_GETRULE`) and its records, no process. What a record
//! means is not decided here: each comes back as its attribute bytes, for the rule engine's
//! decoder (`rules::iptables_nft_decode`) to read.

use netlink_packet_core::{
    DefaultNla, Emitable, ErrorBuffer, NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR,
    NetlinkBuffer, NlaBuffer, NlasIterator,
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_NETFILTER};

use super::nft_batch::{
    BatchError, HEADER_LEN, NFGENMSG_LEN, NFNL_SUBSYS_NFTABLES, REPLY_BUFFER, REPLY_TIMEOUT,
    name_attr, push_header,
};

/// The dump requests made here (`enum nf_tables_msg_types`).
#[derive(Debug, Clone, Copy)]
enum DumpMsg {
    GetChain = 4,
    GetRule = 7,
}

/// `NFTA_CHAIN_TABLE`, `NFTA_CHAIN_NAME`; `NFTA_RULE_TABLE`.
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_RULE_TABLE: u16 = 1;

/// The `(table, chain)` names of every nf_tables chain of one family (`AF_INET`/`AF_INET6`, 0 for
/// all) in the calling thread's network namespace. This is how an apply learns cheaply whether
/// iptables-nft already holds chains of ours.
pub fn list_chains(family: u8) -> Result<Vec<(String, String)>, BatchError> {
    let mut chains = Vec::new();
    for record in dump(DumpMsg::GetChain, family, &[], "list chains")? {
        chains.extend(chain_names(&record)?);
    }
    Ok(chains)
}

/// The rules of one table of one family, in each chain's order (the kernel dumps chain by chain,
/// rules in their order): each record's attributes (`NFTA_RULE_*`) as bytes. A missing table is
/// no rules.
pub fn dump_rules(family: u8, table: &str) -> Result<Vec<Vec<u8>>, BatchError> {
    let filter = [name_attr(NFTA_RULE_TABLE, table)];
    match dump(
        DumpMsg::GetRule,
        family,
        &filter,
        &format!("list rules of table {table}"),
    ) {
        Err(BatchError::Rejected { source, .. }) if source.raw_os_error() == Some(libc::ENOENT) => {
            Ok(Vec::new())
        }
        other => other,
    }
}

fn dump(
    msg: DumpMsg,
    family: u8,
    attrs: &[DefaultNla],
    what: &str,
) -> Result<Vec<Vec<u8>>, BatchError> {
    let kind = (NFNL_SUBSYS_NFTABLES << 8) | msg as u16;
    converse(kind, NLM_F_DUMP, family, attrs, what)
}

/// One nfnetlink request on a fresh socket and every record it is answered with, until
/// `NLMSG_DONE` (a dump) or the acknowledgement (`NLM_F_ACK` in `flags`).
pub(super) fn converse(
    kind: u16,
    flags: u16,
    family: u8,
    attrs: &[DefaultNla],
    what: &str,
) -> Result<Vec<Vec<u8>>, BatchError> {
    const DUMP_SEQ: u32 = 1;
    let mut socket = Socket::new(NETLINK_NETFILTER)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    nix::sys::socket::setsockopt(
        &socket,
        nix::sys::socket::sockopt::ReceiveTimeout,
        &nix::sys::time::TimeVal::new(REPLY_TIMEOUT.as_secs() as i64, 0),
    )
    .map_err(std::io::Error::from)?;
    let attrs_len = Emitable::buffer_len(&attrs);
    let mut request = Vec::with_capacity(HEADER_LEN + NFGENMSG_LEN + attrs_len);
    push_header(
        &mut request,
        kind,
        NLM_F_REQUEST | flags,
        DUMP_SEQ,
        family,
        0,
        attrs_len,
    );
    let at = request.len();
    request.resize(at + attrs_len, 0);
    Emitable::emit(&attrs, &mut request[at..]);
    socket.send(&request, 0)?;
    let mut records = Vec::new();
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
            if reply.sequence_number() != DUMP_SEQ {
                return Err(BatchError::Malformed(None));
            }
            let body = reply.payload();
            match reply.message_type() {
                NLMSG_DONE => return Ok(records),
                NLMSG_ERROR if body.len() >= 4 => {
                    return match ErrorBuffer::new(body).code() {
                        Some(code) => Err(BatchError::Rejected {
                            what: what.to_string(),
                            source: std::io::Error::from_raw_os_error(-code.get()),
                        }),
                        None => Ok(records),
                    };
                }
                _ if body.len() >= NFGENMSG_LEN => records.push(body[NFGENMSG_LEN..].to_vec()),
                _ => {}
            }
            offset += (reply.length() as usize).next_multiple_of(4);
        }
    }
}

/// Table and chain name from the attributes of one `NFT_MSG_NEWCHAIN` dump record.
fn chain_names(attrs: &[u8]) -> Result<Option<(String, String)>, BatchError> {
    let (mut table, mut name) = (None, None);
    for attr in NlasIterator::new(attrs) {
        let attr: NlaBuffer<&[u8]> = attr.map_err(|e| BatchError::Malformed(Some(e)))?;
        let text = || {
            String::from_utf8_lossy(attr.value())
                .trim_end_matches('\0')
                .to_string()
        };
        match attr.kind() {
            NFTA_CHAIN_TABLE => table = Some(text()),
            NFTA_CHAIN_NAME => name = Some(text()),
            _ => {}
        }
    }
    Ok(table.zip(name))
}
