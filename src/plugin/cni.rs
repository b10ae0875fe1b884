//! The CNI protocol surface: commands, the `CNI_*` environment, spec versions, and the error
//! object. Pure: the environment comes in through a lookup function.

use std::cmp::Ordering;

/// Spec versions this plugin speaks, oldest first (the `VERSION` reply lists them in this order).
pub const SUPPORTED_VERSIONS: [&str; 7] = [
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];
/// The newest supported version (reported by `VERSION`, used for results before conversion).
pub const CURRENT_VERSION: &str = "1.1.0";

/// Well-known CNI error codes (spec "Error" section).
pub mod code {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const UNKNOWN_CONTAINER: u32 = 3;
    pub const INVALID_ENV: u32 = 4;
    pub const IO_FAILURE: u32 = 5;
    pub const DECODING_FAILURE: u32 = 6;
    pub const INVALID_NETWORK_CONFIG: u32 = 7;
    pub const TRY_AGAIN_LATER: u32 = 11;
    pub const INVALID_NETNS: u32 = 12;
    pub const PLUGIN_NOT_AVAILABLE: u32 = 50;
    /// What Go's skel reports for plain errors.
    pub const INTERNAL: u32 = 999;
}

/// A CNI error, printed to stdout as the spec's error object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{msg}")]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    pub details: String,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>) -> CniError {
        CniError {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    pub fn internal(msg: impl Into<String>) -> CniError {
        CniError::new(code::INTERNAL, msg)
    }

    pub fn with_details(mut self, details: impl Into<String>) -> CniError {
        self.details = details.into();
        self
    }

    /// The error object; `details` is left out when empty, as Go's encoder does.
    pub fn to_json(&self, cni_version: &str) -> serde_json::Value {
        let mut obj = serde_json::Map::new();
        obj.insert("cniVersion".into(), cni_version.into());
        obj.insert("code".into(), self.code.into());
        obj.insert("msg".into(), self.msg.clone().into());
        if !self.details.is_empty() {
            obj.insert("details".into(), self.details.clone().into());
        }
        serde_json::Value::Object(obj)
    }
}

/// The CNI operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Version,
    Status,
    Gc,
}

/// The spec's name (`ADD`), for logs.
impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Version => "VERSION",
            Command::Status => "STATUS",
            Command::Gc => "GC",
        })
    }
}

impl Command {
    fn parse(name: &str) -> Option<Command> {
        Some(match name {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "VERSION" => Command::Version,
            "STATUS" => Command::Status,
            "GC" => Command::Gc,
            _ => return None,
        })
    }

    /// Whether `var` must be set for this command (as libcni's skel requires).
    fn requires(self, var: &str) -> bool {
        match var {
            "CNI_CONTAINERID" | "CNI_IFNAME" => {
                matches!(self, Command::Add | Command::Del | Command::Check)
            }
            "CNI_NETNS" => matches!(self, Command::Add | Command::Check),
            "CNI_PATH" => !matches!(self, Command::Version),
            _ => false,
        }
    }

    /// Whether the command carries a container (container id and interface are validated).
    pub fn has_container(self) -> bool {
        matches!(self, Command::Add | Command::Del | Command::Check)
    }
}

/// The `CNI_*` environment of one invocation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniEnv {
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    pub args: String,
    pub path: String,
    pub netns_override: String,
}

/// What the environment asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invocation {
    /// No `CNI_COMMAND`: print the about text to stderr and succeed.
    About,
    Run(Command, CniEnv),
}

