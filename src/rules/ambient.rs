//! Ambient mode: the rules the node agent programs inside an enrolled pod (redirect to ztunnel) and
//! on the host (SNAT of kubelet probes), for both backends, in Istio's order and spelling.

pub use super::ambient_nft::{host_nft_rules, inpod_nft_rules};
use super::capture::{DEFAULT_LOOPBACK_V4 as LO_V4, LOOPBACK_V6 as LO_V6};
use super::capture_values::{Field, InvalidValue, check_interface};
use super::model::parts::{TCP, UDP, dst, jump, redirect};
use super::model::well_known::{CT_ZONE_UPSTREAM_DNS, DNS_PORT as DNS, LOOPBACK_IFACE};
use super::model::{Match, Proto, RuleSet, RuleSetBuilder, Table, Target};
use super::nft_model::MaskedMark;

/// ztunnel's ports.
pub const ZTUNNEL_OUTBOUND_PORT: &str = "15001";
pub const ZTUNNEL_INBOUND_PLAINTEXT_PORT: &str = "15006";
pub const ZTUNNEL_HBONE_PORT: &str = "15008";
pub const DNS_PORT: &str = "15053";
/// Packets ztunnel itself sends carry this mark (0x539 = 1337) under this mask.
pub const ZTUNNEL_MARK: MaskedMark = MaskedMark {
    value: 0x539,
    mask: 0xfff,
};
/// Connections ztunnel accepted are marked so replies bypass redirection.
pub const CONN_MARK: MaskedMark = MaskedMark {
    value: 0x111,
    mask: 0xfff,
};
/// Host address sets of pod IPs whose kubelet probes are SNATed.
pub const PROBE_SET_V4: &str = "istio-inpod-probes-v4";
pub const PROBE_SET_V6: &str = "istio-inpod-probes-v6";
/// Default probe SNAT addresses (`HOST_PROBE_SNAT_IP`, `HOST_PROBE_SNAT_IPV6`).
pub const DEFAULT_PROBE_SNAT_V4: &str = "169.254.7.127";
pub const DEFAULT_PROBE_SNAT_V6: &str = "fd16:9254:7127:1337:ffff:ffff:ffff:ffff";

const IN_CHAIN: &str = "ISTIO_PRERT";
const OUT_CHAIN: &str = "ISTIO_OUTPUT";
const HOST_CHAIN: &str = "ISTIO_POSTRT";

/// Node-wide ambient settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmbientConfig {
    pub probe_snat_v4: String,
    pub probe_snat_v6: String,
    pub enable_ipv6: bool,
    pub redirect_dns: bool,
}

impl Default for AmbientConfig {
    fn default() -> Self {
        AmbientConfig {
            probe_snat_v4: DEFAULT_PROBE_SNAT_V4.into(),
            probe_snat_v6: DEFAULT_PROBE_SNAT_V6.into(),
            enable_ipv6: false,
            redirect_dns: false,
        }
    }
}

/// A pod's DNS capture override (annotation), over the node-wide setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PodDns {
    #[default]
    Unset,
    Enabled,
    Disabled,
}

/// Per-pod settings.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodOverrides {
    /// Ingress gateways: no inbound capture.
    pub ingress: bool,
    /// Interfaces whose inbound traffic is treated as outbound.
    pub virtual_interfaces: Vec<String>,
    pub dns: PodDns,
}

impl PodOverrides {
    /// Checks every value that reaches the kernel (the interface names, as the sidecar path
    /// checks its own: [`check_interface`]); the first bad one is returned. A name like
    /// `eth0 -j ACCEPT` would otherwise become rule arguments.
    pub fn validate(&self) -> Result<(), InvalidValue> {
        for name in &self.virtual_interfaces {
            check_interface(name).map_err(|reason| InvalidValue {
                field: Field::RerouteVirtualInterfaces,
                value: name.clone(),
                reason,
            })?;
        }
        Ok(())
    }
}

/// The pod annotation naming the virtual interfaces, read by both modes (the sidecar derivation
/// and the ambient agent re-export it).
pub const ANN_REROUTE_VIRTUAL_INTERFACES: &str = "istio.io/reroute-virtual-interfaces";

