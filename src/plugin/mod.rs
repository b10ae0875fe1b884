//! The `istio-cni` CNI plugin role (ADD/DEL/CHECK/VERSION/STATUS/GC).
//! May call: `cli`, `rules`, `sidecar`, `apply`, `netns`, `kube`, `retry`, `telemetry`, `wire`.
//!
//! Layout: pure parts — [`cni`] (env, versions, errors), [`config`] (stdin JSON), [`args`]
//! (`CNI_ARGS`), [`result`] (prevResult conversion), [`ambient`] (selectors, event); the pod facts,
//! the sidecar selection and the redirect come from the shared [`crate::sidecar`] room (the
//! repair controller derives the same rules); effects — [`add`] (the ADD flow), [`k8s`] (API reads),
//! [`program`] (the pod's netns through `apply::pod`), [`uds`] and [`log`] (agent sockets, log sinks).
//! Operator documentation: docs/plugin.md.

pub mod add;
pub mod ambient;
pub mod args;
pub mod cni;
pub mod config;
pub mod k8s;
pub mod log;
pub mod program;
pub mod result;
pub mod runtime;
pub mod uds;

use std::io::{Read, Write};
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use tracing::{debug, error};

use crate::cli::{Env, ProcessEnv};
use cni::{CniError, Command, Invocation, code};
use config::NetConf;

/// How long after the ADD deadline the backstop timeout fires.
const DEADLINE_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// Where the last panic happened (filled by the panic hook, read when turning it into an error).
static PANIC_LOCATION: Mutex<Option<String>> = Mutex::new(None);

/// What one invocation prints and returns.
struct Reply {
    stdout: Option<String>,
    exit: i32,
}

impl Reply {
    fn ok(stdout: Option<String>) -> Reply {
        Reply { stdout, exit: 0 }
    }

    fn error(e: &CniError, version: &str) -> Reply {
        Reply {
            stdout: Some(pretty(&e.to_json(version))),
            exit: 1,
        }
    }
}

fn pretty(v: &serde_json::Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
}

/// Entry point of the `istio-cni` role.
pub fn main(_args: Vec<String>) -> i32 {
    let log = log::PluginLog::install();
    std::panic::set_hook(Box::new(|info| {
        let location = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        if let Ok(mut slot) = PANIC_LOCATION.lock() {
            *slot = Some(location.clone());
        }
        error!(location = %location, "panic: {}", panic_text(info.payload()));
    }));
    let reply = match std::panic::catch_unwind(|| run(&log)) {
        Ok(reply) => reply,
        Err(payload) => {
            let location = PANIC_LOCATION
                .lock()
                .ok()
                .and_then(|mut s| s.take())
                .unwrap_or_default();
            let e = CniError::internal(format!(
                "istio-cni panicked: {} (at {location})",
                panic_text(payload.as_ref())
            ));
            Reply::error(&e, cni::CURRENT_VERSION)
        }
    };
    if let Some(out) = reply.stdout {
        let stdout = std::io::stdout();
        let mut lock = stdout.lock();
        let _ = writeln!(lock, "{out}");
        let _ = lock.flush();
    }
    log.finish();
    reply.exit
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> &str {
    crate::netns::panic_text(payload).unwrap_or("unknown panic")
}

fn run(log: &log::PluginLog) -> Reply {
    // The one place the plugin reads its process environment: everything below gets it injected.
    let process: &dyn Env = &ProcessEnv;
    let invocation = match cni::read_env(|k| process.get(k)) {
        Ok(i) => i,
        Err(e) => {
            error!(error = %e, "invalid CNI environment");
            return Reply::error(&e, cni::CURRENT_VERSION);
        }
    };
    let (cmd, env) = match invocation {
        Invocation::About => {
            eprint!("{}", cni::about_text());
            return Reply::ok(None);
        }
        Invocation::Run(Command::Version, _) => {
            return Reply::ok(Some(pretty(&cni::version_reply())));
        }
        Invocation::Run(cmd, env) => (cmd, env),
    };
    // A conflist entry with its prevResult is a few KiB: one read, as a rule.
    let mut stdin = Vec::with_capacity(16 * 1024);
    if let Err(e) = std::io::stdin().read_to_end(&mut stdin) {
        let e = CniError::new(code::IO_FAILURE, format!("error reading from stdin: {e}"));
        return Reply::error(&e, cni::CURRENT_VERSION);
    }
    // Errors are reported in the config's version when it can be read at all.
    let version = config::config_version(&stdin).unwrap_or_else(|_| cni::CURRENT_VERSION.into());
    let conf = match NetConf::parse(&stdin) {
        Ok(c) => c,
        Err(e) => {
            // Still reach the node agent's log when the run dir itself is readable.
            if let Some(dir) = config::salvage_run_dir(&stdin) {
                log.attach(&dir.join("istio-cni.log"), &dir.join("log.sock"));
            }
            error!(command = %cmd, error = %e, "invalid network configuration");
            return Reply::error(&e, &version);
        }
    };
    log.set_level(&conf.plugin_log_level);
    log.attach(&conf.log_file_path(), &conf.log_socket_path());
    debug!(command = %cmd, container = %env.container_id, netns = %env.netns, "CNI call");
    let result = match cmd {
        Command::Add => cmd_add(&env, &conf, process),
        Command::Del => {
            // Nothing to undo: the rules live and die with the pod's netns, which may be gone.
            Ok(None)
        }
        Command::Check => require_version(&conf, "0.4.0", "CHECK").map(|_| None),
        Command::Status => require_version(&conf, "1.1.0", "STATUS")
            .and_then(|_| status(&conf))
            .map(|_| None),
        Command::Gc => require_version(&conf, "1.1.0", "GC").map(|_| None),
        Command::Version => Ok(None),
    };
    match result {
        Ok(out) => Reply::ok(out),
        Err(e) => {
            error!(command = %cmd, pod_args = %env.args, error = %e, "CNI call failed");
            Reply::error(&e, &conf.cni_version)
        }
    }
}

fn require_version(conf: &NetConf, min: &str, what: &str) -> Result<(), CniError> {
    if cni::compare_versions(&conf.cni_version, min)? == std::cmp::Ordering::Less {
        return Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            format!("config version does not allow {what}"),
        ));
    }
    Ok(())
}

