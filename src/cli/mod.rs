//! Command-line plumbing shared by every role: pflag-style argv normalising for argh and env-var
//! fallbacks.
//! May call: nothing else in this crate.
