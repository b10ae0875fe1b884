//! Sidecar traffic capture for the nftables backend: the same [`CaptureConfig`] and the same
//! decisions as [`super::capture`], built into one `inet` rule list (IPv6 twins right after their
//! IPv4 rules) in the order and spelling of Istio's nftables capture.

use super::capture::{
    CaptureConfig, DNS_PROXY_PORT, INBOUND_PASSTHROUGH_V4, INBOUND_PASSTHROUGH_V6, InboundPorts,
    LOOPBACK_V6, OUTBOUND_MARK, OwnerGroups,
};
use super::nftables::{NftRule, NftRuleSet, NftTable};

const NAT: NftTable = NftTable::SidecarNat;
const MANGLE: NftTable = NftTable::SidecarMangle;
const RAW: NftTable = NftTable::SidecarRaw;

struct Builder {
    ipv6: bool,
    rules: Vec<NftRule>,
}

impl Builder {
    fn add(&mut self, table: NftTable, chain: &str, expr: impl Into<String>) {
        self.rules.push(NftRule {
            table,
            chain: chain.to_string(),
            index: None,
            expr: expr.into(),
        });
    }

    /// Adds only when IPv6 is enabled.
    fn add6(&mut self, table: NftTable, chain: &str, expr: impl Into<String>) {
        if self.ipv6 {
            self.add(table, chain, expr);
        }
    }

    fn insert(&mut self, table: NftTable, chain: &str, index: usize, expr: impl Into<String>) {
        self.rules.push(NftRule {
            table,
            chain: chain.to_string(),
            index: Some(index),
            expr: expr.into(),
        });
    }
}

#[derive(Clone, Copy)]
enum Owner {
    Uid,
    Gid,
}

impl Owner {
    fn key(self) -> &'static str {
        match self {
            Owner::Uid => "skuid",
            Owner::Gid => "skgid",
        }
    }
}

