//! Applying an nftables transaction with `nft -f -` (atomic: the whole transaction or nothing),
//! and reading our tables back as typed rules: `nft -j -t list ruleset` (one process, JSON,
//! without set elements, which are state) decoded by [`crate::rules::nft_decode`] and compared
//! with what a transaction leaves ([`crate::rules::nft_decode::expected`]). The ambient in-pod
//! and host checks and the sidecar verify all go through [`super::rule_backend::NativeNft`].
//! Next step: the same read over nfnetlink (`NFT_MSG_GETRULE`, no process), decoding the
//! kernel's expressions into the same typed form.

use parking_lot::Mutex;
use std::collections::HashMap;

use super::exec::{Cmd, Executor};
use super::iptables::{ApplyError, find_on_path, run_checked};
use crate::rules::nft_decode::{NativeState, decode_listing};

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

/// How tables named `<prefix>*` list in the calling thread's netns (`nft -t list ruleset`,
/// normalised by [`normalise_listing`]): one process. Terse: without set elements, which are
/// state (the host probe sets' members), not rules.
pub fn our_listing(exec: &mut dyn Executor, prefix: &str) -> Result<String, ApplyError> {
    let out = run_checked(exec, &Cmd::new("nft", ["-t", "list", "ruleset"]))?;
    Ok(normalise_listing(&out.stdout, prefix))
}

/// How the tables named `<prefix>*` list when they hold exactly `transaction`: learnt by applying
/// it in a scratch netns (the kernel's own canonical form: nft rewrites some expressions as it
/// stores them).
pub fn listing_of(transaction: &str, prefix: &'static str) -> Result<String, ApplyError> {
    let transaction = transaction.to_string();
    crate::netns::run_in_scratch(move || {
        let mut exec = super::exec::ProcessExecutor::default();
        apply_transaction(&mut exec, &transaction)?;
        our_listing(&mut exec, prefix)
    })
    .map_err(|e| ApplyError::Failed {
        command: "nft -f - (in a scratch netns)".into(),
        code: None,
        stderr: e.to_string(),
    })?
}

/// The `table <family> <prefix>*` blocks of an `nft list ruleset` text only, without rule
/// handles and counter values, which differ between two identical rule sets.
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

/// Expected listings, learnt once per distinct transaction (each costs a scratch netns and two
/// processes; a node has few distinct ones) and shared by every pod that uses it.
#[derive(Debug)]
pub struct Listings {
    prefix: &'static str,
    known: Mutex<HashMap<String, String>>,
}

impl Listings {
    /// For the tables named `<prefix>*` (`istio-ambient-`, `istio-proxy-`).
    pub fn new(prefix: &'static str) -> Self {
        Listings {
            prefix,
            known: Mutex::new(HashMap::new()),
        }
    }

    /// How `transaction` lists once applied (learnt on first use; a failure is not cached).
    pub fn expected(&self, transaction: &str) -> Result<String, ApplyError> {
        if let Some(listing) = self.lock().get(transaction) {
            return Ok(listing.clone());
        }
        // Learnt without the lock: two callers may both learn one listing, never wait on it.
        let listing = listing_of(transaction, self.prefix)?;
        self.lock().insert(transaction.to_string(), listing.clone());
        Ok(listing)
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, HashMap<String, String>> {
        self.known.lock()
    }
}

/// The first difference between an expected and an actual listing, for logs and events: a
/// table missing, or the first line that differs (with its table and chain).
pub fn listing_difference(expected: &str, actual: &str) -> Option<String> {
    if expected == actual {
        return None;
    }
    let tables = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with("table "))
            .map(|l| l.trim_end_matches(" {").to_string())
            .collect()
    };
    let (want, have) = (tables(expected), tables(actual));
    if let Some(missing) = want.iter().find(|t| !have.contains(t)) {
        return Some(format!("{missing} missing"));
    }
    if let Some(extra) = have.iter().find(|t| !want.contains(t)) {
        return Some(format!("unexpected {extra}"));
    }
    let (mut table, mut chain) = (String::new(), String::new());
    let mut expected_lines = expected.lines();
    for line in actual.lines().map(Some).chain(std::iter::repeat(None)) {
        let want = expected_lines.next();
        if want.is_none() && line.is_none() {
            break;
        }
        if want == line {
            let l = line.unwrap_or_default().trim();
            if l.starts_with("table ") {
                table = l.trim_end_matches(" {").to_string();
            } else if let Some(c) = l.strip_prefix("chain ") {
                chain = c.trim_end_matches(" {").to_string();
            }
            continue;
        }
        let show = |l: Option<&str>| match l.map(str::trim) {
            None => "nothing".to_string(),
            Some("}") => "the end of the chain".to_string(),
            Some(l) => format!("`{l}`"),
        };
        return Some(format!(
            "{table} chain {chain}: found {}, expected {}",
            show(line),
            show(want)
        ));
    }
    Some("listings differ".to_string())
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
        let b = normalise_listing(&listing(1, 0, "drop"), "istio-proxy-");
        assert_eq!(listing_difference(&a, &a), None);
        let what = listing_difference(&a, &b).unwrap();
        assert!(
            what.contains("istio-proxy-nat") && what.contains("output") && what.contains("drop"),
            "{what}"
        );
        assert_eq!(
            listing_difference(&a, "").as_deref(),
            Some("table inet istio-proxy-nat missing")
        );
    }
}
