//! Capability dropping at start: keep only what the enabled roles need, before any thread exists
//! (capabilities are per thread; threads created later inherit the reduced sets).

use caps::{CapSet, Capability, CapsHashSet};
use tracing::{info, warn};

/// The capabilities the enabled roles need. Installing files into host dirs owned by others needs
/// DAC_OVERRIDE; the ambient agent and the repair controller enter pod network namespaces and
/// program rules (the chart grants exactly these five).
pub fn needed(ambient: bool, repair: bool, ports: &[u16]) -> CapsHashSet {
    let mut set = CapsHashSet::new();
    set.insert(Capability::CAP_DAC_OVERRIDE);
    // Only when someone configures a privileged health/metrics port.
    if ports.iter().any(|p| (1..1024).contains(p)) {
        set.insert(Capability::CAP_NET_BIND_SERVICE);
    }
    if ambient || repair {
        set.insert(Capability::CAP_NET_ADMIN);
        set.insert(Capability::CAP_NET_RAW);
        set.insert(Capability::CAP_SYS_ADMIN);
        set.insert(Capability::CAP_SYS_PTRACE);
    }
    set
}

fn names(set: &CapsHashSet) -> String {
    let mut v: Vec<String> = set.iter().map(|c| c.to_string()).collect();
    v.sort();
    if v.is_empty() {
        "none".to_string()
    } else {
        v.join(",")
    }
}

/// Drops everything else from the effective, permitted and inheritable sets and clears the
/// ambient set; never fails (an unprivileged test run has nothing to drop).
pub fn drop_to(keep: &CapsHashSet) {
    let _ = caps::clear(None, CapSet::Ambient);
    for set in [CapSet::Inheritable, CapSet::Effective, CapSet::Permitted] {
        let Ok(current) = caps::read(None, set) else {
            continue;
        };
        let target: CapsHashSet = current.intersection(keep).copied().collect();
        if target != current
            && let Err(e) = caps::set(None, set, &target)
        {
            warn!("could not reduce the {set:?} capability set: {e}");
        }
    }
    let effective = caps::read(None, CapSet::Effective).unwrap_or_default();
    let missing: CapsHashSet = keep.difference(&effective).copied().collect();
    info!(effective = %names(&effective), "capabilities after dropping the unneeded ones");
    if !missing.is_empty() {
        warn!(missing = %names(&missing), "running without capabilities the enabled roles may need");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needed_sets() {
        assert_eq!(needed(false, false, &[8000, 0]).len(), 1);
        assert_eq!(needed(true, false, &[8000]).len(), 5);
        assert_eq!(needed(false, true, &[]), needed(true, true, &[]));
        assert!(needed(false, false, &[80]).contains(&Capability::CAP_NET_BIND_SERVICE));
    }
}
