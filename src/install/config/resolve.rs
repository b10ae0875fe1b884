//! From the declared settings' typed [`Values`] (flag > env > default, `flags`) to the config
//! sections, with what spans several settings: derived defaults, cross-checks and warnings.

use super::checks::node_ip_of;
use super::flags::{Flags, Values, decl};
use super::lenient::adjustment;
use super::raw::{Raw, invalid};
use super::sections::*;
use crate::cli::Env;
use crate::cli::settings::{EmptyEnv, Lookup, Mark};
use crate::telemetry::rotate::RotateSettings;

/// install-cni's env rule: a set-but-empty variable is unset (viper's).
pub(super) fn lookup(env: &dyn Env) -> Lookup<'_> {
    Lookup {
        env,
        empty_env: EmptyEnv::Unset,
        env_label: "env ",
        switched_off: None,
    }
}

/// Builds the config from parsed flags and the environment.
pub fn from_flags(f: &Flags, env: &dyn Env) -> Result<Config, ConfigError> {
    let l = lookup(env);
    let v = Values::resolve(f, &l)?;
    let mut warnings = Vec::new();

    // Istio bug B1: the chart writes ISTIO_OWNED_CNI_CONF_FILENAME, the agent reads
    // ISTIO_OWNED_CNI_CONFIG_FILENAME. Both are read; the correct name wins.
    for s in decl::ALL.iter().filter(|s| s.legacy_env.is_some()) {
        warnings.extend(l.legacy_warning(s, f.given(s)));
    }

    let log = log_config(&v);
    check_ports(&v, &l, f)?;

    let node_name = v.node_name.unwrap_or_default();
    let install = InstallConfig {
        mounted_cni_net_dir: v.mounted_cni_net_dir,
        // Any name: Istio's own goldens install into an explicitly named `undetectable.file`.
        cni_conf_name: v.cni_conf_name.filter(|s| !s.is_empty()),
        chained: v.chained_cni_plugin,
        istio_owned_cni_config: v.istio_owned_cni_config,
        owned_filename: v.istio_owned_cni_config_filename,
        cni_bin_dirs: v.cni_bin_dirs,
        results_dir: v.cni_results_dir,
        run_dir: v.cni_agent_run_dir,
        kubeconfig_mode: v.kubeconfig_mode,
        cni_conf_group_read: v.cni_conf_group_read,
        kube_ca_file: v
            .kube_ca_file
            .unwrap_or_else(|| v.service_account_dir.join("ca.crt")),
        skip_tls_verify: v.skip_tls_verify,
        service_account_dir: v.service_account_dir,
        k8s_service_host: v.kubernetes_service_host,
        k8s_service_port: v.kubernetes_service_port,
        k8s_service_protocol: v.kubernetes_service_protocol,
        ambient_enabled: v.ambient_enabled,
        enable_ambient_detection_retry: v.enable_ambient_detection_retry,
        native_nftables: v.native_nftables,
        exclude_namespaces: v.exclude_namespaces,
        pod_namespace: v.pod_namespace.unwrap_or_default(),
        enablement_selectors: v.ambient_enablement_selector,
        // Istio bug B16: the plugin's scope keeps its own level instead of the agent's.
        plugin_log_level: log.level_of("cni-plugin"),
        ambient_disable_safe_upgrade: v.ambient_disable_safe_upgrade,
        node_name: node_name.clone(),
    };
    let repair = RepairConfig {
        enabled: v.repair_enabled,
        delete_pods: v.repair_delete_pods,
        label_pods: v.repair_label_pods,
        repair_pods: v.repair_repair_pods,
        broken_pod_label_key: v.repair_broken_pod_label_key,
        broken_pod_label_value: v.repair_broken_pod_label_value,
        node_name: v.repair_node_name,
        sidecar_annotation: v.repair_sidecar_annotation,
        init_container_name: v.repair_init_container_name,
        init_container_termination_message: v.repair_init_container_termination_message,
        init_container_exit_code: v.repair_init_container_exit_code,
        label_selectors: v.repair_label_selectors,
        field_selectors: v.repair_field_selectors,
    };
    check_repair_selectors(&repair, &l, f)?;

    let agent = AgentConfig {
        ztunnel_uds_address: v.ztunnel_uds_address,
        dns_capture: v.ambient_dns_capture,
        ipv6: v.ambient_ipv6,
        reconcile_pod_rules_on_startup: v.ambient_reconcile_pod_rules_on_startup,
        system_namespace: v.system_namespace,
        pod_name: v.pod_name.unwrap_or_default(),
        node_name,
        host_probe_snat_ip: node_ip_of(&v.host_probe_snat_node_ips, false)
            .unwrap_or(v.host_probe_snat_ip),
        host_probe_snat_ipv6: node_ip_of(&v.host_probe_snat_node_ips, true)
            .unwrap_or(v.host_probe_snat_ipv6),
        scoped_xtables_locking: v.ambient_use_scoped_xtables_locking,
        aws_branch_eni_probe: v.ambient_enable_aws_branch_eni_probe,
        force_iptables_binary: v.force_iptables_binary,
        allow_switch_to_host_ns: v.allow_switch_to_host_ns,
    };

    warnings.extend(section_warnings(&install, &agent));
    let adjusted = setting_warnings(&l, f, &mut warnings);

    let host_proc_setting = {
        let s = &decl::host_proc_dir;
        l.raw_or_default(s, f.given(s)).expect("has a default").name
    };

    Ok(Config {
        install,
        repair,
        agent,
        log,
        health_port: v.health_port,
        monitoring_port: v.monitoring_port,
        host_proc_dir: v.host_proc_dir,
        host_proc_setting,
        host_netns_dir: v.host_netns_dir,
        drift_verify_interval: v.drift_verify_interval,
        listener_idle_timeout: v.listener_idle_timeout,
        api_retry_max_delay: v.api_retry_max_delay,
        warnings,
        adjusted,
    })
}

