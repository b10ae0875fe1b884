//! The messages a drift heal adds to the encoding: rules put into chains that may exist already,
//! and the deletes (a rule by its handle, a chain's rules, a chain, a table) that iptables-nft
//! sends for `-D`, `-F`, `-X` and a table it removes. Pure, like the rest of the encoding.

use super::{
    Attrs, EncodeError, NftMessage, Unsupported, base_chain, builtin_hook, new_rule, new_table,
    new_user_chain,
};
use crate::rules::iptables::{RestoreStep, restore_steps};
use crate::rules::model::{Family, Rule, Table, is_builtin_chain};
use crate::rules::nf_kernel::{
    NFT_MSG_DELCHAIN, NFT_MSG_DELRULE, NFT_MSG_DELTABLE, NFTA_CHAIN_NAME, NFTA_CHAIN_TABLE,
    NFTA_RULE_CHAIN, NFTA_RULE_HANDLE, NFTA_RULE_TABLE, NFTA_TABLE_NAME,
};

/// [`super::encode`] for chains that may exist: a user chain for which `exists(table, chain)` is
/// true is not created (it is there, emptied earlier in the same transaction); every other chain
/// and every rule is encoded as for a fresh netns.
pub fn encode_onto(
    family: Family,
    rules: &[Rule],
    exists: &dyn Fn(Table, &str) -> bool,
) -> Result<Vec<NftMessage>, EncodeError> {
    let mut out = Vec::new();
    for (table, steps) in restore_steps(rules) {
        if !matches!(table, Table::Nat | Table::Raw | Table::Mangle) {
            return Err(Unsupported(format!("table {table}")).into());
        }
        let mut base_chains_created: Vec<&str> = Vec::new();
        for step in steps {
            match step {
                RestoreStep::NewChain(chain) if exists(table, chain) => {}
                RestoreStep::NewChain(chain) => {
                    out.push(new_table(family, table)?);
                    out.push(new_user_chain(family, table, chain)?);
                }
                RestoreStep::Rule(rule) => {
                    out.push(new_table(family, table)?);
                    if is_builtin_chain(&rule.chain)
                        && !base_chains_created.contains(&rule.chain.as_str())
                    {
                        let Some(hook) = builtin_hook(table, &rule.chain) else {
                            let what = format!("built-in chain {table}/{}", rule.chain);
                            return Err(Unsupported(what).into());
                        };
                        base_chains_created.push(&rule.chain);
                        out.push(base_chain(family, table, &rule.chain, hook)?);
                    }
                    out.push(new_rule(family, rule)?);
                }
            }
        }
    }
    Ok(out)
}

/// Deletes one rule by the handle the kernel gave it (`iptables -D` of that rule).
pub fn delete_rule(
    family: Family,
    table: &str,
    chain: &str,
    handle: u64,
) -> Result<NftMessage, EncodeError> {
    NftMessage::new(
        NFT_MSG_DELRULE,
        0,
        family,
        Attrs::new()
            .string(NFTA_RULE_TABLE, table)
            .string(NFTA_RULE_CHAIN, chain)
            .u64(NFTA_RULE_HANDLE, handle),
        format!("delete rule {handle} of {table}/{chain}"),
    )
}

/// Deletes every rule of a chain (`iptables -F`): a rule delete naming no handle.
pub fn flush_chain(family: Family, table: &str, chain: &str) -> Result<NftMessage, EncodeError> {
    NftMessage::new(
        NFT_MSG_DELRULE,
        0,
        family,
        Attrs::new()
            .string(NFTA_RULE_TABLE, table)
            .string(NFTA_RULE_CHAIN, chain),
        format!("flush chain {table}/{chain}"),
    )
}

/// Deletes a chain, which must hold no rule and be jumped to by none (`iptables -X`).
pub fn delete_chain(family: Family, table: &str, chain: &str) -> Result<NftMessage, EncodeError> {
    NftMessage::new(
        NFT_MSG_DELCHAIN,
        0,
        family,
        Attrs::new()
            .string(NFTA_CHAIN_TABLE, table)
            .string(NFTA_CHAIN_NAME, chain),
        format!("delete chain {table}/{chain}"),
    )
}

/// Deletes a table with whatever it holds.
pub fn delete_table(family: Family, table: &str) -> Result<NftMessage, EncodeError> {
    NftMessage::new(
        NFT_MSG_DELTABLE,
        0,
        family,
        Attrs::new().string(NFTA_TABLE_NAME, table),
        format!("delete table {table}"),
    )
}
