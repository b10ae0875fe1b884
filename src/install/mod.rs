//! The `install-cni` role: installs this binary as the CNI plugin, merges our entry into the node's
//! CNI config, writes the plugin kubeconfig, guards all of it, and cleans up on shutdown.
//! May call: `cli`, `kube`, `retry`, `telemetry`, `agent`, `repair`, `wire`.
//!
//! Files: `config` (flags/env, pure; split into `flags`, `values` (how each kind of value is read;
//! selector YAML through serde-saphyr into `kube::selector`), `resolve` (flag > env > default),
//! `sections`; argv goes through the shared `cli` normaliser), `cniconf` (merge logic, pure), `kubeconfig` (pure render),
//! `fsutil` (atomic file effects), `attachments` (which cached CNI results and configs still
//! name the plugin, so an uninstall keeps its binary for their DEL), `installer` (install pass, check, cleanup; split into
//! `select` (which file), `merge` (writing our entry), `restore` (cleanup and the `.conf` record)),
//! `guard` (watch loop),
//! `upgrade` (shutdown keep/clean decision; its API reads go through `kube`), `caps` (capability dropping),
//! `node_store` (the ONE node-scoped pod store, made here and handed to the agent and the repair
//! controller), `pod_facts` (the root-only socket answering the plugin's pod reads from that
//! store), `ambient` (starting the node agent when `AMBIENT_ENABLED=true`), `status` (the
//! `install-cni status` command: the running agent's `/debug/pods` as a table); the repair
//! controller (`crate::repair`) is started here when `REPAIR_ENABLED=true`.

pub mod ambient;
pub mod attachments;
pub mod caps;
pub mod cniconf;
pub mod config;
pub mod fsutil;
pub mod guard;
pub mod installer;
pub mod kubeconfig;
pub mod node_store;
pub mod pod_facts;
pub mod status;
pub mod upgrade;

use std::collections::BTreeMap;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::kube::KubeClient;
use crate::retry::periodic::Kick;
use crate::telemetry::health::{self, NotReady, Readiness};
use crate::telemetry::logging::{self, LogSettings, ScopeLevels};
use crate::telemetry::logsink;
use crate::telemetry::metrics::Metrics;
use crate::telemetry::serve::Serving;
use config::{Config, LogLevel, LogTarget, Parsed};
use node_store::NodePods;

/// Readiness component name of the installer.
const INSTALLER: &str = "installer";
/// Readiness component name of the ambient node agent (initial sync done).
const AGENT: &str = "agent";
/// Readiness component name of the repair controller (node pod store synced).
const REPAIR: &str = "repair";
/// Readiness component of the node's pod watch after its first list (not ready while refused).
const POD_WATCH: &str = "pod-watch";
/// How often the wait for the API server looks at the store again (the watch's own retries are
/// spaced by `API_RETRY_MAX_DELAY`).
const API_POLL: Duration = Duration::from_millis(200);
/// Threads of the runtime's blocking pool (tokio's default is 512).
const BLOCKING_THREADS: usize = 4;

