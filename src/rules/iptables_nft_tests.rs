use super::*;
use crate::rules::model::RuleSetBuilder;
use crate::rules::nla::to_bytes;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn one_rule(matches: Vec<Match>, target: Target) -> Vec<NftMessage> {
    let mut b = RuleSetBuilder::new(false);
    b.append(Table::Nat, "ISTIO_INBOUND", matches, target);
    encode(Family::V4, &b.build().v4).expect("encodable")
}

// The expected bytes below were captured (strace) from iptables-nft-restore 1.8.9 applying
// the same rule.
#[test]
fn port_return_rule_matches_iptables_nft() {
    let msgs = one_rule(
        vec![
            Match::Proto(Proto::Tcp),
            Match::DstPort {
                port: "15008".into(),
                negate: false,
                module: None,
            },
        ],
        Target::Return,
    );
    let kinds: Vec<u16> = msgs.iter().map(|m| m.kind).collect();
    assert_eq!(
        kinds,
        [
            NFT_MSG_NEWTABLE,
            NFT_MSG_NEWCHAIN,
            NFT_MSG_NEWTABLE,
            NFT_MSG_NEWRULE
        ]
    );
    assert_eq!(msgs[1].flags, NLM_F_EXCL);
    assert_eq!(msgs[3].flags, NLM_F_CREATE | NLM_F_APPEND);
    // table "nat", chain "ISTIO_INBOUND" (14 bytes with the NUL, padded to 16).
    assert!(
        hex(&to_bytes(&msgs[3].attrs))
            .starts_with("080001006e61740012000200495354494f5f494e424f554e440000")
    );
    let exprs = "24000180090001006d6574610000000014000280080002000000001008000100000000012c00018008000100636d700020000280080001000000000108000200000000000c0003800500010006000000340001800c0001007061796c6f6164002400028008000100000000010800020000000002080003000000000208000400000000022c00018008000100636d700020000280080001000000000108000200000000000c000380060001003aa000002c0001800c000100636f756e746572001c0002800c00010000000000000000000c0002000000000000000000300001800e000100696d6d6564696174650000001c0002800800010000000000100002800c00028008000100fffffffb";
    assert!(
        hex(&to_bytes(&msgs[3].attrs)).contains(exprs),
        "{}",
        hex(&to_bytes(&msgs[3].attrs))
    );
    assert!(
        hex(&to_bytes(&msgs[3].attrs)).ends_with("1400058008000100000000060800020000000000"),
        "compat attribute"
    );
}

#[test]
fn redirect_and_owner_match_iptables_nft() {
    let msgs = one_rule(
        vec![Match::Proto(Proto::Tcp)],
        Target::Redirect {
            port: "15001".into(),
            plural: true,
        },
    );
    assert!(hex(&to_bytes(&msgs[3].attrs)).contains(
        "480001800b0001007461726765740000380002800d00010052454449524543540000000008000200000000001c000300010000000200000000000000000000003a993a9900000000"
    ));
    let msgs = one_rule(
        vec![
            Match::OutIface {
                name: "lo".into(),
                negate: false,
            },
            Match::UidOwner {
                id: "1337".into(),
                negate: true,
            },
        ],
        Target::Return,
    );
    let h = hex(&to_bytes(&msgs[3].attrs));
    assert!(
        h.contains("0c000380070001006c6f0000"),
        "lo with its NUL: {h}"
    );
    assert!(h.contains(
        "440001800a0001006d61746368000000340002800a0001006f776e657200000008000200000000011c0003003905000039050000000000000000000001010000000000002c000180"
    ), "{h}");
}

