//! What the agent believes of a plugin's `/cmdadd`: nothing on the caller's word.
//! A netns it is handed is a pod's only when the facts say so — not the agent's own nor the
//! node's, holding every IP the event and the pod's status name, holding no other known pod's
//! IP, and not replacing the live netns of an enrolled pod. [`verify`] decides from the facts
//! alone (gathered by `mesh` through the data-plane seam); its answer is the IPs that may go
//! into the host probe set.

use std::net::IpAddr;

use crate::netns::NetnsId;
use crate::netns::reserved::{Claim, Reserved};

/// The facts about one offered netns.
#[derive(Debug, Clone, Default)]
pub struct Offered {
    /// The path the plugin named (for messages).
    pub path: String,
    pub id: NetnsId,
    /// Namespaces no pod may claim: the agent's own, the node's (the one check every path that
    /// takes a netns as a pod's makes, `netns::reserved`).
    pub reserved: Reserved,
    /// The interface addresses inside the netns.
    pub held: Vec<IpAddr>,
    /// The IPs the event names.
    pub event_ips: Vec<IpAddr>,
    /// The IPs the pod's status lists (the API server's word; often none yet at ADD time).
    pub status_ips: Vec<IpAddr>,
    /// Other known pods (agent cache, node pod store): (`namespace/name` or UID, IP).
    pub others: Vec<(String, IpAddr)>,
    /// The netns the pod is enrolled with, if any.
    pub enrolled: Option<Enrolled>,
}

/// The netns an enrolled pod has, and whether it still exists.
#[derive(Debug, Clone)]
pub struct Enrolled {
    pub path: String,
    pub id: NetnsId,
    /// Its path still names it ([`crate::netns::Netns::still_named`]): not gone.
    pub alive: bool,
}

/// Why an offered netns is not the pod's. Messages say what was offered and what was found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("netns {path} (inode {inode}) is {which}, not a pod's")]
    Reserved {
        path: String,
        inode: u64,
        which: String,
    },
    #[error("netns {path} is refused: {why}")]
    Unidentified { path: String, why: String },
    #[error(
        "netns {path} (inode {inode}) is not the pod's: it is enrolled with netns {old_path} \
         (inode {old_inode}), which still exists"
    )]
    Enrolled {
        path: String,
        inode: u64,
        old_path: String,
        old_inode: u64,
    },
    #[error("netns {path} cannot be checked: neither the event nor the pod's status names an IP")]
    NoIps { path: String },
    #[error("{ip} is not a pod address ({why})")]
    NotPodAddress { ip: IpAddr, why: &'static str },
    #[error(
        "netns {path} (inode {inode}) does not hold {ip} (named by {source_}); it holds {held}"
    )]
    NotHeld {
        path: String,
        inode: u64,
        ip: IpAddr,
        source_: &'static str,
        held: String,
    },
    #[error("netns {path} (inode {inode}) holds {ip}, the IP of another pod ({other})")]
    OtherPod {
        path: String,
        inode: u64,
        ip: IpAddr,
        other: String,
    },
}

/// Why `ip` can never be a pod's own address, if it cannot: every netns holds loopback, and the
/// others would point the node's probe SNAT at everyone.
pub(crate) fn not_pod_address(ip: IpAddr) -> Option<&'static str> {
    let ip = ip.to_canonical();
    if ip.is_loopback() {
        return Some("loopback");
    }
    if ip.is_unspecified() {
        return Some("unspecified");
    }
    if ip.is_multicast() {
        return Some("multicast");
    }
    match ip {
        IpAddr::V4(v4) if v4.is_link_local() => Some("link-local"),
        IpAddr::V4(v4) if v4.is_broadcast() => Some("broadcast"),
        IpAddr::V6(v6) if v6.is_unicast_link_local() => Some("link-local"),
        _ => None,
    }
}

fn contains(list: &[IpAddr], ip: IpAddr) -> bool {
    list.iter().any(|a| crate::netns::procfs::same_ip(*a, ip))
}

