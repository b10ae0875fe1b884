//! Settings that parse but can never work are refused naming the setting and the value;
//! the values Istio's chart and defaults use still pass.

use super::tests::run;
use super::*;

/// Asserts `env` (or `args`) is refused with an error naming `name` and `value`.
fn refused(args: &[&str], env: &[(&str, &str)], name: &str, value: &str, why: &str) {
    match run(args, env) {
        Err(ConfigError::Invalid {
            name: n,
            value: v,
            reason,
        }) => {
            assert_eq!((n.as_str(), v.as_str()), (name, value), "{args:?} {env:?}");
            assert!(reason.contains(why), "{args:?} {env:?}: {reason}");
        }
        other => panic!("{args:?} {env:?} was not refused: {other:?}"),
    }
}

#[test]
fn probe_snat_addresses_must_be_usable_sources_of_their_family() {
    for (var, value, why) in [
        ("HOST_PROBE_SNAT_IP", "fd00::1", "not IPv6"),
        ("HOST_PROBE_SNAT_IP", "0.0.0.0", "unspecified"),
        ("HOST_PROBE_SNAT_IP", "127.0.0.5", "loopback"),
        ("HOST_PROBE_SNAT_IP", "224.0.0.1", "multicast"),
        ("HOST_PROBE_SNAT_IP", "255.255.255.255", "broadcast"),
        ("HOST_PROBE_SNAT_IP", "10.0.0", "expected an IPv4 address"),
        ("HOST_PROBE_SNAT_IPV6", "10.0.0.1", "not IPv4"),
        ("HOST_PROBE_SNAT_IPV6", "::", "unspecified"),
        ("HOST_PROBE_SNAT_IPV6", "::1", "loopback"),
        ("HOST_PROBE_SNAT_IPV6", "ff02::1", "multicast"),
        ("HOST_PROBE_SNAT_IPV6", "::ffff:10.0.0.1", "IPv4-mapped"),
    ] {
        refused(&[], &[(var, value)], &format!("env {var}"), value, why);
    }
    let c = run(
        &[],
        &[
            ("HOST_PROBE_SNAT_IP", "169.254.7.1"),
            ("HOST_PROBE_SNAT_IPV6", "fd16::1"),
        ],
    )
    .unwrap();
    assert_eq!(c.agent.host_probe_snat_ip.to_string(), "169.254.7.1");
}

#[test]
fn relative_path_settings_are_taken_from_the_root_and_said_and_empty_ones_refused() {
    for (var, flag) in [
        ("MOUNTED_CNI_NET_DIR", "--mounted-cni-net-dir"),
        ("CNI_BIN_DIRS", "--cni-bin-dirs"),
        ("CNI_RESULTS_DIR", "--cni-results-dir"),
        ("CNI_AGENT_RUN_DIR", "--cni-agent-run-dir"),
        ("KUBE_CA_FILE", "--kube-ca-file"),
        ("SERVICE_ACCOUNT_DIR", "--service-account-dir"),
        ("HOST_PROC_DIR", "--host-proc-dir"),
        ("HOST_NETNS_DIR", "--host-netns-dir"),
        ("ZTUNNEL_UDS_ADDRESS", "--ztunnel-uds-address"),
    ] {
        let c = run(&[], &[(var, "var/run/x")]).unwrap_or_else(|e| panic!("{var}: {e}"));
        assert_eq!(c.adjusted.len(), 1, "{var}: {:?}", c.adjusted);
        assert_eq!(
            (
                c.adjusted[0].setting.as_str(),
                c.adjusted[0].applied.as_str()
            ),
            (var, "/var/run/x")
        );
        let arg = format!("{flag}=./x");
        let c = run(&[&arg], &[]).unwrap_or_else(|e| panic!("{flag}: {e}"));
        assert_eq!(c.adjusted[0].name, flag);
        assert_eq!(c.adjusted[0].applied, "/x");
        let empty = format!("{flag}= ");
        assert!(run(&[&empty], &[]).is_err(), "{flag}: an empty path");
    }
    // One relative item of a list is enough to say so; the absolute ones stay.
    let c = run(&[], &[("CNI_BIN_DIRS", "/opt/cni/bin, bin")]).unwrap();
    assert_eq!(
        c.install.cni_bin_dirs,
        vec![
            std::path::PathBuf::from("/opt/cni/bin"),
            std::path::PathBuf::from("/bin")
        ]
    );
    assert_eq!(c.adjusted[0].applied, "/opt/cni/bin,/bin");
    // Absolute paths are not adjusted.
    let c = run(&[], &[("MOUNTED_CNI_NET_DIR", "/etc/cni/net.d")]).unwrap();
    assert!(c.adjusted.is_empty(), "{:?}", c.adjusted);
}

