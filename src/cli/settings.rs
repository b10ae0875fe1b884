//! Settings declared once: each setting's name, env var (and legacy alias), flag, default, parser
//! and doc line live in one [`declare_settings!`] list, from which come the argh flag struct (its
//! `--help`), the typed values (flag > env > default, through the one env seam [`Env`]) and the
//! Markdown settings table the docs embed ([`markdown`], [`sync_block`]).

use super::Env;

/// One setting, as declared (the generated `decl` module holds one const per setting).
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    /// The field name; the flag is this with `-` for `_`, the env var this in upper case.
    pub key: &'static str,
    pub env: &'static str,
    /// An older env name still read (after the flag and `env`), with a warning.
    pub legacy_env: Option<&'static str>,
    /// Env-only settings have no flag.
    pub has_flag: bool,
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
        match self.flag() {
            Some(flag) => format!("--{flag}"),
            None => format!("env {}", self.env),
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
}

impl Lookup<'_> {
    /// An env var's value, named `env NAME`.
    pub fn env_raw(&self, name: &str) -> Option<Raw> {
        self.env
            .get(name)
            .filter(|v| self.empty_env == EmptyEnv::Empty || !v.is_empty())
            .map(|value| Raw {
                name: format!("env {name}"),
                value,
            })
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
        self.env_raw(s.env)
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
        let env = s.env;
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

/// The settings as Markdown: one `###` heading and table per section, in declaration order.
pub fn markdown(settings: &[Setting]) -> String {
    let mut out = String::new();
    let mut section = None;
    for s in settings {
        if section != Some(s.section) {
            section = Some(s.section);
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&format!(
                "### {}\n\n| flag | env | default | meaning |\n| --- | --- | --- | --- |\n",
                s.section
            ));
        }
        let flag = s.flag().map_or("—".to_string(), |f| format!("`--{f}`"));
        let mut env = format!("`{}`", s.env);
        if let Some(l) = s.legacy_env {
            env.push_str(&format!(" (legacy `{l}`, with a warning)"));
        }
        let default = match (s.default, s.unset) {
            (Some(""), _) => "empty".to_string(),
            (Some(d), _) => format!("`{d}`"),
            (None, Some(u)) => u.to_string(),
            (None, None) => "—".to_string(),
        };
        let row = [flag, env, default, s.doc.trim().to_string()].map(|c| c.replace('|', "\\|"));
        out.push_str(&format!("| {} |\n", row.join(" | ")));
    }
    out
}

