//! Istio's ambient rule goldens (in-pod and host, iptables and nftables) as an external oracle for
//! the shared rule engine: each case's config from tests/testdata/istio/cases.json is turned into
//! our typed ambient config and the rendered output is compared with Istio's file.

use std::path::{Path, PathBuf};

use istio_cni::apply::transcript;
use istio_cni::rules::ambient::{self, PodDns};
use istio_cni::rules::nftables::{NftTable, render_transaction};
use serde_json::Value;

#[path = "support/cases.rs"]
mod cases;
use cases::{ambient_config, overrides};

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testdata/istio")
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

/// The ambient cases of Istio's cases.json (those whose golden is one of `cni/pkg/iptables` or
/// `cni/pkg/nftables`): the golden file's path, the case, the golden's text. At least the 12
/// Istio ships.
fn ambient_cases() -> Vec<(String, Value, String)> {
    let cases: Value = serde_json::from_str(
        &std::fs::read_to_string(testdata().join("cases.json")).expect("cases.json"),
    )
    .unwrap();
    let mut out = Vec::new();
    for case in cases.as_array().expect("list") {
        let golden = case["golden"].as_str().unwrap_or_default();
        if golden.starts_with("cni/pkg/iptables/") || golden.starts_with("cni/pkg/nftables/") {
            let want = std::fs::read_to_string(testdata().join(golden)).expect("golden");
            out.push((golden.to_string(), case.clone(), want));
        }
    }
    assert!(
        out.len() >= 12,
        "expected the shipped ambient cases, found {}",
        out.len()
    );
    out
}

#[test]
fn ambient_goldens() {
    let cases = ambient_cases();
    let mut failures = Vec::new();
    for (golden, case, want) in &cases {
        let got = render(golden, case);
        if got.trim() != want.trim() {
            failures.push(format!(
                "{golden}\n--- want\n{}\n--- got\n{}",
                want.trim(),
                got.trim()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
}

/// The command line an operator would type for a case: derived from the case's own Go config
/// (AmbientConfig, PodLevelOverrides, kubeletUID), never from a field we add, so held-back cases
/// in Istio's format run unchanged.
fn cli_args(golden: &str, case: &Value) -> Vec<String> {
    let c = &case["config"]["AmbientConfig"];
    let p = &case["config"]["PodLevelOverrides"];
    let cfg = ambient_config(c);
    let pod = overrides(p);
    let host = golden.ends_with("hostprobe.golden");
    let mut args = vec![
        "ambient".to_string(),
        "--dry-run".to_string(),
        format!("--ipv6={}", cfg.enable_ipv6),
        format!("--host-probe-snat-ip={}", cfg.probe_snat_v4),
        format!("--host-probe-snat-ipv6={}", cfg.probe_snat_v6),
    ];
    // DNS capture is in-pod only; the command refuses it with --host rather than ignore it.
    if !host {
        args.push(format!("--redirect-dns={}", cfg.redirect_dns));
    }
    match pod.dns {
        PodDns::Enabled => args.push("--pod-dns=enabled".into()),
        PodDns::Disabled => args.push("--pod-dns=disabled".into()),
        PodDns::Unset => {}
    }
    if pod.ingress {
        args.push("--ingress".into());
    }
    if !pod.virtual_interfaces.is_empty() {
        args.push(format!(
            "--reroute-virtual-interfaces={}",
            pod.virtual_interfaces.join(",")
        ));
    }
    if golden.starts_with("cni/pkg/nftables/") {
        args.push("--native-nftables".into());
    }
    if host {
        args.push("--host".into());
        if golden.starts_with("cni/pkg/nftables/") {
            let uid = case["config"]["kubeletUID"].as_str().unwrap_or("0");
            args.push(format!("--kubelet-uid={uid}"));
        }
    }
    args
}

/// The same goldens through the real binary: `istio-iptables ambient --dry-run ...` with the
/// command line [`cli_args`] derives from each case, stdout byte-identical to Istio's file apart
/// from the one trailing newline Istio's files lack.
#[test]
fn ambient_command_prints_the_goldens() {
    let mut failures = Vec::new();
    for (golden, case, want) in &ambient_cases() {
        let args = cli_args(golden, case);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_istio-cni-rs"))
            .arg("istio-iptables")
            .args(&args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .output()
            .expect("run istio-iptables ambient");
        let got = String::from_utf8_lossy(&out.stdout);
        let want_exact = if want.ends_with('\n') {
            want.clone()
        } else {
            format!("{want}\n")
        };
        if !out.status.success() || got != want_exact {
            failures.push(format!(
                "{golden} {args:?}\nexit {:?}; stderr: {}\n--- want\n{want_exact}--- got\n{got}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn ambient_command_refuses_bad_values_and_its_help_is_truthful() {
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_istio-cni-rs"))
            .arg("istio-iptables")
            .arg("ambient")
            .args(args)
            .env_clear()
            .output()
            .expect("run")
    };
    for (args, needle) in [
        (vec!["--dry-run", "--pod-dns=yes"], "--pod-dns"),
        (
            vec!["--dry-run", "--host-probe-snat-ip=300.1.1.1"],
            "--host-probe-snat-ip",
        ),
        (vec!["--dry-run", "--bogus"], "--bogus"),
        (vec!["--ipv6=true"], "--dry-run"),
        (
            vec![
                "--dry-run",
                "--native-nftables",
                "--host",
                "--host-proc=/nonexistent",
            ],
            "--kubelet-uid",
        ),
    ] {
        let out = run(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(out.stdout.is_empty(), "{args:?} printed rules");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    let help = run(&["--help"]);
    assert!(help.status.success());
    let text = String::from_utf8_lossy(&help.stdout);
    for flag in [
        "--dry-run",
        "--ipv6",
        "--redirect-dns",
        "--pod-dns",
        "--ingress",
        "--reroute-virtual-interfaces",
        "--host-probe-snat-ip",
        "--host-probe-snat-ipv6",
        "--native-nftables",
        "--host",
        "--kubelet-uid",
        "--host-proc",
    ] {
        assert!(text.contains(flag), "help lacks {flag}:\n{text}");
    }
}
