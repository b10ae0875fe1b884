//! The declaration macro of [`super`] and its helpers (`$crate::cli::settings::...` paths, so
//! they expand anywhere in the crate).

#[allow(unused_imports)] // doc links
use super::{Raw, Setting};

/// Declares settings once and derives from the list: an argh `FromArgs` struct with one field
/// per flagged setting (`Option<String>` in a `section`, `bool` in a `switches` section, after
/// them; the help line is the declared doc, the default and the env vars), a typed values struct
/// resolved flag > env > default, and a `decl` module of [`Setting`] consts (one per setting, and
/// `ALL`). argh must see `Option<String>` spelt out, so the two kinds are two kinds of section.
///
/// Entry: `/// doc` then `key: Type { parse: f, [short: 'x',] [env: "KEY",] [also: ["K2"],]
/// [legacy: "OLD",] [default: "v" | unset: "what then",] [marks: [Bool, WarnIfSet]] }`. `f`
/// takes a [`Raw`]; with a default, `f` also parses the default and `Type` is its output, else
/// `Type` is `Option<output>`. A switch is on when given, off when given `=false`, else each set
/// env var in turn (the later winning), else its default; its `Type` is `f`'s output. A last
/// `shared "Section" { key: Type { parse: f } }` block lists env-only settings declared once in
/// [`super::shared`] under the same key (env var, default and doc from there; `Type` is `f`'s
/// output).
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
                        parse: $parse:expr
                        $(, short: $short:literal)?
                        $(, env: $env:literal)?
                        $(, also: [$($also:literal),*])?
                        $(, legacy: $legacy:literal)?
                        $(, default: $default:literal)?
                        $(, unset: $unset:literal)?
                        $(, marks: [$($mark:ident),*])?
                        $(,)?
                    }
                )*
            }
        )*
        $(
            switches $ssection:literal {
                $(
                    $(#[doc = $sdoc:literal])*
                    $skey:ident : $sty:ty {
                        parse: $sparse:expr
                        $(, short: $sshort:literal)?
                        $(, env: $senv:literal)?
                        $(, also: [$($salso:literal),*])?
                        , default: $sdefault:literal
                        $(,)?
                    }
                )*
            }
        )*
        env_only $esection:literal {
            $(
                $(#[doc = $edoc:literal])*
                $ekey:ident : $ety:ty {
                    parse: $eparse:expr
                    , env: $eenv:literal
                    $(, default: $edefault:literal)?
                    $(, unset: $eunset:literal)?
                    $(,)?
                }
            )*
        }
        $(
            shared $shsection:literal {
                $(
                    $shkey:ident : $shty:ty { parse: $shparse:expr $(,)? }
                )*
            }
        )?
    ) => {
        #[derive(::argh::FromArgs, Debug, Default)]
        $(#[$fattr])*
        pub struct $Flags {
            $($(
                $(#[doc = $doc])*
                $(#[doc = "; default \""] #[doc = $default] #[doc = "\""])?
                $(#[doc = "; default "] #[doc = $unset])?
                $(#[doc = " (env "] #[doc = $env] #[doc = ")"])?
                $($(#[doc = " (or env "] #[doc = $also] #[doc = ")"])*)?
                $(#[doc = " (legacy env "] #[doc = $legacy] #[doc = ")"])?
                #[argh(option $(, short = $short)?)]
                pub $key: Option<String>,
            )*)*
            $($(
                $(#[doc = $sdoc])*
                $(#[doc = " (env "] #[doc = $senv] #[doc = ")"])?
                $($(#[doc = " (or env "] #[doc = $salso] #[doc = ")"])*)?
                #[argh(switch $(, short = $sshort)?)]
                pub $skey: bool,
            )*)*
            $($extra)*
        }

        impl $Flags {
            /// What argh parsed for the flag of option `s` (`None` for switches and env-only
            /// settings).
            #[allow(dead_code)]
            pub fn given(&self, s: &$crate::cli::settings::Setting) -> Option<&String> {
                match s.key {
                    $($(
                        stringify!($key) => self.$key.as_ref(),
                    )*)*
                    _ => None,
                }
            }
        }

        /// Every setting's typed value (flag > env > default).
        #[derive(Debug)]
        #[allow(dead_code)] // compatibility settings are parsed for their warning only
        pub struct $Values {
            $($( pub $key: $ty, )*)*
            $($( pub $skey: $sty, )*)*
            $( pub $ekey: $ety, )*
            $($( pub $shkey: $shty, )*)?
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
                            option, lookup, $decl::$key, flags.$key, $parse
                            $(, default $default)?
                        ),
                    )*)*
                    $($(
                        $skey: $crate::cli::settings::setting_value!(
                            switch, lookup, $decl::$skey, flags.$skey, $sparse,
                            default $sdefault
                        ),
                    )*)*
                    $(
                        $ekey: $crate::cli::settings::setting_value!(
                            env, lookup, $decl::$ekey, None, $eparse $(, default $edefault)?
                        ),
                    )*
                    $($(
                        $shkey: $crate::cli::settings::setting_value!(
                            shared, lookup, $decl::$shkey, $shparse
                        ),
                    )*)?
                })
            }
        }

        /// One [`Setting`](crate::cli::settings::Setting) per declared setting.
        #[allow(non_upper_case_globals)]
        pub mod $decl {
            #[allow(unused_imports)]
            use $crate::cli::settings::{Mark, Setting};
            $($(
                pub const $key: Setting = Setting {
                    key: stringify!($key),
                    short: $crate::cli::settings::opt_literal!($($short)?),
                    env: $crate::cli::settings::opt_literal!($($env)?),
                    also_env: &[$($($also),*)?],
                    legacy_env: $crate::cli::settings::opt_literal!($($legacy)?),
                    has_flag: true,
                    switch: false,
                    default: $crate::cli::settings::opt_literal!($($default)?),
                    unset: $crate::cli::settings::opt_literal!($($unset)?),
                    doc: concat!($($doc),*),
                    section: $section,
                    marks: &[$($(Mark::$mark),*)?],
                };
            )*)*
            $($(
                pub const $skey: Setting = Setting {
                    key: stringify!($skey),
                    short: $crate::cli::settings::opt_literal!($($sshort)?),
                    env: $crate::cli::settings::opt_literal!($($senv)?),
                    also_env: &[$($($salso),*)?],
                    legacy_env: None,
                    has_flag: true,
                    switch: true,
                    default: Some($sdefault),
                    unset: None,
                    doc: concat!($($sdoc),*),
                    section: $ssection,
                    marks: &[],
                };
            )*)*
            $(
                pub const $ekey: Setting = Setting {
                    key: stringify!($ekey),
                    short: None,
                    env: Some($eenv),
                    also_env: &[],
                    legacy_env: None,
                    has_flag: false,
                    switch: false,
                    default: $crate::cli::settings::opt_literal!($($edefault)?),
                    unset: $crate::cli::settings::opt_literal!($($eunset)?),
                    doc: concat!($($edoc),*),
                    section: $esection,
                    marks: &[],
                };
            )*
            $($(
                /// Declared once in [`crate::cli::settings::shared`], shown in this list too.
                pub const $shkey: Setting = Setting {
                    section: $shsection,
                    ..$crate::cli::settings::shared::decl::$shkey
                };
                const _: () = assert!($shkey.default.is_some(), "a shared setting has a default");
            )*)?
            /// Every setting, in declaration order.
            pub const ALL: &[Setting] =
                &[$($($key,)*)* $($($skey,)*)* $($ekey,)* $($($shkey,)*)?];
        }
    };
}
pub(crate) use declare_settings;

/// One setting's value inside [`declare_settings!`]: parsed from the given raw value, else from
/// the declared default (or `None` when there is none); a switch as described there.
macro_rules! setting_value {
    (option, $lookup:expr, $s:expr, $flag:expr, $parse:expr $(, default $default:literal)?) => {
        $crate::cli::settings::setting_value!(
            env, $lookup, $s, $flag.as_ref(), $parse $(, default $default)?
        )
    };
    (switch, $lookup:expr, $s:expr, $flag:expr, $parse:expr, default $default:literal) => {
        if $flag {
            true
        } else if $lookup.switched_off(&$s) {
            false
        } else {
            let mut on = ($parse)(&$crate::cli::settings::default_raw(&$s, $default))?;
            for raw in $lookup.env_raws(&$s) {
                on = ($parse)(&raw)?;
            }
            on
        }
    };
    (env, $lookup:expr, $s:expr, $flag:expr, $parse:expr, default $default:literal) => {
        match $lookup.raw(&$s, $flag) {
            Some(raw) => ($parse)(&raw)?,
            None => ($parse)(&$crate::cli::settings::default_raw(&$s, $default))?,
        }
    };
    (shared, $lookup:expr, $s:expr, $parse:expr) => {
        match $lookup.raw(&$s, None) {
            Some(raw) => ($parse)(&raw)?,
            None => ($parse)(&$crate::cli::settings::default_raw(
                &$s,
                $s.default.unwrap_or_default(),
            ))?,
        }
    };
    (env, $lookup:expr, $s:expr, $flag:expr, $parse:expr) => {
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
