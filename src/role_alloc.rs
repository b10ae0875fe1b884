//! The allocator, chosen per role before the first allocation. The node agent (`install-cni`) is
//! long-lived and many-threaded: musl's allocator (the static binary's) serialises its threads on
//! one lock and hands memory back and forth with the kernel on every burst, so the agent uses
//! mimalloc (docs/benchmarks.md). The plugin and `istio-iptables` live a few milliseconds and
//! allocate little: they take their memory from one [`Arena`] in address order and never give it
//! back. musl's allocator spreads a process's first blocks of each size over fresh pages, and
//! mimalloc's heaps are more than such a process needs.
//!
//! mimalloc starts itself in every process through its own C constructor (its public, documented
//! behaviour); only the agent then allocates with it.
//!
//! Transparent huge pages are refused for the agent before mimalloc's first block (`prctl`, and
//! mimalloc built with `no_thp`): mimalloc asks for them by default, and a node whose THP setting
//! is `madvise` or `always` then backs its arenas with 2 MiB pages, which multiplies the agent's
//! RSS.
//!
//! The role is read from `/proc/self/cmdline` on the first allocation, with raw system calls into
//! a stack buffer (nothing may allocate yet), by the rule `main` dispatches with ([`role_source`]:
//! the name invoked under, else the first argument). The choice never changes afterwards, so every block is freed by the
//! allocator that made it. Without /proc the system allocator is used.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

const UNDECIDED: u8 = 0;
const SYSTEM: u8 = 1;
const MIMALLOC: u8 = 2;
const ARENA: u8 = 3;

pub struct RoleAlloc {
    chosen: AtomicU8,
    arena: Arena,
}

impl RoleAlloc {
    pub const fn new() -> RoleAlloc {
        RoleAlloc {
            chosen: AtomicU8::new(UNDECIDED),
            arena: Arena::new(),
        }
    }

    fn chosen(&self) -> u8 {
        match self.chosen.load(Ordering::Acquire) {
            UNDECIDED => {
                // The first allocation happens on the main thread before any other thread
                // exists; the exchange only guards against a surprise.
                let pick = match role_lifetime() {
                    Lifetime::Long => {
                        // SAFETY: a prctl with plain integer arguments; it only sets a process
                        // flag (inherited by children, harmless for the tools the agent runs).
                        unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
                        MIMALLOC
                    }
                    Lifetime::Short if self.arena.reserve() => ARENA,
                    Lifetime::Short | Lifetime::Unknown => SYSTEM,
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

// SAFETY: every call is forwarded to one allocator, the same one for the whole process (decided
// before the first block exists); the arena's blocks that outlive it (it is full) come from the
// system allocator and are told apart by address, so each block is freed by its maker.
unsafe impl GlobalAlloc for RoleAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match self.chosen() {
            MIMALLOC => unsafe { mimalloc::MiMalloc.alloc(layout) },
            ARENA => match self.arena.alloc(layout) {
                Some(p) => p,
                None => unsafe { System.alloc(layout) },
            },
            _ => unsafe { System.alloc(layout) },
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match self.chosen() {
            MIMALLOC => unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) },
            ARENA => match self.arena.alloc(layout) {
                // A block given back may be handed out again: not known to be zero.
                Some(p) => unsafe {
                    p.write_bytes(0, layout.size());
                    p
                },
                None => unsafe { System.alloc_zeroed(layout) },
            },
            _ => unsafe { System.alloc_zeroed(layout) },
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        match self.chosen() {
            MIMALLOC => unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) },
            ARENA if self.arena.owns(ptr) => self.arena.dealloc(ptr, layout),
            _ => unsafe { System.dealloc(ptr, layout) },
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        match self.chosen() {
            MIMALLOC => unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) },
            ARENA if self.arena.owns(ptr) => {
                if self.arena.resize_in_place(ptr, layout.size(), new_size) {
                    return ptr;
                }
                // SAFETY: the caller guarantees `new_size` with `layout.align()` is a valid layout.
                let new_layout =
                    unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
                let moved = match self.arena.alloc(new_layout) {
                    Some(p) => p,
                    None => unsafe { System.alloc(new_layout) },
                };
                if !moved.is_null() {
                    // SAFETY: both blocks hold at least the smaller size and do not overlap.
                    unsafe {
                        std::ptr::copy_nonoverlapping(ptr, moved, layout.size().min(new_size))
                    };
                    self.arena.dealloc(ptr, layout);
                }
                moved
            }
            _ => unsafe { System.realloc(ptr, layout, new_size) },
        }
    }
}

/// The address space a short-lived process allocates from: reserved once, never backed by memory
/// until touched (MAP_NORESERVE), handed out in address order, so the blocks of a whole CNI call
/// share a few pages. Memory is never given back, except the newest block's (freeing it, or
/// growing or shrinking it, moves the top), which is what temporary strings and growing vectors
/// need. A process that fills it goes on with the system allocator.
struct Arena {
    base: AtomicUsize,
    top: AtomicUsize,
    end: AtomicUsize,
}

/// Far more than a CNI call or an `istio-iptables` run allocates in its whole life (a few
/// hundred KiB); only what is touched costs memory.
const ARENA_BYTES: usize = 64 << 20;
/// The part of the arena backed with memory as soon as it is reserved.
const ARENA_PREFAULT: usize = 256 << 10;

