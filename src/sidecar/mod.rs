//! The sidecar redirect derivation, pure: what is read from a pod's API object ([`pod`]:
//! containers, annotations, the istio-proxy env and IDs), whether a sidecar pod is redirected
//! (Istio's check order), and its annotations turned into the rule engine's
//! [`crate::rules::capture::CaptureConfig`] ([`redirect`]).
//!
//! Its own room because two roles derive the same rules from the same pod: the CNI plugin at ADD
//! and the repair controller fixing a pod that started before the plugin was installed. One
//! derivation, so a repaired pod gets exactly the rules the plugin would have given it. No
//! effects: the caller reads the pod and its own environment and applies the result.
//!
//! May call: `cli`, `rules`.

pub mod pod;
pub mod redirect;

pub use pod::PodInfo;
pub use redirect::{EngineEnv, RedirectError, redirect, skip_reason};
