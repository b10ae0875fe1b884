//! Logging setup, the plugin log sink, the health/readiness/metrics servers, and the peer
//! credentials of local socket connections (`peer`).
//! May call: nothing else in this crate.

pub mod health;
pub mod logging;
pub mod logsink;
pub mod metrics;
pub mod peer;
