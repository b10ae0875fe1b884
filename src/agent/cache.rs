//! The pod cache (§3.7): enrolled pod UID -> workload identity and netns handle. It is the ZDS
//! "state of the world": a connecting ztunnel gets a snapshot of it. Handles close when the last
//! `Arc` goes (no explicit close). Each entry also keeps the IPs the agent put in the host probe
//! set for the pod: the expected state the drift pass reconciles the set with.

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use super::ports::WorkloadInfo;
use crate::netns::Netns;

#[derive(Debug, Clone)]
pub struct CachedPod {
    pub info: WorkloadInfo,
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
}

#[derive(Debug, Default)]
pub struct PodCache {
    pods: RwLock<HashMap<String, CachedPod>>,
}

impl PodCache {
    fn read(&self) -> RwLockReadGuard<'_, HashMap<String, CachedPod>> {
        self.pods.read()
    }

    fn write(&self) -> RwLockWriteGuard<'_, HashMap<String, CachedPod>> {
        self.pods.write()
    }

    /// A placeholder without a netns, unless the pod is already there.
    pub fn ensure(&self, uid: &str, info: WorkloadInfo) {
        self.write().entry(uid.to_string()).or_insert(CachedPod {
            info,
            netns: None,
            probe_ips: Some(vec![]),
            annotation_owed: false,
            awaiting_ztunnel: false,
        });
    }

    /// Records the pod's netns. An entry holding the same namespace (dev, inode) keeps its
    /// handle (the new one is dropped); identity is refreshed either way. Returns the kept one.
    pub fn upsert(
        &self,
        uid: &str,
        info: WorkloadInfo,
        netns: impl Into<Arc<Netns>>,
    ) -> Arc<Netns> {
        let netns = netns.into();
        let mut pods = self.write();
        let entry = pods.entry(uid.to_string()).or_insert(CachedPod {
            info: info.clone(),
            netns: None,
            probe_ips: Some(vec![]),
            annotation_owed: false,
            awaiting_ztunnel: false,
        });
        entry.info = info;
        match &entry.netns {
            Some(old) if old.id() == netns.id() => old.clone(),
            _ => {
                entry.netns = Some(netns.clone());
                netns
            }
        }
    }

    pub fn netns(&self, uid: &str) -> Option<Arc<Netns>> {
        self.read().get(uid).and_then(|p| p.netns.clone())
    }

    /// Records the pod's probe-set entries (see [`CachedPod::probe_ips`]); a pod not cached is
    /// left out.
    pub fn set_probe_ips(&self, uid: &str, ips: Option<Vec<IpAddr>>) {
        if let Some(pod) = self.write().get_mut(uid) {
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

    /// Marks (or clears) the pod's `enabled` annotation as owed; a pod not cached is left out.
    pub fn set_annotation_owed(&self, uid: &str, owed: bool) {
        if let Some(pod) = self.write().get_mut(uid) {
            pod.annotation_owed = owed;
        }
    }

    /// Marks (or clears) the pod as programmed but not taken by ztunnel yet.
    pub fn set_awaiting_ztunnel(&self, uid: &str, awaiting: bool) {
        if let Some(pod) = self.write().get_mut(uid) {
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
        self.write().remove(uid)
    }

    /// Puts a taken entry back (a failed removal will be retried).
    pub fn restore(&self, uid: &str, pod: CachedPod) {
        self.write().insert(uid.to_string(), pod);
    }

    /// The entries of pods named `namespace/name` (UID, entry): more than one only while a
    /// deleted pod's successor of the same name is there too.
    pub fn named(&self, namespace: &str, name: &str) -> Vec<(String, CachedPod)> {
        self.read()
            .iter()
            .filter(|(_, p)| p.info.namespace == namespace && p.info.name == name)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// A copy for sending (UID, entry).
    pub fn snapshot(&self) -> Vec<(String, CachedPod)> {
        self.read()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    pub fn len(&self) -> usize {
        self.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str) -> WorkloadInfo {
        WorkloadInfo {
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
}
