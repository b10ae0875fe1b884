//! The `istio-iptables` role: flags/env -> [`flags::Settings`] -> host facts (proxy UID, IPv6, DNS
//! servers) -> capture config -> rule model -> dry-run transcript or apply -> optional validation.
//! May call: `cli`, `rules`, `apply`, `netns`, `netlink`.

pub mod flags;
pub mod host;
pub mod validation;

use std::collections::HashSet;
use std::path::Path;

use argh::FromArgs;
use tracing::{error, info, warn};

use crate::apply::{self, SidecarOptions};
use crate::cli::{Env, ProcessEnv, normalise_args};
use crate::netns::UsernsEntry;
use crate::rules::{self, RuleSet};
use flags::{Flags, SHAPES, Settings};

/// The arguments Istio's sidecar injector passes to the istio-init container (demo, tests, bench).
pub const INJECTOR_DEFAULT_ARGS: &[&str] = &[
    "-p",
    "15001",
    "-z",
    "15006",
    "-u",
    "1337",
    "-m",
    "REDIRECT",
    "-i",
    "*",
    "-x",
    "",
    "-b",
    "*",
    "-d",
    "15090,15021,15020",
];

/// Exit code for command-line errors (pilot-agent exits 255 on a cobra parse error).
const EXIT_USAGE: i32 = 255;
/// Exit code for bad values and failed rule application.
const EXIT_FAILURE: i32 = 1;
/// Exit code when validation fails (the istio-validation init container contract).
pub const EXIT_VALIDATION_FAILED: i32 = 126;

/// Entry point of the `istio-iptables` role.
pub fn main(args: Vec<String>) -> i32 {
    let normalised = match normalise_args(args.get(1..).unwrap_or_default(), &SHAPES) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("istio-iptables: {e}");
            return EXIT_USAGE;
        }
    };
    let refs: Vec<&str> = normalised.args.iter().map(String::as_str).collect();
    let flags = match Flags::from_args(&["istio-iptables"], &refs) {
        Ok(f) => f,
        Err(early) => {
            return if early.status.is_ok() {
                print!("{}", early.output);
                0
            } else {
                eprintln!("istio-iptables: {}", early.output.trim_end());
                eprintln!("Run istio-iptables --help for usage.");
                EXIT_USAGE
            };
        }
    };
    if flags.version {
        println!("istio-iptables (istio-cni-rs) {}", crate::VERSION);
        return 0;
    }
    if let Err(e) = init_logging(&flags.log_target, flags.log_as_json) {
        eprintln!("istio-iptables: --log_target: {e}");
        return EXIT_FAILURE;
    }
    run(&flags, &ProcessEnv, &normalised.explicit_false)
}

/// Logs in the shared Istio format (text or, with --log_as_json, JSON lines) to each
/// --log_target (stdout, stderr or a file; default stderr, so that a dry run's stdout carries only
/// the transcript). ISTIO_IPTABLES_LOG sets the filter (default info).
fn init_logging(targets: &[String], json: bool) -> Result<(), String> {
    let filter = tracing_subscriber::EnvFilter::try_from_env("ISTIO_IPTABLES_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let writer = crate::telemetry::logging::targets_writer(targets)?;
    let _ = tracing_subscriber::fmt()
        .event_format(crate::telemetry::logging::IstioFormat { json })
        .with_writer(writer)
        .with_env_filter(filter)
        .try_init();
    Ok(())
}

fn run(flags: &Flags, env: &dyn Env, explicit_false: &HashSet<String>) -> i32 {
    let mut settings = match flags.resolve(env, explicit_false) {
        Ok(s) => s,
        Err(e) => {
            error!("{e}");
            return EXIT_FAILURE;
        }
    };
    let host_ip = match host::fill_host_facts(&mut settings).and_then(|ip| {
        flags::check_capture(flags, env, &settings.capture)
            .map(|_| ip)
            .map_err(|e| e.to_string())
    }) {
        Ok(ip) => ip,
        Err(e) => {
            error!("{e}");
            return EXIT_FAILURE;
        }
    };
    if !settings.skip_rule_apply {
        let result = match (settings.native_nftables, settings.dry_run) {
            (false, true) if settings.cleanup_only => cleanup_dry_run(&settings),
            (false, true) => dry_run(&settings, &rules::capture::build(&settings.capture)),
            (false, false) if settings.cleanup_only => cleanup(&settings),
            (false, false) => apply_rules(&settings, rules::capture::build(&settings.capture)),
            (true, true) => emit_dry_run(&settings, nft_transaction(&settings)),
            (true, false) => apply_nft(&settings),
        };
        if let Err(e) = result {
            error!("{e}");
            return EXIT_FAILURE;
        }
    }
    if settings.run_validation {
        let ipv6 = host_ip.map(|h| h.addr.is_ipv6()).unwrap_or(false);
        if let Err(e) = validation::run(&settings, ipv6) {
            error!(
                "iptables validation failed; workload is not ready for Istio. \
                 When using Istio CNI, this can occur if a pod is scheduled before the node is ready. \
                 Error: {e}"
            );
            return EXIT_VALIDATION_FAILED;
        }
        info!("iptables validation passed");
    }
    0
}

fn dry_run(settings: &Settings, rules: &RuleSet) -> Result<(), String> {
    let lines = apply::transcript::sidecar(rules, settings.capture.enable_ipv6);
    let mut text = lines.join("\n");
    text.push('\n');
    emit_dry_run(settings, text)
}

/// Runs `work` where the rules live: in `--network-namespace` in CNI mode, else right here.
/// `work` gets the user-namespace entry its tools must take when that netns is owned by another
/// user namespace (`hostUsers: false` pods).
fn in_target_netns<T: Send + 'static>(
    settings: &Settings,
    work: impl FnOnce(Option<UsernsEntry>) -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    let target = Target::open(settings)?;
    let userns = target.userns();
    match target {
        Target::Pod(netns) => netns.run(move || work(userns)).map_err(|e| e.to_string())?,
        Target::Here(_) => work(userns),
    }
}