#[test]
fn first_rule_in_a_builtin_chain_creates_it_once() {
    let mut b = RuleSetBuilder::new(false);
    b.append(Table::Nat, "PREROUTING", vec![], Target::Jump("X".into()));
    b.append(Table::Nat, "PREROUTING", vec![], Target::Return);
    let msgs = encode(Family::V4, &b.build().v4).unwrap();
    let base: Vec<&NftMessage> = msgs
        .iter()
        .filter(|m| m.kind == NFT_MSG_NEWCHAIN && m.flags == NLM_F_CREATE)
        .collect();
    assert_eq!(base.len(), 1);
    // nat/PREROUTING, hook 0 at priority -100, type nat (no policy: see `base_chain`).
    assert_eq!(
        hex(&to_bytes(&base[0].attrs)),
        "080001006e6174000f000300505245524f5554494e470000\
         14000480080001000000000008000200ffffff9c\
         080007006e617400"
    );
}

#[test]
fn prefixes_load_whole_bytes_or_mask() {
    let msgs = one_rule(
        vec![Match::Dst {
            addr: "10.16.0.0/12".into(),
            negate: false,
        }],
        Target::Return,
    );
    assert!(hex(&to_bytes(&msgs[3].attrs)).contains(
        "440001800c0001006269747769736500340002800800010000000001080002000000000108000300000000040c00048008000100fff000000c00058008000100000000002c00018008000100636d700020000280080001000000000108000200000000000c000380080001000a100000"
    ));
    let msgs = one_rule(
        vec![Match::Dst {
            addr: "10.0.0.0/8".into(),
            negate: true,
        }],
        Target::Return,
    );
    let h = hex(&to_bytes(&msgs[3].attrs));
    // payload load 1b @ network + 16; cmp neq 0x0a
    assert!(h.contains("0800030000000010080004000000000"), "{h}");
    assert!(
        h.contains("08000200000000010c000380050001000a000000"),
        "{h}"
    );
}

#[test]
fn unsupported_rules_are_named() {
    let mut b = RuleSetBuilder::new(false);
    b.append(
        Table::Mangle,
        "PREROUTING",
        vec![],
        Target::SetMark("0x539/0xffffffff".into()),
    );
    assert!(encode(Family::V4, &b.build().v4).is_err(), "MARK target");
    let mut b = RuleSetBuilder::new(false);
    b.append(
        Table::Mangle,
        "PREROUTING",
        vec![Match::Mark {
            value: "0x539".into(),
            negate: false,
        }],
        Target::Return,
    );
    assert!(
        encode(Family::V4, &b.build().v4).is_err(),
        "a mark without its mask"
    );
    let mut b = RuleSetBuilder::new(false);
    b.append(Table::Raw, "INPUT", vec![], Target::Return);
    assert!(
        encode(Family::V4, &b.build().v4).is_err(),
        "raw has no INPUT"
    );
    let err = one_rule_err(vec![Match::UidOwner {
        id: "istio-proxy".into(),
        negate: false,
    }]);
    assert!(err.0.contains("istio-proxy"), "{err}");
    let err = one_rule_err(vec![
        Match::Proto(Proto::Tcp),
        Match::DstPort {
            port: "1000:2000".into(),
            negate: false,
            module: None,
        },
    ]);
    assert!(err.0.contains("1000:2000"), "{err}");
}

fn one_rule_err(matches: Vec<Match>) -> Unsupported {
    let mut b = RuleSetBuilder::new(false);
    b.append(Table::Nat, "ISTIO_INBOUND", matches, Target::Return);
    match encode(Family::V4, &b.build().v4).unwrap_err() {
        EncodeError::Unsupported(e) => e,
        other => panic!("{other}"),
    }
}

#[test]
fn an_attribute_too_long_for_netlink_is_refused_not_truncated() {
    // A chain name no iptables accepts, but nothing here may wrap its length silently.
    let long = "X".repeat(70_000);
    let mut b = RuleSetBuilder::new(false);
    b.append(Table::Nat, &long, vec![], Target::Return);
    let err = encode(Family::V4, &b.build().v4).unwrap_err();
    let EncodeError::TooLong { what, source } = &err else {
        panic!("{err}");
    };
    assert!(what.starts_with("create chain nat/XXX"), "{what}");
    assert_eq!(source.kind, 3, "NFTA_CHAIN_NAME");
    assert_eq!(source.len, 4 + 70_001);
}
