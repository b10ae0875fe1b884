//! Logging setup, the plugin log sink, the health/readiness/metrics servers (with the process
//! collector's `process_*` series, `process`), and the one binder (`socket`) and server (`serve`)
//! of every local socket and port of the agent. Inside the room files import downward only
//! (`readiness` below `serve` below `health`).
//! May call: `wire` (the log sink reads the plugin's records as the wire defines them).

pub mod health;
pub mod logging;
pub mod logsink;
pub mod metrics;
pub mod process;
pub mod readiness;
pub mod rotate;
pub mod serve;
pub mod socket;
