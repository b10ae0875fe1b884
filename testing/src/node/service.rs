//! The `kubernetes` Service as kube-proxy would serve it, for the one service the node's pods
//! need: its cluster IP and port DNATed to the API server's loopback address, for pods on the
//! node's bridge (PREROUTING, with `route_localnet` on the bridge so loopback is a valid
//! destination from there) and for host processes such as the CNI plugin (OUTPUT). Rules carry
//! the node's comment and are deleted at drop.

use std::process::Command;

use super::NodeError;

/// The `kubernetes` Service's cluster IP (the first address of the control plane's range).
pub const KUBERNETES_SERVICE_IP: &str = "10.96.0.1";

pub(super) struct ServiceProxy {
    /// (nat chain, rule spec)
    rules: Vec<(String, Vec<String>)>,
}

fn command(op: &str, chain: &str, spec: &[String]) -> Vec<String> {
    let mut v = vec!["-t".to_string(), "nat".into(), op.into(), chain.into()];
    v.extend(spec.iter().cloned());
    v
}

fn iptables(args: &[String]) -> Result<(), NodeError> {
    super::images::run(
        Command::new("iptables").arg("-w").args(args),
        &format!("iptables {}", args.join(" ")),
    )
    .map(|_| ())
}

impl ServiceProxy {
    /// Creates `bridge` (the CNI bridge plugin takes an existing one) and the DNAT rules.
    pub fn start(
        bridge: &str,
        apiserver_port: u16,
        comment: &str,
    ) -> Result<ServiceProxy, NodeError> {
        super::images::run(
            Command::new("ip").args(["link", "add", bridge, "type", "bridge"]),
            &format!("create bridge {bridge}"),
        )?;
        super::images::run(
            Command::new("ip").args(["link", "set", bridge, "up"]),
            &format!("set {bridge} up"),
        )?;
        let sysctl = format!("/proc/sys/net/ipv4/conf/{bridge}/route_localnet");
        std::fs::write(&sysctl, "1").map_err(|source| NodeError::Io {
            what: format!("write {sysctl}"),
            source,
        })?;
        let to = format!("127.0.0.1:{apiserver_port}");
        let rule = |chain: &str, extra: &[&str]| -> (String, Vec<String>) {
            let mut spec: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
            spec.extend(
                [
                    "-d",
                    KUBERNETES_SERVICE_IP,
                    "-p",
                    "tcp",
                    "--dport",
                    "443",
                    "-m",
                    "comment",
                    "--comment",
                    comment,
                    "-j",
                    "DNAT",
                    "--to-destination",
                    &to,
                ]
                .iter()
                .map(|s| s.to_string()),
            );
            (chain.to_string(), spec)
        };
        let mut proxy = ServiceProxy { rules: Vec::new() };
        for (chain, spec) in [rule("PREROUTING", &["-i", bridge]), rule("OUTPUT", &[])] {
            iptables(&command("-A", &chain, &spec))?;
            proxy.rules.push((chain, spec));
        }
        Ok(proxy)
    }
}

impl Drop for ServiceProxy {
    fn drop(&mut self) {
        for (chain, spec) in &self.rules {
            let _ = iptables(&command("-D", chain, spec));
        }
    }
}
