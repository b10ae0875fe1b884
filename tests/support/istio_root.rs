//! Istio's own `install-cni` (built by scripts/build-istio) as the node agent of a test node
//! (tests/support/ambient_node.rs `Node::start_real_istio`), for the differential tests.
//!
//! Istio's binary reads fixed paths: the node's procfs at `/host/proc` (pid 1's `ns/net` is the
//! host netns of its /proc scan), pod netns paths from the plugin under `/host`, the CNI conf and
//! bin dirs at `/host/etc/cni/net.d` and `/host/opt/cni/bin`, its own plugin at
//! `/opt/cni/bin/istio-cni` and the service account at
//! `/var/run/secrets/kubernetes.io/serviceaccount`. It has no setting for a procfs elsewhere
//! (`ALLOW_SWITCH_TO_HOST_NS` only chooses between `/proc/self/ns/net` and
//! `/host/proc/1/ns/net` for host-side work), so it runs chrooted into a root of its own, in a
//! mount namespace of its own whose mounts die with it: `/usr`, `/etc` and `/dev` of the machine,
//! a procfs at `/proc`, the test's node procfs view ([`HostProcView`]: pid 1 in the node netns,
//! since even root cannot open the machine's `/proc/1/ns/net` here) at `/host/proc`, the
//! machine's `/run/netns` at `/host/run/netns` (a slave mount, so pod netns made later show), the
//! test's conf/bin/SA dirs at Istio's paths, and the test's temp dir (run dir, ZDS socket) at the
//! same path as outside, since the plugin and the peer reach them from outside.
//!
//! [`HostProcView`]: super::node_proc::HostProcView
#![allow(dead_code)]

use istio_cni_testing::istio::istio_bin;
use std::path::{Path, PathBuf};

/// Mounts made inside the agent's own mount namespace, then `chroot` and exec. The root is a
/// mount point of its own, as a container's is: Istio's in-pod iptables runs remount `/`
/// private in a mount namespace of their own (pod-scoped xtables lock) and warn where they cannot. Positional
/// arguments: root, temp dir, node procfs, conf dir, bin dir, SA dir, install-cni, plugin (the
/// launcher's own trailing arguments are ignored).
const SCRIPT: &str = r#"R=$1 T=$2 HP=$3 NET=$4 BIN=$5 SA=$6 EXE=$7 PLUGIN=$8
mount --bind "$R" "$R"
mount --rbind /usr "$R/usr"
mount --rbind /etc "$R/etc"
mount --rbind /dev "$R/dev"
mount -t proc proc "$R/proc"
mount --rbind "$HP" "$R/host/proc"
mount --rbind /run/netns "$R/host/run/netns"
mount --bind "$NET" "$R/host/etc/cni/net.d"
mount --bind "$BIN" "$R/host/opt/cni/bin"
mount --bind "$SA" "$R/var/run/secrets/kubernetes.io/serviceaccount"
mount --bind "$EXE" "$R/install-cni"
mount --bind "$PLUGIN" "$R/opt/cni/bin/istio-cni"
mkdir -p "$R$T"
mount --bind "$T" "$R$T"
exec chroot "$R" /install-cni"#;

/// The agent's root (a temp dir; the mounts live only in the agent's mount namespace).
pub struct IstioRoot {
    root: PathBuf,
    _tmp: tempfile::TempDir,
}

impl IstioRoot {
    pub fn new() -> IstioRoot {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("root");
        for d in [
            "usr",
            "etc",
            "dev",
            "proc",
            "tmp",
            "run",
            "host/proc",
            "host/run/netns",
            "host/etc/cni/net.d",
            "host/opt/cni/bin",
            "opt/cni/bin",
            "var/run/secrets/kubernetes.io/serviceaccount",
        ] {
            std::fs::create_dir_all(root.join(d)).expect("mkdir in istio's root");
        }
        for (link, to) in [
            ("bin", "usr/bin"),
            ("sbin", "usr/sbin"),
            ("lib", "usr/lib"),
            ("lib64", "usr/lib64"),
        ] {
            std::os::unix::fs::symlink(to, root.join(link)).expect("link in istio's root");
        }
        // `/host/var/run/netns/X` (the plugin's netns paths) is `/host/run/netns/X`.
        std::fs::create_dir_all(root.join("host/var")).expect("mkdir");
        std::os::unix::fs::symlink("../run", root.join("host/var/run")).expect("link");
        for f in ["install-cni", "opt/cni/bin/istio-cni"] {
            std::fs::write(root.join(f), b"").expect("mount point file");
        }
        IstioRoot { root, _tmp: tmp }
    }

    /// The launcher (`install_support::start_via`'s wrapper) that runs Istio's install-cni in
    /// `node_ns` chrooted into this root.
    pub fn wrapper(
        &self,
        node_ns: &str,
        host_proc: &Path,
        tmp: &Path,
        dirs: (&Path, &Path, &Path),
    ) -> Vec<String> {
        let (net, bin, sa) = dirs;
        let s = |p: &Path| p.display().to_string();
        vec![
            "nsenter".into(),
            format!("--net={node_ns}"),
            "unshare".into(),
            "-m".into(),
            "--propagation".into(),
            "slave".into(),
            "sh".into(),
            "-ec".into(),
            SCRIPT.into(),
            "istio-root".into(),
            s(&self.root),
            s(tmp),
            s(host_proc),
            s(net),
            s(bin),
            s(sa),
            s(&istio_bin("install-cni")),
            s(&istio_bin("istio-cni")),
        ]
    }
}
