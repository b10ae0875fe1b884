//! The AWS "security groups for pods" probe workaround (`AMBIENT_ENABLE_AWS_BRANCH_ENI_PROBE`).
//!
//! With aws-vpc-cni's branch ENIs a pod's host route lives only in a per-ENI routing table, chosen
//! by an `iif <veth>` rule for the pod's replies; the host's own traffic to the pod (the kubelet's
//! probes, SNATed to the probe address) would leave through the VPC fabric, which drops the
//! link-local source. For such a pod two rules are added in the host netns: `to <pod IP> lookup
//! <ENI table> pref 512` (the host reaches the pod through its veth) and `iif <veth> lookup local`
//! just before aws-vpc-cni's own `iif` rule (replies are delivered here, not sent back to the VPC).
//! AWS requires `net.ipv4.tcp_early_demux=0` for branch ENIs, so nothing is looked for unless the
//! host has it: on every other node this costs one file read at start.
//!
//! Detection ([`detect`]) and the rules ([`rules_for`]) are pure; [`BranchEniProbe`] runs them
//! over one rtnetlink session and remembers what it added per pod IP, so removal deletes exactly
//! that. Rebuilt from the kernel on the startup/drift probe-set sync (adding an existing rule is a
//! no-op), so an agent restart forgets nothing it still needs.

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::Path;

use crate::netlink::routes::{
    NetlinkError, PolicyRule, RouteSession, TABLE_LOCAL, TABLE_MAIN, interface_name,
};

/// aws-vpc-cni's priority for its `to <pod IP>` rules; ours takes the same.
const FORWARD_PRIORITY: u32 = 512;

/// How a branch-ENI pod IP is routed: the ENI's table and the veth whose `iif` rule selects it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BranchEni {
    pub table: u32,
    pub veth: String,
    /// The priority of aws-vpc-cni's `iif <veth> lookup <table>` rule.
    pub iif_priority: u32,
}

/// Finds the branch ENI routing `ip`: a table chosen by an `iif` rule that holds a host route to
/// `ip` through that same interface. `host_route_links(table)` names the interfaces of the host
/// routes to `ip` in `table`. Regular veth pods have no `iif` rules: `None`.
pub fn detect(
    rules: &[PolicyRule],
    mut host_route_links: impl FnMut(u32) -> Vec<String>,
) -> Option<BranchEni> {
    // Table -> its iif rules, tables in order so the answer does not depend on listing order.
    let mut by_table: BTreeMap<u32, Vec<(&str, u32)>> = BTreeMap::new();
    for r in rules {
        let Some(iif) = r.iif.as_deref() else {
            continue;
        };
        if r.other_match || r.to.is_some() || matches!(r.table, 0 | TABLE_MAIN | TABLE_LOCAL) {
            continue;
        }
        by_table.entry(r.table).or_default().push((iif, r.priority));
    }
    for (table, iif_rules) in by_table {
        for link in host_route_links(table) {
            if let Some((veth, priority)) = iif_rules.iter().find(|(name, _)| *name == link) {
                return Some(BranchEni {
                    table,
                    veth: veth.to_string(),
                    iif_priority: *priority,
                });
            }
        }
    }
    None
}

/// The two rules for `ip` routed by `eni`: forward (host -> pod via the veth) and return (replies
/// delivered locally, one priority before aws-vpc-cni's `iif` rule).
pub fn rules_for(ip: IpAddr, eni: &BranchEni) -> [PolicyRule; 2] {
    [
        PolicyRule {
            ipv6: ip.is_ipv6(),
            to: Some(ip),
            other_match: false,
            iif: None,
            table: eni.table,
            priority: FORWARD_PRIORITY,
        },
        PolicyRule {
            ipv6: ip.is_ipv6(),
            to: None,
            other_match: false,
            iif: Some(eni.veth.clone()),
            table: TABLE_LOCAL,
            priority: eni.iif_priority.saturating_sub(1),
        },
    ]
}

/// Whether the host runs with `net.ipv4.tcp_early_demux=0` (read under the host's /proc); an
/// unreadable value counts as enabled (nothing to do).
pub fn early_demux_disabled(host_proc: &Path) -> bool {
    std::fs::read_to_string(host_proc.join("sys/net/ipv4/tcp_early_demux"))
        .map(|v| v.trim() == "0")
        .unwrap_or(false)
}

/// The workaround's state: on only when configured and the host has early demux off.
#[derive(Debug, Default)]
pub struct BranchEniProbe {
    active: bool,
    /// Pod IP -> the ENI its rules were added for.
    added: Mutex<HashMap<IpAddr, BranchEni>>,
}

