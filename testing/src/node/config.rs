//! The node's configuration files: containerd's (version 3 for containerd 2.x; runc's state
//! under the node's directory too), kubelet's
//! KubeletConfiguration, and the primary CNI network (Debian's bridge + host-local).

use std::path::Path;

use serde_json::{Value, json};

/// Where everything of one node lives (all under the node's directory).
pub(super) struct Layout<'a> {
    pub dir: &'a Path,
    pub socket: &'a Path,
    pub cni_bin: &'a Path,
    pub cni_conf: &'a Path,
    pub runc: &'a Path,
    pub sandbox_image: &'a str,
}

impl Layout<'_> {
    /// containerd's config: its own root, state and sockets; the CRI plugin with the test's CNI
    /// dirs, the sandbox image of ours, runc with cgroupfs; pod netns under /var/run/netns, which is
    /// the node's own (`super::pidns`).
    pub fn containerd_toml(&self) -> String {
        let d = self.dir.display();
        let q = |p: &Path| toml_string(&p.display().to_string());
        format!(
            r#"version = 3
root = "{d}/containerd/root"
state = "{d}/containerd/state"
disabled_plugins = ["io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = {socket}
[ttrpc]
  address = {ttrpc}
[debug]
  level = "info"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = {sandbox}

[plugins.'io.containerd.cri.v1.runtime']
  enable_selinux = false
  # These machines drop CAP_SYS_RESOURCE: runc cannot lower a process's oom_score_adj below its
  # parent's ("nsexec: failed to update /proc/self/oom_score_adj: Permission denied") and kubelet
  # asks -998 for every sandbox. Clamp to containerd's own instead.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [{bin}]
    conf_dir = {conf}
    max_conf_num = 1
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = {runc}
        SystemdCgroup = false
        Root = {runc_root}

[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
"#,
            socket = q(self.socket),
            ttrpc = toml_string(&format!("{}.ttrpc", self.socket.display())),
            sandbox = toml_string(self.sandbox_image),
            bin = q(self.cni_bin),
            conf = q(self.cni_conf),
            runc = q(self.runc),
            runc_root = toml_string(&format!("{d}/runc")),
        )
    }
}

fn toml_string(s: &str) -> String {
    // JSON string escapes are valid TOML basic-string escapes.
    Value::from(s).to_string()
}

/// What kubelet needs to know beyond the layout.
pub(super) struct Kubelet<'a> {
    pub socket: &'a Path,
    pub dir: &'a Path,
    pub port: u16,
    pub healthz_port: u16,
    pub cgroup_root: &'a str,
}

impl Kubelet<'_> {
    /// KubeletConfiguration: cgroupfs (no systemd on these machines), cgroup v1 allowed, swap
    /// allowed, serving on loopback, no eviction or image GC that a busy test machine's disk would
    /// trigger, the node's own cgroup root and pod log dir.
    pub fn config(&self) -> Value {
        json!({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": "127.0.0.1",
            "port": self.port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.healthz_port,
            "authentication": {"anonymous": {"enabled": true}, "webhook": {"enabled": false}},
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,
            "cgroupsPerQOS": true,
            "enforceNodeAllocatable": [],
            "failCgroupV1": false,
            "failSwapOn": false,
            "containerRuntimeEndpoint": format!("unix://{}", self.socket.display()),
            "podLogsDir": self.dir.join("pod-logs"),
            "volumePluginDir": self.dir.join("volume-plugins"),
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "0%",
                "imagefs.available": "0%", "nodefs.inodesFree": "0%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "localStorageCapacityIsolation": false,
            "serializeImagePulls": false,
            "syncFrequency": "5s",
            "nodeStatusUpdateFrequency": "2s",
            "fileCheckFrequency": "5s",
            "resolvConf": "/etc/resolv.conf",
            "maxPods": 60,
            "shutdownGracePeriod": "0s",
            "shutdownGracePeriodCriticalPods": "0s",
            "serverTLSBootstrap": false,
        })
    }
}

/// The node's primary network: a bridge of the node's own with host-local addresses from
/// `subnet`, its IPAM state in the node's directory, no masquerading (nothing leaves the node).
pub(super) fn bridge_conflist(network: &str, bridge: &str, subnet: &str, ipam_dir: &Path) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": network,
        "plugins": [{
            "type": "bridge",
            "bridge": bridge,
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": subnet}]],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dataDir": ipam_dir,
            },
        }],
    })
}
