//! Istio's golden cases (tests/testdata/istio/cases.json): loading them and the argv for a case.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use istio_cni::rules::ambient::{
    AmbientConfig, DEFAULT_PROBE_SNAT_V4, DEFAULT_PROBE_SNAT_V6, PodDns, PodOverrides,
};
use serde_json::Value;

pub fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testdata/istio")
}

/// The cases whose golden lives under `prefix` and that have a command line.
pub fn cases_under(prefix: &str) -> Vec<Value> {
    let cases: Value = serde_json::from_str(
        &std::fs::read_to_string(testdata().join("cases.json")).expect("cases.json"),
    )
    .expect("cases.json is JSON");
    cases
        .as_array()
        .expect("cases.json is a list")
        .iter()
        .filter(|c| {
            c["golden"].as_str().unwrap_or_default().starts_with(prefix) && !c["cli"].is_null()
        })
        .cloned()
        .collect()
}

/// The ambient iptables cases (in-pod and host), whose goldens are under `cni/pkg/iptables/`.
pub fn ambient_iptables_cases() -> Vec<Value> {
    let cases: Value = serde_json::from_str(
        &std::fs::read_to_string(testdata().join("cases.json")).expect("cases.json"),
    )
    .expect("cases.json is JSON");
    let ambient: Vec<Value> = cases
        .as_array()
        .expect("cases.json is a list")
        .iter()
        .filter(|c| {
            c["golden"]
                .as_str()
                .unwrap_or_default()
                .starts_with("cni/pkg/iptables/")
        })
        .cloned()
        .collect();
    assert!(
        ambient.len() >= 6,
        "expected Istio's ambient iptables cases"
    );
    ambient
}

/// argv for a case: its own args plus `--ipv6` and `--dns-servers` from `host_inputs`.
pub fn case_args(case: &Value) -> Vec<String> {
    let mut args: Vec<String> = case["cli"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(String::from))
        .collect();
    let host = &case["host_inputs"];
    let ipv6 = host["enable_ipv6"].as_bool().unwrap_or(false);
    args.push(format!("--ipv6={ipv6}"));
    if let Some(servers) = host["resolv_conf_nameservers"].as_array() {
        let list: Vec<&str> = servers.iter().filter_map(Value::as_str).collect();
        args.push(format!("--dns-servers={}", list.join(",")));
    }
    args
}

/// The case's environment variables.
pub fn case_env(case: &Value) -> Vec<(String, String)> {
    case["env"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
        .collect()
}

/// A case's `AmbientConfig` as our typed ambient config.
pub fn ambient_config(v: &Value) -> AmbientConfig {
    let s = |key: &str, default: &str| v[key].as_str().unwrap_or(default).to_string();
    AmbientConfig {
        probe_snat_v4: s("HostProbeSNATAddress", DEFAULT_PROBE_SNAT_V4),
        probe_snat_v6: s("HostProbeV6SNATAddress", DEFAULT_PROBE_SNAT_V6),
        enable_ipv6: v["EnableIPv6"].as_bool().unwrap_or(false),
        redirect_dns: v["RedirectDNS"].as_bool().unwrap_or(false),
    }
}

/// A case's `PodLevelOverrides`.
pub fn overrides(v: &Value) -> PodOverrides {
    PodOverrides {
        ingress: v["IngressMode"].as_bool().unwrap_or(false),
        virtual_interfaces: v["VirtualInterfaces"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i.as_str().map(String::from))
            .collect(),
        dns: match v["DNSProxy"].as_str() {
            Some("PodDNSEnabled") => PodDns::Enabled,
            Some("PodDNSDisabled") => PodDns::Disabled,
            _ => PodDns::Unset,
        },
    }
}

/// A sidecar capture case's configuration, resolved in-process as `istio-iptables` resolves it
/// (its flags and env, then the host facts), for the builders of either backend.
pub fn capture_config(case: &Value) -> istio_cni::rules::capture::CaptureConfig {
    use argh::FromArgs;
    let args: Vec<String> = case_args(case)
        .into_iter()
        .filter(|a| a != "--dry-run")
        .collect();
    let env: std::collections::HashMap<String, String> = case_env(case).into_iter().collect();
    let normalised = istio_cni::cli::normalise_args(&args, &istio_cni::iptables_cmd::flags::SHAPES)
        .expect("case argv");
    let refs: Vec<&str> = normalised.args.iter().map(String::as_str).collect();
    let flags = istio_cni::iptables_cmd::flags::Flags::from_args(&["istio-iptables"], &refs)
        .expect("case flags");
    let mut settings = flags
        .resolve(&env, &normalised.explicit_false)
        .expect("case settings");
    istio_cni::iptables_cmd::host::fill_host_facts(&mut settings).expect("host facts");
    settings.capture
}
