//! Reading `iptables-save` output: the parsed state, which of its chains the sidecar rule model
//! owns, and how it compares with a plan. Pure: text in, answers out.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::rules::Rule;
use crate::rules::capture::{is_owned_chain, owned_chains};
use crate::rules::iptables::rule_args;

/// Table -> chain -> rule argument strings, as read from `*-save` (or rendered from a plan).
pub type State = BTreeMap<String, BTreeMap<String, Vec<String>>>;

/// The tables `*-save` output is read for (the ones Istio's state check reads).
const TABLES: [&str; 4] = ["filter", "nat", "mangle", "raw"];

/// Parses `iptables-save` output: tables filter/nat/mangle/raw, chain declarations and rules.
pub fn parse_save(text: &str) -> State {
    let mut state = State::new();
    let mut table: Option<String> = None;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line == "COMMIT" {
            continue;
        }
        if let Some(name) = line.strip_prefix('*') {
            let name = name.trim();
            table = TABLES.contains(&name).then(|| name.to_string());
            if let Some(t) = &table {
                state.entry(t.clone()).or_default();
            }
            continue;
        }
        let Some(t) = &table else { continue };
        let chains = state.entry(t.clone()).or_default();
        if let Some(decl) = line.strip_prefix(':').or_else(|| line.strip_prefix("-N ")) {
            if let Some(chain) = decl.split_whitespace().next() {
                chains.entry(chain.to_string()).or_default();
            }
            continue;
        }
        let mut words = line.splitn(3, ' ');
        let (Some(op), Some(chain)) = (words.next(), words.next()) else {
            continue;
        };
        if op == "-A" || op == "-I" {
            let mut rest = words.next().unwrap_or("").to_string();
            if op == "-I" {
                // Drop the insert position, as the kernel reports rules without one.
                if let Some((pos, tail)) = rest.split_once(' ')
                    && pos.chars().all(|c| c.is_ascii_digit())
                {
                    rest = tail.to_string();
                }
            }
            chains.entry(chain.to_string()).or_default().push(rest);
        }
    }
    state
}

/// The `*table` … `COMMIT` section of one table in `*-save` output (comments dropped), or None.
pub fn table_section(save: &str, table: &str) -> Option<String> {
    let mut out = String::new();
    let mut inside = false;
    for line in save.lines() {
        if line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('*') {
            inside = name.trim() == table;
        }
        if inside {
            out.push_str(line);
            out.push('\n');
            if line.trim() == "COMMIT" {
                return Some(out);
            }
        }
    }
    None
}

/// Whether the state holds any chain the sidecar rule model owns.
pub fn has_owned_chains(state: &State) -> bool {
    let owned = owned_chains();
    state.iter().any(|(table, chains)| {
        chains
            .keys()
            .any(|chain| is_owned_chain(owned, table, chain))
    })
}

/// Whether the state holds anything of a plan: a chain of ours, or a planned rule of a built-in
/// chain (applying on top would stack a second copy). One pass over the saved rules of the
/// built-in chains the plan writes to.
pub fn holds_any_of(state: &State, plan: &[Rule]) -> bool {
    if has_owned_chains(state) {
        return true;
    }
    let planned: HashSet<(&str, &str, String)> = plan
        .iter()
        .filter(|r| crate::rules::model::is_builtin_chain(&r.chain))
        .map(|r| {
            let key = normalise(&rule_args(r).join(" "));
            (r.table.name(), r.chain.as_str(), key)
        })
        .collect();
    let chains: HashSet<(&str, &str)> = planned.iter().map(|(t, c, _)| (*t, *c)).collect();
    chains.into_iter().any(|(table, chain)| {
        state
            .get(table)
            .and_then(|chains| chains.get(chain))
            .is_some_and(|rules| {
                rules
                    .iter()
                    .any(|e| planned.contains(&(table, chain, normalise(e))))
            })
    })
}

/// The jump or goto target of a saved rule.
pub fn jump_target(rule: &str) -> Option<&str> {
    let words: Vec<&str> = rule.split_whitespace().collect();
    words
        .iter()
        .position(|w| *w == "-j" || *w == "-g")
        .and_then(|i| words.get(i + 1).copied())
}

/// A saved rule's arguments as a command line takes them: split on spaces, except inside double
/// quotes (`--comment "a b"`), with the quotes removed.
pub fn rule_words(rule: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let (mut quoted, mut escaped, mut started) = (false, false, false);
    for c in rule.chars() {
        match c {
            _ if escaped => {
                word.push(c);
                escaped = false;
            }
            '\\' if quoted => escaped = true,
            '"' => {
                quoted = !quoted;
                started = true;
            }
            ' ' if !quoted => {
                if started {
                    words.push(std::mem::take(&mut word));
                }
                started = false;
            }
            _ => {
                word.push(c);
                started = true;
            }
        }
    }
    if started {
        words.push(word);
    }
    words
}

/// Result of comparing the current state with a plan.
pub enum Comparison<'a> {
    Same,
    Different(Difference),
    /// Structure matches; these rules did not match textually and need an `iptables -C` check.
    Unsure(Vec<&'a Rule>),
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
        }
    }
}

