//! Settings declared once: each setting's name, env var (and legacy alias), flag, default, parser
//! and doc line live in one [`declare_settings!`] list, from which come the argh flag struct (its
//! `--help`), the typed values (flag > env > default, through the one env seam [`Env`]) and the
//! Markdown settings table the docs embed ([`markdown`], [`sync_block`]).

use std::collections::HashSet;

use super::Env;

mod macros;
pub mod shared;
pub(crate) use macros::{declare_settings, opt_literal, setting_value};

/// One setting, as declared (the generated `decl` module holds one const per setting).
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    /// The field name; the flag is this with `-` for `_`.
    pub key: &'static str,
    /// A single-letter form of the flag.
    pub short: Option<char>,
    pub env: Option<&'static str>,
    /// More env vars read after `env`, the later winning (Istio's aliases of a switch).
    pub also_env: &'static [&'static str],
    /// An older env name still read (after the flag and `env`), with a warning.
    pub legacy_env: Option<&'static str>,
    /// Env-only settings have no flag.
    pub has_flag: bool,
    /// A switch (`--flag`, `--flag=false`) rather than an option taking a value.
    pub switch: bool,
    /// The value used when nothing is given, parsed by the setting's own parser.
    pub default: Option<&'static str>,
    /// No default value: what happens when the setting is not given (docs only).
    pub unset: Option<&'static str>,
    pub doc: &'static str,
    pub section: &'static str,
    pub marks: &'static [Mark],
}

/// Extra properties of a setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// A boolean: a bare `--flag` means `--flag true` (the normaliser's `bool_options`).
    Bool,
    /// Accepted for compatibility and ignored; a warning says so when it is set.
    WarnIfSet,
}

impl Setting {
    /// The long flag (dash form, without `--`), if the setting has one.
    pub fn flag(&self) -> Option<String> {
        self.has_flag.then(|| self.key.replace('_', "-"))
    }

    pub fn is(&self, mark: Mark) -> bool {
        self.marks.contains(&mark)
    }

    /// The name a default value goes by in errors: the flag, else the env var.
    fn default_name(&self) -> String {
        match (self.flag(), self.env) {
            (Some(flag), _) => format!("--{flag}"),
            (None, Some(env)) => env.to_string(),
            (None, None) => self.key.to_string(),
        }
    }
}

/// One setting's given value and where it came from (`--flag` or `env NAME`), for errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Raw {
    pub name: String,
    pub value: String,
}

/// What a set-but-empty env var means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmptyEnv {
    /// Unset (viper's rule: install-cni).
    Unset,
    /// The empty value (istio-iptables).
    Empty,
}

/// Finds settings' values: flag > env > legacy env.
pub struct Lookup<'a> {
    pub env: &'a dyn Env,
    pub empty_env: EmptyEnv,
    /// What an env var's value is named in errors: `env NAME` (`"env "`) or `NAME` (`""`).
    pub env_label: &'static str,
    /// Switches the command line set to false explicitly (dash form), which beat the env.
    pub switched_off: Option<&'a HashSet<String>>,
}

