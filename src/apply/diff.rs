//! The one structural comparison of an iptables family's rules, as read back
//! ([`IptablesState`], from an nf_tables dump or from `*-save` text alike), with a plan in the
//! typed rule model; both flavours and both reads take it. Two questions, one per kind of plan:
//! * [`sidecar_diff`]: Istio's check of a sidecar capture (order not compared; [`Difference`]
//!   names the first way it differs);
//! * [`ambient_difference`]: the ambient in-pod and host rules (order compared, every jump into
//!   our chains accounted for).
//!
//! Pure.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::owned::OwnedChains;
use crate::rules::Rule;
use crate::rules::capture::{is_owned_chain, owned_chains};
use crate::rules::iptables::rule_args;
use crate::rules::iptables_nft_decode::{as_listed, canonical};
use crate::rules::iptables_state::{DecodedRule, IptablesState};
use crate::rules::model::{ForeignRule, is_builtin_chain};

/// How what a backend read compares with its plan.
#[derive(Debug)]
pub enum Diff<'a, D = Difference> {
    Same,
    Differs(D),
    /// A `*-save` read only: these planned rules were not found as decoded (the kernel may have
    /// re-spelt them, e.g. a group name as its id); `iptables -C` decides.
    Unsure(Vec<&'a Rule>),
}

/// How exactly a read says what the kernel holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadKind {
    /// An nf_tables dump: a planned rule not found is missing.
    Dumped,
    /// `*-save` text: a planned rule not found may be re-spelt ([`Diff::Unsure`]).
    Saved,
}

/// The first way the state differs from a plan (for logs and events: what drifted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Difference {
    /// A planned chain is not there (or nothing of its table).
    MissingChain { table: String, chain: String },
    /// A chain of ours holds another number of rules than planned.
    RuleCount {
        table: String,
        chain: String,
        found: usize,
        planned: usize,
    },
    /// A planned rule of a built-in chain is there more often than planned.
    Stacked { table: String, chain: String },
    /// A chain of ours that the plan does not create.
    ExtraChain { table: String, chain: String },
    /// A planned rule is not there (its chain holds others).
    MissingRule {
        table: String,
        chain: String,
        rule: String,
    },
    /// Our chains of a table are not the planned ones (an ambient plan).
    Chains {
        table: String,
        found: Vec<String>,
        planned: Vec<String>,
    },
    /// A rule of a chain we judge reads back as foreign (an ambient plan).
    Foreign {
        table: String,
        chain: String,
        what: ForeignRule,
    },
    /// A chain of ours holds other rules, or the planned ones in another order (an ambient plan).
    Rules {
        table: String,
        chain: String,
        found: usize,
        planned: usize,
    },
    /// The built-in chains' jumps into our chains are not the planned ones (an ambient plan).
    Jumps { table: String },
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Difference::MissingChain { table, chain } => {
                write!(f, "chain {chain} missing from table {table}")
            }
            Difference::RuleCount {
                table,
                chain,
                found,
                planned,
            } => write!(
                f,
                "{table} chain {chain} holds {found} rules, {planned} expected"
            ),
            Difference::Stacked { table, chain } => {
                write!(f, "{table} chain {chain} holds a rule of ours twice")
            }
            Difference::ExtraChain { table, chain } => {
                write!(f, "unexpected chain {chain} in table {table}")
            }
            Difference::MissingRule { table, chain, rule } => {
                write!(f, "{table} chain {chain} lacks rule `{rule}`")
            }
            Difference::Chains {
                table,
                found,
                planned,
            } => write!(f, "{table}: chains {found:?} where {planned:?} are planned"),
            Difference::Foreign { table, chain, what } => {
                write!(f, "{table} chain {chain}: {what}")
            }
            Difference::Rules {
                table,
                chain,
                found,
                planned,
            } => write!(
                f,
                "{table} chain {chain} holds {found} rules that differ from the {planned} planned"
            ),
            Difference::Jumps { table } => write!(
                f,
                "{table}: the built-in chains' jumps into our chains differ from the plan"
            ),
        }
    }
}

/// Whether `state` holds any chain the sidecar rule model owns.
pub fn has_owned_chains(state: &IptablesState) -> bool {
    let owned = owned_chains();
    state
        .chains
        .iter()
        .any(|(t, c)| is_owned_chain(owned, t, c))
}

/// Whether `state` holds anything of the sidecar plan: a chain of ours, or a planned built-in
/// chain rule (applying on top would stack a second copy). One pass over the rules found.
pub fn holds_any_of(state: &IptablesState, rules: &[Rule]) -> bool {
    if has_owned_chains(state) {
        return true;
    }
    let listed = as_listed(rules);
    let planned: HashSet<(&str, &str, &Rule)> = listed
        .iter()
        .filter(|((_, c), _)| is_builtin_chain(c))
        .flat_map(|((t, c), planned)| planned.iter().map(|r| (t.name(), c.as_str(), r)))
        .collect();
    state.rules.iter().any(|h| {
        h.rule
            .as_ref()
            .is_ok_and(|r| planned.contains(&(h.table.as_str(), h.chain.as_str(), r)))
    })
}

