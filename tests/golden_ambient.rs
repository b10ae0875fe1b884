//! Istio's ambient rule goldens (in-pod and host, iptables and nftables) as an external oracle for
//! the shared rule engine: each case's config from tests/testdata/istio/cases.json is turned into
//! our typed ambient config and the rendered output is compared with Istio's file.

use std::path::{Path, PathBuf};

use istio_cni::apply::transcript;
use istio_cni::rules::ambient::{self, AmbientConfig, PodDns, PodOverrides};
use istio_cni::rules::nftables::{NftTable, render_transaction};
use serde_json::Value;

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testdata/istio")
}

fn ambient_config(v: &Value) -> AmbientConfig {
    let s = |key: &str, default: &str| v[key].as_str().unwrap_or(default).to_string();
    AmbientConfig {
        probe_snat_v4: s("HostProbeSNATAddress", ambient::DEFAULT_PROBE_SNAT_V4),
        probe_snat_v6: s("HostProbeV6SNATAddress", ambient::DEFAULT_PROBE_SNAT_V6),
        enable_ipv6: v["EnableIPv6"].as_bool().unwrap_or(false),
        redirect_dns: v["RedirectDNS"].as_bool().unwrap_or(false),
    }
}

fn overrides(v: &Value) -> PodOverrides {
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

fn render(golden: &str, case: &Value) -> String {
    let cfg = ambient_config(&case["config"]["AmbientConfig"]);
    let pod = overrides(&case["config"]["PodLevelOverrides"]);
    let host = golden.ends_with("hostprobe.golden");
    if golden.starts_with("cni/pkg/iptables/") {
        let rules = if host {
            ambient::host_rules(&cfg)
        } else {
            ambient::inpod_rules(&cfg, &pod)
        };
        transcript::ambient(&rules, cfg.enable_ipv6).join("\n")
    } else if host {
        let uid = case["config"]["kubeletUID"].as_str().unwrap_or("0");
        render_transaction(
            &ambient::host_nft_rules(&cfg, uid),
            &[NftTable::AmbientHostNat],
        )
    } else {
        render_transaction(
            &ambient::inpod_nft_rules(&cfg, &pod),
            &NftTable::AMBIENT_POD,
        )
    }
}

#[test]
fn ambient_goldens() {
    let cases: Value = serde_json::from_str(
        &std::fs::read_to_string(testdata().join("cases.json")).expect("cases.json"),
    )
    .unwrap();
    let mut failures = Vec::new();
    let mut ran = 0;
    for case in cases.as_array().expect("list") {
        let golden = case["golden"].as_str().unwrap_or_default();
        if !(golden.starts_with("cni/pkg/iptables/") || golden.starts_with("cni/pkg/nftables/")) {
            continue;
        }
        ran += 1;
        let want = std::fs::read_to_string(testdata().join(golden)).expect("golden");
        let got = render(golden, case);
        if got.trim() != want.trim() {
            failures.push(format!(
                "{golden}\n--- want\n{}\n--- got\n{}",
                want.trim(),
                got.trim()
            ));
        }
    }
    assert!(ran >= 12, "expected the shipped ambient cases, ran {ran}");
    assert!(
        failures.is_empty(),
        "{} of {ran} differ:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
