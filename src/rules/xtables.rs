//! The xtables extension structs iptables-nft hands the kernel inside nf_tables `match`/`target`
//! expressions, laid out byte for byte as iptables 1.8.9 fills them (native byte order, as the
//! kernel's `struct`s are). Pure: only bytes.

use super::model::Family;

/// `XT_OWNER_UID` / `XT_OWNER_GID`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnerKind {
    Uid = 1,
    Gid = 2,
}

/// `-m owner --uid-owner`/`--gid-owner ID`, revision 1: `struct xt_owner_match_info`
/// (uid range, gid range, match, invert; 24 bytes).
pub fn owner_info(kind: OwnerKind, id: u32, negate: bool) -> Vec<u8> {
    let mut info = Vec::with_capacity(24);
    let (uid_range, gid_range) = match kind {
        OwnerKind::Uid => (id, 0),
        OwnerKind::Gid => (0, id),
    };
    for v in [uid_range, uid_range, gid_range, gid_range] {
        info.extend_from_slice(&v.to_ne_bytes());
    }
    info.push(kind as u8);
    info.push(if negate { kind as u8 } else { 0 });
    info.resize(24, 0);
    info
}

/// The most ports one `-m multiport` match holds (`XT_MULTI_PORTS`).
pub const MULTIPORT_MAX: usize = 15;

/// `-m multiport --dports a,b,...` (single ports, at most [`MULTIPORT_MAX`]), revision 1:
/// `struct xt_multiport_v1` — flags, count, ports, range markers (none here), invert.
pub fn multiport_dst_info(ports: &[u16], negate: bool) -> Vec<u8> {
    const XT_MULTIPORT_DESTINATION: u8 = 1;
    let mut info = vec![0u8; 2 + 2 * MULTIPORT_MAX + MULTIPORT_MAX + 1];
    info[0] = XT_MULTIPORT_DESTINATION;
    info[1] = ports.len() as u8;
    for (i, port) in ports.iter().take(MULTIPORT_MAX).enumerate() {
        info[2 + 2 * i..4 + 2 * i].copy_from_slice(&port.to_ne_bytes());
    }
    info[2 + 3 * MULTIPORT_MAX] = u8::from(negate);
    info
}

/// `-j REDIRECT --to-ports PORT`, revision 0: IPv4 takes `nf_nat_ipv4_multi_range_compat`, IPv6
/// `nf_nat_range`; both with only the port range set.
pub fn redirect_info(family: Family, port: u16) -> Vec<u8> {
    const NF_NAT_RANGE_PROTO_SPECIFIED: u32 = 2;
    let port = port.to_be_bytes();
    let mut info = Vec::new();
    match family {
        Family::V4 => {
            info.extend_from_slice(&1u32.to_ne_bytes());
            info.extend_from_slice(&NF_NAT_RANGE_PROTO_SPECIFIED.to_ne_bytes());
            info.extend_from_slice(&[0; 8]);
            info.extend_from_slice(&port);
            info.extend_from_slice(&port);
            info.resize(24, 0);
        }
        Family::V6 => {
            info.extend_from_slice(&NF_NAT_RANGE_PROTO_SPECIFIED.to_ne_bytes());
            info.extend_from_slice(&[0; 32]);
            info.extend_from_slice(&port);
            info.extend_from_slice(&port);
        }
    }
    info
}

/// `-j CT --zone ZONE`, revision 2: `struct xt_ct_target_info_v1` with only the zone set (the
/// trailing kernel pointer included: 72 bytes).
pub fn ct_zone_info(zone: u16) -> Vec<u8> {
    let mut info = vec![0u8; 72];
    info[2..4].copy_from_slice(&zone.to_ne_bytes());
    info
}

/// `-m connmark --mark MARK/MASK`, revision 1: `struct xt_connmark_mtinfo1` (mark, mask, invert;
/// padded to 16 bytes).
pub fn connmark_match_info(mark: u32, mask: u32) -> Vec<u8> {
    let mut info = Vec::with_capacity(16);
    info.extend_from_slice(&mark.to_ne_bytes());
    info.extend_from_slice(&mask.to_ne_bytes());
    info.resize(16, 0);
    info
}

/// What a CONNMARK target does (`XT_CONNMARK_SET` / `_RESTORE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnmarkMode {
    Set = 0,
    Restore = 2,
}

/// `-j CONNMARK`, revision 2: `struct xt_connmark_tginfo2` (ctmark, ctmask, nfmask, shift
/// direction and bits, mode; 16 bytes). iptables starts both masks at all ones; `--set-xmark`
/// sets the ctmark and ctmask, `--restore-mark` keeps the defaults.
pub fn connmark_target_info(mode: ConnmarkMode, ctmark: u32, ctmask: u32) -> Vec<u8> {
    let mut info = Vec::with_capacity(16);
    for v in [ctmark, ctmask, u32::MAX] {
        info.extend_from_slice(&v.to_ne_bytes());
    }
    info.extend_from_slice(&[0, 0, mode as u8]);
    info.resize(16, 0);
    info
}

/// A bare `-m tcp` (no options), revision 0: `struct xt_tcp` with both port ranges 0-65535.
pub fn tcp_any_port_info() -> Vec<u8> {
    let mut info = Vec::with_capacity(16);
    for v in [0u16, u16::MAX, 0, u16::MAX] {
        info.extend_from_slice(&v.to_ne_bytes());
    }
    info.resize(16, 0);
    info
}

#[cfg(test)]
mod tests {
    use super::*;

    // Bytes iptables-nft-restore 1.8.9 sent for the ambient in-pod rules (captured with
    // `strace -e write=3` on x86_64, little endian).

    #[test]
    fn connmark_structs_are_laid_out_as_iptables_fills_them() {
        let hex = |v: Vec<u8>| {
            v.iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(
            hex(connmark_target_info(ConnmarkMode::Set, 0x111, 0xfff)),
            "11 01 00 00 ff 0f 00 00 ff ff ff ff 00 00 00 00"
        );
        assert_eq!(
            hex(connmark_target_info(ConnmarkMode::Restore, 0, u32::MAX)),
            "00 00 00 00 ff ff ff ff ff ff ff ff 00 00 02 00"
        );
        assert_eq!(
            hex(connmark_match_info(0x111, 0xfff)),
            "11 01 00 00 ff 0f 00 00 00 00 00 00 00 00 00 00"
        );
        assert_eq!(
            hex(tcp_any_port_info()),
            "00 00 ff ff 00 00 ff ff 00 00 00 00 00 00 00 00"
        );
    }
}