/// How `state` differs from the sidecar plan `rules`, as Istio checks: every planned chain
/// there; our chains hold as many rules as planned; no planned rule more often than planned;
/// every planned rule there (order not compared); no chain of ours the plan does not create. A
/// foreign rule equals no planned one. Only chains the rule model owns count: a user's
/// `ISTIO_FW` is not drift. Linear in the rules planned and found: each is counted once, by value.
pub fn sidecar_diff<'a>(state: &IptablesState, rules: &'a [Rule], read: ReadKind) -> Diff<'a> {
    let owned = owned_chains();
    let listed = as_listed(rules);
    let found = state.by_chain();
    let mut unsure = Vec::new();
    for ((table, chain), planned) in &listed {
        let (table, chain) = (table.name(), chain.as_str());
        let names = || (table.to_string(), chain.to_string());
        if !state.chains.contains(&names()) {
            let (table, chain) = names();
            return Diff::Differs(Difference::MissingChain { table, chain });
        }
        let have = found.get(&(table, chain)).map_or(&[][..], Vec::as_slice);
        if is_owned_chain(owned, table, chain) && have.len() != planned.len() {
            let (table, chain) = names();
            return Diff::Differs(Difference::RuleCount {
                table,
                chain,
                found: have.len(),
                planned: planned.len(),
            });
        }
        // Planned rule -> (times planned, times found).
        let mut counts: HashMap<&Rule, (usize, usize)> = HashMap::with_capacity(planned.len());
        for rule in planned {
            counts.entry(rule).or_default().0 += 1;
        }
        for rule in have.iter().filter_map(|h| h.rule.as_ref().ok()) {
            if let Some((_, seen)) = counts.get_mut(rule) {
                *seen += 1;
            }
        }
        if counts.values().any(|(want, seen)| seen > want) {
            let (table, chain) = names();
            return Diff::Differs(Difference::Stacked { table, chain });
        }
        match read {
            ReadKind::Dumped => {
                if let Some(missing) = planned.iter().find(|r| counts[r].1 == 0) {
                    let (table, chain) = names();
                    let rule = rule_args(missing).join(" ");
                    return Diff::Differs(Difference::MissingRule { table, chain, rule });
                }
            }
            ReadKind::Saved => unsure.extend(
                rules
                    .iter()
                    .filter(|r| r.table.name() == table && r.chain == chain)
                    .filter(|r| counts.get(&canonical(r)).is_none_or(|c| c.1 == 0)),
            ),
        }
    }
    let planned_chains: HashSet<(&str, &str)> =
        listed.keys().map(|(t, c)| (t.name(), c.as_str())).collect();
    let extra = state.chains.iter().find(|(t, c)| {
        is_owned_chain(owned, t, c) && !planned_chains.contains(&(t.as_str(), c.as_str()))
    });
    match extra {
        Some((table, chain)) => Diff::Differs(Difference::ExtraChain {
            table: table.clone(),
            chain: chain.clone(),
        }),
        None if unsure.is_empty() => Diff::Same,
        None => Diff::Unsure(unsure),
    }
}

/// How `state` differs from holding exactly `rules` in `owned`'s chains: our chains exist
/// exactly when planned, hold exactly the planned rules in order, and the built-in chains hold
/// each planned rule and no other rule jumping into ours. None when nothing differs.
pub fn ambient_difference(
    state: &IptablesState,
    rules: &[Rule],
    owned: OwnedChains,
) -> Option<Difference> {
    let listed = as_listed(rules);
    for &table in owned.tables {
        let planned: Vec<&Rule> = rules.iter().filter(|r| r.table.name() == table).collect();
        let planned_chains = owned.planned_chains(&planned);
        let existing_chains = owned.present_in(state, table);
        if planned_chains != existing_chains {
            let names = |chains: &[&str]| chains.iter().map(|c| c.to_string()).collect();
            return Some(Difference::Chains {
                table: table.to_string(),
                found: names(&existing_chains),
                planned: names(&planned_chains),
            });
        }
        for &chain in &planned_chains {
            let want = listed
                .iter()
                .find(|((t, c), _)| t.name() == table && c == chain)
                .map(|(_, r)| r.as_slice())
                .unwrap_or_default();
            let have: Vec<&DecodedRule> = state.chain(table, chain).collect();
            if let Some(foreign) = have.iter().find_map(|r| r.rule.as_ref().err()) {
                return Some(Difference::Foreign {
                    table: table.to_string(),
                    chain: chain.to_string(),
                    what: foreign.clone(),
                });
            }
            let same = have.len() == want.len()
                && have.iter().zip(want).all(|(h, w)| h.rule.as_ref() == Ok(w));
            if !same {
                return Some(Difference::Rules {
                    table: table.to_string(),
                    chain: chain.to_string(),
                    found: have.len(),
                    planned: want.len(),
                });
            }
        }
        if let Some(how) = builtin_jumps_differ(state, &listed, table, owned) {
            return Some(how);
        }
    }
    None
}