/// The log section; read before the other sections take their values.
fn log_config(v: &Values) -> LogConfig {
    let (default_level, scopes) = v.log_output_level.clone();
    LogConfig {
        default_level,
        scopes,
        as_json: v.log_as_json,
        target: v.log_target.clone(),
        rotate: v
            .log_rotate
            .clone()
            .filter(|p| !p.as_os_str().is_empty())
            .map(|path| RotateSettings {
                path,
                max_size_mb: v.log_rotate_max_size,
                max_age_days: v.log_rotate_max_age,
                max_backups: v.log_rotate_max_backups,
            }),
    }
}

/// The monitoring server may not take the health server's port.
fn check_ports(v: &Values, l: &Lookup<'_>, f: &Flags) -> Result<(), ConfigError> {
    if v.monitoring_port
        .is_some_and(|p| p != 0 && p == v.health_port)
    {
        let s = &decl::monitoring_port;
        let raw = l.raw_or_default(s, f.given(s)).expect("has a default");
        return Err(invalid(
            &raw,
            format!(
                "the health server already listens on port {} (HEALTH_PORT)",
                v.health_port
            ),
        ));
    }
    Ok(())
}

/// The repair selectors compile here, not when the controller starts (after sockets are bound).
fn check_repair_selectors(
    repair: &RepairConfig,
    l: &Lookup<'_>,
    f: &Flags,
) -> Result<(), ConfigError> {
    if let Err(e) = crate::repair::detect::Detection::new(repair) {
        let s = match e {
            crate::repair::detect::FilterError::Labels(_) => &decl::repair_label_selectors,
            crate::repair::detect::FilterError::Field { .. } => &decl::repair_field_selectors,
        };
        let raw = l.raw(s, f.given(s)).unwrap_or(Raw {
            name: s.env.unwrap_or(s.key).to_string(),
            value: String::new(),
        });
        return Err(invalid(&raw, e.to_string()));
    }
    Ok(())
}

/// Settings that contradict each other across sections: said, not refused.
fn section_warnings(install: &InstallConfig, agent: &AgentConfig) -> Vec<String> {
    let mut warnings = Vec::new();
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
    if install.istio_owned_cni_config && !install.owned_mode() {
        warnings.push(format!(
            "ISTIO_OWNED_CNI_CONFIG is set but has no effect: it needs CHAINED_CNI_PLUGIN=true (is {}) \
             and AMBIENT_ENABLED=true (is {}); merging into the primary config instead",
            install.chained, install.ambient_enabled
        ));
    }
    if install.ambient_enabled && install.native_nftables && agent.force_iptables_binary.is_some() {
        warnings.push(
            "NATIVE_NFTABLES is set together with FORCE_IPTABLES_BINARY; the iptables binary choice \
             has no effect with the nftables backend"
                .to_string(),
        );
    }
    warnings
}

/// Per-setting warnings: values adjusted to their safe reading (returned, and counted) and
/// settings accepted only for compatibility.
fn setting_warnings(l: &Lookup<'_>, f: &Flags, warnings: &mut Vec<String>) -> Vec<Adjustment> {
    // Values Istio starts with, given their safe reading here: said and counted.
    let mut adjusted = Vec::new();
    for s in decl::ALL.iter() {
        if let Some(a) = l.raw(s, f.given(s)).and_then(|raw| adjustment(s, &raw)) {
            warnings.push(a.warning());
            adjusted.push(a);
        }
    }

    // Read-and-ignored for drop-in compatibility; say so when someone sets them.
    for s in decl::ALL.iter().filter(|s| s.is(Mark::WarnIfSet)) {
        if let Some(raw) = l.raw(s, f.given(s)) {
            warnings.push(format!(
                "{} is accepted for compatibility and ignored",
                raw.name
            ));
        }
    }

    adjusted
}
