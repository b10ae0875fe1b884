//! The sidecar capture decisions, made once from a [`CaptureConfig`]: what inbound traffic is
//! captured, whose traffic is the proxy's own, which loopback ports it keeps, whether loopback is
//! captured, and what DNS is redirected. Backends render a plan; they do not re-derive it.

use super::capture::config::{CaptureConfig, InboundPorts};
use super::model::Family;
use super::model::well_known::DNS_PORT;

use super::model::OwnerKind;

/// One identity of the proxy (a uid or gid from `PROXY_UID`/`PROXY_GID`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyOwner<'a> {
    pub kind: OwnerKind,
    pub id: &'a str,
    /// Destination ports of the proxy's own loopback traffic that are not sent to inbound capture
    /// (the tunnel port; also DNS for uids when DNS is captured, so the proxy reaches its
    /// own DNS proxy).
    pub kept_loopback_ports: Vec<&'a str>,
}

/// Inbound capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InboundPlan<'a> {
    Off,
    /// Every port except these.
    AllExcept(&'a [String]),
    /// Only these ports.
    Only(&'a [String]),
}

/// DNS capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DnsPlan<'a> {
    Off,
    /// Every DNS destination.
    All,
    /// Only these servers (IPv6 servers as configured, even when IPv6 rules are off: Istio's
    /// nftables capture still adds the DNS jump for them).
    Servers {
        v4: &'a [String],
        v6: &'a [String],
    },
}

impl DnsPlan<'_> {
    pub fn is_on(&self) -> bool {
        !matches!(self, DnsPlan::Off)
    }
}

/// A server address as the host prefix the rules match.
pub fn host_prefix(family: Family, server: &str) -> String {
    match family {
        Family::V4 => format!("{server}/32"),
        Family::V6 => format!("{server}/128"),
    }
}

/// Everything both capture backends decide the same way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturePlan<'a> {
    pub tproxy: bool,
    pub inbound: InboundPlan<'a>,
    /// Uids first, then gids, in configured order.
    pub owners: Vec<ProxyOwner<'a>>,
    /// The outbound include list names a loopback range, so loopback traffic of other owners
    /// is captured rather than returned early.
    pub loopback_included: bool,
    pub dns: DnsPlan<'a>,
}

