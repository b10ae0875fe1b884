//! One plugin differential case run for real: the pod on the shared control plane, then for each
//! plugin a fresh network namespace, the chain's ADD (`bridge` + `static` IPAM, then the plugin),
//! the kernel state, the chain's DEL and the state again. What each run saw is an [`Outcome`].

use std::path::{Path, PathBuf};

use istio_cni_testing::controlplane::{self, ControlPlane, unique_name};
use serde_json::{Value, json};

use super::cni_driver::{LinkGuard, NetnsGuard, run_cni, unique};
use super::plugin_gen::{PodCase, Space};

/// Which plugin a run used.
#[derive(Clone, Copy, Debug)]
pub enum Side {
    Istio,
    Ours,
}

/// Everything one plugin run showed.
#[derive(Debug, Default)]
pub struct Outcome {
    pub add_code: i32,
    pub add_result: String,
    pub add_kernel: String,
    pub del_code: i32,
    pub del_result: String,
    pub del_kernel: String,
    /// The keys of the ADD's error JSON, empty on success.
    pub add_error_keys: String,
    /// The kernel state right after the primary plugin, before the plugin under test.
    pub before: String,
    /// Both calls' stdout and stderr, for the allowlist's `*_said`.
    pub logs: String,
}

impl Outcome {
    /// The compared parts that differ between two runs.
    pub fn differences(&self, other: &Outcome) -> Vec<String> {
        let parts = |o: &Outcome| {
            [
                ("add-exit", o.add_code.to_string()),
                ("add-result", o.add_result.clone()),
                ("add-error-keys", o.add_error_keys.clone()),
                ("add-kernel", without_empty_tables(&o.add_kernel)),
                ("add-empty-tables", o.add_kernel.clone()),
                ("del-exit", o.del_code.to_string()),
                ("del-result", o.del_result.clone()),
                ("del-kernel", without_empty_tables(&o.del_kernel)),
                ("del-empty-tables", o.del_kernel.clone()),
            ]
        };
        // The raw states differing only where the kernel states agree: empty tables alone.
        let kernel_too = |d: &str| d.replace("empty-tables", "kernel");
        // Error keys compare only when both failed: one failing is add-exit already.
        let both_failed = self.add_code != 0 && other.add_code != 0;
        let differing: Vec<String> = parts(self)
            .into_iter()
            .zip(parts(other))
            .filter(|(a, b)| a.1 != b.1 && (a.0 != "add-error-keys" || both_failed))
            .map(|(a, _)| a.0.to_string())
            .collect();
        differing
            .iter()
            .filter(|d| !d.ends_with("empty-tables") || !differing.contains(&kernel_too(d)))
            .cloned()
            .collect()
    }

    pub fn output(&self) -> &str {
        &self.logs
    }

    /// Whether the plugin left the netns other than the primary plugin did.
    pub fn changed_netns(&self) -> bool {
        self.add_code == 0 && self.add_kernel != self.before
    }

    /// The differing parts, Istio's then ours, for a report.
    pub fn side_by_side(&self, ours: &Outcome) -> String {
        let mut s = String::new();
        let pick = |o: &Outcome, d: &str| match d {
            "add-exit" => o.add_code.to_string(),
            "add-result" => o.add_result.clone(),
            "add-kernel" => without_empty_tables(&o.add_kernel),
            "add-error-keys" => o.add_error_keys.clone(),
            "add-empty-tables" => o.add_kernel.clone(),
            "del-empty-tables" => o.del_kernel.clone(),
            "del-exit" => o.del_code.to_string(),
            "del-result" => o.del_result.clone(),
            _ => without_empty_tables(&o.del_kernel),
        };
        for d in self.differences(ours) {
            let (a, b) = (pick(self, &d), pick(ours, &d));
            if d.ends_with("kernel") || d.ends_with("tables") {
                s += &format!("  {d} (lines of one side only):\n{}", line_diff(&a, &b));
            } else {
                s += &format!("  {d}:\n    Istio: {a}\n    ours:  {b}\n");
            }
        }
        let tail = |t: &str| t.lines().rev().take(4).collect::<Vec<_>>().join(" | ");
        s += &format!(
            "  Istio said: {}\n  we said:    {}\n",
            tail(&self.logs),
            tail(&ours.logs)
        );
        s
    }
}

