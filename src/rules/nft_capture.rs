//! Sidecar traffic capture for the nftables backend: the same [`CaptureConfig`] and the same
//! [`CapturePlan`] as the iptables builder in [`super::capture`], built into one `inet` rule list
//! (IPv6 twins right after their IPv4 rules) of typed expressions, in the order of Istio's
//! nftables capture.

use super::capture::{
    CaptureConfig, DNS_PROXY_PORT, INBOUND_PASSTHROUGH_V4, INBOUND_PASSTHROUGH_V6, LOOPBACK_V6,
    OUTBOUND_MARK, OwnerGroups,
};
use super::capture_plan::{CapturePlan, DnsPlan, InboundPlan, host_prefix};
use super::model::well_known::{
    CT_ZONE_APP_DNS, CT_ZONE_UPSTREAM_DNS, DNS_PORT, LOOPBACK_IFACE as LO,
};
use super::model::{Family, Proto};
use super::nft_model::expr::{daddr, dport, iif, jump, oif, ports, redirect, saddr, sport, tcp};
use super::nft_model::{
    MarkKey, MarkSource, NftCtState, NftExpr, NftRuleSet, NftRulesBuilder, OwnerKind, Side,
};
use super::nftables::{NftTable, sidecar_chain as chain};

const NAT: NftTable = NftTable::SidecarNat;
const MANGLE: NftTable = NftTable::SidecarMangle;
const RAW: NftTable = NftTable::SidecarRaw;

use NftExpr::{Accept, Counter, Return};

fn owner(key: OwnerKind, id: &str, negate: bool) -> NftExpr {
    NftExpr::Owner {
        key,
        id: id.into(),
        negate,
        with_meta: false,
    }
}

fn mark(key: MarkKey, value: &str, negate: bool) -> NftExpr {
    NftExpr::Mark {
        key,
        value: value.into(),
        negate,
    }
}

fn mark_set(value: &str) -> NftExpr {
    NftExpr::MetaMarkSet(MarkSource::Value(value.into()))
}

/// Builds the nftables sidecar capture rules.
pub fn build(cfg: &CaptureConfig) -> NftRuleSet {
    let cfg = &*cfg.without_repeats();
    let mut b = NftRulesBuilder::new(cfg.enable_ipv6);
    let plan = CapturePlan::new(cfg);
    build_exclusions(&mut b, cfg, plan.tproxy);
    build_redirect_chains(&mut b, cfg);
    if plan.inbound != InboundPlan::Off {
        build_inbound(&mut b, cfg, &plan);
    }
    build_output_owners(&mut b, cfg, &plan);
    match plan.dns {
        DnsPlan::Off => {}
        DnsPlan::All => build_dns(&mut b, &plan, None),
        DnsPlan::Servers { v4, v6 } => build_dns(&mut b, &plan, Some((v4, v6))),
    }
    build_output_destinations(&mut b, cfg);
    if plan.tproxy {
        build_tproxy_marks(&mut b, cfg, &plan);
    }
    b.finish()
}

fn tcp_dport(port: &str) -> NftExpr {
    dport(Proto::Tcp, port, false)
}

/// Excluded and rerouted interfaces return early; invalid packets drop when asked.
fn build_exclusions(b: &mut NftRulesBuilder, cfg: &CaptureConfig, tproxy: bool) {
    use chain::*;
    let iface_return = |iface: &str, inbound: bool| {
        let m = if inbound {
            iif(iface)
        } else {
            oif(iface, false)
        };
        vec![m, Counter, Return]
    };

    for iface in &cfg.exclude_interfaces {
        b.add(NAT, PREROUTING, iface_return(iface, true));
        b.add(NAT, OUTPUT, iface_return(iface, false));
    }
    if tproxy {
        for iface in &cfg.exclude_interfaces {
            b.add(MANGLE, PREROUTING, iface_return(iface, true));
            b.add(MANGLE, OUTPUT, iface_return(iface, false));
        }
    }
    for iface in &cfg.reroute_virtual_interfaces {
        b.insert(NAT, PREROUTING, 0, iface_return(iface, true));
    }
    if cfg.drop_invalid {
        let invalid = NftExpr::CtState(vec![NftCtState::Invalid]);
        b.add(
            MANGLE,
            PREROUTING,
            vec![tcp(), invalid, Counter, jump(DROP)],
        );
        b.add(MANGLE, DROP, vec![Counter, NftExpr::Drop]);
    }
}

/// The inbound tunnel port's return and the two redirect chains.
fn build_redirect_chains(b: &mut NftRulesBuilder, cfg: &CaptureConfig) {
    use chain::*;
    let tunnel = cfg.inbound_tunnel_port.as_str();
    b.add(
        NAT,
        INBOUND,
        vec![tcp(), tcp_dport(tunnel), Counter, Return],
    );
    b.add(
        NAT,
        REDIRECT,
        vec![tcp(), Counter, redirect(&cfg.proxy_port)],
    );
    b.add(
        NAT,
        IN_REDIRECT,
        vec![tcp(), Counter, redirect(&cfg.inbound_capture_port)],
    );
}