/// A virtual-interface list as Istio reads it: comma-separated, items trimmed, empties dropped.
/// Not checked here: [`PodOverrides::validate`] does that before anything is programmed.
pub fn split_interfaces(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

fn dns_enabled(cfg: &AmbientConfig, pod: &PodOverrides) -> bool {
    match pod.dns {
        PodDns::Enabled => true,
        PodDns::Disabled => false,
        PodDns::Unset => cfg.redirect_dns,
    }
}

fn mark(mark: MaskedMark, negate: bool) -> Match {
    Match::Mark {
        value: mark.iptables(),
        negate,
    }
}

/// One decision of the in-pod redirect, in program order. Both backends render the same steps
/// ([`inpod_rules`] for iptables, [`inpod_nft_rules`] for nftables), each in Istio's spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InpodStep<'a> {
    /// The base chains jump to the pod chains (raw too when DNS is captured).
    EnterChains { raw: bool },
    /// Inbound traffic on this interface is treated as outbound (sent to ztunnel's outbound port).
    VirtualInterface(&'a str),
    /// Connections ztunnel itself opens get [`CONN_MARK`].
    MarkZtunnelConnections,
    /// Kubelet probes (from the probe SNAT address) bypass ztunnel inbound.
    AcceptProbesInbound,
    /// Traffic to the probe SNAT address (probe replies) bypasses ztunnel.
    AcceptProbesOutbound,
    /// Inbound TCP not for the HBONE port and not from ztunnel goes to ztunnel's plaintext port.
    RedirectInbound,
    /// The connection mark is copied back to the packet.
    RestoreConnMark,
    /// DNS goes to ztunnel's DNS proxy; ztunnel's own DNS gets its conntrack zone.
    CaptureDns,
    /// Connections ztunnel opened are not redirected again.
    AcceptZtunnelConnections,
    /// Loopback traffic to non-loopback addresses (the pod's own IP) is not redirected.
    AcceptLoopback,
    /// Outbound TCP not from ztunnel goes to ztunnel's outbound port.
    RedirectOutbound,
}

/// The in-pod redirect decisions for this pod: which steps, in Istio's order.
pub fn inpod_plan<'a>(cfg: &AmbientConfig, pod: &'a PodOverrides) -> Vec<InpodStep<'a>> {
    use InpodStep::*;
    let dns = dns_enabled(cfg, pod);
    let inbound = !pod.ingress;
    let mut steps = vec![EnterChains { raw: dns }];
    steps.extend(pod.virtual_interfaces.iter().map(|v| VirtualInterface(v)));
    steps.push(MarkZtunnelConnections);
    if inbound {
        steps.push(AcceptProbesInbound);
    }
    steps.push(AcceptProbesOutbound);
    if inbound {
        steps.push(RedirectInbound);
    }
    steps.push(RestoreConnMark);
    if dns {
        steps.push(CaptureDns);
    }
    steps.extend([AcceptZtunnelConnections, AcceptLoopback, RedirectOutbound]);
    steps
}