/// The rule lists a cleanup removes: the configuration's, with IPv6 rules even when IPv6 is off
/// (used when ip6tables holds chains of ours), and the same in the other interception mode (its
/// built-in-chain rules go where present).
fn cleanup_rules(settings: &Settings) -> [RuleSet; 2] {
    let mut planned = rules::capture::build(&settings.capture);
    let with_v6 = rules::capture::CaptureConfig {
        enable_ipv6: true,
        ..settings.capture.clone()
    };
    planned.v6 = rules::capture::build(&with_v6).v6;
    [planned, rules::capture::other_mode(&with_v6)]
}

/// `--cleanup-only --dry-run`: the plan the real cleanup would run now (its saves are read, as
/// the real run does; a failing save counts as empty, like Istio's dry-run stub).
fn cleanup_dry_run(settings: &Settings) -> Result<(), String> {
    let [rules, other] = cleanup_rules(settings);
    let ipv6 = settings.capture.enable_ipv6;
    let force = settings.force_binary;
    let stateless = rules.clone();
    let plan = in_target_netns(settings, move |userns| {
        let input = apply::CleanupInput {
            v4: &rules.v4,
            v6: &rules.v6,
            ipv6_enabled: ipv6,
            also: [&other.v4, &other.v6],
        };
        apply::cleanup_plan_here(&input, &[], force, userns.as_ref()).map_err(|e| e.to_string())
    })
    .unwrap_or_else(|e| {
        // No binaries or no namespace to read: plan from an empty state, as Istio's stub does.
        warn!("dry run: cannot read the current rules ({e}); planning from an empty state");
        let input = apply::CleanupInput {
            v4: &stateless.v4,
            v6: &stateless.v6,
            ipv6_enabled: ipv6,
            also: [&[], &[]],
        };
        let empty = [(rules::Family::V4, None), (rules::Family::V6, None)];
        apply::cleanup::plan_from_states(&empty, &input)
    });
    let mut text = plan.transcript().join("\n");
    text.push('\n');
    emit_dry_run(settings, text)
}

/// `--cleanup-only`: removes what this configuration creates (rules, our chains, leftover jumps
/// into them, in every family that has any) and its TPROXY routes and `::6/128` on lo.
fn cleanup(settings: &Settings) -> Result<(), String> {
    let [rules, other] = cleanup_rules(settings);
    let capture = settings.capture.clone();
    let force = settings.force_binary;
    let env = lock_env(settings);
    let outcome = in_target_netns(settings, move |userns| {
        let input = apply::CleanupInput {
            v4: &rules.v4,
            v6: &rules.v6,
            ipv6_enabled: capture.enable_ipv6,
            also: [&other.v4, &other.v6],
        };
        let outcome = apply::cleanup_sidecar_here(&input, &env, force, userns.as_ref())
            .map_err(|e| e.to_string())?;
        apply::routes::remove_sidecar_routes(&capture).map_err(|e| e.to_string())?;
        Ok(outcome)
    })?;
    info!(%outcome, "iptables rules done");
    Ok(())
}

