//! Our native nftables tables as typed [`super::nft_model`] statements ([`NativeState`]): what
//! the kernel holds (read over netlink, [`super::nft_kernel_decode`]; nft's JSON listing, for the
//! tests that let nft write or list, by the test-only `json` reader) and what a transaction leaves
//! ([`expected`]) in the same form, so a drift check compares typed rules ([`difference`]), not
//! listing text. A statement the model cannot say exactly (another expression, operator, range,
//! flag) makes its rule [`ForeignRule`]: a difference, never a near match.
//!
//! The model keeps a golden's spelling and the kernel one meaning; [`canonical`]
//! ([`super::nft_canon`]) spells a planned rule the way it is read back, so "the kernel holds our
//! rules" is `decode(listing) == canonical(plan)`.
//! Pure: no effects.

use std::collections::BTreeMap;

use super::model::ForeignRule;
pub use super::nft_canon::{canonical, canonical_addr, difference, expected};
use super::nft_model::NftExpr;

/// One rule as listed: its statements, or why the model cannot say it.
pub type ListedRule = Result<Vec<NftExpr>, ForeignRule>;

/// A base chain's hook: `type nat hook output priority -100`, and its policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hook {
    pub kind: String,
    pub hook: String,
    pub priority: i64,
    pub policy: String,
}

/// One chain: its hook when it is a base chain, and its rules in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NativeChain {
    pub hook: Option<Hook>,
    pub rules: Vec<ListedRule>,
}

/// One table: its chains and its named sets (name -> element type; elements are state, not
/// rules, and are not read).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NativeTable {
    pub chains: BTreeMap<String, NativeChain>,
    pub sets: BTreeMap<String, String>,
}

/// Our tables (named `<prefix>*`): `inet` ones by name, any other family's as `<family> <name>`
/// (never planned, so always a difference).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NativeState {
    pub tables: BTreeMap<String, NativeTable>,
}

impl NativeState {
    pub fn is_empty(&self) -> bool {
        self.tables.is_empty()
    }
}

// The JSON reader only tests use (the shipped build reads the kernel over netlink).
#[cfg(any(test, feature = "test-hooks"))]
mod json;
#[cfg(any(test, feature = "test-hooks"))]
pub use json::{BadListing, decode_listing};

#[cfg(test)]
#[path = "nft_decode_tests.rs"]
mod tests;
