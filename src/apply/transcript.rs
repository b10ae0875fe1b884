//! The dry-run transcript in the format of Istio's recording stub (its capture goldens): every
//! command without stdin as its command line, every restore as its stdin lines.

use std::io::Write;
use std::path::Path;

use crate::rules::iptables::render_restore;
use crate::rules::{Family, RuleSet};

/// What a sidecar apply would execute: initial saves, the restores and the final saves. (A
/// cleanup prints its plan: [`super::cleanup::CleanupPlan::transcript`].)
pub fn sidecar(rules: &RuleSet, ipv6: bool) -> Vec<String> {
    // The ambient step's commands, then the final saves.
    let mut out = ambient(rules, ipv6);
    out.push("iptables-save".into());
    if ipv6 {
        out.push("ip6tables-save".into());
    }
    out
}

/// Writes the transcript atomically (temp file + rename), so a reader never sees half of it.
pub fn write_file(path: &Path, text: &str) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(text.as_bytes())?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// What the node agent's in-pod (or host) iptables step runs: the saves of the state check, then
/// the restores (IPv4, then IPv6 when enabled); no final saves.
pub fn ambient(rules: &RuleSet, ipv6: bool) -> Vec<String> {
    let mut out = vec!["iptables-save".to_string(), "ip6tables-save".to_string()];
    let families: &[Family] = if ipv6 { &Family::ALL } else { &[Family::V4] };
    for &family in families {
        out.extend(
            render_restore(rules.family(family))
                .lines()
                .map(str::to_string),
        );
    }
    out
}