/// Builds the nftables sidecar capture rules.
pub fn build(cfg: &CaptureConfig) -> NftRuleSet {
    let mut b = Builder {
        ipv6: cfg.enable_ipv6,
        rules: Vec::new(),
    };
    let tproxy = cfg.is_tproxy();
    let dns = cfg.effective_redirect_dns();
    let lo4 = cfg.loopback_v4.as_str();
    let tunnel = cfg.inbound_tunnel_port.as_str();
    let mark = cfg.tproxy_mark.as_str();

    for iface in &cfg.exclude_interfaces {
        b.add(NAT, "prerouting", format!("iifname {iface} counter return"));
        b.add(NAT, "output", format!("oifname {iface} counter return"));
    }
    if tproxy {
        for iface in &cfg.exclude_interfaces {
            b.add(
                MANGLE,
                "prerouting",
                format!("iifname {iface} counter return"),
            );
            b.add(MANGLE, "output", format!("oifname {iface} counter return"));
        }
    }
    for iface in &cfg.reroute_virtual_interfaces {
        b.insert(
            NAT,
            "prerouting",
            0,
            format!("iifname {iface} counter return"),
        );
    }
    if cfg.drop_invalid {
        b.add(
            MANGLE,
            "prerouting",
            "meta l4proto tcp ct state invalid counter jump istio-drop",
        );
        b.add(MANGLE, "istio-drop", "counter drop");
    }
    b.add(
        NAT,
        "istio-inbound",
        format!("meta l4proto tcp tcp dport {tunnel} counter return"),
    );
    b.add(
        NAT,
        "istio-redirect",
        format!("meta l4proto tcp counter redirect to :{}", cfg.proxy_port),
    );
    b.add(
        NAT,
        "istio-in-redirect",
        format!(
            "meta l4proto tcp counter redirect to :{}",
            cfg.inbound_capture_port
        ),
    );

    if cfg.inbound_ports != InboundPorts::None {
        let inbound_table = if tproxy { MANGLE } else { NAT };
        let capture = &cfg.inbound_capture_port;
        if tproxy {
            b.add(
                MANGLE,
                "istio-divert",
                format!("counter meta mark set {mark}"),
            );
            b.add(MANGLE, "istio-divert", "counter accept");
            b.add(
                MANGLE,
                "istio-tproxy",
                format!("meta l4proto tcp ip daddr != {lo4} tproxy ip to :{capture} meta mark set {mark} counter accept"),
            );
            b.add6(
                MANGLE,
                "istio-tproxy",
                format!(
                    "meta l4proto tcp ip6 daddr != {LOOPBACK_V6} tproxy ip6 to :{capture} meta mark set {mark} counter accept"
                ),
            );
        }
        b.add(
            inbound_table,
            "prerouting",
            "meta l4proto tcp counter jump istio-inbound",
        );
        match &cfg.inbound_ports {
            InboundPorts::All => {
                for port in &cfg.inbound_ports_exclude {
                    b.add(
                        inbound_table,
                        "istio-inbound",
                        format!("meta l4proto tcp tcp dport {port} counter return"),
                    );
                }
                if tproxy {
                    b.add(
                        MANGLE,
                        "istio-inbound",
                        "meta l4proto tcp ct state related,established counter jump istio-divert",
                    );
                    b.add(
                        MANGLE,
                        "istio-inbound",
                        "meta l4proto tcp counter jump istio-tproxy",
                    );
                } else {
                    b.add(
                        NAT,
                        "istio-inbound",
                        "meta l4proto tcp counter jump istio-in-redirect",
                    );
                }
            }
            InboundPorts::List(ports) => {
                for port in ports {
                    if tproxy {
                        b.add(
                            MANGLE,
                            "istio-inbound",
                            format!("meta l4proto tcp ct state related,established tcp dport {port} counter jump istio-divert"),
                        );
                        b.add(
                            MANGLE,
                            "istio-inbound",
                            format!("meta l4proto tcp tcp dport {port} counter jump istio-tproxy"),
                        );
                    } else {
                        b.add(
                            NAT,
                            "istio-inbound",
                            format!(
                                "meta l4proto tcp tcp dport {port} counter jump istio-in-redirect"
                            ),
                        );
                    }
                }
            }
            InboundPorts::None => {}
        }
    }

    b.add(NAT, "output", "counter jump istio-output");
    for port in &cfg.outbound_ports_exclude {
        b.add(
            NAT,
            "istio-output",
            format!("tcp dport {port} counter return"),
        );
        b.add(
            NAT,
            "istio-output",
            format!("udp dport {port} counter return"),
        );
    }
    b.add(
        NAT,
        "istio-output",
        format!("oifname lo ip saddr {INBOUND_PASSTHROUGH_V4} counter return"),
    );
    b.add6(
        NAT,
        "istio-output",
        format!("oifname lo ip6 saddr {INBOUND_PASSTHROUGH_V6} counter return"),
    );

    let include = &cfg.outbound_ranges_include;
    let loopback_included = include.has_loopback_v4 || include.has_loopback_v6;
    for (owner, ids) in [(Owner::Uid, &cfg.proxy_uids), (Owner::Gid, &cfg.proxy_gids)] {
        let key = owner.key();
        for id in ids {
            let ports = if dns && matches!(owner, Owner::Uid) {
                format!("{{ 53, {tunnel} }}")
            } else {
                tunnel.to_string()
            };
            b.add(
                NAT,
                "istio-output",
                format!("oifname lo meta l4proto tcp ip daddr != {lo4} tcp dport != {ports} {key} {id} counter jump istio-in-redirect"),
            );
            b.add6(
                NAT,
                "istio-output",
                format!(
                    "oifname lo meta l4proto tcp ip6 daddr != {LOOPBACK_V6} tcp dport != {ports} {key} {id} counter jump istio-in-redirect"
                ),
            );
            if !loopback_included {
                if dns {
                    b.add(NAT, "istio-output", format!("oifname lo meta l4proto tcp tcp dport != 53 {key} != {id} counter return"));
                } else {
                    b.add(
                        NAT,
                        "istio-output",
                        format!("oifname lo {key} != {id} counter return"),
                    );
                }
            }
            b.add(NAT, "istio-output", format!("{key} {id} counter return"));
        }
    }
    match &cfg.owner_groups {
        OwnerGroups::AllExcept(groups) => {
            for g in groups {
                b.add(NAT, "istio-output", format!("skgid {g} counter return"));
            }
        }
        OwnerGroups::Only(groups) => {
            let mut expr: String = groups.iter().map(|g| format!("skgid != {g} ")).collect();
            expr.push_str("counter return");
            b.add(NAT, "istio-output", expr);
        }
    }
    if dns {
        build_dns(&mut b, cfg);
    }
    b.add(
        NAT,
        "istio-output",
        format!("ip daddr {lo4} counter return"),
    );
    b.add6(
        NAT,
        "istio-output",
        format!("ip6 daddr {LOOPBACK_V6} counter return"),
    );
    for cidr in &cfg.outbound_ranges_exclude.v4 {
        b.add(
            NAT,
            "istio-output",
            format!("ip daddr {cidr} counter return"),
        );
    }
    for cidr in &cfg.outbound_ranges_exclude.v6 {
        b.add6(
            NAT,
            "istio-output",
            format!("ip6 daddr {cidr} counter return"),
        );
    }
    for port in &cfg.outbound_ports_include {
        b.add(
            NAT,
            "istio-output",
            format!("tcp dport {port} counter jump istio-redirect"),
        );
    }
    if include.wildcard {
        b.add(NAT, "istio-output", "counter jump istio-redirect");
        for iface in &cfg.reroute_virtual_interfaces {
            b.insert(
                NAT,
                "prerouting",
                0,
                format!("iifname {iface} counter jump istio-redirect"),
            );
        }
    } else {
        for (family, cidrs) in [("ip", &include.v4), ("ip6", &include.v6)] {
            if family == "ip6" && !b.ipv6 {
                continue;
            }
            for cidr in cidrs {
                for iface in &cfg.reroute_virtual_interfaces {
                    b.insert(
                        NAT,
                        "prerouting",
                        0,
                        format!(
                            "iifname {iface} {family} daddr {cidr} counter jump istio-redirect"
                        ),
                    );
                }
                b.add(
                    NAT,
                    "istio-output",
                    format!("{family} daddr {cidr} counter jump istio-redirect"),
                );
            }
        }
    }
    if tproxy {
        b.add(
            MANGLE,
            "prerouting",
            format!("meta l4proto tcp mark {mark} counter ct mark set mark"),
        );
        b.add(
            MANGLE,
            "output",
            format!("oifname lo meta l4proto tcp mark {mark} counter return"),
        );
        for (owner, ids) in [(Owner::Uid, &cfg.proxy_uids), (Owner::Gid, &cfg.proxy_gids)] {
            let key = owner.key();
            for id in ids {
                b.add(
                    MANGLE,
                    "output",
                    format!("oifname lo meta l4proto tcp ip daddr != {lo4} {key} {id} counter meta mark set {OUTBOUND_MARK}"),
                );
                b.add6(
                    MANGLE,
                    "output",
                    format!(
                        "oifname lo meta l4proto tcp ip6 daddr != {LOOPBACK_V6} {key} {id} counter meta mark set {OUTBOUND_MARK}"
                    ),
                );
            }
        }
        b.add(
            MANGLE,
            "output",
            format!("meta l4proto tcp ct mark {mark} counter meta mark set ct mark"),
        );
        b.insert(
            MANGLE,
            "istio-inbound",
            0,
            format!("meta l4proto tcp mark {mark} counter return"),
        );
        b.insert(
            MANGLE,
            "istio-inbound",
            1,
            format!("iifname lo meta l4proto tcp ip saddr {INBOUND_PASSTHROUGH_V4} counter return"),
        );
        if b.ipv6 {
            b.insert(
                MANGLE,
                "istio-inbound",
                1,
                format!(
                    "iifname lo meta l4proto tcp ip6 saddr {INBOUND_PASSTHROUGH_V6} counter return"
                ),
            );
        }
        b.insert(
            MANGLE,
            "istio-inbound",
            2,
            format!("iifname lo meta l4proto tcp mark != {OUTBOUND_MARK} counter return"),
        );
    }
    NftRuleSet { rules: b.rules }
}