/// Inbound capture: REDIRECT in nat, or TPROXY in mangle, for all ports but some or only some.
fn build_inbound(b: &mut NftRulesBuilder, cfg: &CaptureConfig, plan: &CapturePlan) {
    use chain::*;
    let tproxy = plan.tproxy;
    let tproxy_mark = cfg.tproxy_mark.as_str();
    let loopback = (cfg.loopback_v4.as_str(), LOOPBACK_V6);
    let inbound_table = if tproxy { MANGLE } else { NAT };
    let capture = cfg.inbound_capture_port.as_str();
    if tproxy {
        b.add(MANGLE, DIVERT, vec![Counter, mark_set(tproxy_mark)]);
        b.add(MANGLE, DIVERT, vec![Counter, Accept]);
        b.add_both(MANGLE, TPROXY, loopback, |family, lo| {
            vec![
                tcp(),
                daddr(family, lo, true),
                NftExpr::Tproxy {
                    family,
                    port: capture.into(),
                },
                mark_set(tproxy_mark),
                Counter,
                Accept,
            ]
        });
    }
    b.add(
        inbound_table,
        PREROUTING,
        vec![tcp(), Counter, jump(INBOUND)],
    );
    let established = || NftExpr::CtState(vec![NftCtState::Related, NftCtState::Established]);
    match plan.inbound {
        InboundPlan::AllExcept(excluded) => {
            for port in excluded {
                b.add(
                    inbound_table,
                    INBOUND,
                    vec![tcp(), tcp_dport(port), Counter, Return],
                );
            }
            if tproxy {
                b.add(
                    MANGLE,
                    INBOUND,
                    vec![tcp(), established(), Counter, jump(DIVERT)],
                );
                b.add(MANGLE, INBOUND, vec![tcp(), Counter, jump(TPROXY)]);
            } else {
                b.add(NAT, INBOUND, vec![tcp(), Counter, jump(IN_REDIRECT)]);
            }
        }
        InboundPlan::Only(ports) => {
            for port in ports {
                if tproxy {
                    b.add(
                        MANGLE,
                        INBOUND,
                        vec![tcp(), established(), tcp_dport(port), Counter, jump(DIVERT)],
                    );
                    b.add(
                        MANGLE,
                        INBOUND,
                        vec![tcp(), tcp_dport(port), Counter, jump(TPROXY)],
                    );
                } else {
                    b.add(
                        NAT,
                        INBOUND,
                        vec![tcp(), tcp_dport(port), Counter, jump(IN_REDIRECT)],
                    );
                }
            }
        }
        InboundPlan::Off => {}
    }
}

/// ISTIO_OUTPUT's first part: excluded ports, passthrough, the proxy's own and excluded owners.
fn build_output_owners(b: &mut NftRulesBuilder, cfg: &CaptureConfig, plan: &CapturePlan) {
    use chain::*;
    let dns = plan.dns.is_on();
    let loopback = (cfg.loopback_v4.as_str(), LOOPBACK_V6);
    let passthrough = (INBOUND_PASSTHROUGH_V4, INBOUND_PASSTHROUGH_V6);
    b.add(NAT, OUTPUT, vec![Counter, jump(ISTIO_OUTPUT)]);
    for port in &cfg.outbound_ports_exclude {
        for proto in [Proto::Tcp, Proto::Udp] {
            b.add(
                NAT,
                ISTIO_OUTPUT,
                vec![dport(proto, port, false), Counter, Return],
            );
        }
    }
    b.add_both(NAT, ISTIO_OUTPUT, passthrough, |family, src| {
        vec![oif(LO, false), saddr(family, src), Counter, Return]
    });

    for o in &plan.owners {
        let (key, id) = (o.kind, o.id);
        b.add_both(NAT, ISTIO_OUTPUT, loopback, |family, lo| {
            vec![
                oif(LO, false),
                tcp(),
                daddr(family, lo, true),
                ports(Proto::Tcp, Side::Dst, &o.kept_loopback_ports, true),
                owner(key, id, false),
                Counter,
                jump(IN_REDIRECT),
            ]
        });
        if !plan.loopback_included {
            let mut exprs = vec![oif(LO, false)];
            if dns {
                exprs.extend([tcp(), dport(Proto::Tcp, DNS_PORT, true)]);
            }
            exprs.extend([owner(key, id, true), Counter, Return]);
            b.add(NAT, ISTIO_OUTPUT, exprs);
        }
        b.add(
            NAT,
            ISTIO_OUTPUT,
            vec![owner(key, id, false), Counter, Return],
        );
    }
    match &cfg.owner_groups {
        OwnerGroups::AllExcept(groups) => {
            for g in groups {
                b.add(
                    NAT,
                    ISTIO_OUTPUT,
                    vec![owner(OwnerKind::Gid, g, false), Counter, Return],
                );
            }
        }
        OwnerGroups::Only(groups) => {
            let mut exprs: Vec<NftExpr> = groups
                .iter()
                .map(|g| owner(OwnerKind::Gid, g, true))
                .collect();
            exprs.extend([Counter, Return]);
            b.add(NAT, ISTIO_OUTPUT, exprs);
        }
    }
}

