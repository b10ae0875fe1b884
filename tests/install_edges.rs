//! Edges of the installer found by hostile input (issue 8): symlinked configs and conf dirs,
//! duplicate istio-cni entries, AMBIENT_ENABLED with an agent that cannot start, and the restore of a
//! converted `.conf` after the primary dropped our entry.

#[path = "install_support.rs"]
mod support;

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::*;

const T: Duration = Duration::from_secs(30);
/// A repair must come from a watch event, well before the 60 s resync.
const REPAIR: Duration = Duration::from_secs(10);

fn plugins(content: &str) -> Vec<Value> {
    serde_json::from_str::<Value>(content)
        .ok()
        .and_then(|v| v.get("plugins")?.as_array().cloned())
        .unwrap_or_default()
}

fn is_istio(p: &Value) -> bool {
    p.get("type").and_then(Value::as_str) == Some("istio-cni")
}

fn istio_entries(content: &str) -> usize {
    plugins(content).iter().filter(|p| is_istio(p)).count()
}

/// `content` with its plugin list rewritten by `f`.
fn edit_plugins(content: &str, f: impl FnOnce(&mut Vec<Value>)) -> String {
    let mut v: Value = serde_json::from_str(content).expect("json");
    let list = v
        .get_mut("plugins")
        .and_then(Value::as_array_mut)
        .expect("plugins");
    f(list);
    serde_json::to_string_pretty(&v).expect("serialize")
}

fn read(p: &Path) -> Option<String> {
    fs::read_to_string(p).ok()
}

/// Exactly one istio-cni entry, and it is the last plugin.
fn one_entry_last(content: &str) -> bool {
    istio_entries(content) == 1 && has_istio_entry(content)
}

fn is_link(p: &Path) -> bool {
    fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink())
}

#[test]
fn a_symlinked_primary_is_merged_through_its_target_and_restored_on_cleanup() {
    let d = Dirs::new();
    // The conf dir itself is a link to the real directory.
    let real_dir = d.tmp.path().join("net-real");
    fs::rename(&d.net, &real_dir).expect("move conf dir");
    symlink(&real_dir, &d.net).expect("link conf dir");
    // The primary's file lives elsewhere; the conf dir holds a relative link to it.
    let store = d.tmp.path().join("store");
    fs::create_dir(&store).expect("store");
    let target = store.join("10-list.conflist");
    fs::write(&target, testdata("list.conflist")).expect("target");
    let link = d.net.join("10-list.conflist");
    symlink("../store/10-list.conflist", &link).expect("link");
    // A dangling link that sorts first is skipped, and named in the log.
    symlink("gone.conflist", d.net.join("05-dangling.conflist")).expect("dangling");

    let mut env = d.base_env();
    env.push(("LOG_OUTPUT_LEVEL".into(), "info,cni-plugin:debug".into()));
    let mut agent = start(&env, &[]);
    assert!(
        wait_for(T, || read(&target).filter(|c| has_istio_entry(c))).is_some(),
        "the linked primary was never merged:\n{}",
        agent.output()
    );
    // The golden carries `cni_agent_run_dir: /path/to/kubeconfig`; ours is a temp dir.
    assert_eq!(
        read(&target).map(|c| c.replace(&d.run.display().to_string(), "/path/to/kubeconfig")),
        Some(testdata_str("list.conflist.golden"))
    );
    assert!(is_link(&link), "the link is kept");
    assert_eq!(
        fs::read_link(&link).expect("readlink"),
        Path::new("../store/10-list.conflist")
    );
    assert!(is_link(&d.net), "the conf dir link is kept");
    agent.wait_line("05-dangling.conflist", T);
    agent.wait_line("istio-cni is installed; watching for changes", T);

    // The owner rewrites its file in place, then replaces it atomically, both in its own
    // directory (outside the conf dir): each change is noticed and repaired through the link.
    fs::write(&target, testdata("list.conflist")).expect("rewrite in place");
    assert!(
        wait_for(REPAIR, || read(&target).filter(|c| has_istio_entry(c))).is_some(),
        "an in-place change of the link target was not repaired:\n{}",
        agent.output()
    );
    let tmp = store.join(".owner.tmp");
    fs::write(&tmp, testdata("list.conflist")).expect("tmp");
    fs::rename(&tmp, &target).expect("rename");
    assert!(
        wait_for(REPAIR, || read(&target).filter(|c| has_istio_entry(c))).is_some(),
        "an atomic replace of the link target was not repaired:\n{}",
        agent.output()
    );
    assert!(is_link(&link));
    // A new higher-priority config dropped into the real directory is seen through the conf dir
    // link and becomes the primary.
    fs::write(real_dir.join("01-new.conflist"), testdata("list.conflist")).expect("new primary");
    assert!(
        d.waits_for(REPAIR, "01-new.conflist", has_istio_entry),
        "a change in the linked conf dir was missed:\n{}",
        agent.output()
    );

    assert!(agent.terminate(T).success(), "{}", agent.output());
    assert!(is_link(&link), "cleanup keeps the link");
    assert_eq!(
        read(&target),
        Some(testdata_str("list-no-istio.conflist")),
        "cleanup restores the target's content"
    );
    assert_eq!(
        d.names(),
        vec![
            "01-new.conflist",
            "05-dangling.conflist",
            "10-list.conflist"
        ],
        "nothing else in the conf dir"
    );
    assert_eq!(
        d.read("01-new.conflist"),
        Some(testdata_str("list-no-istio.conflist"))
    );
    assert!(fs::metadata(d.net.join("05-dangling.conflist")).is_err());
    let mut in_store: Vec<_> = fs::read_dir(&store)
        .expect("ls store")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    in_store.sort();
    assert_eq!(in_store, vec!["10-list.conflist"], "no temp files left");
}

