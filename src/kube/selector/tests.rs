use super::testing::labels;
use super::*;
use k8s_openapi::api::core::v1::NodeSelectorTerm;
use serde_json::json;

fn structured(v: serde_json::Value) -> Result<Selector, SelectorError> {
    let sel: LabelSelector = serde_json::from_value(v).expect("selector JSON");
    Selector::compile(&sel)
}

#[test]
fn each_operator_structured() {
    let l = labels(&[("a", "1"), ("mode", "ambient")]);
    let expr = |e: serde_json::Value| {
        structured(json!({"matchExpressions": [e]}))
            .expect("valid")
            .matches(&l)
    };
    assert!(expr(
        json!({"key": "a", "operator": "In", "values": ["1", "2"]})
    ));
    assert!(!expr(
        json!({"key": "a", "operator": "In", "values": ["2"]})
    ));
    assert!(!expr(
        json!({"key": "b", "operator": "In", "values": ["1"]})
    ));
    assert!(!expr(
        json!({"key": "a", "operator": "NotIn", "values": ["1"]})
    ));
    assert!(expr(
        json!({"key": "a", "operator": "NotIn", "values": ["2"]})
    ));
    assert!(
        expr(json!({"key": "b", "operator": "NotIn", "values": ["1"]})),
        "absent matches NotIn"
    );
    assert!(expr(json!({"key": "a", "operator": "Exists"})));
    assert!(!expr(json!({"key": "b", "operator": "Exists"})));
    assert!(expr(json!({"key": "b", "operator": "DoesNotExist"})));
    assert!(!expr(json!({"key": "a", "operator": "DoesNotExist"})));
    let ml = structured(json!({"matchLabels": {"mode": "ambient", "a": "1"}})).expect("valid");
    assert!(ml.matches(&l));
    assert!(!ml.matches(&labels(&[("mode", "ambient")])));
}

#[test]
fn empty_selector_matches_everything() {
    let empty = structured(json!({})).expect("valid");
    assert!(empty.matches(&labels(&[])));
    assert!(empty.matches(&labels(&[("x", "y")])));
    assert!(Selector::parse("").expect("valid").matches(&labels(&[])));
}

#[test]
fn bad_structured_selectors_are_named() {
    let err = |v| structured(v).expect_err("invalid").to_string();
    assert_eq!(
        err(json!({"matchExpressions": [{"key": "a", "operator": "Bogus"}]})),
        "unknown operator \"Bogus\" on key \"a\" (want In, NotIn, Exists, DoesNotExist)"
    );
    assert_eq!(
        err(json!({"matchExpressions": [{"key": "a", "operator": "In"}]})),
        "operator In on key \"a\" needs values"
    );
    assert_eq!(
        err(json!({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]})),
        "operator Exists on key \"a\" takes no values"
    );
    assert_eq!(
        err(json!({"matchExpressions": [{"key": "", "operator": "Exists"}]})),
        "invalid label key: \"\" is not a valid Kubernetes qualified name (label key or annotation name): it is empty"
    );
    // Keys and values follow the API server's rules (kube::names), not a loose charset.
    assert!(
        err(json!({"matchLabels": {"Team.IO/app": "x"}})).contains("invalid label key"),
        "upper-case prefix"
    );
    assert!(err(json!({"matchLabels": {"a/b/c": "x"}})).contains("more than one '/'"));
    assert!(err(json!({"matchLabels": {"app": "a b"}})).contains("invalid value on key \"app\""));
    assert!(err(json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["ok", "-bad"]}]}))
        .contains("-bad"));
    assert!(
        err(json!({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}))
            .contains("unknown operator \"Gt\""),
        "Gt/Lt are node-selector only"
    );
}

#[test]
fn string_form_each_operator() {
    let l = labels(&[("app", "a"), ("istio.io/dataplane-mode", "ambient")]);
    let cases = [
        ("app=a", true),
        ("app==a", true),
        ("app!=a", false),
        ("other!=x", true),
        ("app", true),
        ("!app", false),
        ("!other", true),
        ("app in (a, b),istio.io/dataplane-mode", true),
        ("app notin (a)", false),
        ("app notin (x,y)", true),
        ("missing in (a)", false),
        (" , app=a ,", true),
        ("", true),
    ];
    for (text, expected) in cases {
        let sel = Selector::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(sel.matches(&l), expected, "{text}");
    }
}

