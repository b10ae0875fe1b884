//! The host facts both rule tools read, pinned per case: each run happens inside a network
//! namespace with known interface addresses (IPv6 detection) and a private mount namespace whose
//! /etc/resolv.conf is one of a few known files (DNS servers). Istio's tool has no flags for these
//! facts, so the host itself is made the same for both; the namespaces are removed on drop.
//!
//! Each run starts from an empty nftables ruleset: Istio's nftables path ignores --dry-run and
//! programs the namespace, and its `flush table` keeps the chains an earlier case made. A jump
//! to a chain Istio does not create then succeeds or fails by which cases the same worker ran
//! there before, so a namespace reused with its leftovers makes the verdict depend on scheduling.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

/// One kind of host: its interface addresses and what Istio derives from them.
pub struct HostKind {
    pub name: &'static str,
    /// `ip -n NS addr add` arguments for the veth interface (its peer has none), in order.
    pub addrs: &'static [&'static str],
    /// EnableIPv6 as Istio derives it without and with `--dual-stack`; None: no usable address.
    pub ipv6: Option<(bool, bool)>,
}

pub const HOSTS: &[HostKind] = &[
    HostKind {
        name: "v4",
        addrs: &["10.20.0.5/24"],
        ipv6: Some((false, false)),
    },
    HostKind {
        name: "v6",
        addrs: &["fd00:20::5/64"],
        ipv6: Some((true, true)),
    },
    HostKind {
        name: "dual",
        addrs: &["10.20.0.5/24", "fd00:20::5/64"],
        ipv6: Some((false, true)),
    },
    HostKind {
        // Link-local IPv4 is skipped, so the first usable address is IPv6.
        name: "ll4-v6",
        addrs: &["169.254.9.9/16", "fd00:20::5/64"],
        ipv6: Some((true, true)),
    },
    HostKind {
        name: "none",
        addrs: &[],
        ipv6: None,
    },
];

/// resolv.conf variants and the servers Istio derives from each (netip-normalised, in order).
pub const RESOLV: &[(&str, &[&str])] = &[
    ("nameserver 10.96.0.10\n", &["10.96.0.10"]),
    ("search svc.cluster.local\noptions ndots:5\n", &[]),
    (
        "nameserver 10.96.0.10\nnameserver fd00::10\nsearch default.svc.cluster.local\n",
        &["10.96.0.10", "fd00::10"],
    ),
    (
        "# comment\nnameserver ::127.0.0.53\nnameserver bogus\nnameserver 1.1.1.1\noptions ndots:5\n",
        &["::7f00:35", "1.1.1.1"],
    ),
    ("nameserver FD00::0001\n", &["fd00::1"]),
];

/// The namespaces and files of one test run: one namespace per host kind and worker, because
/// Istio's nftables path programs the namespace for real and parallel runs must not meet there.
pub struct Sandbox {
    netns: Vec<(String, File)>,
    resolv: Vec<CString>,
    pub dir: tempfile::TempDir,
    /// A private copy of our binary: the shared target/ may be relinked by another build mid-run.
    pub ours: PathBuf,
}

impl Sandbox {
    pub fn new(workers: usize) -> Sandbox {
        let dir = tempfile::tempdir().expect("temp dir");
        let ours = dir.path().join("istio-cni-rs");
        std::fs::copy(env!("CARGO_BIN_EXE_istio-cni-rs"), &ours).expect("copy our binary");
        let mut sandbox = Sandbox {
            netns: Vec::new(),
            resolv: Vec::new(),
            dir,
            ours,
        };
        // Two sandboxes of one test process must not share a namespace name.
        static SANDBOXES: AtomicUsize = AtomicUsize::new(0);
        let nth = SANDBOXES.fetch_add(1, Ordering::Relaxed);
        for (i, (text, _)) in RESOLV.iter().enumerate() {
            let path = sandbox.dir.path().join(format!("resolv-{i}.conf"));
            std::fs::write(&path, text).expect("write resolv.conf");
            sandbox.resolv.push(cstr(&path));
        }
        let kinds =
            (0..workers).flat_map(|w| HOSTS.iter().enumerate().map(move |(i, h)| (w, i, h)));
        for (w, i, host) in kinds {
            let name = format!("idiff-{}-{nth}-{w}-{i}", std::process::id());
            ip(&["netns", "add", &name]);
            // Pushed before it is configured, so a failure below still removes it on drop.
            let file = File::open(format!("/run/netns/{name}")).expect("open netns");
            sandbox.netns.push((name.clone(), file));
            ip(&["-n", &name, "link", "set", "lo", "up"]);
            if !host.addrs.is_empty() {
                // Left down: no kernel-made link-local address, so the list is exactly ours.
                ip(&[
                    "-n", &name, "link", "add", "d0", "type", "veth", "peer", "name", "d1",
                ]);
                for a in host.addrs {
                    let mut args = vec!["-n", &name, "addr", "add", a, "dev", "d0"];
                    if a.contains(':') {
                        args.push("nodad");
                    }
                    ip(&args);
                }
            }
        }
        sandbox
    }

    /// Runs `cmd` for worker `slot` inside host `host` with resolv.conf variant `resolv`, in a
    /// namespace emptied of nftables rules first (see the module doc).
    pub fn run(&self, mut cmd: Command, slot: usize, host: usize, resolv: usize) -> Output {
        let netns = self.netns[slot * HOSTS.len() + host].1.as_raw_fd();
        flush_ruleset(netns);
        let source = self.resolv[resolv].clone();
        let target = c"/etc/resolv.conf";
        // SAFETY: only async-signal-safe system calls run between fork and exec; every argument
        // was allocated before the fork.
        unsafe {
            cmd.pre_exec(move || {
                let check = |r: libc::c_int| match r {
                    0 => Ok(()),
                    _ => Err(std::io::Error::last_os_error()),
                };
                check(libc::setns(netns, libc::CLONE_NEWNET))?;
                check(libc::unshare(libc::CLONE_NEWNS))?;
                check(libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ))?;
                check(libc::mount(
                    source.as_ptr(),
                    target.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND,
                    std::ptr::null(),
                ))
            });
        }
        cmd.output().expect("run a rule tool in the sandbox")
    }
}

/// Empties the nftables ruleset of the namespace behind `netns`.
fn flush_ruleset(netns: libc::c_int) {
    let mut nft = Command::new("nft");
    nft.args(["flush", "ruleset"]).stdin(Stdio::null());
    // SAFETY: as in `run`: one system call between fork and exec.
    unsafe {
        nft.pre_exec(move || match libc::setns(netns, libc::CLONE_NEWNET) {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        });
    }
    let out = nft.output().expect("run nft flush ruleset");
    assert!(
        out.status.success(),
        "nft flush ruleset in a sandbox namespace: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        for (name, _) in self.netns.drain(..) {
            let _ = Command::new("ip").args(["netns", "del", &name]).status();
        }
    }
}

fn cstr(path: &Path) -> CString {
    CString::new(path.as_os_str().as_encoded_bytes()).expect("path without NUL")
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