#[test]
fn duplicate_istio_entries_collapse_to_one_and_sigterm_removes_them_all() {
    let d = Dirs::new();
    // A primary that already carries two stale istio-cni entries, one before its own plugins.
    let two = edit_plugins(&testdata_str("list-with-istio.conflist"), |p| {
        let stale = p.last().cloned().expect("stale entry");
        p.insert(0, stale);
    });
    d.put("10-list.conflist", two.as_bytes());
    let mut agent = start(&d.base_env(), &[]);
    assert!(
        d.waits_for(T, "10-list.conflist", one_entry_last),
        "two entries were kept: {:?}\n{}",
        d.read("10-list.conflist"),
        agent.output()
    );
    agent.wait_line("istio-cni is installed; watching for changes", T);

    // Someone adds a second copy of our entry, first in the list, while we run.
    let ours = d.read("10-list.conflist").expect("ours");
    let doubled = edit_plugins(&ours, |p| {
        let entry = p.last().cloned().expect("our entry");
        p.insert(0, entry);
    });
    fs::write(d.net.join("10-list.conflist"), doubled).expect("add a duplicate");
    assert!(
        d.waits_for(REPAIR, "10-list.conflist", one_entry_last),
        "a duplicate added while running was kept: {:?}\n{}",
        d.read("10-list.conflist"),
        agent.output()
    );

    // Added again just before shutdown: whether the guard or cleanup sees it first, SIGTERM
    // leaves no istio-cni entry behind.
    let ours = d.read("10-list.conflist").expect("ours");
    let doubled = edit_plugins(&ours, |p| {
        let entry = p.last().cloned().expect("our entry");
        p.insert(1, entry);
    });
    fs::write(d.net.join("10-list.conflist"), doubled).expect("add a duplicate");
    assert!(agent.terminate(T).success(), "{}", agent.output());
    let left = d.read("10-list.conflist").expect("primary kept");
    assert_eq!(istio_entries(&left), 0, "entries left behind: {left}");
    assert_eq!(left, testdata_str("list-no-istio.conflist"));
}

/// The agent starts before anything is installed (§2.2): when it cannot (no NODE_NAME to watch
/// its pods by, no usable Kubernetes client), install-cni exits 1 naming the cause, never reports
/// ready, and leaves the CNI config, the binaries and the plugin kubeconfig alone.
#[test]
fn an_ambient_agent_that_cannot_start_stops_install_cni_before_it_touches_anything() {
    for (extra, args, needle) in [
        (
            vec![("AMBIENT_ENABLED", "true")],
            vec![],
            "NODE_NAME is empty",
        ),
        (
            vec![
                ("NODE_NAME", "node-1"),
                ("KUBECONFIG", "/nonexistent/kubeconfig"),
            ],
            vec!["--ambient-enabled"],
            "Kubernetes client",
        ),
        (
            vec![
                ("AMBIENT_ENABLED", "true"),
                ("ISTIO_OWNED_CNI_CONFIG", "true"),
            ],
            vec![],
            "NODE_NAME is empty",
        ),
    ] {
        let d = Dirs::new();
        d.put("10-list.conflist", &testdata("list.conflist"));
        let health = free_port();
        let mut env = d.base_env();
        env.retain(|(k, _)| k != "HEALTH_PORT");
        env.push(("HEALTH_PORT".into(), health.to_string()));
        env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let mut agent = start(&env, &args);
        let deadline = Instant::now() + Duration::from_secs(10);
        while agent.child.try_wait().expect("try_wait").is_none() {
            assert_ne!(
                http_get(health, "/readyz").map(|(s, _)| s),
                Some(200),
                "{extra:?} {args:?}: reported ready:\n{}",
                agent.output()
            );
            assert!(
                Instant::now() < deadline,
                "{extra:?} {args:?}: still running:\n{}",
                agent.output()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let status = agent.wait(T);
        let out = agent.output();
        assert!(!status.success(), "{extra:?} {args:?}: exit 0\n{out}");
        assert!(
            out.contains("ambient node agent") && out.contains(needle),
            "{extra:?} {args:?}: no {needle:?} in:\n{out}"
        );
        assert_eq!(
            d.read("10-list.conflist"),
            Some(testdata_str("list.conflist")),
            "conflist touched"
        );
        assert_eq!(d.names(), vec!["10-list.conflist"]);
        assert!(!d.bin.join("istio-cni").exists(), "binary copied");
        assert!(
            !d.run.join("istio-cni-kubeconfig").exists(),
            "kubeconfig written"
        );
    }
}

#[test]
fn the_converted_conf_is_restored_after_the_primary_dropped_our_entry() {
    let d = Dirs::new();
    d.put("10-bridge.conf", &testdata("bridge.conf"));
    let mut agent = start(&d.base_env(), &[]);
    let installed = || d.read("10-bridge.conflist").filter(|c| has_istio_entry(c));
    let ours = wait_for(T, installed).expect("converted");
    agent.wait_line("istio-cni is installed; watching for changes", T);

    // The primary rewrites the list without our entry, the rest as we converted it.
    let dropped = edit_plugins(&ours, |p| p.retain(|x| !is_istio(x)));
    fs::write(d.net.join("10-bridge.conflist"), dropped).expect("drop our entry");
    assert!(wait_for(REPAIR, installed).is_some(), "{}", agent.output());

    assert!(agent.terminate(T).success(), "{}", agent.output());
    assert_eq!(
        d.names(),
        vec!["10-bridge.conf".to_string()],
        "{}",
        agent.output()
    );
    assert_eq!(d.read("10-bridge.conf"), Some(testdata_str("bridge.conf")));
    assert!(!d.run.join("istio-cni-restore.json").exists());
}
