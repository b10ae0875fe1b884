//! The host's probe address sets (`istio-inpod-probes-v4/-v6`): one entry per enrolled pod IP,
//! commented with the pod UID, matched by the probe SNAT rule. An ipset (`hash:ip`, comments) with
//! the iptables backend; an nft set in `inet istio-ambient-nat` with nftables.
//!
//! Never flushed: every change is planned against the entries the kernel holds ([`plan_upsert`],
//! [`plan_remove`], [`plan_sync`], pure), read and written over netlink ([`change`]): ipset
//! requests over nfnetlink, one per entry (an add replaces the comment, so a reused IP moves to
//! the new UID in one message), or one nf_tables transaction of set elements (atomic; an owner
//! change is delete-then-add in it). A removal only touches entries carrying the UID asking for
//! it. No process on that path; only creating missing ipsets runs `ipset` (rare; nft sets are
//! created over netlink too). The
//! messages are described in `rules::probe_set_msgs`.

use crate::rules::nft_encode::{NamedSet, NftStep, NftTransaction, SetKind};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use netlink_packet_core::NLM_F_CREATE;

use super::exec::{Cmd, Executor, ProcessExecutor};
use super::iptables::{ApplyError, run_checked};
use crate::netlink::nf_kernel::{NFNL_SUBSYS_IPSET, NFNL_SUBSYS_NFTABLES};
use crate::netlink::nfnl;
use crate::netlink::nft_batch::{BatchError, Transaction};
use crate::rules::ambient::{PROBE_SET_V4, PROBE_SET_V6};
use crate::rules::nf_kernel::NFPROTO_INET;
use crate::rules::nla::{Attr, AttrTooLong};
use crate::rules::probe_set_msgs::{self as msgs, DecodeMemberError, Member};

/// The nft table holding the sets on the host (the host rules' table).
pub const NFT_TABLE: &str = "istio-ambient-nat";
const SET_COMMENT: &str = "UUID of the pods that are part of ambient mesh";

/// Current entries: IP -> UID (comment; empty when there is none).
pub type Entries = BTreeMap<IpAddr, String>;

/// One change to a set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetOp {
    Add { ip: IpAddr, uid: String },
    Del { ip: IpAddr },
}

/// Makes `ips` the entries of `uid`: absent → add; held by another UID (a reused IP) → delete,
/// then add; already ours → nothing; and (with `ips` known) the UID's entries at other IPs are
/// deleted — a sandbox re-created after an interrupted ADD gets a new IP, and the old one must not
/// stay in the set under the pod's UID.
pub fn plan_upsert(current: &Entries, uid: &str, ips: &[IpAddr]) -> Vec<SetOp> {
    let mut ops: Vec<SetOp> = if ips.is_empty() {
        vec![]
    } else {
        current
            .iter()
            .filter(|(ip, owner)| *owner == uid && !ips.contains(ip))
            .map(|(ip, _)| SetOp::Del { ip: *ip })
            .collect()
    };
    ops.extend(plan_put(current, uid, ips));
    ops
}

/// `ips` present with owner `uid` (the other entries of `uid` untouched).
fn plan_put(current: &Entries, uid: &str, ips: &[IpAddr]) -> Vec<SetOp> {
    let mut ops = Vec::new();
    for ip in ips {
        match current.get(ip) {
            Some(owner) if owner == uid => {}
            Some(_) => ops.extend([
                SetOp::Del { ip: *ip },
                SetOp::Add {
                    ip: *ip,
                    uid: uid.into(),
                },
            ]),
            None => ops.push(SetOp::Add {
                ip: *ip,
                uid: uid.into(),
            }),
        }
    }
    ops
}

/// Removes every entry carrying `uid`: `ips` (the pod's IPs as its object says) and any other
/// entry of that UID — a pod deleted before the kubelet reported its IPs, or whose IPs changed,
/// would otherwise leave its entry behind. The second list names IPs of `ips` left because
/// another UID holds them (for a warning).
pub fn plan_remove(current: &Entries, uid: &str, ips: &[IpAddr]) -> (Vec<SetOp>, Vec<IpAddr>) {
    let ops = current
        .iter()
        .filter(|(_, owner)| *owner == uid)
        .map(|(ip, _)| SetOp::Del { ip: *ip })
        .collect();
    let foreign = ips
        .iter()
        .filter(|ip| current.get(ip).is_some_and(|owner| owner != uid))
        .copied()
        .collect();
    (ops, foreign)
}