#[test]
fn socket_paths_must_fit_sun_path() {
    let long = format!("/{}", "r".repeat(95));
    refused(
        &[],
        &[("CNI_AGENT_RUN_DIR", &long)],
        "env CNI_AGENT_RUN_DIR",
        &long,
        "podfacts/pod.sock",
    );
    let sock = format!("/{}.sock", "z".repeat(102));
    refused(
        &[],
        &[("ZTUNNEL_UDS_ADDRESS", &sock)],
        "env ZTUNNEL_UDS_ADDRESS",
        &sock,
        "Unix socket",
    );
    let fits = format!("/{}", "r".repeat(88));
    assert!(run(&[], &[("CNI_AGENT_RUN_DIR", &fits)]).is_ok());
}

#[test]
fn kubeconfig_mode_keeps_the_token_from_other_users_and_has_no_special_bits() {
    for (value, applied) in [
        ("0644", "0640"),
        ("0666", "0660"),
        ("0602", "0600"),
        ("0601", "0600"),
        ("04600", "0600"),
        ("02600", "0600"),
        ("01600", "0600"),
        ("420", "0640"),
    ] {
        let c = run(&[], &[("KUBECONFIG_MODE", value)]).unwrap_or_else(|e| panic!("{value}: {e}"));
        assert_eq!(
            format!("{:04o}", c.install.kubeconfig_mode),
            applied,
            "{value}"
        );
        assert_eq!(c.adjusted.len(), 1, "{value}: {:?}", c.adjusted);
        assert_eq!(c.adjusted[0].applied, applied);
        assert!(c.warnings[0].contains("env KUBECONFIG_MODE=\"") && c.warnings[0].contains(value));
    }
    for value in ["010000", "-1", "rw-r--r--"] {
        refused(
            &[],
            &[("KUBECONFIG_MODE", value)],
            "env KUBECONFIG_MODE",
            value,
            "expected a file mode",
        );
    }
    for ok in ["0600", "0640", "0400", "384"] {
        let c = run(&[], &[("KUBECONFIG_MODE", ok)]).unwrap_or_else(|e| panic!("{ok}: {e}"));
        assert!(c.adjusted.is_empty(), "{ok}: {:?}", c.adjusted);
    }
}

#[test]
fn repair_exit_code_is_a_process_exit_status() {
    for value in ["256", "-1", "4294967296", "x"] {
        refused(
            &[],
            &[("REPAIR_INIT_CONTAINER_EXIT_CODE", value)],
            "env REPAIR_INIT_CONTAINER_EXIT_CODE",
            value,
            "0-255",
        );
    }
    let c = run(&["--repair-init-container-exit-code=255"], &[]).unwrap();
    assert_eq!(c.repair.init_container_exit_code, 255);
}

#[test]
fn names_labels_and_selectors_follow_kubernetes_rules() {
    for (var, value, why) in [
        ("REPAIR_BROKEN_POD_LABEL_KEY", "bad key", "qualified name"),
        ("REPAIR_BROKEN_POD_LABEL_KEY", "a/b/c", "more than one '/'"),
        (
            "REPAIR_BROKEN_POD_LABEL_KEY",
            "Cni.Istio.io/x",
            "qualified name",
        ),
        (
            "REPAIR_BROKEN_POD_LABEL_KEY",
            &format!("x/{}", "k".repeat(64)),
            "at most 63",
        ),
        ("REPAIR_BROKEN_POD_LABEL_VALUE", "not/valid", "label value"),
        (
            "REPAIR_BROKEN_POD_LABEL_VALUE",
            &"v".repeat(64),
            "at most 63",
        ),
        (
            "REPAIR_SIDECAR_ANNOTATION",
            "sidecar.istio.io/",
            "qualified name",
        ),
        (
            "REPAIR_INIT_CONTAINER_NAME",
            "Istio_Validation",
            "DNS-1123 label",
        ),
        ("REPAIR_NODE_NAME", "node,spec.x=y", "DNS-1123 subdomain"),
        ("REPAIR_LABEL_SELECTORS", "a b=c", "REPAIR_LABEL_SELECTORS"),
        ("REPAIR_LABEL_SELECTORS", "app=a/b", "invalid value"),
        (
            "REPAIR_FIELD_SELECTORS",
            "spec.bogus=x",
            "REPAIR_FIELD_SELECTORS",
        ),
        ("SYSTEM_NAMESPACE", "Istio-System", "DNS-1123 label"),
        ("SYSTEM_NAMESPACE", "istio.system", "DNS-1123 label"),
        ("SYSTEM_NAMESPACE", "../kube-system", "DNS-1123 label"),
        ("POD_NAMESPACE", "a b", "DNS-1123 label"),
        ("POD_NAME", "p/q", "DNS-1123 subdomain"),
        ("NODE_NAME", "node-1,metadata.name=x", "DNS-1123 subdomain"),
        ("EXCLUDE_NAMESPACES", "kube-system,Bad_NS", "\"Bad_NS\""),
    ] {
        refused(&[], &[(var, value)], &format!("env {var}"), value, why);
    }
    // The flag form is named as a flag.
    refused(
        &["--repair-broken-pod-label-key=-x"],
        &[],
        "--repair-broken-pod-label-key",
        "-x",
        "qualified name",
    );
    // An explicit empty value keeps Istio's "any"/"none" meaning where it has one.
    let c = run(
        &[
            "--repair-sidecar-annotation=",
            "--repair-init-container-name=",
            "--repair-broken-pod-label-value=",
        ],
        &[
            ("EXCLUDE_NAMESPACES", "kube-system, istio-system"),
            ("NODE_NAME", "ip-10-0-0-1.ec2.internal"),
        ],
    )
    .unwrap();
    assert_eq!(c.repair.sidecar_annotation, "");
    assert_eq!(c.repair.init_container_name, "");
    assert_eq!(c.repair.broken_pod_label_value, "");
    assert_eq!(
        c.install.exclude_namespaces,
        ["kube-system", "istio-system"]
    );
    refused(
        &["--repair-broken-pod-label-key="],
        &[],
        "--repair-broken-pod-label-key",
        "",
        "empty",
    );
}

