//! A tiny nfnetlink query: does this network namespace hold any nftables table? A fresh pod
//! namespace has none, which lets `istio-iptables` hand over to `iptables-restore` directly.

use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_NETFILTER};

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_GETTABLE: u16 = 1;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const HEADER_LEN: usize = 16;

/// Counts the nftables tables (all families) in the calling thread's network namespace.
pub fn table_count() -> std::io::Result<usize> {
    let mut socket = Socket::new(NETLINK_NETFILTER)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    // nlmsghdr + nfgenmsg { family: unspec, version: 0, res_id: 0 }.
    let mut request = Vec::with_capacity(HEADER_LEN + 4);
    request.extend_from_slice(&((HEADER_LEN + 4) as u32).to_ne_bytes());
    request.extend_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETTABLE).to_ne_bytes());
    request.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    request.extend_from_slice(&1u32.to_ne_bytes());
    request.extend_from_slice(&0u32.to_ne_bytes());
    request.extend_from_slice(&[0, 0, 0, 0]);
    socket.send(&request, 0)?;

    let mut tables = 0;
    let mut buf = vec![0u8; 16384];
    loop {
        let n = socket.recv(&mut &mut buf[..], 0)?;
        if n == 0 {
            return Err(std::io::Error::other("netlink: empty reply"));
        }
        let mut offset = 0;
        while offset + HEADER_LEN <= n {
            let field = |at: usize, len: usize| &buf[offset + at..offset + at + len];
            let len = u32::from_ne_bytes(field(0, 4).try_into().unwrap_or_default()) as usize;
            let kind = u16::from_ne_bytes(field(4, 2).try_into().unwrap_or_default());
            match kind {
                NLMSG_DONE => return Ok(tables),
                NLMSG_ERROR => {
                    let code =
                        i32::from_ne_bytes(field(HEADER_LEN, 4).try_into().unwrap_or_default());
                    return if code == 0 {
                        Ok(tables)
                    } else {
                        Err(std::io::Error::from_raw_os_error(-code))
                    };
                }
                k if k == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWTABLE => tables += 1,
                _ => {}
            }
            if len < HEADER_LEN {
                return Err(std::io::Error::other("netlink: malformed message"));
            }
            // Messages are 4-byte aligned.
            offset += (len + 3) & !3;
        }
    }
}
