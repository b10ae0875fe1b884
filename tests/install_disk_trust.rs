//! What install-cni trusts on the node's disk: the mode and owner of the files it guards are put
//! back on the change itself (not by the periodic re-check), the records it reads back from its
//! run dir are checked like input before cleanup acts on them, and every file it reads from
//! outside is read up to a bound.

#[path = "install_support.rs"]
mod support;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use support::*;

const T: Duration = Duration::from_secs(20);
/// Well under the guard's 60 s re-check: a repair in this time came from the change's event.
const ON_EVENT: Duration = Duration::from_secs(5);

fn perms(p: &Path) -> (u32, u32, u32) {
    let m = fs::metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    (m.permissions().mode() & 0o7777, m.uid(), m.gid())
}

fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).expect("chmod");
}

fn chown(p: &Path, id: u32) {
    std::os::unix::fs::chown(p, Some(id), Some(id)).expect("chown");
}

/// Changes `file` with `change` to `changed`, then waits for the guard to give it `want` back.
/// The guard may undo the change before this reads the file again, so the change is checked by
/// its intended result differing from `want`, not by reading it back.
fn restored(
    agent: &Agent,
    file: &Path,
    want: (u32, u32, u32),
    changed: (u32, u32, u32),
    change: impl Fn(),
) {
    let what = format!("{:o}/{}:{}", changed.0, changed.1, changed.2);
    assert_ne!(changed, want, "{what}: the change would change nothing");
    change();
    let back = wait_for(ON_EVENT, || (perms(file) == want).then_some(()));
    assert!(
        back.is_some(),
        "{what}: {} is still {:o}/{}:{} (want {:o}/{}:{}); output:\n{}",
        file.display(),
        perms(file).0,
        perms(file).1,
        perms(file).2,
        want.0,
        want.1,
        want.2,
        agent.output()
    );
}

#[test]
fn the_guard_puts_back_mode_and_owner_of_every_guarded_file_on_the_change() {
    let d = Dirs::new();
    d.put("10-bridge.conflist", &testdata("list.conflist"));
    let mut agent = start(&d.base_env(), &[]);
    agent.wait_line("istio-cni is installed; watching for changes", T);
    let kubeconfig = d.run.join("istio-cni-kubeconfig");
    let binary = d.bin.join("istio-cni");
    for file in [&kubeconfig, &binary] {
        let want = perms(file);
        assert_eq!((want.1, want.2), (0, 0), "{}", file.display());
        let (mode, uid, gid) = want;
        restored(&agent, file, want, (0o644, uid, gid), || chmod(file, 0o644));
        restored(&agent, file, want, (0o777, uid, gid), || chmod(file, 0o777));
        restored(&agent, file, want, (mode, 4321, 4321), || chown(file, 4321));
    }
    assert_eq!(perms(&kubeconfig).0, 0o600);
    assert!(agent.terminate(T).success(), "{}", agent.output());
}

#[test]
fn the_standalone_config_keeps_its_mode_and_owner() {
    let d = Dirs::new();
    let mut env = d.base_env();
    env.push(("CHAINED_CNI_PLUGIN".to_string(), "false".to_string()));
    let mut agent = start(&env, &[]);
    agent.wait_line("istio-cni is installed; watching for changes", T);
    let conf = d.net.join("YYY-istio-cni.conf");
    let want = perms(&conf);
    assert_eq!(want, (0o600, 0, 0));
    restored(&agent, &conf, want, (0o666, 0, 0), || chmod(&conf, 0o666));
    restored(&agent, &conf, want, (0o600, 4321, 4321), || {
        chown(&conf, 4321)
    });
    assert!(agent.terminate(T).success(), "{}", agent.output());
}

