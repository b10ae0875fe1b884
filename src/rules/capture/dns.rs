//! DNS capture of the sidecar rule set: the planned DNS traffic goes to the agent's DNS proxy, and
//! the proxy's own DNS and the replies get their conntrack zones (raw table), per family as
//! iptables needs them.

use super::super::capture_plan::{CapturePlan, DnsPlan, host_prefix};
use super::super::model::parts::{TCP, UDP, dport, dst, jump, redirect, sport, src};
use super::super::model::well_known::{CT_ZONE_APP_DNS, CT_ZONE_UPSTREAM_DNS, DNS_PORT};
use super::super::model::{Family, RuleSetBuilder, Table, Target};
use super::chain::*;
use super::{DNS_PROXY_PORT, owner};

/// The DNS rules, when the plan captures DNS.
pub(super) fn build(b: &mut RuleSetBuilder, plan: &CapturePlan) {
    use Table::{Nat, Raw};
    let all = match plan.dns {
        DnsPlan::Off => return,
        DnsPlan::All => true,
        DnsPlan::Servers { .. } => false,
    };
    let servers = |family: Family| -> &[String] {
        match (plan.dns, family) {
            (DnsPlan::Servers { v4, .. }, Family::V4) => v4,
            (DnsPlan::Servers { v6, .. }, Family::V6) => v6,
            _ => &[],
        }
    };
    let dns_port = || dport(DNS_PORT, false);

    b.append(Raw, "OUTPUT", vec![], jump(OUTPUT_DNS));
    for family in Family::ALL {
        if all || !servers(family).is_empty() {
            b.append_to(family, Nat, OUTPUT, vec![], jump(OUTPUT_DNS));
        }
    }
    // TCP is redirected with `--to-ports`, UDP with `--to-port` (Istio's spelling).
    for (proto, plural) in [(TCP, true), (UDP, false)] {
        let to_proxy = || redirect(DNS_PROXY_PORT, plural);
        if all {
            b.append(Nat, OUTPUT_DNS, vec![proto.clone(), dns_port()], to_proxy());
            continue;
        }
        for family in Family::ALL {
            for server in servers(family) {
                let server = host_prefix(family, server);
                let matches = vec![proto.clone(), dns_port(), dst(&server, false)];
                b.append_to(family, Nat, OUTPUT_DNS, matches, to_proxy());
            }
        }
    }
    for o in &plan.owners {
        let upstream = vec![UDP, dns_port(), owner(o.kind, o.id, false)];
        b.append(
            Raw,
            OUTPUT_DNS,
            upstream,
            Target::CtZone(CT_ZONE_UPSTREAM_DNS),
        );
        let app = vec![UDP, sport(DNS_PROXY_PORT), owner(o.kind, o.id, false)];
        b.append(Raw, OUTPUT_DNS, app, Target::CtZone(CT_ZONE_APP_DNS));
    }
    if all {
        b.append(Raw, "PREROUTING", vec![], jump(INBOUND));
        let app = vec![UDP, dns_port()];
        b.append(Raw, OUTPUT_DNS, app, Target::CtZone(CT_ZONE_APP_DNS));
        let reply = vec![UDP, sport(DNS_PORT)];
        b.append(Raw, INBOUND, reply, Target::CtZone(CT_ZONE_UPSTREAM_DNS));
        return;
    }
    for family in Family::ALL {
        if servers(family).is_empty() {
            continue;
        }
        b.append_to(family, Raw, "PREROUTING", vec![], jump(INBOUND));
        for server in servers(family) {
            let server = host_prefix(family, server);
            let app = vec![UDP, dns_port(), dst(&server, false)];
            b.append_to(
                family,
                Raw,
                OUTPUT_DNS,
                app,
                Target::CtZone(CT_ZONE_APP_DNS),
            );
            let reply = vec![UDP, sport(DNS_PORT), src(&server)];
            b.append_to(
                family,
                Raw,
                INBOUND,
                reply,
                Target::CtZone(CT_ZONE_UPSTREAM_DNS),
            );
        }
    }
}
