//! The xtables extension structs iptables-nft hands the kernel inside nf_tables `match`/`target`
//! expressions, laid out byte for byte as iptables 1.8.9 fills them (native byte order, as the
//! kernel's `struct`s are). Pure: only bytes.

use super::model::Family;

use super::model::OwnerKind;
use super::nf_kernel::NF_NAT_RANGE_PROTO_SPECIFIED;

/// The `XT_OWNER_UID` / `XT_OWNER_GID` flag of an owner kind.
fn owner_flag(kind: OwnerKind) -> u8 {
    match kind {
        OwnerKind::Uid => 1,
        OwnerKind::Gid => 2,
    }
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
    info.push(owner_flag(kind));
    info.push(if negate { owner_flag(kind) } else { 0 });
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

/// What the decoder reads back from an xtables struct: the inverse of the layouts above, plus
/// the structs iptables-nft-restore fills for rules the encoder leaves to it (socket owner,
/// conntrack state, ipset, MARK, TPROXY, SNAT, CONNMARK save). None when the bytes hold anything
/// a rule of the model cannot say (a range, a flag, another mode): such a rule is foreign.
pub mod read {
    use super::{ConnmarkMode, Family, MULTIPORT_MAX, OwnerKind};
    use crate::rules::nf_kernel::{NF_NAT_RANGE_MAP_IPS, NF_NAT_RANGE_PROTO_SPECIFIED};
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    fn u32_at(info: &[u8], at: usize) -> Option<u32> {
        Some(u32::from_ne_bytes(info.get(at..at + 4)?.try_into().ok()?))
    }
    fn u16_at(info: &[u8], at: usize) -> Option<u16> {
        Some(u16::from_ne_bytes(info.get(at..at + 2)?.try_into().ok()?))
    }
    fn be16_at(info: &[u8], at: usize) -> Option<u16> {
        Some(u16::from_be_bytes(info.get(at..at + 2)?.try_into().ok()?))
    }
    fn zero(info: &[u8], from: usize) -> bool {
        info.get(from..)
            .is_some_and(|rest| rest.iter().all(|b| *b == 0))
    }

    /// An owner match: by id, or `--socket-exists`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Owner {
        Id {
            kind: OwnerKind,
            id: u32,
            negate: bool,
        },
        SocketExists,
    }

    /// `struct xt_owner_match_info` (revision 1).
    pub fn owner(info: &[u8]) -> Option<Owner> {
        const XT_OWNER_SOCKET: u8 = 4;
        if info.len() != 24 || !zero(info, 18) {
            return None;
        }
        let (uid_min, uid_max) = (u32_at(info, 0)?, u32_at(info, 4)?);
        let (gid_min, gid_max) = (u32_at(info, 8)?, u32_at(info, 12)?);
        let (matched, invert) = (info[16], info[17]);
        let negate = match invert {
            0 => false,
            i if i == matched => true,
            _ => return None,
        };
        match matched {
            XT_OWNER_SOCKET if !negate && [uid_min, uid_max, gid_min, gid_max] == [0; 4] => {
                Some(Owner::SocketExists)
            }
            1 if uid_min == uid_max && gid_min == 0 && gid_max == 0 => Some(Owner::Id {
                kind: OwnerKind::Uid,
                id: uid_min,
                negate,
            }),
            2 if gid_min == gid_max && uid_min == 0 && uid_max == 0 => Some(Owner::Id {
                kind: OwnerKind::Gid,
                id: gid_min,
                negate,
            }),
            _ => None,
        }
    }

    /// `struct xt_multiport_v1`, destination ports only, no ranges: the ports and the invert.
    pub fn multiport_dst(info: &[u8]) -> Option<(Vec<u16>, bool)> {
        if info.len() != 2 + 3 * MULTIPORT_MAX + 1 || info[0] != 1 {
            return None;
        }
        let count = usize::from(info[1]);
        let ranges = &info[2 + 2 * MULTIPORT_MAX..2 + 3 * MULTIPORT_MAX];
        if count == 0 || count > MULTIPORT_MAX || ranges.iter().any(|r| *r != 0) {
            return None;
        }
        let ports = (0..count)
            .map(|i| u16_at(info, 2 + 2 * i))
            .collect::<Option<Vec<u16>>>()?;
        let negate = match info[2 + 3 * MULTIPORT_MAX] {
            0 => false,
            1 => true,
            _ => return None,
        };
        Some((ports, negate))
    }

    /// `REDIRECT` (revision 0) to one port, in `family`'s layout.
    pub fn redirect(family: Family, info: &[u8]) -> Option<u16> {
        let (flags_at, port_at, len) = match family {
            Family::V4 if u32_at(info, 0)? == 1 => (4, 16, 24),
            Family::V4 => return None,
            Family::V6 => (0, 36, 40),
        };
        let min = be16_at(info, port_at)?;
        let plain = info.len() == len
            && u32_at(info, flags_at)? == NF_NAT_RANGE_PROTO_SPECIFIED
            && info[flags_at + 4..port_at].iter().all(|b| *b == 0)
            && be16_at(info, port_at + 2)? == min
            && zero(info, port_at + 4);
        plain.then_some(min)
    }

    /// `SNAT --to-source ADDR` (IPv4 revision 0, IPv6 revision 1): one address, no ports.
    pub fn snat(family: Family, info: &[u8]) -> Option<IpAddr> {
        match family {
            Family::V4 => {
                let single = info.len() == 24
                    && u32_at(info, 0)? == 1
                    && u32_at(info, 4)? == NF_NAT_RANGE_MAP_IPS
                    && info[8..12] == info[12..16]
                    && zero(info, 16);
                let octets: [u8; 4] = info.get(8..12)?.try_into().ok()?;
                single.then(|| IpAddr::V4(Ipv4Addr::from(octets)))
            }
            Family::V6 => {
                let single = info.len() == 40
                    && u32_at(info, 0)? == NF_NAT_RANGE_MAP_IPS
                    && info[4..20] == info[20..36]
                    && zero(info, 36);
                let octets: [u8; 16] = info.get(4..20)?.try_into().ok()?;
                single.then(|| IpAddr::V6(Ipv6Addr::from(octets)))
            }
        }
    }

    /// `CT --zone ZONE` (revision 2) and nothing else.
    pub fn ct_zone(info: &[u8]) -> Option<u16> {
        let zone = u16_at(info, 2)?;
        (info.len() == 72 && info[..2] == [0, 0] && zero(info, 4)).then_some(zone)
    }

    /// `-m connmark --mark MARK/MASK` (revision 1), not inverted.
    pub fn connmark_match(info: &[u8]) -> Option<(u32, u32)> {
        (info.len() == 16 && zero(info, 8)).then_some((u32_at(info, 0)?, u32_at(info, 4)?))
    }

    /// What a `CONNMARK` target (revision 2) does.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Connmark {
        SetXmark { ctmark: u32, ctmask: u32 },
        Save,
        Restore,
    }

    /// `struct xt_connmark_tginfo2`: set-xmark (nfmask all ones), or save/restore with every
    /// mask all ones; no shift.
    pub fn connmark_target(info: &[u8]) -> Option<Connmark> {
        const SAVE: u8 = 1;
        let (ctmark, ctmask, nfmask) = (u32_at(info, 0)?, u32_at(info, 4)?, u32_at(info, 8)?);
        if info.len() != 16 || nfmask != u32::MAX || info[12..14] != [0, 0] || !zero(info, 15) {
            return None;
        }
        match info[14] {
            m if m == ConnmarkMode::Set as u8 => Some(Connmark::SetXmark { ctmark, ctmask }),
            SAVE if ctmark == 0 && ctmask == u32::MAX => Some(Connmark::Save),
            m if m == ConnmarkMode::Restore as u8 && ctmark == 0 && ctmask == u32::MAX => {
                Some(Connmark::Restore)
            }
            _ => None,
        }
    }

    /// A bare `-m tcp`: both port ranges whole, no flags or options.
    pub fn tcp_any_port(info: &[u8]) -> bool {
        info == super::tcp_any_port_info().as_slice()
    }

    /// `MARK` (revision 2): `struct xt_mark_tginfo2` (mark, mask).
    pub fn mark_target(info: &[u8]) -> Option<(u32, u32)> {
        (info.len() == 8).then_some((u32_at(info, 0)?, u32_at(info, 4)?))
    }

    /// `TPROXY` (revision 1): `struct xt_tproxy_target_info_v1` with no local address — mark
    /// value, mark mask and the port (26 bytes, padded to the xtables alignment).
    pub fn tproxy(info: &[u8]) -> Option<(u32, u32, u16)> {
        let (mask, value) = (u32_at(info, 0)?, u32_at(info, 4)?);
        let port = be16_at(info, 24)?;
        let plain = (26..=32).contains(&info.len()) && zero(&info[..24], 8) && zero(info, 26);
        plain.then_some((value, mask, port))
    }

    /// The states of `-m conntrack --ctstate A,B` (revision 3), as the kernel's bit mask, when
    /// that is all the match checks.
    pub fn conntrack_states(info: &[u8]) -> Option<u16> {
        const XT_CONNTRACK_STATE: u16 = 1;
        const MATCH_FLAGS_AT: usize = 146;
        let flags = u16_at(info, MATCH_FLAGS_AT)?;
        let invert = u16_at(info, MATCH_FLAGS_AT + 2)?;
        let states = u16_at(info, MATCH_FLAGS_AT + 4)?;
        let only_states = flags == XT_CONNTRACK_STATE
            && invert == 0
            && zero(&info[..MATCH_FLAGS_AT], 0)
            && zero(info, MATCH_FLAGS_AT + 6);
        only_states.then_some(states)
    }

    /// `-m set --match-set NAME src|dst` (revision 4): the set's kernel index and whether the
    /// source address is matched; no counters, no flags.
    pub fn set_match(info: &[u8]) -> Option<(u16, bool)> {
        const SRC: u8 = 1;
        let index = u16_at(info, 0)?;
        let (dim, flags) = (*info.get(2)?, *info.get(3)?);
        if dim != 1 || flags & !SRC != 0 || !zero(info, 4) {
            return None;
        }
        Some((index, flags == SRC))
    }
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
