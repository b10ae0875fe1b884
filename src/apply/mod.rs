//! Applying rule sets: iptables/ip6tables(-save/-restore) binary detection, locking, state
//! verification, reconcile/cleanup, and the dry-run recorder that prints Istio's transcript.
//! May call: `rules`.
