//! Ambient mode for the nftables backend: the in-pod redirect to ztunnel and the host's probe
//! SNAT as typed nftables rules, in the order and spelling of Istio's ambient nftables goldens.
//! The settings, ports and marks are [`super::ambient`]'s.

use super::ambient::{
    AmbientConfig, CONN_MARK, DNS_PORT as ZTUNNEL_DNS_PORT, InpodStep, PROBE_SET_V4, PROBE_SET_V6,
    PodOverrides, ZTUNNEL_HBONE_PORT, ZTUNNEL_INBOUND_PLAINTEXT_PORT, ZTUNNEL_MARK,
    ZTUNNEL_OUTBOUND_PORT, inpod_plan,
};
use super::capture::{DEFAULT_LOOPBACK_V4 as LO_V4, LOOPBACK_V6 as LO_V6};
use super::model::well_known::{CT_ZONE_UPSTREAM_DNS, DNS_PORT, LOOPBACK_IFACE as LO};
use super::model::{Family, Proto};
use super::nft_model::expr::{daddr, dport, iif, jump, oif, redirect, saddr, sport, tcp};
use super::nft_model::{
    AddrValue, MarkKey, MarkSource, MaskSpelling, MaskedMark, NftExpr, NftRuleSet, NftRulesBuilder,
    OwnerKind, Side,
};
use super::nftables::{NftTable, ambient_chain as chain};

use NftExpr::{Accept, Counter, Return};

fn masked(key: MarkKey, mark: MaskedMark, negate: bool, spelling: MaskSpelling) -> NftExpr {
    NftExpr::MarkMasked {
        key,
        mark,
        negate,
        spelling,
    }
}

/// `mark and 0xfff != 0x539`: not sent by ztunnel.
fn not_from_ztunnel() -> NftExpr {
    masked(MarkKey::MetaShort, ZTUNNEL_MARK, true, MaskSpelling::And)
}

/// The in-pod nftables rules: [`inpod_plan`]'s steps in nftables spelling.
pub fn inpod_nft_rules(cfg: &AmbientConfig, pod: &PodOverrides) -> NftRuleSet {
    use NftTable::{AmbientMangle as MANGLE, AmbientNat as NAT, AmbientRaw as RAW};
    use chain::*;
    let probe = (cfg.probe_snat_v4.as_str(), cfg.probe_snat_v6.as_str());
    let loopback = (LO_V4, LO_V6);
    let mut r = NftRulesBuilder::new(cfg.enable_ipv6);
    let (pre, out) = (ISTIO_PREROUTING, ISTIO_OUTPUT);
    for step in inpod_plan(cfg, pod) {
        match step {
            InpodStep::EnterChains { raw } => {
                r.add(MANGLE, PREROUTING, vec![jump(pre)]);
                r.add(MANGLE, OUTPUT, vec![jump(out)]);
                r.add(NAT, OUTPUT, vec![jump(out)]);
                if raw {
                    r.add(RAW, PREROUTING, vec![jump(pre)]);
                    r.add(RAW, OUTPUT, vec![jump(out)]);
                }
                r.add(NAT, PREROUTING, vec![jump(pre)]);
            }
            InpodStep::VirtualInterface(vif) => {
                r.add(
                    NAT,
                    pre,
                    vec![iif(vif), tcp(), Counter, redirect(ZTUNNEL_OUTBOUND_PORT)],
                );
                r.add(NAT, pre, vec![iif(vif), tcp(), Counter, Return]);
            }
            InpodStep::MarkZtunnelConnections => r.add(
                MANGLE,
                pre,
                vec![
                    masked(MarkKey::Meta, ZTUNNEL_MARK, false, MaskSpelling::Ampersand),
                    Counter,
                    NftExpr::CtMarkSet(MarkSource::Masked(CONN_MARK)),
                ],
            ),
            InpodStep::AcceptProbesInbound => r.add_both(NAT, pre, probe, |family, p| {
                vec![tcp(), saddr(family, p), Counter, Accept]
            }),
            InpodStep::AcceptProbesOutbound => r.add_both(NAT, out, probe, |family, p| {
                vec![tcp(), daddr(family, p, false), Counter, Accept]
            }),
            InpodStep::RedirectInbound => r.add_both(NAT, pre, loopback, |family, lo| {
                // Istio prints the IPv4 rule with two spaces before `!=`; kept for identical output.
                let spelling = match family {
                    Family::V4 => MaskSpelling::AndWide,
                    Family::V6 => MaskSpelling::And,
                };
                vec![
                    daddr(family, lo, true),
                    dport(Proto::Tcp, ZTUNNEL_HBONE_PORT, true),
                    masked(MarkKey::MetaShort, ZTUNNEL_MARK, true, spelling),
                    Counter,
                    redirect(ZTUNNEL_INBOUND_PLAINTEXT_PORT),
                ]
            }),
            InpodStep::RestoreConnMark => r.add(
                MANGLE,
                out,
                vec![
                    masked(MarkKey::Ct, CONN_MARK, false, MaskSpelling::And),
                    Counter,
                    NftExpr::MetaMarkSet(MarkSource::Other),
                ],
            ),
            InpodStep::CaptureDns => capture_dns(&mut r),
            InpodStep::AcceptZtunnelConnections => r.add(
                NAT,
                out,
                vec![
                    tcp(),
                    masked(MarkKey::MetaShort, CONN_MARK, false, MaskSpelling::And),
                    Counter,
                    Accept,
                ],
            ),
            InpodStep::AcceptLoopback => r.add_both(NAT, out, loopback, |family, lo| {
                vec![oif(LO, false), daddr(family, lo, true), Counter, Accept]
            }),
            InpodStep::RedirectOutbound => r.add_both(NAT, out, loopback, |family, lo| {
                vec![
                    tcp(),
                    daddr(family, lo, true),
                    not_from_ztunnel(),
                    Counter,
                    redirect(ZTUNNEL_OUTBOUND_PORT),
                ]
            }),
        }
    }
    r.finish()
}

