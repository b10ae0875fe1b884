//! docs/istio-iptables.md's settings tables are generated from the declarations in `flags` and
//! `ambient_flags`; these tests fail when they differ. `UPDATE_DOCS=1 cargo test -p istio-cni-rs --lib
//! iptables_cmd::flags::docs_tests` rewrites the block instead.

use super::{Flags, SHAPES, decl};
use crate::cli::settings::assert_doc_block;
use argh::FromArgs;

const DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/istio-iptables.md");
const BLOCK: &str = "istio-iptables settings";
const AMBIENT_BLOCK: &str = "istio-iptables ambient settings";

#[test]
fn the_settings_table_in_docs_istio_iptables_md_is_the_declared_one() {
    assert_doc_block(
        DOC,
        BLOCK,
        decl::ALL,
        "cargo test -p istio-cni-rs --lib iptables_cmd::flags::docs_tests",
    );
}

#[test]
fn the_ambient_settings_table_in_docs_istio_iptables_md_is_the_declared_one() {
    assert_doc_block(
        DOC,
        AMBIENT_BLOCK,
        crate::iptables_cmd::ambient_flags::decl::ALL,
        "cargo test -p istio-cni-rs --lib iptables_cmd::flags::docs_tests",
    );
}

#[test]
fn ambient_help_names_every_env_var_and_the_shapes_every_switch() {
    use crate::iptables_cmd::ambient_flags::{AmbientFlags, SHAPES, decl};
    let help = AmbientFlags::from_args(&["istio-iptables ambient"], &["--help"])
        .expect_err("--help exits early")
        .output;
    let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
    for s in decl::ALL {
        let flag = s.flag().expect("every ambient setting is a flag");
        assert!(help.contains(&format!("--{flag}")), "--{flag}: {help}");
        if let Some(env) = s.env {
            assert!(help.contains(&format!("(env {env})")), "{env}: {help}");
        }
        assert_eq!(
            s.switch,
            SHAPES.switches.contains(&flag.as_str()),
            "--{flag}"
        );
    }
}

#[test]
fn help_names_every_env_var_and_the_shapes_every_switch_and_short() {
    let help = Flags::from_args(&["istio-iptables"], &["--help"])
        .expect_err("--help exits early")
        .output;
    let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
    for s in decl::ALL {
        // Flagged ones in their option's line, env-only ones in the hand-written note.
        for env in s.env.iter().chain(s.also_env) {
            assert!(help.contains(env), "{env} missing from --help");
        }
        let Some(flag) = s.flag() else { continue };
        assert!(
            help.contains(&format!("--{flag}")),
            "--{flag} missing from --help"
        );
        assert_eq!(
            s.switch,
            SHAPES.switches.contains(&flag.as_str()),
            "--{flag}"
        );
        if let Some(c) = s.short {
            assert!(SHAPES.shorts.contains(&(c, flag.as_str())), "-{c}");
            assert!(
                help.contains(&format!("-{c}, --{flag}")),
                "-{c} missing from --help"
            );
        }
    }
}
