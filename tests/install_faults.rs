//! install-cni against an API server that refuses it: RBAC (403), a bad token (401) and a
//! certificate the kubeconfig's CA does not verify are named within seconds in `/readyz` and the
//! log (the resource, the verb and what to fix) while install-cni keeps running and keeps
//! retrying, as Istio's start-up keeps waiting on its informers: a grant or a token that lands
//! later is picked up without a restart. Transient errors (5xx) are retried until the store
//! syncs. While refused, the plugin is never installed.

#[path = "install_support.rs"]
mod support;

use std::time::Duration;

use istio_cni_testing::apiserver::Fault;
use support::*;

const T: Duration = Duration::from_secs(30);
/// A refusal must be named well before the watch's retries grow long.
const FAST: Duration = Duration::from_secs(10);

/// Env for install-cni with the repair controller (the node pod store) against `api`.
fn repair_env(d: &Dirs, api: &ApiServer) -> Vec<(String, String)> {
    let mut env = d.base_env();
    env.retain(|(k, _)| k != "REPAIR_ENABLED");
    env.extend(
        [
            ("REPAIR_ENABLED", "true"),
            ("REPAIR_NODE_NAME", "node-1"),
            ("KUBECONFIG", api.kubeconfig.to_str().expect("utf-8 path")),
            ("API_RETRY_MAX_DELAY", "2s"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    env
}

/// Starts install-cni and waits (at most [`FAST`]) until `/readyz` names every one of `parts`;
/// it must still run, the log must say the same, and the conf dir's primary must be untouched.
fn refused_fast(d: &Dirs, env: &[(String, String)], parts: &[&str]) -> (Agent, u16) {
    let agent = start(env, &[]);
    let health = agent.port("health server");
    let named = wait_for(FAST, || {
        let (code, body) = http_get(health, "/readyz")?;
        (code == 503 && parts.iter().all(|p| body.contains(p))).then_some(body)
    });
    let out = agent.output();
    assert!(named.is_some(), "/readyz never named {parts:?}:\n{out}");
    // The log line is written before readiness changes, but read from a pipe: wait for it too.
    let logged = wait_for(FAST, || {
        let out = agent.output();
        parts.iter().all(|p| out.contains(p)).then_some(())
    });
    let out = agent.output();
    for part in parts {
        assert!(
            logged.is_some() && out.contains(part),
            "{part:?} missing from the log:\n{out}"
        );
    }
    let mut agent = agent;
    assert!(
        agent.child.try_wait().expect("try_wait").is_none(),
        "install-cni exited:\n{out}"
    );
    assert_eq!(
        d.read("10-list.conflist"),
        Some(testdata_str("list.conflist")),
        "the primary changed:\n{out}"
    );
    (agent, health)
}

/// Once the API server lets it list: `/readyz` no longer names the API server and the plugin is
/// installed (other components keep their own readiness).
fn proceeds(d: &Dirs, agent: &Agent, health: u16) {
    let api_ready = || {
        let (_, body) = http_get(health, "/readyz")?;
        (!body.contains("api-server")).then_some(())
    };
    assert!(wait_for(T, api_ready).is_some(), "{}", agent.output());
    assert!(
        d.waits_for(T, "10-list.conflist", has_istio_entry),
        "{}",
        agent.output()
    );
}

// The store's first call is its watch, which streams the pods' initial state.
#[test]
fn a_forbidden_pod_read_is_named_at_once_with_the_verb_and_the_cluster_role() {
    let d = Dirs::new();
    d.put("10-list.conflist", &testdata("list.conflist"));
    let api = ApiServer::start();
    api.rt.block_on(
        api.server
            .set_fault(Fault::fail(403).on_path("/api/v1/pods")),
    );
    let (mut agent, health) = refused_fast(
        &d,
        &repair_env(&d, &api),
        &[
            "pod store cannot start",
            "watch pods",
            "forbidden",
            "cannot watch pods at cluster scope",
            "ClusterRole",
        ],
    );
    api.rt.block_on(api.server.clear_faults());
    proceeds(&d, &agent, health);
    assert!(agent.terminate(T).success(), "{}", agent.output());
}

#[test]
fn a_forbidden_namespace_read_holds_the_ambient_agent_naming_it() {
    let d = Dirs::new();
    d.put("10-list.conflist", &testdata("list.conflist"));
    let api = ApiServer::start();
    // The pod store syncs; the namespace store (the agent's own) is refused.
    let refused = Fault::fail(403).on_path("/api/v1/namespaces");
    api.rt.block_on(api.server.set_fault(refused));
    let mut env = d.base_env();
    env.extend(api.ambient_env());
    let (mut agent, health) = refused_fast(
        &d,
        &env,
        &[
            "namespace store cannot start",
            "cannot watch namespaces at cluster scope",
            "ClusterRole",
        ],
    );
    api.rt.block_on(api.server.clear_faults());
    proceeds(&d, &agent, health);
    assert!(agent.terminate(T).success(), "{}", agent.output());
}

#[test]
fn a_rejected_token_is_named_at_once_and_a_good_one_is_picked_up() {
    let d = Dirs::new();
    d.put("10-list.conflist", &testdata("list.conflist"));
    let api = ApiServer::start();
    let good = api.server.token();
    api.server.set_token(Some("another-token"));
    let (mut agent, health) = refused_fast(
        &d,
        &repair_env(&d, &api),
        &["pod store cannot start", "watch pods", "unauthorized"],
    );
    api.server.set_token(good.as_deref());
    proceeds(&d, &agent, health);
    assert!(agent.terminate(T).success(), "{}", agent.output());
}

#[test]
fn an_api_server_certificate_from_another_ca_is_named_at_once_with_the_server() {
    let d = Dirs::new();
    d.put("10-list.conflist", &testdata("list.conflist"));
    let api = ApiServer::start();
    // The kubeconfig trusts another server's CA.
    let other = ApiServer::start();
    let text = std::fs::read_to_string(&other.kubeconfig).expect("kubeconfig");
    std::fs::write(
        &api.kubeconfig,
        text.replace(&other.server.url(), &api.server.url()),
    )
    .expect("kubeconfig");
    let (mut agent, _) = refused_fast(
        &d,
        &repair_env(&d, &api),
        &[
            "pod store cannot start",
            "TLS with the API server",
            &api.server.url(),
            "invalid peer certificate",
            "certificate authority in the kubeconfig",
        ],
    );
    // The handshake failed: no request ever reached the server.
    assert!(api.server.requests().is_empty());
    assert!(agent.terminate(T).success(), "{}", agent.output());
    assert_eq!(
        d.read("10-list.conflist"),
        Some(testdata_str("list.conflist"))
    );
}

#[test]
fn transient_errors_reading_the_initial_state_are_retried_until_the_store_syncs() {
    let d = Dirs::new();
    d.put("10-list.conflist", &testdata("list.conflist"));
    let api = ApiServer::start();
    let flaky = Fault::fail(500).on_path("/api/v1/pods").times(2);
    api.rt.block_on(api.server.set_fault(flaky));
    let mut agent = start(&repair_env(&d, &api), &[]);
    agent.wait_line("watch failed, retrying", T);
    agent.wait_line("repair controller ready", T);
    assert!(
        d.waits_for(T, "10-list.conflist", has_istio_entry),
        "{}",
        agent.output()
    );
    // Two failed reads of the initial state, then one that syncs.
    let reads = api
        .server
        .requests()
        .iter()
        .filter(|r| r.path == "/api/v1/pods")
        .count();
    assert!(reads >= 3, "{reads} reads");
    assert!(agent.terminate(T).success(), "{}", agent.output());
}

/// A small tmpfs mounted over a directory, unmounted on drop (also when the test fails).
struct Tmpfs {
    path: std::path::PathBuf,
}

impl Tmpfs {
    fn mount(path: &std::path::Path, size: &str) -> Tmpfs {
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(path)
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mount tmpfs on {} (needs root)",
            path.display()
        );
        Tmpfs {
            path: path.to_path_buf(),
        }
    }

    fn remount(&self, how: &str) {
        let status = std::process::Command::new("mount")
            .args(["-o", &format!("remount,{how}")])
            .arg(&self.path)
            .status()
            .expect("run mount");
        assert!(status.success(), "remount {how} {}", self.path.display());
    }

    /// Fills the file system with `filler` until a write fails with ENOSPC.
    fn fill(&self) -> std::path::PathBuf {
        use std::io::Write;
        let filler = self.path.join("filler");
        let mut f = std::fs::File::create(&filler).expect("filler");
        let chunk = [0u8; 4096];
        loop {
            match f.write_all(&chunk) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling {}: {e}", self.path.display()),
            }
        }
        filler
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.path)
            .status();
    }
}

