//! Applying an nftables transaction with `nft -f -` (atomic: the whole transaction or nothing),
//! and reading our tables back as typed rules, compared with what a transaction leaves
//! ([`crate::rules::nft_decode::expected`]): over nfnetlink ([`read_native_netlink`], no
//! process, decoded by [`crate::rules::nft_kernel_decode`]), or with `nft -j -t list ruleset`
//! ([`read_native`], one process, decoded by [`crate::rules::nft_decode`]) when netlink fails.
//! Both give the same typed form (tests/nft_read_conformance.rs). The ambient in-pod and host
//! checks and the sidecar verify all go through [`super::rule_backend::NativeNft`].

use super::exec::{Cmd, Executor};
use super::iptables::{ApplyError, find_on_path, run_checked};
use crate::netlink::nft_batch::BatchError;
use crate::netlink::nft_dump;
use crate::rules::nft_decode::{NativeState, decode_listing};
use crate::rules::nft_kernel_decode::{
    AnonSets, anonymous_sets, decode_kernel, element_keys, table_names,
};

/// Runs one transaction through `nft -f -` in the calling thread's network namespace.
pub fn apply_transaction(exec: &mut dyn Executor, transaction: &str) -> Result<(), ApplyError> {
    if transaction.is_empty() {
        return Ok(());
    }
    if find_on_path("nft").is_none() {
        return Err(ApplyError::NoBinary {
            family: "nft",
            reason: "nft not found on PATH (install nftables)".into(),
        });
    }
    let cmd = Cmd::new("nft", ["-f", "-"]).with_stdin(transaction.to_string());
    let out = exec.run(&cmd)?;
    if out.success {
        Ok(())
    } else {
        Err(ApplyError::Failed {
            command: cmd.display(),
            code: out.code,
            stderr: out.stderr.trim().to_string(),
        })
    }
}

/// Our tables (named `<prefix>*`) in the calling thread's netns as typed rules: one
/// `nft -j -t list ruleset`. A listing nft prints but we cannot read is an error naming it.
pub fn read_native(exec: &mut dyn Executor, prefix: &str) -> Result<NativeState, ApplyError> {
    let cmd = Cmd::new("nft", ["-j", "-t", "list", "ruleset"]);
    let out = run_checked(exec, &cmd)?;
    decode_listing(&out.stdout, prefix).map_err(|e| ApplyError::Failed {
        command: cmd.display(),
        code: Some(0),
        stderr: e.to_string(),
    })
}

/// [`read_native`] over nfnetlink, no process: one dump each of the tables, chains and sets of
/// the `inet` family, one element dump per anonymous set of ours (a rule's `{ 53, 15008 }`) and
/// one rule dump per table of ours, decoded by [`crate::rules::nft_kernel_decode`].
pub fn read_native_netlink(prefix: &str) -> Result<NativeState, BatchError> {
    const NFPROTO_INET: u8 = 1;
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
