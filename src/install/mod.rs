//! The `install-cni` role: installs this binary as the CNI plugin, merges our entry into the node's
//! CNI config, writes the plugin kubeconfig, guards all of it, and cleans up on shutdown.
//! May call: `kube`, `telemetry`.

/// Entry point of the `install-cni` role.
pub fn main(_args: Vec<String>) -> i32 {
    eprintln!("install-cni: not implemented yet");
    1
}
