//! istio-cni in Rust: one multicall executable that is the CNI plugin (`istio-cni`), the installer
//! and node agent (`install-cni`) and the rule tool (`istio-iptables`).
//!
//! Rooms (one folder each) and who may call whom — data flows one way (`tests/room_boundaries.rs`
//! holds every room to this table and to docs/architecture.md's copy of it):
//! CLI/env -> typed config -> decision -> rule model -> renderer -> applier.
//!
//! | room | owns | may call |
//! | --- | --- | --- |
//! | [`cli`] | argv normalising (pflag forms), env fallbacks shared by every role, the settings engine (`settings`: each setting declared once -> flags, env fallback, `--help`, the docs tables) | — |
//! | [`rules`] | the redirect rule model, its builders (sidecar capture, ambient) and renderers (iptables-restore text, nftables, the iptables-nft and probe-set messages as a neutral description for the netlink transport, and their decoders) — pure, no effects | — |
//! | [`iptables_cmd`] | the `istio-iptables` role: flags/env -> capture config -> rules -> apply/dry-run/validation | `cli`, `rules`, `apply`, `netns`, `netlink`, `telemetry` |
//! | [`apply`] | applying rule sets all or nothing: one nf_tables transaction, or iptables/ip6tables(-save/-restore) and nft: binary detection, locking, verify/reconcile/rollback (the outcome and the snapshot in one place, `outcome`), the cleanup plan, dry-run recording; which routes a sidecar capture needs; the one entry programming (or verifying) a netns for both roles (`pod`) | `rules`, `netlink`, `netns` |
//! | [`netns`] | the netns handle (with the user namespace owning it), entered on a dedicated thread or by a child process; finding a pod's netns in the host /proc by the pod UID in the cgroup path (`procfs`) | — |
//! | [`netlink`] | the netlink transport: wire format (headers, batch framing, sequence numbers, replies), addresses (and the /proc scan's address probe), ip rules and routes via rtnetlink with plain parameters, nf_tables transactions via nfnetlink, single nfnetlink requests and dumps (ipset, nf_tables reads) | `netns` |
//! | [`reconcile`] | the one keyed reconcile engine for pod work: a key never worked twice at once, triggers coalesced, bounded concurrency, the error's class deciding retry (jittered backoff) / give up / wait, a caller awaiting the run after its trigger | `retry` |
//! | [`retry`] | retry spacing (doubling, equal jitter, through backon) and the loop retrying only transient failures under a deadline; the periodic pass schedule (jittered period, early kick) of the drift verifiers | — |
//! | [`kube`] | the one Kubernetes client module (kubeconfig/in-cluster, typed helpers), the node stores and when a stored pod may be answered for (`lookup`) | `retry` |
//! | [`sidecar`] | the sidecar redirect derivation, pure: pod facts from the API object, Istio's selection checks, annotations -> capture config; shared by the plugin and the repair controller | `cli`, `rules` |
//! | [`plugin`] | the `istio-cni` CNI plugin role | `cli`, `rules`, `sidecar`, `apply`, `netns`, `kube`, `retry`, `telemetry`, `wire` |
//! | [`install`] | the `install-cni` role: binary + conflist + kubeconfig install, guard loop, cleanup; the one node pod store and the pod-facts socket; starts the ambient agent and the repair controller | `cli`, `kube`, `retry`, `telemetry`, `agent`, `repair`, `wire` |
//! | [`repair`] | the repair controller: is a sidecar pod broken (pure), the reconcile over the node pod store on the one engine (once per UID, jittered backoff), repair/delete/label; the sidecar drift pass (verify, heal in place, or hand to the controller's policy) | `cli`, `kube`, `retry`, `reconcile`, `sidecar`, `apply`, `netns`, `netlink`, `telemetry` |
//! | [`agent`] | the ambient node agent: settings, the pure enrolment state machine, pod cache, add/remove steps, the reconcile of one pod over the one engine (fed by the kube stores, the plugin and the drift pass), plugin-event server, startup and shutdown, the periodic drift pass (verify and heal enrolled pods' rules and the probe set); its data plane (`dataplane`: in-pod and host rules, probe sets); ZDS through `zds` | `cli`, `kube`, `retry`, `reconcile`, `rules`, `sidecar`, `apply`, `netns`, `netlink`, `telemetry`, `zds`, `wire` |
//! | [`telemetry`] | logging setup, plugin log sink, health/readiness and metrics servers; the one binder (`socket`) and server (`serve`) of every local socket and port | `wire` |
//! | [`zds`] | the ZDS server handing enrolled pods' netns fds to ztunnel: protocol messages, the SOCK_SEQPACKET socket, per-connection snapshot and lock-step updates, NACK backoff | `netns`, `retry`, `telemetry` |
//! | [`wire`] | the one plugin <-> node protocol, pure data: `/cmdadd` and `/podadd` on `pluginevent.sock` (the event, the answer, the typed `AddFailure`), the pod-facts socket's request and answer, a pod trimmed to what the plugin reads, the log sink's records | — |

pub mod agent;
pub mod apply;
pub mod cli;
pub mod install;
pub mod iptables_cmd;
pub mod kube;
pub mod netlink;
pub mod netns;
pub mod plugin;
pub mod reconcile;
pub mod repair;
pub mod retry;
pub mod rules;
pub mod sidecar;
pub mod telemetry;
pub mod wire;
pub mod zds;

/// The version printed by `--version` on every role.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
