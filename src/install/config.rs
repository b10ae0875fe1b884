//! Pure configuration parsing for `install-cni`: flags (argh, after the pflag normaliser) and env
//! fallbacks, resolved as flag > env > default, exactly under Istio's names. The environment comes
//! in through the `cli::Env` seam so tests never touch the process environment.
//!
//! Files, each importing only those listed before it (no circle; the room test holds it):
//! `sections` (types only: the resolved config and its sections, the `status` request, the values
//! given their safe reading, the error), `raw` (one setting's raw value, named for errors, and the
//! Go readings every parser shares), `lenient` (the safe reading of values Istio reads more
//! loosely), `checks` (values that parse but can never work, refused), `values` (how each kind of
//! value is read), `flags` (every setting declared once: flag, env, default, parser, doc; the argh
//! flags and typed values come from it), `resolve` (the typed values into the sections, with
//! cross-checks and warnings), `status` (`install-cni status`'s own flags); `docs_tests`
//! (docs/configuration.md's generated table).

use argh::FromArgs;

mod checks;
#[cfg(test)]
mod checks_tests;
#[cfg(test)]
mod docs_tests;
mod flags;
mod lenient;
mod raw;
mod resolve;
mod sections;
mod status;
#[cfg(test)]
mod tests;
mod values;

pub use checks::{PROC_SUPER_MAGIC, procfs};
pub use flags::{DEFAULT_OWNED_FILENAME, Flags, decl};
pub use resolve::from_flags;
pub use sections::*;
pub use values::{SelectorsError, parse_selectors};

/// Parses `args` (the full argv, program name first) with `env` as the environment.
pub fn parse(args: &[String], env: &dyn crate::cli::Env) -> Result<Parsed, ConfigError> {
    // `status` is a command of its own, with its own flags and help.
    if args.get(1).is_some_and(|a| a == "status") {
        return status::parse_status(args.get(2..).unwrap_or(&[]), env);
    }
    let bool_flags = crate::cli::settings::bool_flags(decl::ALL);
    let bool_flags: Vec<&str> = bool_flags.iter().map(String::as_str).collect();
    let shapes = crate::cli::FlagShapes {
        switches: &["version"],
        shorts: &[],
        underscore_longs: &[],
        all_underscores: true,
        bool_options: &bool_flags,
        repeatable: &[],
        positionals: true,
    };
    let rest = crate::cli::normalise_args(args.get(1..).unwrap_or(&[]), &shapes)
        .map_err(|e| ConfigError::Args(e.to_string()))?
        .args;
    let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
    let flags = match Flags::from_args(&["install-cni"], &rest) {
        Ok(f) => f,
        Err(early) => {
            return Ok(Parsed::Exit {
                text: early.output,
                code: if early.status.is_ok() { 0 } else { 2 },
            });
        }
    };
    if flags.version || flags.command.first().is_some_and(|c| c == "version") {
        return Ok(Parsed::Exit {
            text: format!("install-cni (istio-cni-rs) {}\n", crate::VERSION),
            code: 0,
        });
    }
    if let Some(cmd) = flags.command.first() {
        return Err(ConfigError::Args(match cmd.as_str() {
            "status" => "`status` must be the first argument: install-cni status [--json] \
                         [--health-port N] (see install-cni status --help)"
                .to_string(),
            _ => format!("unknown command {cmd:?} (`version`, or `status` first)"),
        }));
    }
    from_flags(&flags, env).map(|c| Parsed::Run(Box::new(c)))
}