fn capture_dns(r: &mut NftRulesBuilder) {
    use NftTable::{AmbientNat as NAT, AmbientRaw as RAW};
    use chain::{ISTIO_OUTPUT as out, ISTIO_PREROUTING as pre};
    r.add(
        NAT,
        out,
        vec![
            oif(LO, true),
            not_from_ztunnel(),
            dport(Proto::Udp, DNS_PORT, false),
            Counter,
            redirect(ZTUNNEL_DNS_PORT),
        ],
    );
    r.add_both(NAT, out, (LO_V4, LO_V6), |family, lo| {
        vec![
            daddr(family, lo, true),
            dport(Proto::Tcp, DNS_PORT, false),
            not_from_ztunnel(),
            Counter,
            redirect(ZTUNNEL_DNS_PORT),
        ]
    });
    r.add(
        RAW,
        out,
        vec![
            dport(Proto::Udp, DNS_PORT, false),
            masked(MarkKey::Meta, ZTUNNEL_MARK, false, MaskSpelling::And),
            Counter,
            NftExpr::CtZoneSet(CT_ZONE_UPSTREAM_DNS),
        ],
    );
    r.add(
        RAW,
        pre,
        vec![
            sport(Proto::Udp, DNS_PORT),
            masked(MarkKey::Meta, ZTUNNEL_MARK, true, MaskSpelling::And),
            Counter,
            NftExpr::CtZoneSet(CT_ZONE_UPSTREAM_DNS),
        ],
    );
}

/// The host-side nftables rules; `kubelet_uid` is the UID kubelet's probes come from.
pub fn host_nft_rules(cfg: &AmbientConfig, kubelet_uid: &str) -> NftRuleSet {
    let mut r = NftRulesBuilder::new(cfg.enable_ipv6);
    let sets = (PROBE_SET_V4, PROBE_SET_V6);
    r.add_both(
        NftTable::AmbientHostNat,
        chain::POSTROUTING,
        sets,
        |family, set| {
            let snat = match family {
                Family::V4 => &cfg.probe_snat_v4,
                Family::V6 => &cfg.probe_snat_v6,
            };
            vec![
                tcp(),
                NftExpr::Owner {
                    key: OwnerKind::Uid,
                    id: kubelet_uid.into(),
                    negate: false,
                    with_meta: false,
                },
                NftExpr::Addr {
                    family,
                    side: Side::Dst,
                    value: AddrValue::Set(set.into()),
                    negate: false,
                },
                Counter,
                NftExpr::SnatTo(snat.clone()),
            ]
        },
    );
    r.finish()
}