/// Reconciles with the enrolled pods: every member IP present with its UID; with `prune`, entries
/// of no member go. Members' entries are never deleted unless they change owner.
pub fn plan_sync(current: &Entries, members: &[(String, Vec<IpAddr>)], prune: bool) -> Vec<SetOp> {
    let mut ops = Vec::new();
    let mut wanted: HashMap<IpAddr, &str> = HashMap::new();
    for (uid, ips) in members {
        for ip in ips {
            wanted.insert(*ip, uid);
        }
    }
    if prune {
        ops.extend(
            current
                .keys()
                .filter(|ip| !wanted.contains_key(ip))
                .map(|ip| SetOp::Del { ip: *ip }),
        );
    }
    let mut wanted: Vec<(IpAddr, &str)> = wanted.into_iter().collect();
    wanted.sort();
    for (ip, uid) in wanted {
        ops.extend(plan_put(current, uid, &[ip]));
    }
    ops
}

/// `current` after `ops` were applied (what the kernel holds after a successful batch).
#[cfg(test)]
fn apply_to(current: &mut Entries, ops: &[SetOp]) {
    for op in ops {
        match op {
            SetOp::Add { ip, uid } => {
                current.insert(*ip, uid.clone());
            }
            SetOp::Del { ip } => {
                current.remove(ip);
            }
        }
    }
}

fn set_name(ip: &IpAddr) -> &'static str {
    if ip.is_ipv6() {
        PROBE_SET_V6
    } else {
        PROBE_SET_V4
    }
}

