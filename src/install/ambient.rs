//! Starting the ambient node agent from install-cni: its settings from the parsed
//! config, its seams, and the start itself (blocks until the stores synced, with no deadline:
//! install-cni waits for the API server however long it is away).
//!
//! The seams are chosen in [`deps`]: the data plane (in-pod rules, probe set, netns finder) and
//! the ZDS server are joined here. With the `test-hooks` feature, `ISTIO_CNI_RS_TEST_FAKE_DATAPLANE`
//! selects recording fakes instead, so install tests run the agent without touching the host.

use std::sync::Arc;

use tracing::info;

use super::config::Config;
use super::node_store::NodePods;
use crate::agent::adapters;
use crate::agent::adapters::{RECORD_FILE, Recorded};
use crate::agent::ports::{KubeAnnotator, LateZtunnel};
use crate::agent::settings::{AgentTiming, Settings};
use crate::agent::{Agent, AgentError, Deps};
use crate::kube::KubeClient;
use crate::retry::periodic::{Kick, Periodic};
use crate::telemetry::metrics::Metrics;
use crate::telemetry::serve::Serving;

/// Env var (test-hooks builds only) that selects the fake data plane and ztunnel.
#[cfg(feature = "test-hooks")]
const FAKE_DATAPLANE_ENV: &str = "ISTIO_CNI_RS_TEST_FAKE_DATAPLANE";

/// Why the agent did not start; install-cni exits 1 before installing anything.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("ambient node agent: {0}")]
    Agent(#[from] AgentError),
    #[error("ambient node agent: {0}")]
    Adapters(#[from] adapters::AdapterError),
    #[error(
        "ambient node agent: the backend record {path} is unreadable ({cause}); delete it to let the agent detect the backend again"
    )]
    Record {
        path: std::path::PathBuf,
        cause: String,
    },
}

/// Where the backend decided at the node's first install is recorded.
pub fn record_path(cfg: &Config) -> std::path::PathBuf {
    cfg.install.run_dir.join(RECORD_FILE)
}

/// The iptables flavour every role on this node uses, when one is decided: `FORCE_IPTABLES_BINARY`,
/// else (ambient) the flavour in the backend record, unless the record says native nftables. None
/// leaves each role's own detection (sidecar-only nodes, as Istio).
pub fn node_flavour(cfg: &Config) -> Option<String> {
    let forced = cfg
        .agent
        .force_iptables_binary
        .as_deref()
        .filter(|f| !f.is_empty());
    if let Some(f) = forced {
        return Some(f.to_string());
    }
    if !cfg.install.ambient_enabled {
        return None;
    }
    let recorded = read_record(&record_path(cfg)).ok().flatten()?;
    recorded.iptables_flavour().map(str::to_string)
}

/// The recorded backend (None: no record yet, a first install).
fn read_record(path: &std::path::Path) -> Result<Option<Recorded>, StartError> {
    let bad = |cause: String| StartError::Record {
        path: path.to_path_buf(),
        cause,
    };
    match super::fsutil::read_bounded(path) {
        Ok(bytes) => std::str::from_utf8(&bytes)
            .map_err(|_| "not UTF-8 text".to_string())
            .and_then(|text| Recorded::parse(text).map_err(|e| e.to_string()))
            .map(Some)
            .map_err(bad),
        Err(e) if e.source.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(bad(e.source.to_string())),
    }
}

/// Records the decision (atomically) unless the record already says it.
fn write_record(
    path: &std::path::Path,
    old: Option<&Recorded>,
    new: &Recorded,
) -> Result<(), StartError> {
    if old == Some(new) {
        return Ok(());
    }
    super::fsutil::write_atomic(path, new.render().as_bytes(), 0o644).map_err(|e| {
        StartError::Record {
            path: path.to_path_buf(),
            cause: e.to_string(),
        }
    })?;
    info!(path = %path.display(), backend = ?new.backend, "ambient backend recorded for this node");
    Ok(())
}

/// The agent's settings, from install-cni's parsed config; `drift_kick` starts a drift pass
/// early (install-cni's guard kicks it when it (re)installs our CNI entry).
pub fn agent_settings(cfg: &Config, drift_kick: &Kick) -> Settings {
    Settings {
        config: cfg.agent.clone(),
        run_dir: cfg.install.run_dir.clone(),
        exclude_namespaces: cfg.install.exclude_namespaces.clone(),
        enablement_selectors: cfg.install.enablement_selectors.clone(),
        native_nftables: cfg.install.native_nftables,
        host_proc_dir: cfg.host_proc_dir.clone(),
        pod_namespace: cfg.install.pod_namespace.clone(),
        timing: AgentTiming {
            sync_timeout: std::time::Duration::MAX,
            watch_retry_max: cfg.api_retry_max_delay,
            ..AgentTiming::default()
        },
        drift: cfg
            .drift_verify_interval
            .map(|period| Periodic::new(period, drift_kick.clone())),
    }
}

