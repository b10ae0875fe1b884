//! The neutral description of netlink attributes: a typed tree (raw bytes, or nested attributes)
//! that the nf_tables encoding fills and the netlink transport frames. It implements
//! netlink-packet-core's `Nla`, so whoever frames a message serializes it without knowing what it
//! says. Integers are big-endian, as nf_tables expects; strings carry their NUL.

use netlink_packet_core::{Emitable, NLA_F_NESTED, NLA_HEADER_SIZE, Nla};

/// One netlink attribute: its type and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    pub kind: u16,
    pub value: AttrValue,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttrValue {
    Bytes(Vec<u8>),
    /// Sent with `NLA_F_NESTED` set; with the inner list's encoded length, computed once (framing
    /// asks for it at every level, and recomputing it was quadratic in the nesting).
    Nested(Vec<Attr>, usize),
}

impl Nla for Attr {
    fn value_len(&self) -> usize {
        match &self.value {
            AttrValue::Bytes(bytes) => bytes.len(),
            AttrValue::Nested(_, len) => *len,
        }
    }

    fn kind(&self) -> u16 {
        match self.value {
            AttrValue::Bytes(_) => self.kind,
            AttrValue::Nested(..) => self.kind | NLA_F_NESTED,
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match &self.value {
            AttrValue::Bytes(bytes) => buffer.copy_from_slice(bytes),
            AttrValue::Nested(inner, _) => inner.as_slice().emit(buffer),
        }
    }
}

/// An attribute that does not fit a netlink attribute's 16-bit length field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "netlink attribute type {kind} would be {len} bytes long; its length field holds at most {}",
    u16::MAX
)]
pub struct AttrTooLong {
    pub kind: u16,
    pub len: usize,
}

/// An attribute list under construction. An attribute too long for its length field is refused,
/// never truncated: the first one is kept as the error [`Attrs::done`] returns.
#[derive(Debug, Default)]
pub struct Attrs {
    list: Vec<Attr>,
    refused: Option<AttrTooLong>,
}

impl Attrs {
    pub fn new() -> Attrs {
        Attrs::default()
    }

    fn put(&mut self, attr: Attr) {
        let len = NLA_HEADER_SIZE + attr.value_len();
        if len > usize::from(u16::MAX) {
            self.refused.get_or_insert(AttrTooLong {
                kind: attr.kind,
                len,
            });
            return;
        }
        self.list.push(attr);
    }

    pub fn bytes(mut self, kind: u16, payload: &[u8]) -> Attrs {
        self.put(Attr {
            kind,
            value: AttrValue::Bytes(payload.to_vec()),
        });
        self
    }

    /// A NUL-terminated string.
    pub fn string(self, kind: u16, value: &str) -> Attrs {
        let mut v = Vec::with_capacity(value.len() + 1);
        v.extend_from_slice(value.as_bytes());
        v.push(0);
        self.bytes(kind, &v)
    }

    pub fn u32(self, kind: u16, value: u32) -> Attrs {
        self.bytes(kind, &value.to_be_bytes())
    }

    pub fn u64(self, kind: u16, value: u64) -> Attrs {
        self.bytes(kind, &value.to_be_bytes())
    }

    /// A nested attribute holding `inner` (whose refusal, if any, becomes this list's).
    pub fn nested(mut self, kind: u16, inner: Attrs) -> Attrs {
        self.nested_in_place(kind, inner);
        self
    }

    pub fn nested_in_place(&mut self, kind: u16, inner: Attrs) {
        if let Some(refused) = inner.refused {
            self.refused.get_or_insert(refused);
            return;
        }
        self.put(Attr {
            kind,
            value: {
                let len = inner.list.as_slice().buffer_len();
                AttrValue::Nested(inner.list, len)
            },
        });
    }

    pub fn done(self) -> Result<Vec<Attr>, AttrTooLong> {
        match self.refused {
            Some(refused) => Err(refused),
            None => Ok(self.list),
        }
    }
}

/// The wire bytes of an attribute list (for tests and diagnostics).
pub fn to_bytes(attrs: &[Attr]) -> Vec<u8> {
    let mut buf = vec![0; attrs.buffer_len()];
    attrs.emit(&mut buf);
    buf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_are_padded_and_nested_with_the_flag() {
        let attrs = Attrs::new()
            .string(1, "nat")
            .nested(4, Attrs::new().u32(1, 3))
            .done()
            .unwrap();
        assert_eq!(
            to_bytes(&attrs),
            [
                8, 0, 1, 0, b'n', b'a', b't', 0, // "nat\0"
                12, 0, 4, 0x80, 8, 0, 1, 0, 0, 0, 0, 3, // nested, big-endian 3
            ]
        );
        let odd = Attrs::new().bytes(2, &[9]).done().unwrap();
        assert_eq!(to_bytes(&odd), [5, 0, 2, 0, 9, 0, 0, 0]);
    }

    #[test]
    fn lengths_over_u16_are_refused_naming_the_attribute() {
        let fits = vec![0u8; usize::from(u16::MAX) - NLA_HEADER_SIZE];
        assert!(Attrs::new().bytes(3, &fits).done().is_ok());
        let err = Attrs::new()
            .string(1, "nat")
            .bytes(3, &[0u8; 65532])
            .done()
            .unwrap_err();
        assert_eq!(
            err,
            AttrTooLong {
                kind: 3,
                len: 65536
            }
        );
        assert!(err.to_string().contains("type 3"), "{err}");
        // Each part fits, the nest holding them does not.
        let half = vec![0u8; 40_000];
        let err = Attrs::new()
            .nested(4, Attrs::new().bytes(1, &half).bytes(2, &half))
            .done()
            .unwrap_err();
        assert_eq!(err.kind, 4);
        // A refusal deep inside reaches the top.
        let err = Attrs::new()
            .nested(
                4,
                Attrs::new().nested(1, Attrs::new().bytes(7, &[0; 70_000])),
            )
            .done()
            .unwrap_err();
        assert_eq!(err.kind, 7);
    }
}

/// Reading attribute bytes back (the inverse direction, for the decoders of dumped rules).
pub mod read {
    use netlink_packet_core::{NlaBuffer, NlasIterator};

    /// Flags above the attribute number (`NLA_F_NESTED`, `NLA_F_NET_BYTEORDER`).
    const NLA_TYPE_MASK: u16 = 0x3fff;

    /// An attribute list as `(number, value)` pairs; None when the bytes are not one.
    pub fn attrs(bytes: &[u8]) -> Option<Vec<(u16, &[u8])>> {
        NlasIterator::new(bytes)
            .map(|a| {
                let a: NlaBuffer<&[u8]> = a.ok()?;
                let (kind, len) = (a.kind() & NLA_TYPE_MASK, a.value_length());
                Some((kind, a.into_inner().get(4..4 + len)?))
            })
            .collect()
    }

    /// The first attribute numbered `kind`.
    pub fn get<'a>(list: &[(u16, &'a [u8])], kind: u16) -> Option<&'a [u8]> {
        list.iter().find(|(k, _)| *k == kind).map(|(_, v)| *v)
    }

    pub fn be32(v: &[u8]) -> Option<u32> {
        Some(u32::from_be_bytes(v.try_into().ok()?))
    }

    /// A NUL-terminated string attribute.
    pub fn text(v: &[u8]) -> String {
        String::from_utf8_lossy(v)
            .trim_end_matches('\0')
            .to_string()
    }
}