/// Decides whether the offered netns is the pod's; `Ok` carries the verified IPs (the event's
/// and the status's, deduplicated, in that order): the only ones the probe set may get.
pub fn verify(o: &Offered) -> Result<Vec<IpAddr>, Refusal> {
    let (path, inode) = (o.path.clone(), o.id.inode);
    match o.reserved.check(o.id) {
        Ok(()) => {}
        Err(Claim::Reserved(which)) => return Err(Refusal::Reserved { path, inode, which }),
        Err(Claim::Unidentified(why)) => return Err(Refusal::Unidentified { path, why }),
    }
    if let Some(old) = &o.enrolled
        && old.id != o.id
        && old.alive
    {
        return Err(Refusal::Enrolled {
            path,
            inode,
            old_path: old.path.clone(),
            old_inode: old.id.inode,
        });
    }
    let named = o
        .event_ips
        .iter()
        .map(|ip| (*ip, "the event"))
        .chain(o.status_ips.iter().map(|ip| (*ip, "the pod's status")));
    let mut verified: Vec<IpAddr> = Vec::new();
    for (ip, source_) in named {
        if let Some(why) = not_pod_address(ip) {
            return Err(Refusal::NotPodAddress { ip, why });
        }
        // With the event naming this sandbox's IPs, a status IP the netns lacks is the previous
        // sandbox's (the kubelet keeps it in the status until the new one is ready: a node
        // rebooted without drain); only when the status is the sole evidence must it hold.
        if source_ == "the pod's status" && !o.event_ips.is_empty() && !contains(&o.held, ip) {
            continue;
        }
        if !contains(&o.held, ip) {
            let held: Vec<String> = o.held.iter().map(ToString::to_string).collect();
            return Err(Refusal::NotHeld {
                path,
                inode,
                ip,
                source_,
                held: if held.is_empty() {
                    "no address".to_string()
                } else {
                    held.join(", ")
                },
            });
        }
        if !contains(&verified, ip) {
            verified.push(ip.to_canonical());
        }
    }
    if verified.is_empty() {
        return Err(Refusal::NoIps { path });
    }
    let pod_address = |ip: &&IpAddr| not_pod_address(**ip).is_none();
    for held in o.held.iter().filter(pod_address) {
        if let Some((other, ip)) = o
            .others
            .iter()
            .find(|(_, ip)| crate::netns::procfs::same_ip(*ip, *held))
        {
            return Err(Refusal::OtherPod {
                path,
                inode,
                ip: *ip,
                other: other.clone(),
            });
        }
    }
    Ok(verified)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn id(inode: u64) -> NetnsId {
        NetnsId { dev: 4, inode }
    }

    /// A pod netns (inode 100) holding loopback and 10.0.0.5, offered for a pod the event says
    /// is 10.0.0.5.
    fn good() -> Offered {
        Offered {
            path: "/var/run/netns/cni-1".into(),
            id: id(100),
            reserved: Reserved::new(
                std::path::Path::new("/proc"),
                vec![
                    ("the agent's own netns".into(), id(1)),
                    ("the node's netns".into(), id(2)),
                ],
                None,
            ),
            held: vec![ip("127.0.0.1"), ip("::1"), ip("10.0.0.5")],
            event_ips: vec![ip("10.0.0.5")],
            ..Default::default()
        }
    }

    #[test]
    fn a_pod_netns_holding_the_named_ips_is_verified() {
        assert_eq!(verify(&good()), Ok(vec![ip("10.0.0.5")]));
        // The status agrees (v4-mapped spelling too): one entry.
        let o = Offered {
            status_ips: vec![ip("::ffff:10.0.0.5")],
            ..good()
        };
        assert_eq!(verify(&o), Ok(vec![ip("10.0.0.5")]));
        // No event IPs: the status's are checked and used.
        let o = Offered {
            event_ips: vec![],
            status_ips: vec![ip("10.0.0.5")],
            ..good()
        };
        assert_eq!(verify(&o), Ok(vec![ip("10.0.0.5")]));
    }

    #[test]
    fn the_agent_s_and_the_node_s_netns_are_refused() {
        for (inode, which) in [(1, "the agent's own netns"), (2, "the node's netns")] {
            let o = Offered {
                id: id(inode),
                ..good()
            };
            let err = verify(&o).unwrap_err();
            assert!(matches!(err, Refusal::Reserved { .. }), "{err}");
            assert!(err.to_string().contains(which), "{err}");
        }
    }

    #[test]
    fn with_the_reserved_namespaces_unidentified_every_netns_is_refused() {
        let o = Offered {
            reserved: Reserved::new(
                std::path::Path::new("/host/proc"),
                vec![],
                Some("cannot identify the node's network namespace".into()),
            ),
            ..good()
        };
        let err = verify(&o).unwrap_err().to_string();
        assert_eq!(
            err,
            "netns /var/run/netns/cni-1 is refused: cannot identify the node's network namespace"
        );
    }

    #[test]
    fn a_netns_not_holding_a_named_ip_is_refused() {
        let o = Offered {
            event_ips: vec![ip("10.0.0.6")],
            ..good()
        };
        let err = verify(&o).unwrap_err().to_string();
        assert!(
            err.contains("does not hold 10.0.0.6 (named by the event)") && err.contains("10.0.0.5"),
            "{err}"
        );
        // The status, the only evidence, lists an IP the netns does not hold.
        let o = Offered {
            event_ips: vec![],
            status_ips: vec![ip("10.0.0.7")],
            ..good()
        };
        let err = verify(&o).unwrap_err().to_string();
        assert!(
            err.contains("10.0.0.7 (named by the pod's status)"),
            "{err}"
        );
    }

    #[test]
    fn a_stale_status_ip_is_ignored_when_the_event_names_this_sandbox_s() {
        // A new sandbox after a reboot: the status still names the old sandbox's IP.
        let o = Offered {
            status_ips: vec![ip("10.0.0.2")],
            ..good()
        };
        assert_eq!(verify(&o).expect("verified"), vec![ip("10.0.0.5")]);
    }

    #[test]
    fn loopback_and_other_non_pod_addresses_never_verify() {
        for (bad, why) in [
            ("127.0.0.1", "loopback"),
            ("::1", "loopback"),
            ("::ffff:127.0.0.1", "loopback"),
            ("0.0.0.0", "unspecified"),
            ("169.254.7.127", "link-local"),
            ("fe80::1", "link-local"),
            ("224.0.0.1", "multicast"),
            ("255.255.255.255", "broadcast"),
        ] {
            let mut o = good();
            o.held.push(ip(bad));
            o.event_ips = vec![ip("10.0.0.5"), ip(bad)];
            assert_eq!(
                verify(&o),
                Err(Refusal::NotPodAddress { ip: ip(bad), why }),
                "{bad}"
            );
        }
    }

    #[test]
    fn nothing_to_check_against_is_refused() {
        let o = Offered {
            event_ips: vec![],
            ..good()
        };
        assert!(matches!(verify(&o), Err(Refusal::NoIps { .. })));
    }

    #[test]
    fn a_netns_holding_another_known_pod_s_ip_is_not_this_pod_s() {
        let mut o = good();
        o.held.push(ip("10.0.0.9"));
        o.others = vec![("ns/other".into(), ip("10.0.0.9"))];
        let err = verify(&o).unwrap_err().to_string();
        assert!(
            err.contains("holds 10.0.0.9, the IP of another pod (ns/other)"),
            "{err}"
        );
    }

    #[test]
    fn an_enrolled_pod_keeps_its_netns_unless_the_old_one_is_gone() {
        let old = Enrolled {
            path: "/var/run/netns/cni-0".into(),
            id: id(99),
            alive: true,
        };
        let o = Offered {
            enrolled: Some(old.clone()),
            ..good()
        };
        let err = verify(&o).unwrap_err().to_string();
        assert!(
            err.contains("enrolled with netns /var/run/netns/cni-0 (inode 99), which still exists"),
            "{err}"
        );
        // The same netns again (another path to it): fine.
        let same = Offered {
            enrolled: Some(Enrolled {
                id: id(100),
                ..old.clone()
            }),
            ..good()
        };
        assert!(verify(&same).is_ok());
        // The old one is gone (the sandbox was recreated): the new one is taken.
        let gone = Offered {
            enrolled: Some(Enrolled {
                alive: false,
                ..old
            }),
            ..good()
        };
        assert!(verify(&gone).is_ok());
    }
}
