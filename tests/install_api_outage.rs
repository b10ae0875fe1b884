//! install-cni started while the API server is away: it does not exit (no CrashLoopBackOff), leaves
//! the node's installed plugin and CNI config as they are, answers `/healthz` ok and `/readyz` 503
//! saying it waits for the API server (and `install-cni status` says so), and is ready within
//! seconds of the API server's return.
//!
//! The outage named for this is 3 minutes. What makes an outage long for the agent is that its
//! retry delay has grown to its cap (`API_RETRY_MAX_DELAY`, 30 s by default, reached after about
//! 50 s of retries); from then on a longer outage only adds more retries at the cap. The test
//! sets the cap to 2 s and keeps the API server away for 20 s (ten times the cap, several
//! retries at it): the same situation as a 3-minute outage at the default cap, in 20 s of test
//! time. Ready "within seconds" is then at most one capped delay (plus jitter) after the return.

#[path = "install_support.rs"]
mod support;

use std::time::{Duration, Instant};

use support::*;

const T: Duration = Duration::from_secs(30);
const CAP: &str = "2s";
const OUTAGE: Duration = Duration::from_secs(20);
/// Ready at most this long after the API server is back (one capped delay is 2 s, jittered).
const BACK_WITHIN: Duration = Duration::from_secs(8);

/// Env for install-cni with the ambient node agent (its pod and namespace stores, on the test-only
/// fake data plane) against `api`, retries capped at [`CAP`].
fn agent_env(d: &Dirs, api: &ApiServer) -> Vec<(String, String)> {
    let mut env = d.base_env();
    env.extend(api.ambient_env());
    env.push(("API_RETRY_MAX_DELAY".into(), CAP.into()));
    env
}

/// `install-cni status` against the running agent's health port: (exit code, stdout + stderr).
fn status(health: u16) -> (i32, String) {
    let out = std::process::Command::new(bin())
        .args(["install-cni", "status"])
        .env_clear()
        .env("HEALTH_PORT", health.to_string())
        .output()
        .expect("run install-cni status");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn an_api_server_away_at_start_is_waited_for_and_readiness_follows_its_return() {
    let d = Dirs::new();
    // A node where an earlier agent installed the plugin: our entry in the conflist, the binary.
    let installed = testdata_str("list.conflist.golden");
    d.put("10-list.conflist", installed.as_bytes());
    std::fs::write(d.bin.join("istio-cni"), b"earlier plugin").expect("plugin");
    let api = ApiServer::start();
    // Nothing listens on the API server's port until it is restarted below.
    api.rt.block_on(api.server.stop());
    let mut agent = start(&agent_env(&d, &api), &[]);
    let health = agent.port("health server");
    let outage = Instant::now();
    agent.wait_line("waiting for the API server", T);

    let mut checked_status = false;
    while outage.elapsed() < OUTAGE {
        assert!(
            agent.child.try_wait().expect("try_wait").is_none(),
            "install-cni exited during the outage:\n{}",
            agent.output()
        );
        assert_eq!(http_get(health, "/healthz").map(|r| r.0), Some(200));
        let (code, body) = http_get(health, "/readyz").expect("/readyz answers");
        assert_eq!(code, 503, "{body}");
        assert!(
            body.contains("api-server (the pod store's first list"),
            "{body}"
        );
        if !checked_status {
            let (code, text) = status(health);
            assert_eq!(code, 1, "{text}");
            assert!(text.contains("api-server ("), "{text}");
            checked_status = true;
        }
        assert_eq!(d.read("10-list.conflist").as_deref(), Some(&*installed));
        assert_eq!(
            std::fs::read(d.bin.join("istio-cni")).expect("plugin"),
            b"earlier plugin"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // Retried with growing, capped delays, not given up.
    let retries = agent.output().matches("watch failed, retrying").count();
    assert!(retries >= 5, "{retries} retries in {OUTAGE:?}");

    api.rt
        .block_on(api.server.restart())
        .expect("API server back");
    let back = Instant::now();
    let ready = wait_for(T, || (http_get(health, "/readyz")?.0 == 200).then_some(()));
    let took = back.elapsed();
    assert!(ready.is_some(), "never ready:\n{}", agent.output());
    assert!(
        took < BACK_WITHIN,
        "ready {took:?} after the API server's return:\n{}",
        agent.output()
    );
    agent.wait_line("the API server answered", T);
    assert!(has_istio_entry(
        &d.read("10-list.conflist").expect("conflist")
    ));
    eprintln!("ready {took:?} after the API server returned ({retries} retries while away)");
    assert!(agent.terminate(T).success(), "{}", agent.output());
}

#[test]
fn a_signal_while_waiting_for_the_api_server_ends_it_leaving_the_config_alone() {
    let d = Dirs::new();
    let installed = testdata_str("list.conflist.golden");
    d.put("10-list.conflist", installed.as_bytes());
    let api = ApiServer::start();
    api.rt.block_on(api.server.stop());
    let mut agent = start(&agent_env(&d, &api), &[]);
    agent.wait_line("waiting for the API server", T);
    assert!(agent.terminate(T).success(), "{}", agent.output());
    assert_eq!(d.read("10-list.conflist").as_deref(), Some(&*installed));
}
