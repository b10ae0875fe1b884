//! Inbound capture of the sidecar rule set: the planned inbound ports go to the proxy's inbound
//! port (REDIRECT in nat, or TPROXY in mangle), and in TPROXY mode the marks that keep the proxy's
//! own loopback traffic and passthrough connections out of that capture.

use super::super::capture_plan::{CapturePlan, InboundPlan};
use super::super::model::parts::{TCP, dport, dst, in_iface, jump, mark, out_iface, src};
use super::super::model::well_known::LOOPBACK_IFACE as LO;
use super::super::model::{CtState, Family, Match, RuleSetBuilder, Table, Target};
use super::chain::*;
use super::{CaptureConfig, INBOUND_PASSTHROUGH_V4, INBOUND_PASSTHROUGH_V6, LOOPBACK_V6};
use super::{OUTBOUND_MARK, owner};

/// The inbound chains: which ports are captured, and how.
pub(super) fn build(b: &mut RuleSetBuilder, cfg: &CaptureConfig, plan: &CapturePlan) {
    use Table::{Mangle, Nat};
    if plan.inbound == InboundPlan::Off {
        return;
    }
    let tproxy = plan.tproxy;
    let table = if tproxy { Mangle } else { Nat };
    if tproxy {
        b.append(
            Mangle,
            DIVERT,
            vec![],
            Target::SetMark(cfg.tproxy_mark.clone()),
        );
        b.append(Mangle, DIVERT, vec![], Target::Accept);
        let tproxy_target = Target::Tproxy {
            mark: format!("{}/0xffffffff", cfg.tproxy_mark),
            port: cfg.inbound_capture_port.clone(),
        };
        b.append_versioned(Mangle, TPROXY, &cfg.loopback_v4, LOOPBACK_V6, |lo| {
            (vec![dst(lo, true), TCP], tproxy_target.clone())
        });
    }
    b.append(table, "PREROUTING", vec![TCP], jump(INBOUND));
    let established = || Match::CtState(vec![CtState::Related, CtState::Established]);
    match plan.inbound {
        InboundPlan::AllExcept(excluded) => {
            for port in excluded {
                b.append(
                    table,
                    INBOUND,
                    vec![TCP, dport(port, false)],
                    Target::Return,
                );
            }
            if tproxy {
                b.append(Mangle, INBOUND, vec![TCP, established()], jump(DIVERT));
                b.append(Mangle, INBOUND, vec![TCP], jump(TPROXY));
            } else {
                b.append(Nat, INBOUND, vec![TCP], jump(IN_REDIRECT));
            }
        }
        InboundPlan::Only(ports) => {
            for port in ports {
                let to_port = || vec![TCP, dport(port, false)];
                if tproxy {
                    let mut matches = to_port();
                    matches.push(established());
                    b.append(Mangle, INBOUND, matches, jump(DIVERT));
                    b.append(Mangle, INBOUND, to_port(), jump(TPROXY));
                } else {
                    b.append(Nat, INBOUND, to_port(), jump(IN_REDIRECT));
                }
            }
        }
        InboundPlan::Off => {}
    }
}

/// TPROXY: connection marks, and the loop prevention for the proxy's own loopback traffic
/// (after the outbound rules, as Istio orders them).
pub(super) fn tproxy_marks(b: &mut RuleSetBuilder, cfg: &CaptureConfig, plan: &CapturePlan) {
    use Table::Mangle;
    let tproxy_mark = cfg.tproxy_mark.as_str();
    b.append(
        Mangle,
        "PREROUTING",
        vec![TCP, mark(tproxy_mark, false)],
        Target::ConnmarkSave,
    );
    b.append(
        Mangle,
        "OUTPUT",
        vec![TCP, out_iface(LO), mark(tproxy_mark, false)],
        Target::Return,
    );
    for o in &plan.owners {
        b.append_versioned(Mangle, "OUTPUT", &cfg.loopback_v4, LOOPBACK_V6, |lo| {
            (
                vec![
                    dst(lo, true),
                    TCP,
                    out_iface(LO),
                    owner(o.kind, o.id, false),
                ],
                Target::SetMark(OUTBOUND_MARK.into()),
            )
        });
    }
    b.append(
        Mangle,
        "OUTPUT",
        vec![
            TCP,
            Match::ConnMark {
                value: tproxy_mark.into(),
            },
        ],
        Target::ConnmarkRestore { masks: false },
    );
    b.insert(
        Mangle,
        INBOUND,
        1,
        vec![TCP, mark(tproxy_mark, false)],
        Target::Return,
    );
    for (family, passthrough) in [
        (Family::V4, INBOUND_PASSTHROUGH_V4),
        (Family::V6, INBOUND_PASSTHROUGH_V6),
    ] {
        b.insert_to(
            family,
            Mangle,
            INBOUND,
            2,
            vec![TCP, src(passthrough), in_iface(LO)],
            Target::Return,
        );
    }
    b.insert(
        Mangle,
        INBOUND,
        3,
        vec![TCP, in_iface(LO), mark(OUTBOUND_MARK, true)],
        Target::Return,
    );
}
