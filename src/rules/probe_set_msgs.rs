//! The probe sets' netlink messages as a neutral description (message kind, flags, attribute
//! tree), and the inverse: the members a kernel dump record holds. Two encodings of the same
//! thing, an IP with the pod UID as comment: ipset over nfnetlink (`hash:ip` with comments, the
//! iptables backend) and nf_tables set elements (native nftables), whose comment is the
//! `NFTA_SET_ELEM_USERDATA` TLV that `nft` writes and reads. Pure: framing and sending is the
//! `netlink` room's, choosing the changes is `apply::probe_set`'s.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_packet_core::{DecodeError, NlaBuffer, NlasIterator};

use super::nf_kernel::NFTA_LIST_ELEM;
/// The set-element messages, named here beside their attributes for the transport's caller.
pub use super::nf_kernel::{NFT_MSG_DELSETELEM, NFT_MSG_GETSETELEM, NFT_MSG_NEWSETELEM};
use super::nla::{Attr, AttrTooLong, Attrs};

/// `IPSET_CMD_*` (`linux/netfilter/ipset/ip_set.h`), sent in the ipset nfnetlink subsystem.
pub const IPSET_CMD_LIST: u16 = 7;
pub const IPSET_CMD_ADD: u16 = 9;
pub const IPSET_CMD_DEL: u16 = 10;
/// Answers with the set's header, or ENOENT: whether a set exists, without its members.
pub const IPSET_CMD_HEADER: u16 = 12;
/// The protocol revision every ipset request carries (the kernel refuses requests without it).
const IPSET_PROTOCOL: u8 = 7;
const IPSET_ATTR_PROTOCOL: u16 = 1;
const IPSET_ATTR_SETNAME: u16 = 2;
const IPSET_ATTR_DATA: u16 = 7;
const IPSET_ATTR_ADT: u16 = 8;
const IPSET_ATTR_IP: u16 = 1;
const IPSET_ATTR_COMMENT: u16 = 26;
const IPSET_ATTR_IPADDR_IPV4: u16 = 1;
const IPSET_ATTR_IPADDR_IPV6: u16 = 2;
/// `NLA_F_NET_BYTEORDER`: ipset insists on it for addresses.
const NLA_F_NET_BYTEORDER: u16 = 0x4000;
/// The kernel's longest ipset comment (`IPSET_MAX_COMMENT_SIZE`).
const IPSET_MAX_COMMENT: usize = 255;

/// `NFTA_SET_ELEM_LIST_*`, `NFTA_SET_ELEM_*`, `NFTA_DATA_VALUE`.
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_USERDATA: u16 = 6;
const NFTA_DATA_VALUE: u16 = 1;
/// libnftnl's element comment TLV (`NFTNL_UDATA_SET_ELEM_COMMENT`): type, length, the string
/// with its NUL.
const UDATA_ELEM_COMMENT: u8 = 0;

/// A set member: its IP and comment (the pod UID; empty when there is none).
pub type Member = (IpAddr, String);

/// Why a dump record could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DecodeMemberError {
    #[error("malformed netlink attributes: {0}")]
    Attributes(#[from] DecodeError),
    #[error("a set member's address is {0} bytes long (neither IPv4 nor IPv6)")]
    Address(usize),
}

/// A comment goes into a bounded NUL-terminated string: quotes and backslashes are dropped (as
/// `nft` and `ipset restore` input would need), and it is cut at the kernel's limit.
fn comment_bytes(comment: &str) -> Vec<u8> {
    let mut bytes: Vec<u8> = comment
        .bytes()
        .filter(|b| *b != b'"' && *b != b'\\' && *b != 0)
        .take(IPSET_MAX_COMMENT - 1)
        .collect();
    bytes.push(0);
    bytes
}

fn ipset_head(set: &str) -> Attrs {
    Attrs::new()
        .bytes(IPSET_ATTR_PROTOCOL, &[IPSET_PROTOCOL])
        .string(IPSET_ATTR_SETNAME, set)
}

fn ipset_ip(ip: IpAddr) -> Attrs {
    match ip {
        IpAddr::V4(v4) => {
            Attrs::new().bytes(IPSET_ATTR_IPADDR_IPV4 | NLA_F_NET_BYTEORDER, &v4.octets())
        }
        IpAddr::V6(v6) => {
            Attrs::new().bytes(IPSET_ATTR_IPADDR_IPV6 | NLA_F_NET_BYTEORDER, &v6.octets())
        }
    }
}

/// `IPSET_CMD_ADD`'s attributes: `ip` with `comment`. Sent without `NLM_F_EXCL`, an existing
/// entry is kept and its comment replaced (what `ipset -exist add` does).
pub fn ipset_add(set: &str, ip: IpAddr, comment: &str) -> Result<Vec<Attr>, AttrTooLong> {
    let data = Attrs::new()
        .nested(IPSET_ATTR_IP, ipset_ip(ip))
        .bytes(IPSET_ATTR_COMMENT, &comment_bytes(comment));
    ipset_head(set).nested(IPSET_ATTR_DATA, data).done()
}

