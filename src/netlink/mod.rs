//! Addresses, ip rules and routes via rtnetlink (no `ip` subprocess).
//! May call: nothing else in this crate.
