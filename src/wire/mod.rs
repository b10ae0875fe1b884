//! The one plugin <-> node protocol: every request and answer the `istio-cni` plugin exchanges
//! with the node's long-lived process, as typed values with their JSON encoding, shared by both
//! ends so an older plugin and a newer agent (or the other way round) read each other. Pure data:
//! no sockets, no stores.
//!
//! Files, lower first: [`event`] (Istio's `/cmdadd` body on `pluginevent.sock`), [`pod`] (a pod
//! trimmed to what the plugin reads), [`pod_add`] (our `/podadd`: its request, its answer and the
//! typed [`pod_add::AddFailure`]), [`pod_facts`] (the pod-facts socket's request and answer), [`log`]
//! (the log sink's records).
//!
//! May call: nothing (leaf).

pub mod event;
pub mod log;
pub mod pod;
pub mod pod_add;
pub mod pod_facts;
