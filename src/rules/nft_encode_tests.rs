use super::super::nft_canon::canonical;
use super::super::nft_kernel_decode::{AnonSets, decode_kernel};
use super::super::nft_model::expr::*;
use super::super::nft_model::{MaskSpelling, MaskedMark};
use super::super::nla::to_bytes;
use super::*;

fn one(exprs: Vec<NftExpr>) -> NftRuleSet {
    NftRuleSet {
        rules: vec![NftRule {
            table: NftTable::SidecarNat,
            chain: "output".into(),
            index: None,
            exprs,
        }],
    }
}

/// Encodes one rule and reads its NEWRULE record back with the kernel decoder, its port set
/// (named as the rule names it) taken from the NEWSETELEM message.
fn round_trip(exprs: Vec<NftExpr>) -> Vec<NftExpr> {
    let tx = NftTransaction::new(vec![NftStep::Replace {
        set: one(exprs),
        tables: NftTable::SIDECAR.to_vec(),
    }]);
    let messages = encode(&tx).expect("encodes");
    let mut anon = AnonSets::new();
    let mut rules = Vec::new();
    for m in &messages {
        match m.kind {
            NFT_MSG_NEWSETELEM => {
                let bytes = to_bytes(&m.attrs);
                let keys = super::super::nft_kernel_decode::element_keys(&[bytes]);
                anon.insert(("istio-proxy-nat".into(), ANON_SET.into()), keys);
            }
            NFT_MSG_NEWRULE => rules.push(to_bytes(&m.attrs)),
            _ => {}
        }
    }
    let state = decode_kernel(&[], &[], &[], &rules, &anon, "istio-");
    let chain = &state.tables["istio-proxy-nat"].chains["output"];
    chain.rules[0].clone().expect("not foreign")
}

#[test]
fn every_statement_reads_back_as_the_decoder_reads_nft_own_encoding() {
    let masked = MaskedMark {
        value: 0x539,
        mask: 0xfff,
    };
    let cases = vec![
        vec![
            oif("lo", false),
            iif("eth+"),
            tcp(),
            daddr(Family::V4, "127.0.0.6/32", true),
            dport(Proto::Tcp, "15008", true),
            NftExpr::Counter,
            jump("istio-in-redirect"),
        ],
        vec![
            daddr(Family::V6, "fd00::/7", false),
            saddr(Family::V4, "10.0.0.0/8"),
            ports(Proto::Udp, Side::Dst, &["53", "15008"], true),
            NftExpr::Owner {
                key: OwnerKind::Gid,
                id: "1337".into(),
                negate: true,
                with_meta: false,
            },
            NftExpr::Return,
        ],
        vec![
            NftExpr::CtState(vec![NftCtState::Related, NftCtState::Established]),
            NftExpr::Addr {
                family: Family::V4,
                side: Side::Dst,
                value: AddrValue::Set("probes".into()),
                negate: false,
            },
            NftExpr::SnatTo("169.254.7.127".into()),
        ],
        vec![
            NftExpr::MarkMasked {
                key: MarkKey::Meta,
                mark: masked,
                negate: false,
                spelling: MaskSpelling::And,
            },
            NftExpr::Mark {
                key: MarkKey::Ct,
                value: "0x539".into(),
                negate: true,
            },
            NftExpr::CtMarkSet(MarkSource::Masked(masked)),
            NftExpr::MetaMarkSet(MarkSource::Other),
            NftExpr::CtMarkSet(MarkSource::Other),
            NftExpr::MetaMarkSet(MarkSource::Value("1337".into())),
            NftExpr::Accept,
        ],
        vec![tcp(), redirect("15001")],
        vec![
            tcp(),
            NftExpr::Tproxy {
                family: Family::V6,
                port: "15006".into(),
            },
        ],
        vec![NftExpr::CtZoneSet(3), NftExpr::Drop],
    ];
    for exprs in cases {
        assert_eq!(round_trip(exprs.clone()), canonical(&exprs), "{exprs:?}");
    }
}

#[test]
fn a_port_without_its_protocol_gets_nfts_dependency_and_inserts_land_in_place() {
    // `tcp dport 53` alone: nft adds `meta l4proto tcp`, which reads back as the port alone.
    let exprs = vec![dport(Proto::Tcp, "53", false)];
    assert_eq!(round_trip(exprs.clone()), canonical(&exprs));
    let rule = |index, name: &str| NftRule {
        table: NftTable::SidecarNat,
        chain: "prerouting".into(),
        index,
        exprs: vec![iif(name), NftExpr::Return],
    };
    let set = NftRuleSet {
        rules: vec![rule(None, "a"), rule(Some(0), "b")],
    };
    let tx = NftTransaction::new(vec![NftStep::Replace {
        set,
        tables: vec![NftTable::SidecarNat],
    }]);
    let names: Vec<String> = encode(&tx)
        .unwrap()
        .into_iter()
        .filter(|m| m.kind == NFT_MSG_NEWRULE)
        .map(|m| m.what)
        .collect();
    assert_eq!(
        names,
        [
            "add rule inet istio-proxy-nat prerouting iifname b return",
            "add rule inet istio-proxy-nat prerouting iifname a return"
        ]
    );
}

#[test]
fn owner_names_and_bad_numbers_are_refused_naming_them() {
    let tx = NftTransaction::new(vec![NftStep::Replace {
        set: one(vec![NftExpr::Owner {
            key: OwnerKind::Gid,
            id: "java".into(),
            negate: false,
            with_meta: false,
        }]),
        tables: vec![NftTable::SidecarNat],
    }]);
    let err = encode(&tx).unwrap_err().to_string();
    assert!(err.contains("java"), "{err}");
}

#[test]
fn steps_render_as_nft_text() {
    let tx = NftTransaction::new(vec![
        NftStep::Remove(vec![NftTable::SidecarRaw]),
        NftStep::DeclareSets(vec![NamedSet {
            table: "istio-ambient-nat",
            name: "s4",
            kind: SetKind::Ipv4Addr,
            comment: "c",
        }]),
    ]);
    assert_eq!(
        tx.render(),
        "add table inet istio-proxy-raw\ndelete table inet istio-proxy-raw\n\
         add table inet istio-ambient-nat\n\
         add set inet istio-ambient-nat s4 { type ipv4_addr ; comment \"c\" ; }\n"
    );
    assert!(!tx.is_empty());
    assert!(NftTransaction::default().is_empty());
}
