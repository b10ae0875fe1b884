//! Which user chains an ambient apply owns, in which tables ([`OwnedChains`]): the in-pod rules'
//! and the host rules'. The ambient apply, its `*-save` planner, the netlink read and the heal
//! all take it; it names nothing else of this room.

use crate::rules::Rule;
use crate::rules::iptables_state::IptablesState;

/// The chains the in-pod rules own, in every table they use.
pub const INPOD_CHAINS: OwnedChains = OwnedChains {
    tables: &["mangle", "nat", "raw"],
    chains: &["ISTIO_PRERT", "ISTIO_OUTPUT"],
};
/// The chain the host rules own.
pub const HOST_CHAINS: OwnedChains = OwnedChains {
    tables: &["nat"],
    chains: &["ISTIO_POSTRT"],
};

/// Which user chains are ours (every named chain in every named table).
#[derive(Debug, Clone, Copy)]
pub struct OwnedChains {
    pub tables: &'static [&'static str],
    pub chains: &'static [&'static str],
}

impl OwnedChains {
    /// The owned chains the `planned` rules use (hold rules, or are jumped to).
    pub(super) fn planned_chains(&self, planned: &[&Rule]) -> Vec<&'static str> {
        self.chains
            .iter()
            .copied()
            .filter(|c| {
                planned
                    .iter()
                    .any(|r| r.chain == *c || r.target.jump_chain() == Some(*c))
            })
            .collect()
    }

    /// The owned chains of `table` that `state` holds, in declaration order.
    pub(super) fn present_in(&self, state: &IptablesState, table: &str) -> Vec<&'static str> {
        self.chains
            .iter()
            .copied()
            .filter(|c| state.chains.contains(&(table.to_string(), c.to_string())))
            .collect()
    }

    pub(super) fn owns(&self, table: &str, chain: &str) -> bool {
        self.tables.contains(&table) && self.chains.contains(&chain)
    }
}