impl Lookup<'_> {
    /// An env var's value, named `env NAME` or `NAME` (`env_label`).
    pub fn env_raw(&self, name: &str) -> Option<Raw> {
        self.env
            .get(name)
            .filter(|v| self.empty_env == EmptyEnv::Empty || !v.is_empty())
            .map(|value| Raw {
                name: format!("{}{name}", self.env_label),
                value,
            })
    }

    /// The values of the env vars of `s` that are set, `env` first, then `also_env` in order.
    pub fn env_raws(&self, s: &Setting) -> Vec<Raw> {
        s.env
            .iter()
            .chain(s.also_env)
            .filter_map(|name| self.env_raw(name))
            .collect()
    }

    /// Whether the command line turned switch `s` off explicitly (`--flag=false`).
    pub fn switched_off(&self, s: &Setting) -> bool {
        match (self.switched_off, s.flag()) {
            (Some(off), Some(flag)) => off.contains(&flag),
            _ => false,
        }
    }

    /// The value given for `s`: its flag (`flag` is what argh parsed), else its env var, else
    /// its legacy env var.
    pub fn raw(&self, s: &Setting, flag: Option<&String>) -> Option<Raw> {
        if let (Some(v), Some(name)) = (flag, s.flag()) {
            return Some(Raw {
                name: format!("--{name}"),
                value: v.clone(),
            });
        }
        s.env
            .and_then(|e| self.env_raw(e))
            .or_else(|| s.legacy_env.and_then(|l| self.env_raw(l)))
    }

    /// The given value, else the declared default (named by the flag, else the env var).
    pub fn raw_or_default(&self, s: &Setting, flag: Option<&String>) -> Option<Raw> {
        self.raw(s, flag)
            .or_else(|| s.default.map(|d| default_raw(s, d)))
    }

    /// Why the legacy env var of `s` is being read, or ignored, if it is set.
    pub fn legacy_warning(&self, s: &Setting, flag: Option<&String>) -> Option<String> {
        let legacy = self.env_raw(s.legacy_env?)?;
        let env = s.env?;
        let l = s.legacy_env?;
        let given = match (flag, s.flag()) {
            (Some(v), Some(name)) => Some(Raw {
                name: format!("--{name}"),
                value: v.clone(),
            }),
            _ => self.env_raw(env),
        };
        match given {
            Some(g) if g.value == legacy.value => None,
            Some(g) => Some(format!(
                "ignoring legacy env {l}={:?}: {} is set to {:?}",
                legacy.value, g.name, g.value
            )),
            None => Some(format!(
                "env {l} is a misspelt legacy name (Istio chart bug); using it, please set {env} \
                 instead"
            )),
        }
    }
}

/// The default of `s` as a raw value, for its parser.
pub fn default_raw(s: &Setting, default: &str) -> Raw {
    Raw {
        name: s.default_name(),
        value: default.to_string(),
    }
}

/// The flags (dash form) of the boolean settings, for the normaliser's `bool_options`.
pub fn bool_flags(settings: &[Setting]) -> Vec<String> {
    settings
        .iter()
        .filter(|s| s.is(Mark::Bool))
        .filter_map(Setting::flag)
        .collect()
}

/// The settings as Markdown: one `###` heading and table per section, in declaration order; a
/// `short` column when any setting has a short flag. The docs' generated tables (tests hold them).
#[cfg(test)]
pub(crate) fn markdown(settings: &[Setting]) -> String {
    let shorts = settings.iter().any(|s| s.short.is_some());
    let mut out = String::new();
    let mut section = None;
    for s in settings {
        if section != Some(s.section) {
            section = Some(s.section);
            if !out.is_empty() {
                out.push('\n');
            }
            let (head, rule) = match shorts {
                true => (
                    "| flag | short | env | default | meaning |",
                    "| --- | --- | --- | --- | --- |",
                ),
                false => (
                    "| flag | env | default | meaning |",
                    "| --- | --- | --- | --- |",
                ),
            };
            out.push_str(&format!("### {}\n\n{head}\n{rule}\n", s.section));
        }
        let mut row = vec![s.flag().map_or("—".to_string(), |f| format!("`--{f}`"))];
        if shorts {
            row.push(s.short.map_or(String::new(), |c| format!("`-{c}`")));
        }
        let envs: Vec<String> = s
            .env
            .iter()
            .chain(s.also_env)
            .map(|e| format!("`{e}`"))
            .collect();
        let mut env = if envs.is_empty() {
            "—".to_string()
        } else {
            envs.join(", ")
        };
        if let Some(l) = s.legacy_env {
            env.push_str(&format!(" (legacy `{l}`, with a warning)"));
        }
        row.push(env);
        row.push(match (s.default, s.unset) {
            (Some(""), _) => "empty".to_string(),
            (Some(d), _) => format!("`{d}`"),
            (None, Some(u)) => u.to_string(),
            (None, None) => "—".to_string(),
        });
        row.push(s.doc.trim().to_string());
        let row: Vec<String> = row.into_iter().map(|c| c.replace('|', "\\|")).collect();
        out.push_str(&format!("| {} |\n", row.join(" | ")));
    }
    out
}