/// The in-pod iptables rules.
pub fn inpod_rules(cfg: &AmbientConfig, pod: &PodOverrides) -> RuleSet {
    use Table::{Mangle, Nat, Raw};
    let (p4, p6) = (cfg.probe_snat_v4.as_str(), cfg.probe_snat_v6.as_str());
    let mut b = RuleSetBuilder::new(cfg.enable_ipv6);
    for step in inpod_plan(cfg, pod) {
        match step {
            InpodStep::EnterChains { raw } => {
                b.append(Mangle, "PREROUTING", vec![], jump(IN_CHAIN));
                b.append(Mangle, "OUTPUT", vec![], jump(OUT_CHAIN));
                b.append(Nat, "OUTPUT", vec![], jump(OUT_CHAIN));
                if raw {
                    b.append(Raw, "PREROUTING", vec![], jump(IN_CHAIN));
                    b.append(Raw, "OUTPUT", vec![], jump(OUT_CHAIN));
                }
                b.append(Nat, "PREROUTING", vec![], jump(IN_CHAIN));
            }
            InpodStep::VirtualInterface(vif) => {
                let iface = || Match::InIface {
                    name: vif.into(),
                    negate: false,
                };
                b.append(
                    Nat,
                    IN_CHAIN,
                    vec![iface(), TCP],
                    redirect(ZTUNNEL_OUTBOUND_PORT, true),
                );
                b.append(Nat, IN_CHAIN, vec![iface(), TCP], Target::Return);
            }
            InpodStep::MarkZtunnelConnections => b.append(
                Mangle,
                IN_CHAIN,
                vec![mark(ZTUNNEL_MARK, false)],
                Target::ConnmarkSetXmark(CONN_MARK.iptables()),
            ),
            InpodStep::AcceptProbesInbound => {
                b.append_versioned(Nat, IN_CHAIN, p4, p6, |p| {
                    (
                        vec![
                            Match::Src {
                                addr: p.into(),
                                negate: false,
                            },
                            TCP,
                            Match::ProtoModule(Proto::Tcp),
                        ],
                        Target::Accept,
                    )
                });
            }
            InpodStep::AcceptProbesOutbound => {
                b.append_versioned(Nat, OUT_CHAIN, p4, p6, |p| {
                    (
                        vec![dst(p, false), TCP, Match::ProtoModule(Proto::Tcp)],
                        Target::Accept,
                    )
                });
            }
            InpodStep::RedirectInbound => {
                b.append_versioned(Nat, IN_CHAIN, LO_V4, LO_V6, |lo| {
                    (
                        vec![
                            dst(lo, true),
                            TCP,
                            Match::DstPort {
                                port: ZTUNNEL_HBONE_PORT.into(),
                                negate: true,
                                module: None,
                            },
                            mark(ZTUNNEL_MARK, true),
                        ],
                        redirect(ZTUNNEL_INBOUND_PLAINTEXT_PORT, true),
                    )
                });
            }
            InpodStep::RestoreConnMark => b.append(
                Mangle,
                OUT_CHAIN,
                vec![Match::ConnMark {
                    value: CONN_MARK.iptables(),
                }],
                Target::ConnmarkRestore { masks: true },
            ),
            InpodStep::CaptureDns => capture_dns(&mut b),
            InpodStep::AcceptZtunnelConnections => b.append(
                Nat,
                OUT_CHAIN,
                vec![TCP, mark(CONN_MARK, false)],
                Target::Accept,
            ),
            InpodStep::AcceptLoopback => {
                b.append_versioned(Nat, OUT_CHAIN, LO_V4, LO_V6, |lo| {
                    (
                        vec![
                            dst(lo, true),
                            Match::OutIface {
                                name: LOOPBACK_IFACE.into(),
                                negate: false,
                            },
                        ],
                        Target::Accept,
                    )
                });
            }
            InpodStep::RedirectOutbound => {
                b.append_versioned(Nat, OUT_CHAIN, LO_V4, LO_V6, |lo| {
                    (
                        vec![dst(lo, true), TCP, mark(ZTUNNEL_MARK, true)],
                        redirect(ZTUNNEL_OUTBOUND_PORT, true),
                    )
                });
            }
        }
    }
    b.build()
}

fn capture_dns(b: &mut RuleSetBuilder) {
    use Table::{Nat, Raw};
    let port53 = |module| Match::DstPort {
        port: DNS.into(),
        negate: false,
        module,
    };
    b.append(
        Nat,
        OUT_CHAIN,
        vec![
            Match::OutIface {
                name: LOOPBACK_IFACE.into(),
                negate: true,
            },
            UDP,
            mark(ZTUNNEL_MARK, true),
            port53(Some(Proto::Udp)),
        ],
        redirect(DNS_PORT, false),
    );
    b.append_versioned(Nat, OUT_CHAIN, LO_V4, LO_V6, |lo| {
        (
            vec![dst(lo, true), TCP, port53(None), mark(ZTUNNEL_MARK, true)],
            redirect(DNS_PORT, true),
        )
    });
    b.append(
        Raw,
        OUT_CHAIN,
        vec![UDP, mark(ZTUNNEL_MARK, false), port53(Some(Proto::Udp))],
        Target::CtZone(CT_ZONE_UPSTREAM_DNS),
    );
    b.append(
        Raw,
        IN_CHAIN,
        vec![
            UDP,
            mark(ZTUNNEL_MARK, true),
            Match::SrcPort {
                port: DNS.into(),
                negate: false,
                module: Some(Proto::Udp),
            },
        ],
        Target::CtZone(CT_ZONE_UPSTREAM_DNS),
    );
}