/// The lines only one side has, each under the section (`== tool`) it is in.
fn line_diff(istio: &str, ours: &str) -> String {
    let sectioned = |t: &str| {
        let mut section = "";
        let mut out = Vec::new();
        for l in t.lines() {
            if l.starts_with("== ") {
                section = l;
            }
            out.push(format!("{section}: {l}"));
        }
        out
    };
    let (a, b) = (sectioned(istio), sectioned(ours));
    let only = |x: &[String], y: &[String], who: &str| {
        let set: std::collections::HashSet<&String> = y.iter().collect();
        x.iter()
            .filter(|l| !set.contains(l))
            .map(|l| format!("    {who} {l}\n"))
            .collect::<String>()
    };
    let mut s = only(&a, &b, "Istio only:") + &only(&b, &a, "ours only: ");
    if s.is_empty() {
        // The same lines in another order: the first place they part.
        let at = a
            .iter()
            .zip(&b)
            .position(|(x, y)| x != y)
            .unwrap_or(a.len().min(b.len()));
        let near = |x: &[String]| x[at.saturating_sub(1)..(at + 3).min(x.len())].join(" / ");
        s = format!(
            "    same lines, other order at line {at}:\n    Istio: {}\n    ours:  {}\n",
            near(&a),
            near(&b)
        );
    }
    s
}

/// The run's fixed parts: the control plane's namespaces, each plugin's run dir (its own
/// kubeconfig) and bin dir, one bridge per job.
pub struct World {
    cp: &'static ControlPlane,
    namespaces: [String; 3],
    run_dirs: [tempfile::TempDir; 2],
    bin_dirs: [tempfile::TempDir; 2],
    bridges: Vec<String>,
    _links: Vec<LinkGuard>,
    net: String,
}

fn istio_plugin() -> PathBuf {
    let dir = std::env::var_os("ISTIO_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/istio"));
    let bin = dir.join("istio-cni");
    assert!(
        bin.is_file(),
        "{} is missing: run scripts/build-istio to build Istio's binaries",
        bin.display()
    );
    bin
}

fn bin_dir(plugin: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::symlink(plugin, dir.path().join("istio-cni")).expect("symlink");
    dir
}

impl World {
    pub fn new(jobs: usize) -> World {
        for plugin in ["bridge", "static"] {
            assert!(
                Path::new("/usr/lib/cni").join(plugin).is_file(),
                "/usr/lib/cni/{plugin} is required: apt-get install containernetworking-plugins"
            );
        }
        let cp = controlplane::shared();
        let namespaces = ["app", "amb", "excl"].map(|t| unique_name(&format!("pdiff-{t}")));
        cp.create_namespace(&namespaces[0], &[]);
        cp.create_namespace(&namespaces[1], &[("istio.io/dataplane-mode", "ambient")]);
        cp.create_namespace(&namespaces[2], &[]);
        let run_dirs = [(); 2].map(|_| tempfile::tempdir().expect("tempdir"));
        for dir in &run_dirs {
            std::fs::copy(
                cp.admin_kubeconfig(),
                dir.path().join("istio-cni-kubeconfig"),
            )
            .expect("kubeconfig");
        }
        let bins = [
            bin_dir(&istio_plugin()),
            bin_dir(&super::cni_driver::binary()),
        ];
        let bridges: Vec<String> = (0..jobs).map(|_| unique("pdb")).collect();
        World {
            cp,
            namespaces,
            run_dirs,
            bin_dirs: bins,
            _links: bridges.iter().cloned().map(LinkGuard).collect(),
            bridges,
            net: unique("pdnet"),
        }
    }

    fn namespace(&self, space: Space) -> &str {
        &self.namespaces[match space {
            Space::Plain => 0,
            Space::Ambient => 1,
            Space::Excluded => 2,
        }]
    }

    fn address(slot: usize) -> String {
        format!("10.{}.{}.2", 70 + std::process::id() % 10, slot + 1)
    }

    /// The pod on the API server (with its podIP), then each plugin's run.
    pub fn run_both(&self, case: &PodCase, slot: usize) -> (Outcome, Outcome) {
        let ns = self.namespace(case.space);
        let name = unique_name("pod");
        self.cp.create(&case.pod(ns, &name));
        let ip = Self::address(slot);
        self.cp.set_pod_status(
            ns,
            &name,
            json!({"phase": "Pending", "podIP": ip, "podIPs": [{"ip": ip}]}),
        );
        let istio = self.run(Side::Istio, case, ns, &name, slot);
        let ours = self.run(Side::Ours, case, ns, &name, slot);
        (istio, ours)
    }

    fn plugin_conf(&self, side: Side, case: &PodCase) -> Value {
        let at = side as usize;
        json!({
            "type": "istio-cni",
            "plugin_log_level": "debug",
            "cni_agent_run_dir": self.run_dirs[at].path().display().to_string(),
            "ambient_enabled": case.ambient_enabled,
            "enablement_selectors": super::cni_driver::enablement_selectors(),
            "exclude_namespaces": [self.namespaces[2]],
            "pod_namespace": "istio-system",
            "native_nftables": case.native_nftables,
            "dns": {}, "ipam": {},
        })
    }

