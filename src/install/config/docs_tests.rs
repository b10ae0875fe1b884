//! docs/configuration.md's install-cni settings table is generated from the declarations in
//! `flags`; this test fails when the two differ. `UPDATE_DOCS=1 cargo test -p istio-cni-rs --lib
//! install::config::docs_tests` rewrites the block instead.

use super::decl;
use crate::cli::settings::{Mark, assert_doc_block};

const DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md");
const BLOCK: &str = "install-cni settings";

#[test]
fn the_settings_table_in_docs_configuration_md_is_the_declared_one() {
    assert_doc_block(
        DOC,
        BLOCK,
        decl::ALL,
        "cargo test -p istio-cni-rs --lib install::config::docs_tests",
    );
}

#[test]
fn every_declaration_is_named_consistently_and_complete() {
    let mut envs = std::collections::HashSet::new();
    for s in decl::ALL {
        // viper binds each flag to the env var of the same name (`-`/`_`, case): so do we.
        let env = s
            .env
            .unwrap_or_else(|| panic!("{}: every setting has an env var", s.key));
        assert_eq!(env.to_ascii_lowercase(), s.key, "{env}");
        assert!(envs.insert(env), "{env} declared twice");
        assert!(!s.doc.trim().is_empty(), "{env} has no doc line");
        assert!(
            !s.switch && s.short.is_none() && s.also_env.is_empty(),
            "{env}"
        );
        assert!(
            s.default.is_none() || s.unset.is_none(),
            "{env}: a default and an unset text"
        );
        assert!(
            !s.is(Mark::WarnIfSet) || s.default.is_none(),
            "{env}: an ignored setting has no default"
        );
    }
}

#[test]
fn help_shows_each_flag_with_its_env_var_and_default() {
    let argv = vec!["install-cni".to_string(), "--help".to_string()];
    let text = match super::parse(&argv, &std::collections::HashMap::new()) {
        Ok(super::Parsed::Exit { text, code: 0 }) => text,
        other => panic!("expected help, got {other:?}"),
    };
    // One block per option: its first line starts with the flag, the wrapped lines follow.
    let mut blocks: Vec<String> = Vec::new();
    for line in text.lines().skip_while(|l| l.trim() != "Options:").skip(1) {
        match blocks.last_mut() {
            Some(b) if !line.trim_start().starts_with("--") => b.push_str(line),
            _ => blocks.push(line.to_string()),
        }
        blocks.last_mut().expect("pushed").push(' ');
    }
    let blocks: Vec<String> = blocks
        .iter()
        .map(|b| b.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    for s in decl::ALL.iter().filter(|s| s.has_flag) {
        let flag = format!("--{} ", s.flag().expect("has a flag"));
        let block = blocks
            .iter()
            .find(|b| b.starts_with(&flag))
            .unwrap_or_else(|| panic!("help lacks {flag}"));
        assert!(
            block.contains(&format!("(env {})", s.env.expect("env"))),
            "{block}"
        );
        if let Some(d) = s.default {
            assert!(
                block.contains(&format!("; default \"{d}\" (env")),
                "{block}"
            );
        }
    }
}

#[test]
fn defaults_that_other_rooms_also_know_agree() {
    let no_env = std::collections::HashMap::<String, String>::new();
    let l = super::resolve::lookup(&no_env);
    let raw = l
        .raw_or_default(&decl::listener_idle_timeout, None)
        .expect("default");
    assert_eq!(
        super::values::idle_timeout(&raw).expect("parses"),
        crate::telemetry::serve::DEFAULT_IDLE_TIMEOUT
    );
}
