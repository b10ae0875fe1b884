//! Multicall entry point: the role is chosen from the name this executable is invoked under.

use std::path::Path;

const USAGE: &str = "\
usage: <binary> <role> [args...]   (or invoke through a link named after the role)

roles:
  istio-cni        the CNI plugin (ADD/DEL/CHECK/VERSION/STATUS/GC), run by the container runtime
  install-cni      installer and node agent (the DaemonSet entrypoint)
  istio-iptables   the traffic-capture rule tool, flag-compatible with Istio's
";

mod role_alloc;

#[global_allocator]
static ALLOCATOR: role_alloc::RoleAlloc = role_alloc::RoleAlloc::new();

fn main() {
    let mut args: Vec<String> = std::env::args().collect();
    let invoked = args
        .first()
        .map(|a| {
            Path::new(a)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        })
        .unwrap_or_default();
    let first_arg = args.get(1).map(|a| a.as_bytes());
    let role = match role_alloc::role_source(invoked.as_bytes(), first_arg) {
        Some(role_alloc::RoleSource::Name) => invoked,
        Some(role_alloc::RoleSource::FirstArg) => {
            let role = args.remove(1);
            args[0] = role.clone();
            role
        }
        None => {
            if args.get(1).is_some_and(|a| a == "--version") {
                println!("istio-cni-rs {}", istio_cni::VERSION);
                return;
            }
            // Asked for: the usage and success. No role or an unknown one: a usage error.
            let asked = args.get(1).is_some_and(|a| a == "--help" || a == "-h");
            if asked {
                print!("{USAGE}");
                std::process::exit(0);
            }
            eprint!("{USAGE}");
            std::process::exit(2);
        }
    };
    let code = match role.as_str() {
        "istio-cni" => istio_cni::plugin::main(args),
        "install-cni" => istio_cni::install::main(args),
        _ => istio_cni::iptables_cmd::main(args),
    };
    std::process::exit(code);
}
