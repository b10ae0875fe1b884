use super::values::*;
use super::*;
use std::collections::HashMap;
use std::path::PathBuf;

/// install-cni's argv and env parsed as `main` does (shared with `checks_tests`).
pub(super) fn run(args: &[&str], env: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let map: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mut argv = vec!["install-cni".to_string()];
    argv.extend(args.iter().map(|s| s.to_string()));
    match parse(&argv, &map)? {
        Parsed::Run(c) => Ok(*c),
        Parsed::Exit { text, .. } => Err(ConfigError::Args(text)),
        Parsed::Status(r) => Err(ConfigError::Args(format!("{r:?}"))),
    }
}

fn err_text<T>(r: Result<T, ConfigError>) -> String {
    match r {
        Ok(_) => "no error".to_string(),
        Err(e) => e.to_string(),
    }
}

#[test]
fn unreadable_boolean_variables_are_errors_plain_words_are_read_and_empty_ones_keep_the_default() {
    for var in [
        "CHAINED_CNI_PLUGIN",
        "ISTIO_OWNED_CNI_CONFIG",
        "CNI_CONF_GROUP_READ",
        "SKIP_TLS_VERIFY",
        "AMBIENT_ENABLED",
        "ENABLE_AMBIENT_DETECTION_RETRY",
        "NATIVE_NFTABLES",
        "AMBIENT_DISABLE_SAFE_UPGRADE",
        "REPAIR_ENABLED",
        "REPAIR_DELETE_PODS",
        "REPAIR_LABEL_PODS",
        "REPAIR_REPAIR_PODS",
        "AMBIENT_DNS_CAPTURE",
        "AMBIENT_IPV6",
        "AMBIENT_RECONCILE_POD_RULES_ON_STARTUP",
        "AMBIENT_USE_SCOPED_XTABLES_LOCKING",
        "AMBIENT_ENABLE_AWS_BRANCH_ENI_PROBE",
        "ALLOW_SWITCH_TO_HOST_NS",
        "LOG_AS_JSON",
    ] {
        for value in ["enabled", "maybe", "2"] {
            match run(&[], &[(var, value)]) {
                Err(ConfigError::Invalid { name, value: v, .. }) => {
                    assert_eq!((name, v), (format!("env {var}"), value.to_string()))
                }
                other => panic!("{var}={value:?} was not refused: {other:?}"),
            }
        }
        // Words with a plain meaning are read by it, said and counted (lenient).
        for (value, meant) in [
            ("yes", "true"),
            ("On", "true"),
            ("no", "false"),
            ("OFF", "false"),
        ] {
            let c = run(&[], &[(var, value)]).unwrap_or_else(|e| panic!("{var}={value}: {e}"));
            assert_eq!(c.adjusted.len(), 1, "{var}={value}: {:?}", c.adjusted);
            assert_eq!(c.adjusted[0].setting, var);
            assert_eq!(c.adjusted[0].applied, meant);
            assert!(
                c.warnings
                    .iter()
                    .any(|w| w.contains(&format!("env {var}=\"{value}\"")))
            );
        }
        // viper's rule: an empty variable is unset, so the (safe) default stays.
        assert_eq!(
            run(&[], &[(var, "")]).ok(),
            run(&[], &[]).ok(),
            "{var}=\"\""
        );
    }
}

