//! Logging setup, the plugin log sink, and the health/readiness/metrics servers.
//! May call: nothing else in this crate.

pub mod health;
pub mod logging;
pub mod logsink;
pub mod metrics;
