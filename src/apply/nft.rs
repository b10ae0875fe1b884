//! Applying an nftables transaction with `nft -f -` (atomic: the whole transaction or nothing).

use super::exec::{Cmd, Executor};
use super::iptables::{ApplyError, find_on_path};

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
