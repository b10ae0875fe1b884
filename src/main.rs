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
            eprint!("{USAGE}");
            std::process::exit(
                if args.len() > 1 && args[1] != "--help" && args[1] != "-h" {
                    2
                } else {
                    0
                },
            );
        }
    };
    let code = match role.as_str() {
        "istio-cni" => istio_cni::plugin::main(args),
        "install-cni" => std::process::exit(istio_cni::install::main(args)),
        _ => istio_cni::iptables_cmd::main(args),
    };
    exit_short_lived(code);
}

/// The end of the plugin and of `istio-iptables`: what they printed is flushed, then the process
/// ends without the C library's exit handlers. The only one in this binary is mimalloc's
/// process-done (linked for the node agent, it still runs in every process), which walks its
/// heaps and arenas to free them: about 3% of a plugin ADD's CPU, for memory the kernel takes
/// back at exit anyway. Rust's own `exit` does nothing more than the flush.
fn exit_short_lived(code: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: `_exit` only ends the process; nothing of ours is left unwritten (flushed above,
    // and files are written unbuffered).
    unsafe { libc::_exit(code) }
}
