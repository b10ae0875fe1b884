//! The pod cache: enrolled pod UID -> workload identity and netns handle. It is the ZDS
//! "state of the world": a connecting ztunnel gets a snapshot of it. Handles close when the last
//! `Arc` goes (no explicit close). Each entry also keeps the IPs the agent put in the host probe
//! set for the pod: the expected state the drift pass reconciles the set with.

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use super::ports::PodWorkload;
use crate::netns::Netns;

#[derive(Debug, Clone)]
pub struct CachedPod {
    pub info: PodWorkload,
    pub netns: Option<Arc<Netns>>,
    /// The pod's probe-set entries: `Some(ips)` as the agent wrote them (empty: none expected,
    /// e.g. a pod ztunnel has not taken yet), `None` when unknown (restored at startup without
    /// an IP) — a probe-set reconcile then must not prune.
    pub probe_ips: Option<Vec<IpAddr>>,
    /// Enrolled by a plugin's `/podadd`, whose `enabled` annotation is written after the answer
    /// and not yet confirmed (the pod's key retries it; the drift pass looks again).
    pub annotation_owed: bool,
    /// Programmed, but ztunnel has not taken it yet (the add is to be tried again).
    pub awaiting_ztunnel: bool,
    /// The addresses verified at the pod's ADD when they hold one no status can (see
    /// [`super::cni_ips`]); kept in the record, so a restarted agent can learn them again.
    pub cni_ips: Vec<IpAddr>,
}

#[derive(Debug, Default)]
pub struct PodCache {
    pods: RwLock<Pods>,
    /// Whether the probe sets are known to hold nothing the cache does not record: set by a
    /// sync that pruned (the kernel then holds exactly the members). Until then (a restarted
    /// agent may find entries an earlier one wrote for pods it does not know) a change is
    /// planned against the kernel's entries, not the belief.
    belief_complete: std::sync::atomic::AtomicBool,
    /// Where the pods' [`CachedPod::cni_ips`] are recorded (unset: not recorded), and the lock
    /// one rewrite of that record holds.
    record_dir: std::sync::OnceLock<std::path::PathBuf>,
    record_lock: parking_lot::Mutex<()>,
}

/// The entries by UID, and the UIDs by `namespace/name` (a run of a pod's key asks for the
/// pods of its name: a lookup, not a walk over every enrolled pod).
#[derive(Debug, Default)]
struct Pods {
    by_uid: HashMap<String, CachedPod>,
    by_name: HashMap<(String, String), Vec<String>>,
}

impl Pods {
    fn name_of(info: &PodWorkload) -> (String, String) {
        (info.namespace.clone(), info.name.clone())
    }

    fn index(&mut self, uid: &str, info: &PodWorkload) {
        let uids = self.by_name.entry(Self::name_of(info)).or_default();
        if !uids.iter().any(|u| u == uid) {
            uids.push(uid.to_string());
        }
    }

    fn unindex(&mut self, uid: &str, info: &PodWorkload) {
        let name = Self::name_of(info);
        if let Some(uids) = self.by_name.get_mut(&name) {
            uids.retain(|u| u != uid);
            if uids.is_empty() {
                self.by_name.remove(&name);
            }
        }
    }

    fn insert(&mut self, uid: &str, pod: CachedPod) {
        if let Some(old) = self.by_uid.get(uid) {
            let info = old.info.clone();
            self.unindex(uid, &info);
        }
        self.index(uid, &pod.info);
        self.by_uid.insert(uid.to_string(), pod);
    }

    fn remove(&mut self, uid: &str) -> Option<CachedPod> {
        let pod = self.by_uid.remove(uid)?;
        self.unindex(uid, &pod.info);
        Some(pod)
    }
}

impl std::ops::Deref for Pods {
    type Target = HashMap<String, CachedPod>;
    fn deref(&self) -> &Self::Target {
        &self.by_uid
    }
}

