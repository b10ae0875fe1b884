//! Unit tests of the sidecar redirect decision: the skip order, annotation validation and the
//! capture settings it builds.

use super::*;

fn engine() -> EngineEnv {
    EngineEnv::default()
}

fn sidecar_pod(annotations: &[(&str, &str)]) -> PodInfo {
    let mut p = PodInfo::default();
    p.containers.insert("app".into());
    p.containers.insert(ISTIO_PROXY.into());
    p.annotations.insert(ANN_STATUS.into(), "true".into());
    for (k, v) in annotations {
        p.annotations.insert(k.to_string(), v.to_string());
    }
    p
}

fn annotation_error(p: &PodInfo) -> AnnotationError {
    match redirect(p, &engine()) {
        Err(RedirectError::Annotation(e)) => e,
        other => panic!("expected an annotation error, got {other:?}"),
    }
}

fn capture(p: &PodInfo) -> CaptureSettings {
    match redirect(p, &engine()).unwrap() {
        Redirect::Capture(c) => *c,
        Redirect::None => panic!("expected capture"),
    }
}

#[test]
fn selection_order() {
    let mut p = sidecar_pod(&[]);
    assert_eq!(skip_reason(&p), None);
    p.proxy_type = Some("router".into());
    assert_eq!(skip_reason(&p), Some(Skip::NotSidecarProxy));
    p.proxy_type = Some("sidecar".into());
    p.annotations.insert(ANN_INJECT.into(), "false".into());
    assert_eq!(skip_reason(&p), Some(Skip::InjectionDisabled));
    // The label wins over the annotation.
    p.labels.insert(ANN_INJECT.into(), "true".into());
    assert_eq!(skip_reason(&p), None);
    p.labels.insert(ANN_INJECT.into(), "maybe".into());
    assert_eq!(
        skip_reason(&p),
        None,
        "unparseable inject values are ignored"
    );
    p.proxy_env.insert(ENV_DISABLE_ENVOY.into(), "True".into());
    assert_eq!(skip_reason(&p), Some(Skip::EnvoyDisabled));
    p.containers.insert(ISTIO_INIT.into());
    assert_eq!(skip_reason(&p), Some(Skip::IstioInit));

    let mut p = sidecar_pod(&[]);
    p.annotations.remove(ANN_STATUS);
    assert_eq!(skip_reason(&p), Some(Skip::NoStatus));
    p.containers.remove(ISTIO_PROXY);
    assert_eq!(skip_reason(&p), Some(Skip::NoProxy));
}

#[test]
fn defaults() {
    let c = capture(&sidecar_pod(&[])).config;
    assert_eq!(c.inbound_ports, InboundPorts::All);
    assert_eq!(c.inbound_ports_exclude, vec!["15020", "15021", "15090"]);
    assert_eq!(c.outbound_ports_exclude, vec!["15020"]);
    assert!(c.outbound_ranges_include.wildcard);
    assert_eq!(c.proxy_uids, vec!["1337"]);
    assert_eq!(c.mode, InterceptionMode::Redirect);
}

#[test]
fn exclude_inbound_merging() {
    assert_eq!(exclude_inbound_ports(""), "15020,15021,15090");
    assert_eq!(exclude_inbound_ports("3306"), "3306,15020,15021,15090");
    assert_eq!(exclude_inbound_ports(" 15021,80, "), "15021,80,15020,15090");
    assert_eq!(exclude_inbound_ports("x,x"), "x,15020,15021,15090");
    assert_eq!(
        exclude_inbound_ports("8080, 15020 ,9090"),
        "8080,15020,9090,15021,15090"
    );
}

#[test]
fn explicit_empty_include_inbound_means_no_inbound_capture() {
    let c = capture(&sidecar_pod(&[(ANN_INCLUDE_INBOUND_PORTS, "")])).config;
    assert_eq!(c.inbound_ports, InboundPorts::None);
}

#[test]
fn uid_zero_falls_back_and_custom_ids_are_used() {
    let mut p = sidecar_pod(&[]);
    p.proxy_uid = Some(0);
    p.proxy_gid = Some(1000670001);
    let c = capture(&p).config;
    assert_eq!(c.proxy_uids, vec!["1337"]);
    assert_eq!(c.proxy_gids, vec!["1000670001"]);
}

