//! The iptables binaries (flavour detection as Istio does it), the errors of an apply, and the
//! commands every apply path is made of. The apply itself is in [`super::sidecar`], cleanup in
//! [`super::cleanup`].

use std::path::{Path, PathBuf};

use super::exec::{Cmd, CmdOutput, Executor, SpawnError};
use crate::netns::UsernsEntry;
use crate::rules::{Family, RuleSet};

/// Which iptables flavour to use when more than one is installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForceBinary {
    Legacy,
    Nft,
}

/// The resolved binaries of one family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binaries {
    pub family: Family,
    pub iptables: String,
    pub save: String,
    pub restore: String,
    /// Legacy iptables takes the xtables lock; nft does not need it.
    pub legacy: bool,
}

impl Binaries {
    /// The plain, unflavoured names (`iptables`, `iptables-save`, ...) of a family, for tests that
    /// record commands instead of running them.
    #[cfg(test)]
    pub(super) fn plain(family: Family) -> Binaries {
        let prefix = family_prefix(family);
        Binaries {
            family,
            iptables: prefix.to_string(),
            save: format!("{prefix}-save"),
            restore: format!("{prefix}-restore"),
            legacy: false,
        }
    }

    /// Whether these are the `*-nft` binaries (the ones whose kernel encoding
    /// [`crate::rules::iptables_nft`] reproduces).
    pub fn is_nft_flavour(&self) -> bool {
        !self.legacy
            && Path::new(&self.restore)
                .file_name()
                .is_some_and(|n| n.to_string_lossy().ends_with("-nft-restore"))
    }

    /// Extra arguments for write commands (legacy only: wait for the xtables lock).
    pub(super) fn lock_args(&self) -> Vec<String> {
        if self.legacy {
            vec!["--wait=30".to_string()]
        } else {
            vec![]
        }
    }
}

/// Errors of the apply step. Each names the command and what it said.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("{0}")]
    Spawn(#[from] SpawnError),
    #[error("no usable {family} binary: {reason} (install the iptables package)")]
    NoBinary {
        family: &'static str,
        reason: String,
    },
    #[error("{command} failed ({}): {stderr}", exit_text(*code))]
    Failed {
        command: String,
        code: Option<i32>,
        stderr: String,
    },
    #[error(
        "existing ISTIO rules in this network namespace differ from the requested ones ({family}); \
         rerun with --reconcile to replace them"
    )]
    Drift { family: &'static str },
    #[error(
        "cleanup left chains of ours in {family} (see the commands logged at debug level with \
         ISTIO_IPTABLES_LOG=debug)"
    )]
    CleanupIncomplete { family: String },
    #[error("cannot {what} over netlink: {source}")]
    Netlink {
        what: String,
        #[source]
        source: crate::netlink::nft_batch::BatchError,
    },
    #[error("cannot encode the nftables transaction: {0}")]
    NftEncode(String),
    #[error("{cause}; undoing the partial apply also failed: {rollback}")]
    RollbackFailed {
        cause: Box<ApplyError>,
        rollback: Box<ApplyError>,
    },
}

/// Why the nf_tables netlink path did not apply a rule set. Nothing changed either way; the
/// caller decides by kind: a rule set outside the encoding is expected (fall back quietly), a
/// transaction that failed is worth saying.
#[derive(Debug, thiserror::Error)]
pub enum NftNetlinkError {
    #[error("{} rules: {source}", family_prefix(*family))]
    Encode {
        family: Family,
        #[source]
        source: crate::rules::iptables_nft::EncodeError,
    },
    #[error("nf_tables transaction: {0}")]
    Transaction(#[source] crate::netlink::nft_batch::BatchError),
}

impl NftNetlinkError {
    /// The rules are not covered by the netlink encoding (nothing was sent).
    pub fn is_not_encodable(&self) -> bool {
        matches!(self, NftNetlinkError::Encode { .. })
    }
}

pub(super) fn family_prefix(family: Family) -> &'static str {
    match family {
        Family::V4 => "iptables",
        Family::V6 => "ip6tables",
    }
}

