//! Why a rule-tool command cannot go on: a bad setting ([`SettingError`], naming the flag or
//! variable and the value), or a fact of the host or of the flags given together. The messages
//! are the command's error output.

use super::values::SettingError;

#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error(transparent)]
    Setting(#[from] SettingError),
    #[error("no valid local IP address found")]
    NoHostAddress,
    #[error("cannot read /etc/resolv.conf for DNS capture: {0}")]
    ResolvConf(#[source] std::io::Error),
    #[error(
        "ambient: only --dry-run is supported (the node agent in install-cni programs pods and the host)"
    )]
    AmbientNeedsDryRun,
    #[error(
        "{flag} is about the in-pod rules and means nothing with --host (the host rules only SNAT kubelet probes)"
    )]
    PodFlagWithHost { flag: &'static str },
    #[error(
        "{flag} is only used by the nftables host rule: give it with --host --native-nftables (or NATIVE_NFTABLES=true)"
    )]
    HostNftFlagWithoutHostNft { flag: &'static str },
}
