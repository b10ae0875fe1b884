//! No role starts an `nft` process: native nftables is written and read over nfnetlink only, so
//! a host or image without nft (or with an nft that cannot talk to this kernel, or built without
//! JSON) is served the same. Three checks:
//! * no code path in `src/` builds a command for `nft` (a source scan);
//! * `istio-iptables --native-nftables` run with a PATH holding no `nft` applies a golden case,
//!   heals a flushed chain with `--reconcile` and removes everything with `--cleanup-only`; the
//!   sidecar plugin with `native_nftables` applies what its dry run says and heals on the next ADD;
//! * the ambient in-pod and host nftables paths, run by this test binary re-executed inside the
//!   pod's netns with a PATH holding no `nft`, apply, report and heal drift, and remove.
//!
//! After every step `nft -j list ruleset`, run by this test from /usr/sbin, must list exactly
//! what `nft -f` of Istio's golden lists in another netns.

mod support;

#[path = "support/cases.rs"]
mod cases;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use support::{Netns, require_tool};

/// A PATH with the usual tool directories but not the sbin ones nft lives in.
const NO_NFT_PATH: &str = "/usr/bin:/bin";
const NFT: &str = "/usr/sbin/nft";

fn assert_no_nft_on(path: &str) {
    for dir in path.split(':') {
        assert!(
            !Path::new(dir).join("nft").exists(),
            "{dir} holds nft: the test PATH must not"
        );
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Whether a line builds or looks up an `nft` command.
fn starts_nft(line: &str) -> bool {
    let compact: String = line.split_whitespace().collect();
    [
        "Command::new(\"nft\"",
        "Cmd::new(\"nft\"",
        "find_on_path(\"nft\"",
        "run_with_deadline(\"nft\"",
        "\"/usr/sbin/nft\"",
        "\"/sbin/nft\"",
    ]
    .iter()
    .any(|p| compact.contains(p))
}

#[test]
fn no_code_path_in_src_starts_nft() {
    let mut files = Vec::new();
    rust_files(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    assert!(files.len() > 50, "found the sources");
    let mut hits = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read");
        for (i, line) in text.lines().enumerate() {
            if starts_nft(line) {
                hits.push(format!("{}:{}: {}", file.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(hits.is_empty(), "nft started from:\n{}", hits.join("\n"));
    assert!(starts_nft("let c = Cmd::new( \"nft\", [\"-f\", \"-\"]);"));
}

/// `nft -j list ruleset` in `ns` without handles and metainfo.
fn listing(ns: &Netns) -> Value {
    listing_in(&ns.name)
}

fn listing_in(netns: &str) -> Value {
    let out = Command::new("ip")
        .args(["netns", "exec", netns, NFT, "-j", "list", "ruleset"])
        .output()
        .expect("nft -j");
    assert!(
        out.status.success(),
        "{}",
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

/// A netns holding what `nft -f` makes of `text`.
fn reference(text: &str) -> Value {
    let ns = Netns::new("nonftref");
    let mut child = Command::new("ip")
        .args(["netns", "exec", &ns.name, NFT, "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("nft");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), text.as_bytes()).unwrap();
    assert!(child.wait().unwrap().success(), "nft -f of the golden");
    listing(&ns)
}

fn golden(path: &str) -> String {
    std::fs::read_to_string(cases::testdata().join(path)).expect("golden")
}

/// Runs `program args` in `ns` with only `env` and the nft-less PATH.
fn run_without_nft(ns: &Netns, program: &str, args: &[String], env: &[(String, String)]) -> Output {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &ns.name, "/usr/bin/env", "-i"])
        .arg(format!("PATH={NO_NFT_PATH}"));
    for (k, v) in env {
        cmd.arg(format!("{k}={v}"));
    }
    let out = cmd.arg(program).args(args).output().expect("run");
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn is_empty_ruleset(v: &Value) -> bool {
    v["nftables"].as_array().is_some_and(|a| a.is_empty())
}

#[test]
fn sidecar_native_nftables_without_nft_applies_heals_and_cleans_up() {
    require_tool("nft", "nftables");
    assert_no_nft_on(NO_NFT_PATH);
    let case = cases::cases_under("tools/istio-nftables/pkg/capture/")
        .into_iter()
        .find(|c| {
            c["golden"]
                .as_str()
                .is_some_and(|g| g.ends_with("/tproxy.golden"))
        })
        .or_else(|| {
            cases::cases_under("tools/istio-nftables/pkg/capture/")
                .into_iter()
                .next()
        })
        .expect("a sidecar nftables case");
    let want = reference(&golden(case["golden"].as_str().unwrap()));
    let mut args = vec!["istio-iptables".to_string()];
    args.extend(
        cases::case_args(&case)
            .into_iter()
            .filter(|a| a != "--dry-run"),
    );
    let env = cases::case_env(&case);
    let bin = env!("CARGO_BIN_EXE_istio-cni-rs");
    let ns = Netns::new("nonftsc");

    run_without_nft(&ns, bin, &args, &env);
    assert_eq!(listing(&ns), want, "applied");

    // Drift: a chain flushed behind our back; --reconcile puts it back.
    ns.exec(
        NFT,
        &["flush", "chain", "inet", "istio-proxy-nat", "output"],
    );
    assert_ne!(listing(&ns), want, "the flush took");
    let mut reconcile = args.clone();
    reconcile.push("--reconcile".into());
    run_without_nft(&ns, bin, &reconcile, &env);
    assert_eq!(listing(&ns), want, "healed");

    let mut cleanup = args.clone();
    cleanup.push("--cleanup-only".into());
    run_without_nft(&ns, bin, &cleanup, &env);
    assert!(is_empty_ruleset(&listing(&ns)), "{}", listing(&ns));
}

/// The ambient nftables cases: (golden, case) of the first in-pod and the first host one.
fn ambient_cases() -> (String, Value, String, Value) {
    let all: Value = serde_json::from_str(&golden("cases.json")).expect("cases.json");
    let nft: Vec<&Value> = all
        .as_array()
        .expect("list")
        .iter()
        .filter(|c| {
            c["golden"]
                .as_str()
                .unwrap_or_default()
                .starts_with("cni/pkg/nftables/")
        })
        .collect();
    let name = |c: &Value| c["golden"].as_str().unwrap_or_default().to_string();
    let host = nft
        .iter()
        .find(|c| name(c).ends_with("hostprobe.golden"))
        .expect("a host case");
    let inpod = nft
        .iter()
        .find(|c| !name(c).ends_with("hostprobe.golden"))
        .expect("an in-pod case");
    (name(inpod), (*inpod).clone(), name(host), (*host).clone())
}

/// One step of the ambient paths, run by this binary re-executed in the pod's netns with the
/// nft-less PATH (the `NO_NFT_STEP` environment names it); prints what the step reported.
#[test]
#[ignore = "run by ambient_nftables_without_nft_applies_heals_and_cleans_up"]
fn ambient_step_in_this_netns() {
    use istio_cni::apply::ambient::{
        AmbientApply, program_host_here, program_inpod_here, remove_host_here, remove_inpod_here,
    };
    let Ok(step) = std::env::var("NO_NFT_STEP") else {
        return;
    };
    assert_no_nft_on(&std::env::var("PATH").unwrap_or_default());
    let (_, inpod, _, host) = ambient_cases();
    let opts = AmbientApply {
        nftables: true,
        force_binary: None,
        env: Vec::new(),
        userns: None,
    };
    let cfg = cases::ambient_config(&inpod["config"]["AmbientConfig"]);
    let pod = cases::overrides(&inpod["config"]["PodLevelOverrides"]);
    let host_cfg = cases::ambient_config(&host["config"]["AmbientConfig"]);
    let uid = host["config"]["kubeletUID"].as_str().unwrap_or("0");
    match step.as_str() {
        "inpod" => {
            let change = program_inpod_here(&cfg, &pod, &opts).expect("in-pod");
            println!("STEP inpod {change}");
        }
        "host" => {
            let heal = program_host_here(&host_cfg, uid, &opts).expect("host");
            println!("STEP host {heal:?}");
        }
        "remove" => {
            remove_inpod_here(&opts).expect("remove in-pod");
            remove_host_here(&opts, host_cfg.enable_ipv6).expect("remove host");
            println!("STEP removed");
        }
        other => panic!("unknown step {other}"),
    }
}

fn ambient_step(ns: &Netns, step: &str) -> String {
    let exe = std::env::current_exe().expect("this test binary");
    let args: Vec<String> = [
        "--exact",
        "ambient_step_in_this_netns",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]
    .map(String::from)
    .to_vec();
    let env = [("NO_NFT_STEP".to_string(), step.to_string())];
    let out = run_without_nft(ns, exe.to_str().unwrap(), &args, &env);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    text.lines()
        .find_map(|l| l.split_once("STEP ").map(|(_, said)| said.to_string()))
        .unwrap_or_else(|| panic!("step {step} said nothing: {text}"))
}

#[test]
fn ambient_nftables_without_nft_applies_heals_and_cleans_up() {
    require_tool("nft", "nftables");
    assert_no_nft_on(NO_NFT_PATH);
    let (inpod_golden, _, host_golden, _) = ambient_cases();
    let want_inpod = reference(&golden(&inpod_golden));
    let host_text = format!(
        "add table inet {}\n{}{}",
        istio_cni::apply::probe_set::NFT_TABLE,
        istio_cni::apply::probe_set::nft_set_declarations(false),
        golden(&host_golden)
    );
    let want_host = reference(&host_text);

    let pod = Netns::new("nonftpod");
    ambient_step(&pod, "inpod");
    assert_eq!(listing(&pod), want_inpod, "in-pod applied");
    let again = ambient_step(&pod, "inpod");
    ns_drift(&pod, "istio-ambient-nat");
    let healed = ambient_step(&pod, "inpod");
    assert_eq!(
        listing(&pod),
        want_inpod,
        "in-pod healed ({again}; {healed})"
    );

    let node = Netns::new("nonfthost");
    ambient_step(&node, "host");
    assert_eq!(listing(&node), want_host, "host applied");
    assert_eq!(ambient_step(&node, "host"), "host None", "nothing to heal");
    ns_drift(&node, "istio-ambient-nat");
    let heal = ambient_step(&node, "host");
    assert!(heal.starts_with("host Some("), "drift reported: {heal}");
    assert_eq!(listing(&node), want_host, "host healed");

    for ns in [&pod, &node] {
        ambient_step(ns, "remove");
        assert!(is_empty_ruleset(&listing(ns)), "{}", listing(ns));
    }
}

/// Drift behind our back: every rule of the table's base chains flushed.
fn ns_drift(ns: &Netns, table: &str) {
    let before = listing(ns);
    for chain in ["prerouting", "output", "postrouting"] {
        let _ = ns.try_exec(NFT, &["flush", "chain", "inet", table, chain]);
    }
    assert_ne!(listing(ns), before, "the drift took");
}

/// The sidecar plugin with `native_nftables`: its ADD, run with no nft on PATH, leaves what `nft
/// -f` makes of the transaction its dry run writes; a flushed chain is healed by the next ADD.
#[test]
fn plugin_native_nftables_without_nft_applies_and_heals() {
    use support::cni_driver::{
        NetnsGuard, api_with_sidecar_pod, cni_env, run_plugin, sidecar_conf,
    };
    require_tool("nft", "nftables");
    assert_no_nft_on(NO_NFT_PATH);
    let (_api, dir) = api_with_sidecar_pod("ns1", "nonft");
    let mut conf = sidecar_conf(dir.path(), "10.30.0.2/24");
    conf["native_nftables"] = serde_json::json!(true);
    let add = |ns: &NetnsGuard, extra: Option<(&'static str, String)>| {
        let mut env = cni_env("ADD", &ns.path().display().to_string(), "ns1", "nonft");
        env.push(("PATH", NO_NFT_PATH.to_string()));
        env.extend(extra);
        let run = run_plugin(&env, &conf.to_string());
        assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    };
    let dry = NetnsGuard::new("nonftdry");
    let text_file = dir.path().join("nft-dry-run.txt");
    add(
        &dry,
        Some(("DRY_RUN_FILE_PATH", text_file.display().to_string())),
    );
    let want = reference(&std::fs::read_to_string(&text_file).expect("dry run text"));

    let pod = NetnsGuard::new("nonftpl");
    add(&pod, None);
    let got = listing_in(&pod.name);
    assert_eq!(got, want, "applied");
    assert!(
        serde_json::to_string(&got)
            .unwrap()
            .contains("istio-proxy-nat"),
        "{got}"
    );
    pod.exec(
        NFT,
        &["flush", "chain", "inet", "istio-proxy-nat", "output"],
    );
    add(&pod, None);
    let healed = listing_in(&pod.name);
    assert_eq!(healed, want, "healed by the next ADD");
}
