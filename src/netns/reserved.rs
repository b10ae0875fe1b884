//! The network namespaces no pod may claim: the agent's own and the node's
//! (`<HOST_PROC_DIR>/1/ns/net`), by identity. Every path that takes a netns as a pod's asks
//! [`Reserved::check`]: the plugin's `/cmdadd` (the ambient agent's trust check) and the host
//! /proc scan ([`super::procfs::scan`]: the agent's restore and re-adds, the repair controller,
//! the sidecar drift pass), which cannot run without a [`Reserved`].
//!
//! When either namespace cannot be identified (the node's /proc not mounted, or pid 1's netns not
//! readable) nothing tells the node's netns from a pod's but its addresses, and a hostNetwork pod's
//! IP is the node's: then every netns is refused (fail closed), with the reason
//! ([`Reserved::unidentified`]) for the log and readiness.

use std::path::{Path, PathBuf};

use super::{Netns, NetnsId};

/// The reserved namespaces of one node, learnt once.
#[derive(Debug, Clone)]
pub struct Reserved {
    host_proc: PathBuf,
    known: Vec<(String, NetnsId)>,
    unidentified: Option<String>,
}

/// Unidentified: refuses every netns (a value nobody learnt must not let anything through).
impl Default for Reserved {
    fn default() -> Reserved {
        Reserved {
            host_proc: PathBuf::new(),
            known: Vec::new(),
            unidentified: Some("the reserved network namespaces were never identified".into()),
        }
    }
}

/// The reserved namespaces could not be identified, so no netns is anyone's (fail closed); says
/// which could not be opened and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unidentified(pub String);

/// Why a netns cannot be a pod's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// It is one of the reserved namespaces (the label says which).
    Reserved(String),
    /// The reserved namespaces are not known, so no netns is taken (why).
    Unidentified(String),
}

impl Reserved {
    /// Identifies the agent's own netns (the calling thread's: call it from a thread that never
    /// entered a pod's) and the node's (`<host_proc>/1/ns/net`, opened and checked as a netns).
    pub fn identify(host_proc: &Path) -> Reserved {
        let node_path = host_proc.join("1/ns/net");
        let mut known = Vec::new();
        let mut missing = Vec::new();
        match Netns::current() {
            Ok(ns) => known.push(("the agent's own netns".to_string(), ns.id())),
            Err(e) => missing.push(format!("the agent's own network namespace: {e}")),
        }
        match Netns::open(&node_path) {
            Ok(ns) => known.push((
                format!("the node's netns ({})", node_path.display()),
                ns.id(),
            )),
            Err(e) => missing.push(format!("the node's network namespace: {e}")),
        }
        let unidentified = (!missing.is_empty()).then(|| {
            format!(
                "cannot identify {}; no network namespace is taken as a pod's (the node's could not be told from one)",
                missing.join("; ")
            )
        });
        Reserved {
            host_proc: host_proc.to_path_buf(),
            known,
            unidentified,
        }
    }

    /// Reserved namespaces given as facts (fakes and fixtures); `unidentified` refuses every netns.
    #[cfg(any(test, feature = "test-hooks"))]
    pub fn new(
        host_proc: &Path,
        known: Vec<(String, NetnsId)>,
        unidentified: Option<String>,
    ) -> Reserved {
        Reserved {
            host_proc: host_proc.to_path_buf(),
            known,
            unidentified,
        }
    }

    /// The host /proc the node's netns was identified under (the scan reads the same).
    pub fn host_proc(&self) -> &Path {
        &self.host_proc
    }

    /// Why every netns is refused, when the reserved ones could not be identified.
    pub fn unidentified(&self) -> Option<&str> {
        self.unidentified.as_deref()
    }

    /// The identified namespaces with their labels.
    #[cfg(test)]
    pub(crate) fn known(&self) -> &[(String, NetnsId)] {
        &self.known
    }

    /// Whether the netns `id` may be taken as a pod's.
    pub fn check(&self, id: NetnsId) -> Result<(), Claim> {
        if let Some(why) = &self.unidentified {
            return Err(Claim::Unidentified(why.clone()));
        }
        match self.known.iter().find(|(_, known)| *known == id) {
            Some((which, _)) => Err(Claim::Reserved(which.clone())),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_s_and_the_node_s_netns_are_reserved_by_identity() {
        let here = Netns::current().unwrap().id();
        let proc = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(proc.path().join("1/ns")).unwrap();
        // A node whose pid 1 runs in another netns (a fresh one, kept by a sleeping process).
        let mut child = std::process::Command::new("unshare")
            .args(["--net", "sleep", "30"])
            .spawn()
            .unwrap();
        let child_ns = PathBuf::from(format!("/proc/{}/ns/net", child.id()));
        let node = loop {
            // unshare execs sleep after entering the new netns.
            let id = Netns::open(&child_ns).unwrap().id();
            if id != here {
                break id;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        std::os::unix::fs::symlink(&child_ns, proc.path().join("1/ns/net")).unwrap();
        let reserved = Reserved::identify(proc.path());
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(reserved.unidentified(), None);
        assert_eq!(
            reserved.check(here),
            Err(Claim::Reserved("the agent's own netns".into()))
        );
        match reserved.check(node) {
            Err(Claim::Reserved(which)) => {
                assert!(which.starts_with("the node's netns ("), "{which}")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(reserved.check(NetnsId { dev: 1, inode: 2 }), Ok(()));
    }

    #[test]
    fn an_unreadable_node_netns_refuses_every_netns() {
        // No pid 1 at all; then a pid 1 whose ns/net is not a namespace (masked by a file).
        let empty = tempfile::tempdir().unwrap();
        let masked = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(masked.path().join("1/ns")).unwrap();
        std::fs::write(masked.path().join("1/ns/net"), "").unwrap();
        for proc in [empty.path(), masked.path()] {
            let reserved = Reserved::identify(proc);
            let why = reserved.unidentified().expect("fails closed").to_string();
            assert!(why.contains("the node's network namespace"), "{why}");
            assert!(
                why.contains(&proc.join("1/ns/net").display().to_string()),
                "{why}"
            );
            for id in [NetnsId { dev: 1, inode: 2 }, Netns::current().unwrap().id()] {
                assert_eq!(reserved.check(id), Err(Claim::Unidentified(why.clone())));
            }
        }
    }
}
