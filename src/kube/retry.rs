//! Retrying one-shot API calls: the crate's one retry policy and loop ([`crate::retry`]), with
//! [`KubeError::is_transient`](super::KubeError::is_transient) deciding what is worth retrying.

pub use crate::retry::{RetryPolicy, retry_transient};