/// A pod-scoped xtables lock in CNI mode: concurrent pods never wait on each other's lock.
fn lock_env(settings: &Settings) -> Vec<(String, String)> {
    match (&settings.network_namespace, settings.cni_mode) {
        (Some(ns), true) => vec![("XTABLES_LOCKFILE".into(), ns.clone())],
        _ => vec![],
    }
}

/// Prints a dry-run text and writes it to $DRY_RUN_FILE_PATH when set.
fn emit_dry_run(settings: &Settings, text: String) -> Result<(), String> {
    if let Some(path) = &settings.dry_run_file {
        crate::apply::transcript::write_file(Path::new(path), &text)
            .map_err(|e| format!("cannot write DRY_RUN_FILE_PATH {path}: {e}"))?;
    }
    print!("{text}");
    Ok(())
}

/// The nftables transaction for the settings: our tables replaced, or removed with --cleanup-only.
fn nft_transaction(settings: &Settings) -> String {
    use rules::nftables::{NftTable, render_cleanup, render_transaction};
    if settings.cleanup_only {
        render_cleanup(&NftTable::SIDECAR)
    } else {
        render_transaction(
            &rules::nft_capture::build(&settings.capture),
            &NftTable::SIDECAR,
        )
    }
}

/// Where the rules go: into `--network-namespace` (CNI mode) or the netns we run in.
enum Target {
    Pod(crate::netns::Netns),
    Here(Option<crate::netns::Netns>),
}

impl Target {
    /// Opens the target netns once; it tells whether tools must also enter the user namespace
    /// owning it (`hostUsers: false`). Our own netns is only inspected: without procfs we work as
    /// before.
    fn open(settings: &Settings) -> Result<Target, String> {
        match (&settings.network_namespace, settings.cni_mode) {
            (Some(ns), true) => crate::netns::Netns::open(Path::new(ns))
                .map(Target::Pod)
                .map_err(|e| e.to_string()),
            _ => Ok(Target::Here(crate::netns::Netns::current().ok())),
        }
    }

    fn userns(&self) -> Option<crate::netns::UsernsEntry> {
        match self {
            Target::Pod(ns) | Target::Here(Some(ns)) => ns.userns_entry().cloned(),
            Target::Here(None) => None,
        }
    }
}

fn apply_nft(settings: &Settings) -> Result<(), String> {
    let transaction = nft_transaction(settings);
    let capture = settings.capture.clone();
    let cleanup_only = settings.cleanup_only;
    let work = move |userns: Option<UsernsEntry>| -> Result<(), String> {
        apply::nft::apply_transaction(&mut apply::ProcessExecutor::entering(userns), &transaction)
            .map_err(|e| e.to_string())?;
        if cleanup_only {
            apply::routes::remove_sidecar_routes(&capture).map_err(|e| e.to_string())?;
        } else {
            // Each run replaces our tables, so the routes follow the flags of this run.
            apply::routes::converge_sidecar_routes(&capture, true).map_err(|e| e.to_string())?;
        }
        Ok(())
    };
    in_target_netns(settings, work)?;
    info!("nftables rules done");
    Ok(())
}

fn apply_rules(settings: &Settings, rules: RuleSet) -> Result<(), String> {
    let opts = SidecarOptions {
        reconcile: settings.reconcile,
        cleanup_only: false,
        force_apply: settings.force_apply,
        env: lock_env(settings),
        restore_only: settings.restore_only,
        userns: None,
        reconcile_also: rules::capture::other_mode(&settings.capture),
    };
    let force = settings.force_binary;
    let capture = settings.capture.clone();
    let outcome = in_target_netns(settings, move |userns| {
        let opts = SidecarOptions { userns, ..opts };
        let outcome = apply::apply_sidecar_here(&rules, &opts, force).map_err(|e| e.to_string())?;
        apply::routes::converge_sidecar_routes(&capture, outcome == apply::Outcome::Reconciled)
            .map_err(|e| e.to_string())?;
        Ok(outcome)
    })?;
    info!(%outcome, "iptables rules done");
    Ok(())
}
