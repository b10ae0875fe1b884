//! nftables renderer: a rule list for `inet` tables rendered as one `nft -f -` transaction, in the
//! layout knftables produces (Istio's nftables goldens): per table `add table`, `flush table`, the
//! chains that have rules (base chains with their hook spec first, then regular chains in a fixed
//! order), then the rules, with indexed rules as `insert ... index N` where needed.

/// Chain names of the sidecar nftables tables.
pub mod sidecar_chain {
    pub const PREROUTING: &str = "prerouting";
    pub const OUTPUT: &str = "output";
    pub const INBOUND: &str = "istio-inbound";
    pub const REDIRECT: &str = "istio-redirect";
    pub const IN_REDIRECT: &str = "istio-in-redirect";
    pub const ISTIO_OUTPUT: &str = "istio-output";
    pub const OUTPUT_DNS: &str = "istio-output-dns";
    pub const DIVERT: &str = "istio-divert";
    pub const TPROXY: &str = "istio-tproxy";
    pub const DROP: &str = "istio-drop";
}

/// Chain names of the ambient nftables tables.
pub mod ambient_chain {
    pub const PREROUTING: &str = "prerouting";
    pub const OUTPUT: &str = "output";
    pub const POSTROUTING: &str = "postrouting";
    pub const ISTIO_PREROUTING: &str = "istio-prerouting";
    pub const ISTIO_OUTPUT: &str = "istio-output";
}

/// The tables our rule sets use (all family `inet`, both IP versions in one ruleset).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NftTable {
    SidecarNat,
    SidecarMangle,
    SidecarRaw,
    /// In-pod ambient tables.
    AmbientNat,
    AmbientMangle,
    AmbientRaw,
    /// The host's ambient table (probe SNAT); same name as the in-pod nat table, other netns.
    AmbientHostNat,
}

struct ChainSpec {
    name: &'static str,
    /// `type X hook Y priority N` for base chains.
    base: Option<&'static str>,
}

const fn base(name: &'static str, spec: &'static str) -> ChainSpec {
    ChainSpec {
        name,
        base: Some(spec),
    }
}

const fn regular(name: &'static str) -> ChainSpec {
    ChainSpec { name, base: None }
}

impl NftTable {
    /// Rendering order of the tables.
    pub const SIDECAR: [NftTable; 3] = [
        NftTable::SidecarNat,
        NftTable::SidecarMangle,
        NftTable::SidecarRaw,
    ];
    pub const AMBIENT_POD: [NftTable; 3] = [
        NftTable::AmbientNat,
        NftTable::AmbientMangle,
        NftTable::AmbientRaw,
    ];

