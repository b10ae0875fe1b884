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
use crate::rules::nft_decode::NativeState;
use crate::rules::nft_encode::{NFPROTO_INET, NftTransaction, encode};
use crate::rules::nft_kernel_decode::{
    AnonSets, anonymous_sets, decode_kernel, element_keys, table_names,
};

/// Sends one transaction as one nf_tables batch in the calling thread's network namespace (from a
/// forked child inside the owning user namespace when `exec` enters one).
pub fn apply_transaction(exec: &mut dyn Executor, tx: &NftTransaction) -> Result<(), ApplyError> {
    if tx.is_empty() {
        return Ok(());
    }
    let messages = encode(tx).map_err(|e| ApplyError::NftEncode(e.to_string()))?;
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

/// The `table <family> <prefix>*` blocks of an `nft list ruleset` text only, without rule
/// handles and counter values, which differ between two identical rule sets (for tests and
/// logs that compare what an operator sees; the checks compare typed rules).
pub fn normalise_listing(text: &str, prefix: &str) -> String {
    let mut out = String::new();
    let mut ours = false;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("table ") {
            ours = rest
                .split_whitespace()
                .nth(1)
                .is_some_and(|name| name.starts_with(prefix));
        }
        if !ours {
            continue;
        }
        let line = line.split(" # handle ").next().unwrap_or(line);
        let mut words: Vec<&str> = line.split(' ').collect();
        while let Some(i) = words.iter().position(|w| *w == "packets") {
            // `counter packets N bytes M` -> `counter`
            words.drain(i..(i + 4).min(words.len()));
        }
        out.push_str(&words.join(" "));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(handle: u32, packets: u32, verdict: &str) -> String {
        format!(
            "table inet other {{\n}}\ntable inet istio-proxy-nat {{\n\tchain output {{\n\t\tmeta l4proto tcp counter packets {packets} bytes {packets} {verdict} # handle {handle}\n\t}}\n}}\n"
        )
    }

    #[test]
    fn listings_compare_without_handles_counters_and_other_tables() {
        let a = normalise_listing(&listing(1, 0, "accept"), "istio-proxy-");
        assert_eq!(
            a,
            normalise_listing(&listing(7, 42, "accept"), "istio-proxy-")
        );
        assert!(!a.contains("other"));
        assert_eq!(
            normalise_listing(&listing(1, 0, "accept"), "istio-ambient-"),
            ""
        );
        assert_ne!(a, normalise_listing(&listing(1, 0, "drop"), "istio-proxy-"));
    }
}
