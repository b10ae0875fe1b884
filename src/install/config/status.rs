//! `install-cni status`: its own flags (argh, through the shared normaliser) and where the agent's
//! health port is, read through install-cni's own declaration of the setting (`--health-port` >
//! env `HEALTH_PORT` > its declared default) that the running install-cni bound it from.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use argh::FromArgs;

use super::flags::decl;
use super::raw::{Raw, invalid};
use super::sections::{ConfigError, Parsed, StatusRequest};
use super::values::port;
use crate::cli::Env;

/// install-cni status: asks the running node agent (GET /debug/pods on its health port) for this
/// node's pods and prints one row each: mode, enrolled or not and why, netns, IPs, the drift
/// pass's last verification, the last ZDS request and ztunnel's answer. Exits 1 when the agent
/// is not running or not reachable or a flag's value is bad, 2 on an unknown flag.
#[derive(FromArgs, Debug, Default)]
pub struct StatusFlags {
    /// print the agent's /debug/pods answer as JSON (docs/troubleshooting.md) instead of a table
    #[argh(switch)]
    pub json: bool,
    /// the agent's health port; default install-cni's own setting: its env HEALTH_PORT, else its
    /// default (install-cni --help)
    #[argh(option)]
    pub health_port: Option<String>,
    /// address the health server is reached at; default 127.0.0.1
    #[argh(option)]
    pub address: Option<String>,
    /// how long to wait for the answer (a Go duration); default 3s
    #[argh(option)]
    pub timeout: Option<String>,
}

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3);

/// Parses `install-cni status ...` (`args` after `status`).
pub fn parse_status(args: &[String], env: &dyn Env) -> Result<Parsed, ConfigError> {
    let shapes = crate::cli::FlagShapes::switches_only(&["json"]);
    let rest = crate::cli::normalise_args(args, &shapes)
        .map_err(|e| ConfigError::Args(e.to_string()))?
        .args;
    let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
    let flags = match StatusFlags::from_args(&["install-cni status"], &rest) {
        Ok(f) => f,
        Err(early) => {
            return Ok(Parsed::Exit {
                text: early.output,
                code: if early.status.is_ok() { 0 } else { 2 },
            });
        }
    };
    resolve(&flags, env).map(Parsed::Status)
}

fn resolve(f: &StatusFlags, env: &dyn Env) -> Result<StatusRequest, ConfigError> {
    // install-cni's own HEALTH_PORT setting (its env var and default), under this command's flag.
    let raw = super::resolve::lookup(env)
        .raw_or_default(&decl::health_port, f.health_port.as_ref())
        .expect("HEALTH_PORT has a default");
    // One range in the check and its message: 0 is a valid HEALTH_PORT for install-cni (any
    // free port) but names no port to ask.
    let health_port = port(&raw).ok().filter(|p| *p != 0).ok_or_else(|| {
        invalid(
            &raw,
            "expected the agent's port number, 1-65535 (with HEALTH_PORT=0 it bound a free port: \
             pass the one its \"health server listening\" log line names)",
        )
    })?;
    let ip = match &f.address {
        Some(a) => a.parse::<IpAddr>().map_err(|e| {
            invalid(
                &Raw {
                    name: "--address".into(),
                    value: a.clone(),
                },
                format!("expected an IP address: {e}"),
            )
        })?,
        None => IpAddr::V4(Ipv4Addr::LOCALHOST),
    };
    let timeout = match &f.timeout {
        Some(t) => crate::cli::parse_go_duration(t)
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                invalid(
                    &Raw {
                        name: "--timeout".into(),
                        value: t.clone(),
                    },
                    "expected a positive Go duration (e.g. 3s)",
                )
            })?,
        None => DEFAULT_TIMEOUT,
    };
    Ok(StatusRequest {
        address: SocketAddr::new(ip, health_port),
        json: f.json,
        timeout,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str], env: &[(&str, &str)]) -> Result<Parsed, ConfigError> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let env: std::collections::HashMap<String, String> = env.into_iter().collect();
        parse_status(&args, &env)
    }

    fn request(args: &[&str], env: &[(&str, &str)]) -> StatusRequest {
        match run(args, env) {
            Ok(Parsed::Status(r)) => r,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_port_is_install_cnis_setting() {
        let r = request(&[], &[]);
        assert_eq!(r.address, "127.0.0.1:8000".parse().unwrap());
        assert!(!r.json);
        assert_eq!(r.timeout, DEFAULT_TIMEOUT);
        let r = request(&[], &[("HEALTH_PORT", "9001")]);
        assert_eq!(r.address.port(), 9001);
        let r = request(
            &[
                "--json",
                "--health_port=9002",
                "--address",
                "::1",
                "--timeout",
                "500ms",
            ],
            &[("HEALTH_PORT", "9001")],
        );
        assert_eq!(r.address, "[::1]:9002".parse().unwrap());
        assert!(r.json);
        assert_eq!(r.timeout, Duration::from_millis(500));
    }

    #[test]
    fn bad_values_name_the_setting() {
        let text = |args: &[&str], env: &[(&str, &str)]| match run(args, env) {
            Err(e) => e.to_string(),
            other => panic!("{other:?}"),
        };
        assert!(text(&[], &[("HEALTH_PORT", "0")]).contains("env HEALTH_PORT"));
        assert!(text(&[], &[("HEALTH_PORT", "x")]).contains("\"x\""));
        assert!(text(&["--address", "localhost"], &[]).contains("--address"));
        assert!(text(&["--timeout", "0s"], &[]).contains("--timeout"));
        assert!(text(&["extra"], &[]).contains("extra"));
    }

    #[test]
    fn help_describes_status() {
        match run(&["--help"], &[]) {
            Ok(Parsed::Exit { text, code: 0 }) => {
                assert!(text.contains("install-cni status"), "{text}");
                assert!(
                    text.contains("--json") && text.contains("HEALTH_PORT"),
                    "{text}"
                );
            }
            other => panic!("{other:?}"),
        }
    }
}