/// Whether the current state already holds exactly the planned rules: every planned chain and rule
/// present, and our chains hold no more and no fewer rules than planned. Order is not compared
/// (as in Istio). Only chains the rule model owns count: a user's `ISTIO_FW` is not drift.
pub fn compare_with_plan<'a>(current: &State, plan: &'a [Rule]) -> Comparison<'a> {
    let owned = owned_chains();
    let mut planned: BTreeMap<(String, String), Vec<&Rule>> = BTreeMap::new();
    for rule in plan {
        planned
            .entry((rule.table.name().to_string(), rule.chain.clone()))
            .or_default()
            .push(rule);
    }
    let mut unsure = Vec::new();
    for ((table, chain), rules) in &planned {
        let Some(existing) = current.get(table).and_then(|c| c.get(chain)) else {
            return Comparison::Different(Difference::MissingChain {
                table: table.clone(),
                chain: chain.clone(),
            });
        };
        if is_owned_chain(owned, table, chain) && existing.len() != rules.len() {
            return Comparison::Different(Difference::RuleCount {
                table: table.clone(),
                chain: chain.clone(),
                found: existing.len(),
                planned: rules.len(),
            });
        }
        // A planned rule present more often than planned was applied twice. Each rule is
        // spelt once and counted by its spelling, so this is linear in the chain's rules.
        let mut counts: HashMap<String, (usize, usize)> = HashMap::with_capacity(rules.len());
        let keys: Vec<String> = rules
            .iter()
            .map(|r| normalise(&rule_args(r).join(" ")))
            .collect();
        for key in &keys {
            counts.entry(key.clone()).or_default().0 += 1;
        }
        for saved in existing {
            if let Some((_, seen)) = counts.get_mut(&normalise(saved)) {
                *seen += 1;
            }
        }
        if counts.values().any(|(planned, seen)| seen > planned) {
            return Comparison::Different(Difference::Stacked {
                table: table.clone(),
                chain: chain.clone(),
            });
        }
        unsure.extend(
            rules
                .iter()
                .zip(&keys)
                .filter(|(_, key)| counts[*key].1 == 0)
                .map(|(r, _)| *r),
        );
    }
    // Chains of ours that this plan would not create are drift too.
    let foreign_chain = current.iter().find_map(|(table, chains)| {
        chains
            .keys()
            .filter(|c| is_owned_chain(owned, table, c))
            .find(|c| !planned.contains_key(&(table.clone(), (*c).clone())))
            .map(|c| (table.clone(), c.clone()))
    });
    if let Some((table, chain)) = foreign_chain {
        Comparison::Different(Difference::ExtraChain { table, chain })
    } else if unsure.is_empty() {
        Comparison::Same
    } else {
        Comparison::Unsure(unsure)
    }
}

/// Canonical form of a rule for comparison: iptables-save re-orders and re-spells some matches
/// (`-p tcp` gains `-m tcp`, prefixes and marks are rewritten, `--set-mark` becomes `--set-xmark`,
/// default masks and addresses are printed), so compare the sorted word multiset in the saved
/// spelling, without the implicit protocol modules.
pub fn normalise(rule: &str) -> String {
    let words: Vec<&str> = rule.split_whitespace().collect();
    let mut out: Vec<String> = Vec::with_capacity(words.len());
    let mut i = 0;
    while i < words.len() {
        let (word, next) = (words[i], words.get(i + 1).copied());
        let skip_pair = matches!(
            (word, next),
            ("-m", Some("tcp" | "udp"))
                | ("--nfmask" | "--ctmask", Some("0xffffffff"))
                | ("--on-ip", Some("0.0.0.0" | "::"))
        );
        if skip_pair {
            i += 2;
            continue;
        }
        let previous = i.checked_sub(1).map(|p| words[p]);
        let w = match (word, previous) {
            ("--set-mark", _) => "--set-xmark".to_string(),
            // REDIRECT's `--to-port` is saved as `--to-ports`.
            ("--to-port", _) => "--to-ports".to_string(),
            (value, Some("--set-mark")) if !value.contains('/') => {
                format!("{}/0xffffffff", hex_mark(value))
            }
            (value, Some("--mark" | "--tproxy-mark" | "--set-mark" | "--set-xmark")) => {
                value.split('/').map(hex_mark).collect::<Vec<_>>().join("/")
            }
            (w, _) => {
                let w = w.strip_suffix("/32").unwrap_or(w);
                w.strip_suffix("/128").unwrap_or(w).to_string()
            }
        };
        out.push(w);
        i += 1;
    }
    out.sort();
    out.join(" ")
}