/// `IPSET_CMD_DEL`'s attributes. Without `NLM_F_EXCL` an absent entry is no error.
pub fn ipset_del(set: &str, ip: IpAddr) -> Result<Vec<Attr>, AttrTooLong> {
    let data = Attrs::new().nested(IPSET_ATTR_IP, ipset_ip(ip));
    ipset_head(set).nested(IPSET_ATTR_DATA, data).done()
}

/// `IPSET_CMD_LIST` (a dump) or `IPSET_CMD_HEADER` of one set.
pub fn ipset_named(set: &str) -> Result<Vec<Attr>, AttrTooLong> {
    ipset_head(set).done()
}

fn text(value: &[u8]) -> String {
    let end = value.iter().position(|b| *b == 0).unwrap_or(value.len());
    String::from_utf8_lossy(&value[..end]).into_owned()
}

fn address(value: &[u8]) -> Result<IpAddr, DecodeMemberError> {
    if let Ok(v4) = <[u8; 4]>::try_from(value) {
        return Ok(IpAddr::V4(Ipv4Addr::from(v4)));
    }
    <[u8; 16]>::try_from(value)
        .map(|v6| IpAddr::V6(Ipv6Addr::from(v6)))
        .map_err(|_| DecodeMemberError::Address(value.len()))
}

fn attrs(bytes: &[u8]) -> impl Iterator<Item = Result<NlaBuffer<&[u8]>, DecodeError>> {
    NlasIterator::new(bytes)
}

/// The members in one ipset `LIST` dump record (its attributes after the `nfgenmsg`): the
/// record carrying the set header has none; the others carry `IPSET_ATTR_ADT`, one
/// `IPSET_ATTR_DATA` per member.
pub fn ipset_members(record: &[u8]) -> Result<Vec<Member>, DecodeMemberError> {
    let mut members = Vec::new();
    for attr in attrs(record) {
        let attr = attr?;
        if attr.kind() != IPSET_ATTR_ADT {
            continue;
        }
        for data in attrs(attr.value()) {
            let data = data?;
            if data.kind() != IPSET_ATTR_DATA {
                continue;
            }
            let (mut ip, mut comment) = (None, String::new());
            for field in attrs(data.value()) {
                let field = field?;
                match field.kind() {
                    IPSET_ATTR_IP => {
                        for addr in attrs(field.value()) {
                            ip = Some(address(addr?.value())?);
                        }
                    }
                    IPSET_ATTR_COMMENT => comment = text(field.value()),
                    _ => {}
                }
            }
            members.extend(ip.map(|ip| (ip, comment)));
        }
    }
    Ok(members)
}

fn nft_list_head(table: &str, set: &str) -> Attrs {
    Attrs::new()
        .string(NFTA_SET_ELEM_LIST_TABLE, table)
        .string(NFTA_SET_ELEM_LIST_SET, set)
}

