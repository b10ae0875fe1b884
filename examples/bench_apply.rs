//! Benchmark: applying Istio's default sidecar rules in a fresh network namespace with our
//! `istio-iptables` vs a bare `iptables-restore --noflush` of the same text, measured side by side
//! (alternating) in one run; plus the dry-run wall time. Prints a Markdown fragment.
//!
//! Usage (root): bench_apply <path to istio-cni-rs> [iterations]

use std::fs::File;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sched::{CloneFlags, setns};

use istio_cni::iptables_cmd::INJECTOR_DEFAULT_ARGS as INIT_ARGS;

#[path = "support/mod.rs"]
mod support;

fn ip(args: &[&str]) {
    let ok = Command::new("ip")
        .args(args)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "ip {args:?} failed");
}

/// CPU time (user + system) used so far by waited-for children of this process.
fn children_cpu() -> Duration {
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
        .expect("getrusage");
    let tv =
        |t: nix::sys::time::TimeVal| Duration::new(t.tv_sec() as u64, t.tv_usec() as u32 * 1000);
    tv(usage.user_time()) + tv(usage.system_time())
}

/// Wall time and CPU time of one run.
type Sample = (Duration, Duration);

/// Deletes the named netns when dropped, also when a run panics.
struct NetnsGuard(String);

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// Runs `cmd` with the calling thread moved into a fresh netns; returns wall and CPU time.
fn time_in_fresh_netns(name: &str, mut cmd: Command, stdin: Option<&str>) -> Sample {
    ip(&["netns", "add", name]);
    let _guard = NetnsGuard(name.to_string());
    let file = File::open(format!("/var/run/netns/{name}")).expect("open netns");
    let stdin = stdin.map(str::to_string);
    std::thread::spawn(move || {
        setns(&file, CloneFlags::CLONE_NEWNET).expect("setns");
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        if stdin.is_some() {
            cmd.stdin(Stdio::piped());
        }
        let cpu_before = children_cpu();
        let start = Instant::now();
        let mut child = cmd.spawn().expect("spawn");
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(text.as_bytes()).expect("write stdin");
        }
        let status = child.wait().expect("wait");
        let elapsed = start.elapsed();
        assert!(status.success(), "benchmarked command failed");
        (elapsed, children_cpu() - cpu_before)
    })
    .join()
    .expect("bench thread")
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn main() {
    let (binary, iterations) = support::bench_args("bench_apply <binary> [iterations]", 30);

    // The restore text our tool applies: the transcript's lines between the saves.
    let dry = Command::new(&binary)
        .arg("istio-iptables")
        .args(INIT_ARGS)
        .args(["--dry-run", "--ipv6=false"])
        .output()
        .expect("dry run");
    let transcript = String::from_utf8_lossy(&dry.stdout).to_string();
    let restore: String = transcript
        .lines()
        .filter(|l| !l.ends_with("-save"))
        .map(|l| format!("{l}\n"))
        .collect();

    let mut ours = Vec::new();
    let mut ours_via_restore = Vec::new();
    let mut bare = Vec::new();
    let mut dry_runs = Vec::new();
    for i in 0..iterations {
        let name = format!("bench-{}-{i}", std::process::id());
        // Alternate which goes first so drift on a noisy machine hits both equally.
        // `restore_only`: the opt-out, the same run made to go through iptables-restore.
        let run_ours = |n: &str, restore_only: bool| {
            let mut c = Command::new(&binary);
            // A fresh netns has no pod address to detect the IP family from: pin it.
            c.arg("istio-iptables").args(INIT_ARGS).arg("--ipv6=false");
            if restore_only {
                c.env("ISTIO_IPTABLES_RESTORE_ONLY", "true");
            }
            time_in_fresh_netns(n, c, None)
        };
        let run_bare = |n: &str| {
            let mut c = Command::new("iptables-restore");
            c.arg("--noflush");
            time_in_fresh_netns(n, c, Some(&restore))
        };
        if i % 2 == 0 {
            ours.push(run_ours(&format!("{name}a"), false));
            bare.push(run_bare(&format!("{name}b")));
            ours_via_restore.push(run_ours(&format!("{name}c"), true));
        } else {
            ours_via_restore.push(run_ours(&format!("{name}c"), true));
            bare.push(run_bare(&format!("{name}b")));
            ours.push(run_ours(&format!("{name}a"), false));
        }
        let start = Instant::now();
        let ok = Command::new(&binary)
            .arg("istio-iptables")
            .args(INIT_ARGS)
            .args(["--dry-run", "--ipv6=false"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "dry run failed");
        dry_runs.push(start.elapsed());
    }
    let wall = |v: &[Sample]| median(v.iter().map(|s| s.0).collect());
    let cpu = |v: &[Sample]| median(v.iter().map(|s| s.1).collect());
    let (w_ours, w_bare, c_ours, c_bare) = (wall(&ours), wall(&bare), cpu(&ours), cpu(&bare));
    let m_dry = median(dry_runs);
    println!(
        "| measurement (median of {iterations}) | ours | bare `iptables-restore` | ratio (target <= 1.1) |"
    );
    println!("| --- | --- | --- | --- |");
    println!(
        "| apply of the default rules in a fresh netns (rules over netlink), wall time | {} | {} | {:.2} |",
        ms(w_ours),
        ms(w_bare),
        w_ours.as_secs_f64() / w_bare.as_secs_f64()
    );
    println!(
        "| same, CPU time of the process tree (robust to a busy machine) | {} | {} | {:.2} |",
        ms(c_ours),
        ms(c_bare),
        c_ours.as_secs_f64() / c_bare.as_secs_f64()
    );
    let w_restore = wall(&ours_via_restore);
    println!(
        "| same with `ISTIO_IPTABLES_RESTORE_ONLY=true` (through iptables-restore), wall time | {} | {} | {:.2} |",
        ms(w_restore),
        ms(w_bare),
        w_restore.as_secs_f64() / w_bare.as_secs_f64()
    );
    println!();
    println!("| measurement (median of {iterations}) | value |");
    println!("| --- | --- |");
    println!("| `istio-iptables --dry-run` wall time | {} |", ms(m_dry));
}
