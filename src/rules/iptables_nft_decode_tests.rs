use super::*;
use crate::rules::ambient::sample_inpod_rule_sets;
use crate::rules::iptables_nft::encode;
use crate::rules::model::RuleSetBuilder;
use crate::rules::nf_kernel::NFT_MSG_NEWRULE;
use crate::rules::nla::{Attrs, to_bytes};

/// Every rule the encoder sends for `rules`, decoded from the bytes it would send.
fn round_trip(family: Family, rules: &[Rule]) -> Vec<Rule> {
    encode(family, rules)
        .expect("encodable")
        .into_iter()
        .filter(|m| m.kind == NFT_MSG_NEWRULE)
        .map(|m| {
            decode_rule(family, &to_bytes(&m.attrs), &NoSets)
                .rule
                .unwrap_or_else(|e| panic!("{}: {e}", m.what))
        })
        .collect()
}

fn listed_in_order(rules: &[Rule]) -> Vec<Rule> {
    // The encoder only prepends at 1 or appends: the listing order is the chain order.
    let listed = as_listed(rules);
    let mut out = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for r in rules {
        if seen.insert((r.table, r.chain.clone())) {
            out.extend(listed[&(r.table, r.chain.clone())].iter().cloned());
        }
    }
    out
}

fn sorted(mut rules: Vec<Rule>) -> Vec<String> {
    let mut keys: Vec<String> = rules.drain(..).map(|r| format!("{r:?}")).collect();
    keys.sort();
    keys
}

#[test]
fn the_encoders_rules_decode_to_their_canonical_model() {
    let mut sets = sample_inpod_rule_sets();
    sets.push(crate::rules::capture::build(&Default::default()));
    for set in &sets {
        for family in Family::ALL {
            let rules = set.family(family);
            assert_eq!(
                sorted(round_trip(family, rules)),
                sorted(listed_in_order(rules)),
                "{family:?}"
            );
        }
    }
}

#[test]
fn spellings_with_one_meaning_are_one_canonical_rule() {
    let rule = |matches, target| Rule {
        table: Table::Mangle,
        chain: "ISTIO_X".into(),
        position: Position::Insert(1),
        matches,
        target,
    };
    let a = rule(
        vec![
            Match::Mark {
                value: "1337".into(),
                negate: false,
            },
            Match::Dst {
                addr: "10.1.2.3/8".into(),
                negate: true,
            },
            Match::Proto(Proto::Tcp),
            Match::DstPort {
                port: "080".into(),
                negate: false,
                module: Some(Proto::Tcp),
            },
            Match::Src {
                addr: "0.0.0.0/0".into(),
                negate: false,
            },
        ],
        Target::SetMark("0x539/0xffffffff".into()),
    );
    let c = canonical(&a);
    assert_eq!(
        c.matches,
        vec![
            Match::Proto(Proto::Tcp),
            Match::Dst {
                addr: "10.0.0.0/8".into(),
                negate: true
            },
            Match::Mark {
                value: "0x539".into(),
                negate: false
            },
            Match::DstPort {
                port: "80".into(),
                negate: false,
                module: None
            },
        ]
    );
    assert_eq!(c.target, Target::SetMark("0x539".into()));
    assert_eq!(c.position, Position::Append);
    // A value that does not parse stays as written: never equal to what the kernel holds.
    let odd = rule(
        vec![Match::UidOwner {
            id: "istio-proxy".into(),
            negate: false,
        }],
        Target::Accept,
    );
    assert_eq!(canonical(&odd).matches, odd.matches);
}

#[test]
fn inserts_land_where_iptables_puts_them() {
    let mut b = RuleSetBuilder::new(false);
    for (i, pos) in [None, Some(1), None, Some(2)].into_iter().enumerate() {
        let t = Target::Jump(format!("C{i}"));
        match pos {
            None => b.append(Table::Nat, "ISTIO_IN", vec![], t),
            Some(n) => b.insert(Table::Nat, "ISTIO_IN", n, vec![], t),
        }
    }
    let listed = as_listed(&b.build().v4);
    let order: Vec<String> = listed[&(Table::Nat, "ISTIO_IN".to_string())]
        .iter()
        .map(|r| r.target.jump_chain().unwrap().to_string())
        .collect();
    assert_eq!(order, ["C1", "C3", "C0", "C2"]);
}

/// A rule record with one expression list.
fn record(exprs: Attrs) -> Vec<u8> {
    to_bytes(
        &Attrs::new()
            .string(1, "nat")
            .string(2, "ISTIO_X")
            .u64(3, 7)
            .nested(4, exprs)
            .done()
            .unwrap(),
    )
}

fn elem(exprs: Attrs, name: &str, data: Attrs) -> Attrs {
    exprs.nested(1, Attrs::new().string(1, name).nested(2, data))
}

fn accept(exprs: Attrs) -> Attrs {
    let verdict = Attrs::new().nested(2, Attrs::new().u32(1, 1));
    elem(
        exprs,
        "immediate",
        Attrs::new().u32(1, 0).nested(2, verdict),
    )
}

#[test]
fn what_the_model_cannot_say_is_foreign() {
    // A native nft expression iptables-nft never writes (a limit), in front of the verdict.
    let limit = elem(Attrs::new(), "limit", Attrs::new().u64(1, 10));
    let decoded = decode_rule(Family::V4, &record(accept(limit)), &NoSets);
    assert_eq!(decoded.at, RuleAt::Handle(7));
    let err = decoded.rule.unwrap_err();
    assert!(err.to_string().contains("limit"), "{err}");
    // A compare on another register, a load with no compare.
    let reg2 = elem(
        Attrs::new(),
        "meta",
        Attrs::new().u32(2, NFT_META_L4PROTO).u32(1, 2),
    );
    assert!(
        decode_rule(Family::V4, &record(accept(reg2)), &NoSets)
            .rule
            .is_err()
    );
    let lone = elem(
        Attrs::new(),
        "meta",
        Attrs::new().u32(2, NFT_META_L4PROTO).u32(1, NFT_REG_1),
    );
    assert!(
        decode_rule(Family::V4, &record(accept(lone)), &NoSets)
            .rule
            .is_err()
    );
    // No verdict at all.
    assert!(
        decode_rule(Family::V4, &record(Attrs::new()), &NoSets)
            .rule
            .is_err()
    );
    // A set match whose set this reader cannot name.
    let set = elem(
        Attrs::new(),
        "match",
        Attrs::new().string(1, "set").u32(2, 4).bytes(3, &[0; 40]),
    );
    assert!(
        decode_rule(Family::V4, &record(accept(set)), &NoSets)
            .rule
            .is_err()
    );
    // A foreign rule still says where it jumps.
    let verdict = Attrs::new().nested(2, Attrs::new().u32(1, NFT_JUMP as u32).string(2, "ISTIO_Y"));
    let jump = elem(
        limit_again(),
        "immediate",
        Attrs::new().u32(1, 0).nested(2, verdict),
    );
    let d = decode_rule(Family::V4, &record(jump), &NoSets);
    assert!(d.rule.is_err());
    assert_eq!(d.jumps_to.as_deref(), Some("ISTIO_Y"));
}

fn limit_again() -> Attrs {
    elem(Attrs::new(), "limit", Attrs::new().u64(1, 10))
}
