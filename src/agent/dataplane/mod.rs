//! The node agent's data plane: what it programs inside an enrolled pod's netns (redirection to
//! ztunnel and the policy routing, [`Dataplane::program_pod`]), on the host (probe SNAT rules and
//! the probe address sets, never flushed: [`Dataplane::probe_sync`] reconciles), and how it finds a
//! pod's netns (the plugin's path under the host prefix, or a scan of the host's /proc,
//! `crate::netns::procfs`, shared with the repair controller). The backend is decided once at
//! construction ([`crate::apply::backend`]) and logged with its reason. Blocking: callers run these on a blocking thread.
//! Owns nothing of Kubernetes or ZDS; it is given plain pod facts ([`PodNet`]).

pub mod branch_eni;

use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tracing::{info, warn};

use crate::apply::RuleChange;
use crate::apply::ambient::{
    AmbientApply, AmbientError, program_host_here, program_inpod_here, remove_inpod_here,
};
use crate::apply::backend::{BackendRequest, Decision, ProcessHost, Recorded, decide_recorded};
use crate::apply::hostproc::{KubeletUidError, kubelet_uid};
use crate::apply::iptables::ForceBinary;
use crate::apply::pod::Backend;
use crate::apply::probe_set::{self, Entries, Ipsets, NftSets, ProbeSetError, ProbeSets, SetOp};

use crate::netns::reserved::Reserved;
use crate::netns::{Netns, NetnsError};
use crate::rules::ambient::{AmbientConfig, PodOverrides};
use branch_eni::BranchEniProbe;

/// The data plane's settings (from the agent's configuration).
#[derive(Debug, Clone)]
pub struct DataplaneSettings {
    /// Probe SNAT addresses, IPv6 and DNS capture (node-wide).
    pub ambient: AmbientConfig,
    /// `NATIVE_NFTABLES`.
    pub native_nftables: bool,
    /// `FORCE_IPTABLES_BINARY`.
    pub force_iptables_binary: Option<ForceBinary>,
    /// Where the host's / is mounted (`/host`): plugin netns paths are opened under it.
    pub host_prefix: PathBuf,
    /// Where the host's /proc is mounted (`/host/proc`).
    pub host_proc: PathBuf,
    /// `ALLOW_SWITCH_TO_HOST_NS`: host work enters `<host_proc>/1/ns/net` (else it runs in the
    /// agent's own netns, which is the host's for a hostNetwork DaemonSet).
    pub allow_switch_to_host_ns: bool,
    /// `AMBIENT_USE_SCOPED_XTABLES_LOCKING`: each pod's iptables runs take a lock of their own.
    pub scoped_xtables_locking: bool,
    /// Skip the host rules at construction (tests that only program pods).
    pub skip_host_rules: bool,
    /// `AMBIENT_ENABLE_AWS_BRANCH_ENI_PROBE` (active only where the host has
    /// `tcp_early_demux=0`, see [`branch_eni`]).
    pub aws_branch_eni_probe: bool,
    /// The backend recorded at this node's first install (reused; see
    /// [`crate::apply::backend::decide_recorded`]).
    pub recorded: Option<Recorded>,
}

impl Default for DataplaneSettings {
    fn default() -> Self {
        DataplaneSettings {
            ambient: AmbientConfig::default(),
            native_nftables: false,
            force_iptables_binary: None,
            host_prefix: PathBuf::from("/host"),
            host_proc: PathBuf::from("/host/proc"),
            allow_switch_to_host_ns: false,
            scoped_xtables_locking: true,
            skip_host_rules: false,
            aws_branch_eni_probe: true,
            recorded: None,
        }
    }
}

/// One pod as the data plane needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodNet {
    pub uid: String,
    pub name: String,
    pub namespace: String,
    pub ips: Vec<IpAddr>,
    pub overrides: PodOverrides,
}

/// What a probe-set reconcile changed: entries put (back) for a member, entries of no member
/// removed. Empty when the sets already held exactly what they should.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeSynced {
    /// (member UID, IP) entries that were missing or carried another owner.
    pub added: Vec<(String, IpAddr)>,
    /// Entries of no member (pruned).
    pub removed: Vec<IpAddr>,
}