/// The agent's seams. The annotation patch is always the real one (the API server is reached
/// through the agent's client); ztunnel is bound late (see [`start`]). The flag is `Some` with the
/// real data plane (the ZDS server is then served): `true` when this start wrote the backend
/// record first.
async fn deps(
    client: &KubeClient,
    settings: &Settings,
    metrics: &Metrics,
    record: &std::path::Path,
    serving: &Serving,
) -> Result<(Deps, Arc<LateZtunnel>, Option<bool>), StartError> {
    let annotator = Arc::new(KubeAnnotator {
        client: client.clone(),
        timeout: settings.timing.kube_call_timeout,
    });
    let ztunnel = Arc::new(LateZtunnel::default());
    #[cfg(feature = "test-hooks")]
    if std::env::var_os(FAKE_DATAPLANE_ENV).is_some() {
        use crate::agent::testing::{FakeDataplane, FakeZtunnel};
        tracing::warn!("test hook: fake data plane and ztunnel (nothing is programmed)");
        ztunnel.bind(Arc::new(FakeZtunnel::default()));
        let deps = Deps {
            dataplane: Arc::new(FakeDataplane::default()),
            ztunnel: ztunnel.clone(),
            annotator,
            metrics: metrics.clone(),
            serving: serving.clone(),
        };
        return Ok((deps, ztunnel, None));
    }
    let recorded = read_record(record)?;
    let (dataplane, decision) = adapters::real_dataplane(settings, recorded).await?;
    let now = Recorded::of(&decision, settings.native_nftables);
    write_record(record, recorded.as_ref(), &now)?;
    let deps = Deps {
        dataplane,
        ztunnel: ztunnel.clone(),
        annotator,
        metrics: metrics.clone(),
        serving: serving.clone(),
    };
    Ok((deps, ztunnel, Some(recorded.is_none())))
}

/// Starts the agent on install-cni's client and node pod store ([`NodePods`]): settings checked,
/// seams built, then [`Agent::start`] (stores synced, startup snapshot restored), and only then
/// the ZDS server, so the first ztunnel to connect gets the whole restored state.
pub async fn start(
    cfg: &Config,
    node: &NodePods,
    metrics: &Metrics,
    serving: &Serving,
    drift_kick: &Kick,
    stop: &tokio_util::sync::CancellationToken,
) -> Result<Agent, StartError> {
    let settings = agent_settings(cfg, drift_kick);
    if settings.config.node_name.is_empty() {
        return Err(AgentError::NoNodeName.into());
    }
    let client = &node.client;
    info!(node = %settings.config.node_name, "starting the ambient node agent");
    let record = record_path(cfg);
    let (deps, ztunnel, real) = deps(client, &settings, metrics, &record, serving).await?;
    let started = async {
        let agent = Agent::start(&settings, client, node.pods.clone(), deps, stop).await?;
        if real.is_some() {
            adapters::serve_ztunnel(
                &agent,
                &ztunnel,
                settings.config.ztunnel_uds_address.clone(),
                metrics.clone(),
                stop.clone(),
            )
            .await?;
        }
        Ok(agent)
    }
    .await;
    // A record this failed start wrote first is not a decision the node ran with: the next start
    // decides afresh. One from an earlier install is kept.
    if started.is_err() && real == Some(true) {
        let _ = super::fsutil::remove_if_exists(&record);
    }
    started
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::install::config::{Parsed, parse};

    #[test]
    fn settings_come_from_the_install_config() {
        let env: std::collections::HashMap<String, String> = [
            ("AMBIENT_ENABLED", "true"),
            ("NODE_NAME", "node-1"),
            ("EXCLUDE_NAMESPACES", "kube-system,other"),
            ("AMBIENT_DNS_CAPTURE", "true"),
            ("HOST_PROBE_SNAT_IP", "169.254.9.9"),
            ("CNI_AGENT_RUN_DIR", "/run/x"),
            (
                "AMBIENT_ENABLEMENT_SELECTOR",
                r#"[{"podSelector":{"matchLabels":{"a":"b"}}}]"#,
            ),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let Ok(Parsed::Run(cfg)) = parse(&["install-cni".to_string()], &env) else {
            panic!("parse")
        };
        let s = agent_settings(&cfg, &Kick::new());
        assert_eq!(s.config.node_name, "node-1");
        assert!(s.config.dns_capture);
        assert_eq!(s.config.host_probe_snat_ip.to_string(), "169.254.9.9");
        assert_eq!(s.exclude_namespaces, ["kube-system", "other"]);
        assert_eq!(s.enablement_selectors.len(), 1);
        assert_eq!(
            s.plugin_event_socket(),
            std::path::Path::new("/run/x/pluginevent.sock")
        );
        assert_eq!(s.config.system_namespace, "istio-system");
        let drift = s.drift.expect("drift verification on by default");
        assert_eq!(drift.period(), std::time::Duration::from_secs(60));
    }

    #[test]
    fn the_backend_record_is_read_as_input_bounded_and_only_from_a_regular_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(RECORD_FILE);
        assert!(read_record(&path).expect("missing is fine").is_none());
        let good = "backend=nftables\nflavour=auto\nnative_nftables=true\n";
        std::fs::write(&path, good).expect("write");
        assert!(read_record(&path).expect("good").is_some());
        // Over the read limit: refused naming the file, nothing parsed.
        let mut big = good.as_bytes().to_vec();
        big.resize(2 << 20, b'\n');
        std::fs::write(&path, &big).expect("write big");
        let e = read_record(&path).expect_err("too large").to_string();
        assert!(e.contains(RECORD_FILE) && e.contains("read limit"), "{e}");
        // A FIFO in its place is refused at once (a blocking open would hang the start).
        std::fs::remove_file(&path).expect("rm");
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("fifo");
        let e = read_record(&path).expect_err("fifo").to_string();
        assert!(e.contains("not a regular file"), "{e}");
        std::fs::write(dir.path().join("x"), b"\xff\xfe").expect("write");
        let e = read_record(&dir.path().join("x"))
            .expect_err("binary")
            .to_string();
        assert!(e.contains("not UTF-8"), "{e}");
    }
}
