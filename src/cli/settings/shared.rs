//! Settings more than one role reads from its environment, declared once here: `istio-iptables`
//! lists them among its own (the `shared` block of its declaration) and the CNI plugin, which has
//! no flags, reads the same ones for the capture it programs (`sidecar::EngineEnv`). Only env-only
//! settings can be shared: a flag's help text must be written out where its flag is declared.

use super::Setting;

/// One env-only [`Setting`] const per entry (its key is its env var in lower case; `section` is
/// set by the list that shows it), and `ALL`.
macro_rules! env_only {
    ($( $(#[doc = $doc:literal])* $key:ident { env: $env:literal, default: $default:literal } )*) => {
        $(
            $(#[doc = $doc])*
            pub const $key: Setting = Setting {
                key: stringify!($key),
                short: None,
                env: Some($env),
                also_env: &[],
                legacy_env: None,
                has_flag: false,
                switch: false,
                default: Some($default),
                unset: None,
                doc: concat!($($doc),*),
                section: "",
                marks: &[],
            };
        )*
        /// Every shared setting.
        pub const ALL: &[Setting] = &[$($key),*];
    };
}

#[allow(non_upper_case_globals)]
pub mod decl {
    use super::Setting;

    env_only! {
        /// groups whose outbound traffic is captured: `*`, or a comma list of GIDs or names (at most 64)
        istio_outbound_owner_groups { env: "ISTIO_OUTBOUND_OWNER_GROUPS", default: "*" }
        /// with `*` above: groups whose outbound traffic is not captured
        istio_outbound_owner_groups_exclude {
            env: "ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE", default: ""
        }
        /// the IPv4 loopback range of the pod
        istio_outbound_ipv4_loopback_cidr {
            env: "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR", default: "127.0.0.1/32"
        }
        /// a file the dry run's output is also written to (empty: none); the CNI plugin writes the rules there instead of programming the pod
        dry_run_file_path { env: "DRY_RUN_FILE_PATH", default: "" }
        /// `true`: always apply through iptables-restore, never by sending its nf_tables messages directly
        istio_iptables_restore_only { env: "ISTIO_IPTABLES_RESTORE_ONLY", default: "false" }
    }
}
