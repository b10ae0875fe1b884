//! iptables renderer: the rule model as iptables arguments and as iptables-restore input, in the
//! exact layout Istio produces (so its goldens are an oracle for ours).

use std::collections::{BTreeMap, HashSet};

use super::model::{CtState, Match, Position, Rule, SetDir, Table, Target, is_builtin_chain};

/// The match and target arguments of a rule (everything after `-A CHAIN` / `-I CHAIN N`).
pub fn rule_args(rule: &Rule) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(12);
    let mut push = |parts: &[&str]| out.extend(parts.iter().map(|p| p.to_string()));
    for m in &rule.matches {
        if let Some(pm) = m.as_port() {
            if let Some(p) = pm.module {
                push(&["-m", p.name()]);
            }
            let flag = if pm.source { "--sport" } else { "--dport" };
            push_negated(&mut push, pm.negate, &[flag, pm.port]);
            continue;
        }
        match m {
            Match::InIface { name, negate } => push_negated(&mut push, *negate, &["-i", name]),
            Match::OutIface { name, negate } => push_negated(&mut push, *negate, &["-o", name]),
            Match::Proto(p) => push(&["-p", p.name()]),
            Match::Src { addr, negate } => push_negated(&mut push, *negate, &["-s", addr]),
            Match::Dst { addr, negate } => push_negated(&mut push, *negate, &["-d", addr]),
            // Rendered above, by `as_port`.
            Match::DstPort { .. } | Match::SrcPort { .. } => {}
            Match::DstPorts { ports, negate } => {
                push(&["-m", "multiport"]);
                push_negated(&mut push, *negate, &["--dports", &ports.join(",")]);
            }
            Match::UidOwner { id, negate } => {
                push(&["-m", "owner"]);
                push_negated(&mut push, *negate, &["--uid-owner", id]);
            }
            Match::GidOwner { id, negate } => {
                push(&["-m", "owner"]);
                push_negated(&mut push, *negate, &["--gid-owner", id]);
            }
            Match::SocketExists => push(&["-m", "owner", "--socket-exists"]),
            Match::Mark { value, negate } => {
                push(&["-m", "mark"]);
                push_negated(&mut push, *negate, &["--mark", value]);
            }
            Match::ConnMark { value } => push(&["-m", "connmark", "--mark", value]),
            Match::CtState(states) => {
                let names: Vec<&str> = states
                    .iter()
                    .map(|s| match s {
                        CtState::Invalid => "INVALID",
                        CtState::Related => "RELATED",
                        CtState::Established => "ESTABLISHED",
                    })
                    .collect();
                push(&["-m", "conntrack", "--ctstate", &names.join(",")]);
            }
            Match::InSet { name, dir } => {
                let dir = match dir {
                    SetDir::Src => "src",
                    SetDir::Dst => "dst",
                };
                push(&["-m", "set", "--match-set", name, dir]);
            }
            Match::ProtoModule(p) => push(&["-m", p.name()]),
        }
    }
    match &rule.target {
        Target::Jump(chain) => push(&["-j", chain]),
        Target::Return => push(&["-j", "RETURN"]),
        Target::Accept => push(&["-j", "ACCEPT"]),
        Target::Drop => push(&["-j", "DROP"]),
        Target::Redirect { port, plural } => push(&[
            "-j",
            "REDIRECT",
            if *plural { "--to-ports" } else { "--to-port" },
            port,
        ]),
        Target::Tproxy { mark, port } => {
            push(&["-j", "TPROXY", "--tproxy-mark", mark, "--on-port", port])
        }
        Target::SetMark(mark) => push(&["-j", "MARK", "--set-mark", mark]),
        Target::ConnmarkSetXmark(mark) => push(&["-j", "CONNMARK", "--set-xmark", mark]),
        Target::ConnmarkSave => push(&["-j", "CONNMARK", "--save-mark"]),
        Target::ConnmarkRestore { masks } => {
            push(&["-j", "CONNMARK", "--restore-mark"]);
            if *masks {
                push(&["--nfmask", "0xffffffff", "--ctmask", "0xffffffff"]);
            }
        }
        Target::CtZone(zone) => push(&["-j", "CT", "--zone", &zone.to_string()]),
        Target::Snat(addr) => push(&["-j", "SNAT", "--to-source", addr]),
    }
    out
}

