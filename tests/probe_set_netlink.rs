//! The probe sets changed and read over netlink (ipset over nfnetlink, nft set elements) against
//! the real tools, the external oracle, each case in a fresh netns: what we add or delete is what
//! `ipset list -o save` / `nft -j list set` show, and what the tools add is what our reading
//! decodes. Plus the cost of one probe-set change through the data plane (printed).

mod support;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Instant;

use istio_cni::agent::dataplane::Dataplane;
use istio_cni::apply::exec::ProcessExecutor;
use istio_cni::apply::probe_set::{Entries, Ipsets, NftSets, ProbeSets, SetOp};
use istio_cni::rules::ambient::{PROBE_SET_V4, PROBE_SET_V6};
use istio_cni_testing::listings::parse_ipset_save;
use support::{FakeHost, Netns, require_dataplane_tools};

/// CPU time (user + system) of this process and its reaped children, in ms.
fn cpu_ms() -> f64 {
    let used = |who| {
        // SAFETY: getrusage fills the struct it is given.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(who, &mut u) };
        let ms = |t: libc::timeval| t.tv_sec as f64 * 1000.0 + t.tv_usec as f64 / 1000.0;
        ms(u.ru_utime) + ms(u.ru_stime)
    };
    used(libc::RUSAGE_SELF) + used(libc::RUSAGE_CHILDREN)
}

/// Times `n` adds then `n` removes of one pod each through the data plane, wall and CPU per
/// change (printed for the report; `strace -f -e trace=execve` on this test counts the
/// processes). Each change must spawn nothing.
fn measure(nft: bool) {
    require_dataplane_tools();
    let host = FakeHost::new(if nft { "pmn" } else { "pmi" });
    let dp = Dataplane::new(&host.settings(nft, false)).expect("data plane");
    let n = 200u32;
    let pods: Vec<(String, IpAddr)> = (0..n)
        .map(|i| {
            (
                format!("00000000-0000-4000-8000-{i:012}"),
                format!("10.78.{}.{}", i / 250, i % 250 + 1)
                    .parse()
                    .unwrap(),
            )
        })
        .collect();
    let per = |started: Instant, cpu: f64| {
        (
            started.elapsed().as_secs_f64() * 1000.0 / f64::from(n),
            (cpu_ms() - cpu) / f64::from(n),
        )
    };
    let (started, cpu) = (Instant::now(), cpu_ms());
    for (uid, ip) in &pods {
        dp.probe_add(uid, &[*ip], None).unwrap();
    }
    let (add, add_cpu) = per(started, cpu);
    let (started, cpu) = (Instant::now(), cpu_ms());
    for (uid, ip) in &pods {
        dp.probe_remove(uid, &[*ip], None).unwrap();
    }
    let (remove, remove_cpu) = per(started, cpu);
    println!(
        "probe set ({}): add {add:.3} ms ({add_cpu:.3} ms CPU), remove {remove:.3} ms \
         ({remove_cpu:.3} ms CPU) per change ({n} pods, one at a time, set of up to {n})",
        if nft { "nft" } else { "ipset" }
    );
}

#[test]
fn measure_ipset_changes() {
    measure(false);
}