/// Reads and checks the `CNI_*` variables: missing required ones are reported together, in the
/// order libcni lists them; an unknown command is an error.
pub fn read_env(get: impl Fn(&str) -> Option<String>) -> Result<Invocation, CniError> {
    let var = |name: &str| get(name).unwrap_or_default();
    let cmd_name = var("CNI_COMMAND");
    if cmd_name.is_empty() {
        return Ok(Invocation::About);
    }
    let cmd = Command::parse(&cmd_name);
    let env = CniEnv {
        container_id: var("CNI_CONTAINERID"),
        netns: var("CNI_NETNS"),
        ifname: var("CNI_IFNAME"),
        args: var("CNI_ARGS"),
        path: var("CNI_PATH"),
        netns_override: var("CNI_NETNS_OVERRIDE"),
    };
    if let Some(cmd) = cmd {
        let values = [
            ("CNI_CONTAINERID", &env.container_id),
            ("CNI_NETNS", &env.netns),
            ("CNI_IFNAME", &env.ifname),
            ("CNI_PATH", &env.path),
        ];
        let missing: Vec<&str> = values
            .iter()
            .filter(|(name, value)| value.is_empty() && cmd.requires(name))
            .map(|(name, _)| *name)
            .collect();
        if !missing.is_empty() {
            return Err(CniError::new(
                code::INVALID_ENV,
                format!("required env variables [{}] missing", missing.join(",")),
            ));
        }
        if cmd.has_container() {
            validate_container_id(&env.container_id)?;
            validate_ifname(&env.ifname)?;
        }
        Ok(Invocation::Run(cmd, env))
    } else {
        Err(CniError::new(
            code::INVALID_ENV,
            format!("unknown CNI_COMMAND: {cmd_name}"),
        ))
    }
}

/// Names that start with an alphanumeric and continue with alphanumerics, `_`, `.` or `-`.
fn is_plain_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

pub fn validate_container_id(id: &str) -> Result<(), CniError> {
    if id.is_empty() {
        return Err(CniError::new(
            code::UNKNOWN_CONTAINER,
            "missing containerID",
        ));
    }
    if !is_plain_name(id) {
        return Err(
            CniError::new(code::INVALID_ENV, "invalid characters in containerID")
                .with_details(id.to_string()),
        );
    }
    Ok(())
}

/// The kernel's interface-name rules.
pub fn validate_ifname(name: &str) -> Result<(), CniError> {
    let err = |msg: &str| CniError::new(code::INVALID_ENV, msg).with_details(name.to_string());
    if name.is_empty() {
        return Err(err("interface name is empty"));
    }
    if name.len() > 15 {
        return Err(err("interface name is too long"));
    }
    if name == "." || name == ".." {
        return Err(err("interface name is . or .."));
    }
    if name
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        return Err(err(
            "interface name contains / or : or whitespace characters",
        ));
    }
    Ok(())
}

pub fn validate_network_name(name: &str) -> Result<(), CniError> {
    if name.is_empty() {
        return Err(CniError::new(
            code::INVALID_NETWORK_CONFIG,
            "missing network name",
        ));
    }
    if !is_plain_name(name) {
        return Err(CniError::new(
            code::INVALID_NETWORK_CONFIG,
            "invalid characters found in network name",
        )
        .with_details(name.to_string()));
    }
    Ok(())
}

/// A parsed `major.minor.patch`.
fn parse_version(v: &str) -> Option<(u64, u64, u64)> {
    let mut parts = v.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    let patch = parts.next()?.parse().ok()?;
    parts.next().is_none().then_some((major, minor, patch))
}

/// Compares two spec versions; unparseable ones are a decoding error.
pub fn compare_versions(a: &str, b: &str) -> Result<Ordering, CniError> {
    let pa = parse_version(a).ok_or_else(|| bad_version(a))?;
    let pb = parse_version(b).ok_or_else(|| bad_version(b))?;
    Ok(pa.cmp(&pb))
}

fn bad_version(v: &str) -> CniError {
    CniError::new(
        code::DECODING_FAILURE,
        format!("unable to parse version {v:?}"),
    )
}

