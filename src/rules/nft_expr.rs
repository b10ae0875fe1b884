//! The nf_tables expressions both encoders build ([`super::iptables_nft`] and
//! [`super::nft_encode`]), each as its attribute tree appended to a rule's expression list: one
//! spelling of `meta`, `payload`, `cmp`, `bitwise`, `counter` and the verdict `immediate`, so the
//! two encoders cannot drift apart byte-wise. Every load goes into `NFT_REG_1`. Pure.

use super::nf_kernel::{NFT_CMP_EQ, NFT_CMP_NEQ, NFT_REG_1, NFT_REG_VERDICT};
use super::nla::Attrs;

/// One expression: a list element holding the expression's name and its data attributes.
pub fn expr(x: &mut Attrs, name: &str, data: Attrs) {
    x.nested_in_place(1, Attrs::new().string(1, name).nested(2, data));
}

/// `NFTA_DATA_VALUE`: bytes as an expression's data.
pub fn value(bytes: &[u8]) -> Attrs {
    Attrs::new().bytes(1, bytes)
}

/// Loads `meta` key `key` (`NFT_META_*`).
pub fn meta_load(x: &mut Attrs, key: u32) {
    expr(x, "meta", Attrs::new().u32(2, key).u32(1, NFT_REG_1));
}

/// Loads `len` bytes at `offset` from header `base` (`NFT_PAYLOAD_*`).
pub fn payload(x: &mut Attrs, base: u32, offset: u32, len: u32) {
    let data = Attrs::new()
        .u32(1, NFT_REG_1)
        .u32(2, base)
        .u32(3, offset)
        .u32(4, len);
    expr(x, "payload", data);
}

/// Compares the register with `bytes`: equal, or not equal when `negate`.
pub fn cmp(x: &mut Attrs, negate: bool, bytes: &[u8]) {
    let data = Attrs::new()
        .u32(1, NFT_REG_1)
        .u32(2, if negate { NFT_CMP_NEQ } else { NFT_CMP_EQ })
        .nested(3, value(bytes));
    expr(x, "cmp", data);
}

/// `register = (register & mask) ^ xor`, as long as `mask`.
pub fn bitwise(x: &mut Attrs, mask: &[u8], xor: &[u8]) {
    let data = Attrs::new()
        .u32(1, NFT_REG_1)
        .u32(2, NFT_REG_1)
        .u32(3, mask.len() as u32)
        .nested(4, value(mask))
        .nested(5, value(xor));
    expr(x, "bitwise", data);
}

/// A `counter` starting at zero packets and bytes.
pub fn counter(x: &mut Attrs) {
    expr(x, "counter", Attrs::new().u64(1, 0).u64(2, 0));
}

/// The verdict `code` (`NF_*`, `NFT_*`), naming `chain` for a jump or goto.
pub fn verdict(x: &mut Attrs, code: i32, chain: Option<&str>) {
    let mut v = Attrs::new().u32(1, code as u32);
    if let Some(chain) = chain {
        v = v.string(2, chain);
    }
    let data = Attrs::new()
        .u32(1, NFT_REG_VERDICT)
        .nested(2, Attrs::new().nested(2, v));
    expr(x, "immediate", data);
}