    pub fn name(self) -> &'static str {
        match self {
            NftTable::SidecarNat => "istio-proxy-nat",
            NftTable::SidecarMangle => "istio-proxy-mangle",
            NftTable::SidecarRaw => "istio-proxy-raw",
            NftTable::AmbientNat | NftTable::AmbientHostNat => "istio-ambient-nat",
            NftTable::AmbientMangle => "istio-ambient-mangle",
            NftTable::AmbientRaw => "istio-ambient-raw",
        }
    }

    fn chains(self) -> &'static [ChainSpec] {
        use ambient_chain as a;
        use sidecar_chain as s;
        const NAT: &[ChainSpec] = &[
            base(s::PREROUTING, "type nat hook prerouting priority -100"),
            base(s::OUTPUT, "type nat hook output priority -100"),
            regular(s::INBOUND),
            regular(s::REDIRECT),
            regular(s::IN_REDIRECT),
            regular(s::ISTIO_OUTPUT),
            regular(s::OUTPUT_DNS),
        ];
        const MANGLE: &[ChainSpec] = &[
            base(s::PREROUTING, "type filter hook prerouting priority -150"),
            base(s::OUTPUT, "type route hook output priority -150"),
            regular(s::DIVERT),
            regular(s::TPROXY),
            regular(s::INBOUND),
            regular(s::DROP),
        ];
        const RAW: &[ChainSpec] = &[
            base(s::PREROUTING, "type filter hook prerouting priority -300"),
            base(s::OUTPUT, "type filter hook output priority -300"),
            regular(s::INBOUND),
            regular(s::OUTPUT_DNS),
        ];
        const AMBIENT_NAT: &[ChainSpec] = &[
            base(a::PREROUTING, "type nat hook prerouting priority -100"),
            base(a::OUTPUT, "type nat hook output priority -100"),
            regular(a::ISTIO_PREROUTING),
            regular(a::ISTIO_OUTPUT),
        ];
        const AMBIENT_MANGLE: &[ChainSpec] = &[
            base(a::PREROUTING, "type filter hook prerouting priority -150"),
            base(a::OUTPUT, "type route hook output priority -150"),
            regular(a::ISTIO_PREROUTING),
            regular(a::ISTIO_OUTPUT),
        ];
        const AMBIENT_RAW: &[ChainSpec] = &[
            base(a::PREROUTING, "type filter hook prerouting priority -300"),
            base(a::OUTPUT, "type filter hook output priority -300"),
            regular(a::ISTIO_PREROUTING),
            regular(a::ISTIO_OUTPUT),
        ];
        const AMBIENT_HOST: &[ChainSpec] = &[base(
            a::POSTROUTING,
            "type nat hook postrouting priority 100",
        )];
        match self {
            NftTable::SidecarNat => NAT,
            NftTable::SidecarMangle => MANGLE,
            NftTable::SidecarRaw => RAW,
            NftTable::AmbientNat => AMBIENT_NAT,
            NftTable::AmbientMangle => AMBIENT_MANGLE,
            NftTable::AmbientRaw => AMBIENT_RAW,
            NftTable::AmbientHostNat => AMBIENT_HOST,
        }
    }
}

pub use super::nft_model::{NftRule, NftRuleSet};

/// The rules of `set` in `table`, in program order.
fn rules_of(set: &NftRuleSet, table: NftTable) -> Vec<&NftRule> {
    set.rules.iter().filter(|r| r.table == table).collect()
}

/// The chains the transaction declares in `table` for `rules` (the table's rules), in order:
/// name and, for a base chain, its `type X hook Y priority N`.
fn declared(table: NftTable, rules: &[&NftRule]) -> Vec<&'static ChainSpec> {
    // A chain only jumped to is declared too (an ingress pod's empty `istio-prerouting`; the
    // DNS chains when every listed server is IPv6 on an IPv4-only pod): netfilter refuses a
    // jump to a chain that does not exist, and a jump to an empty one returns.
    let used = |name: &str| {
        rules
            .iter()
            .any(|r| r.chain == name || r.jump_target() == Some(name))
    };
    table.chains().iter().filter(|c| used(c.name)).collect()
}

/// How `set` leaves `table` once applied: each declared chain (base chains with their hook spec)
/// and its rules in the order the kernel holds them (an `insert ... index N` lands at N). None
/// when the table has no rules (the transaction leaves it alone). What a read-back is compared
/// with ([`super::nft_decode::expected`]).
pub fn placed(set: &NftRuleSet, table: NftTable) -> Option<Vec<PlacedChain<'_>>> {
    let rules = rules_of(set, table);
    if rules.is_empty() {
        return None;
    }
    let mut by_chain: std::collections::HashMap<&str, Vec<(Option<usize>, &NftRule)>> =
        std::collections::HashMap::new();
    for &rule in &rules {
        by_chain
            .entry(rule.chain.as_str())
            .or_default()
            .push((rule.index, rule));
    }
    let chains = declared(table, &rules)
        .into_iter()
        .map(|c| PlacedChain {
            name: c.name,
            base: c.base,
            rules: super::model::place_in_order(by_chain.remove(c.name).unwrap_or_default()),
        })
        .collect();
    Some(chains)
}

