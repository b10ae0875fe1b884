//! The native nftables read-back (nft's JSON listing, run by this test and decoded with
//! `rules::nft_decode`, and the netlink read `apply::nft::read_native_netlink`) against nft itself, the external oracle: every nftables golden Istio
//! ships (the sidecar capture cases, the ambient in-pod and host cases) is applied with `nft -f`
//! in a fresh netns, and what the reader gives back must be exactly the typed model that
//! produced the golden (spelt canonically: `rules::nft_decode::expected`). Nothing may read back
//! as foreign, and a rule changed behind our back must not read back as equal.

mod support;

#[path = "support/cases.rs"]
mod cases;

use istio_cni::apply::nft::read_native_netlink;
use istio_cni::apply::probe_set::{NFT_TABLE, nft_set_declarations, nft_sets};
use istio_cni::rules::ambient;
use istio_cni::rules::nft_decode::{NativeState, difference, expected};
use istio_cni::rules::nftables::NftTable;
use istio_cni::rules::{nft_capture, nft_model::NftRuleSet};
use serde_json::Value;
use support::{Netns, require_tool};

/// Every table prefix of ours: a golden's tables, and nothing else, must read back.
const OURS: &str = "istio-";

/// A sidecar nftables case's rules, built in-process as `istio-iptables --native-nftables` does.
fn capture_rules(case: &Value) -> NftRuleSet {
    nft_capture::build(&cases::capture_config(case))
}

/// One golden: its name, the text applied (Istio's file; the host one after the probe sets it
/// names), and what must read back.
struct Golden {
    name: String,
    text: String,
    want: NativeState,
}

