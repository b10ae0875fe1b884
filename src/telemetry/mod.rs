//! Logging setup, the plugin log sink, and the health/readiness/metrics servers.
//! May call: nothing else in this crate.