impl ProbeSynced {
    /// From a sync's planned operations (a delete followed by an add of the same IP is an owner
    /// change: counted once, as an add).
    pub fn of(ops: &[SetOp]) -> Self {
        let mut report = ProbeSynced::default();
        for op in ops {
            if let SetOp::Add { ip, uid } = op {
                report.added.push((uid.clone(), *ip));
            }
        }
        for op in ops {
            if let SetOp::Del { ip } = op
                && !report.added.iter().any(|(_, a)| a == ip)
            {
                report.removed.push(*ip);
            }
        }
        report
    }

    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty()
    }
}

/// Why a data-plane step failed. Every variant names the object.
#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    #[error("cannot open the pod network namespace {path}: {source}")]
    OpenNetns {
        path: PathBuf,
        #[source]
        source: NetnsError,
    },
    #[error("cannot enter the network namespace of pod {pod}: {source}")]
    Enter {
        pod: String,
        #[source]
        source: NetnsError,
    },
    #[error("cannot read the addresses in netns {path} offered for pod {pod}: {source}")]
    Addresses {
        pod: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("in-pod rules of pod {pod}: {source}")]
    Inpod {
        pod: String,
        #[source]
        source: AmbientError,
    },
    #[error("host network namespace {path}: {source}")]
    HostNetns {
        path: PathBuf,
        #[source]
        source: NetnsError,
    },
    #[error("host probe SNAT rules: {0}")]
    HostRules(#[source] AmbientError),
    #[error("host probe set ({what}): {source}")]
    ProbeSet {
        what: String,
        #[source]
        source: ProbeSetError,
    },
    #[error("kubelet UID for the nftables probe rule: {0}")]
    KubeletUid(#[source] KubeletUidError),
    #[error("AWS branch-ENI probe rules ({what}): {source}")]
    BranchEni {
        what: String,
        #[source]
        source: crate::netlink::routes::NetlinkError,
    },
}

/// The data plane of one node.
pub struct Dataplane {
    settings: DataplaneSettings,
    decision: Decision,
    host_netns: Option<Netns>,
    /// Held by one probe-set change from its read to its last netlink message (never across a
    /// process): see [`probe_set::change`].
    probe_serial: Arc<Mutex<()>>,
    /// The AWS branch-ENI probe routing of enrolled pods (inert on other hosts).
    branch_eni: Arc<BranchEniProbe>,
    /// The netns no pod may claim (`netns::reserved`), identified once.
    reserved: Reserved,
    /// `NATIVE_NFTABLES` changed since the recorded decision: the old backend, whose in-pod
    /// rules each pod loses the first time it is programmed (the drift pass's first run reaches
    /// every pod).
    migrate_from: Option<Recorded>,
    /// Pods (netns identity) already rid of the old backend's rules.
    migrated: Mutex<std::collections::HashSet<crate::netns::NetnsId>>,
}

impl Dataplane {
    /// Decides the backend (logged with its reason) and programs the host rules and probe sets
    /// (created, never flushed), in the host netns.
    pub fn new(settings: &DataplaneSettings) -> Result<Self, DataplaneError> {
        let host_netns = if settings.allow_switch_to_host_ns {
            let path = settings.host_proc.join("1/ns/net");
            Some(Netns::open(&path).map_err(|source| DataplaneError::HostNetns { path, source })?)
        } else {
            None
        };
        let req = BackendRequest {
            native_nftables: settings.native_nftables,
            restore_only: false,
            force_binary: settings.force_iptables_binary,
        };
        let ipv6 = settings.ambient.enable_ipv6;
        let recorded = settings.recorded;
        let (decision, migrate_from) = in_host(&host_netns, move || {
            decide_recorded(&req, ipv6, &ProcessHost, recorded.as_ref())
        })?;
        if let Some(w) = &decision.warning {
            warn!("{w}");
        }
        info!(backend = ?decision.backend, flavour = ?decision.force_binary, reason = %decision.reason, "ambient data plane backend");
        let branch_eni = BranchEniProbe::new(settings.aws_branch_eni_probe, &settings.host_proc);
        if branch_eni.active() {
            info!("AWS branch-ENI probe routing is on (the host has tcp_early_demux=0)");
        }
        let reserved = Reserved::identify(&settings.host_proc);
        if let Some(why) = reserved.unidentified() {
            warn!("refusing every pod network namespace (fail closed): {why}");
        }
        let dp = Dataplane {
            settings: settings.clone(),
            decision,
            host_netns,
            probe_serial: Arc::default(),
            branch_eni: Arc::new(branch_eni),
            reserved,
            migrate_from,
            migrated: Mutex::default(),
        };
        if !settings.skip_host_rules {
            if let Some(old) = &dp.migrate_from {
                dp.remove_host(old)?;
            }
            dp.program_host()?;
        }
        Ok(dp)
    }

    /// The backend decision made at construction.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    fn nftables(&self) -> bool {
        self.decision.backend == Backend::Nftables
    }

    fn apply_opts(&self, netns: Option<&Netns>) -> AmbientApply {
        AmbientApply {
            nftables: self.nftables(),
            force_binary: self.decision.force_binary,
            env: match netns {
                Some(ns) if self.settings.scoped_xtables_locking => vec![(
                    "XTABLES_LOCKFILE".to_string(),
                    ns.path().display().to_string(),
                )],
                _ => vec![],
            },
            userns: netns.and_then(|ns| ns.userns_entry().cloned()),
        }
    }

    /// Programs the host probe SNAT rules and probe sets, reading first: `None` when they were
    /// in place (nothing written), else what was missing or different and was re-applied.
    fn program_host(&self) -> Result<Option<String>, DataplaneError> {
        let cfg = self.settings.ambient.clone();
        let uid = if self.nftables() {
            kubelet_uid(&self.settings.host_proc).map_err(DataplaneError::KubeletUid)?
        } else {
            String::new()
        };
        let opts = self.apply_opts(None);
        in_host(&self.host_netns, move || {
            program_host_here(&cfg, &uid, &opts)
        })?
        .map_err(DataplaneError::HostRules)
    }

    /// The drift pass's host check: the probe SNAT rules (chain, jump or table) and the probe
    /// sets compared with the plan and re-applied where they differ. `None`: all in place.
    pub fn verify_host(&self) -> Result<Option<String>, DataplaneError> {
        if self.settings.skip_host_rules {
            return Ok(None);
        }
        self.program_host()
    }

    /// The old backend's host rules and probe sets removed (a `NATIVE_NFTABLES` migration): the
    /// new backend's are programmed right after, and every pod is put back by the sync.
    fn remove_host(&self, old: &Recorded) -> Result<(), DataplaneError> {
        let mut opts = self.apply_opts(None);
        opts.nftables = old.backend == Backend::Nftables;
        opts.force_binary = old.force_binary;
        info!(from = ?old.backend, to = ?self.decision.backend, "NATIVE_NFTABLES changed: removing the old backend's host rules");
        self.remove_host_with(opts)
    }

    /// This backend's host probe SNAT rules and probe sets removed, in the host netns: an
    /// uninstall (not an upgrade), after which nothing on the node may keep naming them.
    pub fn uninstall_host(&self) -> Result<(), DataplaneError> {
        if self.settings.skip_host_rules {
            return Ok(());
        }
        self.remove_host_with(self.apply_opts(None))
    }

    fn remove_host_with(&self, opts: AmbientApply) -> Result<(), DataplaneError> {
        let ipv6 = self.settings.ambient.enable_ipv6;
        in_host(&self.host_netns, move || {
            crate::apply::ambient::remove_host_here(&opts, ipv6)
        })?
        .map_err(DataplaneError::HostRules)
    }

    /// Opens a netns path the plugin reported (a host path) under the host prefix.
    pub fn open_netns(&self, cni_netns_path: &str) -> Result<Netns, DataplaneError> {
        let path = host_path(&self.settings.host_prefix, cni_netns_path);
        Netns::open(&path).map_err(|source| DataplaneError::OpenNetns { path, source })
    }

    /// The agent's own netns and the node's, by identity (learnt at construction); when they
    /// could not be identified, every netns is refused.
    pub fn reserved_netns(&self) -> Reserved {
        self.reserved.clone()
    }

    /// The interface addresses inside the netns offered for `pod`.
    pub fn netns_addresses(
        &self,
        netns: &Netns,
        pod: &PodNet,
    ) -> Result<Vec<IpAddr>, DataplaneError> {
        crate::netlink::addresses_in(netns).map_err(|source| DataplaneError::Addresses {
            pod: pod_ref(pod),
            path: netns.path().to_path_buf(),
            source,
        })
    }

    /// Finds the netns of each wanted pod (uid -> its IPs) by scanning the host's /proc; pods not
    /// found (or without IPs yet) are absent from the answer.
    pub fn find_netns(&self, wanted: &HashMap<String, Vec<IpAddr>>) -> HashMap<String, Netns> {
        crate::netlink::find_pod_netns(&self.reserved, wanted).unwrap_or_else(|why| {
            warn!(pods = wanted.len(), "no pod's netns looked up: {why}");
            HashMap::new()
        })
    }

    /// Programs the in-pod redirection and policy routing; idempotent (an unchanged pod is not
    /// touched) and all or nothing.
    pub fn program_pod(&self, netns: &Netns, pod: &PodNet) -> Result<RuleChange, DataplaneError> {
        let cfg = self.settings.ambient.clone();
        let overrides = pod.overrides.clone();
        let opts = self.apply_opts(Some(netns));
        let old = self
            .migrate_from
            .filter(|_| !self.migrated.lock().contains(&netns.id()));
        let old_opts = old.map(|old| AmbientApply {
            nftables: old.backend == Backend::Nftables,
            force_binary: old.force_binary,
            ..self.apply_opts(Some(netns))
        });
        let outcome = in_pod(netns, pod, move || {
            if let Some(old_opts) = &old_opts {
                remove_inpod_here(old_opts)?;
            }
            program_inpod_here(&cfg, &overrides, &opts)
        })?;
        if old.is_some() {
            info!(pod = %pod_ref(pod), "the old backend's in-pod rules removed (NATIVE_NFTABLES changed)");
            self.migrated.lock().insert(netns.id());
        }
        tracing::debug!(pod = %pod_ref(pod), %outcome, "in-pod rules");
        Ok(outcome)
    }

    /// Removes the in-pod rules and policy routing.
    pub fn unprogram_pod(&self, netns: &Netns, pod: &PodNet) -> Result<(), DataplaneError> {
        let opts = self.apply_opts(Some(netns));
        in_pod(netns, pod, move || remove_inpod_here(&opts))
    }

    /// The addresses of `ips` the node has a probe set for: with `AMBIENT_IPV6=false` there is no
    /// IPv6 set (nor IPv6 tooling), so a dual-stack pod's IPv6 address is left out, not an error.
    fn probed(&self, ips: &[IpAddr]) -> Vec<IpAddr> {
        let ipv6 = self.settings.ambient.enable_ipv6;
        ips.iter()
            .copied()
            .filter(|ip| ipv6 || ip.is_ipv4())
            .collect()
    }

    /// Puts the pod's IPs into the probe sets under its UID (a reused IP moves to this UID).
    /// Planned against `believed` when given: what the pod cache says the sets hold at these IPs
    /// and for this UID (no dump; see [`probe_set::change_believed`]); else against the sets as
    /// the kernel holds them.
    pub fn probe_add(
        &self,
        uid: &str,
        ips: &[IpAddr],
        believed: Option<&Entries>,
    ) -> Result<(), DataplaneError> {
        let (owner, wanted) = (uid.to_string(), self.probed(ips));
        self.probe_pod(
            format!("add pod {uid}"),
            ips,
            believed,
            true,
            move |current| probe_set::plan_upsert(current, &owner, &wanted),
        )
    }

    /// One pod's probe change: the sets as `plan` says (against `believed` when given), then
    /// its branch-ENI probe rules added (`add`) or removed.
    fn probe_pod(
        &self,
        what: String,
        ips: &[IpAddr],
        believed: Option<&Entries>,
        add: bool,
        plan: impl Fn(&Entries) -> Vec<SetOp> + Send + 'static,
    ) -> Result<(), DataplaneError> {
        let believed = believed.map(|b| self.probed_entries(b));
        self.probe_change(what.clone(), believed, plan)?;
        self.branch_eni_step(what, ips, add)
    }

    /// Adds (`add`) or removes the branch-ENI probe rules of `ips`, in the host netns.
    fn branch_eni_step(
        &self,
        what: String,
        ips: &[IpAddr],
        add: bool,
    ) -> Result<(), DataplaneError> {
        if !self.branch_eni.active() || ips.is_empty() {
            return Ok(());
        }
        let (probe, ips) = (self.branch_eni.clone(), ips.to_vec());
        in_host(&self.host_netns, move || {
            if add {
                probe.add(&ips).map(|_| ())
            } else {
                probe.remove(&ips)
            }
        })?
        .map_err(|source| DataplaneError::BranchEni { what, source })
    }

    /// Removes the pod's IPs from the probe sets, only where the entry carries its UID (planned
    /// against `believed` or the kernel's sets, as [`Dataplane::probe_add`]).
    pub fn probe_remove(
        &self,
        uid: &str,
        ips: &[IpAddr],
        believed: Option<&Entries>,
    ) -> Result<(), DataplaneError> {
        let (owner, gone) = (uid.to_string(), ips.to_vec());
        self.probe_pod(format!("remove pod {uid}"), ips, believed, false, move |current| {
            let (ops, foreign) = probe_set::plan_remove(current, &owner, &gone);
            for ip in foreign {
                warn!(pod = %owner, %ip, "probe set entry belongs to another pod; left in place");
            }
            ops
        })
    }

    /// Reconciles the probe sets with the enrolled pods (never flushed: members stay present
    /// throughout); with `prune`, entries of no member are removed. The sets are read first
    /// (the kernel is the truth); returns what had to change.
    pub fn probe_sync(
        &self,
        members: &[(String, Vec<IpAddr>)],
        prune: bool,
    ) -> Result<ProbeSynced, DataplaneError> {
        let wanted: Vec<(String, Vec<IpAddr>)> = members
            .iter()
            .map(|(uid, ips)| (uid.clone(), self.probed(ips)))
            .collect();
        let ops = self.probe_change("sync".to_string(), None, move |current| {
            probe_set::plan_sync(current, &wanted, prune)
        })?;
        // Re-learns (and re-adds where missing) every member's branch-ENI rules, so a restarted
        // agent can still remove them.
        let ips: Vec<IpAddr> = members
            .iter()
            .flat_map(|(_, ips)| ips.iter().copied())
            .collect();
        self.branch_eni_step("sync".to_string(), &ips, true)?;
        Ok(ProbeSynced::of(&ops))
    }

    /// The believed entries this data plane's sets can hold (no IPv6 ones without IPv6).
    fn probed_entries(&self, believed: &Entries) -> Entries {
        let ipv6 = self.settings.ambient.enable_ipv6;
        believed
            .iter()
            .filter(|(ip, _)| ipv6 || ip.is_ipv4())
            .map(|(ip, uid)| (*ip, uid.clone()))
            .collect()
    }

    /// Plans one probe-set change and applies it over netlink, in the host netns: against
    /// `believed` when given ([`probe_set::change_believed`]), else against the sets as the
    /// kernel holds them ([`probe_set::change`]); returns the operations applied.
    fn probe_change(
        &self,
        what: String,
        believed: Option<Entries>,
        plan: impl Fn(&Entries) -> Vec<SetOp> + Send + 'static,
    ) -> Result<Vec<SetOp>, DataplaneError> {
        let (nft, ipv6) = (self.nftables(), self.settings.ambient.enable_ipv6);
        let serial = self.probe_serial.clone();
        in_host(&self.host_netns, move || {
            let sets: &dyn ProbeSets = if nft { &NftSets } else { &Ipsets };
            match &believed {
                Some(believed) => probe_set::change_believed(sets, &serial, ipv6, believed, &plan),
                None => probe_set::change(sets, &serial, ipv6, &plan),
            }
        })?
        .map_err(|source| DataplaneError::ProbeSet { what, source })
    }
}

