//! Sidecar traffic capture: the typed capture config both backends read (its types are
//! re-exported here from `config`), and the iptables builder, which renders the one
//! [`CapturePlan`] into the rule model in Istio's exact iptables order. The builder is split by
//! direction (`inbound`, with TPROXY's marks; `outbound`; `dns`); this file keeps the order
//! they run in. Shared by `istio-iptables` and the CNI plugin.

use std::collections::BTreeSet;

use super::capture_plan::CapturePlan;
use super::model::OwnerKind;
use super::model::parts::{TCP, dport, in_iface, jump, out_iface, redirect};
use super::model::{CtState, Match, RuleSet, RuleSetBuilder, Table, Target, is_builtin_chain};

pub(super) mod config;
mod dns;
mod inbound;
mod outbound;

pub use config::{
    CaptureConfig, DEFAULT_LOOPBACK_V4, DNS_PROXY_PORT, INBOUND_PASSTHROUGH_V4,
    INBOUND_PASSTHROUGH_V6, InboundPorts, InterceptionMode, IpRanges, LOOPBACK_V6, OUTBOUND_MARK,
    OwnerGroups, RangeError, split_list,
};

/// Chain names of the sidecar rule set.
pub mod chain {
    pub const INBOUND: &str = "ISTIO_INBOUND";
    pub const REDIRECT: &str = "ISTIO_REDIRECT";
    pub const IN_REDIRECT: &str = "ISTIO_IN_REDIRECT";
    pub const OUTPUT: &str = "ISTIO_OUTPUT";
    pub const OUTPUT_DNS: &str = "ISTIO_OUTPUT_DNS";
    pub const DIVERT: &str = "ISTIO_DIVERT";
    pub const TPROXY: &str = "ISTIO_TPROXY";
    pub const DROP: &str = "ISTIO_DROP";
}

/// The socket-owner match for one of the proxy's identities (or an owner group).
fn owner(kind: OwnerKind, id: &str, negate: bool) -> Match {
    let id = id.into();
    match kind {
        OwnerKind::Uid => Match::UidOwner { id, negate },
        OwnerKind::Gid => Match::GidOwner { id, negate },
    }
}

/// Builds the sidecar capture rules, in Istio's order.
pub fn build(cfg: &CaptureConfig) -> RuleSet {
    use Table::{Mangle, Nat};
    use chain::*;
    let cfg = &*cfg.without_repeats();
    let plan = CapturePlan::new(cfg);
    let mut b = RuleSetBuilder::new(cfg.enable_ipv6);

    // Interfaces excluded from capture in both directions.
    for iface in &cfg.exclude_interfaces {
        b.append(Nat, "PREROUTING", vec![in_iface(iface)], Target::Return);
        b.append(Nat, "OUTPUT", vec![out_iface(iface)], Target::Return);
    }
    if plan.tproxy {
        for iface in &cfg.exclude_interfaces {
            b.append(Mangle, "PREROUTING", vec![in_iface(iface)], Target::Return);
            b.append(Mangle, "OUTPUT", vec![out_iface(iface)], Target::Return);
        }
    }
    // Virtual interfaces: inbound treated as outbound, so no inbound capture on them.
    for iface in &cfg.reroute_virtual_interfaces {
        b.insert(Nat, "PREROUTING", 1, vec![in_iface(iface)], Target::Return);
    }
    if cfg.drop_invalid {
        b.append(
            Mangle,
            "PREROUTING",
            vec![Match::CtState(vec![CtState::Invalid])],
            jump(DROP),
        );
        b.append(Mangle, DROP, vec![], Target::Drop);
    }
    // The fixed chains: the tunnel port is never captured inbound; the two redirect chains.
    b.append(
        Nat,
        INBOUND,
        vec![TCP, dport(&cfg.inbound_tunnel_port, false)],
        Target::Return,
    );
    for (chain, port) in [
        (REDIRECT, &cfg.proxy_port),
        (IN_REDIRECT, &cfg.inbound_capture_port),
    ] {
        b.append(Nat, chain, vec![TCP], redirect(port, true));
    }

    inbound::build(&mut b, cfg, &plan);
    outbound::build(&mut b, cfg, &plan);
    if plan.tproxy {
        inbound::tproxy_marks(&mut b, cfg, &plan);
    }
    b.build()
}

/// Every `(table, chain)` user chain the sidecar builder can create, in either family: derived
/// from the builder itself run with every feature on, so cleanup and drift checks only ever touch
/// chains this rule model owns (a user's `ISTIO_FW` in filter is not one of them).
/// Built once per process (it runs the whole builder; the hot paths ask on every apply).
pub fn owned_chains() -> &'static BTreeSet<(Table, String)> {
    static OWNED: std::sync::LazyLock<BTreeSet<(Table, String)>> =
        std::sync::LazyLock::new(build_owned_chains);
    &OWNED
}

fn build_owned_chains() -> BTreeSet<(Table, String)> {
    let mut owned = BTreeSet::new();
    for mode in [InterceptionMode::Redirect, InterceptionMode::Tproxy] {
        let everything = CaptureConfig {
            mode,
            inbound_ports: InboundPorts::All,
            redirect_dns: true,
            capture_all_dns: true,
            drop_invalid: true,
            enable_ipv6: true,
            ..Default::default()
        };
        let rules = build(&everything);
        for rule in rules.v4.iter().chain(&rules.v6) {
            let targets = std::iter::once(rule.chain.as_str()).chain(rule.target.jump_chain());
            for chain in targets.filter(|c| !is_builtin_chain(c)) {
                owned.insert((rule.table, chain.to_string()));
            }
        }
    }
    owned
}

/// The same configuration in the other interception mode (REDIRECT ↔ TPROXY): what a reconcile
/// after a mode change must also take out of the built-in chains.
pub fn other_mode(cfg: &CaptureConfig) -> RuleSet {
    let mode = match cfg.mode {
        InterceptionMode::Redirect => InterceptionMode::Tproxy,
        InterceptionMode::Tproxy => InterceptionMode::Redirect,
    };
    build(&CaptureConfig {
        mode,
        ..cfg.clone()
    })
}

/// Whether `chain` in `table` (by name, as `iptables-save` prints it) is one [`owned_chains`] lists.
pub fn is_owned_chain(owned: &BTreeSet<(Table, String)>, table: &str, chain: &str) -> bool {
    owned.iter().any(|(t, c)| t.name() == table && c == chain)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_chains_are_exactly_the_ones_the_builder_creates() {
        let owned = owned_chains();
        let names: Vec<String> = owned.iter().map(|(t, c)| format!("{t}/{c}")).collect();
        assert_eq!(
            names,
            [
                "mangle/ISTIO_DIVERT",
                "mangle/ISTIO_DROP",
                "mangle/ISTIO_INBOUND",
                "mangle/ISTIO_TPROXY",
                "nat/ISTIO_INBOUND",
                "nat/ISTIO_IN_REDIRECT",
                "nat/ISTIO_OUTPUT",
                "nat/ISTIO_OUTPUT_DNS",
                "nat/ISTIO_REDIRECT",
                "raw/ISTIO_INBOUND",
                "raw/ISTIO_OUTPUT_DNS",
            ]
        );
        assert!(!is_owned_chain(owned, "filter", "ISTIO_FW"));
        assert!(!is_owned_chain(owned, "filter", "ISTIO_OUTPUT"));
        assert!(is_owned_chain(owned, "nat", "ISTIO_OUTPUT"));
    }
}