/// Entry point of the `install-cni` role.
pub fn main(args: Vec<String>) -> i32 {
    let cfg = match config::parse(&args, &crate::cli::ProcessEnv) {
        Ok(Parsed::Run(c)) => c,
        Ok(Parsed::Status(req)) => return status::main(req),
        Ok(Parsed::Exit { text, code }) => {
            if code == 0 {
                print!("{text}");
            } else {
                eprint!("{text}");
                if !text.ends_with('\n') {
                    eprintln!();
                }
            }
            return code;
        }
        Err(e) => {
            eprintln!("install-cni: {e}");
            return 1;
        }
    };
    // The one setting checked on the host, still before anything is touched (even the log file).
    if let Err(e) = check_host_proc(&cfg) {
        eprintln!("install-cni: {e}");
        return 1;
    }
    // Held to the end of this function: records still queued are written before the exit.
    let _log = match logging::init(log_settings(&cfg)) {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("install-cni: {e}");
            return 1;
        }
    };
    for w in &cfg.warnings {
        warn!("{w}");
    }
    // Every listener at its connection bound must still leave the agent fds for its own work.
    match crate::telemetry::socket::raise_fd_limit(crate::telemetry::serve::fds_needed()) {
        Ok(l) if l.enough => info!(before = l.before, now = l.now, "open-file limit"),
        Ok(l) => warn!(
            limit = l.now,
            needed = crate::telemetry::serve::fds_needed(),
            "the open-file limit (RLIMIT_NOFILE hard limit) is below every listener's connection \
             bound plus the agent's reserve; under a connection flood the agent may run out of fds"
        ),
        Err(e) => warn!("{e}"),
    }
    // Before any thread exists: capabilities are per thread and inherited.
    let ports = [cfg.health_port, cfg.monitoring_port.unwrap_or(0)];
    caps::drop_to(&caps::needed(
        cfg.install.ambient_enabled,
        cfg.repair.enabled,
        &ports,
    ));
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        // Blocking work is netlink and nf_tables for one pod at a time (CPU, not waiting): more
        // threads than this only add per-thread heaps and context switches on a node's cores.
        .max_blocking_threads(BLOCKING_THREADS)
        .thread_name("install-cni")
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            error!("building the async runtime: {e}");
            return 1;
        }
    };
    let code = rt.block_on(run(*cfg));
    rt.shutdown_timeout(Duration::from_secs(2));
    code
}

/// `HOST_PROC_DIR` must be a procfs when a feature reads pods' netns from it (ambient, in-place
/// repair; the chart mounts it for exactly those). The sidecar drift pass only warns (it is on by
/// default, and the chart does not mount /proc without those features).
fn check_host_proc(cfg: &Config) -> Result<(), config::ConfigError> {
    if !(cfg.install.ambient_enabled || (cfg.repair.enabled && cfg.repair.repair_pods)) {
        return Ok(());
    }
    // `f_type` is signed on glibc and unsigned on musl (the shipped build); magic numbers are
    // small and positive, so one unsigned type serves both.
    let f_type = nix::sys::statfs::statfs(&cfg.host_proc_dir)
        .map(|s| s.filesystem_type().0 as u64)
        .map_err(|e| e.to_string());
    config::procfs(
        &cfg.host_proc_setting,
        &cfg.host_proc_dir.display().to_string(),
        f_type,
    )
}

fn to_tracing(l: LogLevel) -> Option<tracing::Level> {
    match l {
        LogLevel::Debug => Some(tracing::Level::DEBUG),
        LogLevel::Info => Some(tracing::Level::INFO),
        LogLevel::Warn => Some(tracing::Level::WARN),
        LogLevel::Error | LogLevel::Fatal => Some(tracing::Level::ERROR),
        LogLevel::None => None,
    }
}

fn log_settings(cfg: &Config) -> LogSettings {
    let scopes: BTreeMap<String, Option<tracing::Level>> = cfg
        .log
        .scopes
        .iter()
        .map(|(k, v)| (k.clone(), to_tracing(*v)))
        .collect();
    LogSettings {
        levels: ScopeLevels {
            default: to_tracing(cfg.log.default_level),
            scopes,
        },
        json: cfg.log.as_json,
        file: match &cfg.log.target {
            LogTarget::File(p) => Some(p.clone()),
            _ => None,
        },
        stdout: cfg.log.target == LogTarget::Stdout,
        rotate: cfg.log.rotate.clone(),
    }
}

/// Reports guard progress to readiness and metrics.
struct Observer {
    readiness: Readiness,
    metrics: Metrics,
    /// Asks the drift verifiers for a pass: pods started while our entry was missing
    /// ran without the plugin.
    drift: Kick,
}

impl guard::GuardObserver for Observer {
    fn set_ready(&self, ready: bool) {
        self.readiness.set(INSTALLER, ready);
        self.metrics.install_ready.set(i64::from(ready));
    }

    fn pass_result(&self, failure: Option<&'static str>) {
        self.metrics.install_result(failure.unwrap_or("SUCCESS"));
    }

    fn installed(&self) {
        self.drift.kick();
    }
}

