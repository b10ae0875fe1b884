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

/// Changes `file` with `change`, then waits for the guard to give it `want` back.
fn restored(agent: &Agent, file: &Path, want: (u32, u32, u32), what: &str, change: impl Fn()) {
    change();
    assert_ne!(perms(file), want, "{what}: the change did not take");
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
        restored(&agent, file, want, "chmod 0644", || chmod(file, 0o644));
        restored(&agent, file, want, "chmod 0777", || chmod(file, 0o777));
        restored(&agent, file, want, "chown", || chown(file, 4321));
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
    restored(&agent, &conf, want, "chmod 0666", || chmod(&conf, 0o666));
    restored(&agent, &conf, want, "chown", || chown(&conf, 4321));
    assert!(agent.terminate(T).success(), "{}", agent.output());
}
