//! `istio-iptables` argv (what the injected init container runs) and the environment it reads,
//! through the same pure steps as the role's main: normalise the pflag forms, parse, resolve
//! against the environment, check the capture values; `ambient` runs the ambient subcommand's.
//! Input: NUL-separated words; a word `@NAME=value` is an environment variable instead.
//! Properties: no panic; a resolved command renders its rules (iptables and nftables).
#![no_main]

use std::collections::HashMap;

use argh::FromArgs;
use istio_cni::cli::normalise_args;
use istio_cni::iptables_cmd::ambient::{self, AmbientFlags};
use istio_cni::iptables_cmd::flags::{self, Flags, SHAPES};
use istio_cni::plugin::program::{Backend, dry_run_text};
use libfuzzer_sys::fuzz_target;

fn sidecar(argv: &[String], env: &HashMap<String, String>) {
    let Ok(normalised) = normalise_args(argv, &SHAPES) else {
        return;
    };
    let refs: Vec<&str> = normalised.args.iter().map(String::as_str).collect();
    let Ok(parsed) = Flags::from_args(&["istio-iptables"], &refs) else {
        return;
    };
    let Ok(settings) = parsed.resolve(env, &normalised.explicit_false) else {
        return;
    };
    if flags::check_capture(&parsed, env, &settings.capture).is_ok() {
        for backend in [Backend::Iptables, Backend::Nftables] {
            let _ = dry_run_text(&settings.capture, backend);
        }
    }
}

fn ambient_cmd(argv: &[String], env: &HashMap<String, String>) {
    let Ok(normalised) = normalise_args(argv, &ambient::SHAPES) else {
        return;
    };
    let refs: Vec<&str> = normalised.args.iter().map(String::as_str).collect();
    let Ok(parsed) = AmbientFlags::from_args(&["istio-iptables ambient"], &refs) else {
        return;
    };
    if let Ok(cmd) = ambient::resolve(&parsed, env, &normalised.explicit_false) {
        let _ = ambient::render(&cmd, "1000");
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut argv = Vec::new();
    let mut env = HashMap::new();
    for word in text.split('\0') {
        match word.strip_prefix('@').and_then(|kv| kv.split_once('=')) {
            Some((k, v)) => {
                env.insert(k.to_string(), v.to_string());
            }
            None => argv.push(word.to_string()),
        }
    }
    if argv.first().map(String::as_str) == Some("ambient") {
        ambient_cmd(&argv[1..], &env);
    } else {
        sidecar(&argv, &env);
    }
});