/// SIGTERM/SIGINT, registered as the very first thing so an early signal still cleans up.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn register() -> std::io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// Resolves if the guard thread ends on its own (only a bug can do that).
async fn guard_died(guard: &guard::GuardHandle) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        if guard.is_finished() {
            return;
        }
    }
}

async fn run(cfg: Config) -> i32 {
    let ic = &cfg.install;
    info!(
        version = crate::VERSION,
        conf_dir = %ic.mounted_cni_net_dir.display(),
        bin_dirs = %ic.cni_bin_dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(","),
        run_dir = %ic.run_dir.display(),
        chained = ic.chained,
        owned = ic.owned_mode(),
        ambient = ic.ambient_enabled,
        repair = cfg.repair.enabled,
        "starting install-cni"
    );
    let mut signals = match Signals::register() {
        Ok(s) => s,
        Err(e) => {
            error!("cannot install signal handlers: {e}");
            return 1;
        }
    };
    let base = Base::new(&cfg);
    // The start may wait long for the API server; a signal meanwhile ends it (nothing was
    // installed or removed yet: the node's plugin and CNI config stay as they are).
    let started = tokio::select! {
        started = start(&cfg, &base) => started,
        signal = signals.recv() => {
            info!(signal, "shutting down before the start finished; the node's CNI config is left as it is");
            base.stop.cancel();
            return 0;
        }
    };
    let started = match started {
        Ok(started) => started,
        Err(failure) => {
            error!("{failure}");
            base.stop.cancel();
            return 1;
        }
    };
    tokio::select! {
        signal = signals.recv() => info!(signal, "shutting down"),
        _ = guard_died(&started.guard) => error!("the guard thread ended unexpectedly; shutting down"),
    }
    shut_down(&cfg, &base, started).await
}

/// What every part of install-cni shares: the stop token, metrics, readiness, the listeners'
/// bounds, and the guard's kick of the drift verifiers.
struct Base {
    stop: CancellationToken,
    metrics: Metrics,
    readiness: Readiness,
    serving: Serving,
    /// Kicked when the guard (re)installs; the drift verifiers then run a pass at once.
    drift_kick: Kick,
}

impl Base {
    fn new(cfg: &Config) -> Base {
        let readiness = Readiness::default();
        readiness.register(INSTALLER);
        let metrics = Metrics::default();
        for a in &cfg.adjusted {
            metrics.setting_adjusted(&a.setting);
        }
        Base {
            stop: CancellationToken::new(),
            metrics,
            serving: Serving {
                readiness: readiness.clone(),
                idle_timeout: cfg.listener_idle_timeout,
            },
            readiness,
            drift_kick: Kick::new(),
        }
    }
}

/// What is running once install-cni started.
struct Started {
    servers: Vec<tokio::task::JoinHandle<()>>,
    agent: Option<crate::agent::Agent>,
    guard: guard::GuardHandle,
    check: Box<dyn upgrade::UpgradeCheck>,
}