fn goldens() -> Vec<Golden> {
    let read = |golden: &str| {
        std::fs::read_to_string(cases::testdata().join(golden)).expect("golden file")
    };
    let mut out = Vec::new();
    for case in cases::cases_under("tools/istio-nftables/pkg/capture/") {
        let golden = case["golden"].as_str().unwrap_or_default().to_string();
        let want = expected(&capture_rules(&case), &NftTable::SIDECAR, &[]);
        out.push(Golden {
            text: read(&golden),
            name: golden,
            want,
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
        let (text, want) = if golden.ends_with("hostprobe.golden") {
            let uid = case["config"]["kubeletUID"].as_str().unwrap_or("0");
            let sets = nft_sets(cfg.enable_ipv6);
            let rules = ambient::host_nft_rules(&cfg, uid);
            let head = format!(
                "add table inet {NFT_TABLE}\n{}",
                nft_set_declarations(cfg.enable_ipv6)
            );
            (
                head + &read(&golden),
                expected(&rules, &[NftTable::AmbientHostNat], &sets),
            )
        } else {
            let pod = cases::overrides(&case["config"]["PodLevelOverrides"]);
            let rules = ambient::inpod_nft_rules(&cfg, &pod);
            (read(&golden), expected(&rules, &NftTable::AMBIENT_POD, &[]))
        };
        out.push(Golden {
            name: golden,
            text,
            want,
        });
    }
    assert!(
        out.len() >= 20,
        "expected Istio's ambient nftables cases too"
    );
    out
}

/// `nft -f -` of `text` in `ns`; Err with what nft said when it refuses.
fn apply(ns: &Netns, text: &str) -> Result<(), String> {
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

/// `nft -j -t list ruleset` in `ns`, decoded (the listing the test runs itself; the crate starts
/// no nft).
fn read_back(ns: &Netns) -> NativeState {
    let out = std::process::Command::new("ip")
        .args([
            "netns", "exec", &ns.name, "nft", "-j", "-t", "list", "ruleset",
        ])
        .output()
        .expect("nft -j");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    istio_cni::rules::nft_decode::decode_listing(&String::from_utf8_lossy(&out.stdout), OURS)
        .expect("read the tables back")
}

fn foreign_rules(state: &NativeState) -> Vec<String> {
    let mut foreign = Vec::new();
    for (table, t) in &state.tables {
        for (chain, c) in &t.chains {
            for (i, rule) in c.rules.iter().enumerate() {
                if let Err(e) = rule {
                    foreign.push(format!("{table}/{chain} rule {i}: {e}"));
                }
            }
        }
    }
    foreign
}

#[test]
fn every_golden_nft_rule_set_reads_back_as_the_model_that_produced_it() {
    require_tool("nft", "nftables");
    let mut failures = Vec::new();
    let mut checked = Vec::new();
    let mut not_applicable = Vec::new();
    for golden in goldens() {
        let ns = Netns::new("nftread");
        if let Err(refused) = apply(&ns, &golden.text) {
            // Only an owner group this host does not have (Istio's `java`) may refuse.
            assert!(
                refused.contains("Group does not exist"),
                "{}: nft refused the golden: {refused}",
                golden.name
            );
            not_applicable.push(golden.name);
            continue;
        }
        let got = read_back(&ns);
        let over_netlink = ns
            .spawn(|| read_native_netlink(OURS))
            .join()
            .unwrap()
            .expect("read the tables back over netlink");
        if over_netlink != golden.want {
            failures.push(format!(
                "{} over netlink: {}\n{:?}",
                golden.name,
                difference(&golden.want, &over_netlink)
                    .unwrap_or_else(|| "equal by difference".into()),
                foreign_rules(&over_netlink)
            ));
        }
        let foreign = foreign_rules(&got);
        if !foreign.is_empty() {
            failures.push(format!(
                "{}: foreign rules:\n{}",
                golden.name,
                foreign.join("\n")
            ));
        } else if got != golden.want {
            failures.push(format!(
                "{}: {}\n--- planned\n{:#?}\n--- read back\n{got:#?}",
                golden.name,
                difference(&golden.want, &got).unwrap_or_else(|| "equal by difference".into()),
                golden.want
            ));
        }
        checked.push(golden.name);
    }
    eprintln!(
        "read back {} nftables goldens; not applicable on this host: {not_applicable:?}",
        checked.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(
        checked.len() >= 18 && not_applicable.len() <= 2,
        "too few goldens were applied: {checked:?}; not applicable: {not_applicable:?}"
    );
}

/// How the tables in `ns` differ from `want`, read both ways (nft's JSON, netlink): the two
/// reads must agree on whether they differ.
fn differs(ns: &Netns, want: &NativeState) -> Option<String> {
    let json = difference(want, &read_back(ns));
    let netlink = ns
        .spawn(|| read_native_netlink(OURS))
        .join()
        .unwrap()
        .expect("read over netlink");
    let over_netlink = difference(want, &netlink);
    assert_eq!(
        json.is_some(),
        over_netlink.is_some(),
        "JSON: {json:?}; netlink: {over_netlink:?}"
    );
    json
}

/// A rule changed behind our back (one appended, one with a statement the model cannot say,
/// a chain's policy, a table gone) is a difference, never equal, read either way.
#[test]
fn a_changed_rule_reads_back_as_a_difference() {
    require_tool("nft", "nftables");
    let cfg = ambient::AmbientConfig::default();
    let rules = ambient::inpod_nft_rules(&cfg, &ambient::PodOverrides::default());
    let want = expected(&rules, &NftTable::AMBIENT_POD, &[]);
    let ns = Netns::new("nftreaddiff");
    let text = istio_cni::apply::ambient::inpod_nft_transaction(&cfg, &Default::default()).render();
    apply(&ns, &text).expect("apply");
    assert_eq!(differs(&ns, &want), None, "as applied");

    // Each change on top of the applied rules, and what the difference must name.
    let t = "inet istio-ambient-nat";
    let accept_port = |port| {
        vec![
            "add",
            "rule",
            t,
            "istio-output",
            "tcp",
            "dport",
            port,
            "accept",
        ]
    };
    let changes: [(&str, Vec<&str>, &str); 4] = [
        ("an appended rule", accept_port("80"), "istio-output"),
        (
            "a foreign statement",
            vec!["insert", "rule", t, "istio-output", "log", "accept"],
            "foreign",
        ),
        ("an appended set rule", accept_port("{ 80, 81 }"), ""),
        (
            "a policy",
            vec![
                "add", "chain", t, "output", "{", "type", "nat", "hook", "output", "priority",
                "-100", ";", "policy", "drop", ";", "}",
            ],
            "hook",
        ),
    ];
    for (what_changed, args, named) in changes {
        apply(&ns, &text).expect("re-apply");
        assert_eq!(
            differs(&ns, &want),
            None,
            "re-applied before {what_changed}"
        );
        ns.exec("nft", &args);
        let what = differs(&ns, &want).unwrap_or_else(|| panic!("{what_changed} not seen"));
        assert!(what.contains(named), "{what_changed}: {what}");
    }

    ns.exec("nft", &["delete", "table", "inet", "istio-ambient-mangle"]);
    let what = differs(&ns, &want).expect("a table gone");
    assert!(what.contains("istio-ambient-mangle missing"), "{what}");
}

/// An executor that starts nothing: the native backend's read must not need a process.
struct NoProcess;

impl istio_cni::apply::Executor for NoProcess {
    fn run(
        &mut self,
        cmd: &istio_cni::apply::Cmd,
    ) -> Result<istio_cni::apply::CmdOutput, istio_cni::apply::exec::SpawnError> {
        panic!("the native nft read started {}", cmd.display());
    }
}

/// The native backend reads over netlink, starting no process, and its diff finds the plan.
#[test]
fn the_native_backend_reads_without_a_process() {
    use istio_cni::apply::rule_backend::{Diff, NativeNft, RuleBackend};
    require_tool("nft", "nftables");
    let cfg = ambient::AmbientConfig::default();
    let pod = ambient::PodOverrides::default();
    let ns = Netns::new("nftreadnoproc");
    apply(
        &ns,
        &istio_cni::apply::ambient::inpod_nft_transaction(&cfg, &pod).render(),
    )
    .expect("apply");
    let planned = istio_cni::apply::ambient::inpod_nft_expected(&cfg, &pod);
    let same = ns
        .spawn(move || {
            let backend = NativeNft {
                prefix: istio_cni::apply::ambient::OUR_NFT_TABLES,
            };
            let owned = backend.read_owned(&mut NoProcess, &[]).expect("read");
            matches!(backend.diff(&planned, &owned), Diff::Same)
        })
        .join()
        .unwrap();
    assert!(same, "the applied in-pod tables read back as the plan");
}