/// `text` with the lines between `<!-- BEGIN GENERATED: name -->` and `<!-- END GENERATED: name
/// -->` replaced by `content`, or why the markers are missing.
#[cfg(test)]
fn sync_block(text: &str, name: &str, content: &str) -> Result<String, String> {
    let begin = format!("<!-- BEGIN GENERATED: {name} -->\n");
    let end = format!("<!-- END GENERATED: {name} -->");
    let start = text
        .find(&begin)
        .ok_or_else(|| format!("no {begin:?} marker"))?
        + begin.len();
    let stop = start
        + text[start..]
            .find(&end)
            .ok_or_else(|| format!("no {end:?} marker after the begin marker"))?;
    Ok(format!("{}{content}{}", &text[..start], &text[stop..]))
}

/// Test helper for a doc's generated block: fails naming the first differing line (and how to
/// regenerate), or with `UPDATE_DOCS=1` rewrites the block.
#[cfg(test)]
pub(crate) fn assert_doc_block(doc: &str, block: &str, settings: &[Setting], rerun: &str) {
    let text = std::fs::read_to_string(doc).unwrap_or_else(|e| panic!("{doc}: {e}"));
    let want =
        sync_block(&text, block, &markdown(settings)).unwrap_or_else(|e| panic!("{doc}: {e}"));
    if std::env::var_os("UPDATE_DOCS").is_some_and(|v| v == "1") {
        std::fs::write(doc, &want).unwrap_or_else(|e| panic!("{doc}: {e}"));
        return;
    }
    if text != want {
        let first = text
            .lines()
            .zip(want.lines())
            .find(|(a, b)| a != b)
            .map_or_else(
                || "(lengths differ)".to_string(),
                |(a, b)| format!("doc:  {a}\nwant: {b}"),
            );
        panic!(
            "{doc}: the generated block {block:?} is out of date with its declarations; \
             run UPDATE_DOCS=1 {rerun}\n{first}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const OWNED: Setting = Setting {
        key: "owned_name",
        short: None,
        env: Some("OWNED_NAME"),
        also_env: &[],
        legacy_env: Some("OWNED_NAM"),
        has_flag: true,
        switch: false,
        default: Some("a.conf"),
        unset: None,
        doc: " the name | of it",
        section: "S",
        marks: &[],
    };

    #[test]
    fn flag_beats_env_beats_legacy_env() {
        let e = env(&[("OWNED_NAME", "env"), ("OWNED_NAM", "old")]);
        let l = Lookup {
            env: &e,
            empty_env: EmptyEnv::Unset,
            env_label: "env ",
            switched_off: None,
        };
        let flag = "flag".to_string();
        assert_eq!(l.raw(&OWNED, Some(&flag)).unwrap().name, "--owned-name");
        assert_eq!(l.raw(&OWNED, None).unwrap().name, "env OWNED_NAME");
        let w = l.legacy_warning(&OWNED, None).unwrap();
        assert!(w.contains("ignoring legacy env OWNED_NAM=\"old\""), "{w}");
        let e = env(&[("OWNED_NAM", "old"), ("OWNED_NAME", "")]);
        let l = Lookup {
            env: &e,
            empty_env: EmptyEnv::Unset,
            env_label: "env ",
            switched_off: None,
        };
        assert_eq!(l.raw(&OWNED, None).unwrap().value, "old");
        assert!(
            l.legacy_warning(&OWNED, None)
                .unwrap()
                .contains("OWNED_NAME instead")
        );
        let l = Lookup {
            env: &e,
            empty_env: EmptyEnv::Empty,
            env_label: "env ",
            switched_off: None,
        };
        assert_eq!(
            l.raw(&OWNED, None).unwrap().value,
            "",
            "set-but-empty is a value"
        );
    }

    #[test]
    fn markdown_rows_escape_pipes_and_name_the_legacy_env() {
        let md = markdown(&[OWNED]);
        assert!(
            md.starts_with("### S\n\n| flag | env | default | meaning |\n"),
            "{md}"
        );
        assert!(
            md.contains(
                "| `--owned-name` | `OWNED_NAME` (legacy `OWNED_NAM`, with a warning) | `a.conf` | the name \\| of it |"
            ),
            "{md}"
        );
    }

    #[test]
    fn sync_block_replaces_only_between_the_markers() {
        let doc = "a\n<!-- BEGIN GENERATED: t -->\nold\n<!-- END GENERATED: t -->\nb\n";
        assert_eq!(
            sync_block(doc, "t", "new\n").unwrap(),
            "a\n<!-- BEGIN GENERATED: t -->\nnew\n<!-- END GENERATED: t -->\nb\n"
        );
        assert!(sync_block("a\n", "t", "x").unwrap_err().contains("BEGIN"));
    }

    mod declared {
        use super::super::Raw;

        #[derive(Debug, PartialEq)]
        pub struct Bad(pub String);

        fn number(raw: &Raw) -> Result<u32, Bad> {
            raw.value.parse().map_err(|_| Bad(raw.name.clone()))
        }

        fn on(raw: &Raw) -> Result<bool, Bad> {
            crate::cli::parse_go_bool(&raw.value).ok_or_else(|| Bad(raw.name.clone()))
        }

        crate::cli::settings::declare_settings! {
            /// a test command
            pub struct Flags {}
            pub struct Values;
            pub mod decl;
            error Bad;

            section "Options" {
                /// a number
                count: u32 { parse: number, short: 'c', env: "COUNT", default: "3" }
                /// another, without a default
                limit: Option<u32> { parse: number, env: "LIMIT", unset: "no limit" }
            }
            switches "Switches" {
                /// a switch with an alias
                loud: bool { parse: on, env: "LOUD", also: ["NOISY"], default: "false" }
            }
            env_only "Environment only" {
                /// env only
                depth: u32 { parse: number, env: "DEPTH", default: "7" }
            }
        }
    }

    #[test]
    fn a_declaration_resolves_flag_over_env_over_default_and_switches_as_documented() {
        use argh::FromArgs;
        use declared::*;
        let resolve = |args: &[&str], pairs: &[(&str, &str)], off: &[&str]| {
            let flags = Flags::from_args(&["t"], args).expect("parses");
            let e = env(pairs);
            let off: HashSet<String> = off.iter().map(|s| s.to_string()).collect();
            Values::resolve(
                &flags,
                &Lookup {
                    env: &e,
                    empty_env: EmptyEnv::Empty,
                    env_label: "",
                    switched_off: Some(&off),
                },
            )
        };
        let v = resolve(&[], &[], &[]).unwrap();
        assert_eq!((v.count, v.limit, v.loud, v.depth), (3, None, false, 7));
        let v = resolve(
            &["-c", "5"],
            &[("COUNT", "9"), ("LIMIT", "2"), ("DEPTH", "1")],
            &[],
        );
        let v = v.unwrap();
        assert_eq!((v.count, v.limit, v.depth), (5, Some(2), 1));
        assert_eq!(
            resolve(&[], &[("COUNT", "x")], &[]).unwrap_err(),
            Bad("COUNT".into())
        );
        assert_eq!(
            resolve(&["--count", "x"], &[], &[]).unwrap_err(),
            Bad("--count".into())
        );
        assert!(
            resolve(&[], &[("LOUD", "false"), ("NOISY", "true")], &[])
                .unwrap()
                .loud
        );
        assert!(!resolve(&[], &[("NOISY", "true")], &["loud"]).unwrap().loud);
        assert!(resolve(&["--loud"], &[("LOUD", "bad")], &[]).unwrap().loud);
        let help = Flags::from_args(&["t"], &["--help"]).unwrap_err().output;
        let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            help.contains("a number; default \"3\" (env COUNT)"),
            "{help}"
        );
        assert!(help.contains("default no limit (env LIMIT)"), "{help}");
        assert!(
            help.contains("a switch with an alias (env LOUD) (or env NOISY)"),
            "{help}"
        );
        let keys: Vec<&str> = decl::ALL.iter().map(|s| s.key).collect();
        assert_eq!(keys, ["count", "limit", "loud", "depth"]);
        assert_eq!(bool_flags(decl::ALL), Vec::<String>::new());
    }
}