#[test]
fn defaults_match_istio() {
    let c = run(&[], &[]).expect("defaults parse");
    let i = &c.install;
    assert_eq!(i.mounted_cni_net_dir, PathBuf::from("/host/etc/cni/net.d"));
    assert_eq!(i.cni_conf_name, None);
    assert!(i.chained);
    assert!(!i.istio_owned_cni_config);
    assert_eq!(i.owned_filename, "02-istio-cni.conflist");
    assert_eq!(
        i.cni_bin_dirs,
        vec![
            PathBuf::from("/host/opt/cni/bin"),
            PathBuf::from("/host/secondary-bin-dir")
        ]
    );
    assert_eq!(i.run_dir, PathBuf::from("/var/run/istio-cni"));
    assert_eq!(i.kubeconfig_mode, 0o600);
    assert_eq!(
        i.kube_ca_file,
        PathBuf::from("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
    );
    assert_eq!(i.k8s_service_protocol, "https");
    assert_eq!(i.plugin_log_level, LogLevel::Info);
    assert!(i.enablement_selectors.is_empty());
    assert_eq!(c.health_port, 8000);
    assert_eq!(c.monitoring_port, Some(15014));
    assert!(c.repair.enabled);
    assert!(!c.repair.repair_pods);
    assert_eq!(c.repair.init_container_exit_code, 126);
    assert_eq!(c.repair.init_container_name, "istio-validation");
    assert_eq!(
        c.agent.ztunnel_uds_address,
        PathBuf::from("/var/run/ztunnel/ztunnel.sock")
    );
    assert_eq!(c.host_proc_dir, PathBuf::from("/host/proc"));
    // Istio logs to stdout unless --log_target says otherwise.
    assert_eq!(c.log.target, LogTarget::Stdout);
    assert!(c.warnings.is_empty());
}

#[test]
fn flag_beats_env_beats_default() {
    let c = run(&["--cni-conf-name=a.conf"], &[("CNI_CONF_NAME", "b.conf")]).expect("parses");
    assert_eq!(c.install.cni_conf_name.as_deref(), Some("a.conf"));
    let c = run(&[], &[("CNI_CONF_NAME", "b.conf")]).expect("parses");
    assert_eq!(c.install.cni_conf_name.as_deref(), Some("b.conf"));
    let c = run(
        &["--chained-cni-plugin=false"],
        &[("CHAINED_CNI_PLUGIN", "true")],
    )
    .expect("parses");
    assert!(!c.install.chained);
    let c = run(&["--ambient-enabled"], &[("AMBIENT_ENABLED", "false")]).expect("parses");
    assert!(c.install.ambient_enabled);
    let c = run(&[], &[("CHAINED_CNI_PLUGIN", "")]).expect("empty env = unset");
    assert!(c.install.chained);
}

#[test]
fn host_paths_and_ports_are_configurable() {
    let c = run(
        &[
            "--cni-bin-dirs",
            "/a, /b,",
            "--health-port=0",
            "--service-account-dir=/sa",
        ],
        &[
            ("HOST_PROC_DIR", "/p"),
            ("HOST_NETNS_DIR", "/n"),
            ("MONITORING_PORT", "-1"),
        ],
    )
    .expect("parses");
    assert_eq!(
        c.install.cni_bin_dirs,
        vec![PathBuf::from("/a"), PathBuf::from("/b")]
    );
    assert_eq!(c.health_port, 0);
    assert_eq!(c.install.kube_ca_file, PathBuf::from("/sa/ca.crt"));
    assert_eq!(c.host_proc_dir, PathBuf::from("/p"));
    assert_eq!(c.host_netns_dir, PathBuf::from("/n"));
    assert_eq!(c.monitoring_port, None);
}

#[test]
fn kubeconfig_mode_is_go_base_zero() {
    let mode = |v: &str| run(&[], &[("KUBECONFIG_MODE", v)]).map(|c| c.install.kubeconfig_mode);
    assert_eq!(mode("0600").expect("octal"), 0o600);
    assert_eq!(mode("384").expect("decimal"), 0o600);
    assert_eq!(mode("0o640").expect("0o"), 0o640);
    let e = err_text(mode("rw-------"));
    assert!(
        e.contains("KUBECONFIG_MODE") && e.contains("rw-------"),
        "{e}"
    );
    assert!(err_text(mode("0800")).contains("KUBECONFIG_MODE"));
}

#[test]
fn invalid_values_name_the_variable() {
    let e = err_text(run(&[], &[("HEALTH_PORT", "70000")]));
    assert!(e.contains("env HEALTH_PORT") && e.contains("70000"), "{e}");
    let e = err_text(run(&["--monitoring-port=abc"], &[]));
    assert!(e.contains("--monitoring-port"), "{e}");
    let e = err_text(run(&[], &[("AMBIENT_ENABLED", "maybe")]));
    assert!(e.contains("AMBIENT_ENABLED"), "{e}");
    let e = err_text(run(
        &[],
        &[("AMBIENT_ENABLEMENT_SELECTOR", "- podSelector: [\n")],
    ));
    assert!(e.contains("AMBIENT_ENABLEMENT_SELECTOR"), "{e}");
    let e = err_text(run(
        &[],
        &[("AMBIENT_ENABLEMENT_SELECTOR", "[{\"podSelector\": 3}]")],
    ));
    assert!(e.contains("AMBIENT_ENABLEMENT_SELECTOR"), "{e}");
    let e = err_text(run(&["--log_output_level=cni-agent:loud"], &[]));
    assert!(e.contains("--log-output-level"), "{e}");
    let e = err_text(run(&[], &[("HOST_PROBE_SNAT_IP", "1.2.3")]));
    assert!(e.contains("HOST_PROBE_SNAT_IP"), "{e}");
    let e = err_text(run(&["--cni-conf-name=../x.conf"], &[]));
    assert!(e.contains("--cni-conf-name"), "{e}");
}

#[test]
fn legacy_owned_filename_alias_is_accepted_with_a_warning() {
    let c = run(
        &[],
        &[("ISTIO_OWNED_CNI_CONF_FILENAME", "01-mine.conflist")],
    )
    .expect("parses");
    assert_eq!(c.install.owned_filename, "01-mine.conflist");
    assert!(
        c.warnings
            .iter()
            .any(|w| w.contains("ISTIO_OWNED_CNI_CONF_FILENAME"))
    );
    let c = run(
        &[],
        &[
            ("ISTIO_OWNED_CNI_CONF_FILENAME", "01-mine.conflist"),
            ("ISTIO_OWNED_CNI_CONFIG_FILENAME", "03-right.conflist"),
        ],
    )
    .expect("parses");
    assert_eq!(c.install.owned_filename, "03-right.conflist");
}

#[test]
fn owned_mode_needs_chained_and_ambient() {
    let c = run(&["--istio-owned-cni-config"], &[]).expect("parses");
    assert!(!c.install.owned_mode());
    assert!(!c.warnings.is_empty());
    let c = run(&["--istio-owned-cni-config", "--ambient-enabled"], &[]).expect("parses");
    assert!(c.install.owned_mode());
}

#[test]
fn log_levels_keep_the_plugin_scope_independent() {
    let c = run(&["--log_output_level=cni-agent:warn,cni-plugin:debug"], &[]).expect("parses");
    assert_eq!(c.log.level_of("cni-agent"), LogLevel::Warn);
    assert_eq!(c.install.plugin_log_level, LogLevel::Debug);
    let c = run(&["--log_output_level=error"], &[]).expect("parses");
    assert_eq!(c.log.level_of("cni-agent"), LogLevel::Error);
    assert_eq!(c.install.plugin_log_level, LogLevel::Error);
    let c = run(&["--log_as_json"], &[("LOG_OUTPUT_LEVEL", "default:debug")]).expect("parses");
    assert!(c.log.as_json);
    assert_eq!(c.log.default_level, LogLevel::Debug);
}

#[test]
fn selectors_from_yaml_and_json() {
    let yaml = "- podSelector:\n    matchLabels:\n      istio.io/dataplane-mode: ambient\n";
    let c = run(&[], &[("AMBIENT_ENABLEMENT_SELECTOR", yaml)]).expect("parses");
    assert_eq!(c.install.enablement_selectors.len(), 1);
    let json = r#"[{"namespaceSelector":{"matchExpressions":[{"key":"k","operator":"Exists"}]}}]"#;
    let c = run(&[], &[("AMBIENT_ENABLEMENT_SELECTOR", json)]).expect("parses");
    assert_eq!(
        serde_json::to_string(&c.install.enablement_selectors).expect("serializes"),
        json
    );
    assert!(
        parse_selectors(r#"[{"podSelector":{"matchExpressions":[{"key":"k","operator":"In"}]}}]"#)
            .is_err()
    );
    // The chart's `toYaml` form, with a plain scalar that looks like a bool.
    let chart = "- podSelector:\n    matchLabels:\n      istio.io/dataplane-mode: ambient\n\
                 - podSelector:\n    matchExpressions:\n    - key: istio.io/dataplane-mode\n      \
                 operator: NotIn\n      values:\n      - none\n  namespaceSelector:\n    \
                 matchLabels:\n      enabled: true\n";
    let parsed = parse_selectors(chart).expect("chart YAML parses");
    assert_eq!(parsed.len(), 2);
    assert_eq!(
        serde_json::to_value(&parsed[1]).expect("serializes")["namespaceSelector"]["matchLabels"]["enabled"],
        "true"
    );
    assert!(matches!(
        parse_selectors("- podSelector: [unclosed"),
        Err(SelectorsError::Yaml(_))
    ));
    assert!(matches!(
        parse_selectors(r#"[{"podSelector": 3]"#),
        Err(SelectorsError::Json(_))
    ));
    let err = parse_selectors(
        r#"[{"podSelector":{"matchExpressions":[{"key":"k","operator":"Near"}]}}]"#,
    )
    .expect_err("unknown operator");
    assert!(matches!(err, SelectorsError::Selector(_)), "{err:?}");
    assert!(err.to_string().contains("\"Near\" on key \"k\""), "{err}");
}

#[test]
fn help_lists_flags_with_env_names() {
    let argv = vec!["install-cni".to_string(), "--help".to_string()];
    match parse(&argv, &HashMap::new()) {
        Ok(Parsed::Exit { text, code }) => {
            assert_eq!(code, 0);
            for needle in [
                "--cni-bin-dirs",
                "CNI_BIN_DIRS",
                "--health-port",
                "HEALTH_PORT",
                "KUBECONFIG_MODE",
            ] {
                assert!(text.contains(needle), "help lacks {needle}");
            }
        }
        other => panic!("expected help, got {other:?}"),
    }
}

#[test]
fn unknown_flag_is_rejected() {
    let argv = vec!["install-cni".to_string(), "--no-such-flag=1".to_string()];
    match parse(&argv, &HashMap::new()) {
        Ok(Parsed::Exit { code, .. }) => assert_ne!(code, 0),
        other => panic!("expected an error exit, got {other:?}"),
    }
}

#[test]
fn drift_verify_interval_defaults_to_60s_0_turns_it_off_and_bad_values_name_the_variable() {
    use std::time::Duration;
    let interval = |env: &[(&str, &str)]| run(&[], env).map(|c| c.drift_verify_interval);
    assert_eq!(interval(&[]).unwrap(), Some(Duration::from_secs(60)));
    assert_eq!(interval(&[("DRIFT_VERIFY_INTERVAL", "0")]).unwrap(), None);
    assert_eq!(
        interval(&[("DRIFT_VERIFY_INTERVAL", "2s")]).unwrap(),
        Some(Duration::from_secs(2))
    );
    assert_eq!(
        interval(&[("DRIFT_VERIFY_INTERVAL", "5m")]).unwrap(),
        Some(Duration::from_secs(300))
    );
    let flag = run(
        &["--drift-verify-interval=90s"],
        &[("DRIFT_VERIFY_INTERVAL", "5s")],
    );
    assert_eq!(
        flag.unwrap().drift_verify_interval,
        Some(Duration::from_secs(90))
    );
    for bad in ["500ms", "abc", "-1s"] {
        let e = err_text(interval(&[("DRIFT_VERIFY_INTERVAL", bad)]));
        assert!(
            e.contains("DRIFT_VERIFY_INTERVAL") && e.contains(bad),
            "{bad}: {e}"
        );
    }
    let e = err_text(interval(&[("DRIFT_VERIFY_INTERVAL", "500ms")]));
    assert!(e.contains("at least 1s"), "{e}");
}

#[test]
fn ambient_without_an_enablement_selector_warns_that_nothing_is_enrolled() {
    let warned = |c: &Config| {
        c.warnings
            .iter()
            .any(|w| w.contains("AMBIENT_ENABLEMENT_SELECTOR") && w.contains("no pod"))
    };
    for selector in [None, Some(""), Some("[]")] {
        let mut env = vec![("AMBIENT_ENABLED", "true")];
        env.extend(selector.map(|s| ("AMBIENT_ENABLEMENT_SELECTOR", s)));
        let c = run(&[], &env).expect("parses");
        assert!(warned(&c), "{selector:?}: {:?}", c.warnings);
    }
    let chart = r#"[{"podSelector":{"matchLabels":{"istio.io/dataplane-mode":"ambient"}}}]"#;
    let c = run(
        &[],
        &[
            ("AMBIENT_ENABLED", "true"),
            ("AMBIENT_ENABLEMENT_SELECTOR", chart),
        ],
    )
    .expect("parses");
    assert!(!warned(&c), "{:?}", c.warnings);
    // Sidecar mode never reads it.
    let c = run(&[], &[]).expect("parses");
    assert!(!warned(&c), "{:?}", c.warnings);
}

#[test]
fn listener_idle_timeout_defaults_to_10s_and_bad_values_name_the_variable() {
    use std::time::Duration;
    let timeout = |env: &[(&str, &str)]| run(&[], env).map(|c| c.listener_idle_timeout);
    assert_eq!(timeout(&[]).unwrap(), Duration::from_secs(10));
    assert_eq!(
        timeout(&[("LISTENER_IDLE_TIMEOUT", "1s")]).unwrap(),
        Duration::from_secs(1)
    );
    for bad in ["50ms", "0", "soon"] {
        let e = err_text(timeout(&[("LISTENER_IDLE_TIMEOUT", bad)]));
        assert!(
            e.contains("LISTENER_IDLE_TIMEOUT") && e.contains(bad),
            "{bad}: {e}"
        );
    }
}
