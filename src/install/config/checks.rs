//! Settings that parse but can never work, refused before anything is touched.
//! Each check takes one raw value (named by its flag or env var) and returns the typed value or a
//! [`ConfigError::Invalid`] naming the setting, the value and why. Pure: the one check that needs
//! the host (`HOST_PROC_DIR` is a procfs) is split into [`procfs`] (pure, on the filesystem type)
//! and `install::check_host_proc` (the statfs).

use std::net::IpAddr;
use std::path::PathBuf;

use super::raw::{Raw, invalid, parse_go_int, split_list};
use super::sections::ConfigError;
use crate::kube::names::{self, NameRule};

/// Longest Unix socket path the kernel takes (`sun_path` is 108 bytes with its NUL).
pub(super) const SOCKET_PATH_MAX: usize = 107;
/// The longest socket path below the run dir (`podfacts/pod.sock`, `pluginevent.sock`,
/// `log.sock`): the run dir must leave room for it.
pub(super) const LONGEST_RUN_DIR_SOCKET: &str = "/podfacts/pod.sock";
/// `PROC_SUPER_MAGIC` (linux/magic.h), the `f_type` statfs reports for a procfs.
pub const PROC_SUPER_MAGIC: u64 = 0x9fa0;
/// File name endings the CNI library loads from the conf dir (libcni `ConfFiles`).
const CNI_CONF_EXTENSIONS: &[&str] = &[".conf", ".conflist", ".json"];

/// A path setting, made absolute: the installer, the plugin and the host all read these paths,
/// and a relative one would resolve against whichever working directory each process has. A
/// relative one is taken from `/` (reported by `lenient`); an empty one has no meaning.
pub(super) fn absolute_path(raw: &Raw) -> Result<PathBuf, ConfigError> {
    super::lenient::rooted(&raw.value).ok_or_else(|| invalid(raw, "must be a path"))
}

/// A path that is (or holds, with `suffix`) a Unix socket: absolute, and short enough to bind.
pub(super) fn socket_path(raw: &Raw, suffix: &str) -> Result<PathBuf, ConfigError> {
    let path = absolute_path(raw)?;
    let len = path.as_os_str().len() + suffix.len();
    if len > SOCKET_PATH_MAX {
        return Err(invalid(
            raw,
            format!(
                "too long for a Unix socket path: {len} bytes{} (at most {SOCKET_PATH_MAX})",
                if suffix.is_empty() {
                    String::new()
                } else {
                    format!(" with {suffix:?}")
                }
            ),
        ));
    }
    Ok(path)
}

/// The name of a CNI config we write for the container runtime to load (`.conf`, `.conflist`,
/// `.json`; the owned conflist). Not applied to `CNI_CONF_NAME`, which names an existing file.
pub(super) fn cni_conf_file_name(raw: &Raw, name: &str) -> Result<(), ConfigError> {
    if CNI_CONF_EXTENSIONS.iter().any(|ext| name.ends_with(ext)) {
        return Ok(());
    }
    Err(invalid(
        raw,
        "the container runtime loads only .conf, .conflist and .json files",
    ))
}

/// `KUBECONFIG_MODE`: the plugin kubeconfig holds the service-account token, so no bit for
/// "others" (readable or writable by any local user) and no setuid/setgid/sticky bit: a mode with
/// them is applied without them (reported by `lenient`).
pub(super) fn kubeconfig_mode(raw: &Raw) -> Result<u32, ConfigError> {
    match parse_go_int(&raw.value) {
        Some(m) if (0..=0o7777).contains(&m) => Ok(super::lenient::safe_mode(m as u32)),
        _ => Err(invalid(
            raw,
            "expected a file mode such as 0600 (octal) or 384",
        )),
    }
}

/// `REPAIR_INIT_CONTAINER_EXIT_CODE`: a process exit status is 0-255 (0 = any).
pub(super) fn exit_code(raw: &Raw) -> Result<i32, ConfigError> {
    match parse_go_int(&raw.value) {
        Some(c) if (0..=255).contains(&c) => Ok(c as i32),
        _ => Err(invalid(raw, "expected an exit code 0-255 (0 matches any)")),
    }
}

