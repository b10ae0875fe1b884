//! The host's probe address sets (`istio-inpod-probes-v4/-v6`): one entry per enrolled pod IP,
//! commented with the pod UID, matched by the probe SNAT rule. An ipset (`hash:ip`, comments) with
//! the iptables backend; an nft set in `inet istio-ambient-nat` with nftables.
//!
//! Never flushed: every change is planned against the current entries ([`plan_upsert`],
//! [`plan_remove`], [`plan_sync`], pure) and sent as one batch (`ipset -exist restore`, or one
//! `nft -f -` transaction, which is atomic). A reused IP moves to the new UID by delete-then-add in
//! that batch; a removal only touches entries carrying the UID asking for it.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use super::exec::{Cmd, Executor};
use super::iptables::{ApplyError, run_checked};
use crate::rules::ambient::{PROBE_SET_V4, PROBE_SET_V6};

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
pub fn apply_to(current: &mut Entries, ops: &[SetOp]) {
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

/// A probe set backend (in the calling thread's netns).
pub trait ProbeSets {
    /// Creates the sets (v6 too when `ipv6`) if missing; never flushes.
    fn ensure(&self, exec: &mut dyn Executor, ipv6: bool) -> Result<(), ApplyError>;
    /// Entries of both sets (a missing set has none).
    fn entries(&self, exec: &mut dyn Executor) -> Result<Entries, ApplyError>;
    /// Applies the changes in one batch.
    fn apply(&self, exec: &mut dyn Executor, ops: &[SetOp]) -> Result<(), ApplyError>;
}

/// ipsets (iptables backend).
pub struct Ipsets;

impl Ipsets {
    /// The probe sets (v6 too when `ipv6`) the calling thread's netns lacks, asked over
    /// netlink (no `ipset` process).
    pub fn missing(&self, ipv6: bool) -> Result<Vec<&'static str>, ApplyError> {
        let wanted: &[&'static str] = if ipv6 {
            &[PROBE_SET_V4, PROBE_SET_V6]
        } else {
            &[PROBE_SET_V4]
        };
        let mut missing = Vec::new();
        for set in wanted {
            let present =
                crate::netlink::ipset::exists(set).map_err(|source| ApplyError::Netlink {
                    what: format!("look up ipset {set}"),
                    source,
                })?;
            if !present {
                missing.push(*set);
            }
        }
        Ok(missing)
    }
}

impl ProbeSets for Ipsets {
    fn ensure(&self, exec: &mut dyn Executor, ipv6: bool) -> Result<(), ApplyError> {
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

    fn entries(&self, exec: &mut dyn Executor) -> Result<Entries, ApplyError> {
        let mut entries = Entries::new();
        for set in [PROBE_SET_V4, PROBE_SET_V6] {
            let out = exec.run(&Cmd::new("ipset", ["save", set]))?;
            if out.success {
                entries.extend(parse_ipset_save(&out.stdout));
            } else if !out.stderr.contains("does not exist") {
                return Err(ApplyError::Failed {
                    command: format!("ipset save {set}"),
                    code: out.code,
                    stderr: out.stderr.trim().to_string(),
                });
            }
        }
        Ok(entries)
    }

    fn apply(&self, exec: &mut dyn Executor, ops: &[SetOp]) -> Result<(), ApplyError> {
        if ops.is_empty() {
            return Ok(());
        }
        let text: String = ops
            .iter()
            .map(|op| match op {
                SetOp::Add { ip, uid } => {
                    format!("add {} {ip} comment \"{}\"\n", set_name(ip), quote(uid))
                }
                SetOp::Del { ip } => format!("del {} {ip}\n", set_name(ip)),
            })
            .collect();
        run_checked(
            exec,
            &Cmd::new("ipset", ["-exist", "restore"]).with_stdin(text),
        )?;
        Ok(())
    }
}

/// nft sets in `inet istio-ambient-nat` (nftables backend).
pub struct NftSets;

/// The nft statements creating the sets (idempotent; existing elements are kept).
pub fn nft_set_declarations(ipv6: bool) -> String {
    let mut text = format!(
        "add set inet {NFT_TABLE} {PROBE_SET_V4} {{ type ipv4_addr ; comment \"{SET_COMMENT}\" ; }}\n"
    );
    if ipv6 {
        text.push_str(&format!(
            "add set inet {NFT_TABLE} {PROBE_SET_V6} {{ type ipv6_addr ; comment \"{SET_COMMENT}\" ; }}\n"
        ));
    }
    text
}

impl ProbeSets for NftSets {
    fn ensure(&self, exec: &mut dyn Executor, ipv6: bool) -> Result<(), ApplyError> {
        let text = format!("add table inet {NFT_TABLE}\n{}", nft_set_declarations(ipv6));
        super::nft::apply_transaction(exec, &text)
    }

