//! The `istio-iptables` role.
//! May call: `cli`, `rules`, `apply`, `netlink`.

/// Entry point of the `istio-iptables` role.
pub fn main(_args: Vec<String>) -> i32 {
    1
}