#[test]
fn measure_nft_set_changes() {
    measure(true);
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn add(addr: &str, uid: &str) -> SetOp {
    SetOp::Add {
        ip: ip(addr),
        uid: uid.into(),
    }
}

fn del(addr: &str) -> SetOp {
    SetOp::Del { ip: ip(addr) }
}

fn text(out: std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `work` against `sets` on a thread inside `ns`.
fn inside<T: Send + 'static>(
    ns: &Netns,
    work: impl FnOnce(&dyn ProbeSets) -> T + Send + 'static,
    nft: bool,
) -> T {
    ns.spawn(move || {
        let sets: &dyn ProbeSets = if nft { &NftSets } else { &Ipsets };
        work(sets)
    })
    .join()
    .expect("netns thread")
}

/// Both sets as the tool lists them: `ipset list -o save`, or `nft -j list set` (JSON).
fn listed(ns: &Netns, nft: bool) -> Entries {
    let mut entries = Entries::new();
    for set in [PROBE_SET_V4, PROBE_SET_V6] {
        if !nft {
            entries.extend(parse_ipset_save(&text(
                ns.exec("ipset", &["list", "-o", "save", set]),
            )));
            continue;
        }
        let out = text(ns.exec(
            "nft",
            &["-j", "list", "set", "inet", "istio-ambient-nat", set],
        ));
        let json: serde_json::Value = serde_json::from_str(&out).expect("nft -j output");
        let sets = json["nftables"].as_array().expect("nftables array");
        let set = sets.iter().find_map(|o| o.get("set")).expect("a set");
        for elem in set["elem"].as_array().into_iter().flatten() {
            // A bare address, or {"elem": {"val": ADDRESS, "comment": UID}}.
            let (val, comment) = match elem.get("elem") {
                Some(e) => (&e["val"], e["comment"].as_str().unwrap_or_default()),
                None => (elem, ""),
            };
            let addr = val.as_str().unwrap_or_else(|| panic!("element {elem}"));
            entries.insert(ip(addr), comment.to_string());
        }
    }
    entries
}

fn entries(list: &[(&str, &str)]) -> Entries {
    list.iter().map(|(i, u)| (ip(i), u.to_string())).collect()
}

/// Our messages against the tool's listing, and the tool's adds against our reading.
fn conformance(nft: bool) {
    require_dataplane_tools();
    let ns = Netns::new(if nft { "psn" } else { "psi" });
    // The sets are missing: an add says so (the data plane then creates them).
    let refused = inside(&ns, |s| s.apply(&[add("10.0.0.1", "a")]), nft).unwrap_err();
    assert!(refused.set_missing(), "{refused}");
    assert!(inside(&ns, |s| s.entries(), nft).unwrap().is_empty());
    inside(
        &ns,
        |s| s.ensure(&mut ProcessExecutor::default(), true),
        nft,
    )
    .unwrap();

    let ops = vec![
        add("10.0.0.1", "00000000-0000-4000-8000-000000000001"),
        add("10.0.0.2", "uid-b"),
        add("fd00::1", "uid-c"),
        add("10.0.0.3", "uid-d"),
    ];
    inside(&ns, move |s| s.apply(&ops), nft).unwrap();
    let want = entries(&[
        ("10.0.0.1", "00000000-0000-4000-8000-000000000001"),
        ("10.0.0.2", "uid-b"),
        ("fd00::1", "uid-c"),
        ("10.0.0.3", "uid-d"),
    ]);
    assert_eq!(listed(&ns, nft), want);
    assert_eq!(inside(&ns, |s| s.entries(), nft).unwrap(), want);

    // An owner change, a delete, a delete of an absent entry, a repeated add: in one apply.
    let ops = vec![
        del("10.0.0.2"),
        add("10.0.0.2", "uid-new"),
        del("10.0.0.3"),
        del("10.0.0.99"),
        add("fd00::1", "uid-c"),
    ];
    inside(&ns, move |s| s.apply(&ops), nft).unwrap();
    let want = entries(&[
        ("10.0.0.1", "00000000-0000-4000-8000-000000000001"),
        ("10.0.0.2", "uid-new"),
        ("fd00::1", "uid-c"),
    ]);
    assert_eq!(listed(&ns, nft), want);

    // The tool's own members (with and without a comment, many: a dump spans several
    // messages) read back by our decoder exactly as the tool lists them.
    let mut script = String::new();
    for i in 0..600 {
        let (a, b) = (i / 200, i % 200 + 1);
        if nft {
            script.push_str(&format!(
                "add element inet istio-ambient-nat {PROBE_SET_V4} {{ 10.1.{a}.{b} comment \"tool-{i}\" }}\n"
            ));
        } else {
            script.push_str(&format!(
                "add {PROBE_SET_V4} 10.1.{a}.{b} comment \"tool-{i}\"\n"
            ));
        }
    }
    if nft {
        script.push_str(&format!(
            "add element inet istio-ambient-nat {PROBE_SET_V4} {{ 10.2.0.1 }}\nadd element inet istio-ambient-nat {PROBE_SET_V6} {{ fd00::2 comment \"tool-v6\" }}\n"
        ));
    } else {
        script.push_str(&format!(
            "add {PROBE_SET_V4} 10.2.0.1\nadd {PROBE_SET_V6} fd00::2 comment \"tool-v6\"\n"
        ));
    }
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), script).unwrap();
    let path = file.path().to_str().unwrap().to_string();
    if nft {
        ns.exec("nft", &["-f", &path]);
    } else {
        ns.exec("sh", &["-c", &format!("ipset restore < {path}")]);
    }
    let tool: BTreeMap<IpAddr, String> = listed(&ns, nft);
    assert_eq!(tool.len(), 3 + 600 + 2, "the tool's view");
    assert_eq!(tool[&ip("10.2.0.1")], "");
    assert_eq!(inside(&ns, |s| s.entries(), nft).unwrap(), tool);

    // And our deletes of the tool's members.
    let ops: Vec<SetOp> = vec![del("10.2.0.1"), del("fd00::2"), del("10.1.0.1")];
    inside(&ns, move |s| s.apply(&ops), nft).unwrap();
    let now = listed(&ns, nft);
    assert_eq!(now.len(), tool.len() - 3);
    assert!(!now.contains_key(&ip("10.1.0.1")) && !now.contains_key(&ip("fd00::2")));
}

