//! The nfnetlink and nf_tables numbers this room's requests carry, each declared once under its
//! kernel name (`linux/netfilter/nfnetlink.h`, `linux/netfilter/nf_tables.h`). The messages a
//! caller describes carry their own numbers; these are the ones the transport writes itself.
//! The rule room may not import the transport (nor it the rule room), so the few numbers both
//! write are declared in `rules::nf_kernel` too; the room test holds the two equal.

/// `NFNL_SUBSYS_IPSET`, `NFNL_SUBSYS_NFTABLES`: the subsystem in a message type's high byte.
pub const NFNL_SUBSYS_IPSET: u16 = 6;
pub const NFNL_SUBSYS_NFTABLES: u16 = 10;
/// `NFNL_MSG_BATCH_BEGIN`, `NFNL_MSG_BATCH_END`: the frame around an nf_tables transaction.
pub const NFNL_MSG_BATCH_BEGIN: u16 = 16;
pub const NFNL_MSG_BATCH_END: u16 = 17;

/// The nf_tables requests made here (`enum nf_tables_msg_types`): the dumps and the deletes.
pub const NFT_MSG_GETTABLE: u16 = 1;
pub const NFT_MSG_DELTABLE: u16 = 2;
pub const NFT_MSG_GETCHAIN: u16 = 4;
pub const NFT_MSG_DELCHAIN: u16 = 5;
pub const NFT_MSG_GETRULE: u16 = 7;
pub const NFT_MSG_GETSET: u16 = 10;
pub const NFT_MSG_GETSETELEM: u16 = 13;

/// `NFTA_TABLE_NAME`; `NFTA_CHAIN_TABLE`, `NFTA_CHAIN_NAME`, `NFTA_CHAIN_POLICY`;
/// `NFTA_RULE_TABLE`; `NFTA_SET_ELEM_LIST_TABLE`, `NFTA_SET_ELEM_LIST_SET`.
pub const NFTA_TABLE_NAME: u16 = 1;
pub const NFTA_CHAIN_TABLE: u16 = 1;
pub const NFTA_CHAIN_NAME: u16 = 3;
pub const NFTA_CHAIN_POLICY: u16 = 5;
pub const NFTA_RULE_TABLE: u16 = 1;
pub const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
pub const NFTA_SET_ELEM_LIST_SET: u16 = 2;