/// Built-in chains of `table`: every rule jumping into ours, against the planned built-in rules.
fn builtin_jumps_differ(
    state: &IptablesState,
    listed: &BTreeMap<(crate::rules::Table, String), Vec<Rule>>,
    table: &str,
    owned: OwnedChains,
) -> Option<Difference> {
    let mut want: Vec<String> = listed
        .iter()
        .filter(|((t, c), _)| t.name() == table && is_builtin_chain(c))
        .flat_map(|(_, rules)| rules.iter().map(|r| format!("{r:?}")))
        .collect();
    let mut have = Vec::new();
    for r in state.rules.iter().filter(|r| {
        r.table == table
            && is_builtin_chain(&r.chain)
            && r.jumps_to
                .as_deref()
                .is_some_and(|t| owned.chains.contains(&t))
    }) {
        match &r.rule {
            Ok(rule) => have.push(format!("{rule:?}")),
            Err(foreign) => {
                return Some(Difference::Foreign {
                    table: table.to_string(),
                    chain: r.chain.clone(),
                    what: foreign.clone(),
                });
            }
        }
    }
    want.sort();
    have.sort();
    (want != have).then(|| Difference::Jumps {
        table: table.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::iptables_save_decode::decode_save;

    const SAVED: &str = "# Generated by iptables-nft-save v1.8.9\n*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:ISTIO_OUTPUT - [0:0]\n:ISTIO_REDIRECT - [0:0]\n-A OUTPUT -j ISTIO_OUTPUT\n-A OUTPUT -p tcp -j RETURN\n-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN\n-A ISTIO_OUTPUT -j ISTIO_REDIRECT\n-A ISTIO_REDIRECT -p tcp -m tcp -j REDIRECT --to-ports 15001\nCOMMIT\n*filter\n:INPUT ACCEPT [0:0]\n:ISTIO_FW - [0:0]\n-A ISTIO_FW -j ACCEPT\nCOMMIT\n";

    #[test]
    fn a_user_chain_named_istio_is_not_ours() {
        let state = decode_save("*filter\n:ISTIO_FW - [0:0]\n-A ISTIO_FW -j ACCEPT\nCOMMIT\n");
        assert!(!has_owned_chains(&state));
        assert!(has_owned_chains(&decode_save(SAVED)));
    }

    fn saved_text(rules: &[Rule]) -> String {
        let mut text = String::from("*nat\n");
        for rule in rules {
            text.push_str(&format!(
                "-A {} {}\n",
                rule.chain,
                rule_args(rule).join(" ")
            ));
        }
        text.push_str("COMMIT\n");
        text
    }

    #[test]
    fn a_planned_rule_applied_twice_is_drift() {
        let rules = crate::rules::capture::build(&Default::default());
        let mut text = saved_text(&rules.v4);
        let diff = |text: &str| sidecar_diff(&decode_save(text), &rules.v4, ReadKind::Saved);
        assert!(matches!(diff(&text), Diff::Same));
        text = text.replace("COMMIT", "-A OUTPUT -j ISTIO_OUTPUT\nCOMMIT");
        assert!(matches!(
            diff(&text),
            Diff::Differs(Difference::Stacked { .. })
        ));
    }

    /// A saved rule that does not read back as planned (a group saved by its id) is unsure, not
    /// missing: `iptables -C` decides.
    #[test]
    fn a_saved_rule_read_otherwise_is_unsure() {
        let rules = crate::rules::capture::build(&crate::rules::capture::CaptureConfig {
            proxy_gids: vec!["istio-proxy".into()],
            ..Default::default()
        });
        let text = saved_text(&rules.v4).replace("istio-proxy", "1337");
        let state = decode_save(&text);
        match sidecar_diff(&state, &rules.v4, ReadKind::Saved) {
            Diff::Unsure(rules) => assert!(!rules.is_empty()),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            sidecar_diff(&state, &rules.v4, ReadKind::Dumped),
            Diff::Differs(Difference::MissingRule { .. })
        ));
    }

    /// Counting each planned rule against every saved one (and back) would take n² rule
    /// comparisons (10⁹ here); counting by value takes a moment. The bound is generous.
    #[test]
    fn comparing_a_wide_plan_with_saved_text_is_linear() {
        let ranges: Vec<String> = (0..40_000u32)
            .map(|i| format!("10.{}.{}.0/24", i / 256 % 256, i % 256))
            .collect();
        let cfg = crate::rules::capture::CaptureConfig {
            outbound_ranges_exclude: crate::rules::capture::IpRanges::parse(&ranges.join(","))
                .unwrap(),
            ..Default::default()
        };
        let rules = crate::rules::capture::build(&cfg);
        let state = decode_save(&saved_text(&rules.v4));
        let started = std::time::Instant::now();
        assert!(matches!(
            sidecar_diff(&state, &rules.v4, ReadKind::Saved),
            Diff::Same
        ));
        assert!(holds_any_of(&state, &rules.v4));
        let took = started.elapsed();
        assert!(took < std::time::Duration::from_secs(10), "{took:?}");
    }
}

#[cfg(test)]
#[path = "diff_tests.rs"]
mod dumped_tests;
