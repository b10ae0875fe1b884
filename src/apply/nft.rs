//! Applying a native nftables transaction over nfnetlink (atomic: the whole transaction or
//! nothing), encoded by [`crate::rules::nft_encode`], and reading our tables back as typed rules
//! over nfnetlink ([`read_native_netlink`], decoded by [`crate::rules::nft_kernel_decode`]),
//! compared with what a transaction leaves ([`crate::rules::nft_decode::expected`]). No `nft`
//! process is started: a host or image without nft (or with one that cannot talk to this
//! kernel) is served the same. The ambient in-pod and host checks and the sidecar verify all go
//! through [`super::rule_backend::NativeNft`].

use super::exec::Executor;
use super::iptables::ApplyError;
use crate::netlink::nft_batch::{BatchError, Transaction};
use crate::netlink::nft_dump;
use crate::rules::nf_kernel::NFPROTO_INET;
use crate::rules::nft_decode::NativeState;
use crate::rules::nft_encode::{NftStep, NftTransaction, encode};
use crate::rules::nft_kernel_decode::{
    AnonSets, anonymous_sets, decode_kernel, element_keys, table_names,
};
use crate::rules::nft_model::{NftExpr, OwnerKind};

/// Sends one transaction as one nf_tables batch in the calling thread's network namespace (from a
/// forked child inside the owning user namespace when `exec` enters one).
pub fn apply_transaction(exec: &mut dyn Executor, tx: &NftTransaction) -> Result<(), ApplyError> {
    if tx.is_empty() {
        return Ok(());
    }
    let resolved = with_owner_ids(tx)?;
    let messages = encode(resolved.as_ref().unwrap_or(tx))
        .map_err(|e| ApplyError::NftEncode(e.to_string()))?;
    let netlink = |source: BatchError| ApplyError::Netlink {
        what: "apply the nftables transaction".into(),
        source,
    };
    let mut batch = Transaction::new();
    for m in messages {
        batch
            .push(m.kind, m.flags, NFPROTO_INET, &m.attrs, m.what)
            .map_err(netlink)?;
    }
    match exec.userns() {
        Some(entry) => batch.send_entering(entry),
        None => batch.send(),
    }
    .map_err(netlink)
}

/// `tx` with every owner given by name (`skgid java`) as its number, looked up in the user and
/// group databases as nft does; None when no owner is named (the usual case: nothing copied).
fn with_owner_ids(tx: &NftTransaction) -> Result<Option<NftTransaction>, ApplyError> {
    let named = |e: &NftExpr| matches!(e, NftExpr::Owner { id, .. } if id.parse::<u32>().is_err());
    let any = tx.steps.iter().any(|s| match s {
        NftStep::Replace { set, .. } => set.rules.iter().any(|r| r.exprs.iter().any(named)),
        _ => false,
    });
    if !any {
        return Ok(None);
    }
    let mut out = tx.clone();
    for step in &mut out.steps {
        let NftStep::Replace { set, .. } = step else {
            continue;
        };
        for expr in set.rules.iter_mut().flat_map(|r| r.exprs.iter_mut()) {
            if let NftExpr::Owner { key, id, .. } = expr
                && id.parse::<u32>().is_err()
            {
                *id = owner_id(*key, id)?.to_string();
            }
        }
    }
    Ok(Some(out))
}

fn owner_id(key: OwnerKind, name: &str) -> Result<u32, ApplyError> {
    use nix::unistd::{Group, User};
    let (what, found) = match key {
        OwnerKind::Uid => (
            "user",
            User::from_name(name).map(|u| u.map(|u| u.uid.as_raw())),
        ),
        OwnerKind::Gid => (
            "group",
            Group::from_name(name).map(|g| g.map(|g| g.gid.as_raw())),
        ),
    };
    match found {
        Ok(Some(id)) => Ok(id),
        Ok(None) => Err(ApplyError::NftEncode(format!(
            "owner {what} {name} does not exist"
        ))),
        Err(e) => Err(ApplyError::NftEncode(format!(
            "cannot look up owner {what} {name}: {e}"
        ))),
    }
}

/// Our tables (named `<prefix>*`) in the calling thread's netns as typed rules, over nfnetlink,
/// no process: one dump each of the tables, chains and sets of
/// the `inet` family, one element dump per anonymous set of ours (a rule's `{ 53, 15008 }`) and
/// one rule dump per table of ours, decoded by [`crate::rules::nft_kernel_decode`].
pub fn read_native_netlink(prefix: &str) -> Result<NativeState, BatchError> {
    let layout = nft_dump::dump_layout(NFPROTO_INET)?;
    let mut anon = AnonSets::new();
    for (table, set) in anonymous_sets(&layout.sets, prefix) {
        let records = nft_dump::dump_set_elements(NFPROTO_INET, &table, &set)?;
        anon.insert((table, set), element_keys(&records));
    }
    let mut rules = Vec::new();
    for table in table_names(&layout.tables, prefix) {
        rules.extend(nft_dump::dump_rules(NFPROTO_INET, &table)?);
    }
    Ok(decode_kernel(
        &layout.tables,
        &layout.chains,
        &layout.sets,
        &rules,
        &anon,
        prefix,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_given_by_name_are_looked_up_as_nft_does() {
        use crate::rules::nft_model::NftRule;
        use crate::rules::nftables::NftTable;
        let tx = |id: &str| {
            let rule = NftRule {
                table: NftTable::SidecarNat,
                chain: "output".into(),
                index: None,
                exprs: vec![NftExpr::Owner {
                    key: OwnerKind::Gid,
                    id: id.into(),
                    negate: false,
                    with_meta: false,
                }],
            };
            NftTransaction::new(vec![NftStep::Replace {
                set: crate::rules::nft_model::NftRuleSet { rules: vec![rule] },
                tables: vec![NftTable::SidecarNat],
            }])
        };
        assert_eq!(with_owner_ids(&tx("1337")).unwrap(), None);
        assert_eq!(with_owner_ids(&tx("root")).unwrap(), Some(tx("0")));
        let err = with_owner_ids(&tx("no-such-group-x"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("group no-such-group-x does not exist"),
            "{err}"
        );
    }
}