    fn entries(&self, exec: &mut dyn Executor) -> Result<Entries, ApplyError> {
        let mut entries = Entries::new();
        for set in [PROBE_SET_V4, PROBE_SET_V6] {
            let out = exec.run(&Cmd::new("nft", ["list", "set", "inet", NFT_TABLE, set]))?;
            if out.success {
                entries.extend(parse_nft_set(&out.stdout));
            } else if !out.stderr.contains("No such file or directory") {
                return Err(ApplyError::Failed {
                    command: format!("nft list set inet {NFT_TABLE} {set}"),
                    code: out.code,
                    stderr: out.stderr.trim().to_string(),
                });
            }
        }
        Ok(entries)
    }

    fn apply(&self, exec: &mut dyn Executor, ops: &[SetOp]) -> Result<(), ApplyError> {
        let text: String = ops
            .iter()
            .map(|op| match op {
                SetOp::Add { ip, uid } => format!(
                    "add element inet {NFT_TABLE} {} {{ {ip} comment \"{}\" }}\n",
                    set_name(ip),
                    quote(uid)
                ),
                SetOp::Del { ip } => {
                    format!(
                        "delete element inet {NFT_TABLE} {} {{ {ip} }}\n",
                        set_name(ip)
                    )
                }
            })
            .collect();
        super::nft::apply_transaction(exec, &text)
    }
}

/// A UID goes into a double-quoted comment: quotes and backslashes are dropped (pod UIDs have none).
fn quote(uid: &str) -> String {
    uid.chars().filter(|c| *c != '"' && *c != '\\').collect()
}

/// `ipset save` lines `add SET IP comment "UID"`.
pub fn parse_ipset_save(text: &str) -> Entries {
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("add ")?;
            let mut words = rest.splitn(3, ' ');
            let (_set, ip) = (words.next()?, words.next()?.parse().ok()?);
            let uid = words
                .next()
                .and_then(|tail| tail.split("comment \"").nth(1))
                .and_then(|c| c.split('"').next())
                .unwrap_or_default();
            Some((ip, uid.to_string()))
        })
        .collect()
}

/// `nft list set` output: `elements = { IP comment "UID", ... }` (possibly over several lines).
pub fn parse_nft_set(text: &str) -> Entries {
    let Some(start) = text.find("elements = {") else {
        return Entries::new();
    };
    let body = &text[start + "elements = {".len()..];
    let body = &body[..body.find('}').unwrap_or(body.len())];
    body.split(',')
        .filter_map(|item| {
            let item = item.trim();
            let ip = item.split_whitespace().next()?.parse().ok()?;
            let uid = item
                .split("comment \"")
                .nth(1)
                .and_then(|c| c.split('"').next())
                .unwrap_or_default();
            Some((ip, uid.to_string()))
        })
        .collect()
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
    fn parses_both_listings() {
        let saved = "create istio-inpod-probes-v4 hash:ip family inet hashsize 1024 maxelem 65536 comment bucketsize 12 initval 0x1\nadd istio-inpod-probes-v4 10.0.0.1 comment \"uid-1\"\nadd istio-inpod-probes-v4 10.0.0.2\n";
        assert_eq!(
            parse_ipset_save(saved),
            entries(&[("10.0.0.1", "uid-1"), ("10.0.0.2", "")])
        );
        let listed = "table inet istio-ambient-nat {\n\tset istio-inpod-probes-v4 {\n\t\ttype ipv4_addr\n\t\tcomment \"UUID of the pods\"\n\t\telements = { 10.0.0.1 comment \"u1\",\n\t\t\t     10.0.0.2 comment \"u2\" }\n\t}\n}\n";
        assert_eq!(
            parse_nft_set(listed),
            entries(&[("10.0.0.1", "u1"), ("10.0.0.2", "u2")])
        );
        assert!(parse_nft_set("table inet x {\n\tset s {\n\t}\n}\n").is_empty());
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