#[test]
fn string_form_is_the_same_model() {
    let parsed = parse("a=b,c!=d,e in (x,y),!f,g").expect("parses");
    let expected: LabelSelector = serde_json::from_value(json!({"matchExpressions": [
        {"key": "a", "operator": "In", "values": ["b"]},
        {"key": "c", "operator": "NotIn", "values": ["d"]},
        {"key": "e", "operator": "In", "values": ["x", "y"]},
        {"key": "f", "operator": "DoesNotExist"},
        {"key": "g", "operator": "Exists"},
    ]}))
    .expect("model JSON");
    assert_eq!(parsed, expected);
}

#[test]
fn bad_string_form_is_named() {
    let err = |t: &str| Selector::parse(t).expect_err(t).to_string();
    assert_eq!(
        err("a in b"),
        "invalid label value set \"b\": expected (v1,v2,...)"
    );
    assert!(err("bad key=1").starts_with("invalid label key: \"bad key\""));
    assert_eq!(err("a in ()"), "operator In on key \"a\" needs values");
    assert!(err("!").starts_with("invalid label key: \"\""));
    assert!(err("a=b/c").starts_with("invalid value on key \"a\""));
    assert!(Selector::parse("a=,b.io/c=x_y").is_ok());
}

#[test]
fn strict_deserialization_refuses_unknown_fields_and_drops_empty_lists() {
    #[derive(serde::Deserialize)]
    struct Holder {
        #[serde(default, deserialize_with = "deserialize_strict")]
        sel: Option<LabelSelector>,
    }
    let read = |v| serde_json::from_value::<Holder>(v).map(|h| h.sel);
    assert!(read(json!({"sel": {"matchLabel": {"a": "b"}}})).is_err());
    assert!(
        read(
            json!({"sel": {"matchExpressions": [{"key": "a", "operator": "Exists", "extra": 1}]}})
        )
        .is_err()
    );
    assert_eq!(read(json!({})).expect("absent"), None);
    assert_eq!(read(json!({"sel": null})).expect("null"), None);
    let sel = read(json!({"sel": {"matchLabels": {}, "matchExpressions": [{"key": "a", "operator": "Exists", "values": []}]}}))
        .expect("reads")
        .expect("present");
    assert_eq!(
        serde_json::to_value(&sel).expect("serializes"),
        json!({"matchExpressions": [{"key": "a", "operator": "Exists"}]})
    );
}

fn req(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: key.to_string(),
        operator: op.to_string(),
        values: Some(values.iter().map(|v| v.to_string()).collect()),
    }
}

#[test]
fn node_selector_semantics() {
    let l = labels(&[("pool", "mesh"), ("cpu", "8")]);
    let sel = |terms: Vec<NodeSelectorTerm>| NodeSelector {
        node_selector_terms: terms,
    };
    let term =
        |e: Vec<NodeSelectorRequirement>, f: Vec<NodeSelectorRequirement>| NodeSelectorTerm {
            match_expressions: Some(e),
            match_fields: Some(f),
        };
    let one = |r: NodeSelectorRequirement| sel(vec![term(vec![r], vec![])]);
    for (r, want) in [
        (req("pool", "In", &["mesh"]), true),
        (req("pool", "NotIn", &["mesh"]), false),
        (req("cpu", "Gt", &["4"]), true),
        (req("cpu", "Lt", &["4"]), false),
    ] {
        let why = format!("{r:?}");
        assert_eq!(node_selector_matches(&one(r), &l, "n1"), want, "{why}");
    }
    assert!(
        !node_selector_matches(&one(req("pool", "Gt", &["4"])), &l, "n1"),
        "not a number"
    );
    assert!(!node_selector_matches(
        &one(req("pool", "Bogus", &[])),
        &l,
        "n1"
    ));
    assert!(node_selector_matches(
        &sel(vec![
            term(vec![req("pool", "In", &["other"])], vec![]),
            term(
                vec![req("cpu", "Gt", &["4"]), req("gpu", "DoesNotExist", &[])],
                vec![]
            ),
        ]),
        &l,
        "n1"
    ));
    let by_name = |n: &str| sel(vec![term(vec![], vec![req("metadata.name", "In", &[n])])]);
    assert!(node_selector_matches(&by_name("n1"), &l, "n1"));
    assert!(!node_selector_matches(&by_name("n2"), &l, "n1"));
    assert!(
        !node_selector_matches(&sel(vec![term(vec![], vec![])]), &l, "n1"),
        "empty term matches nothing"
    );
}