/// Finds `name` on $PATH. A hit is remembered for the process (per $PATH value and name) and
/// checked again with one `stat` before it is used: the agent asks on every pod it programs,
/// and walking $PATH each time was a dozen `stat`s per ADD. A miss is not remembered (a tool
/// installed later is found).
pub fn find_on_path(name: &str) -> Option<PathBuf> {
    static FOUND: std::sync::LazyLock<
        parking_lot::Mutex<std::collections::HashMap<(std::ffi::OsString, String), PathBuf>>,
    > = std::sync::LazyLock::new(Default::default);
    let path = std::env::var_os("PATH")
        .unwrap_or_else(|| "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    let key = (path, name.to_string());
    if let Some(hit) = FOUND.lock().get(&key).filter(|p| is_executable(p)) {
        return Some(hit.clone());
    }
    let found = std::env::split_paths(&key.0)
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))?;
    FOUND.lock().insert(key, found.clone());
    Some(found)
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Whether legacy xtables already has tables in the current thread's network namespace. This is
/// what Istio learns by running `iptables-legacy-save` (it prints exactly these tables), read here
/// from procfs without starting a process.
pub fn legacy_has_tables(family: Family) -> bool {
    let file = match family {
        Family::V4 => "/proc/thread-self/net/ip_tables_names",
        Family::V6 => "/proc/thread-self/net/ip6_tables_names",
    };
    std::fs::read_to_string(file)
        .map(|s| !s.trim().is_empty())
        .unwrap_or(false)
}

/// Resolves the binaries for a family as Istio does: forced flavour if asked; else legacy when it
/// already holds rules here, else nft, else the plain name.
pub fn detect(family: Family, force: Option<ForceBinary>) -> Result<Binaries, ApplyError> {
    let prefix = family_prefix(family);
    // Absolute paths, resolved once (only for the flavour considered): each later spawn then skips
    // the $PATH walk. None when the flavour is not installed.
    let make = |suffix: &str, legacy: bool| -> Option<Binaries> {
        let iptables = find_on_path(&format!("{prefix}{suffix}"))?;
        // The -save and -restore of a flavour are installed beside it: looked for there first
        // (one stat each instead of a $PATH walk, paid by every plugin exec), else on $PATH.
        let beside = |tail: &str| {
            let name = format!("{prefix}{suffix}{tail}");
            iptables
                .parent()
                .map(|dir| dir.join(&name))
                .filter(|p| is_executable(p))
                .or_else(|| find_on_path(&name))
                .map(|p| p.to_string_lossy().into_owned())
        };
        Some(Binaries {
            family,
            save: beside("-save")?,
            restore: beside("-restore")?,
            iptables: iptables.to_string_lossy().into_owned(),
            legacy,
        })
    };
    let missing = |suffix: &str| ApplyError::NoBinary {
        family: prefix,
        reason: format!(
            "{prefix}{suffix}, {prefix}{suffix}-save or {prefix}{suffix}-restore not found on PATH"
        ),
    };
    match force {
        Some(ForceBinary::Legacy) => {
            return make("-legacy", true).ok_or_else(|| missing("-legacy"));
        }
        Some(ForceBinary::Nft) => return make("-nft", false).ok_or_else(|| missing("-nft")),
        None => {}
    }
    if legacy_has_tables(family)
        && let Some(legacy) = make("-legacy", true)
    {
        return Ok(legacy);
    }
    if let Some(nft) = make("-nft", false) {
        return Ok(nft);
    }
    let plain = make("", false).ok_or_else(|| ApplyError::NoBinary {
        family: prefix,
        reason: format!("none of {prefix}-legacy, {prefix}-nft, {prefix} found on PATH"),
    })?;
    // Unknown flavour: ask it, so legacy still gets the lock flag.
    let version = std::process::Command::new(&plain.iptables)
        .arg("--version")
        .output();
    let is_nft = version
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("nf_tables"))
        .unwrap_or(false);
    Ok(Binaries {
        legacy: !is_nft,
        ..plain
    })
}

/// [`apply_nft_netlink_entering`] from the calling thread's netns, without a user namespace.
#[cfg(any(test, feature = "test-hooks"))]
pub fn apply_nft_netlink(rules: &RuleSet) -> Result<(), NftNetlinkError> {
    apply_nft_netlink_entering(rules, None)
}

/// Applies `rules` by sending the nf_tables messages `iptables-nft-restore --noflush` would send
/// ([`crate::rules::iptables_nft`]), both families in one transaction, from the calling thread's
/// netns; with a [`UsernsEntry`] from a forked child inside the user namespace owning the netns
/// (what `-m owner` matches need there). Err when the rules are not covered by that encoding or
/// the kernel refused them; either way nothing has changed, and the caller runs iptables-restore
/// instead.
pub fn apply_nft_netlink_entering(
    rules: &RuleSet,
    userns: Option<&UsernsEntry>,
) -> Result<(), NftNetlinkError> {
    use crate::rules::iptables_nft::encode;
    let mut messages = Vec::new();
    for family in Family::ALL {
        let encoded = encode(family, rules.family(family))
            .map_err(|source| NftNetlinkError::Encode { family, source })?;
        messages.extend(encoded);
    }
    send_nft_messages(messages, userns).map_err(NftNetlinkError::Transaction)
}