/// Ready when the plugin's kubeconfig is in place and, in ambient mode, the agent answers.
fn status(conf: &NetConf) -> Result<(), CniError> {
    let kubeconfig = conf.kubeconfig_path();
    if !kubeconfig.is_file() {
        return Err(CniError::new(
            code::PLUGIN_NOT_AVAILABLE,
            format!(
                "istio-cni is not ready: kubeconfig {} is missing (is the istio-cni node agent running?)",
                kubeconfig.display()
            ),
        ));
    }
    if conf.ambient_enabled {
        let sock = conf.event_socket_path();
        if let Err(e) = std::os::unix::net::UnixStream::connect(&sock) {
            return Err(CniError::new(
                code::PLUGIN_NOT_AVAILABLE,
                format!(
                    "istio-cni is not ready: node agent socket {} is unreachable: {e}",
                    sock.display()
                ),
            ));
        }
    }
    Ok(())
}

fn cmd_add(
    env: &cni::CniEnv,
    conf: &NetConf,
    process: &dyn Env,
) -> Result<Option<String>, CniError> {
    let deadline = Instant::now() + conf.add_timeout;
    // Validate the previous result before touching anything.
    let reply = result::pass_through(conf.prev_result.as_ref(), &conf.cni_version)?;
    let args = args::CniArgs::parse(&env.args).map_err(|e| CniError::internal(e.to_string()))?;
    let override_ok = env.netns_override.eq_ignore_ascii_case("true") || env.netns_override == "1";
    // A dry run never changes the namespace, so it may name any (Istio's tests use a fake one).
    let engine = crate::sidecar::EngineEnv::from_env(process);
    if !override_ok && engine.dry_run.is_none() && program::is_own_netns(Path::new(&env.netns)) {
        return Err(CniError::new(
            code::INVALID_NETNS,
            "plugin's netns and netns from CNI_NETNS should not be the same",
        ));
    }
    let runtime = runtime::get()
        .map_err(|e| CniError::internal(format!("cannot start the async runtime: {e}")))?;
    let kubeconfig = conf.kubeconfig_path();
    // On the heap from the start: the ADD's future is large (the API client's path is in
    // it), and every move of it by value (into the timeout, into block_on) took fresh stack pages.
    let flow = Box::pin(add::cmd_add(
        env,
        conf,
        &engine,
        &args,
        deadline,
        || async move { k8s::PluginKube::from_kubeconfig(&kubeconfig).await },
    ));
    let outcome = runtime.block_on(async {
        // Lets the tests prove that a panic becomes a CNI error (`test-hooks` builds only).
        #[cfg(feature = "test-hooks")]
        if std::env::var_os("ISTIO_CNI_RS_TEST_PANIC").is_some() {
            panic!("panic requested by ISTIO_CNI_RS_TEST_PANIC");
        }
        // A backstop only: every step is cut at `deadline` and fails with its own error (e.g. the
        // ambient check's code 11); the grace lets that error win over this generic one.
        tokio::time::timeout_at((deadline + DEADLINE_GRACE).into(), flow)
            .await
            .map_err(|_| {
                CniError::internal(format!(
                    "ADD did not finish within {:?} (add_timeout_seconds)",
                    conf.add_timeout
                ))
            })?
    });
    // The runtime is never dropped, so stray blocking work (a hung iptables) is not waited for.
    outcome?;
    Ok(Some(pretty(&reply)))
}
