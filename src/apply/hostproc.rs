//! Host facts read from the host's `/proc` (mounted at a configurable root, `/host/proc` in the
//! DaemonSet): the UID kubelet runs as, which the nftables probe SNAT rule matches on (`meta
//! skuid`). Used by the node agent and by `istio-iptables ambient --host`.

use std::path::Path;

/// Why kubelet's UID could not be found.
#[derive(Debug, thiserror::Error)]
pub enum KubeletUidError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "no kubelet process (comm kubelet, kubelite or k3s) found under {0}; is the host /proc \
         mounted there?"
    )]
    NotFound(String),
}

/// Whether a process is kubelet, by its `comm` and (for kubelet/kubelite) its command line, as
/// Istio decides: `kubelet` or `kubelite` whose argv mentions kubelet, or `k3s`.
pub fn is_kubelet(comm: &str, cmdline: &[u8]) -> bool {
    match comm.trim() {
        "kubelet" | "kubelite" => String::from_utf8_lossy(cmdline).contains("kubelet"),
        "k3s" => true,
        _ => false,
    }
}

/// The real UID in a `/proc/<pid>/status` text (first field of `Uid:`).
pub fn real_uid(status: &str) -> Option<String> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|rest| rest.split_whitespace().next())
        .map(str::to_string)
}

/// The real UID of the first kubelet process (lowest pid) under `proc_root`.
pub fn kubelet_uid(proc_root: &Path) -> Result<String, KubeletUidError> {
    let read_err = |source| KubeletUidError::Read {
        path: proc_root.display().to_string(),
        source,
    };
    let mut pids: Vec<u32> = std::fs::read_dir(proc_root)
        .map_err(read_err)?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    for pid in pids {
        let dir = proc_root.join(pid.to_string());
        // A process may exit while we look: skip it.
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
            continue;
        };
        let cmdline = std::fs::read(dir.join("cmdline")).unwrap_or_default();
        if !is_kubelet(&comm, &cmdline) {
            continue;
        }
        if let Some(uid) = std::fs::read_to_string(dir.join("status"))
            .ok()
            .as_deref()
            .and_then(real_uid)
        {
            return Ok(uid);
        }
    }
    Err(KubeletUidError::NotFound(proc_root.display().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(root: &Path, pid: u32, comm: &str, cmdline: &str, uid: u32) {
        let dir = root.join(pid.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("comm"), format!("{comm}\n")).unwrap();
        std::fs::write(dir.join("cmdline"), cmdline.replace(' ', "\0")).unwrap();
        std::fs::write(
            dir.join("status"),
            format!("Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"),
        )
        .unwrap();
    }

    #[test]
    fn finds_kubelet_and_its_variants() {
        let root = tempfile::tempdir().unwrap();
        process(root.path(), 1, "systemd", "/sbin/init", 0);
        // A process called kubelet that is not kubelet (argv says otherwise) is skipped.
        process(root.path(), 5, "kubelet", "/bin/sleep 100", 7);
        process(
            root.path(),
            9,
            "kubelet",
            "/usr/bin/kubelet --config x",
            1000,
        );
        std::fs::create_dir_all(root.path().join("self")).unwrap();
        assert_eq!(kubelet_uid(root.path()).unwrap(), "1000");

        assert!(is_kubelet(
            "kubelite",
            b"/snap/bin/kubelite\0--kubelet-args"
        ));
        assert!(is_kubelet("k3s", b"k3s\0server"));
        assert!(!is_kubelet("kubelite", b"/snap/bin/kubelite"));
    }

    #[test]
    fn says_where_it_looked_when_there_is_no_kubelet() {
        let root = tempfile::tempdir().unwrap();
        process(root.path(), 1, "systemd", "/sbin/init", 0);
        let err = kubelet_uid(root.path()).unwrap_err();
        assert!(
            err.to_string().contains(&root.path().display().to_string()),
            "{err}"
        );
        assert_eq!(real_uid("Uid:\t0\t0\t0\t0\n").as_deref(), Some("0"));
    }
}