impl BranchEniProbe {
    pub fn new(configured: bool, host_proc: &Path) -> BranchEniProbe {
        BranchEniProbe {
            active: configured && early_demux_disabled(host_proc),
            added: Mutex::default(),
        }
    }

    pub fn active(&self) -> bool {
        self.active
    }

    /// Adds the rules for every branch-ENI IP of `ips` (run in the host netns). Returns the IPs
    /// that needed them.
    pub fn add(&self, ips: &[IpAddr]) -> Result<Vec<IpAddr>, NetlinkError> {
        if !self.active || ips.is_empty() {
            return Ok(vec![]);
        }
        let mut session = RouteSession::new();
        let mut rules_by_family: HashMap<bool, Vec<PolicyRule>> = HashMap::new();
        let mut routed = Vec::new();
        for ip in ips {
            let v6 = ip.is_ipv6();
            if let std::collections::hash_map::Entry::Vacant(e) = rules_by_family.entry(v6) {
                e.insert(session.list_rules(v6)?);
            }
            let mut lookup_err = None;
            let eni = detect(&rules_by_family[&v6], |table| {
                match session.host_route_links(table, *ip) {
                    Ok(links) => links.into_iter().filter_map(interface_name).collect(),
                    Err(e) => {
                        lookup_err = Some(e);
                        vec![]
                    }
                }
            });
            if let Some(e) = lookup_err {
                return Err(e);
            }
            let Some(eni) = eni else { continue };
            let [forward, back] = rules_for(*ip, &eni);
            session.add_policy_rule(&forward)?;
            if let Err(e) = session.add_policy_rule(&back) {
                // Not half of the pair left behind.
                let _ = session.delete_policy_rule(&forward);
                return Err(e);
            }
            tracing::info!(ip = %ip, veth = %eni.veth, table = eni.table, "branch ENI pod: probe routing rules added");
            self.added.lock().insert(*ip, eni);
            routed.push(*ip);
        }
        Ok(routed)
    }

