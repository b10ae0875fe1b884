//! The ambient node agent inside `install-cni`. This branch holds its data plane ([`dataplane`]):
//! in-pod and host rules, the probe sets and the /proc netns finder. (The state machine, watches
//! and plugin-event server join it from the agent-core work.)
//! May call: `rules`, `apply`, `netns`, `netlink`.

pub mod dataplane;
