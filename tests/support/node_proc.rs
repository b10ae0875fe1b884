//! A node's /proc for tests that run install-cni as on a node (tests/chart_helm.rs,
//! tests/image_daemonset.rs): a real procfs, since install-cni refuses anything else there.

use std::path::{Path, PathBuf};

/// The node's /proc (the chart's `cni-host-procfs`; install-cni refuses anything but a procfs
/// there): the procfs of a pid namespace of its own whose pid 1 is a process named `kubelet` in
/// the node netns, so the agent finds a kubelet, no pods (a fresh node) and none of the
/// machine's processes (pid 1's netns, entered for host-side rules, is the node's). The kubelet dies with the handle (`--kill-child`), the mount is detached.
pub struct NodeProc {
    pub dir: PathBuf,
    child: std::process::Child,
}

impl NodeProc {
    pub fn start(node_ns: &str, tmp: &Path) -> NodeProc {
        let dir = tmp.join("host-proc");
        std::fs::create_dir_all(&dir).expect("mkdir host-proc");
        let kubelet = tmp.join("kubelet");
        std::fs::copy("/bin/sleep", &kubelet).expect("copy sleep");
        let child = std::process::Command::new("nsenter")
            .arg(format!("--net={node_ns}"))
            .args(["unshare", "--pid", "--fork", "--kill-child", "sh", "-ec"])
            .arg("mount -t proc proc \"$0\" && exec \"$1\" 600")
            .arg(&dir)
            .arg(&kubelet)
            .spawn()
            .expect("start the node's kubelet (nsenter, unshare)");
        let mut node = NodeProc { dir, child };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let fs = nix::sys::statfs::statfs(&node.dir).map(|s| s.filesystem_type());
            if fs.is_ok_and(|t| t == nix::sys::statfs::PROC_SUPER_MAGIC) {
                return node;
            }
            if let Ok(Some(status)) = node.child.try_wait() {
                panic!("the node's kubelet exited ({status}) before its procfs was mounted");
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no procfs at {} within 10 s",
                node.dir.display()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.dir)
            .status();
    }
}
