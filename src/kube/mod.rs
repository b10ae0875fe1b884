//! The one Kubernetes client module shared by every role, and the test API server.
//! May call: nothing else in this crate.
