//! Values Istio's agent starts with that ours reads more strictly, for safety: rather than leave a
//! node without an agent, each is given its safe reading, and the setting, the value given and
//! what was applied instead are reported ([`Adjustment`](super::sections::Adjustment): logged as a warning and counted in
//! `istio_cni_settings_adjusted_total`). Only values with no meaning at all stop install-cni.
//!
//! | given | applied |
//! | --- | --- |
//! | a boolean `yes`, `on`, `y`, `no`, `off`, `n` (any case) | `true` or `false` |
//! | `KUBECONFIG_MODE` with bits for other users or setuid/setgid/sticky (`0644`) | the mode without them (`0640`) |
//! | a relative path for a path setting (`etc/cni/net.d`) | the path from `/` (the image's working directory) |
//!
//! The parsers apply the safe reading ([`lenient_bool`], [`safe_mode`], [`rooted`]); [`adjustment`]
//! says, from the same raw value, whether one was applied.

use std::path::PathBuf;

use super::raw::{Raw, parse_go_int};
use super::sections::Adjustment;
use crate::cli::settings::Setting;

/// The settings read with [`rooted`] paths (every item of a list).
const PATH_SETTINGS: &[&str] = &[
    "mounted_cni_net_dir",
    "cni_bin_dirs",
    "cni_results_dir",
    "cni_agent_run_dir",
    "kube_ca_file",
    "service_account_dir",
    "host_proc_dir",
    "host_netns_dir",
    "ztunnel_uds_address",
];

/// Words with a plain boolean meaning that Go's `strconv.ParseBool` refuses.
pub(super) fn lenient_bool(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "yes" | "y" | "on" => Some(true),
        "no" | "n" | "off" => Some(false),
        _ => None,
    }
}

/// A kubeconfig mode without bits for other users and without setuid/setgid/sticky.
pub(super) fn safe_mode(mode: u32) -> u32 {
    mode & 0o770
}

/// A path from `/` when relative; `None` for an empty one.
pub(super) fn rooted(v: &str) -> Option<PathBuf> {
    let v = v.trim();
    match v {
        "" => None,
        _ if v.starts_with('/') => Some(PathBuf::from(v)),
        _ => Some(PathBuf::from("/").join(v.trim_start_matches("./"))),
    }
}

/// The adjustment the setting's parser applied to `raw`, if any.
pub(super) fn adjustment(s: &Setting, raw: &Raw) -> Option<Adjustment> {
    let v = raw.value.trim();
    let applied = if s.key == "kubeconfig_mode" {
        let mode = parse_go_int(v).filter(|m| (0..=0o7777).contains(m))? as u32;
        (safe_mode(mode) != mode).then(|| format!("{:04o}", safe_mode(mode)))?
    } else if matches!(s.default, Some("true" | "false")) {
        if crate::cli::parse_go_bool(v).is_some() {
            return None;
        }
        lenient_bool(v)?.to_string()
    } else if PATH_SETTINGS.contains(&s.key) {
        let items: Vec<&str> = match s.key {
            "cni_bin_dirs" => v.split(',').map(str::trim).collect(),
            _ => vec![v],
        };
        if items.iter().all(|i| i.is_empty() || i.starts_with('/')) {
            return None;
        }
        let rooted: Vec<String> = items
            .iter()
            .filter_map(|i| rooted(i))
            .map(|p| p.display().to_string())
            .collect();
        rooted.join(",")
    } else {
        return None;
    };
    Some(Adjustment {
        name: raw.name.clone(),
        setting: s
            .env
            .map(str::to_string)
            .or_else(|| s.flag().map(|f| format!("--{f}")))
            .unwrap_or_else(|| s.key.to_string()),
        given: raw.value.clone(),
        applied,
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::run;

    #[test]
    fn only_the_list_setting_is_split_at_commas() {
        let c = run(&[], &[("MOUNTED_CNI_NET_DIR", "etc/a,b")]).unwrap();
        assert_eq!(c.install.mounted_cni_net_dir.to_str(), Some("/etc/a,b"));
        assert_eq!(c.adjusted[0].applied, "/etc/a,b");
        let c = run(&[], &[("CNI_BIN_DIRS", "a, /b")]).unwrap();
        assert_eq!(c.adjusted[0].applied, "/a,/b");
    }

    #[test]
    fn plain_words_and_nothing_else_are_read_as_booleans() {
        for (w, b) in [
            ("yes", true),
            ("Y", true),
            ("on", true),
            ("No", false),
            ("off", false),
        ] {
            assert_eq!(super::lenient_bool(w), Some(b), "{w}");
        }
        for w in ["enabled", "", "1", "true", "yess"] {
            assert_eq!(super::lenient_bool(w), None, "{w}");
        }
        assert_eq!(super::safe_mode(0o4644), 0o640);
        assert_eq!(super::rooted("./x").unwrap().to_str(), Some("/x"));
        assert_eq!(super::rooted("  "), None);
    }
}
