//! The image and its container through podman: `scripts/image` builds it (the test's faster
//! static profile, the Containerfile's shipping runtime stage), and a container is run the way
//! the kubelet runs the DaemonSet's: the rendered command, args, env, mounts and securityContext.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// crun fails on these machines ("cgroups in hybrid mode not supported"); setrlimit to podman's
/// defaults is refused (they are above what runc may set here), so the limits are explicit: this
/// process's open-file limit and a process limit runc is allowed to set (as scripts/image does).
fn run_opts() -> Vec<String> {
    use nix::sys::resource::{Resource, getrlimit};
    let nofile = getrlimit(Resource::RLIMIT_NOFILE).map_or(1024, |(_, hard)| hard);
    [
        "--runtime".to_string(),
        "runc".to_string(),
        "--ulimit".to_string(),
        format!("nofile={nofile}:{nofile}"),
        "--ulimit".to_string(),
        "nproc=4096:4096".to_string(),
    ]
    .into()
}

pub const TEST_IMAGE: &str = "localhost/istio-cni-rs:image-test";

fn podman(args: &[&str]) -> Output {
    Command::new("podman")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("podman {args:?}: {e} (scripts/deps-image installs podman)"))
}

fn checked(args: &[&str]) -> String {
    let out = podman(args);
    assert!(
        out.status.success(),
        "podman {args:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// What building took.
pub struct Built {
    pub image: String,
    pub took: Duration,
    pub size_bytes: u64,
}

/// Builds the image with `scripts/image` (which installs podman, runc and mmdebstrap when
/// missing, and reuses the cached base) around the `static-test` profile.
pub fn build() -> Built {
    let t0 = Instant::now();
    // A clean environment, as from a shell: cargo's variables for this test would make the
    // static build's build scripts rerun and rebuild half the dependency graph.
    let keep = ["PATH", "HOME", "CARGO_HOME", "RUSTUP_HOME", "TMPDIR"];
    let out = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/image"))
        .env_clear()
        .envs(std::env::vars().filter(|(k, _)| keep.contains(&k.as_str())))
        .env("STATIC_PROFILE", "static-test")
        .env("IMAGE", TEST_IMAGE)
        // The host's architecture alone: tests/arm64_qemu.rs builds and runs the arm64 image.
        .env("PLATFORMS", "amd64")
        .output()
        .expect("run scripts/image");
    assert!(
        out.status.success(),
        "scripts/image failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let took = t0.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let image = stdout.lines().last().expect("the image reference").trim();
    assert_eq!(image, TEST_IMAGE);
    let size_bytes = checked(&["image", "inspect", "--format", "{{.Size}}", image])
        .parse()
        .expect("image size");
    Built {
        image: image.to_string(),
        took,
        size_bytes,
    }
}

/// Runs `script` with `sh -c` in a throwaway container of `image`; returns its stdout.
pub fn run_sh(image: &str, script: &str) -> String {
    let opts = run_opts();
    let mut args = vec!["run", "--rm"];
    args.extend(opts.iter().map(String::as_str));
    args.extend([
        "--network",
        "none",
        "--entrypoint",
        "/bin/sh",
        image,
        "-c",
        script,
    ]);
    checked(&args)
}

/// One container mount: host path, container path, and the options (`ro`, `rslave`).
pub struct Mount {
    pub host: String,
    pub container: String,
    pub read_only: bool,
    pub host_to_container: bool,
}

/// How to run the container, from the rendered DaemonSet.
pub struct Spec<'a> {
    pub image: &'a str,
    pub netns: &'a Path,
    pub command: Vec<String>,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub mounts: Vec<Mount>,
    pub cap_add: Vec<String>,
    pub cap_drop_all: bool,
    pub user: String,
}

/// A running container, removed on drop.
pub struct Container {
    pub name: String,
}

impl Container {
    pub fn start(spec: &Spec) -> Container {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let name = format!("icrs-image-{}-{nanos}", std::process::id());
        let netns = format!("ns:{}", spec.netns.display());
        let mut args: Vec<String> = ["run", "--detach", "--name", &name, "--network", &netns]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(run_opts());
        // What the kubelet gives a pod that sets no profile: seccomp and AppArmor unconfined (the
        // chart asks for AppArmor unconfined explicitly).
        for opt in ["seccomp=unconfined", "apparmor=unconfined"] {
            args.extend(["--security-opt".to_string(), opt.to_string()]);
        }
        args.extend(["--user".to_string(), spec.user.clone()]);
        if spec.cap_drop_all {
            args.extend(["--cap-drop".to_string(), "ALL".to_string()]);
        }
        for cap in &spec.cap_add {
            args.extend(["--cap-add".to_string(), cap.clone()]);
        }
        for (k, v) in &spec.env {
            args.extend(["--env".to_string(), format!("{k}={v}")]);
        }
        for m in &spec.mounts {
            let mut opts = vec![if m.read_only { "ro" } else { "rw" }];
            if m.host_to_container {
                opts.push("rslave");
            }
            args.extend([
                "--volume".to_string(),
                format!("{}:{}:{}", m.host, m.container, opts.join(",")),
            ]);
        }
        // The kubelet: `command` replaces the image's ENTRYPOINT, `args` its CMD.
        let command = serde_json::to_string(&spec.command).expect("command JSON");
        args.extend(["--entrypoint".to_string(), command, spec.image.to_string()]);
        args.extend(spec.args.iter().cloned());
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        checked(&refs);
        Container { name }
    }

    pub fn logs(&self) -> String {
        let out = podman(&["logs", &self.name]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// `(running, exit code)`.
    pub fn state(&self) -> (bool, i64) {
        let s = checked(&[
            "inspect",
            "--format",
            "{{.State.Running}} {{.State.ExitCode}}",
            &self.name,
        ]);
        let mut it = s.split_whitespace();
        let running = it.next() == Some("true");
        let code = it.next().and_then(|c| c.parse().ok()).unwrap_or(-1);
        (running, code)
    }

    /// SIGTERM (as the kubelet sends on pod deletion), then waits up to `grace`; the exit code.
    pub fn stop(&self, grace: Duration) -> i64 {
        let secs = grace.as_secs().to_string();
        checked(&["stop", "--time", &secs, &self.name]);
        self.state().1
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman(&["rm", "--force", "--time", "2", &self.name]);
    }
}