/// A probe SNAT source address: of the family its setting is for, and one a packet can come
/// from. Unspecified (`0.0.0.0`, `::`), loopback (dropped as martian when routed to a pod),
/// multicast, broadcast and IPv4-mapped IPv6 addresses can never be a probe's source.
pub(super) fn probe_snat_ip(raw: &Raw, v6: bool) -> Result<IpAddr, ConfigError> {
    let family = if v6 { "IPv6" } else { "IPv4" };
    let ip: IpAddr = raw
        .value
        .trim()
        .parse()
        .map_err(|_| invalid(raw, format!("expected an {family} address")))?;
    if ip.is_ipv6() != v6 {
        return Err(invalid(
            raw,
            format!("expected an {family} address, not {}", family_of(ip)),
        ));
    }
    let why = crate::cli::unusable_source_ip(ip);
    match why {
        Some(why) => Err(invalid(
            raw,
            format!("{why} cannot be the source address of SNATed kubelet probes"),
        )),
        None => Ok(ip),
    }
}

/// `HOST_PROBE_SNAT_NODE_IPS`: the node's addresses, comma-separated (what the downward API's
/// `status.hostIPs` gives). Each must be a usable source, like the SNAT addresses themselves; a
/// family the node has no address of keeps its `HOST_PROBE_SNAT_IP`/`_IPV6`.
pub(super) fn node_ip_list(raw: &Raw) -> Result<Vec<IpAddr>, ConfigError> {
    let mut ips = Vec::new();
    for item in split_list(&raw.value) {
        let ip: IpAddr = item
            .parse()
            .map_err(|_| invalid(raw, format!("item {item:?}: expected an IP address")))?;
        if let Some(why) = crate::cli::unusable_source_ip(ip) {
            return Err(invalid(
                raw,
                format!(
                    "item {item:?}: {why} cannot be the source address of SNATed kubelet probes"
                ),
            ));
        }
        ips.push(ip);
    }
    Ok(ips)
}

/// The first of `ips` of the family (IPv6 when `v6`), if any.
pub(super) fn node_ip_of(ips: &[IpAddr], v6: bool) -> Option<IpAddr> {
    ips.iter().copied().find(|ip| ip.is_ipv6() == v6)
}

fn family_of(ip: IpAddr) -> &'static str {
    if ip.is_ipv6() { "IPv6" } else { "IPv4" }
}

/// A value checked against one of the Kubernetes naming rules (`kube::names`).
pub(super) fn kube_name(raw: &Raw, rule: NameRule) -> Result<String, ConfigError> {
    let v = raw.value.trim();
    names::check(v, rule).map_err(|e| invalid(raw, e.to_string()))?;
    Ok(v.to_string())
}

/// A comma-separated list of namespaces (`EXCLUDE_NAMESPACES`), each a DNS-1123 label.
pub(super) fn namespace_list(raw: &Raw) -> Result<Vec<String>, ConfigError> {
    let list = split_list(&raw.value);
    for ns in &list {
        names::check(ns, NameRule::StrictLabel)
            .map_err(|e| invalid(raw, format!("item {ns:?}: {e}")))?;
    }
    Ok(list)
}

/// `HOST_PROC_DIR`: `f_type` is what statfs reported for it, or why it could not be read.
pub fn procfs(raw_name: &str, path: &str, f_type: Result<u64, String>) -> Result<(), ConfigError> {
    let reason = match f_type {
        Ok(PROC_SUPER_MAGIC) => return Ok(()),
        Ok(t) => format!(
            "not a procfs mount (filesystem type {t:#x}); the chart mounts the host /proc here for ambient and repair.repairPods"
        ),
        Err(e) => format!(
            "cannot be read ({e}); the chart mounts the host /proc here for ambient and repair.repairPods"
        ),
    };
    Err(ConfigError::Invalid {
        name: raw_name.to_string(),
        value: path.to_string(),
        reason,
    })
}