/// Why install-cni did not start; it exits 1 (before installing anything, but for the guard).
#[derive(Debug, thiserror::Error)]
enum StartFailure {
    #[error("plugin log sink failed to start: {0}")]
    LogSink(#[source] crate::telemetry::socket::SocketError),
    #[error("health server on port {port} failed to start: {source}")]
    Health {
        port: u16,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Node(#[from] node_store::NodeError),
    #[error("{features}: Kubernetes client: {source}")]
    Client {
        features: String,
        #[source]
        source: Box<crate::kube::KubeError>,
    },
    #[error(transparent)]
    Repair(#[from] crate::repair::RepairError),
    #[error(transparent)]
    Agent(#[from] ambient::StartError),
    #[error("cannot find our own executable to install as the plugin: {0}")]
    OwnExe(#[source] std::io::Error),
    #[error(transparent)]
    Installer(#[from] installer::InstallError),
    #[error("starting the guard thread: {0}")]
    Guard(#[source] std::io::Error),
}

/// In order: the listeners, the node's pod watch with the repair controller and the ambient
/// agent (both ready before the plugin is installed), the pod-facts socket, then the guard that
/// installs and watches the plugin. An error names what failed to start.
async fn start(cfg: &Config, base: &Base) -> Result<Started, StartFailure> {
    let (mut servers, debug_pods) = serve_listeners(cfg, base).await?;
    let node = watch_node(cfg, &base.stop).await?;
    if let Some(node) = &node {
        wait_for_api(&node.pods, &base.readiness, base.stop.clone()).await;
    }
    // The repair controller (started first so it sees the store's initial list; ready once synced below).
    let repair = match (&node, cfg.repair.enabled) {
        (Some(node), true) => Some(start_repair(cfg, base, node)?),
        _ => None,
    };
    // The agent is ready (stores synced) before the plugin is installed, so a new
    // node's CNI config only appears once ambient pods can be served.
    let agent = match (cfg.install.ambient_enabled, &node) {
        (true, Some(node)) => Some(start_agent(cfg, base, node, &debug_pods).await?),
        _ => None,
    };
    // Sidecar-only (the repair controller's store): `/debug/pods` lists the node's pods from it.
    if let (None, Some(node)) = (&agent, &node) {
        let pods = node.pods.clone();
        debug_pods.bind(std::sync::Arc::new(move || {
            serde_json::to_value(crate::agent::status::debug_pods_without_agent(&pods))
                .unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }))
        }));
    }
    // Istio blocks until its informers synced: a new node's CNI config only appears once the
    // agent and the repair controller can see this node's pods. No deadline (wait_for_api).
    if let (Some(repair), Some(node)) = (&repair, &node) {
        // Fail closed, and say so: the controller runs, but enters no pod's netns.
        base.readiness
            .set_state(REPAIR, refused_state(repair.netns_refused.as_deref()));
        info!(pods = node.pods.len(), "repair controller ready");
    }
    // Pod facts: the plugin reads its pod from the node pod store instead of the API
    // server; the namespace labels for its ambient check come from the agent's store.
    if let Some(node) = &node {
        let namespaces = agent.as_ref().map(|a| a.core().namespaces.clone());
        let path = crate::wire::pod_facts::socket_path(&cfg.install.run_dir);
        match pod_facts::start(
            &path,
            node.pods.clone(),
            namespaces,
            &base.serving,
            base.stop.clone(),
        ) {
            Ok(task) => servers.push(task),
            // Not fatal: every plugin ADD then asks the API server, as without a store.
            Err(e) => warn!("{e}; the plugin will GET pods from the API server"),
        }
    }
    let check = upgrade::checker(&cfg.install.pod_namespace, &cfg.install.node_name).await;
    let exe = std::env::current_exe().map_err(StartFailure::OwnExe)?;
    let mut installer = installer::Installer::new(cfg.install.clone(), exe)?;
    // The agent (started above) has decided and recorded the node's flavour by now.
    let flavour = ambient::node_flavour(cfg);
    if let Some(f) = &flavour {
        info!(flavour = %f, "the plugin uses this node's iptables flavour");
    }
    installer.set_iptables_flavour(flavour);
    let observer = Observer {
        readiness: base.readiness.clone(),
        metrics: base.metrics.clone(),
        drift: base.drift_kick.clone(),
    };
    let guard = guard::spawn(installer, observer).map_err(StartFailure::Guard)?;
    Ok(Started {
        servers,
        agent,
        guard,
        check,
    })
}

/// The metrics server (its failure is only logged, as Istio), the plugin log sink and the health
/// server; returns their tasks and the `/debug/pods` binding the agent fills in later.
async fn serve_listeners(
    cfg: &Config,
    base: &Base,
) -> Result<(Vec<tokio::task::JoinHandle<()>>, health::DebugPods), StartFailure> {
    let idle = base.serving.idle_timeout;
    if let Some(port) = cfg.monitoring_port {
        match health::serve_metrics(port, base.metrics.clone(), idle, base.stop.clone()).await {
            Ok(addr) => info!(addr = %addr, "metrics server listening"),
            // As Istio: metrics are not worth failing the node agent for.
            Err(e) => error!("metrics server on port {port} failed to start: {e}"),
        }
    }
    let sock = logsink::socket_path(&cfg.install.run_dir);
    let sink = logsink::bind(&sock).map_err(StartFailure::LogSink)?;
    let servers = vec![tokio::spawn(logsink::serve(
        sink,
        base.readiness.clone(),
        idle,
        base.stop.clone(),
    ))];
    info!(path = %sock.display(), "plugin log sink listening");
    let debug_pods = health::DebugPods::default();
    let addr = health::serve_health(
        cfg.health_port,
        base.readiness.clone(),
        debug_pods.clone(),
        idle,
        base.stop.clone(),
    )
    .await
    .map_err(|source| StartFailure::Health {
        port: cfg.health_port,
        source,
    })?;
    info!(addr = %addr, "health server listening");
    Ok((servers, debug_pods))
}

/// The one watch of this node's pods, shared by the agent and the repair controller (none when
/// neither runs).
async fn watch_node(
    cfg: &Config,
    stop: &CancellationToken,
) -> Result<Option<NodePods>, StartFailure> {
    let Some(node) = node_store::store_node(cfg)? else {
        return Ok(None);
    };
    let (client, source) =
        KubeClient::for_agent(None)
            .await
            .map_err(|source| StartFailure::Client {
                features: node_store::features(cfg),
                source: Box::new(source),
            })?;
    info!(?source, node, "watching this node's pods");
    let backoff = crate::kube::WatchBackoff {
        max: cfg.api_retry_max_delay,
        ..Default::default()
    };
    Ok(Some(NodePods::spawn(client, node, backoff, stop)))
}

/// Waits for this node's first pod list however long the API server is away (Istio's start-up
/// blocks on its informers the same way; exiting would only add CrashLoopBackOff's delay to the
/// outage). Meanwhile `/healthz` answers ok and `/readyz` says why it waits; nothing is installed
/// or removed, so a node's existing plugin and CNI config stay in place. Refusals that need an
/// operator (RBAC, token, TLS) are waited out the same way and named in the reason.
async fn wait_for_api(
    pods: &crate::kube::stores::PodStore,
    readiness: &Readiness,
    stop: CancellationToken,
) {
    use crate::telemetry::health::API_SERVER;
    let report = |why: &str| {
        warn!(
            "waiting for the API server: {why}; retrying, the node's CNI config is left as it is"
        );
        readiness.set_state(API_SERVER, Err(NotReady::ApiServer(why.to_string())));
    };
    pods.wait_until_synced(API_POLL, report).await;
    readiness.set_state(API_SERVER, Ok(()));
    info!(
        pods = pods.len(),
        "the API server answered: this node's pods are listed"
    );
    // Listed but no longer watched (RBAC without `watch`, a revoked token): not ready, naming
    // the refusal, until the watch is allowed again.
    let (pods, readiness) = (pods.clone(), readiness.clone());
    tokio::spawn(async move {
        pods.follow_watch_refusals(stop, |why| {
            readiness.set_state(
                POD_WATCH,
                why.map_or(Ok(()), |why| Err(NotReady::WatchRefused(why))),
            );
        })
        .await
    });
}

fn start_repair(
    cfg: &Config,
    base: &Base,
    node: &NodePods,
) -> Result<crate::repair::Repair, StartFailure> {
    base.readiness.register(REPAIR);
    let host = crate::repair::HostSettings {
        host_proc_dir: cfg.host_proc_dir.clone(),
        native_nftables: cfg.install.native_nftables,
        force_iptables_binary: cfg.agent.force_iptables_binary.clone(),
        flavour_record: cfg
            .install
            .ambient_enabled
            .then(|| ambient::record_path(cfg)),
    };
    // Sidecar drift self-heal runs with the repair controller only.
    let drift = cfg
        .drift_verify_interval
        .map(|period| crate::repair::drift::DriftSettings {
            period,
            kick: base.drift_kick.clone(),
            exclude_namespaces: cfg.install.exclude_namespaces.clone(),
        });
    crate::repair::start(
        &cfg.repair,
        host,
        node.client.clone(),
        node.pods.clone(),
        base.metrics.clone(),
        drift,
        &base.stop,
    )
    .map_err(StartFailure::from)
}

async fn start_agent(
    cfg: &Config,
    base: &Base,
    node: &NodePods,
    debug_pods: &health::DebugPods,
) -> Result<crate::agent::Agent, StartFailure> {
    base.readiness.register(AGENT);
    let agent = ambient::start(
        cfg,
        node,
        &base.metrics,
        &base.serving,
        &base.drift_kick,
        &base.stop,
    )
    .await?;
    let core = agent.core().clone();
    debug_pods.bind(std::sync::Arc::new(move || {
        serde_json::to_value(crate::agent::status::debug_pods(&core))
            .unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }))
    }));
    let reserved = agent.core().mesh.dataplane.reserved_netns();
    base.readiness
        .set_state(AGENT, refused_state(reserved.unidentified()));
    info!("ambient node agent ready");
    Ok(agent)
}

/// An uninstall removes the agent's host probe SNAT rules and probe sets (an upgrade keeps them
/// for the next agent); a failure is logged, the rest of the uninstall goes on.
async fn uninstall_host_rules(dataplane: std::sync::Arc<dyn crate::agent::ports::DataplanePort>) {
    match tokio::task::spawn_blocking(move || dataplane.uninstall_host()).await {
        Ok(Ok(())) => info!("ambient host rules and probe sets removed"),
        Ok(Err(e)) => warn!("removing the ambient host rules and probe sets: {e}"),
        Err(e) => warn!("removing the ambient host rules and probe sets: {e}"),
    }
}

/// A component's readiness when the node's netns could not be identified: not ready, saying why
/// no pod's netns is entered.
fn refused_state(refused: Option<&str>) -> Result<(), NotReady> {
    match refused {
        None => Ok(()),
        Some(why) => Err(NotReady::NetnsRefused(why.to_string())),
    }
}

/// Ordered shutdown: the agent first (its socket disappears, so plugins fail ADD at once and the
/// kubelet retries, instead of waiting on a half-stopped agent), then the guard, then the
/// installer's cleanup and the agent's host rules unless an upgrade keeps the node's config,
/// then the servers.
async fn shut_down(cfg: &Config, base: &Base, started: Started) -> i32 {
    let Started {
        servers,
        agent,
        guard,
        check,
    } = started;
    base.readiness.set(INSTALLER, false);
    let mut host_rules = None;
    if let Some(agent) = agent {
        base.readiness.set(AGENT, false);
        host_rules = Some(agent.core().mesh.dataplane.clone());
        agent.stop(Duration::from_secs(5)).await;
    }
    let installer = tokio::task::spawn_blocking(move || guard.stop())
        .await
        .ok()
        .flatten();
    let keep = upgrade::should_keep(
        check.as_ref(),
        cfg.install.ambient_disable_safe_upgrade,
        upgrade::RETRY_DELAY,
    )
    .await;
    let uninstall = installer.is_some() && !keep;
    let code = match installer {
        Some(mut inst) if !keep => {
            let _ = tokio::task::spawn_blocking(move || inst.cleanup()).await;
            if let Some(dataplane) = host_rules {
                uninstall_host_rules(dataplane).await;
            }
            // Uninstalled: a later install decides the backend afresh.
            let record = ambient::record_path(cfg);
            match std::fs::remove_file(&record) {
                Ok(()) => info!(path = %record.display(), "ambient backend record removed"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    warn!(path = %record.display(), "removing the ambient backend record: {e}")
                }
            }
            0
        }
        Some(_) => 0,
        None => {
            error!("the guard thread died; skipping cleanup");
            1
        }
    };
    base.stop.cancel();
    // The servers remove their sockets (only those still ours) on the way out.
    let _ = tokio::time::timeout(Duration::from_secs(2), futures::future::join_all(servers)).await;
    if uninstall {
        installer::remove_run_dir_leftovers(&cfg.install.run_dir);
    }
    info!("install-cni stopped");
    code
}