/// Converts the primary `.conf`, is killed, finds its original-config record rewritten to name
/// `original` (and a link), and is stopped: cleanup must not write or link anything there.
fn tampered_record_is_ignored(original: &str, link: Option<&str>, victim: &Path) {
    let d = Dirs::new();
    d.put("10-bridge.conf", &testdata("bridge.conf"));
    let mut agent = start(&d.base_env(), &[]);
    agent.wait_line("istio-cni is installed; watching for changes", T);
    agent.signal(nix::sys::signal::Signal::SIGKILL);
    agent.wait(T);
    let record = d.run.join("istio-cni-restore.json");
    let mut r: serde_json::Value =
        serde_json::from_slice(&fs::read(&record).expect("record")).expect("json");
    r["original"] = original.into();
    if let Some(link) = link {
        r["link"] = link.into();
    }
    fs::write(&record, serde_json::to_vec(&r).expect("json")).expect("tamper");

    let mut again = start(&d.base_env(), &[]);
    again.wait_line("istio-cni is installed; watching for changes", T);
    again.wait_line("ignoring the original-config record", T);
    assert!(again.terminate(T).success(), "{}", again.output());
    assert!(
        fs::symlink_metadata(victim).is_err(),
        "{original}: cleanup wrote {}; output:\n{}",
        victim.display(),
        again.output()
    );
    // Without a record it trusts, cleanup still takes our entry out of the list it is left.
    let left = d.read("10-bridge.conflist").expect("the list is kept");
    assert!(!has_istio_entry(&left), "{left}");
}

#[test]
fn a_restore_record_naming_a_path_outside_the_conf_dir_is_reported_and_ignored() {
    let outside = tempfile::tempdir().expect("tempdir");
    let victim = outside.path().join("10-bridge.conf");
    tampered_record_is_ignored(&victim.display().to_string(), None, &victim);
    // Relative: `..` out of the conf dir (the test's dirs are siblings of one temp dir).
    let rel = tempfile::tempdir().expect("tempdir");
    let abs_victim = rel.path().join("10-bridge.conf");
    let dotdot = format!("../../../../../../../..{}", abs_victim.display());
    tampered_record_is_ignored(&dotdot, None, &abs_victim);
    // A link record: the link itself would be made outside (this is how a device node is
    // replaced by a symlink).
    let null = outside.path().join("null");
    tampered_record_is_ignored(&null.display().to_string(), Some("x"), &null);
}

#[test]
fn an_oversized_or_malformed_conflist_is_named_and_never_read_whole() {
    let d = Dirs::new();
    d.put("10-list.conflist", &testdata("list.conflist"));
    // Sorts first: without a bound it would be read whole and become the primary.
    let mut big = testdata("list.conflist");
    big.truncate(big.len() - 2);
    big.extend(b", \"pad\": \"");
    big.extend(std::iter::repeat_n(b'x', 60 << 20));
    big.extend(b"\"}\n");
    d.put("05-big.conflist", &big);
    d.put(
        "06-broken.conflist",
        b"{\"cniVersion\": \"1.0.0\", \"plugins\": [",
    );
    let mut agent = start(&d.base_env(), &[]);
    agent.wait_line("istio-cni is installed; watching for changes", T);
    let line = agent.wait_line("05-big.conflist", T);
    assert!(line.contains("read limit"), "{line}");
    let line = agent.wait_line("06-broken.conflist", T);
    assert!(line.contains("skipping CNI config"), "{line}");
    assert!(has_istio_entry(&d.read("10-list.conflist").expect("list")));
    assert!(!has_istio_entry(&String::from_utf8_lossy(
        &fs::read(d.net.join("05-big.conflist")).expect("big")
    )));
    let hwm = proc_status_kb(agent.child.id(), "VmHWM").expect("VmHWM");
    eprintln!("install-cni peak RSS with a 60 MB conflist: {hwm} kB");
    assert!(hwm < 40 * 1024, "peak RSS {hwm} kB");
    assert!(agent.terminate(T).success(), "{}", agent.output());
}

#[test]
fn an_oversized_token_is_refused_naming_it() {
    let d = Dirs::new();
    d.put("10-list.conflist", &testdata("list.conflist"));
    fs::write(d.sa.join("token"), vec![b'a'; 2 << 20]).expect("token");
    let mut agent = start(&d.base_env(), &[]);
    let line = agent.wait_line("install pass failed", T);
    assert!(
        line.contains(&d.sa.join("token").display().to_string()) && line.contains("read limit"),
        "{line}"
    );
    assert!(!d.run.join("istio-cni-kubeconfig").exists());
    assert!(agent.terminate(T).success(), "{}", agent.output());
}