impl<'a> CapturePlan<'a> {
    pub fn new(cfg: &'a CaptureConfig) -> CapturePlan<'a> {
        let dns = if !cfg.effective_redirect_dns() {
            DnsPlan::Off
        } else if cfg.capture_all_dns {
            DnsPlan::All
        } else {
            DnsPlan::Servers {
                v4: &cfg.dns_servers_v4,
                v6: &cfg.dns_servers_v6,
            }
        };
        let tunnel = cfg.inbound_tunnel_port.as_str();
        let owner = |kind, id: &'a String| ProxyOwner {
            kind,
            id: id.as_str(),
            kept_loopback_ports: if dns.is_on() && kind == OwnerKind::Uid {
                vec![DNS_PORT, tunnel]
            } else {
                vec![tunnel]
            },
        };
        let owners = cfg
            .proxy_uids
            .iter()
            .map(|id| owner(OwnerKind::Uid, id))
            .chain(cfg.proxy_gids.iter().map(|id| owner(OwnerKind::Gid, id)))
            .collect();
        let inbound = match &cfg.inbound_ports {
            InboundPorts::None => InboundPlan::Off,
            InboundPorts::All => InboundPlan::AllExcept(&cfg.inbound_ports_exclude),
            InboundPorts::List(ports) => InboundPlan::Only(ports),
        };
        let include = &cfg.outbound_ranges_include;
        CapturePlan {
            tproxy: cfg.is_tproxy(),
            inbound,
            owners,
            loopback_included: include.has_loopback_v4 || include.has_loopback_v6,
            dns,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::super::capture::IpRanges;
    use super::*;

    #[test]
    fn dns_keeps_port_53_for_uids_only() {
        let cfg = CaptureConfig {
            redirect_dns: true,
            dns_servers_v4: vec!["10.0.0.10".into()],
            proxy_uids: vec!["1337".into()],
            proxy_gids: vec!["1338".into()],
            ..Default::default()
        };
        let plan = CapturePlan::new(&cfg);
        let kept: Vec<_> = plan
            .owners
            .iter()
            .map(|o| (o.kind, o.id, o.kept_loopback_ports.clone()))
            .collect();
        assert_eq!(
            kept,
            vec![
                (OwnerKind::Uid, "1337", vec!["53", "15008"]),
                (OwnerKind::Gid, "1338", vec!["15008"]),
            ]
        );
        assert!(matches!(plan.dns, DnsPlan::Servers { v4, .. } if v4.len() == 1));
    }

    #[test]
    fn dns_without_servers_is_off_and_loopback_include_is_seen() {
        let cfg = CaptureConfig {
            redirect_dns: true,
            outbound_ranges_include: IpRanges::parse("127.0.0.1/8").unwrap(),
            inbound_ports: InboundPorts::All,
            inbound_ports_exclude: vec!["15090".into()],
            ..Default::default()
        };
        let plan = CapturePlan::new(&cfg);
        assert_eq!(plan.dns, DnsPlan::Off);
        assert!(plan.loopback_included);
        assert_eq!(plan.inbound, InboundPlan::AllExcept(&["15090".to_string()]));
        assert_eq!(host_prefix(Family::V6, "::1"), "::1/128");
    }

    /// The DNS decision as each backend renders it: the destinations whose DNS is redirected to
    /// the DNS proxy (`*` for every one), as a set of (TCP or UDP) redirect rules' addresses.
    fn rendered_dns_destinations(cfg: &CaptureConfig) -> [BTreeSet<String>; 2] {
        use super::super::model::{Match, Table, Target};
        use super::super::nft_model::{AddrValue, NftExpr};
        use super::super::nftables::{NftTable, sidecar_chain};
        let rules = super::super::capture::build(cfg);
        let iptables = rules
            .v4
            .iter()
            .chain(&rules.v6)
            .filter(|r| {
                r.table == Table::Nat && r.chain == super::super::capture::chain::OUTPUT_DNS
            })
            .filter(|r| matches!(r.target, Target::Redirect { .. }))
            .map(|r| {
                let addr = r.matches.iter().find_map(|m| match m {
                    Match::Dst { addr, .. } => Some(addr.clone()),
                    _ => None,
                });
                addr.unwrap_or_else(|| "*".into())
            })
            .collect();
        let nft = super::super::nft_capture::build(cfg)
            .rules
            .iter()
            .filter(|r| r.table == NftTable::SidecarNat && r.chain == sidecar_chain::OUTPUT_DNS)
            .filter(|r| r.exprs.iter().any(|e| matches!(e, NftExpr::RedirectTo(_))))
            .map(|r| {
                let addr = r.exprs.iter().find_map(|e| match e {
                    NftExpr::Addr {
                        value: AddrValue::Prefix(p),
                        ..
                    } => Some(p.clone()),
                    _ => None,
                });
                addr.unwrap_or_else(|| "*".into())
            })
            .collect();
        [iptables, nft]
    }

    #[test]
    fn both_backends_render_the_planned_dns() {
        let servers = |v4: &[&str], v6: &[&str]| CaptureConfig {
            redirect_dns: true,
            dns_servers_v4: v4.iter().map(|s| s.to_string()).collect(),
            dns_servers_v6: v6.iter().map(|s| s.to_string()).collect(),
            enable_ipv6: true,
            ..Default::default()
        };
        let all = CaptureConfig {
            capture_all_dns: true,
            ..servers(&[], &[])
        };
        let not_asked = CaptureConfig {
            redirect_dns: false,
            ..servers(&["10.96.0.10"], &[])
        };
        for cfg in [
            servers(&[], &[]),
            not_asked,
            all,
            servers(&["10.96.0.10"], &[]),
            servers(&["10.96.0.10", "1.1.1.1"], &["fd00::10"]),
        ] {
            let planned: BTreeSet<String> = match CapturePlan::new(&cfg).dns {
                DnsPlan::Off => BTreeSet::new(),
                DnsPlan::All => ["*".to_string()].into(),
                DnsPlan::Servers { v4, v6 } => {
                    let v4 = v4.iter().map(|s| host_prefix(Family::V4, s));
                    v4.chain(v6.iter().map(|s| host_prefix(Family::V6, s)))
                        .collect()
                }
            };
            for rendered in rendered_dns_destinations(&cfg) {
                assert_eq!(rendered, planned, "{cfg:?}");
            }
        }
    }

    /// The proxy-owner decision as each backend renders it: (kind, id, kept loopback ports) of
    /// every rule sending the proxy's own loopback traffic to inbound capture (IPv4 rules).
    fn rendered_owner_decisions(cfg: &CaptureConfig) -> [Vec<(OwnerKind, String, Vec<String>)>; 2] {
        use super::super::model::{Match, Target};
        use super::super::nft_model::NftExpr;
        let iptables = super::super::capture::build(cfg)
            .v4
            .iter()
            .filter(|r| r.target == Target::Jump(super::super::capture::chain::IN_REDIRECT.into()))
            .filter_map(|r| {
                let mut owner = None;
                let mut ports = Vec::new();
                for m in &r.matches {
                    match m {
                        Match::UidOwner { id, .. } => owner = Some((OwnerKind::Uid, id.clone())),
                        Match::GidOwner { id, .. } => owner = Some((OwnerKind::Gid, id.clone())),
                        Match::DstPort { port, .. } => ports = vec![port.clone()],
                        Match::DstPorts { ports: p, .. } => ports = p.clone(),
                        _ => {}
                    }
                }
                owner.map(|(kind, id)| (kind, id, ports))
            })
            .collect();
        let nft = super::super::nft_capture::build(cfg)
            .rules
            .iter()
            .filter(|r| r.jump_target() == Some(super::super::nftables::sidecar_chain::IN_REDIRECT))
            .filter(|r| {
                !r.exprs.iter().any(|e| {
                    matches!(
                        e,
                        NftExpr::Addr {
                            family: Family::V6,
                            ..
                        }
                    )
                })
            })
            .filter_map(|r| {
                let mut owner = None;
                let mut ports = Vec::new();
                for e in &r.exprs {
                    match e {
                        NftExpr::Owner { key, id, .. } => owner = Some((*key, id.clone())),
                        NftExpr::Port { ports: p, .. } => ports = p.clone(),
                        _ => {}
                    }
                }
                owner.map(|(kind, id)| (kind, id, ports))
            })
            .collect();
        [iptables, nft]
    }

    #[test]
    fn both_backends_render_the_planned_proxy_owners() {
        for (dns, uids, gids) in [
            (false, vec!["1337"], vec!["1337"]),
            (true, vec!["1337", "0"], vec![]),
            (true, vec![], vec!["2000", "3000"]),
            (false, vec![], vec![]),
        ] {
            let cfg = CaptureConfig {
                redirect_dns: dns,
                dns_servers_v4: vec!["10.96.0.10".into()],
                proxy_uids: uids.iter().map(|s| s.to_string()).collect(),
                proxy_gids: gids.iter().map(|s| s.to_string()).collect(),
                enable_ipv6: true,
                ..Default::default()
            };
            let plan = CapturePlan::new(&cfg);
            let planned: Vec<_> = plan
                .owners
                .iter()
                .map(|o| {
                    let ports = o.kept_loopback_ports.iter().map(|p| p.to_string());
                    (o.kind, o.id.to_string(), ports.collect())
                })
                .collect();
            for rendered in rendered_owner_decisions(&cfg) {
                assert_eq!(rendered, planned, "dns={dns} uids={uids:?} gids={gids:?}");
            }
        }
    }
}