/// `text` with the lines between `<!-- BEGIN GENERATED: name -->` and `<!-- END GENERATED: name
/// -->` replaced by `content`, or why the markers are missing.
pub fn sync_block(text: &str, name: &str, content: &str) -> Result<String, String> {
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

/// Declares settings once and derives from the list: an argh `FromArgs` struct with one
/// `Option<String>` option per flagged setting (its help line is the declared doc, the default
/// and the env var), a typed values struct resolved flag > env > default, and a `decl` module of
/// [`Setting`] consts (one per setting, and `ALL`).
///
/// Entry: `/// doc` then `key: Type { env: "KEY", [legacy: "OLD",] parse: f, [default: "v" |
/// unset: "what then"], [marks: [Bool, WarnIfSet]] }`. `f` takes a [`Raw`]; with a default, `f`
/// also parses the default and `Type` is its output, else `Type` is `Option<output>`.
macro_rules! declare_settings {
    (
        $(#[$fattr:meta])*
        pub struct $Flags:ident { $($extra:tt)* }
        pub struct $Values:ident;
        pub mod $decl:ident;
        error $Err:ty;
        $(
            section $section:literal {
                $(
                    $(#[doc = $doc:literal])*
                    $key:ident : $ty:ty {
                        env: $env:literal
                        $(, legacy: $legacy:literal)?
                        , parse: $parse:expr
                        $(, default: $default:literal)?
                        $(, unset: $unset:literal)?
                        $(, marks: [$($mark:ident),*])?
                        $(,)?
                    }
                )*
            }
        )*
        env_only $esection:literal {
            $(
                $(#[doc = $edoc:literal])*
                $ekey:ident : $ety:ty {
                    env: $eenv:literal
                    , parse: $eparse:expr
                    $(, default: $edefault:literal)?
                    $(, unset: $eunset:literal)?
                    $(,)?
                }
            )*
        }
    ) => {
        $(#[$fattr])*
        #[derive(::argh::FromArgs, Debug, Default)]
        pub struct $Flags {
            $($(
                $(#[doc = $doc])*
                $(#[doc = "; default "] #[doc = $default])?
                $(#[doc = "; default "] #[doc = $unset])?
                #[doc = " (env "] #[doc = $env]
                $(#[doc = ", legacy "] #[doc = $legacy])?
                #[doc = ")"]
                #[argh(option)]
                pub $key: Option<String>,
            )*)*
            $($extra)*
        }

        impl $Flags {
            /// What argh parsed for the flag of setting `s` (`None` for env-only settings).
            #[allow(dead_code)]
            pub fn given(&self, s: &$crate::cli::settings::Setting) -> Option<&String> {
                match s.key {
                    $($( stringify!($key) => self.$key.as_ref(), )*)*
                    _ => None,
                }
            }
        }

        /// Every setting's typed value (flag > env > default).
        #[derive(Debug)]
        #[allow(dead_code)] // compatibility settings are parsed for their warning only
        pub struct $Values {
            $($( pub $key: $ty, )*)*
            $( pub $ekey: $ety, )*
        }

        impl $Values {
            /// Resolves every setting, in declaration order; the first bad value is the error.
            pub fn resolve(
                flags: &$Flags,
                lookup: &$crate::cli::settings::Lookup,
            ) -> Result<Self, $Err> {
                Ok(Self {
                    $($(
                        $key: $crate::cli::settings::setting_value!(
                            lookup, $decl::$key, flags.$key.as_ref(), $parse
                            $(, default $default)?
                        ),
                    )*)*
                    $(
                        $ekey: $crate::cli::settings::setting_value!(
                            lookup, $decl::$ekey, None, $eparse $(, default $edefault)?
                        ),
                    )*
                })
            }
        }

        /// One [`Setting`](crate::cli::settings::Setting) per declared setting.
        #[allow(non_upper_case_globals)]
        pub mod $decl {
            use $crate::cli::settings::{Mark, Setting};
            $($(
                pub const $key: Setting = Setting {
                    key: stringify!($key),
                    env: $env,
                    legacy_env: $crate::cli::settings::opt_literal!($($legacy)?),
                    has_flag: true,
                    default: $crate::cli::settings::opt_literal!($($default)?),
                    unset: $crate::cli::settings::opt_literal!($($unset)?),
                    doc: concat!($($doc),*),
                    section: $section,
                    marks: &[$($(Mark::$mark),*)?],
                };
            )*)*
            $(
                pub const $ekey: Setting = Setting {
                    key: stringify!($ekey),
                    env: $eenv,
                    legacy_env: None,
                    has_flag: false,
                    default: $crate::cli::settings::opt_literal!($($edefault)?),
                    unset: $crate::cli::settings::opt_literal!($($eunset)?),
                    doc: concat!($($edoc),*),
                    section: $esection,
                    marks: &[],
                };
            )*
            /// Every setting, in declaration order.
            pub const ALL: &[Setting] = &[$($($key,)*)* $($ekey,)*];
        }
    };
}
pub(crate) use declare_settings;

/// One setting's value inside [`declare_settings!`]: parsed from the given raw value, else from
/// the declared default (or `None` when there is none).
macro_rules! setting_value {
    ($lookup:expr, $s:expr, $flag:expr, $parse:expr, default $default:literal) => {
        match $lookup.raw(&$s, $flag) {
            Some(raw) => ($parse)(&raw)?,
            None => ($parse)(&$crate::cli::settings::default_raw(&$s, $default))?,
        }
    };
    ($lookup:expr, $s:expr, $flag:expr, $parse:expr) => {
        match $lookup.raw(&$s, $flag) {
            Some(raw) => Some(($parse)(&raw)?),
            None => None,
        }
    };
}
pub(crate) use setting_value;

/// `Some(literal)` or `None`, for an optional part of a declaration.
macro_rules! opt_literal {
    () => {
        None
    };
    ($l:literal) => {
        Some($l)
    };
}
pub(crate) use opt_literal;

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
        env: "OWNED_NAME",
        legacy_env: Some("OWNED_NAM"),
        has_flag: true,
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
}