    fn run(&self, side: Side, case: &PodCase, ns: &str, pod: &str, slot: usize) -> Outcome {
        let netns = NetnsGuard::new("pd");
        let cni_path = std::env::join_paths([
            self.bin_dirs[side as usize].path(),
            Path::new("/usr/lib/cni"),
        ])
        .expect("CNI_PATH")
        .to_string_lossy()
        .into_owned();
        let env = |command: &str| {
            vec![
                ("CNI_COMMAND", command.to_string()),
                ("CNI_CONTAINERID", format!("c-{pod}")),
                ("CNI_NETNS", netns.path().display().to_string()),
                ("CNI_IFNAME", "eth0".to_string()),
                ("CNI_PATH", cni_path.clone()),
                (
                    "CNI_ARGS",
                    format!(
                        "IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={pod};K8S_POD_INFRA_CONTAINER_ID=c-{pod}"
                    ),
                ),
            ]
        };
        let stdin = |mut conf: Value, prev: Option<&Value>| {
            conf["name"] = json!(self.net);
            conf["cniVersion"] = json!("1.0.0");
            if let Some(p) = prev {
                conf["prevResult"] = p.clone();
            }
            conf.to_string()
        };
        let bridge = json!({
            "type": "bridge", "bridge": self.bridges[slot], "isGateway": false, "ipMasq": false,
            "ipam": {"type": "static", "addresses": [{"address": format!("{}/24", Self::address(slot))}]}
        });
        let primary = run_cni(
            &Path::new("/usr/lib/cni").join("bridge"),
            &[],
            &env("ADD"),
            &stdin(bridge.clone(), None),
        );
        assert_eq!(
            primary.code, 0,
            "bridge ADD: {}{}",
            primary.stdout, primary.stderr
        );
        let prev: Value = serde_json::from_str(&primary.stdout).expect("bridge result");
        let mut out = Outcome {
            before: kernel_state(&netns),
            ..Outcome::default()
        };
        let plugin = self.bin_dirs[side as usize].path().join("istio-cni");
        let conf = self.plugin_conf(side, case);
        let add = run_cni(&plugin, &[], &env("ADD"), &stdin(conf.clone(), Some(&prev)));
        out.add_code = add.code;
        out.add_result = normalise_result(&add.stdout, &netns);
        out.add_error_keys = error_keys(&add.stdout);
        out.add_kernel = kernel_state(&netns);
        let result: Value = serde_json::from_str(&add.stdout).unwrap_or_else(|_| prev.clone());
        let del = run_cni(&plugin, &[], &env("DEL"), &stdin(conf, Some(&result)));
        let _ = run_cni(
            &Path::new("/usr/lib/cni").join("bridge"),
            &[],
            &env("DEL"),
            &stdin(bridge, Some(&prev)),
        );
        out.del_code = del.code;
        out.del_result = normalise_result(&del.stdout, &netns);
        out.del_kernel = kernel_state(&netns);
        out.logs = format!(
            "{}\n{}\n{}\n{}",
            add.stdout, add.stderr, del.stdout, del.stderr
        );
        out
    }
}

/// A CNI result with what differs by namespace alone made constant (MACs, the host-side veth,
/// the netns path); an error is its code alone (its words are each plugin's own).
fn normalise_result(stdout: &str, netns: &NetnsGuard) -> String {
    let Ok(mut v) = serde_json::from_str::<Value>(stdout) else {
        return stdout.trim().to_string();
    };
    if let Some(o) = v.as_object_mut().filter(|o| o.contains_key("code")) {
        return format!("error code {}", o["code"]);
    }
    if let Some(ifaces) = v.get_mut("interfaces").and_then(Value::as_array_mut) {
        for i in ifaces {
            if i.get("mac").is_some() {
                i["mac"] = json!("MAC");
            }
            if i["name"].as_str().is_some_and(|n| n.starts_with("veth")) {
                i["name"] = json!("VETH");
            }
            if i["sandbox"].as_str() == Some(&netns.path().display().to_string()) {
                i["sandbox"] = json!("NETNS");
            }
        }
    }
    v.to_string()
}

/// The keys of an error JSON (`code,msg`), sorted; empty for a result.
fn error_keys(stdout: &str) -> String {
    match serde_json::from_str::<Value>(stdout) {
        Ok(Value::Object(o)) if o.contains_key("code") => {
            let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
            keys.sort_unstable();
            keys.join(",")
        }
        _ => String::new(),
    }
}

const STATE_SCRIPT: &str = "for t in iptables-nft-save iptables-legacy-save ip6tables-nft-save ip6tables-legacy-save; \
do echo \"== $t\"; $t 2>/dev/null | grep -v '^#'; done; \
echo '== nft'; nft list ruleset 2>&1; \
echo '== rules'; ip rule; ip -6 rule; \
echo '== routes'; ip route show table all; ip -6 route show table all; \
echo '== lo'; ip -6 addr show dev lo";