/// Why the probe sets could not be read, changed or created. Every variant names the set or
/// the change.
#[derive(Debug, thiserror::Error)]
pub enum ProbeSetError {
    /// Creating the sets (the rare path; ipsets still through `ipset`).
    #[error(transparent)]
    Create(#[from] ApplyError),
    #[error("{0}")]
    Netlink(#[from] BatchError),
    #[error("cannot encode the request to {what}: {source}")]
    Encode {
        what: String,
        #[source]
        source: AttrTooLong,
    },
    #[error("cannot read the members of {set}: {source}")]
    Decode {
        set: String,
        #[source]
        source: DecodeMemberError,
    },
}

impl ProbeSetError {
    /// The set (or the nft table holding it) does not exist: creating it may help.
    pub fn set_missing(&self) -> bool {
        matches!(self, ProbeSetError::Netlink(e) if e.refused_with() == Some(libc::ENOENT))
    }
}

/// A probe set backend (in the calling thread's netns). Reading and changing members is netlink
/// only; creating the sets (rare: at startup, or after someone destroyed them) runs the tool.
pub trait ProbeSets {
    /// Creates the sets (v6 too when `ipv6`) if missing; never flushes.
    fn ensure(&self, exec: &mut dyn Executor, ipv6: bool) -> Result<(), ProbeSetError>;
    /// Entries of both sets, one dump each (a missing set has none).
    fn entries(&self) -> Result<Entries, ProbeSetError>;
    /// Applies the changes, in order.
    fn apply(&self, ops: &[SetOp]) -> Result<(), ProbeSetError>;
}

/// Reads the sets, plans one change against what they hold and applies it. `serial` is held
/// from the read to the last message (netlink only, no process): two changes planned against
/// the same read could otherwise undo each other (a removal deleting an IP another pod has
/// just taken). A missing set is created (the tool) and the change planned again.
pub fn change(
    sets: &dyn ProbeSets,
    serial: &Mutex<()>,
    ipv6: bool,
    plan: &dyn Fn(&Entries) -> Vec<SetOp>,
) -> Result<Vec<SetOp>, ProbeSetError> {
    let attempt = || {
        let _one_change = serial.lock();
        let ops = plan(&sets.entries()?);
        sets.apply(&ops).map(|()| ops)
    };
    match attempt() {
        Err(e) if e.set_missing() => {
            sets.ensure(&mut ProcessExecutor::default(), ipv6)?;
            attempt()
        }
        done => done,
    }
}

/// One change planned against what the agent believes the sets hold around it (`believed`: the
/// entries at the IPs concerned and the asking pod's own, from the pod cache) instead of a dump
/// of every entry: one netlink message per entry and no read, so an ADD costs the same with
/// 10 or 10,000 pods enrolled. When the kernel disagrees (an apply fails: an nft element to
/// delete is not there, a set is missing) the change is planned again against the kernel
/// ([`change`]); an entry the kernel lost meanwhile is the drift pass's to put back.
pub fn change_believed(
    sets: &dyn ProbeSets,
    serial: &Mutex<()>,
    ipv6: bool,
    believed: &Entries,
    plan: &dyn Fn(&Entries) -> Vec<SetOp>,
) -> Result<Vec<SetOp>, ProbeSetError> {
    let ops = plan(believed);
    if ops.is_empty() {
        return Ok(ops);
    }
    let applied = {
        let _one_change = serial.lock();
        sets.apply(&ops)
    };
    match applied {
        Ok(()) => Ok(ops),
        Err(e) => {
            tracing::debug!(error = %e, "probe-set change planned from the pod cache failed; planning it against the kernel");
            change(sets, serial, ipv6, plan)
        }
    }
}

/// An owner change is planned as a delete, then an add of the same IP: for the backends whose add
/// replaces the comment the delete is left out (the entry never goes missing).
fn without_replaced_deletes(ops: &[SetOp]) -> impl Iterator<Item = &SetOp> {
    ops.iter()
        .enumerate()
        .filter_map(move |(i, op)| match (op, ops.get(i + 1)) {
            (SetOp::Del { ip }, Some(SetOp::Add { ip: next, .. })) if ip == next => None,
            _ => Some(op),
        })
}

/// ipsets (iptables backend), over the ipset nfnetlink subsystem.
pub struct Ipsets;

const AF_INET: u8 = libc::AF_INET as u8;

impl Ipsets {
    /// The probe sets (v6 too when `ipv6`) the calling thread's netns lacks (`IPSET_CMD_HEADER`
    /// each).
    pub fn missing(&self, ipv6: bool) -> Result<Vec<&'static str>, ProbeSetError> {
        let wanted: &[&'static str] = if ipv6 {
            &[PROBE_SET_V4, PROBE_SET_V6]
        } else {
            &[PROBE_SET_V4]
        };
        let mut missing = Vec::new();
        for set in wanted {
            let what = format!("read the header of ipset {set}");
            let attrs = msgs::ipset_named(set).map_err(|source| encode(&what, source))?;
            match nfnl::request(
                NFNL_SUBSYS_IPSET,
                msgs::IPSET_CMD_HEADER,
                0,
                AF_INET,
                &attrs,
                &what,
            ) {
                Ok(()) => {}
                Err(e) if e.refused_with() == Some(libc::ENOENT) => missing.push(*set),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(missing)
    }
}

/// One set's members (`set` names it in errors), dumped with `(subsystem, message, family)` and
/// decoded record by record into `entries`; a missing set has none.
fn dump_members(
    set: &str,
    attrs: Result<Vec<Attr>, AttrTooLong>,
    (subsys, kind, family): (u16, u16, u8),
    decode: fn(&[u8]) -> Result<Vec<Member>, DecodeMemberError>,
    entries: &mut Entries,
) -> Result<(), ProbeSetError> {
    let what = format!("list {set}");
    let attrs = attrs.map_err(|source| encode(&what, source))?;
    let records = match nfnl::dump(subsys, kind, family, &attrs, &what) {
        Ok(records) => records,
        Err(e) if e.refused_with() == Some(libc::ENOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    for record in &records {
        let members = decode(record).map_err(|source| ProbeSetError::Decode {
            set: set.to_string(),
            source,
        })?;
        entries.extend(members);
    }
    Ok(())
}

fn encode(what: &str, source: AttrTooLong) -> ProbeSetError {
    ProbeSetError::Encode {
        what: what.to_string(),
        source,
    }
}

impl ProbeSets for Ipsets {
    fn ensure(&self, exec: &mut dyn Executor, ipv6: bool) -> Result<(), ProbeSetError> {
        let mut text = format!("create {PROBE_SET_V4} hash:ip family inet comment\n");
        if ipv6 {
            text.push_str(&format!(
                "create {PROBE_SET_V6} hash:ip family inet6 comment\n"
            ));
        }
        run_checked(
            exec,
            &Cmd::new("ipset", ["-exist", "restore"]).with_stdin(text),
        )?;
        Ok(())
    }

    fn entries(&self) -> Result<Entries, ProbeSetError> {
        let mut entries = Entries::new();
        for set in [PROBE_SET_V4, PROBE_SET_V6] {
            let attrs = msgs::ipset_named(set);
            let dump = (NFNL_SUBSYS_IPSET, msgs::IPSET_CMD_LIST, AF_INET);
            dump_members(
                &format!("ipset {set}"),
                attrs,
                dump,
                msgs::ipset_members,
                &mut entries,
            )?;
        }
        Ok(entries)
    }

    fn apply(&self, ops: &[SetOp]) -> Result<(), ProbeSetError> {
        // One message each, without NLM_F_EXCL: an add replaces the comment of an entry already
        // there, a delete of an absent entry is no error (ipset's `-exist`).
        for op in without_replaced_deletes(ops) {
            let (kind, what, attrs) = match op {
                SetOp::Add { ip, uid } => {
                    let what = format!("add {ip} (pod {uid}) to ipset {}", set_name(ip));
                    let attrs = msgs::ipset_add(set_name(ip), *ip, uid);
                    (msgs::IPSET_CMD_ADD, what, attrs)
                }
                SetOp::Del { ip } => {
                    let what = format!("delete {ip} from ipset {}", set_name(ip));
                    (
                        msgs::IPSET_CMD_DEL,
                        what,
                        msgs::ipset_del(set_name(ip), *ip),
                    )
                }
            };
            let attrs = attrs.map_err(|source| encode(&what, source))?;
            nfnl::request(NFNL_SUBSYS_IPSET, kind, 0, AF_INET, &attrs, &what)?;
        }
        Ok(())
    }
}

/// nft sets in `inet istio-ambient-nat` (nftables backend), as nf_tables set elements.
pub struct NftSets;

/// The nft sets the host table declares: (table, name, element type).
pub fn nft_sets(ipv6: bool) -> Vec<(&'static str, &'static str, &'static str)> {
    let mut sets = vec![(NFT_TABLE, PROBE_SET_V4, "ipv4_addr")];
    if ipv6 {
        sets.push((NFT_TABLE, PROBE_SET_V6, "ipv6_addr"));
    }
    sets
}

/// The sets the host table declares, typed (creating one is idempotent; existing elements are
/// kept).
pub fn nft_named_sets(ipv6: bool) -> Vec<NamedSet> {
    nft_sets(ipv6)
        .into_iter()
        .map(|(table, name, kind)| NamedSet {
            table,
            name,
            kind: if kind == "ipv6_addr" {
                SetKind::Ipv6Addr
            } else {
                SetKind::Ipv4Addr
            },
            comment: SET_COMMENT,
        })
        .collect()
}

/// The nft statements creating the sets, as text (for the tests that apply with nft itself).
#[cfg(any(test, feature = "test-hooks"))]
pub fn nft_set_declarations(ipv6: bool) -> String {
    crate::rules::nft_encode::render_sets(&nft_named_sets(ipv6))
        .lines()
        .filter(|l| l.starts_with("add set "))
        .map(|l| format!("{l}\n"))
        .collect()
}

impl ProbeSets for NftSets {
    fn ensure(&self, exec: &mut dyn Executor, ipv6: bool) -> Result<(), ProbeSetError> {
        let tx = NftTransaction::new(vec![NftStep::DeclareSets(nft_named_sets(ipv6))]);
        super::nft::apply_transaction(exec, &tx)?;
        Ok(())
    }

    fn entries(&self) -> Result<Entries, ProbeSetError> {
        let mut entries = Entries::new();
        for set in [PROBE_SET_V4, PROBE_SET_V6] {
            let attrs = msgs::nft_elements_of(NFT_TABLE, set);
            let dump = (NFNL_SUBSYS_NFTABLES, msgs::NFT_MSG_GETSETELEM, NFPROTO_INET);
            let name = format!("set inet {NFT_TABLE} {set}");
            dump_members(&name, attrs, dump, msgs::nft_members, &mut entries)?;
        }
        Ok(entries)
    }

    fn apply(&self, ops: &[SetOp]) -> Result<(), ProbeSetError> {
        // One transaction (all or nothing). An add keeps an element already there as it is, so
        // an owner change stays delete-then-add; a delete is preceded by an add of the bare
        // element, so an element someone else removed meanwhile fails nothing.
        let mut tx = Transaction::new();
        for op in ops {
            let (ip, comment) = match op {
                SetOp::Add { ip, uid } => (ip, Some(uid.as_str())),
                SetOp::Del { ip } => (ip, None),
            };
            let set = set_name(ip);
            let what = match comment {
                Some(uid) => format!("add {ip} (pod {uid}) to set inet {NFT_TABLE} {set}"),
                None => format!("delete {ip} from set inet {NFT_TABLE} {set}"),
            };
            let messages = match comment {
                Some(_) => vec![(msgs::NFT_MSG_NEWSETELEM, NLM_F_CREATE, comment)],
                None => vec![
                    (msgs::NFT_MSG_NEWSETELEM, NLM_F_CREATE, None),
                    (msgs::NFT_MSG_DELSETELEM, 0, None),
                ],
            };
            for (kind, flags, comment) in messages {
                let attrs = msgs::nft_element(NFT_TABLE, set, *ip, comment)
                    .map_err(|source| encode(&what, source))?;
                tx.push(kind, flags, NFPROTO_INET, &attrs, what.clone())?;
            }
        }
        tx.send()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn entries(list: &[(&str, &str)]) -> Entries {
        list.iter().map(|(i, u)| (ip(i), u.to_string())).collect()
    }

    /// Sets in memory that count their dumps and refuse a delete of an absent entry (as an nft
    /// transaction does).
    #[derive(Default)]
    struct CountingSets {
        held: Mutex<Entries>,
        dumps: std::sync::atomic::AtomicUsize,
    }

    impl ProbeSets for CountingSets {
        fn ensure(&self, _: &mut dyn Executor, _: bool) -> Result<(), ProbeSetError> {
            Ok(())
        }
        fn entries(&self) -> Result<Entries, ProbeSetError> {
            self.dumps
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(self.held.lock().clone())
        }
        fn apply(&self, ops: &[SetOp]) -> Result<(), ProbeSetError> {
            let mut held = self.held.lock();
            let mut after = held.clone();
            for op in ops {
                if let SetOp::Del { ip } = op
                    && after.remove(ip).is_none()
                {
                    return Err(ProbeSetError::Netlink(BatchError::Rejected {
                        what: format!("delete {ip}"),
                        source: std::io::Error::from_raw_os_error(libc::ENOENT),
                    }));
                }
                apply_to(&mut after, std::slice::from_ref(op));
            }
            *held = after;
            Ok(())
        }
    }

    #[test]
    fn a_change_planned_from_the_cache_reads_no_set_and_falls_back_when_the_kernel_disagrees() {
        let sets = CountingSets::default();
        let serial = Mutex::new(());
        let dumps = || sets.dumps.load(std::sync::atomic::Ordering::Relaxed);
        let add = |uid: &'static str, at: &'static str| {
            move |current: &Entries| plan_upsert(current, uid, &[ip(at)])
        };
        // Believed right: one change, no dump.
        let ops = change_believed(
            &sets,
            &serial,
            false,
            &Entries::new(),
            &add("a", "10.0.0.1"),
        );
        assert_eq!(ops.unwrap().len(), 1);
        assert_eq!(dumps(), 0);
        // Believed already there: nothing sent, nothing read.
        let believed = entries(&[("10.0.0.1", "a")]);
        let ops = change_believed(&sets, &serial, false, &believed, &add("a", "10.0.0.1"));
        assert_eq!((ops.unwrap().len(), dumps()), (0, 0));
        // Believed wrong (the cache thinks 10.0.0.2 is b's; the kernel lost it): the delete is
        // refused, the change is planned again from the kernel and lands.
        let believed = entries(&[("10.0.0.2", "b")]);
        let ops = change_believed(&sets, &serial, false, &believed, &add("c", "10.0.0.2"));
        assert_eq!(dumps(), 1);
        assert_eq!(
            ops.unwrap(),
            vec![SetOp::Add {
                ip: ip("10.0.0.2"),
                uid: "c".into()
            }]
        );
        assert_eq!(
            *sets.held.lock(),
            entries(&[("10.0.0.1", "a"), ("10.0.0.2", "c")])
        );
    }

    #[test]
    fn a_reused_ip_moves_to_the_new_uid_by_delete_then_add() {
        let current = entries(&[("10.0.0.1", "old"), ("10.0.0.2", "new")]);
        assert_eq!(
            plan_upsert(
                &current,
                "new",
                &[ip("10.0.0.1"), ip("10.0.0.2"), ip("fd00::1")]
            ),
            vec![
                SetOp::Del { ip: ip("10.0.0.1") },
                SetOp::Add {
                    ip: ip("10.0.0.1"),
                    uid: "new".into()
                },
                SetOp::Add {
                    ip: ip("fd00::1"),
                    uid: "new".into()
                },
            ]
        );
    }

    #[test]
    fn removal_only_touches_the_uids_own_entries() {
        let current = entries(&[("10.0.0.1", "a"), ("10.0.0.2", "b")]);
        let (ops, foreign) = plan_remove(
            &current,
            "a",
            &[ip("10.0.0.1"), ip("10.0.0.2"), ip("10.0.0.3")],
        );
        assert_eq!(ops, vec![SetOp::Del { ip: ip("10.0.0.1") }]);
        assert_eq!(foreign, vec![ip("10.0.0.2")]);
    }

    #[test]
    fn removal_also_takes_the_uids_entries_the_pod_object_no_longer_names() {
        // Deleted before its status had IPs (or with changed IPs): the UID's entries still go.
        let current = entries(&[("10.0.0.1", "a"), ("10.0.0.2", "b"), ("fd00::1", "a")]);
        let (ops, foreign) = plan_remove(&current, "a", &[]);
        assert_eq!(
            ops,
            vec![
                SetOp::Del { ip: ip("10.0.0.1") },
                SetOp::Del { ip: ip("fd00::1") }
            ]
        );
        assert!(foreign.is_empty());
    }

    #[test]
    fn sync_never_deletes_a_kept_member_and_prunes_only_when_asked() {
        let current = entries(&[("10.0.0.1", "a"), ("10.0.0.9", "gone"), ("10.0.0.2", "x")]);
        let members = vec![
            ("a".to_string(), vec![ip("10.0.0.1")]),
            ("b".to_string(), vec![ip("10.0.0.2"), ip("10.0.0.3")]),
        ];
        let ops = plan_sync(&current, &members, false);
        assert_eq!(
            ops,
            vec![
                SetOp::Del { ip: ip("10.0.0.2") },
                SetOp::Add {
                    ip: ip("10.0.0.2"),
                    uid: "b".into()
                },
                SetOp::Add {
                    ip: ip("10.0.0.3"),
                    uid: "b".into()
                },
            ]
        );
        let pruned = plan_sync(&current, &members, true);
        assert_eq!(pruned[0], SetOp::Del { ip: ip("10.0.0.9") });
        assert!(!pruned.contains(&SetOp::Del { ip: ip("10.0.0.1") }));
    }

    #[test]
    fn an_upsert_drops_the_uids_entries_at_ips_it_no_longer_has() {
        let current = entries(&[("10.0.0.2", "a"), ("10.0.0.3", "b"), ("10.0.0.7", "a")]);
        let ops = plan_upsert(&current, "a", &[ip("10.0.0.9"), ip("10.0.0.7")]);
        assert_eq!(
            ops,
            [
                SetOp::Del { ip: ip("10.0.0.2") },
                SetOp::Add {
                    ip: ip("10.0.0.9"),
                    uid: "a".into()
                }
            ]
        );
        assert!(plan_upsert(&current, "a", &[]).is_empty(), "IPs unknown");
    }
}
