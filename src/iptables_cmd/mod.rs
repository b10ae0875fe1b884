//! The `istio-iptables` role: flags/env -> [`values::Settings`] -> host facts (proxy UID, IPv6, DNS
//! servers) -> capture config -> rule model -> dry-run transcript (printed here) or apply/cleanup
//! through the shared entry [`crate::apply::pod`] (as the plugin does) -> optional validation.
//! `istio-iptables ambient --dry-run` ([`ambient`]) prints what the ambient node agent programs.
//! May call: `cli`, `rules`, `apply`, `netns`, `netlink`.

pub mod ambient;
pub mod ambient_flags;
pub mod error;
pub mod flags;
pub mod host;
pub mod resolve;
pub mod validation;
pub mod values;

use std::collections::HashSet;
use std::path::Path;

use argh::FromArgs;
use tracing::{error, info, warn};

use crate::apply;
use crate::apply::pod::{Backend, PodOptions, WhichNetns};
use crate::cli::{Env, ProcessEnv, normalise_args};
use crate::netns::Netns;
use crate::rules::{self, RuleSet};
use flags::{Flags, SHAPES};
use values::Settings;

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
    if args.get(1).map(String::as_str) == Some("ambient") {
        return ambient::main(&args[2..], &ProcessEnv);
    }
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
    if let Err(e) = init_logging(&flags.log_target, flags.log_as_json, &ProcessEnv) {
        eprintln!("istio-iptables: --log_target: {e}");
        return EXIT_FAILURE;
    }
    run(&flags, &ProcessEnv, &normalised.explicit_false)
}

/// The scope of this role's log records (Istio's istio-iptables logs under its own scope too).
const LOG_SCOPE: &str = "iptables";

/// Logs in the shared Istio format (text or, with --log_as_json, JSON lines) to each
/// --log_target (stdout, stderr or a file; default stderr, so that a dry run's stdout carries only
/// the transcript). ISTIO_IPTABLES_LOG sets the filter; one it cannot parse means its default.
fn init_logging(
    targets: &[String],
    json: bool,
    env: &dyn Env,
) -> Result<(), crate::telemetry::logging::LogError> {
    let filter = tracing_subscriber::EnvFilter::try_new(log_filter(env))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_log_filter()));
    let writer = crate::telemetry::logging::targets_writer(targets)?;
    let _ = tracing_subscriber::fmt()
        .event_format(crate::telemetry::logging::IstioFormat {
            json,
            scope: LOG_SCOPE,
        })
        .with_writer(writer)
        .with_env_filter(filter)
        .try_init();
    Ok(())
}

/// The log filter: `ISTIO_IPTABLES_LOG` as declared, read before the other settings so that
/// their errors are logged.
fn log_filter(env: &dyn Env) -> String {
    resolve::lookup(env, None)
        .raw(&flags::decl::istio_iptables_log, None)
        .map_or_else(default_log_filter, |raw| raw.value)
}

fn default_log_filter() -> String {
    flags::decl::istio_iptables_log
        .default
        .unwrap_or_default()
        .to_string()
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
        resolve::check_capture(flags, env, &settings.capture)
            .map(|_| ip)
            .map_err(error::CommandError::from)
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
            (true, true) => emit_dry_run(&settings, nft_transaction(&settings)),
            (_, false) if settings.cleanup_only => cleanup(&settings),
            (_, false) => apply_rules(&settings),
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

/// Opens `--network-namespace` in CNI mode (the rules go there); `None`: right here.
fn open_target(settings: &Settings) -> Result<Option<Netns>, String> {
    match (&settings.network_namespace, settings.cni_mode) {
        (Some(ns), true) => Netns::open(Path::new(ns))
            .map(Some)
            .map_err(|e| e.to_string()),
        _ => Ok(None),
    }
}

fn target(netns: &Option<Netns>) -> WhichNetns<'_> {
    netns.as_ref().map_or(WhichNetns::Here, WhichNetns::Pod)
}

/// The shared entry's backend for these settings.
fn backend(settings: &Settings) -> Backend {
    apply::backend::decide(&apply::backend::BackendRequest {
        native_nftables: settings.native_nftables,
        restore_only: settings.restore_only,
        force_binary: settings.force_binary,
    })
    .backend
}

/// `--cleanup-only --dry-run`: the plan the real cleanup would run now (its saves are read, as
/// the real run does; a failing save counts as empty, like Istio's dry-run stub).
fn cleanup_dry_run(settings: &Settings) -> Result<(), String> {
    let [rules, other] = apply::pod::cleanup_rules(&settings.capture);
    let ipv6 = settings.capture.enable_ipv6;
    let force = settings.force_binary;
    let stateless = rules.clone();
    let plan = open_target(settings)
        .and_then(|netns| {
            apply::pod::in_target(target(&netns), move |userns| {
                let input = apply::CleanupInput {
                    v4: &rules.v4,
                    v6: &rules.v6,
                    ipv6_enabled: ipv6,
                    also: [&other.v4, &other.v6],
                };
                apply::cleanup_plan_here(&input, &[], force, userns.as_ref())
            })
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
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
/// into them, in every family that has any; or our nftables tables) and its TPROXY routes and
/// `::6/128` on lo.
fn cleanup(settings: &Settings) -> Result<(), String> {
    let netns = open_target(settings)?;
    let outcome = apply::pod::cleanup(
        target(&netns),
        &settings.capture,
        backend(settings),
        settings.force_binary,
    )
    .map_err(|e| e.to_string())?;
    match settings.native_nftables {
        true => info!("nftables rules done"),
        false => info!(%outcome, "iptables rules done"),
    }
    Ok(())
}

/// Applies the capture (or, with nftables, replaces our tables) and converges the routes.
fn apply_rules(settings: &Settings) -> Result<(), String> {
    let netns = open_target(settings)?;
    let opts = PodOptions {
        backend: backend(settings),
        reconcile: settings.reconcile,
        force_apply: settings.force_apply,
        force_binary: settings.force_binary,
        ..PodOptions::default()
    };
    let done =
        apply::pod::program(target(&netns), &settings.capture, &opts).map_err(|e| e.to_string())?;
    match settings.native_nftables {
        true => info!("nftables rules done"),
        false => info!(outcome = %done.outcome, "iptables rules done"),
    }
    Ok(())
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
    if settings.cleanup_only {
        apply::pod::nft_cleanup_transaction().render()
    } else {
        apply::pod::nft_transaction(&settings.capture).render()
    }
}