fn ip_bytes(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

/// The comment as `nft` stores it in an element's user data.
pub fn nft_comment_udata(comment: &str) -> Vec<u8> {
    let value = comment_bytes(comment);
    let mut udata = Vec::with_capacity(value.len() + 2);
    udata.push(UDATA_ELEM_COMMENT);
    udata.push(value.len() as u8);
    udata.extend_from_slice(&value);
    udata
}

/// The comment in an element's user data (empty without one; unknown TLVs are skipped).
pub fn nft_udata_comment(mut udata: &[u8]) -> String {
    while let [kind, len, rest @ ..] = udata {
        let len = usize::from(*len);
        let Some(value) = rest.get(..len) else {
            break;
        };
        if *kind == UDATA_ELEM_COMMENT {
            return text(value);
        }
        udata = &rest[len..];
    }
    String::new()
}

/// `NFT_MSG_NEWSETELEM` (with a comment) or `NFT_MSG_DELSETELEM` (`comment` None) of one element
/// of `table`'s `set`. A new element is sent with `NLM_F_CREATE` and without `NLM_F_EXCL`: one
/// already present is kept as it is (its comment too).
pub fn nft_element(
    table: &str,
    set: &str,
    ip: IpAddr,
    comment: Option<&str>,
) -> Result<Vec<Attr>, AttrTooLong> {
    let mut element = Attrs::new().nested(
        NFTA_SET_ELEM_KEY,
        Attrs::new().bytes(NFTA_DATA_VALUE, &ip_bytes(ip)),
    );
    if let Some(comment) = comment {
        element = element.bytes(NFTA_SET_ELEM_USERDATA, &nft_comment_udata(comment));
    }
    nft_list_head(table, set)
        .nested(
            NFTA_SET_ELEM_LIST_ELEMENTS,
            Attrs::new().nested(NFTA_LIST_ELEM, element),
        )
        .done()
}

/// `NFT_MSG_GETSETELEM`'s attributes (a dump of one set's elements).
pub fn nft_elements_of(table: &str, set: &str) -> Result<Vec<Attr>, AttrTooLong> {
    nft_list_head(table, set).done()
}

/// The members in one `NFT_MSG_NEWSETELEM` dump record (its attributes after the `nfgenmsg`).
pub fn nft_members(record: &[u8]) -> Result<Vec<Member>, DecodeMemberError> {
    let mut members = Vec::new();
    for attr in attrs(record) {
        let attr = attr?;
        if attr.kind() != NFTA_SET_ELEM_LIST_ELEMENTS {
            continue;
        }
        for element in attrs(attr.value()) {
            let element = element?;
            if element.kind() != NFTA_LIST_ELEM {
                continue;
            }
            let (mut ip, mut comment) = (None, String::new());
            for field in attrs(element.value()) {
                let field = field?;
                match field.kind() {
                    NFTA_SET_ELEM_KEY => {
                        for data in attrs(field.value()) {
                            let data = data?;
                            if data.kind() == NFTA_DATA_VALUE {
                                ip = Some(address(data.value())?);
                            }
                        }
                    }
                    NFTA_SET_ELEM_USERDATA => comment = nft_udata_comment(field.value()),
                    _ => {}
                }
            }
            members.extend(ip.map(|ip| (ip, comment)));
        }
    }
    Ok(members)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::nla::to_bytes;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_ipset_add_carries_protocol_name_and_a_nested_address_in_network_order() {
        let bytes = to_bytes(&ipset_add("s", ip("10.0.0.1"), "u").unwrap());
        assert_eq!(
            bytes,
            [
                5, 0, 1, 0, 7, 0, 0, 0, // protocol 7
                6, 0, 2, 0, b's', 0, 0, 0, // set name
                24, 0, 7, 0x80, // data (nested)
                12, 0, 1, 0x80, 8, 0, 1, 0x40, 10, 0, 0, 1, // ip { ipv4, net byte order }
                6, 0, 26, 0, b'u', 0, 0, 0, // comment
            ]
        );
    }

    #[test]
    fn the_nft_comment_is_libnftnl_s_tlv_and_reads_back() {
        assert_eq!(nft_comment_udata("ab"), [0, 3, b'a', b'b', 0]);
        assert_eq!(nft_udata_comment(&nft_comment_udata("uid-1")), "uid-1");
        // Another TLV first, and a truncated one: skipped, never a panic.
        assert_eq!(nft_udata_comment(&[9, 1, 7, 0, 2, b'x', 0]), "x");
        assert_eq!(nft_udata_comment(&[0, 9, b'x']), "");
        assert_eq!(nft_comment_udata("a\"b\\c"), [0, 4, b'a', b'b', b'c', 0]);
    }

    /// A dump record as the kernel sends it, built with the request encoder's own pieces.
    fn record(kind: u16, inner: u16, members: &[(&str, Option<&str>)], nft: bool) -> Vec<u8> {
        let mut list = Attrs::new();
        for (addr, comment) in members {
            let element = if nft {
                let e = Attrs::new().nested(
                    NFTA_SET_ELEM_KEY,
                    Attrs::new().bytes(NFTA_DATA_VALUE, &ip_bytes(ip(addr))),
                );
                match comment {
                    Some(c) => e.bytes(NFTA_SET_ELEM_USERDATA, &nft_comment_udata(c)),
                    None => e,
                }
            } else {
                let e = Attrs::new().nested(IPSET_ATTR_IP, ipset_ip(ip(addr)));
                match comment {
                    Some(c) => e.bytes(IPSET_ATTR_COMMENT, &comment_bytes(c)),
                    None => e,
                }
            };
            list.nested_in_place(inner, element);
        }
        to_bytes(
            &Attrs::new()
                .string(2, "s")
                .nested(kind, list)
                .done()
                .unwrap(),
        )
    }

    #[test]
    fn dump_records_decode_to_members() {
        let want = vec![
            (ip("10.0.0.1"), "a".to_string()),
            (ip("fd00::1"), String::new()),
        ];
        let members = [("10.0.0.1", Some("a")), ("fd00::1", None)];
        let ipset = record(IPSET_ATTR_ADT, IPSET_ATTR_DATA, &members, false);
        assert_eq!(ipset_members(&ipset).unwrap(), want);
        let nft = record(NFTA_SET_ELEM_LIST_ELEMENTS, NFTA_LIST_ELEM, &members, true);
        assert_eq!(nft_members(&nft).unwrap(), want);
        // The header record of an ipset dump has no members.
        assert!(
            ipset_members(&to_bytes(&ipset_named("s").unwrap()))
                .unwrap()
                .is_empty()
        );
        assert!(matches!(
            ipset_members(&[200, 0, 8, 0]),
            Err(DecodeMemberError::Attributes(_))
        ));
    }
}