fn push_negated(push: &mut impl FnMut(&[&str]), negate: bool, parts: &[&str]) {
    if negate {
        push(&["!"]);
    }
    push(parts);
}

/// The rule as one iptables-restore line (`-A CHAIN ...` or `-I CHAIN N ...`).
pub fn rule_line(rule: &Rule) -> String {
    let mut line = match rule.position {
        Position::Append => format!("-A {}", rule.chain),
        Position::Insert(pos) => format!("-I {} {}", rule.chain, pos),
    };
    for arg in rule_args(rule) {
        line.push(' ');
        line.push_str(&arg);
    }
    line
}

/// One step of an iptables-restore transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestoreStep<'a> {
    /// `-N CHAIN`: declare a user chain.
    NewChain(&'a str),
    /// `-A`/`-I`: add a rule.
    Rule(&'a Rule),
}

/// The steps of a restore for one family's rules, per table, laid out as Istio does: tables in
/// lexicographic order, each with its `-N` declarations (first the chains rules live in, then
/// chains only jumped to, each in first-seen order), then the rules in program order. Both the
/// restore text and the netlink encoding ([`super::iptables_nft`]) follow these steps.
pub fn restore_steps(rules: &[Rule]) -> BTreeMap<Table, Vec<RestoreStep<'_>>> {
    let mut tables: BTreeMap<Table, Vec<RestoreStep<'_>>> = BTreeMap::new();
    let mut seen: HashSet<(Table, &str)> = HashSet::new();
    for rule in rules {
        if seen.insert((rule.table, rule.chain.as_str())) && !is_builtin_chain(&rule.chain) {
            tables
                .entry(rule.table)
                .or_default()
                .push(RestoreStep::NewChain(&rule.chain));
        }
    }
    for rule in rules {
        if let Some(target) = rule.target.jump_chain()
            && seen.insert((rule.table, target))
            && !is_builtin_chain(target)
        {
            tables
                .entry(rule.table)
                .or_default()
                .push(RestoreStep::NewChain(target));
        }
    }
    for rule in rules {
        tables
            .entry(rule.table)
            .or_default()
            .push(RestoreStep::Rule(rule));
    }
    tables
}

/// iptables-restore input for one family's rules ([`restore_steps`]), each table closed by
/// `COMMIT`.
pub fn render_restore(rules: &[Rule]) -> String {
    let mut out = String::new();
    for (table, steps) in restore_steps(rules) {
        out.push_str("* ");
        out.push_str(table.name());
        out.push('\n');
        for step in steps {
            match step {
                RestoreStep::NewChain(chain) => {
                    out.push_str("-N ");
                    out.push_str(chain);
                }
                RestoreStep::Rule(rule) => out.push_str(&rule_line(rule)),
            }
            out.push('\n');
        }
        out.push_str("COMMIT\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::model::{Proto, RuleSetBuilder};

    #[test]
    fn declares_jump_only_chains_after_rule_chains() {
        let mut b = RuleSetBuilder::new(false);
        b.append(
            Table::Nat,
            "PREROUTING",
            vec![],
            Target::Jump("ISTIO_PRERT".into()),
        );
        b.append(
            Table::Nat,
            "ISTIO_OUTPUT",
            vec![
                Match::Proto(Proto::Tcp),
                Match::DstPort {
                    port: "53".into(),
                    negate: true,
                    module: None,
                },
            ],
            Target::Return,
        );
        let text = render_restore(&b.build().v4);
        assert_eq!(
            text,
            "* nat\n-N ISTIO_OUTPUT\n-N ISTIO_PRERT\n-A PREROUTING -j ISTIO_PRERT\n-A ISTIO_OUTPUT -p tcp ! --dport 53 -j RETURN\nCOMMIT\n"
        );
    }

    #[test]
    fn empty_rules_render_nothing() {
        assert_eq!(render_restore(&[]), "");
    }
}