/// One chain as a transaction leaves it ([`placed`]).
#[derive(Debug, Clone)]
pub struct PlacedChain<'s> {
    pub name: &'static str,
    /// `type X hook Y priority N` for a base chain.
    pub base: Option<&'static str>,
    pub rules: Vec<&'s NftRule>,
}

/// The transaction that replaces our tables with `set` (tables without rules are left alone).
pub fn render_transaction(set: &NftRuleSet, tables: &[NftTable]) -> String {
    let mut out = String::new();
    for &table in tables {
        let rules = rules_of(set, table);
        if rules.is_empty() {
            continue;
        }
        let t = table.name();
        out.push_str(&format!("add table inet {t}\nflush table inet {t}\n"));
        for chain in declared(table, &rules) {
            match chain.base {
                Some(spec) => out.push_str(&format!(
                    "add chain inet {t} {} {{ {spec} ; }}\n",
                    chain.name
                )),
                None => out.push_str(&format!("add chain inet {t} {}\n", chain.name)),
            }
        }
        let mut counts: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
        for rule in rules {
            let count = counts.entry(rule.chain.as_str()).or_default();
            match rule.index {
                Some(index) if *count > 0 && index < *count => {
                    out.push_str(&format!(
                        "insert rule inet {t} {} index {index} {}\n",
                        rule.chain,
                        rule.body()
                    ));
                }
                _ => out.push_str(&format!(
                    "add rule inet {t} {} {}\n",
                    rule.chain,
                    rule.body()
                )),
            }
            *count += 1;
        }
    }
    out
}

/// The transaction that removes our tables (`add` first so a missing table is not an error).
pub fn render_cleanup(tables: &[NftTable]) -> String {
    tables
        .iter()
        .map(|t| format!("add table inet {0}\ndelete table inet {0}\n", t.name()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::nft_model::{NftExpr, expr::iif};
    use super::*;

    fn rule(chain: &str, index: Option<usize>, iface: &str) -> NftRule {
        NftRule {
            table: NftTable::SidecarNat,
            chain: chain.into(),
            index,
            exprs: vec![iif(iface), NftExpr::Counter, NftExpr::Return],
        }
    }

    #[test]
    fn indexed_rules_insert_only_when_needed() {
        let set = NftRuleSet {
            rules: vec![
                rule("prerouting", Some(0), "a"),
                rule("prerouting", Some(0), "b"),
                rule("prerouting", Some(5), "c"),
            ],
        };
        assert_eq!(
            render_transaction(&set, &NftTable::SIDECAR),
            "add table inet istio-proxy-nat\nflush table inet istio-proxy-nat\n\
             add chain inet istio-proxy-nat prerouting { type nat hook prerouting priority -100 ; }\n\
             add rule inet istio-proxy-nat prerouting iifname a counter return\n\
             insert rule inet istio-proxy-nat prerouting index 0 iifname b counter return\n\
             add rule inet istio-proxy-nat prerouting iifname c counter return\n"
        );
    }

    #[test]
    fn ambient_declares_chains_named_by_a_typed_jump_only() {
        let jump_to = |chain: &str, target: &str| NftRule {
            table: NftTable::AmbientNat,
            chain: chain.into(),
            index: None,
            exprs: vec![NftExpr::Jump(target.into())],
        };
        // Only a `Jump` statement declares a chain; other text naming a chain does not.
        let set = NftRuleSet {
            rules: vec![
                jump_to("prerouting", "istio-prerouting"),
                NftRule {
                    exprs: vec![NftExpr::RedirectTo("istio-output".into())],
                    ..jump_to("output", "")
                },
            ],
        };
        let text = render_transaction(&set, &NftTable::AMBIENT_POD);
        assert!(text.contains("add chain inet istio-ambient-nat istio-prerouting\n"));
        assert!(!text.contains("add chain inet istio-ambient-nat istio-output\n"));
    }

    #[test]
    fn cleanup_adds_then_deletes() {
        assert_eq!(
            render_cleanup(&[NftTable::SidecarNat]),
            "add table inet istio-proxy-nat\ndelete table inet istio-proxy-nat\n"
        );
    }
}