/// The host-side iptables rules: SNAT kubelet probes to enrolled pods (listed in the probe sets)
/// to the probe address, so in-pod rules can let them bypass ztunnel.
pub fn host_rules(cfg: &AmbientConfig) -> RuleSet {
    use super::model::{Family, SetDir};
    let mut b = RuleSetBuilder::new(cfg.enable_ipv6);
    b.insert(Table::Nat, "POSTROUTING", 1, vec![], jump(HOST_CHAIN));
    for (family, set, addr) in [
        (Family::V4, PROBE_SET_V4, &cfg.probe_snat_v4),
        (Family::V6, PROBE_SET_V6, &cfg.probe_snat_v6),
    ] {
        b.append_to(
            family,
            Table::Nat,
            HOST_CHAIN,
            vec![
                Match::SocketExists,
                TCP,
                Match::InSet {
                    name: set.into(),
                    dir: SetDir::Dst,
                },
            ],
            Target::Snat(addr.clone()),
        );
    }
    b.build()
}

/// In-pod rule sets for the readers' tests to read back: the default pod, and one with every
/// option on (IPv6, DNS, ingress, virtual interfaces, one of them a wildcard).
#[cfg(test)]
pub(crate) fn sample_inpod_rule_sets() -> Vec<RuleSet> {
    let all_on = AmbientConfig {
        enable_ipv6: true,
        redirect_dns: true,
        ..Default::default()
    };
    let pod = PodOverrides {
        ingress: true,
        virtual_interfaces: vec!["tap0".into(), "veth+".into()],
        dns: PodDns::Enabled,
    };
    vec![
        inpod_rules(&AmbientConfig::default(), &PodOverrides::default()),
        inpod_rules(&all_on, &pod),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_follows_ingress_and_the_pod_dns_override() {
        use InpodStep::*;
        let cfg = AmbientConfig {
            redirect_dns: true,
            ..Default::default()
        };
        let pod = PodOverrides {
            ingress: true,
            virtual_interfaces: vec!["tun0".into()],
            dns: PodDns::Disabled,
        };
        assert_eq!(
            inpod_plan(&cfg, &pod),
            vec![
                EnterChains { raw: false },
                VirtualInterface("tun0"),
                MarkZtunnelConnections,
                AcceptProbesOutbound,
                RestoreConnMark,
                AcceptZtunnelConnections,
                AcceptLoopback,
                RedirectOutbound,
            ]
        );
        let plain = PodOverrides::default();
        let steps = inpod_plan(&cfg, &plain);
        assert!(steps.contains(&EnterChains { raw: true }) && steps.contains(&CaptureDns));
        assert!(steps.contains(&RedirectInbound) && steps.contains(&AcceptProbesInbound));
    }

    #[test]
    fn both_backends_leave_out_the_same_steps() {
        // An ingress pod without DNS: no inbound redirect to ztunnel's plaintext port and no DNS
        // proxy port in either backend.
        let cfg = AmbientConfig::default();
        let pod = PodOverrides {
            ingress: true,
            ..Default::default()
        };
        let iptables = format!("{:?}", inpod_rules(&cfg, &pod));
        let nft = inpod_nft_rules(&cfg, &pod)
            .rules
            .iter()
            .map(|r| r.body())
            .collect::<Vec<_>>()
            .join("\n");
        for text in [iptables, nft] {
            assert!(!text.contains(ZTUNNEL_INBOUND_PLAINTEXT_PORT), "{text}");
            assert!(!text.contains(DNS_PORT), "{text}");
            assert!(text.contains(ZTUNNEL_OUTBOUND_PORT), "{text}");
        }
    }

    #[test]
    fn a_virtual_interface_wildcard_is_an_nft_wildcard_in_pod() {
        let pod = PodOverrides {
            virtual_interfaces: vec!["tun+".into()],
            ..Default::default()
        };
        let nft: Vec<String> = inpod_nft_rules(&AmbientConfig::default(), &pod)
            .rules
            .iter()
            .map(|r| r.body())
            .collect();
        assert!(
            nft.iter().any(|b| b.starts_with("iifname tun* ")),
            "{nft:?}"
        );
        assert!(!nft.iter().any(|b| b.contains('+')), "{nft:?}");
    }
}
