//! The allocator, chosen per role before the first allocation. The node agent (`install-cni`) is
//! long-lived and many-threaded: musl's allocator (the static binary's) serialises its threads on
//! one lock and hands memory back and forth with the kernel on every burst; mimalloc cut the
//! agent's CPU per ambient ADD and per drift pass by a third (docs/benchmarks.md). The plugin and
//! `istio-iptables` live a few milliseconds and allocate little: there mimalloc's own start-up
//! cost more than it saved, so they keep the system allocator.
//!
//! Transparent huge pages are refused for the agent before mimalloc's first block (`prctl`, and
//! mimalloc built with `no_thp`): mimalloc asks for them by default, and a node whose THP setting
//! is `madvise` or `always` then backs its arenas with 2 MiB pages, which made the agent's RSS 68 MB
//! where it is about 15 MB without them.
//!
//! The role is read from `/proc/self/cmdline` on the first allocation, with raw system calls into
//! a stack buffer (nothing may allocate yet), by the rule `main` dispatches with ([`role_source`]:
//! the name invoked under, else the first argument). The choice never changes afterwards, so every block is freed by the
//! allocator that made it. Without /proc the system allocator is used.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU8, Ordering};

const UNDECIDED: u8 = 0;
const SYSTEM: u8 = 1;
const MIMALLOC: u8 = 2;

pub struct RoleAlloc {
    chosen: AtomicU8,
}

impl RoleAlloc {
    pub const fn new() -> RoleAlloc {
        RoleAlloc {
            chosen: AtomicU8::new(UNDECIDED),
        }
    }

    fn chosen(&self) -> u8 {
        match self.chosen.load(Ordering::Acquire) {
            UNDECIDED => {
                // The first allocation happens on the main thread before any other thread
                // exists; the exchange only guards against a surprise.
                let pick = if long_lived_role() {
                    // SAFETY: a prctl with plain integer arguments; it only sets a process flag
                    // (inherited by children, which is harmless for the tools the agent runs).
                    unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
                    MIMALLOC
                } else {
                    SYSTEM
                };
                match self.chosen.compare_exchange(
                    UNDECIDED,
                    pick,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => pick,
                    Err(already) => already,
                }
            }
            decided => decided,
        }
    }
}

impl Default for RoleAlloc {
    fn default() -> Self {
        Self::new()
    }
}

// SAFETY: every call is forwarded to one of two allocators, the same one for the whole process
// (decided before the first block exists), so each block is freed and reallocated by its maker.
unsafe impl GlobalAlloc for RoleAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if self.chosen() == MIMALLOC {
            unsafe { mimalloc::MiMalloc.alloc(layout) }
        } else {
            unsafe { System.alloc(layout) }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if self.chosen() == MIMALLOC {
            unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) }
        } else {
            unsafe { System.alloc_zeroed(layout) }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if self.chosen() == MIMALLOC {
            unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
        } else {
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if self.chosen() == MIMALLOC {
            unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) }
        } else {
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }
}

/// Whether this process is the node agent, from its command line (no allocation).
fn long_lived_role() -> bool {
    let mut buf = [0u8; 512];
    let len = read_cmdline(&mut buf);
    is_long_lived(&buf[..len])
}

/// Where the binary's role comes from (`main` dispatches by the same rule; it lives here because
/// the allocator must apply it before anything may allocate).
#[derive(Debug, PartialEq)]
pub enum RoleSource {
    /// The name the binary was invoked under (`/opt/cni/bin/istio-cni`).
    Name,
    /// The first argument: the multicall fallback `<binary> install-cni ...`.
    FirstArg,
}

/// The multicall rule: the invoked name (its last path component) if it is a role, else the first
/// argument if that is one.
pub fn role_source(name: &[u8], first_arg: Option<&[u8]>) -> Option<RoleSource> {
    const ROLES: [&[u8]; 3] = [b"istio-cni", b"install-cni", b"istio-iptables"];
    if ROLES.contains(&name) {
        Some(RoleSource::Name)
    } else if first_arg.is_some_and(|a| ROLES.contains(&a)) {
        Some(RoleSource::FirstArg)
    } else {
        None
    }
}

/// `argv` as the kernel lists it (NUL-separated), by [`role_source`].
fn is_long_lived(cmdline: &[u8]) -> bool {
    let mut args = cmdline.split(|b| *b == 0);
    let argv0 = args.next().unwrap_or_default();
    let name = argv0.rsplit(|b| *b == b'/').next().unwrap_or_default();
    let first = args.next();
    let role = match role_source(name, first) {
        Some(RoleSource::Name) => name,
        Some(RoleSource::FirstArg) => first.unwrap_or_default(),
        None => return false,
    };
    role == b"install-cni"
}

fn read_cmdline(buf: &mut [u8]) -> usize {
    // SAFETY: a NUL-terminated path, a buffer of the length given, and the fd closed once read.
    unsafe {
        let fd = libc::open(
            c"/proc/self/cmdline".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return 0;
        }
        let mut filled = 0;
        while filled < buf.len() {
            let n = libc::read(fd, buf[filled..].as_mut_ptr().cast(), buf.len() - filled);
            if n <= 0 {
                break;
            }
            filled += n as usize;
        }
        libc::close(fd);
        filled
    }
}

#[cfg(test)]
mod tests {
    use super::is_long_lived;

    #[test]
    fn only_the_node_agent_is_long_lived_by_name_or_by_subcommand() {
        assert!(is_long_lived(b"/opt/cni/bin/install-cni\0"));
        assert!(is_long_lived(b"install-cni\0--log_output_level\0debug\0"));
        assert!(is_long_lived(b"/usr/local/bin/istio-cni-rs\0install-cni\0"));
        assert!(!is_long_lived(b"/opt/cni/bin/istio-cni\0"));
        assert!(!is_long_lived(b"istio-iptables\0--redirect-port\0x\0"));
        // The name wins over the first argument, as in main.
        assert!(!is_long_lived(b"/opt/cni/bin/istio-cni\0install-cni\0"));
        assert!(!is_long_lived(b"/usr/local/bin/istio-cni-rs\0istio-cni\0"));
        assert!(!is_long_lived(b""));
    }

    #[test]
    fn the_role_is_the_name_else_the_first_argument() {
        use super::{RoleSource, role_source};
        assert_eq!(
            role_source(b"istio-cni", Some(b"install-cni")),
            Some(RoleSource::Name)
        );
        assert_eq!(
            role_source(b"istio-cni-rs", Some(b"istio-iptables")),
            Some(RoleSource::FirstArg)
        );
        assert_eq!(role_source(b"istio-cni-rs", Some(b"--version")), None);
        assert_eq!(role_source(b"istio-cni-rs", None), None);
    }
}