impl PodCache {
    fn read(&self) -> RwLockReadGuard<'_, Pods> {
        self.pods.read()
    }

    fn write(&self) -> RwLockWriteGuard<'_, Pods> {
        self.pods.write()
    }

    /// An entry's fields other than its identity (which [`Pods::insert`] indexes).
    fn entry_mut<'a>(pods: &'a mut Pods, uid: &str) -> Option<&'a mut CachedPod> {
        pods.by_uid.get_mut(uid)
    }

    /// A placeholder without a netns, unless the pod is already there.
    pub fn ensure(&self, uid: &str, info: PodWorkload) {
        let mut pods = self.write();
        if pods.contains_key(uid) {
            return;
        }
        pods.insert(
            uid,
            CachedPod {
                info,
                netns: None,
                probe_ips: Some(vec![]),
                annotation_owed: false,
                awaiting_ztunnel: false,
                cni_ips: vec![],
            },
        );
    }

    /// Records the pod's netns. An entry holding the same namespace (dev, inode) keeps its
    /// handle (the new one is dropped); identity is refreshed either way. Returns the kept one.
    pub fn upsert(&self, uid: &str, info: PodWorkload, netns: impl Into<Arc<Netns>>) -> Arc<Netns> {
        let netns = netns.into();
        let mut pods = self.write();
        let mut entry = pods.remove(uid).unwrap_or(CachedPod {
            info: info.clone(),
            netns: None,
            probe_ips: Some(vec![]),
            annotation_owed: false,
            awaiting_ztunnel: false,
            cni_ips: vec![],
        });
        entry.info = info;
        let kept = match &entry.netns {
            Some(old) if old.id() == netns.id() => old.clone(),
            _ => {
                entry.netns = Some(netns.clone());
                netns
            }
        };
        pods.insert(uid, entry);
        kept
    }

    pub fn netns(&self, uid: &str) -> Option<Arc<Netns>> {
        self.read().get(uid).and_then(|p| p.netns.clone())
    }

    /// Records the pod's probe-set entries (see [`CachedPod::probe_ips`]); a pod not cached is
    /// left out.
    pub fn set_probe_ips(&self, uid: &str, ips: Option<Vec<IpAddr>>) {
        if let Some(pod) = Self::entry_mut(&mut self.write(), uid) {
            pod.probe_ips = ips;
        }
    }

    /// What the probe set should hold: (UID, IPs) of every cached pod with entries, and whether
    /// every pod's entries are known (only then may strangers be pruned).
    pub fn probe_members(&self) -> (Vec<(String, Vec<IpAddr>)>, bool) {
        let pods = self.read();
        let known = pods.values().all(|p| p.probe_ips.is_some());
        let mut members: Vec<(String, Vec<IpAddr>)> = pods
            .iter()
            .filter_map(|(uid, p)| match &p.probe_ips {
                Some(ips) if !ips.is_empty() => Some((uid.clone(), ips.clone())),
                _ => None,
            })
            .collect();
        members.sort();
        (members, known)
    }

    /// (UID, IP) of every cached pod but `except_uid` whose probe entries hold one of `ips`.
    pub fn owners_of(&self, ips: &[IpAddr], except_uid: &str) -> Vec<(String, IpAddr)> {
        let pods = self.read();
        let mut owners = Vec::new();
        for (uid, p) in pods.iter().filter(|(uid, _)| uid.as_str() != except_uid) {
            for ip in p.probe_ips.iter().flatten() {
                if ips
                    .iter()
                    .any(|held| crate::netns::procfs::same_ip(*held, *ip))
                {
                    owners.push((uid.clone(), *ip));
                }
            }
        }
        owners
    }

    /// What the probe set holds around a change of `uid` at `ips`, as the cache believes: the
    /// entries at those IPs (whichever pod recorded them) and `uid`'s own. A change is planned
    /// from this instead of a dump of the set (the mesh holds its probe gate meanwhile).
    /// `None` while the belief may be incomplete ([`PodCache::probe_set_synced`]).
    pub fn probe_believed(&self, uid: &str, ips: &[IpAddr]) -> Option<BTreeMap<IpAddr, String>> {
        if !self
            .belief_complete
            .load(std::sync::atomic::Ordering::Acquire)
        {
            return None;
        }
        let pods = self.read();
        let mut believed = BTreeMap::new();
        if let Some(own) = pods.get(uid).and_then(|p| p.probe_ips.as_ref()) {
            for ip in own {
                believed.insert(*ip, uid.to_string());
            }
        }
        // Another pod's record of one of these IPs wins over `uid`'s own: an add then writes the
        // entry for certain, and a removal leaves it (at worst a stale entry the drift pass
        // prunes; never another pod's entry deleted).
        let own: Vec<IpAddr> = believed.keys().copied().collect();
        for (owner, p) in pods.iter().filter(|(owner, _)| owner.as_str() != uid) {
            for ip in p.probe_ips.iter().flatten() {
                if ips.contains(ip) || own.contains(ip) {
                    believed.insert(*ip, owner.clone());
                }
            }
        }
        Some(believed)
    }

    /// A probe-set sync succeeded; `pruned`: it removed every entry of no member, so the sets
    /// now hold exactly what the cache records and changes may be planned from the belief.
    pub fn probe_set_synced(&self, pruned: bool) {
        if pruned {
            self.belief_complete
                .store(true, std::sync::atomic::Ordering::Release);
        }
    }

    /// Marks (or clears) the pod's `enabled` annotation as owed; a pod not cached is left out.
    pub fn set_annotation_owed(&self, uid: &str, owed: bool) {
        if let Some(pod) = Self::entry_mut(&mut self.write(), uid) {
            pod.annotation_owed = owed;
        }
    }

    /// Marks (or clears) the pod as programmed but not taken by ztunnel yet.
    pub fn set_awaiting_ztunnel(&self, uid: &str, awaiting: bool) {
        if let Some(pod) = Self::entry_mut(&mut self.write(), uid) {
            pod.awaiting_ztunnel = awaiting;
        }
    }

    /// Whether the pod is cached with its `enabled` annotation still owed.
    pub fn annotation_owed(&self, uid: &str) -> bool {
        self.read().get(uid).is_some_and(|p| p.annotation_owed)
    }

    pub fn contains(&self, uid: &str) -> bool {
        self.read().contains_key(uid)
    }

    /// Removes and returns the entry (a second take finds nothing).
    pub fn take(&self, uid: &str) -> Option<CachedPod> {
        let taken = self.write().remove(uid);
        if taken.as_ref().is_some_and(|p| !p.cni_ips.is_empty()) {
            self.persist_cni_ips();
        }
        taken
    }

    /// Puts a taken entry back (a failed removal will be retried).
    pub fn restore(&self, uid: &str, pod: CachedPod) {
        let recorded = !pod.cni_ips.is_empty();
        self.write().insert(uid, pod);
        if recorded {
            self.persist_cni_ips();
        }
    }

    /// Records the pod's [`CachedPod::cni_ips`] (a pod not cached is left out) and rewrites the
    /// record when they changed.
    pub fn set_cni_ips(&self, uid: &str, ips: Vec<IpAddr>) {
        let changed = match Self::entry_mut(&mut self.write(), uid) {
            Some(pod) if pod.cni_ips != ips => {
                pod.cni_ips = ips;
                true
            }
            _ => false,
        };
        if changed {
            self.persist_cni_ips();
        }
    }

    /// Records the pods' [`CachedPod::cni_ips`] in `dir` from now on (set once, at startup).
    pub fn record_cni_ips_in(&self, dir: std::path::PathBuf) {
        let _ = self.record_dir.set(dir);
    }

    /// Rewrites the record from the cache; a failure is logged (the pods stay enrolled, only a
    /// restart would not learn their second addresses again).
    pub fn persist_cni_ips(&self) {
        let Some(dir) = self.record_dir.get() else {
            return;
        };
        let _one_at_a_time = self.record_lock.lock();
        let record: super::cni_ips::Record = self
            .read()
            .iter()
            .filter(|(_, p)| !p.cni_ips.is_empty())
            .map(|(uid, p)| (uid.clone(), p.cni_ips.clone()))
            .collect();
        if let Err(e) = super::cni_ips::write(dir, &record) {
            tracing::warn!("{e}; after a restart these pods' second addresses are not known");
        }
    }

    /// The entries of pods named `namespace/name` (UID, entry): more than one only while a
    /// deleted pod's successor of the same name is there too.
    pub fn named(&self, namespace: &str, name: &str) -> Vec<(String, CachedPod)> {
        let pods = self.read();
        let key = (namespace.to_string(), name.to_string());
        pods.by_name
            .get(&key)
            .into_iter()
            .flatten()
            .filter_map(|uid| pods.get(uid).map(|p| (uid.clone(), p.clone())))
            .collect()
    }

    /// A copy for sending (UID, entry).
    pub fn snapshot(&self) -> Vec<(String, CachedPod)> {
        self.read()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.read().len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str) -> PodWorkload {
        PodWorkload {
            name: name.into(),
            ..Default::default()
        }
    }

    #[test]
    fn ensure_upsert_take() {
        let cache = PodCache::default();
        cache.ensure("u", info("a"));
        assert!(cache.contains("u") && cache.netns("u").is_none());
        let first = cache.upsert("u", info("a"), Netns::current().unwrap());
        // Same namespace again: the old handle is kept.
        let again = cache.upsert("u", info("b"), Netns::current().unwrap());
        assert!(Arc::ptr_eq(&first, &again));
        assert_eq!(cache.snapshot()[0].1.info.name, "b");
        assert_eq!(
            cache.probe_members(),
            (vec![], true),
            "no entries expected yet"
        );
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        cache.set_probe_ips("u", Some(vec![ip]));
        cache.ensure("v", info("c"));
        assert_eq!(cache.probe_members(), (vec![("u".into(), vec![ip])], true));
        cache.set_probe_ips("v", None);
        assert!(!cache.probe_members().1, "an unknown pod forbids pruning");
        cache.set_probe_ips("gone", Some(vec![ip]));
        assert!(!cache.contains("gone"));
        assert!(cache.take("u").is_some());
        assert!(cache.take("u").is_none());
        cache.take("v");
        assert!(cache.is_empty());
    }

    #[test]
    fn pods_are_found_by_name_and_the_belief_names_each_ips_owner() {
        let cache = PodCache::default();
        let named = |ns: &str, name: &str| -> Vec<String> {
            let mut uids: Vec<String> = cache.named(ns, name).into_iter().map(|(u, _)| u).collect();
            uids.sort();
            uids
        };
        let at = |ns: &str, name: &str| PodWorkload {
            namespace: ns.into(),
            name: name.into(),
            ..Default::default()
        };
        cache.ensure("old", at("shop", "web-0"));
        cache.upsert("new", at("shop", "web-0"), Netns::current().unwrap());
        cache.ensure("other", at("shop", "web-1"));
        assert_eq!(named("shop", "web-0"), ["new", "old"]);
        assert_eq!(named("shop", "web-1"), ["other"]);
        assert!(named("bank", "web-0").is_empty());
        let taken = cache.take("old").unwrap();
        assert_eq!(named("shop", "web-0"), ["new"]);
        cache.restore("old", taken);
        assert_eq!(named("shop", "web-0"), ["new", "old"]);

        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        cache.set_probe_ips("old", Some(vec![ip("10.0.0.1")]));
        cache.set_probe_ips("new", Some(vec![ip("10.0.0.2")]));
        cache.set_probe_ips("other", Some(vec![ip("10.0.0.9")]));
        // Nothing is believed before a pruning sync (a restarted agent's sets may hold more).
        assert_eq!(cache.probe_believed("new", &[ip("10.0.0.1")]), None);
        cache.probe_set_synced(false);
        assert_eq!(cache.probe_believed("new", &[ip("10.0.0.1")]), None);
        cache.probe_set_synced(true);
        // The asker's own entries and whoever holds the IPs it asks about; nobody else.
        let believed = cache.probe_believed("new", &[ip("10.0.0.1")]).unwrap();
        assert_eq!(
            believed,
            BTreeMap::from([
                (ip("10.0.0.1"), "old".to_string()),
                (ip("10.0.0.2"), "new".to_string())
            ])
        );
        // Another pod's record of an IP wins over the asker's own.
        cache.set_probe_ips("other", Some(vec![ip("10.0.0.2")]));
        assert_eq!(
            cache.probe_believed("new", &[]).unwrap()[&ip("10.0.0.2")],
            "other".to_string()
        );
    }
}
