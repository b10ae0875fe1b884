//! Reading nf_tables state over nfnetlink in the calling thread's network namespace: one dump
//! request (`NFT_MSG_GETTABLE`, `GETCHAIN`, `GETRULE`, `GETSET`, `GETSETELEM`) and its records,
//! no process. What a record
//! means is not decided here: each comes back as its attribute bytes, for the rule engine's
//! decoder (`rules::iptables_nft_decode`) to read.

use netlink_packet_core::{DefaultNla, NlaBuffer, NlasIterator};

use super::nf_kernel::{
    NFNL_SUBSYS_NFTABLES, NFT_MSG_GETCHAIN, NFT_MSG_GETRULE, NFT_MSG_GETSET, NFT_MSG_GETSETELEM,
    NFT_MSG_GETTABLE, NFTA_CHAIN_NAME, NFTA_CHAIN_POLICY, NFTA_CHAIN_TABLE, NFTA_RULE_TABLE,
    NFTA_SET_ELEM_LIST_SET, NFTA_SET_ELEM_LIST_TABLE,
};
use super::nft_batch::{BatchError, name_attr};

/// The `(table, chain)` names of every nf_tables chain of one family (`AF_INET`/`AF_INET6`, 0 for
/// all) in the calling thread's network namespace. This is how an apply learns cheaply whether
/// iptables-nft already holds chains of ours.
pub fn list_chains(family: u8) -> Result<Vec<(String, String)>, BatchError> {
    Ok(list_chains_with_policy(family)?
        .into_iter()
        .map(|(table, chain, _)| (table, chain))
        .collect())
}

/// [`list_chains`] with each chain's policy verdict (`NF_ACCEPT` is 1), which only base chains
/// have: whether a built-in chain left without rules still decides a packet's fate.
pub fn list_chains_with_policy(
    family: u8,
) -> Result<Vec<(String, String, Option<u32>)>, BatchError> {
    let mut chains = Vec::new();
    for record in dump(NFT_MSG_GETCHAIN, family, &[], "list chains")? {
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
        NFT_MSG_GETRULE,
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

/// Every table, chain (with its hook) and set record of one family, for a decoder: what a read of
/// a whole ruleset needs besides the rules.
pub fn dump_layout(family: u8) -> Result<Layout, BatchError> {
    Ok(Layout {
        tables: dump(NFT_MSG_GETTABLE, family, &[], "list tables")?,
        chains: dump(NFT_MSG_GETCHAIN, family, &[], "list chains")?,
        sets: dump(NFT_MSG_GETSET, family, &[], "list sets")?,
    })
}

/// Raw records of [`dump_layout`] (`NFTA_TABLE_*`, `NFTA_CHAIN_*`, `NFTA_SET_*` attributes).
#[derive(Debug, Clone, Default)]
pub struct Layout {
    pub tables: Vec<Vec<u8>>,
    pub chains: Vec<Vec<u8>>,
    pub sets: Vec<Vec<u8>>,
}

/// The element records (`NFTA_SET_ELEM_LIST_*`) of one set of one table.
pub fn dump_set_elements(family: u8, table: &str, set: &str) -> Result<Vec<Vec<u8>>, BatchError> {
    let filter = [
        name_attr(NFTA_SET_ELEM_LIST_TABLE, table),
        name_attr(NFTA_SET_ELEM_LIST_SET, set),
    ];
    dump(
        NFT_MSG_GETSETELEM,
        family,
        &filter,
        &format!("list elements of set {set} in table {table}"),
    )
}

fn dump(
    msg: u16,
    family: u8,
    attrs: &[DefaultNla],
    what: &str,
) -> Result<Vec<Vec<u8>>, BatchError> {
    super::nfnl::dump(NFNL_SUBSYS_NFTABLES, msg, family, attrs, what)
}

/// Table, chain name and policy from the attributes of one `NFT_MSG_NEWCHAIN` dump record.
fn chain_names(attrs: &[u8]) -> Result<Option<(String, String, Option<u32>)>, BatchError> {
    let (mut table, mut name, mut policy) = (None, None, None);
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
            NFTA_CHAIN_POLICY => {
                policy = <[u8; 4]>::try_from(attr.value())
                    .ok()
                    .map(u32::from_be_bytes)
            }
            _ => {}
        }
    }
    Ok(table.zip(name).map(|(t, n)| (t, n, policy)))
}