/// ISTIO_OUTPUT's last part: loopback and excluded destinations return, included ones redirect.
fn build_output_destinations(b: &mut NftRulesBuilder, cfg: &CaptureConfig) {
    use chain::*;
    let loopback = (cfg.loopback_v4.as_str(), LOOPBACK_V6);
    b.add_both(NAT, ISTIO_OUTPUT, loopback, |family, lo| {
        vec![daddr(family, lo, false), Counter, Return]
    });
    for (family, cidrs) in [
        (Family::V4, &cfg.outbound_ranges_exclude.v4),
        (Family::V6, &cfg.outbound_ranges_exclude.v6),
    ] {
        if family == Family::V6 && !b.ipv6 {
            continue;
        }
        for cidr in cidrs {
            b.add(
                NAT,
                ISTIO_OUTPUT,
                vec![daddr(family, cidr, false), Counter, Return],
            );
        }
    }
    for port in &cfg.outbound_ports_include {
        b.add(
            NAT,
            ISTIO_OUTPUT,
            vec![tcp_dport(port), Counter, jump(REDIRECT)],
        );
    }
    let include = &cfg.outbound_ranges_include;
    if include.wildcard {
        b.add(NAT, ISTIO_OUTPUT, vec![Counter, jump(REDIRECT)]);
        for iface in &cfg.reroute_virtual_interfaces {
            b.insert(
                NAT,
                PREROUTING,
                0,
                vec![iif(iface), Counter, jump(REDIRECT)],
            );
        }
    } else {
        for (family, cidrs) in [(Family::V4, &include.v4), (Family::V6, &include.v6)] {
            if family == Family::V6 && !b.ipv6 {
                continue;
            }
            for cidr in cidrs {
                for iface in &cfg.reroute_virtual_interfaces {
                    b.insert(
                        NAT,
                        PREROUTING,
                        0,
                        vec![
                            iif(iface),
                            daddr(family, cidr, false),
                            Counter,
                            jump(REDIRECT),
                        ],
                    );
                }
                b.add(
                    NAT,
                    ISTIO_OUTPUT,
                    vec![daddr(family, cidr, false), Counter, jump(REDIRECT)],
                );
            }
        }
    }
}

/// TPROXY: connection marks, and the loop prevention for the proxy's own loopback traffic.
fn build_tproxy_marks(b: &mut NftRulesBuilder, cfg: &CaptureConfig, plan: &CapturePlan) {
    use chain::*;
    let tproxy_mark = cfg.tproxy_mark.as_str();
    let loopback = (cfg.loopback_v4.as_str(), LOOPBACK_V6);
    b.add(
        MANGLE,
        PREROUTING,
        vec![
            tcp(),
            mark(MarkKey::MetaShort, tproxy_mark, false),
            Counter,
            NftExpr::CtMarkSet(MarkSource::Other),
        ],
    );
    b.add(
        MANGLE,
        OUTPUT,
        vec![
            oif(LO, false),
            tcp(),
            mark(MarkKey::MetaShort, tproxy_mark, false),
            Counter,
            Return,
        ],
    );
    for o in &plan.owners {
        let (key, id) = (o.kind, o.id);
        b.add_both(MANGLE, OUTPUT, loopback, |family, lo| {
            vec![
                oif(LO, false),
                tcp(),
                daddr(family, lo, true),
                owner(key, id, false),
                Counter,
                mark_set(OUTBOUND_MARK),
            ]
        });
    }
    b.add(
        MANGLE,
        OUTPUT,
        vec![
            tcp(),
            mark(MarkKey::Ct, tproxy_mark, false),
            Counter,
            NftExpr::MetaMarkSet(MarkSource::Other),
        ],
    );
    b.insert(
        MANGLE,
        INBOUND,
        0,
        vec![
            tcp(),
            mark(MarkKey::MetaShort, tproxy_mark, false),
            Counter,
            Return,
        ],
    );
    let passthrough = |family, src| vec![iif(LO), tcp(), saddr(family, src), Counter, Return];
    b.insert(
        MANGLE,
        INBOUND,
        1,
        passthrough(Family::V4, INBOUND_PASSTHROUGH_V4),
    );
    if b.ipv6 {
        b.insert(
            MANGLE,
            INBOUND,
            1,
            passthrough(Family::V6, INBOUND_PASSTHROUGH_V6),
        );
    }
    b.insert(
        MANGLE,
        INBOUND,
        2,
        vec![
            iif(LO),
            tcp(),
            mark(MarkKey::MetaShort, OUTBOUND_MARK, true),
            Counter,
            Return,
        ],
    );
}