/// Runs host work in the host netns (entered when configured), else right here.
fn in_host<T: Send + 'static>(
    host: &Option<Netns>,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, DataplaneError> {
    let work = move || crate::netlink::nfnl::with_session(work);
    match host {
        Some(ns) => ns.run(work).map_err(|source| DataplaneError::HostNetns {
            path: ns.path().to_path_buf(),
            source,
        }),
        None => Ok(work()),
    }
}

/// `<prefix>/<path>` for an absolute host path.
pub fn host_path(prefix: &Path, path: &str) -> PathBuf {
    prefix.join(path.trim_start_matches('/'))
}

fn pod_ref(pod: &PodNet) -> String {
    format!("{}/{} ({})", pod.namespace, pod.name, pod.uid)
}

/// Runs in-pod work inside the pod's netns; entering and the work itself fail as their own kinds
/// (the agent retries neither).
fn in_pod<T: Send + 'static>(
    netns: &Netns,
    pod: &PodNet,
    work: impl FnOnce() -> Result<T, AmbientError> + Send + 'static,
) -> Result<T, DataplaneError> {
    // One nfnetlink socket for all of the pod's dumps and requests (a drift check makes several).
    netns
        .run(move || crate::netlink::nfnl::with_session(work))
        .map_err(|source| DataplaneError::Enter {
            pod: pod_ref(pod),
            source,
        })?
        .map_err(|source| DataplaneError::Inpod {
            pod: pod_ref(pod),
            source,
        })
}

#[cfg(test)]
mod tests;
