//! The nf_tables numbers of the kernel's netlink interface that the encoders and decoders of this
//! room share, each declared once under its kernel name (`linux/netfilter/nf_tables.h`,
//! `linux/netfilter.h`): message types, attribute numbers, registers, `meta` keys, `payload`
//! bases and verdict codes. A number only one encoder knows stays beside that encoder.

/// `enum nf_tables_msg_types`.
pub const NFT_MSG_NEWTABLE: u16 = 0;
pub const NFT_MSG_DELTABLE: u16 = 2;
pub const NFT_MSG_NEWCHAIN: u16 = 3;
pub const NFT_MSG_DELCHAIN: u16 = 5;
pub const NFT_MSG_NEWRULE: u16 = 6;
pub const NFT_MSG_DELRULE: u16 = 8;
pub const NFT_MSG_NEWSET: u16 = 9;
pub const NFT_MSG_NEWSETELEM: u16 = 12;
pub const NFT_MSG_GETSETELEM: u16 = 13;
pub const NFT_MSG_DELSETELEM: u16 = 14;

/// `NFPROTO_INET`: the family of every native table of ours.
pub const NFPROTO_INET: u8 = 1;

/// `NFTA_TABLE_*`, `NFTA_CHAIN_*`, `NFTA_RULE_*`.
pub const NFTA_TABLE_NAME: u16 = 1;
pub const NFTA_CHAIN_TABLE: u16 = 1;
pub const NFTA_CHAIN_NAME: u16 = 3;
pub const NFTA_RULE_TABLE: u16 = 1;
pub const NFTA_RULE_CHAIN: u16 = 2;
pub const NFTA_RULE_HANDLE: u16 = 3;
pub const NFTA_RULE_EXPRESSIONS: u16 = 4;
pub const NFTA_RULE_USERDATA: u16 = 7;
/// `NFTA_LIST_ELEM`: each entry of a nested list (expressions, set elements).
pub const NFTA_LIST_ELEM: u16 = 1;
/// `NFTA_EXPR_NAME`, `NFTA_EXPR_DATA`.
pub const NFTA_EXPR_NAME: u16 = 1;
pub const NFTA_EXPR_DATA: u16 = 2;

/// `NFT_REG_VERDICT`, and `NFT_REG_1`: the one data register the matches load into and compare.
pub const NFT_REG_VERDICT: u32 = 0;
pub const NFT_REG_1: u32 = 1;

/// `enum nft_cmp_ops`: equal, not equal.
pub const NFT_CMP_EQ: u32 = 0;
pub const NFT_CMP_NEQ: u32 = 1;

/// `enum nft_meta_keys`.
pub const NFT_META_MARK: u32 = 3;
pub const NFT_META_IIFNAME: u32 = 6;
pub const NFT_META_OIFNAME: u32 = 7;
pub const NFT_META_SKUID: u32 = 10;
pub const NFT_META_SKGID: u32 = 11;
pub const NFT_META_NFPROTO: u32 = 15;
pub const NFT_META_L4PROTO: u32 = 16;

/// `enum nft_payload_bases`: where a `payload` load starts.
pub const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
pub const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;

/// Verdict codes: `NF_DROP`, `NF_ACCEPT` and `enum nft_verdicts`.
pub const NF_DROP: i32 = 0;
pub const NF_ACCEPT: i32 = 1;
pub const NFT_JUMP: i32 = -3;
pub const NFT_GOTO: i32 = -4;
pub const NFT_RETURN: i32 = -5;

/// `NF_NAT_RANGE_MAP_IPS`, `NF_NAT_RANGE_PROTO_SPECIFIED` (`linux/netfilter/nf_nat.h`).
pub const NF_NAT_RANGE_MAP_IPS: u32 = 1;
pub const NF_NAT_RANGE_PROTO_SPECIFIED: u32 = 2;