/// DNS capture: every DNS destination (`servers` is `None`) or only the (IPv4, IPv6) servers.
fn build_dns(b: &mut NftRulesBuilder, plan: &CapturePlan, servers: Option<(&[String], &[String])>) {
    use chain::*;
    let all = servers.is_none();
    let (v4, v6_configured) = servers.unwrap_or((&[], &[]));
    // IPv6 servers get rules only with IPv6 on; they still add the jump below (Istio's output).
    let v6 = if b.ipv6 { v6_configured } else { &[] };
    let servers = [(Family::V4, v4), (Family::V6, v6)];
    let dns_dport = |proto| dport(proto, DNS_PORT, false);
    let udp_sport = |port: &str| sport(Proto::Udp, port);
    let zone = NftExpr::CtZoneSet;
    b.add(RAW, OUTPUT, vec![Counter, jump(OUTPUT_DNS)]);
    if all || !v4.is_empty() || !v6_configured.is_empty() {
        b.add(NAT, ISTIO_OUTPUT, vec![Counter, jump(OUTPUT_DNS)]);
    }
    if all {
        b.add(
            NAT,
            OUTPUT_DNS,
            vec![
                tcp(),
                dns_dport(Proto::Tcp),
                Counter,
                redirect(DNS_PROXY_PORT),
            ],
        );
        b.add(
            NAT,
            OUTPUT_DNS,
            vec![dns_dport(Proto::Udp), Counter, redirect(DNS_PROXY_PORT)],
        );
    } else {
        for proto in [Proto::Tcp, Proto::Udp] {
            for (family, list) in servers {
                for s in list {
                    b.add(
                        NAT,
                        OUTPUT_DNS,
                        vec![
                            daddr(family, &host_prefix(family, s), false),
                            dns_dport(proto),
                            Counter,
                            redirect(DNS_PROXY_PORT),
                        ],
                    );
                }
            }
        }
    }
    for o in &plan.owners {
        let (key, id) = (o.kind, o.id);
        let meta_owner = || NftExpr::Owner {
            key,
            id: id.into(),
            negate: false,
            with_meta: true,
        };
        b.add(
            RAW,
            OUTPUT_DNS,
            vec![
                dns_dport(Proto::Udp),
                meta_owner(),
                Counter,
                zone(CT_ZONE_UPSTREAM_DNS),
            ],
        );
        b.add(
            RAW,
            OUTPUT_DNS,
            vec![
                udp_sport(DNS_PROXY_PORT),
                meta_owner(),
                Counter,
                zone(CT_ZONE_APP_DNS),
            ],
        );
    }
    if all {
        b.add(RAW, PREROUTING, vec![Counter, jump(INBOUND)]);
        b.add(
            RAW,
            OUTPUT_DNS,
            vec![dns_dport(Proto::Udp), Counter, zone(CT_ZONE_APP_DNS)],
        );
        b.add(
            RAW,
            INBOUND,
            vec![udp_sport(DNS_PORT), Counter, zone(CT_ZONE_UPSTREAM_DNS)],
        );
        return;
    }
    if !v4.is_empty() || !v6.is_empty() {
        b.add(RAW, PREROUTING, vec![Counter, jump(INBOUND)]);
    }
    for (family, list) in servers {
        for s in list {
            let h = host_prefix(family, s);
            b.add(
                RAW,
                OUTPUT_DNS,
                vec![
                    dns_dport(Proto::Udp),
                    daddr(family, &h, false),
                    Counter,
                    zone(CT_ZONE_APP_DNS),
                ],
            );
            b.add(
                RAW,
                INBOUND,
                vec![
                    udp_sport(DNS_PORT),
                    saddr(family, &h),
                    Counter,
                    zone(CT_ZONE_UPSTREAM_DNS),
                ],
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_wildcards_from_flags_are_nft_wildcards() {
        let cfg = CaptureConfig {
            exclude_interfaces: vec!["eth+".into()],
            reroute_virtual_interfaces: vec!["tun+".into()],
            ..Default::default()
        };
        let bodies: Vec<String> = build(&cfg).rules.iter().map(|r| r.body()).collect();
        let all = bodies.join("\n");
        assert!(all.contains("iifname eth* counter return"), "{all}");
        assert!(all.contains("iifname tun* "), "{all}");
        assert!(!all.contains('+'), "{all}");
    }
}