#[test]
fn ipset_members_changed_over_netlink_match_ipset_and_back() {
    conformance(false);
}

#[test]
fn nft_set_elements_changed_over_netlink_match_nft_and_back() {
    conformance(true);
}

/// Concurrent changes through the data plane (no batcher any more): every add of distinct pods
/// lands, and a reused IP's new owner survives the old owner's removal racing with it.
fn concurrent(nft: bool) {
    require_dataplane_tools();
    let host = FakeHost::new(if nft { "pcn" } else { "pci" });
    let dp = std::sync::Arc::new(Dataplane::new(&host.settings(nft, true)).expect("data plane"));
    let workers: Vec<_> = (0..8u32)
        .map(|w| {
            let dp = dp.clone();
            std::thread::spawn(move || {
                for i in 0..25u32 {
                    let uid = format!("uid-{w}-{i}");
                    dp.probe_add(&uid, &[ip(&format!("10.79.{w}.{}", i + 1))], None)
                        .unwrap();
                }
                // The old owner of a shared IP goes while the new one takes it.
                let shared = ip(&format!("10.80.0.{}", w + 1));
                dp.probe_add(&format!("old-{w}"), &[shared], None).unwrap();
                let (a, b) = (dp.clone(), dp.clone());
                let new =
                    std::thread::spawn(move || a.probe_add(&format!("new-{w}"), &[shared], None));
                b.probe_remove(&format!("old-{w}"), &[shared], None)
                    .unwrap();
                new.join().unwrap().unwrap();
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let now = listed(&host.netns, nft);
    for w in 0..8u32 {
        for i in 0..25u32 {
            assert_eq!(
                now.get(&ip(&format!("10.79.{w}.{}", i + 1))),
                Some(&format!("uid-{w}-{i}")),
                "{now:?}"
            );
        }
        // Either order leaves the new owner or (removal after the takeover found it foreign)
        // the new owner too: never the old one, never nothing.
        assert_eq!(
            now.get(&ip(&format!("10.80.0.{}", w + 1))),
            Some(&format!("new-{w}")),
            "{now:?}"
        );
    }
    assert_eq!(now.len(), 8 * 25 + 8);
}

#[test]
fn concurrent_ipset_changes_all_land_and_a_reused_ip_keeps_its_new_owner() {
    concurrent(false);
}

#[test]
fn concurrent_nft_changes_all_land_and_a_reused_ip_keeps_its_new_owner() {
    concurrent(true);
}

/// The agent's path: each change planned from what its cache believes (no dump of the set). A
/// belief the kernel contradicts (an entry it lost, an owner that changed behind the agent's
/// back) still ends with the entry the change asked for.
fn believed_changes(nft: bool) {
    require_dataplane_tools();
    let host = FakeHost::new(if nft { "pbn" } else { "pbi" });
    let dp = Dataplane::new(&host.settings(nft, true)).expect("data plane");
    let (a, b) = (ip("10.81.0.1"), ip("10.81.0.2"));
    let believed = |list: &[(IpAddr, &str)]| -> Entries {
        list.iter()
            .map(|(ip, uid)| (*ip, uid.to_string()))
            .collect()
    };
    dp.probe_add("uid-a", &[a], Some(&believed(&[]))).unwrap();
    dp.probe_add("uid-b", &[b], Some(&believed(&[]))).unwrap();
    // IP reuse the cache knows of: b's IP goes to c.
    dp.probe_add("uid-c", &[b], Some(&believed(&[(b, "uid-b")])))
        .unwrap();
    // The cache believes an entry the kernel does not hold (deleted behind its back).
    let gone = ip("10.81.0.3");
    dp.probe_add("uid-d", &[gone], Some(&believed(&[(gone, "uid-x")])))
        .unwrap();
    let now = listed(&host.netns, nft);
    let want: BTreeMap<IpAddr, String> = [(a, "uid-a"), (b, "uid-c"), (gone, "uid-d")]
        .into_iter()
        .map(|(ip, uid)| (ip, uid.to_string()))
        .collect();
    assert_eq!(now, want);
    // A removal only takes what carries the UID; a stale belief deletes no other pod's entry.
    dp.probe_remove("uid-b", &[b], Some(&believed(&[(b, "uid-c")])))
        .unwrap();
    dp.probe_remove("uid-a", &[a], Some(&believed(&[(a, "uid-a")])))
        .unwrap();
    let now = listed(&host.netns, nft);
    assert_eq!(now.get(&b), Some(&"uid-c".to_string()), "{now:?}");
    assert_eq!(now.get(&a), None, "{now:?}");
}

#[test]
fn ipset_changes_planned_from_the_agents_belief_land_even_when_it_is_stale() {
    believed_changes(false);
}

#[test]
fn nft_changes_planned_from_the_agents_belief_land_even_when_it_is_stale() {
    believed_changes(true);
}
