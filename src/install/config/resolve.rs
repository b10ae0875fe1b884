//! flag > env > default for every setting, into the config sections.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

use super::checks::*;
use super::flags::Flags;
use super::sections::*;
use super::values::*;
use crate::kube::names::NameRule;

/// Builds the config from parsed flags and the environment.
pub fn from_flags(f: &Flags, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
    let r = Resolver { env };
    let mut warnings = Vec::new();

    let chained = r.boolean(&f.chained_cni_plugin, "CHAINED_CNI_PLUGIN", true)?;
    let owned = r.boolean(&f.istio_owned_cni_config, "ISTIO_OWNED_CNI_CONFIG", false)?;
    let ambient_enabled = r.boolean(&f.ambient_enabled, "AMBIENT_ENABLED", false)?;

    // Istio bug B1: the chart writes ISTIO_OWNED_CNI_CONF_FILENAME, the agent reads
    // ISTIO_OWNED_CNI_CONFIG_FILENAME. Accept both; the correct name wins.
    let owned_raw = r.raw(
        &f.istio_owned_cni_config_filename,
        "ISTIO_OWNED_CNI_CONFIG_FILENAME",
    );
    let legacy = r.env_raw("ISTIO_OWNED_CNI_CONF_FILENAME");
    let owned_raw = match (owned_raw, legacy) {
        (Some(o), Some(l)) => {
            if o.value != l.value {
                warnings.push(format!(
                    "ignoring legacy env ISTIO_OWNED_CNI_CONF_FILENAME={:?}: {} is set to {:?}",
                    l.value, o.name, o.value
                ));
            }
            Some(o)
        }
        (Some(o), None) => Some(o),
        (None, Some(l)) => {
            warnings.push(
                "env ISTIO_OWNED_CNI_CONF_FILENAME is a misspelt legacy name (Istio chart bug); \
                 using it, please set ISTIO_OWNED_CNI_CONFIG_FILENAME instead"
                    .to_string(),
            );
            Some(l)
        }
        (None, None) => None,
    };
    let owned_filename = match owned_raw {
        Some(raw) => {
            let name = file_name_only(&raw)?;
            cni_conf_file_name(&raw, &name)?;
            name
        }
        None => DEFAULT_OWNED_FILENAME.to_string(),
    };
    let cni_conf_name = match r.raw(&f.cni_conf_name, "CNI_CONF_NAME") {
        // Any name: Istio's own goldens install into an explicitly named `undetectable.file`.
        Some(raw) => Some(file_name_only(&raw)?).filter(|s| !s.is_empty()),
        None => None,
    };

    let bin_raw = r.raw(&f.cni_bin_dirs, "CNI_BIN_DIRS").unwrap_or(Raw {
        name: "--cni-bin-dirs".to_string(),
        value: "/host/opt/cni/bin,/host/secondary-bin-dir".to_string(),
    });
    let cni_bin_dirs = split_list(&bin_raw.value)
        .into_iter()
        .map(|dir| {
            absolute_path(&Raw {
                name: bin_raw.name.clone(),
                value: dir,
            })
        })
        .collect::<Result<Vec<PathBuf>, _>>()?;
    if cni_bin_dirs.is_empty() {
        return Err(invalid(&bin_raw, "needs at least one directory"));
    }

    let kubeconfig_mode = match r.raw(&f.kubeconfig_mode, "KUBECONFIG_MODE") {
        Some(raw) => kubeconfig_mode(&raw)?,
        None => 0o600,
    };

    let path = |flag: &Option<String>, env_name: &str, default: &str| match r.raw(flag, env_name) {
        Some(raw) => absolute_path(&raw),
        None => Ok(PathBuf::from(default)),
    };
    let service_account_dir = path(
        &f.service_account_dir,
        "SERVICE_ACCOUNT_DIR",
        "/var/run/secrets/kubernetes.io/serviceaccount",
    )?;
    let kube_ca_file = match r.raw(&f.kube_ca_file, "KUBE_CA_FILE") {
        Some(raw) => absolute_path(&raw)?,
        None => service_account_dir.join("ca.crt"),
    };

    let log_levels_raw = r.raw(&f.log_output_level, "LOG_OUTPUT_LEVEL");
    let (default_level, scopes) = match &log_levels_raw {
        Some(raw) => parse_log_levels(&raw.value).map_err(|e| invalid(raw, e))?,
        None => (LogLevel::Info, BTreeMap::new()),
    };
    let log = LogConfig {
        default_level,
        scopes,
        as_json: r.boolean(&f.log_as_json, "LOG_AS_JSON", false)?,
        target: match r.string(&f.log_target, "LOG_TARGET", "stderr").as_str() {
            "stderr" => LogTarget::Stderr,
            "stdout" => LogTarget::Stdout,
            path => LogTarget::File(PathBuf::from(path)),
        },
    };
    // Istio bug B16: the plugin's scope keeps its own level instead of the agent's.
    let plugin_log_level = log.level_of("cni-plugin");

    let selectors_raw = r.env_raw("AMBIENT_ENABLEMENT_SELECTOR");
    let enablement_selectors = match &selectors_raw {
        Some(raw) => parse_selectors(&raw.value).map_err(|e| invalid(raw, e.to_string()))?,
        None => Vec::new(),
    };

    let health_port = match r.raw(&f.health_port, "HEALTH_PORT") {
        Some(raw) => port(&raw)?,
        None => 8000,
    };
    let monitoring_raw = r.raw(&f.monitoring_port, "MONITORING_PORT");
    let monitoring_port = match &monitoring_raw {
        Some(raw) => match parse_go_int(&raw.value) {
            Some(p) if p <= 0 => None,
            Some(p) if p <= 65535 => Some(p as u16),
            _ => {
                return Err(invalid(
                    raw,
                    "expected a port number (<= 0 disables metrics)",
                ));
            }
        },
        None => Some(15014),
    };
    if monitoring_port.is_some_and(|p| p != 0 && p == health_port) {
        let raw = monitoring_raw.unwrap_or(Raw {
            name: "--monitoring-port".into(),
            value: "15014".into(),
        });
        return Err(invalid(
            &raw,
            format!("the health server already listens on port {health_port} (HEALTH_PORT)"),
        ));
    }

    // Settings that name Kubernetes objects: a value the API server could never hold would
    // never match anything (or, in a selector, change what is asked for).
    let name = |flag: &Option<String>, env_name: &str, rule: NameRule| match r.raw(flag, env_name) {
        Some(raw) => kube_name(&raw, rule),
        None => Ok(String::new()),
    };
    let node_name = name(&None, "NODE_NAME", NameRule::StrictSubdomain)?;
    let exclude_namespaces = match r.env_raw("EXCLUDE_NAMESPACES") {
        Some(raw) => namespace_list(&raw)?,
        None => Vec::new(),
    };
    let service = kube_service(&r)?;
    let install = InstallConfig {
        mounted_cni_net_dir: path(
            &f.mounted_cni_net_dir,
            "MOUNTED_CNI_NET_DIR",
            "/host/etc/cni/net.d",
        )?,
        cni_conf_name,
        chained,
        istio_owned_cni_config: owned,
        owned_filename,
        cni_bin_dirs,
        run_dir: match r.raw(&f.cni_agent_run_dir, "CNI_AGENT_RUN_DIR") {
            Some(raw) => socket_path(&raw, LONGEST_RUN_DIR_SOCKET)?,
            None => PathBuf::from("/var/run/istio-cni"),
        },
        kubeconfig_mode,
        cni_conf_group_read: r.boolean(&f.cni_conf_group_read, "CNI_CONF_GROUP_READ", false)?,
        kube_ca_file,
        skip_tls_verify: r.boolean(&f.skip_tls_verify, "SKIP_TLS_VERIFY", false)?,
        service_account_dir,
        k8s_service_host: service.host,
        k8s_service_port: service.port,
        k8s_service_protocol: service.protocol,
        ambient_enabled,
        enable_ambient_detection_retry: r.boolean(
            &f.enable_ambient_detection_retry,
            "ENABLE_AMBIENT_DETECTION_RETRY",
            false,
        )?,
        native_nftables: r.env_bool("NATIVE_NFTABLES", false)?,
        exclude_namespaces,
        pod_namespace: name(&None, "POD_NAMESPACE", NameRule::StrictLabel)?,
        enablement_selectors,
        plugin_log_level,
        ambient_disable_safe_upgrade: r.env_bool("AMBIENT_DISABLE_SAFE_UPGRADE", false)?,
        node_name: node_name.clone(),
    };
    if install.ambient_enabled && install.enablement_selectors.is_empty() {
        // The chart always sets it; run by hand it is easy to miss, and then every ADD just says
        // the pod is not ambient.
        warnings.push(
            "AMBIENT_ENABLED=true but AMBIENT_ENABLEMENT_SELECTOR is unset or empty: no pod will \
             ever be enrolled in ambient; set it as the chart does, e.g. \
             [{\"podSelector\":{\"matchLabels\":{\"istio.io/dataplane-mode\":\"ambient\"}}}]"
                .to_string(),
        );
    }
    if owned && !install.owned_mode() {
        warnings.push(format!(
            "ISTIO_OWNED_CNI_CONFIG is set but has no effect: it needs CHAINED_CNI_PLUGIN=true (is {chained}) \
             and AMBIENT_ENABLED=true (is {ambient_enabled}); merging into the primary config instead"
        ));
    }

    let exit_code_raw = r.raw(
        &f.repair_init_container_exit_code,
        "REPAIR_INIT_CONTAINER_EXIT_CODE",
    );
    let init_container_exit_code = match &exit_code_raw {
        Some(raw) => exit_code(raw)?,
        None => 126,
    };
    // Empty (an explicit `--flag=`) keeps Istio's meaning where it has one: no annotation
    // check, any init container, no node.
    let checked = |flag: &Option<String>, env_name: &str, default: &str, rule: NameRule| match r
        .raw(flag, env_name)
    {
        Some(raw) if raw.value.trim().is_empty() && rule != NameRule::QualifiedName => {
            Ok(String::new())
        }
        Some(raw) => kube_name(&raw, rule),
        None => Ok(default.to_string()),
    };
    let repair = RepairConfig {
        enabled: r.boolean(&f.repair_enabled, "REPAIR_ENABLED", true)?,
        delete_pods: r.boolean(&f.repair_delete_pods, "REPAIR_DELETE_PODS", false)?,
        label_pods: r.boolean(&f.repair_label_pods, "REPAIR_LABEL_PODS", false)?,
        repair_pods: r.env_bool("REPAIR_REPAIR_PODS", false)?,
        broken_pod_label_key: checked(
            &f.repair_broken_pod_label_key,
            "REPAIR_BROKEN_POD_LABEL_KEY",
            "cni.istio.io/uninitialized",
            NameRule::QualifiedName,
        )?,
        broken_pod_label_value: checked(
            &f.repair_broken_pod_label_value,
            "REPAIR_BROKEN_POD_LABEL_VALUE",
            "true",
            NameRule::LabelValue,
        )?,
        node_name: checked(
            &f.repair_node_name,
            "REPAIR_NODE_NAME",
            "",
            NameRule::StrictSubdomain,
        )?,
        sidecar_annotation: match r.raw(&f.repair_sidecar_annotation, "REPAIR_SIDECAR_ANNOTATION") {
            Some(raw) if raw.value.trim().is_empty() => String::new(),
            Some(raw) => kube_name(&raw, NameRule::QualifiedName)?,
            None => "sidecar.istio.io/status".to_string(),
        },
        init_container_name: checked(
            &f.repair_init_container_name,
            "REPAIR_INIT_CONTAINER_NAME",
            "istio-validation",
            NameRule::StrictLabel,
        )?,
        init_container_termination_message: r.string(
            &f.repair_init_container_termination_message,
            "REPAIR_INIT_CONTAINER_TERMINATION_MESSAGE",
            "",
        ),
        init_container_exit_code,
        label_selectors: r.string(&f.repair_label_selectors, "REPAIR_LABEL_SELECTORS", ""),
        field_selectors: r.string(&f.repair_field_selectors, "REPAIR_FIELD_SELECTORS", ""),
    };
    // The selectors compile here, not when the controller starts (after sockets are bound).
    if let Err(e) = crate::repair::detect::Detection::new(&repair) {
        let (flag, env_name) = match e {
            crate::repair::detect::FilterError::Labels(_) => {
                (&f.repair_label_selectors, "REPAIR_LABEL_SELECTORS")
            }
            crate::repair::detect::FilterError::Field { .. } => {
                (&f.repair_field_selectors, "REPAIR_FIELD_SELECTORS")
            }
        };
        let raw = r.raw(flag, env_name).unwrap_or(Raw {
            name: env_name.to_string(),
            value: String::new(),
        });
        return Err(invalid(&raw, e.to_string()));
    }

    let ip_env = |name: &str, default: &str, v6: bool| -> Result<IpAddr, ConfigError> {
        match r.env_raw(name) {
            Some(raw) => probe_snat_ip(&raw, v6),
            None => default
                .parse()
                .map_err(|_| ConfigError::Args(format!("bad built-in default for {name}"))),
        }
    };
    let force_iptables_binary = match r.env_raw("FORCE_IPTABLES_BINARY") {
        Some(raw) if raw.value == "legacy" || raw.value == "nft" => Some(raw.value),
        Some(raw) => return Err(invalid(&raw, "expected `legacy` or `nft`")),
        None => None,
    };
    let agent = AgentConfig {
        ztunnel_uds_address: match r.raw(&f.ztunnel_uds_address, "ZTUNNEL_UDS_ADDRESS") {
            Some(raw) => socket_path(&raw, "")?,
            None => PathBuf::from("/var/run/ztunnel/ztunnel.sock"),
        },
        dns_capture: r.env_bool("AMBIENT_DNS_CAPTURE", false)?,
        ipv6: r.env_bool("AMBIENT_IPV6", false)?,
        reconcile_pod_rules_on_startup: r
            .env_bool("AMBIENT_RECONCILE_POD_RULES_ON_STARTUP", false)?,
        system_namespace: match r.env_raw("SYSTEM_NAMESPACE") {
            Some(raw) => kube_name(&raw, NameRule::StrictLabel)?,
            None => "istio-system".to_string(),
        },
        pod_name: name(&None, "POD_NAME", NameRule::StrictSubdomain)?,
        node_name,
        host_probe_snat_ip: ip_env("HOST_PROBE_SNAT_IP", "169.254.7.127", false)?,
        host_probe_snat_ipv6: ip_env(
            "HOST_PROBE_SNAT_IPV6",
            "fd16:9254:7127:1337:ffff:ffff:ffff:ffff",
            true,
        )?,
        scoped_xtables_locking: r.env_bool("AMBIENT_USE_SCOPED_XTABLES_LOCKING", true)?,
        aws_branch_eni_probe: r.env_bool("AMBIENT_ENABLE_AWS_BRANCH_ENI_PROBE", true)?,
        force_iptables_binary,
        allow_switch_to_host_ns: r.env_bool("ALLOW_SWITCH_TO_HOST_NS", false)?,
    };

    if install.ambient_enabled && install.native_nftables && agent.force_iptables_binary.is_some() {
        warnings.push(
            "NATIVE_NFTABLES is set together with FORCE_IPTABLES_BINARY; the iptables binary choice \
             has no effect with the nftables backend"
                .to_string(),
        );
    }

    // Read-and-ignored for drop-in compatibility; say so when someone sets them.
    for (flag, env_name) in [
        (&f.log_level, "LOG_LEVEL"),
        (&f.cni_network_config, "CNI_NETWORK_CONFIG"),
        (&f.cni_network_config_file, "CNI_NETWORK_CONFIG_FILE"),
        (&f.ctrlz_port, "CTRLZ_PORT"),
        (&f.log_rotate, "LOG_ROTATE"),
    ] {
        if let Some(raw) = r.raw(flag, env_name) {
            warnings.push(format!(
                "{} is accepted for compatibility and ignored",
                raw.name
            ));
        }
    }

    let drift_verify_interval = match r.raw(&f.drift_verify_interval, "DRIFT_VERIFY_INTERVAL") {
        None => Some(DEFAULT_DRIFT_VERIFY_INTERVAL),
        Some(raw) => match crate::cli::parse_go_duration(raw.value.trim()) {
            Some(d) if d.is_zero() => None,
            Some(d) if d < std::time::Duration::from_secs(1) => {
                return Err(invalid(&raw, "expected at least 1s (or 0 to disable)"));
            }
            Some(d) => Some(d),
            None => return Err(invalid(&raw, "expected a Go duration such as 60s or 5m")),
        },
    };

    let host_proc_setting = r
        .raw(&f.host_proc_dir, "HOST_PROC_DIR")
        .map_or_else(|| "--host-proc-dir".to_string(), |raw| raw.name);
    // Ours: slow request headers and idle keep-alives on every listener are closed after it.
    let listener_idle_timeout = match r.env_raw("LISTENER_IDLE_TIMEOUT") {
        None => DEFAULT_LISTENER_IDLE_TIMEOUT,
        Some(raw) => match crate::cli::parse_go_duration(raw.value.trim()) {
            Some(d) if d >= std::time::Duration::from_millis(100) => d,
            Some(_) => return Err(invalid(&raw, "expected at least 100ms")),
            None => return Err(invalid(&raw, "expected a Go duration such as 10s")),
        },
    };

    Ok(Config {
        install,
        repair,
        agent,
        log,
        health_port,
        monitoring_port,
        host_proc_dir: path(&f.host_proc_dir, "HOST_PROC_DIR", "/host/proc")?,
        host_proc_setting,
        host_netns_dir: path(&f.host_netns_dir, "HOST_NETNS_DIR", "/host/var/run/netns")?,
        drift_verify_interval,
        listener_idle_timeout,
        warnings,
    })
}

