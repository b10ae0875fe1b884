//! Applying rule sets: iptables/ip6tables(-save/-restore) binary detection, locking, state
//! verification, reconcile/cleanup, and the dry-run transcript in Istio's format. [`pod`] is the
//! one entry that programs (or cleans, or verifies without writing: `verify`) a netns, for
//! `istio-iptables`, the plugin and the repair room's drift pass alike. The
//! routes a sidecar capture needs besides its rules are decided here too ([`routes`]). The
//! iptables-nft flavour's owned tables are read over netlink as typed rules ([`nft_read`]).
//! May call: `rules`, `netlink` (nf_tables transactions, rtnetlink routes), `netns` (entering a
//! pod's user namespace).

pub mod ambient;
pub mod backend;
pub mod cleanup;
pub mod exec;
pub mod hostproc;
pub mod iptables;
pub mod nft;
pub mod nft_heal;
pub mod nft_read;
pub mod pod;
pub mod probe_set;
pub mod routes;
pub mod rule_backend;
pub mod sidecar;
pub mod state;
pub mod transcript;
pub mod verify;

pub use cleanup::{CleanupInput, CleanupPlan};
pub use exec::{Cmd, CmdOutput, Executor, ProcessExecutor};
pub use iptables::{ApplyError, Binaries, ForceBinary, NftNetlinkError, detect};
pub use sidecar::{
    RuleChange, SidecarOptions, apply_sidecar, apply_sidecar_here, cleanup_plan_here,
    cleanup_sidecar_here,
};