fn build_dns(b: &mut Builder, cfg: &CaptureConfig) {
    let all = cfg.capture_all_dns;
    let v4 = &cfg.dns_servers_v4;
    let v6: &[String] = if cfg.enable_ipv6 {
        &cfg.dns_servers_v6
    } else {
        &[]
    };
    b.add(RAW, "output", "counter jump istio-output-dns");
    if all || !v4.is_empty() || !cfg.dns_servers_v6.is_empty() {
        b.add(NAT, "istio-output", "counter jump istio-output-dns");
    }
    if all {
        b.add(
            NAT,
            "istio-output-dns",
            format!("meta l4proto tcp tcp dport 53 counter redirect to :{DNS_PROXY_PORT}"),
        );
        b.add(
            NAT,
            "istio-output-dns",
            format!("udp dport 53 counter redirect to :{DNS_PROXY_PORT}"),
        );
    } else {
        for proto in ["tcp", "udp"] {
            for s in v4 {
                b.add(
                    NAT,
                    "istio-output-dns",
                    format!(
                        "ip daddr {s}/32 {proto} dport 53 counter redirect to :{DNS_PROXY_PORT}"
                    ),
                );
            }
            for s in v6 {
                b.add(
                    NAT,
                    "istio-output-dns",
                    format!(
                        "ip6 daddr {s}/128 {proto} dport 53 counter redirect to :{DNS_PROXY_PORT}"
                    ),
                );
            }
        }
    }
    for (owner, ids) in [(Owner::Uid, &cfg.proxy_uids), (Owner::Gid, &cfg.proxy_gids)] {
        let key = owner.key();
        for id in ids {
            b.add(
                RAW,
                "istio-output-dns",
                format!("udp dport 53 meta {key} {id} counter ct zone set 1"),
            );
            b.add(
                RAW,
                "istio-output-dns",
                format!("udp sport {DNS_PROXY_PORT} meta {key} {id} counter ct zone set 2"),
            );
        }
    }
    if all {
        b.add(RAW, "prerouting", "counter jump istio-inbound");
        b.add(
            RAW,
            "istio-output-dns",
            "udp dport 53 counter ct zone set 2",
        );
        b.add(RAW, "istio-inbound", "udp sport 53 counter ct zone set 1");
        return;
    }
    if !v4.is_empty() || !v6.is_empty() {
        b.add(RAW, "prerouting", "counter jump istio-inbound");
    }
    for s in v4 {
        b.add(
            RAW,
            "istio-output-dns",
            format!("udp dport 53 ip daddr {s}/32 counter ct zone set 2"),
        );
        b.add(
            RAW,
            "istio-inbound",
            format!("udp sport 53 ip saddr {s}/32 counter ct zone set 1"),
        );
    }
    for s in v6 {
        b.add(
            RAW,
            "istio-output-dns",
            format!("udp dport 53 ip6 daddr {s}/128 counter ct zone set 2"),
        );
        b.add(
            RAW,
            "istio-inbound",
            format!("udp sport 53 ip6 saddr {s}/128 counter ct zone set 1"),
        );
    }
}