fn readyz(port: u16) -> Option<u16> {
    http_get(port, "/readyz").map(|(s, _)| s)
}

/// Temp files our atomic writes left in the conf dir.
fn temps(d: &Dirs) -> Vec<String> {
    d.names()
        .into_iter()
        .filter(|n| n.contains(".tmp."))
        .collect()
}

/// A conf dir that cannot take our write (`break_it` on the mounted tmpfs): the pass fails
/// naming the file and `cause`, readiness stays false, the primary stays byte-identical with no
/// temp file beside it; after `heal` the next pass installs and readiness turns true.
fn unwritable_conf_dir_case(break_it: impl FnOnce(&Tmpfs), cause: &str, heal: impl FnOnce(&Tmpfs)) {
    let d = Dirs::new();
    let fs = Tmpfs::mount(&d.net, "64k");
    d.put("10-list.conflist", &testdata("list.conflist"));
    break_it(&fs);
    let mut agent = start(&d.base_env(), &[]);
    let health = agent.port("health server");
    let line = agent.wait_line("install pass failed", T);
    let primary = d.net.join("10-list.conflist");
    // The file being replaced is named (not the temp file), with the cause.
    let named = format!("{}: ", primary.display());
    assert!(
        line.contains(&named) && line.to_lowercase().contains(&cause.to_lowercase()),
        "{line}"
    );
    // A second failed pass (the retry) changes nothing either.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(readyz(health), Some(503));
    assert_eq!(
        d.read("10-list.conflist"),
        Some(testdata_str("list.conflist"))
    );
    assert!(temps(&d).is_empty(), "temp files left: {:?}", temps(&d));

    heal(&fs);
    assert!(
        d.waits_for(T, "10-list.conflist", has_istio_entry),
        "{}",
        agent.output()
    );
    assert!(
        wait_for(T, || (readyz(health) == Some(200)).then_some(())).is_some(),
        "{}",
        agent.output()
    );
    assert!(temps(&d).is_empty(), "temp files left: {:?}", temps(&d));
    assert!(agent.terminate(T).success(), "{}", agent.output());
}

#[test]
fn a_full_conf_dir_keeps_the_primary_whole_and_recovers_once_space_is_freed() {
    let filler = std::sync::OnceLock::new();
    unwritable_conf_dir_case(
        |fs| {
            let _ = filler.set(fs.fill());
        },
        "no space left",
        |_| std::fs::remove_file(filler.get().expect("filled")).expect("free space"),
    );
}

#[test]
fn a_read_only_conf_dir_keeps_the_primary_whole_and_recovers_once_writable() {
    unwritable_conf_dir_case(
        |fs| fs.remount("ro"),
        "read-only file system",
        |fs| fs.remount("rw"),
    );
}
