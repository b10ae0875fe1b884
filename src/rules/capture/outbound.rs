//! Outbound capture of the sidecar rule set (nat `ISTIO_OUTPUT`): what returns early (excluded
//! ports, inbound passthrough, the proxy's own traffic, owner groups, loopback and excluded
//! destinations), DNS at its place in that order, and what is sent to the proxy.

use super::super::capture_plan::CapturePlan;
use super::super::model::OwnerKind;
use super::super::model::parts::{TCP, UDP, dport, dst, in_iface, jump, out_iface, src};
use super::super::model::well_known::{DNS_PORT, LOOPBACK_IFACE as LO};
use super::super::model::{Family, Match, RuleSetBuilder, Table, Target};
use super::chain::*;
use super::{CaptureConfig, INBOUND_PASSTHROUGH_V4, INBOUND_PASSTHROUGH_V6, LOOPBACK_V6};
use super::{OwnerGroups, dns, owner};

/// The outbound chain, in Istio's order.
pub(super) fn build(b: &mut RuleSetBuilder, cfg: &CaptureConfig, plan: &CapturePlan) {
    use Table::Nat;
    let lo4 = cfg.loopback_v4.as_str();
    b.append(Nat, "OUTPUT", vec![], jump(OUTPUT));
    for port in &cfg.outbound_ports_exclude {
        for proto in [TCP, UDP] {
            b.append(Nat, OUTPUT, vec![proto, dport(port, false)], Target::Return);
        }
    }
    // Inbound passthrough traffic from the sidecar itself.
    b.append_versioned(
        Nat,
        OUTPUT,
        INBOUND_PASSTHROUGH_V4,
        INBOUND_PASSTHROUGH_V6,
        |passthrough| (vec![out_iface(LO), src(passthrough)], Target::Return),
    );
    proxy_owned(b, cfg, plan);
    match &cfg.owner_groups {
        OwnerGroups::AllExcept(groups) => {
            for g in groups {
                let matches = vec![owner(OwnerKind::Gid, g, false)];
                b.append(Nat, OUTPUT, matches, Target::Return);
            }
        }
        OwnerGroups::Only(groups) => {
            let matches = groups
                .iter()
                .map(|g| owner(OwnerKind::Gid, g, true))
                .collect();
            b.append(Nat, OUTPUT, matches, Target::Return);
        }
    }
    dns::build(b, plan);
    // Loopback destinations are never captured.
    b.append_versioned(Nat, OUTPUT, lo4, LOOPBACK_V6, |lo| {
        (vec![dst(lo, false)], Target::Return)
    });
    for family in Family::ALL {
        for cidr in cfg.outbound_ranges_exclude.family(family) {
            b.append_to(family, Nat, OUTPUT, vec![dst(cidr, false)], Target::Return);
        }
    }
    for port in &cfg.outbound_ports_include {
        b.append(Nat, OUTPUT, vec![TCP, dport(port, false)], jump(REDIRECT));
    }
    captured_destinations(b, cfg);
}

/// The proxy's own traffic: its loopback connections to non-loopback addresses (the pod's own IP)
/// go to inbound capture except the ports it keeps; the rest of it returns.
fn proxy_owned(b: &mut RuleSetBuilder, cfg: &CaptureConfig, plan: &CapturePlan) {
    use Table::Nat;
    let dns = plan.dns.is_on();
    for o in &plan.owners {
        // One kept port prints as `--dport`, several as multiport `--dports` (Istio's spelling).
        let kept = match o.kept_loopback_ports.as_slice() {
            [port] => dport(port, true),
            ports => Match::DstPorts {
                ports: ports.iter().map(|p| p.to_string()).collect(),
                negate: true,
            },
        };
        b.append_versioned(Nat, OUTPUT, &cfg.loopback_v4, LOOPBACK_V6, |lo| {
            let matches = vec![
                out_iface(LO),
                dst(lo, true),
                TCP,
                kept.clone(),
                owner(o.kind, o.id, false),
            ];
            (matches, jump(IN_REDIRECT))
        });
        if !plan.loopback_included {
            let mut matches = vec![out_iface(LO)];
            if dns {
                matches.extend([TCP, dport(DNS_PORT, true)]);
            }
            matches.push(owner(o.kind, o.id, true));
            b.append(Nat, OUTPUT, matches, Target::Return);
        }
        let matches = vec![owner(o.kind, o.id, false)];
        b.append(Nat, OUTPUT, matches, Target::Return);
    }
}

/// The captured destinations (every one, or the include list), and the virtual interfaces whose
/// inbound traffic to them is sent to the proxy as outbound.
fn captured_destinations(b: &mut RuleSetBuilder, cfg: &CaptureConfig) {
    use Table::Nat;
    let include = &cfg.outbound_ranges_include;
    let virtual_ifaces = &cfg.reroute_virtual_interfaces;
    for family in Family::ALL {
        if include.wildcard {
            b.append_to(family, Nat, OUTPUT, vec![], jump(REDIRECT));
            for iface in virtual_ifaces {
                let matches = vec![in_iface(iface)];
                b.insert_to(family, Nat, "PREROUTING", 1, matches, jump(REDIRECT));
            }
            continue;
        }
        for cidr in include.family(family) {
            for iface in virtual_ifaces {
                let matches = vec![in_iface(iface), dst(cidr, false)];
                b.insert_to(family, Nat, "PREROUTING", 1, matches, jump(REDIRECT));
            }
            b.append_to(family, Nat, OUTPUT, vec![dst(cidr, false)], jump(REDIRECT));
        }
    }
}
