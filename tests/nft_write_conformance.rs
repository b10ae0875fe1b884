//! The native nftables write path (`rules::nft_encode`, sent by `apply::nft::apply_transaction`
//! over nfnetlink, no process) against nft itself, the external oracle: every nftables golden
//! Istio ships (the sidecar capture cases, the ambient in-pod and host cases) is applied twice,
//! in two fresh netns: as the golden's text with `nft -f`, and as our typed transaction through
//! the netlink encoder. `nft -j list ruleset`, run by this test, must list the same ruleset in
//! both (compared as JSON values, rule handles and the listing's metainfo left out). nft reads
//! every expression back, so a statement encoded differently from nft's own encoding shows up as
//! a different (or unreadable) listing.

mod support;

#[path = "support/cases.rs"]
mod cases;

use istio_cni::apply::ProcessExecutor;
use istio_cni::apply::nft::apply_transaction;
use istio_cni::apply::probe_set::{NFT_TABLE, nft_set_declarations};
use istio_cni::rules::nft_capture;
use istio_cni::rules::nft_encode::{NftStep, NftTransaction};
use istio_cni::rules::nftables::NftTable;
use serde_json::Value;
use support::{Netns, require_tool};

/// One golden: its name, the text nft applies (Istio's file; the host one after the probe sets
/// it names) and the transaction our encoder sends for the same case.
struct Golden {
    name: String,
    text: String,
    tx: NftTransaction,
}

fn goldens() -> Vec<Golden> {
    let read = |golden: &str| {
        std::fs::read_to_string(cases::testdata().join(golden)).expect("golden file")
    };
    let mut out = Vec::new();
    for case in cases::cases_under("tools/istio-nftables/pkg/capture/") {
        let golden = case["golden"].as_str().unwrap_or_default().to_string();
        let tx = NftTransaction::new(vec![NftStep::Replace {
            set: nft_capture::build(&cases::capture_config(&case)),
            tables: NftTable::SIDECAR.to_vec(),
        }]);
        out.push(Golden {
            text: read(&golden),
            name: golden,
            tx,
        });
    }
    assert!(out.len() >= 14, "expected Istio's nftables capture cases");
    let all: Value = serde_json::from_str(&read("cases.json")).expect("cases.json");
    let ambient_cases = all.as_array().expect("list").iter().filter(|c| {
        c["golden"]
            .as_str()
            .unwrap_or_default()
            .starts_with("cni/pkg/nftables/")
    });
    for case in ambient_cases {
        let golden = case["golden"].as_str().unwrap_or_default().to_string();
        let cfg = cases::ambient_config(&case["config"]["AmbientConfig"]);
        let (text, tx) = if golden.ends_with("hostprobe.golden") {
            let uid = case["config"]["kubeletUID"].as_str().unwrap_or("0");
            let head = format!(
                "add table inet {NFT_TABLE}\n{}",
                nft_set_declarations(cfg.enable_ipv6)
            );
            (
                head + &read(&golden),
                istio_cni::apply::ambient::host_nft_transaction(&cfg, uid),
            )
        } else {
            let pod = cases::overrides(&case["config"]["PodLevelOverrides"]);
            (
                read(&golden),
                istio_cni::apply::ambient::inpod_nft_transaction(&cfg, &pod),
            )
        };
        out.push(Golden {
            name: golden,
            text,
            tx,
        });
    }
    assert!(
        out.len() >= 20,
        "expected Istio's ambient nftables cases too"
    );
    out
}

/// `nft -f -` of `text` in `ns`; Err with what nft said when it refuses.
fn nft_apply(ns: &Netns, text: &str) -> Result<(), String> {
    let mut child = std::process::Command::new("ip")
        .args(["netns", "exec", &ns.name, "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("nft");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).to_string())
    }
}

/// Our transaction in `ns`, over netlink.
fn our_apply(ns: &Netns, tx: NftTransaction) -> Result<(), String> {
    ns.spawn(move || apply_transaction(&mut ProcessExecutor::default(), &tx))
        .join()
        .unwrap()
        .map_err(|e| e.to_string())
}

/// `nft -j list ruleset` in `ns` without handles and metainfo: what a reader sees.
fn listing(ns: &Netns) -> Value {
    let out = ns.exec("nft", &["-j", "list", "ruleset"]);
    assert!(
        out.status.success(),
        "nft -j: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut v: Value = serde_json::from_slice(&out.stdout).expect("nft JSON");
    strip(&mut v);
    v
}

fn strip(v: &mut Value) {
    match v {
        Value::Object(map) => {
            map.remove("handle");
            map.values_mut().for_each(strip);
        }
        Value::Array(items) => {
            items.retain(|i| i.get("metainfo").is_none());
            items.iter_mut().for_each(strip);
        }
        _ => {}
    }
}

#[test]
fn every_golden_applied_over_netlink_lists_as_nft_applying_the_golden() {
    require_tool("nft", "nftables");
    let (mut failures, mut checked, mut not_applicable) = (Vec::new(), Vec::new(), Vec::new());
    for golden in goldens() {
        let theirs = Netns::new("nftwref");
        if let Err(refused) = nft_apply(&theirs, &golden.text) {
            // Only an owner group this host does not have (Istio's `java`) may refuse; ours
            // looks the name up as nft does and refuses it too.
            assert!(
                refused.contains("Group does not exist"),
                "{}: nft refused the golden: {refused}",
                golden.name
            );
            let ours = Netns::new("nftwours");
            let err = our_apply(&ours, golden.tx).expect_err("a group name is refused");
            assert!(err.contains("does not exist"), "{}: {err}", golden.name);
            not_applicable.push(golden.name);
            continue;
        }
        let ours = Netns::new("nftwours");
        if let Err(e) = our_apply(&ours, golden.tx) {
            failures.push(format!("{}: the kernel refused ours: {e}", golden.name));
            continue;
        }
        let (want, got) = (listing(&theirs), listing(&ours));
        if want != got {
            failures.push(format!(
                "{}:\n--- nft -f\n{}\n--- netlink\n{}",
                golden.name,
                serde_json::to_string(&want).unwrap(),
                serde_json::to_string(&got).unwrap()
            ));
        }
        checked.push(golden.name);
    }
    eprintln!(
        "applied {} nftables goldens over netlink; not applicable here: {not_applicable:?}",
        checked.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(
        checked.len() >= 18 && not_applicable.len() <= 2,
        "too few goldens were applied: {checked:?}; not applicable: {not_applicable:?}"
    );
}