/// The netns's rules, policy rules, routes and lo's IPv6 address, without counters and without
/// what a random MAC decides (the link-local address).
fn kernel_state(netns: &NetnsGuard) -> String {
    let out = netns.exec("sh", &["-c", STATE_SCRIPT]);
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .filter(|l| !l.contains("fe80::") || l.contains("fe80::/64"))
        .filter(|l| !l.trim_start().starts_with("valid_lft"))
        .map(strip_counters)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The state without empty tables: an iptables-save table with no rule and only built-in chains
/// accepting, an nft base chain with no rule, an nft table with no chain left. Probing which
/// iptables to use, or a restore, leaves such tables; they change no packet's path.
pub fn without_empty_tables(state: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    let mut block: Vec<&str> = Vec::new();
    let mut in_save_table = false;
    for line in state.lines() {
        if line.starts_with('*') {
            in_save_table = true;
            block.clear();
        }
        if in_save_table {
            block.push(line);
            if line == "COMMIT" {
                in_save_table = false;
                let empty = block[1..block.len() - 1]
                    .iter()
                    .all(|l| l.starts_with(':') && l.ends_with(" ACCEPT"));
                if !empty {
                    out.append(&mut block);
                }
                block.clear();
            }
            continue;
        }
        out.push(line);
    }
    nft_without_empty(&out)
}

/// nft's listing without rule-less chains and then chain-less tables.
fn nft_without_empty(lines: &[&str]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i];
        if l.starts_with("\tchain ") && l.ends_with('{') {
            let end = (i..lines.len())
                .find(|&j| lines[j] == "\t}")
                .unwrap_or(lines.len() - 1);
            let body = &lines[i + 1..end];
            if !body
                .iter()
                .all(|b| b.trim().starts_with("type ") || b.trim().is_empty())
            {
                out.extend(lines[i..=end].iter().map(|s| s.to_string()));
            }
            i = end + 1;
            continue;
        }
        if !l.trim().is_empty() {
            out.push(l.to_string());
        }
        i += 1;
    }
    // Tables left with no chain go. The tables iptables-nft manages are in iptables-nft-save
    // already. The rest: tables and their chains in name order (nft lists them in creation
    // order, which says nothing about packets); rules keep theirs.
    let mut kept: Vec<String> = Vec::new();
    let mut tables: Vec<String> = Vec::new();
    let mut iptables_nft = false;
    let mut k = 0;
    while k < out.len() {
        if out[k].starts_with("table ") && out[k].ends_with('{') {
            let end = (k..out.len())
                .find(|&j| out[j] == "}")
                .unwrap_or(out.len() - 1);
            let body = &out[k + 1..end];
            if body.iter().any(|b| b.starts_with("\tchain ")) && !iptables_nft {
                tables.push(sorted_chains(&out[k], body));
            }
            iptables_nft = false;
            k = end + 1;
            continue;
        }
        if out[k].starts_with("# Warning: table") {
            iptables_nft = true;
        } else if !out[k].trim().is_empty() {
            tables.sort();
            kept.append(&mut tables);
            kept.push(out[k].clone());
        }
        k += 1;
    }
    tables.sort();
    kept.append(&mut tables);
    kept.join("\n")
}

/// One nft table as text with its chains in name order.
fn sorted_chains(header: &str, body: &[String]) -> String {
    let mut chains: Vec<String> = Vec::new();
    for line in body {
        if line.starts_with("\tchain ") || chains.is_empty() {
            chains.push(String::new());
        }
        let last = chains.last_mut().expect("a chain");
        last.push_str(line);
        last.push('\n');
    }
    chains.sort();
    format!("{header}\n{}}}", chains.concat())
}

/// `:CHAIN ACCEPT [12:345]` -> `:CHAIN ACCEPT`; nft's `counter packets 1 bytes 60` -> `counter`.
fn strip_counters(line: &str) -> String {
    let mut l = line.to_string();
    if let Some(at) = l.rfind(" [")
        && l.ends_with(']')
        && l[at + 2..l.len() - 1]
            .split(':')
            .all(|n| n.chars().all(|c| c.is_ascii_digit()))
    {
        l.truncate(at);
    }
    if let Some(at) = l.find("counter packets ") {
        let rest = &l[at + "counter packets ".len()..];
        let words: Vec<&str> = rest.splitn(4, ' ').collect();
        if words.len() >= 3 && words[1] == "bytes" {
            let tail = words.get(3).map(|t| format!(" {t}")).unwrap_or_default();
            l = format!("{}counter{tail}", &l[..at]);
        }
    }
    l
}
