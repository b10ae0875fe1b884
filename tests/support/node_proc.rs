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

/// This machine's processes as a node's /proc: a procfs mount of the test's pid namespace (every
/// process, the pods' too) whose `1` is a process in the node netns (its directory bind-mounted
/// over pid 1's), so `<HOST_PROC_DIR>/1/ns/net` is the node's netns whatever the machine's pid 1
/// is or lets us read; its parent stands for the host's root (every other top-level directory
/// linked to the machine's). [`HostProcView::pid1_unreadable`]: `1` is an empty directory instead, a node
/// whose pid 1's netns cannot be read. Unmounted (and the stand-in killed) on drop.
pub struct HostProcView {
    pub dir: PathBuf,
    init: Option<std::process::Child>,
    _tmp: tempfile::TempDir,
}

impl HostProcView {
    /// Pid 1 is a process in `node_ns` (a netns path).
    pub fn with_init_in(node_ns: &str) -> HostProcView {
        let init = std::process::Command::new("nsenter")
            .arg(format!("--net={node_ns}"))
            .args(["sleep", "infinity"])
            .spawn()
            .expect("start the node's pid 1 stand-in (nsenter)");
        let view = Self::mount(Some(init));
        let want = std::fs::metadata(node_ns)
            .map(|m| ids(&m))
            .expect("node netns");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        // nsenter enters the netns before it execs sleep: wait until pid 1 is in it.
        while std::fs::metadata(view.dir.join("1/ns/net"))
            .map(|m| ids(&m))
            .ok()
            != Some(want)
        {
            assert!(
                std::time::Instant::now() < deadline,
                "pid 1 of {} never entered {node_ns}",
                view.dir.display()
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        view
    }

    /// Pid 1's directory is empty: its netns cannot be read.
    pub fn pid1_unreadable() -> HostProcView {
        let view = Self::mount(None);
        assert!(!view.dir.join("1/ns/net").exists());
        view
    }

    fn mount(init: Option<std::process::Child>) -> HostProcView {
        let tmp = tempfile::tempdir().expect("tempdir");
        // The agent opens the plugin's netns paths under the parent of its /proc (the chart's
        // `/host`): that parent links every other top-level directory to the machine's.
        let root = tmp.path().join("root");
        let dir = root.join("proc");
        let empty = tmp.path().join("empty");
        std::fs::create_dir_all(&dir).expect("mkdir proc");
        std::fs::create_dir_all(&empty).expect("mkdir empty");
        for entry in std::fs::read_dir("/").expect("read /").flatten() {
            let name = entry.file_name();
            if name != "proc" {
                std::os::unix::fs::symlink(Path::new("/").join(&name), root.join(&name))
                    .expect("link a top-level directory");
            }
        }
        let mount = |args: &[&str]| {
            let out = std::process::Command::new("mount")
                .args(args)
                .output()
                .expect("run mount");
            assert!(
                out.status.success(),
                "mount {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        mount(&["-t", "proc", "proc", dir.to_str().expect("utf-8")]);
        let view = HostProcView {
            dir: dir.clone(),
            init,
            _tmp: tmp,
        };
        let over = match &view.init {
            Some(child) => dir.join(child.id().to_string()),
            None => empty,
        };
        mount(&[
            "--bind",
            over.to_str().expect("utf-8"),
            dir.join("1").to_str().expect("utf-8"),
        ]);
        view
    }
}

fn ids(m: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (m.dev(), m.ino())
}

impl Drop for HostProcView {
    fn drop(&mut self) {
        for target in [self.dir.join("1"), self.dir.clone()] {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&target)
                .status();
        }
        if let Some(child) = &mut self.init {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