#[test]
fn other_values_that_can_never_work() {
    for (var, value, why) in [
        ("MONITORING_PORT", "8000", "health server"),
        ("ISTIO_OWNED_CNI_CONFIG_FILENAME", "02-istio", ".conflist"),
        ("KUBERNETES_SERVICE_PORT", "0", "1-65535"),
        ("KUBERNETES_SERVICE_PORT", "https", "1-65535"),
        ("KUBERNETES_SERVICE_HOST", "10.96.0.1/evil", "host name"),
        ("KUBERNETES_SERVICE_PROTOCOL", "ftp", "https"),
    ] {
        refused(
            &[],
            &[(var, value), ("HEALTH_PORT", "8000")],
            &format!("env {var}"),
            value,
            why,
        );
    }
    refused(
        &["--istio-owned-cni-config-filename="],
        &[],
        "--istio-owned-cni-config-filename",
        "",
        ".conflist",
    );
    // Port 0 (any free port) twice is fine; the API server's address forms all pass.
    assert!(run(&[], &[("HEALTH_PORT", "0"), ("MONITORING_PORT", "0")]).is_ok());
    for host in [
        "10.96.0.1",
        "fd00::1",
        "[fd00::1]",
        "kubernetes.default.svc",
    ] {
        assert!(
            run(&[], &[("KUBERNETES_SERVICE_HOST", host)]).is_ok(),
            "{host}"
        );
    }
}

#[test]
fn host_proc_dir_must_be_a_procfs() {
    assert!(procfs("env HOST_PROC_DIR", "/host/proc", Ok(PROC_SUPER_MAGIC)).is_ok());
    let err = procfs("env HOST_PROC_DIR", "/tmp", Ok(0x0102_1994)).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("env HOST_PROC_DIR")
            && text.contains("\"/tmp\"")
            && text.contains("0x1021994"),
        "{text}"
    );
    let err = procfs("--host-proc-dir", "/nope", Err("ENOENT".into())).unwrap_err();
    assert!(err.to_string().contains("--host-proc-dir") && err.to_string().contains("ENOENT"));
}

#[test]
fn the_node_s_addresses_replace_the_probe_snat_address_of_their_family() {
    // Dual-stack node (`status.hostIPs`): each family gets the node's address.
    let c = run(
        &[],
        &[("HOST_PROBE_SNAT_NODE_IPS", "10.250.0.10,fd00:250::10")],
    )
    .unwrap();
    assert_eq!(c.agent.host_probe_snat_ip.to_string(), "10.250.0.10");
    assert_eq!(c.agent.host_probe_snat_ipv6.to_string(), "fd00:250::10");
    // An IPv4-only node: IPv6 keeps its setting.
    let c = run(
        &[],
        &[
            ("HOST_PROBE_SNAT_NODE_IPS", "10.250.0.10"),
            ("HOST_PROBE_SNAT_IPV6", "fd16::1"),
        ],
    )
    .unwrap();
    assert_eq!(c.agent.host_probe_snat_ip.to_string(), "10.250.0.10");
    assert_eq!(c.agent.host_probe_snat_ipv6.to_string(), "fd16::1");
    refused(
        &[],
        &[("HOST_PROBE_SNAT_NODE_IPS", "10.0.0.1,127.0.0.1")],
        "env HOST_PROBE_SNAT_NODE_IPS",
        "10.0.0.1,127.0.0.1",
        "loopback",
    );
}
