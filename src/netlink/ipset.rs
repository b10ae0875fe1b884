//! ipset over nfnetlink: the name of a set from the index the kernel keeps in `-m set` matches
//! (`IPSET_CMD_GET_BYINDEX`), so reading a rule back needs no `ipset` process. (Members and
//! whether a set exists: `apply::probe_set` over [`super::nfnl`].)

use netlink_packet_core::{DefaultNla, NLM_F_ACK, NlaBuffer, NlasIterator};

use super::nf_kernel::NFNL_SUBSYS_IPSET;
use super::nfnl::{self, Message};
use super::nft_batch::BatchError;

const IPSET_CMD_GET_BYINDEX: u16 = 15;
/// The protocol version the kernel's ipset speaks (`IPSET_PROTOCOL`).
const IPSET_PROTOCOL: u8 = 7;
const IPSET_ATTR_PROTOCOL: u16 = 1;
const IPSET_ATTR_SETNAME: u16 = 2;
const IPSET_ATTR_INDEX: u16 = 11;

/// The name of the set with kernel index `index` in the calling thread's netns; None when there
/// is none.
pub fn set_name(index: u16) -> Result<Option<String>, BatchError> {
    let attrs = [
        DefaultNla::new(IPSET_ATTR_PROTOCOL, vec![IPSET_PROTOCOL]),
        DefaultNla::new(IPSET_ATTR_INDEX, index.to_be_bytes().to_vec()),
    ];
    let what = format!("look up ipset index {index}");
    let family = libc::AF_INET as u8;
    let request = Message {
        subsys: NFNL_SUBSYS_IPSET,
        kind: IPSET_CMD_GET_BYINDEX,
        flags: NLM_F_ACK,
        family,
        attrs: &attrs,
        what: &what,
    };
    let records = match nfnl::records(&request) {
        Err(BatchError::Rejected { source, .. }) if source.raw_os_error() == Some(libc::ENOENT) => {
            return Ok(None);
        }
        other => other?,
    };
    for record in records {
        for attr in NlasIterator::new(record.as_slice()) {
            let attr: NlaBuffer<&[u8]> = attr.map_err(|e| BatchError::Malformed(Some(e)))?;
            if attr.kind() & 0x3fff == IPSET_ATTR_SETNAME {
                let name = String::from_utf8_lossy(attr.value());
                return Ok(Some(name.trim_end_matches('\0').to_string()));
            }
        }
    }
    Ok(None)
}