/// The API server address the plugin kubeconfig names (the kubelet's service env).
struct KubeService {
    host: Option<String>,
    port: Option<String>,
    protocol: String,
}

/// `KUBERNETES_SERVICE_HOST` (an IP or a host name), `_PORT` (1-65535) and `_PROTOCOL`
/// (`http` or `https`): anything else makes a server URL no client can use.
fn kube_service(r: &Resolver) -> Result<KubeService, ConfigError> {
    let host = match r.env_raw("KUBERNETES_SERVICE_HOST") {
        Some(raw) => {
            let v = raw.value.trim();
            let bare = v
                .strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .unwrap_or(v);
            if bare.parse::<IpAddr>().is_err()
                && crate::kube::names::check(bare, NameRule::Subdomain).is_err()
            {
                return Err(invalid(&raw, "expected an IP address or a host name"));
            }
            Some(v.to_string())
        }
        None => None,
    };
    let port = match r.env_raw("KUBERNETES_SERVICE_PORT") {
        Some(raw) => match raw.value.trim().parse::<u16>() {
            Ok(p) if p > 0 => Some(p.to_string()),
            _ => return Err(invalid(&raw, "expected a port number 1-65535")),
        },
        None => None,
    };
    let protocol = match r.env_raw("KUBERNETES_SERVICE_PROTOCOL") {
        Some(raw) if matches!(raw.value.trim(), "http" | "https") => raw.value.trim().to_string(),
        Some(raw) => return Err(invalid(&raw, "expected `https` or `http`")),
        None => "https".to_string(),
    };
    Ok(KubeService {
        host,
        port,
        protocol,
    })
}