/// Sends `messages` as one nf_tables transaction (the families they name, together) from the
/// calling thread's netns, or with a [`UsernsEntry`] from a forked child inside the user
/// namespace owning it. The kernel applies all of it or nothing.
pub(super) fn send_nft_messages(
    messages: Vec<crate::rules::iptables_nft::NftMessage>,
    userns: Option<&UsernsEntry>,
) -> Result<(), crate::netlink::nft_batch::BatchError> {
    use crate::netlink::nft_batch::Transaction;
    // The rule engine describes the messages; the netlink transport frames them.
    let mut transaction = Transaction::new();
    for m in messages {
        transaction.push(m.kind, m.flags, nf_family(m.family), &m.attrs, m.what)?;
    }
    match userns {
        Some(entry) => transaction.send_entering(entry),
        None => transaction.send(),
    }
}

/// "exit 2", or "killed by a signal" when there is no exit code.
fn exit_text(code: Option<i32>) -> String {
    code.map_or_else(|| "killed by a signal".to_string(), |c| format!("exit {c}"))
}

pub(super) fn run_checked(exec: &mut dyn Executor, cmd: &Cmd) -> Result<CmdOutput, ApplyError> {
    let out = exec.run(cmd)?;
    if out.success {
        Ok(out)
    } else {
        Err(ApplyError::Failed {
            command: cmd.display(),
            code: out.code,
            stderr: out.stderr.trim().to_string(),
        })
    }
}

pub(super) fn with_env(mut cmd: Cmd, env: &[(String, String)]) -> Cmd {
    cmd.env.extend(env.iter().cloned());
    cmd
}

/// `*-restore --noflush` (our rules on top of whatever is there) with `text` on stdin.
pub(super) fn restore_cmd(bins: &Binaries, text: String, env: &[(String, String)]) -> Cmd {
    let mut args = vec!["--noflush".to_string()];
    args.extend(bins.lock_args());
    with_env(Cmd::new(&bins.restore, args).with_stdin(text), env)
}

/// `*-restore` without `--noflush`: each table in `text` is replaced by its content there.
pub(super) fn replace_tables_cmd(bins: &Binaries, text: String, env: &[(String, String)]) -> Cmd {
    with_env(
        Cmd::new(&bins.restore, bins.lock_args()).with_stdin(text),
        env,
    )
}

/// `*-save`.
pub(super) fn save_cmd(bins: &Binaries, env: &[(String, String)]) -> Cmd {
    with_env(Cmd::new(&bins.save, Vec::<String>::new()), env)
}

/// Deletes nf_tables tables an undone apply had created (iptables-nft only: legacy tables cannot
/// be unloaded). Best effort: a table someone filled in the meantime stays.
pub(super) fn drop_created_tables(bins: &Binaries, tables: Vec<String>) {
    if !bins.is_nft_flavour() {
        return;
    }
    for table in tables {
        if let Err(e) = crate::netlink::nft_batch::delete_table(nf_family(bins.family), &table) {
            tracing::debug!(%table, error = %e, "created table not deleted");
        }
    }
}

pub(super) fn nf_family(family: Family) -> u8 {
    match family {
        Family::V4 => libc::AF_INET as u8,
        Family::V6 => libc::AF_INET6 as u8,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::iptables_nft::EncodeError;
    use crate::rules::model::RuleSetBuilder;
    use crate::rules::{Table, Target};

    #[test]
    fn rules_outside_the_netlink_encoding_fail_by_kind_before_anything_is_sent() {
        // IPv4 is covered; the IPv6 mangle rule is not, so nothing at all is sent.
        let mut b = RuleSetBuilder::new(true);
        b.append_to(
            Family::V4,
            Table::Nat,
            "ISTIO_OUTPUT",
            vec![],
            Target::Return,
        );
        b.append_to(
            Family::V6,
            Table::Mangle,
            "ISTIO_DIVERT",
            vec![],
            Target::SetMark("0x539/0xffffffff".into()),
        );
        let err = apply_nft_netlink(&b.build()).expect_err("MARK has no encoding");
        assert!(err.is_not_encodable(), "{err}");
        assert!(
            matches!(
                err,
                NftNetlinkError::Encode {
                    family: Family::V6,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().starts_with("ip6tables rules: "), "{err}");
        let source = std::error::Error::source(&err).expect("cause kept");
        assert!(
            matches!(
                source.downcast_ref::<EncodeError>(),
                Some(EncodeError::Unsupported(_))
            ),
            "{source}"
        );
    }
}
