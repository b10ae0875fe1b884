//! Applying rule sets: iptables/ip6tables(-save/-restore) binary detection, locking, state
//! verification, reconcile/cleanup, and the dry-run transcript in Istio's format. [`pod`] is the
//! one entry that programs (or cleans, or verifies without writing: `verify`) a netns, for
//! `istio-iptables`, the plugin and the repair room's drift pass alike. The
//! routes a sidecar capture needs besides its rules are decided here too ([`routes`]). The
//! iptables-nft flavour's owned tables are read over netlink as typed rules ([`nft_read`]).
//! May call: `rules`, `netlink` (nf_tables transactions, rtnetlink routes), `netns` (entering a
//! pod's user namespace).
//!
//! Inside the room files import downward only, never in a circle (the room test holds it):
//! * leaves: [`exec`] (processes), [`owned`] (which chains an ambient apply owns), [`routes`],
//!   [`hostproc`], [`transcript`]; [`diff`], the one comparison of an iptables read (typed
//!   rules, from a dump or from `*-save` text alike) with a plan;
//! * the kernel's faces: [`iptables`] (binaries, commands, errors), [`nft`] (native nftables),
//!   [`nft_read`] (iptables-nft tables read as typed rules) and [`nft_heal`] (the heal planned
//!   from that read), [`probe_set`];
//! * [`rule_backend`]: read, diff and write per backend, over the above;
//! * [`outcome`]: what an apply reports and the snapshot it undoes itself from, over the backend;
//! * the applies: [`cleanup`], [`sidecar`] and [`ambient`], then [`verify`] (read and diff only);
//! * [`pod`], the one entry for a netns, and [`backend`] (the choice made once) on top.

pub mod ambient;
pub mod backend;
pub mod cleanup;
pub mod diff;
pub mod exec;
pub mod hostproc;
pub mod iptables;
pub mod nft;
pub mod nft_heal;
pub mod nft_read;
pub mod outcome;
pub mod owned;
pub mod pod;
pub mod probe_set;
pub mod routes;
pub mod rule_backend;
pub mod sidecar;
pub mod transcript;
pub mod verify;

pub use cleanup::CleanupInput;
pub use exec::{Cmd, CmdOutput, Executor, ProcessExecutor};
pub use iptables::ForceBinary;
pub use outcome::RuleChange;
pub use sidecar::{SidecarOptions, apply_sidecar, apply_sidecar_here, cleanup_plan_here};
