//! The `istio-cni` CNI plugin role (ADD/DEL/CHECK/VERSION/STATUS/GC).
//! May call: `rules`, `apply`, `netns`, `kube`, `telemetry`.

/// Entry point of the `istio-cni` role.
pub fn main(_args: Vec<String>) -> i32 {
    1
}
