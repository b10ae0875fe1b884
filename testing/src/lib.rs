//! Test-only stand-ins for istio-cni-rs's integration tests, examples and benchmarks, in a crate of
//! their own so the product's `cargo build` never compiles them (docs/architecture.md, "Test
//! code"): a real node (kubelet + containerd, [`node`]) beside the real control plane
//! ([`controlplane`]), a Kubernetes API server for pods and namespaces ([`apiserver`], also the
//! `test-apiserver` binary), where Istio's own binaries are ([`istio`]) and a ztunnel-like ZDS peer ([`zds_peer`] on the SOCK_SEQPACKET
//! plumbing in [`zds_raw`], also the `zds-peer` binary).
//!
//! Depends on the product (its selector model, ZDS messages); the product's src/ never depends on
//! this crate: its unit tests use `#[cfg(test)]` fakes, since a crate that depends on the product
//! would hand them a second copy of every type.

pub mod apiserver;
pub mod controlplane;
pub mod istio;
pub mod listings;
pub mod node;
pub mod tied;
pub mod zds_peer;
pub mod zds_raw;