#[test]
fn interception_modes() {
    let p = sidecar_pod(&[(ANN_INTERCEPTION_MODE, "TPROXY")]);
    assert_eq!(capture(&p).config.mode, InterceptionMode::Tproxy);
    let p = sidecar_pod(&[(ANN_INTERCEPTION_MODE, "NONE")]);
    assert_eq!(redirect(&p, &engine()).unwrap(), Redirect::None);
    let p = sidecar_pod(&[(ANN_INTERCEPTION_MODE, "tproxy")]);
    let e = annotation_error(&p);
    assert_eq!(e.annotation, ANN_INTERCEPTION_MODE);
    assert!(e.to_string().contains("\"tproxy\""), "{e}");
}

#[test]
fn invalid_values_name_the_annotation_and_value() {
    for (key, value) in [
        (ANN_INCLUDE_OUTBOUND_IP_RANGES, "10.0.0.0/8,bogus"),
        (ANN_EXCLUDE_OUTBOUND_IP_RANGES, "10.0.0.1"),
        (ANN_EXCLUDE_OUTBOUND_IP_RANGES, "*"),
        (ANN_INCLUDE_INBOUND_PORTS, "80,http"),
        (ANN_EXCLUDE_INBOUND_PORTS, "70000"),
        (ANN_INCLUDE_OUTBOUND_PORTS, "1,,2"),
        (ANN_EXCLUDE_OUTBOUND_PORTS, "-1"),
        (ANN_EXCLUDE_INTERFACES, "eth0,this-name-is-too-long"),
        (ANN_EXCLUDE_INTERFACES, "eth0,"),
        (ANN_EXCLUDE_INTERFACES, "eth0,a/b"),
        (ANN_INCLUDE_INBOUND_PORTS, "80, 0"),
        (ANN_EXCLUDE_INBOUND_PORTS, "8080,,9090"),
        (ANN_EXCLUDE_INBOUND_PORTS, "8080, 9090,"),
        (ANN_INCLUDE_OUTBOUND_PORTS, "*"),
        (ANN_EXCLUDE_OUTBOUND_IP_RANGES, "10.0.0.0/8,"),
        (ANN_REROUTE_VIRTUAL_INTERFACES, "a b"),
        (ANN_KUBEVIRT_INTERFACES, "abcdefghijklmnop"),
    ] {
        let e = annotation_error(&sidecar_pod(&[(key, value)]));
        assert_eq!(e.annotation, key);
        assert_eq!(e.value, value);
        let msg = e.to_string();
        assert!(msg.contains(key) && msg.contains(value), "{msg}");
    }
}

#[test]
fn valid_lists() {
    let p = sidecar_pod(&[
        (ANN_INCLUDE_OUTBOUND_IP_RANGES, "127.0.0.0/8,fd00::/8"),
        (ANN_EXCLUDE_OUTBOUND_IP_RANGES, "10.0.0.0/8"),
        (ANN_INCLUDE_INBOUND_PORTS, "1111, 2222"),
        (ANN_EXCLUDE_INBOUND_PORTS, "8080, 9090, 15021"),
        (ANN_EXCLUDE_OUTBOUND_PORTS, "5555 ,6666"),
        (ANN_INCLUDE_OUTBOUND_PORTS, " 7777"),
        (ANN_EXCLUDE_INTERFACES, "eth1, net_2"),
        (ANN_KUBEVIRT_INTERFACES, "k0, k1"),
    ]);
    let c = capture(&p).config;
    assert_eq!(c.outbound_ranges_include.v4, vec!["127.0.0.0/8"]);
    assert_eq!(c.outbound_ranges_include.v6, vec!["fd00::/8"]);
    // Every list item reaches the rules trimmed.
    assert_eq!(
        c.inbound_ports,
        InboundPorts::List(vec!["1111".into(), "2222".into()])
    );
    assert_eq!(
        c.inbound_ports_exclude,
        vec!["8080", "9090", "15021", "15020", "15090"]
    );
    assert_eq!(c.outbound_ports_exclude, vec!["5555", "6666"]);
    assert_eq!(c.outbound_ports_include, vec!["7777"]);
    assert_eq!(c.exclude_interfaces, vec!["eth1", "net_2"]);
    assert_eq!(c.reroute_virtual_interfaces, vec!["k0", "k1"]);
    let p = sidecar_pod(&[
        (ANN_INCLUDE_INBOUND_PORTS, " * "),
        (ANN_INCLUDE_OUTBOUND_IP_RANGES, " *"),
    ]);
    let c = capture(&p).config;
    assert_eq!(c.inbound_ports, InboundPorts::All);
    assert!(c.outbound_ranges_include.wildcard);
    let p = sidecar_pod(&[(ANN_EXCLUDE_OUTBOUND_IP_RANGES, " 10.0.0.0/8, fd00::/8 ")]);
    let c = capture(&p).config;
    assert_eq!(c.outbound_ranges_exclude.v4, vec!["10.0.0.0/8"]);
    assert_eq!(c.outbound_ranges_exclude.v6, vec!["fd00::/8"]);
    let p = sidecar_pod(&[
        (ANN_KUBEVIRT_INTERFACES, "k0"),
        (ANN_REROUTE_VIRTUAL_INTERFACES, "r0,r1"),
    ]);
    assert_eq!(
        capture(&p).config.reroute_virtual_interfaces,
        vec!["r0", "r1"]
    );
}