impl Arena {
    const fn new() -> Arena {
        Arena {
            base: AtomicUsize::new(0),
            top: AtomicUsize::new(0),
            end: AtomicUsize::new(0),
        }
    }

    /// Maps the reservation (once, before the first block); false when the kernel refuses it.
    fn reserve(&self) -> bool {
        // SAFETY: an anonymous private mapping at an address of the kernel's choosing, and an
        // advice call on exactly that range.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                ARENA_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return false;
        }
        // SAFETY: advice on the range just mapped. A node with THP `always` would back the first
        // touch with a 2 MiB page to zero. The start is backed at once, in one call instead of a
        // page fault per page: about what a CNI call uses. A kernel before 5.14 refuses
        // MADV_POPULATE_WRITE, and the pages then come by faults as before.
        unsafe {
            libc::madvise(base, ARENA_BYTES, libc::MADV_NOHUGEPAGE);
            libc::madvise(base, ARENA_PREFAULT, libc::MADV_POPULATE_WRITE);
        }
        let base = base as usize;
        self.base.store(base, Ordering::Release);
        self.top.store(base, Ordering::Release);
        self.end.store(base + ARENA_BYTES, Ordering::Release);
        true
    }

    fn owns(&self, ptr: *mut u8) -> bool {
        let p = ptr as usize;
        p >= self.base.load(Ordering::Acquire) && p < self.end.load(Ordering::Acquire)
    }

    /// The next block at `layout`'s alignment, or `None` when the arena is full.
    fn alloc(&self, layout: Layout) -> Option<*mut u8> {
        let end = self.end.load(Ordering::Acquire);
        let mut top = self.top.load(Ordering::Acquire);
        loop {
            let start = top.checked_add(layout.align() - 1)? & !(layout.align() - 1);
            let new_top = start.checked_add(layout.size())?;
            if new_top > end {
                return None;
            }
            match self
                .top
                .compare_exchange_weak(top, new_top, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(start as *mut u8),
                Err(now) => top = now,
            }
        }
    }

    /// Gives the block back when it is the newest; older blocks stay where they are.
    fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let p = ptr as usize;
        let _ =
            self.top
                .compare_exchange(p + layout.size(), p, Ordering::AcqRel, Ordering::Relaxed);
    }

    /// Resizes the newest block where it is (and any block that shrinks); false otherwise.
    fn resize_in_place(&self, ptr: *mut u8, old: usize, new: usize) -> bool {
        let p = ptr as usize;
        let Some(new_top) = p.checked_add(new) else {
            return false;
        };
        if new_top > self.end.load(Ordering::Acquire) {
            return false;
        }
        self.top
            .compare_exchange(p + old, new_top, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
            || new <= old
    }
}

/// How long this process lives, by its role.
enum Lifetime {
    /// The node agent.
    Long,
    /// The plugin, `istio-iptables`, a usage message.
    Short,
    /// No command line to tell by (no /proc): the system allocator, which suits either.
    Unknown,
}

/// This process's [`Lifetime`], from its command line (no allocation).
fn role_lifetime() -> Lifetime {
    let mut buf = [0u8; 512];
    let len = read_cmdline(&mut buf);
    match (len, is_long_lived(&buf[..len])) {
        (0, _) => Lifetime::Unknown,
        (_, true) => Lifetime::Long,
        (_, false) => Lifetime::Short,
    }
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
    use super::{Arena, is_long_lived};
    use std::alloc::Layout;

    fn layout(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).unwrap()
    }

    #[test]
    fn the_arena_hands_out_aligned_blocks_in_address_order_and_takes_back_only_the_newest() {
        let arena = Arena::new();
        assert!(arena.reserve());
        let a = arena.alloc(layout(10, 1)).unwrap();
        let b = arena.alloc(layout(8, 8)).unwrap();
        assert_eq!(b as usize % 8, 0);
        assert!(b as usize >= a as usize + 10 && b as usize - (a as usize + 10) < 8);
        assert!(arena.owns(a) && arena.owns(b));
        assert!(!arena.owns(std::ptr::null_mut()));
        // An older block stays; the newest is given back and its place handed out again.
        arena.dealloc(a, layout(10, 1));
        let c = arena.alloc(layout(8, 8)).unwrap();
        assert!(c > b);
        arena.dealloc(c, layout(8, 8));
        assert_eq!(arena.alloc(layout(8, 8)).unwrap(), c);
    }

    #[test]
    fn the_newest_block_grows_in_place_and_any_block_shrinks_in_place() {
        let arena = Arena::new();
        assert!(arena.reserve());
        let a = arena.alloc(layout(16, 8)).unwrap();
        assert!(arena.resize_in_place(a, 16, 4096));
        let b = arena.alloc(layout(16, 8)).unwrap();
        assert!(b as usize >= a as usize + 4096);
        assert!(
            !arena.resize_in_place(a, 4096, 8192),
            "a is no longer the newest"
        );
        assert!(arena.resize_in_place(a, 4096, 100));
        // Past the end it refuses, and a full arena says so (the caller goes to the system).
        assert!(!arena.resize_in_place(b, 16, super::ARENA_BYTES));
        assert!(arena.alloc(layout(super::ARENA_BYTES, 8)).is_none());
        assert!(arena.alloc(layout(16, 8)).is_some());
    }

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
