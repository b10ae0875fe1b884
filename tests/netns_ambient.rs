//! The ambient data plane for real, in uniquely named network namespaces (removed on drop): a
//! "host" netns entered through a fixture host /proc (`1/ns/net` links to it; a fake kubelet
//! process gives the nftables rule its UID), and pods joined to a server netns by a veth pair.
//! In-pod rules equal what Istio's golden restore/transaction produces, a second run changes
//! nothing, removal leaves nothing, traffic is redirected to ztunnel's ports, and the probe sets
//! keep every member while an agent restarts.

mod support;

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use istio_cni::agent::dataplane::{Dataplane, PodNet};
use istio_cni::apply::RuleChange;
use istio_cni::rules::ambient::PodOverrides;
use support::{FakeHost, Netns as TestNetns, PodAndServer, accept_within, require_dataplane_tools};

/// A fake host with DNS capture on, as the cases here expect.
fn ambient_host(tag: &str) -> FakeHost {
    FakeHost {
        redirect_dns: true,
        ..FakeHost::new(tag)
    }
}

fn text(out: std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// iptables-save without comments, counters and the built-in chains' policy lines.
fn iptables_rules(ns: &TestNetns) -> String {
    text(ns.exec("iptables-save", &[]))
        .lines()
        .filter(|l| !l.starts_with('#') && (!l.starts_with(':') || l.starts_with(":ISTIO")))
        .map(|l| l.split(" [").next().unwrap_or(l).to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

/// `nft list ruleset` without counter values and handles.
fn nft_rules(ns: &TestNetns) -> String {
    text(ns.exec("nft", &["list", "ruleset"]))
        .lines()
        .map(|l| match l.find("counter packets") {
            Some(at) => {
                let tail = l[at..].splitn(6, ' ').nth(5).unwrap_or("");
                format!("{}counter {tail}", &l[..at])
            }
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The restore input of an iptables golden (everything after the two recorded saves).
fn golden_restore(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/testdata/istio/cni/pkg/iptables/testdata")
        .join(name);
    let golden = std::fs::read_to_string(path).unwrap();
    let mut lines: Vec<&str> = golden.lines().skip(2).collect();
    lines.push("");
    lines.join("\n")
}

fn golden_nft(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/testdata/istio/cni/pkg/nftables/testdata")
            .join(name),
    )
    .unwrap()
}

fn pod(env: &PodAndServer) -> PodNet {
    PodNet {
        uid: "11111111-2222-3333-4444-555555555555".into(),
        name: "app".into(),
        namespace: "default".into(),
        ips: vec![env.pod_ip.parse().unwrap()],
        overrides: PodOverrides::default(),
    }
}

fn open(ns: &TestNetns) -> istio_cni::netns::Netns {
    istio_cni::netns::Netns::open(Path::new(&ns.path())).unwrap()
}

fn pipe_into(ns: &TestNetns, program: &str, args: &[&str], input: &str) {
    use std::io::Write;
    let mut child = std::process::Command::new("ip")
        .args(["netns", "exec", &ns.name, program])
        .args(args)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success(), "{program} {args:?} failed");
}

/// Connections into and out of the pod land on ztunnel's ports inside the pod.
fn assert_redirected(env: &PodAndServer) {
    let inbound = env.pod.listen("0.0.0.0:15006");
    let target = format!("{}:8080", env.pod_ip);
    assert!(env.server.connect(&target), "inbound connect to {target}");
    let orig = accept_within(&inbound, Duration::from_secs(2)).expect("nothing on 15006");
    assert_eq!(orig.to_string(), target);
    let outbound = env.pod.listen("0.0.0.0:15001");
    let target = format!("{}:80", env.server_ip);
    assert!(env.pod.connect(&target), "outbound connect to {target}");
    let orig = accept_within(&outbound, Duration::from_secs(2)).expect("nothing on 15001");
    assert_eq!(orig.to_string(), target);
}

fn assert_policy_routing(env: &PodAndServer, present: bool) {
    let rules = text(env.pod.exec("ip", &["rule"]));
    let route = text(env.pod.exec("ip", &["route", "show", "table", "100"]));
    let rule = "32764:\tfrom all fwmark 0x111/0xfff lookup 100";
    assert_eq!(rules.contains(rule), present, "{rules}");
    assert_eq!(route.contains("local default dev lo"), present, "{route}");
}

#[test]
fn inpod_iptables_equals_the_golden_is_idempotent_redirects_and_is_removed() {
    require_dataplane_tools();
    let host = ambient_host("aih");
    let env = PodAndServer::new("aip");
    let reference = TestNetns::new("air");
    pipe_into(
        &reference,
        "iptables-restore",
        &["--noflush"],
        &golden_restore("default.golden"),
    );

    let dp = Dataplane::new(&host.settings(false, false)).expect("data plane");
    let netns = open(&env.pod);
    let pod = pod(&env);
    // A new pod's netns with iptables-nft: one nf_tables transaction, no iptables process.
    let outcome = dp.program_pod(&netns, &pod).expect("program");
    assert_eq!(outcome, RuleChange::AppliedOverNetlink);
    assert_eq!(iptables_rules(&env.pod), iptables_rules(&reference));
    assert_policy_routing(&env, true);
    assert_redirected(&env);

    // A second run writes nothing: the counters the traffic above left stay.
    let counters = text(env.pod.exec("iptables-save", &["-c"]));
    assert!(
        counters.contains("-A ISTIO_PRERT")
            && !counters.contains("[0:0] -A PREROUTING -j ISTIO_PRERT"),
        "{counters}"
    );
    let outcome = dp.program_pod(&netns, &pod).expect("program again");
    assert_eq!(outcome, RuleChange::AlreadyApplied);
    let again = text(env.pod.exec("iptables-save", &["-c"]));
    let strip = |s: &str| {
        s.lines()
            .filter(|l| !l.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(strip(&again), strip(&counters));

    dp.unprogram_pod(&netns, &pod).expect("unprogram");
    let left = iptables_rules(&env.pod);
    assert!(!left.contains("ISTIO"), "{left}");
    assert_policy_routing(&env, false);
}

#[test]
fn inpod_iptables_converges_when_the_pod_settings_change() {
    require_dataplane_tools();
    let host = ambient_host("aich");
    let env = PodAndServer::new("aicp");
    let reference = TestNetns::new("aicr");
    pipe_into(
        &reference,
        "iptables-restore",
        &["--noflush"],
        &golden_restore("ingress.golden"),
    );
    let dp = Dataplane::new(&host.settings(false, false)).expect("data plane");
    let netns = open(&env.pod);
    let mut pod = pod(&env);
    dp.program_pod(&netns, &pod).expect("program with DNS");
    // Now an ingress pod without DNS: raw goes, inbound capture goes; exactly the golden remains.
    pod.overrides = PodOverrides {
        ingress: true,
        dns: istio_cni::rules::ambient::PodDns::Disabled,
        ..Default::default()
    };
    dp.program_pod(&netns, &pod).expect("program as ingress");
    assert_eq!(iptables_rules(&env.pod), iptables_rules(&reference));
}

#[test]
fn a_bad_virtual_interface_annotation_is_refused_before_anything_is_programmed() {
    require_dataplane_tools();
    let host = ambient_host("abvh");
    let env = PodAndServer::new("abvp");
    let netns = open(&env.pod);
    let mut pod = pod(&env);
    for nft in [false, true] {
        let dp = Dataplane::new(&host.settings(nft, false)).expect("data plane");
        // ':' passes iptables but is no interface name; the second would become rule arguments.
        for bad in ["tun0:1", "eth0 -j ACCEPT"] {
            pod.overrides.virtual_interfaces = vec!["ok0".into(), bad.into()];
            let err = dp.program_pod(&netns, &pod).unwrap_err().to_string();
            assert!(
                err.contains("istio.io/reroute-virtual-interfaces")
                    && err.contains(&format!("{bad:?}"))
                    && err.contains("default/app"),
                "{err}"
            );
            let rules = iptables_rules(&env.pod);
            assert!(!rules.contains("ISTIO"), "programmed:\n{rules}");
            let ruleset = nft_rules(&env.pod);
            assert!(!ruleset.contains("istio"), "programmed:\n{ruleset}");
        }
    }
    // A good name (and iptables' wildcard) is programmed.
    pod.overrides.virtual_interfaces = vec!["tun0".into(), "veth+".into()];
    let dp = Dataplane::new(&host.settings(false, false)).expect("data plane");
    dp.program_pod(&netns, &pod).expect("program");
    assert!(iptables_rules(&env.pod).contains("-A ISTIO_PRERT -i veth+ -p tcp"));
}

#[test]
fn inpod_nftables_equals_the_golden_is_stable_redirects_and_is_removed() {
    require_dataplane_tools();
    let host = ambient_host("anh");
    let env = PodAndServer::new("anp");
    let reference = TestNetns::new("anr");
    pipe_into(
        &reference,
        "nft",
        &["-f", "-"],
        &golden_nft("default.golden"),
    );

    let dp = Dataplane::new(&host.settings(true, false)).expect("data plane");
    let netns = open(&env.pod);
    let pod = pod(&env);
    dp.program_pod(&netns, &pod).expect("program");
    assert_eq!(nft_rules(&env.pod), nft_rules(&reference));
    assert_policy_routing(&env, true);
    assert_redirected(&env);
    // Unchanged: nothing is written (rule handles and counters stay).
    let handles = text(env.pod.exec("nft", &["-a", "list", "ruleset"]));
    let outcome = dp.program_pod(&netns, &pod).expect("program again");
    assert_eq!(outcome, RuleChange::AlreadyApplied);
    assert_eq!(
        text(env.pod.exec("nft", &["-a", "list", "ruleset"])),
        handles
    );
    assert_eq!(nft_rules(&env.pod), nft_rules(&reference));

    dp.unprogram_pod(&netns, &pod).expect("unprogram");
    assert_eq!(nft_rules(&env.pod).trim(), "");
    assert_policy_routing(&env, false);
}

/// The host netns holds the probe SNAT rule as Istio's golden has it (iptables), or our table with
/// the kubelet UID found in the host /proc (nftables).
#[test]
fn host_rules_are_programmed_in_the_host_netns() {
    require_dataplane_tools();
    let host = ambient_host("ahr");
    let reference = TestNetns::new("ahrr");
    pipe_into(
        &reference,
        "ipset",
        &["restore"],
        "create istio-inpod-probes-v4 hash:ip family inet comment\n",
    );
    pipe_into(
        &reference,
        "iptables-restore",
        &["--noflush"],
        &golden_restore("hostprobe.golden"),
    );
    let _dp = Dataplane::new(&host.settings(false, false)).expect("iptables data plane");
    assert_eq!(iptables_rules(&host.netns), iptables_rules(&reference));
    // Constructing again (an agent restart) changes nothing.
    let before = text(host.netns.exec("iptables-save", &["-c"]));
    let _dp = Dataplane::new(&host.settings(false, false)).expect("again");
    assert_eq!(
        text(host.netns.exec("iptables-save", &["-c"]))
            .lines()
            .filter(|l| !l.starts_with('#'))
            .collect::<Vec<_>>(),
        before
            .lines()
            .filter(|l| !l.starts_with('#'))
            .collect::<Vec<_>>()
    );

    let nft_host = ambient_host("ahn");
    let dp = Dataplane::new(&nft_host.settings(true, false)).expect("nft data plane");
    assert_eq!(
        dp.decision().backend,
        istio_cni::apply::pod::Backend::Nftables
    );
    let listed = nft_rules(&nft_host.netns);
    assert!(listed.contains("meta l4proto tcp meta skuid 4242 ip daddr @istio-inpod-probes-v4 counter snat ip to 169.254.7.127"), "{listed}");
}

fn ipset_entries(ns: &TestNetns) -> HashMap<IpAddr, String> {
    istio_cni_testing::listings::parse_ipset_save(&text(ns.try_exec("ipset", &["save"])))
        .into_iter()
        .collect()
}

fn nft_entries(ns: &TestNetns) -> HashMap<IpAddr, String> {
    let out = ns.try_exec(
        "nft",
        &[
            "list",
            "set",
            "inet",
            "istio-ambient-nat",
            "istio-inpod-probes-v4",
        ],
    );
    istio_cni_testing::listings::parse_nft_set(&text(out))
        .into_iter()
        .collect()
}

fn probe_set_lifecycle(nft: bool) {
    require_dataplane_tools();
    let host = ambient_host(if nft { "apn" } else { "api" });
    let entries = |ns: &TestNetns| {
        if nft {
            nft_entries(ns)
        } else {
            ipset_entries(ns)
        }
    };
    let dp = Dataplane::new(&host.settings(nft, false)).expect("data plane");
    let ip: IpAddr = "10.77.0.1".parse().unwrap();
    dp.probe_add("old-uid", &[ip], None).unwrap();
    assert_eq!(entries(&host.netns)[&ip], "old-uid");
    // The IP is reused by a new pod: it takes the entry.
    dp.probe_add("new-uid", &[ip], None).unwrap();
    assert_eq!(entries(&host.netns)[&ip], "new-uid");
    // The old pod's removal leaves the new pod's entry.
    dp.probe_remove("old-uid", &[ip], None).unwrap();
    assert_eq!(entries(&host.netns)[&ip], "new-uid");
    dp.probe_remove("new-uid", &[ip], None).unwrap();
    assert!(!entries(&host.netns).contains_key(&ip));

    // 20 enrolled pods and one stranger; the agent restarts and re-syncs while a poller watches.
    let members: Vec<(String, Vec<IpAddr>)> = (1..=20)
        .map(|i| {
            (
                format!("pod-{i}"),
                vec![format!("10.77.1.{i}").parse().unwrap()],
            )
        })
        .collect();
    dp.probe_sync(&members, false).unwrap();
    dp.probe_add("stranger", &["10.77.2.1".parse().unwrap()], None)
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (poll_stop, name, want) = (stop.clone(), host.netns.name.clone(), members.clone());
    let poller = std::thread::spawn(move || {
        let ns = TestNetns { name };
        let mut polls = 0;
        let mut missing = Vec::new();
        while !poll_stop.load(Ordering::SeqCst) {
            let now = if nft {
                nft_entries(&ns)
            } else {
                ipset_entries(&ns)
            };
            for (uid, ips) in &want {
                if now.get(&ips[0]) != Some(uid) {
                    missing.push(format!("{uid} missing at poll {polls}"));
                }
            }
            polls += 1;
        }
        std::mem::forget(ns); // owned by the test, not the poller
        (polls, missing)
    });
    std::thread::sleep(Duration::from_millis(50));
    let restarted = Dataplane::new(&host.settings(nft, false)).expect("restart");
    restarted.probe_sync(&members, true).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    stop.store(true, Ordering::SeqCst);
    let (polls, missing) = poller.join().unwrap();
    assert!(polls > 0);
    assert!(missing.is_empty(), "{missing:?}");
    let now = entries(&host.netns);
    assert_eq!(now.len(), 20, "{now:?}");
    assert!(!now.contains_key(&"10.77.2.1".parse::<IpAddr>().unwrap()));
}

#[test]
fn ipset_probe_set_replaces_removes_own_and_syncs_without_flush() {
    probe_set_lifecycle(false);
}

#[test]
fn nft_probe_set_replaces_removes_own_and_syncs_without_flush() {
    probe_set_lifecycle(true);
}

#[test]
fn the_proc_scan_finds_a_real_pod_netns_by_its_ip() {
    require_dataplane_tools();
    let host = ambient_host("afh");
    let env = PodAndServer::new("afp");
    // A process living in the pod netns, in a fake pod cgroup: the fixture /proc links to it.
    let mut sleeper = std::process::Command::new("ip")
        .args(["netns", "exec", &env.pod.name, "sleep", "30"])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let uid = "99999999-8888-7777-6666-555555555555";
    let real = Path::new("/proc").join(sleeper.id().to_string());
    let dir = host.proc.path().join("700");
    std::fs::create_dir_all(dir.join("ns")).unwrap();
    std::os::unix::fs::symlink(env.pod.path(), dir.join("ns/net")).unwrap();
    std::fs::copy(real.join("stat"), dir.join("stat")).unwrap();
    std::fs::write(
        dir.join("cgroup"),
        format!("0::/kubepods/besteffort/pod{uid}/{}\n", "e".repeat(64)),
    )
    .unwrap();

    let mut settings = host.settings(false, false);
    settings.skip_host_rules = true;
    let dp = Dataplane::new(&settings).unwrap();
    let wanted = HashMap::from([(uid.to_string(), vec![env.pod_ip.parse().unwrap()])]);
    let found = dp.find_netns(&wanted);
    assert_eq!(found.get(uid), Some(&open(&env.pod)));
    // The wrong IP: not the pod's netns.
    let wrong = HashMap::from([(uid.to_string(), vec!["10.99.99.99".parse().unwrap()])]);
    assert!(dp.find_netns(&wrong).is_empty());
    let _ = sleeper.kill();
    let _ = sleeper.wait();
}
