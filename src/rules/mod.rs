//! The one rule engine: a typed model of redirect rules ([`model`]) and of nftables rules
//! ([`nft_model`]); the sidecar capture decisions made once ([`capture_plan`]); the builders
//! ([`capture`]: the sidecar config, whose values [`capture_values`] checks, and the iptables
//! renderer of the plan; [`nft_capture`], the nftables one; [`ambient`] and [`ambient_nft`]); and the renderers ([`iptables`] restore text, [`nftables`] text, and
//! [`iptables_nft`]: the nf_tables messages iptables-nft would send, described neutrally with a
//! [`nla`] attribute tree and the [`xtables`] structs, for the netlink transport to frame;
//! [`nft_encode`]: our native nftables transactions as typed steps and the nf_tables messages nft
//! would send for them, described the same way; the
//! probe sets' ipset and nft set-element messages and their decoding, [`probe_set_msgs`]); and
//! the inverses, [`iptables_nft_decode`]: a dumped nf_tables rule read back into the model,
//! [`iptables_save_decode`]: `*-save` text read back the same way, both into one
//! [`iptables_state::IptablesState`]; and
//! [`nft_decode`]: our native nftables tables as nft lists them (JSON) read back into the
//! [`nft_model`] statements, and [`nft_kernel_decode`]: the same from the kernel's dumped
//! records; both compared with a plan spelt as it reads back ([`nft_canon`]).
//! The nf_tables kernel numbers these share are declared once, in [`nf_kernel`]; the
//! expressions both nf_tables encoders build, once, in [`nft_expr`].
//! Pure: no processes, files, sockets or namespaces are touched here.
//! May call: nothing else in this crate.

pub mod ambient;
pub mod ambient_nft;
pub mod capture;
pub mod capture_plan;
pub mod capture_values;
pub mod iptables;
pub mod iptables_nft;
pub mod iptables_nft_decode;
pub mod iptables_save_decode;
pub mod iptables_state;
pub mod model;
pub mod nf_kernel;
pub mod nft_canon;
pub mod nft_capture;
pub mod nft_decode;
pub mod nft_encode;
pub mod nft_expr;
pub mod nft_kernel_decode;
pub mod nft_model;
pub mod nftables;
pub mod nla;
pub mod probe_set_msgs;
pub mod xtables;

pub use model::{Family, Match, Position, Proto, Rule, RuleSet, Table, Target};