#[test]
fn wildcard_fails_naming_the_annotation_except_for_include_inbound() {
    for key in [
        ANN_EXCLUDE_INBOUND_PORTS,
        ANN_INCLUDE_OUTBOUND_PORTS,
        ANN_EXCLUDE_OUTBOUND_PORTS,
    ] {
        for value in ["*", "80,*"] {
            let err = annotation_error(&sidecar_pod(&[(key, value)]));
            assert_eq!(err.annotation, key);
            assert!(err.to_string().contains(key), "{err}");
        }
    }
    let c = capture(&sidecar_pod(&[(ANN_INCLUDE_INBOUND_PORTS, "*")])).config;
    assert_eq!(c.inbound_ports, InboundPorts::All);
}

#[test]
fn proxy_env_flags() {
    let mut p = sidecar_pod(&[]);
    p.proxy_env.insert(ENV_DNS_CAPTURE.into(), "true".into());
    p.proxy_env.insert(ENV_DUAL_STACK.into(), "1".into());
    p.proxy_env.insert(ENV_INVALID_DROP.into(), "nope".into());
    let s = capture(&p);
    assert!(s.config.redirect_dns && s.config.capture_all_dns && s.dual_stack);
    assert!(!s.config.drop_invalid);
    assert_eq!(s.warnings.len(), 1);
    assert!(s.warnings[0].contains("INVALID_DROP"));
}

#[test]
fn owner_groups_from_engine_env() {
    use crate::rules::capture::OwnerGroups;
    let env = EngineEnv {
        owner_groups_include: Some("a,b".into()),
        loopback_v4: Some("127.0.0.0/8".into()),
        ..EngineEnv::default()
    };
    let Redirect::Capture(c) = redirect(&sidecar_pod(&[]), &env).unwrap() else {
        panic!()
    };
    assert_eq!(
        c.config.owner_groups,
        OwnerGroups::Only(vec!["a".into(), "b".into()])
    );
    assert_eq!(c.config.loopback_v4, "127.0.0.0/8");
    let env = EngineEnv {
        owner_groups_include: Some("a,b c".into()),
        ..env
    };
    let e = redirect(&sidecar_pod(&[]), &env).unwrap_err();
    assert!(
        matches!(e, RedirectError::Value(ref v) if v.value == "b c"),
        "{e}"
    );
}

#[test]
fn engine_env_is_read_through_the_injected_env() {
    let env: std::collections::HashMap<String, String> = [
        ("ISTIO_OUTBOUND_OWNER_GROUPS", "a"),
        ("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", ""),
        ("ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", "127.0.0.2/32"),
        ("ISTIO_IPTABLES_RESTORE_ONLY", "true"),
        ("DRY_RUN_FILE_PATH", "/tmp/out"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let e = EngineEnv::from_env(&env);
    assert_eq!(e.owner_groups_include.as_deref(), Some("a"));
    assert_eq!(e.owner_groups_exclude, None, "empty is unset");
    assert_eq!(e.loopback_v4.as_deref(), Some("127.0.0.2/32"));
    assert!(e.restore_only);
    assert_eq!(e.dry_run, Some(PathBuf::from("/tmp/out")));
    let none = EngineEnv::from_env(&std::collections::HashMap::<String, String>::new());
    assert!(none.dry_run.is_none() && !none.restore_only);
    // The plugin reads every setting it shares with istio-iptables, each under its declaration.
    let mut fed: Vec<&str> = env.keys().map(String::as_str).collect();
    let mut shared: Vec<&str> = crate::cli::settings::shared::decl::ALL
        .iter()
        .filter_map(|s| s.env)
        .collect();
    fed.sort_unstable();
    shared.sort_unstable();
    assert_eq!(fed, shared);
}