/// A mark as iptables-save prints it (hex); anything unparsable stays as written.
fn hex_mark(value: &str) -> String {
    let parsed = match value.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => value.parse::<u32>().ok(),
    };
    parsed.map_or_else(|| value.to_string(), |n| format!("{n:#x}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAVED: &str = "# Generated by iptables-nft-save v1.8.9\n*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:ISTIO_OUTPUT - [0:0]\n:ISTIO_REDIRECT - [0:0]\n-A OUTPUT -j ISTIO_OUTPUT\n-A OUTPUT -p tcp -j RETURN\n-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN\n-A ISTIO_OUTPUT -j ISTIO_REDIRECT\n-A ISTIO_REDIRECT -p tcp -m tcp -j REDIRECT --to-ports 15001\nCOMMIT\n*filter\n:INPUT ACCEPT [0:0]\n:ISTIO_FW - [0:0]\n-A ISTIO_FW -j ACCEPT\nCOMMIT\n";

    #[test]
    fn parses_save_output() {
        let state = parse_save(SAVED);
        assert_eq!(
            state["nat"]["ISTIO_OUTPUT"],
            vec!["-d 127.0.0.1/32 -j RETURN", "-j ISTIO_REDIRECT"]
        );
        assert!(state["nat"]["PREROUTING"].is_empty());
    }

    #[test]
    fn a_user_chain_named_istio_is_not_ours() {
        let state = parse_save("*filter\n:ISTIO_FW - [0:0]\n-A ISTIO_FW -j ACCEPT\nCOMMIT\n");
        assert!(!has_owned_chains(&state));
        assert!(has_owned_chains(&parse_save(SAVED)));
    }

    #[test]
    fn splits_table_sections_and_quoted_words() {
        assert_eq!(
            table_section(SAVED, "filter").unwrap(),
            "*filter\n:INPUT ACCEPT [0:0]\n:ISTIO_FW - [0:0]\n-A ISTIO_FW -j ACCEPT\nCOMMIT\n"
        );
        assert!(table_section(SAVED, "raw").is_none());
        assert_eq!(
            rule_words(r#"-m comment --comment "a \"b\" c" -j ISTIO_OUTPUT"#),
            [
                "-m",
                "comment",
                "--comment",
                r#"a "b" c"#,
                "-j",
                "ISTIO_OUTPUT"
            ]
        );
    }

    #[test]
    fn a_planned_rule_applied_twice_is_drift() {
        let rules = crate::rules::capture::build(&Default::default());
        let mut text = String::from("*nat\n");
        for rule in &rules.v4 {
            text.push_str(&format!(
                "-A {} {}\n",
                rule.chain,
                rule_args(rule).join(" ")
            ));
        }
        text.push_str("COMMIT\n");
        assert!(matches!(
            compare_with_plan(&parse_save(&text), &rules.v4),
            Comparison::Same
        ));
        text = text.replace("COMMIT", "-A OUTPUT -j ISTIO_OUTPUT\nCOMMIT");
        assert!(matches!(
            compare_with_plan(&parse_save(&text), &rules.v4),
            Comparison::Different(Difference::Stacked { .. })
        ));
    }

    /// Counting each planned rule against every saved one (and back) would take n² rule
    /// spellings (10⁹ here); counting by spelling takes a moment. The bound is generous.
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
        let mut text = String::from("*nat\n");
        for rule in &rules.v4 {
            text.push_str(&format!(
                "-A {} {}\n",
                rule.chain,
                rule_args(rule).join(" ")
            ));
        }
        text.push_str("COMMIT\n");
        let state = parse_save(&text);
        let started = std::time::Instant::now();
        assert!(matches!(
            compare_with_plan(&state, &rules.v4),
            Comparison::Same
        ));
        assert!(holds_any_of(&state, &rules.v4));
        let took = started.elapsed();
        assert!(took < std::time::Duration::from_secs(10), "{took:?}");
    }

    #[test]
    fn normalise_ignores_implicit_modules_and_host_prefixes() {
        assert_eq!(
            normalise("-p tcp -m tcp --dport 15008 -j RETURN"),
            normalise("-p tcp --dport 15008 -j RETURN")
        );
        assert_eq!(
            normalise("-d 127.0.0.1 -j RETURN"),
            normalise("-d 127.0.0.1/32 -j RETURN")
        );
    }

    #[test]
    fn normalise_spells_marks_as_iptables_save_does() {
        for (planned, saved) in [
            (
                "-p tcp -m mark --mark 1337 -j CONNMARK --save-mark",
                "-p tcp -m mark --mark 0x539 -j CONNMARK --save-mark --nfmask 0xffffffff --ctmask 0xffffffff",
            ),
            (
                "! -d 127.0.0.1/32 -p tcp -o lo -m owner --uid-owner 1337 -j MARK --set-mark 1338",
                "! -d 127.0.0.1/32 -o lo -p tcp -m owner --uid-owner 1337 -j MARK --set-xmark 0x53a/0xffffffff",
            ),
            (
                "! -d 127.0.0.1/32 -p tcp -j TPROXY --tproxy-mark 1337/0xffffffff --on-port 15006",
                "! -d 127.0.0.1/32 -p tcp -j TPROXY --on-port 15006 --on-ip 0.0.0.0 --tproxy-mark 0x539/0xffffffff",
            ),
        ] {
            assert_eq!(normalise(planned), normalise(saved), "{planned}");
        }
    }
}