/// Checks that the config's version is one we speak.
pub fn check_supported(version: &str) -> Result<(), CniError> {
    if SUPPORTED_VERSIONS.contains(&version) {
        return Ok(());
    }
    let supported: Vec<String> = SUPPORTED_VERSIONS
        .iter()
        .map(|v| format!("{v:?}"))
        .collect();
    Err(
        CniError::new(code::INCOMPATIBLE_VERSION, "incompatible CNI versions").with_details(
            format!(
                "config is {version:?}, plugin supports [{}]",
                supported.join(" ")
            ),
        ),
    )
}

/// The `VERSION` reply.
pub fn version_reply() -> serde_json::Value {
    serde_json::json!({
        "cniVersion": CURRENT_VERSION,
        "supportedVersions": SUPPORTED_VERSIONS,
    })
}

/// The about text printed to stderr when run without `CNI_COMMAND`.
pub fn about_text() -> String {
    format!(
        "CNI plugin istio-cni {}\nCNI protocol versions supported: {}\n",
        crate::VERSION,
        SUPPORTED_VERSIONS.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn no_command_is_about() {
        assert_eq!(read_env(env(&[])).unwrap(), Invocation::About);
    }

    #[test]
    fn add_lists_every_missing_variable() {
        let err = read_env(env(&[("CNI_COMMAND", "ADD")])).unwrap_err();
        assert_eq!(err.code, code::INVALID_ENV);
        assert_eq!(
            err.msg,
            "required env variables [CNI_CONTAINERID,CNI_NETNS,CNI_IFNAME,CNI_PATH] missing"
        );
    }

    #[test]
    fn del_does_not_need_netns_and_status_needs_only_path() {
        let del = read_env(env(&[
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "abc"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/opt/cni/bin"),
        ]));
        assert!(matches!(del, Ok(Invocation::Run(Command::Del, _))));
        let status = read_env(env(&[("CNI_COMMAND", "STATUS"), ("CNI_PATH", "/x")]));
        assert!(matches!(status, Ok(Invocation::Run(Command::Status, _))));
        let gc = read_env(env(&[("CNI_COMMAND", "GC")])).unwrap_err();
        assert_eq!(gc.msg, "required env variables [CNI_PATH] missing");
        assert!(matches!(
            read_env(env(&[("CNI_COMMAND", "VERSION")])),
            Ok(Invocation::Run(Command::Version, _))
        ));
    }

    #[test]
    fn unknown_command() {
        let err = read_env(env(&[("CNI_COMMAND", "FROB")])).unwrap_err();
        assert_eq!(err.code, code::INVALID_ENV);
        assert!(err.msg.contains("FROB"));
    }

    #[test]
    fn container_and_interface_rules() {
        assert!(validate_container_id("a-b_c.1").is_ok());
        assert_eq!(
            validate_container_id("").unwrap_err().code,
            code::UNKNOWN_CONTAINER
        );
        assert_eq!(
            validate_container_id("-x").unwrap_err().code,
            code::INVALID_ENV
        );
        assert!(validate_ifname("eth0").is_ok());
        assert!(validate_ifname("0123456789abcdef").is_err());
        assert!(validate_ifname("..").is_err());
        assert!(validate_ifname("a b").is_err());
        assert!(validate_ifname("a:b").is_err());
    }

    #[test]
    fn versions() {
        assert!(check_supported("0.3.1").is_ok());
        let err = check_supported("9.9.9").unwrap_err();
        assert_eq!(err.code, code::INCOMPATIBLE_VERSION);
        assert!(err.details.contains("\"9.9.9\""), "{}", err.details);
        assert_eq!(compare_versions("0.4.0", "1.0.0").unwrap(), Ordering::Less);
        assert_eq!(compare_versions("1.1.0", "1.1.0").unwrap(), Ordering::Equal);
        assert!(compare_versions("1.x", "1.0.0").is_err());
    }

    #[test]
    fn error_json_omits_empty_details() {
        let json = CniError::internal("boom").to_json("1.0.0");
        assert_eq!(
            json,
            serde_json::json!({"cniVersion": "1.0.0", "code": 999, "msg": "boom"})
        );
    }
}
