//! Shared by the examples (included with `#[path]`; a folder without `main.rs` is no example).
#![allow(dead_code)]

use std::process::Command;

/// Runs a command; its stderr is the error when it fails.
pub fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A benchmark's arguments: `<binary> [count]` (`count` defaults to `default`).
pub fn bench_args(usage: &str, default: usize) -> (String, usize) {
    let mut args = std::env::args().skip(1);
    let binary = args.next().unwrap_or_else(|| panic!("usage: {usage}"));
    let count = args.next().and_then(|s| s.parse().ok()).unwrap_or(default);
    (binary, count)
}
