//! Entering a network namespace: work runs on a dedicated thread that `setns`es into the target and
//! never returns to a shared pool (namespaces are per thread).
//! May call: nothing else in this crate.