    /// Deletes the rules added for `ips` (run in the host netns); absent ones are fine. A return
    /// rule another remembered IP still needs (same interface and family) stays.
    pub fn remove(&self, ips: &[IpAddr]) -> Result<(), NetlinkError> {
        let (gone, still_needed): (Vec<(IpAddr, BranchEni)>, Vec<PolicyRule>) = {
            let mut added = self.added.lock();
            let gone = ips
                .iter()
                .filter_map(|ip| added.remove(ip).map(|eni| (*ip, eni)))
                .collect();
            let kept = added
                .iter()
                .map(|(ip, eni)| rules_for(*ip, eni)[1].clone())
                .collect();
            (gone, kept)
        };
        let mut session = RouteSession::new();
        for (ip, eni) in gone {
            let [forward, back] = rules_for(ip, &eni);
            session.delete_policy_rule(&forward)?;
            if !still_needed.contains(&back) {
                session.delete_policy_rule(&back)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(iif: Option<&str>, table: u32, priority: u32) -> PolicyRule {
        PolicyRule {
            ipv6: false,
            to: None,
            other_match: false,
            iif: iif.map(str::to_string),
            table,
            priority,
        }
    }

    #[test]
    fn a_table_chosen_by_an_iif_rule_holding_the_pod_route_is_a_branch_eni() {
        let rules = vec![
            rule(None, TABLE_LOCAL, 0),
            rule(Some("vlan.eth.1"), 101, 10),
            rule(Some("vlanX"), 102, 11),
            rule(None, TABLE_MAIN, 32766),
        ];
        let found = detect(&rules, |table| match table {
            101 => vec!["vlan.eth.1".into()],
            _ => vec![],
        });
        assert_eq!(
            found,
            Some(BranchEni {
                table: 101,
                veth: "vlan.eth.1".into(),
                iif_priority: 10
            })
        );
        let [forward, back] = rules_for("10.1.2.3".parse().unwrap(), &found.unwrap());
        assert_eq!(forward.to_string(), "to 10.1.2.3 lookup 101 pref 512");
        assert_eq!(back.to_string(), "iif vlan.eth.1 lookup local pref 9");
    }

    #[test]
    fn regular_pods_and_foreign_rules_are_not_branch_enis() {
        // No iif rules at all (a regular veth pod).
        assert_eq!(
            detect(&[rule(None, TABLE_MAIN, 512)], |_| vec!["eth0".into()]),
            None
        );
        // An iif rule to main or local, or one matching more than the interface, is not aws-vpc-cni's.
        let mut marked = rule(Some("veth1"), 101, 10);
        marked.other_match = true;
        let rules = [rule(Some("veth1"), TABLE_MAIN, 10), marked];
        assert_eq!(detect(&rules, |_| vec!["veth1".into()]), None);
        // The table routes the pod through another interface than the iif rule's.
        let rules = [rule(Some("veth1"), 101, 10)];
        assert_eq!(detect(&rules, |_| vec!["veth2".into()]), None);
    }

    #[test]
    fn priority_zero_return_rule_stays_at_zero() {
        let eni = BranchEni {
            table: 7,
            veth: "v".into(),
            iif_priority: 0,
        };
        let [_, back] = rules_for("fd00::1".parse().unwrap(), &eni);
        assert_eq!(back.priority, 0);
        assert!(back.ipv6);
    }

    #[test]
    fn only_early_demux_zero_turns_it_on() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sys/net/ipv4/tcp_early_demux");
        assert!(!early_demux_disabled(dir.path()), "unreadable = enabled");
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, "1\n").unwrap();
        assert!(!BranchEniProbe::new(true, dir.path()).active());
        std::fs::write(&file, "0\n").unwrap();
        assert!(BranchEniProbe::new(true, dir.path()).active());
        assert!(
            !BranchEniProbe::new(false, dir.path()).active(),
            "configured off"
        );
    }

    /// Runs `ip ARGS` (in the calling thread's netns); panics with its stderr on failure.
    fn ip(args: &str) -> String {
        let out = std::process::Command::new("ip")
            .args(args.split_whitespace())
            .output()
            .expect("run ip (iproute2)");
        assert!(
            out.status.success(),
            "ip {args}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// In a scratch netns laid out as aws-vpc-cni lays out a branch ENI pod (host route in the
    /// ENI's table only, an `iif` rule choosing it), the real rtnetlink path finds it, adds both
    /// rules once (a second add changes nothing), leaves a regular pod alone, and removes exactly
    /// what it added.
    #[test]
    fn branch_eni_rules_are_added_once_and_removed_in_a_real_netns() {
        let demux = tempfile::tempdir().unwrap();
        let file = demux.path().join("sys/net/ipv4/tcp_early_demux");
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, "0").unwrap();
        let host_proc = demux.path().to_path_buf();
        crate::netns::run_in_scratch(move || {
            // veth pairs: the dummy link type is not in every kernel.
            for (a, b) in [("vlan-eni1", "vlan-eni1p"), ("veth-plain", "veth-plainp")] {
                ip(&format!("link add {a} type veth peer name {b}"));
                ip(&format!("link set {a} up"));
                ip(&format!("link set {b} up"));
            }
            ip("route add 10.99.0.5/32 dev vlan-eni1 table 197");
            ip("rule add iif vlan-eni1 lookup 197 pref 10");
            ip("route add 10.99.0.6/32 dev veth-plain");
            ip("-6 route add fd99::5/128 dev vlan-eni1 table 197");
            ip("-6 rule add iif vlan-eni1 lookup 197 pref 10");
            let before = ip("rule show");
            let before6 = ip("-6 rule show");

            let probe = BranchEniProbe::new(true, &host_proc);
            let branch: IpAddr = "10.99.0.5".parse().unwrap();
            let branch6: IpAddr = "fd99::5".parse().unwrap();
            let plain: IpAddr = "10.99.0.6".parse().unwrap();
            let routed = probe.add(&[branch, plain, branch6]).expect("add");
            assert_eq!(routed, vec![branch, branch6], "only the branch ENI IPs");
            let rules = ip("rule show");
            assert!(
                rules.contains("512:\tfrom all to 10.99.0.5 lookup 197"),
                "{rules}"
            );
            assert!(
                rules.contains("9:\tfrom all iif vlan-eni1 lookup local"),
                "{rules}"
            );
            assert!(
                !rules.contains("10.99.0.6"),
                "regular pod untouched: {rules}"
            );
            let rules6 = ip("-6 rule show");
            assert!(
                rules6.contains("from all to fd99::5 lookup 197"),
                "{rules6}"
            );
            probe.add(&[branch]).expect("again");
            assert_eq!(ip("rule show"), rules, "a second add changes nothing");

            probe.remove(&[branch, plain, branch6]).expect("remove");
            assert_eq!(ip("rule show"), before);
            assert_eq!(ip("-6 rule show"), before6);
            probe.remove(&[branch]).expect("removing twice is fine");
        })
        .expect("scratch netns");
    }
}
