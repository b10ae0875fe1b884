//! The arm64 build, run under qemu-user on this amd64 machine: the static binary cross-built for
//! `aarch64-unknown-linux-musl` (scripts/build-static `STATIC_ARCH=arm64`, the faster
//! `static-test` profile of the same code, as the image test uses) answers `--version` in every
//! role it is started as (argv[0] symlinks, as the image and the node name it), and its
//! `istio-iptables --dry-run` over Istio's capture goldens and its plugin dry run (`ADD` with
//! `$DRY_RUN_FILE_PATH`) are byte for byte what the amd64 binary gives. Then the arm64 image
//! (scripts/image `PLATFORMS=arm64`, the base made by `mmdebstrap --arch arm64`) is run under
//! emulation: its layout, and `install-cni --version` as its entrypoint.
//!
//! Needs root, the rust target, Debian's aarch64 cross gcc, qemu-user-static, binfmt_misc and
//! podman (scripts/deps-image installs and registers them); a missing one fails naming it.

mod cni_driver;

#[path = "support/cases.rs"]
mod cases;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use cases::{case_args, case_env, cases_under, testdata};
use cni_driver::{FakeApiServer, Run, cni_env, plugin_conf, run_cni, sidecar_pod};
use serde_json::{Value, json};

const QEMU: &str = "qemu-aarch64-static";
const ROLES: [&str; 3] = ["istio-cni", "install-cni", "istio-iptables"];
const ARM64_IMAGE: &str = "localhost/istio-cni-rs:arm64-test";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// One of the repository's scripts with a clean environment, as from a shell: cargo's variables
/// for this test would make the static build's build scripts rerun.
fn script(name: &str, env: &[(&str, &str)]) -> Output {
    let keep = ["PATH", "HOME", "CARGO_HOME", "RUSTUP_HOME", "TMPDIR"];
    Command::new(repo().join("scripts").join(name))
        .env_clear()
        .envs(std::env::vars().filter(|(k, _)| keep.contains(&k.as_str())))
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("run scripts/{name}: {e}"))
}

/// The cross-built binary and a directory of role symlinks to it; built once per test binary.
struct Arm64 {
    roles: tempfile::TempDir,
}

impl Arm64 {
    fn role(&self, role: &str) -> PathBuf {
        self.roles.path().join(role)
    }
}

/// The build, once per test binary: a failed one is reported by every test that needs it,
/// without building again.
fn arm64() -> &'static Arm64 {
    static BUILT: OnceLock<Result<Arm64, String>> = OnceLock::new();
    match BUILT.get_or_init(build_arm64) {
        Ok(built) => built,
        Err(why) => panic!("{why}"),
    }
}

fn build_arm64() -> Result<Arm64, String> {
    cni_driver::require_tool(QEMU, "qemu-user-static");
    let t0 = std::time::Instant::now();
    let out = script(
        "build-static",
        &[("STATIC_ARCH", "arm64"), ("STATIC_PROFILE", "static-test")],
    );
    if !out.status.success() {
        return Err(format!(
            "scripts/build-static STATIC_ARCH=arm64 failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    eprintln!("arm64 static-test build: {:?}", t0.elapsed());
    let bin = repo().join("target/static/istio-cni-rs-static-test-arm64");
    if elf_machine(&bin) != 0xb7 {
        return Err(format!("{} is not an aarch64 ELF", bin.display()));
    }
    let roles = tempfile::tempdir().expect("temp dir");
    for role in ROLES {
        std::os::unix::fs::symlink(&bin, roles.path().join(role)).expect("role symlink");
    }
    Ok(Arm64 { roles })
}

/// The ELF header's e_machine (0xb7 is aarch64, 0x3e x86-64).
fn elf_machine(path: &Path) -> u16 {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        bytes.starts_with(b"\x7fELF"),
        "{} is not ELF",
        path.display()
    );
    u16::from_le_bytes([bytes[18], bytes[19]])
}

/// The amd64 binary cargo built for the tests, started with the role as its first argument.
fn amd64(role: &str) -> Command {
    let mut cmd = Command::new(cni_driver::binary());
    cmd.arg(role);
    cmd
}

/// The arm64 binary under qemu-user, started by the role's name (qemu passes it as argv[0]).
fn arm64_cmd(role: &str) -> Command {
    let mut cmd = Command::new(QEMU);
    cmd.arg(arm64().role(role));
    cmd
}

fn output(mut cmd: Command, what: &str) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"))
}

#[test]
fn every_role_answers_version_on_arm64() {
    assert_eq!(
        elf_machine(&cni_driver::binary()),
        0x3e,
        "the reference build is amd64"
    );
    for role in ROLES {
        let mut cmd = arm64_cmd(role);
        cmd.arg("--version");
        let got = output(cmd, role);
        let mut cmd = amd64(role);
        cmd.arg("--version");
        let want = output(cmd, role);
        // The plugin prints its version on stderr (as CNI plugins do), the other roles on stdout.
        let text = |o: &Output| {
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
        };
        assert!(
            got.status.success(),
            "arm64 {role} --version: {}\n{}",
            got.status,
            text(&got)
        );
        assert!(
            text(&got).contains(&format!(" {}", env!("CARGO_PKG_VERSION"))),
            "arm64 {role} --version names no version: {}",
            text(&got)
        );
        assert_eq!(
            (got.stdout, got.stderr),
            (want.stdout, want.stderr),
            "{role} --version: arm64 and amd64 differ"
        );
    }
}

/// One case of Istio's capture goldens through both binaries; a difference, described.
fn compare_capture_case(case: &Value) -> Option<String> {
    let golden = case["golden"].as_str().unwrap_or_default();
    let args = case_args(case);
    let run = |mut cmd: Command| {
        cmd.args(&args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(case_env(case));
        output(cmd, golden)
    };
    let want = run(amd64("istio-iptables"));
    let got = run(arm64_cmd("istio-iptables"));
    let golden_text = std::fs::read_to_string(testdata().join(golden)).expect("golden file");
    let text = String::from_utf8_lossy(&got.stdout);
    if got.status.code() != want.status.code() || got.stdout != want.stdout {
        return Some(format!(
            "case {golden}: arm64 exit {:?}, amd64 exit {:?}\n--- arm64 stdout\n{text}\n--- amd64 stdout\n{}\n--- arm64 stderr\n{}",
            got.status.code(),
            want.status.code(),
            String::from_utf8_lossy(&want.stdout),
            String::from_utf8_lossy(&got.stderr)
        ));
    }
    // The goldens hold the amd64 output already (tests/golden_capture.rs); this keeps the
    // comparison from passing on two equally empty outputs.
    (!got.status.success() || text.trim() != golden_text.trim())
        .then(|| format!("case {golden}: arm64 output is not Istio's golden:\n{text}"))
}

#[test]
fn istio_iptables_dry_run_is_byte_identical_on_arm64() {
    let mut ran = 0;
    let mut failures = Vec::new();
    for prefix in [
        "tools/istio-iptables/pkg/capture/testdata/",
        "tools/istio-nftables/pkg/capture/testdata/",
    ] {
        for case in &cases_under(prefix) {
            ran += 1;
            failures.extend(compare_capture_case(case));
        }
    }
    assert!(
        ran >= 29,
        "expected Istio's iptables and nftables capture cases, ran {ran}"
    );
    assert!(
        failures.is_empty(),
        "{} of {ran} cases differ on arm64:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// One plugin ADD in dry-run mode: the result, and the rules it would have written.
fn plugin_dry_run(executable: &Path, args0: &[&str], pod: &Value, nft: bool) -> (Run, Vec<u8>) {
    let api = FakeApiServer::start();
    api.put_pod(pod.clone());
    let run_dir = tempfile::tempdir().expect("temp dir");
    api.write_kubeconfig(run_dir.path());
    let out = run_dir.path().join("dry-run.txt");
    // A dry run only reads the netns path; Istio's own harness passes one that does not exist.
    let mut env = cni_env("ADD", "/var/run/netns/does-not-exist", "testNS", "testPod");
    env.push(("DRY_RUN_FILE_PATH", out.display().to_string()));
    let mut conf = plugin_conf("1.0.0", run_dir.path(), true);
    conf["native_nftables"] = json!(nft);
    let run = run_cni(executable, args0, &env, &conf.to_string());
    let rules = std::fs::read(&out).unwrap_or_default();
    (run, rules)
}

#[test]
fn plugin_dry_run_is_byte_identical_on_arm64() {
    let pods = [
        ("basic", json!({}), json!([]), json!({})),
        ("basic-nftables", json!({}), json!([]), json!({})),
        (
            "include-exclude",
            json!({
                "traffic.sidecar.istio.io/includeOutboundIPRanges": "127.0.0.0/8",
                "traffic.sidecar.istio.io/excludeOutboundIPRanges": "10.0.0.0/8",
                "traffic.sidecar.istio.io/includeInboundPorts": "1111,2222",
                "traffic.sidecar.istio.io/excludeInboundPorts": "3333,4444",
                "traffic.sidecar.istio.io/excludeOutboundPorts": "5555,6666"
            }),
            json!([]),
            json!({}),
        ),
        (
            "dns",
            json!({}),
            json!([{"name": "ISTIO_META_DNS_CAPTURE", "value": "true"}]),
            json!({}),
        ),
        (
            "custom-uid",
            json!({}),
            json!([]),
            json!({"runAsUser": 1000670000, "runAsGroup": 1000670001}),
        ),
    ];
    let arm = arm64().role("istio-cni");
    let arm = arm.display().to_string();
    for (name, annotations, proxy_env, security) in pods {
        let pod = sidecar_pod("testNS", "testPod", annotations, proxy_env, security);
        let nft = name.ends_with("nftables");
        let (want, want_rules) = plugin_dry_run(&cni_driver::binary(), &["istio-cni"], &pod, nft);
        let (got, got_rules) = plugin_dry_run(Path::new(QEMU), &[&arm], &pod, nft);
        assert_eq!(
            want.code, 0,
            "{name}: amd64 ADD failed: {}\n{}",
            want.stdout, want.stderr
        );
        assert_eq!(
            got.code, 0,
            "{name}: arm64 ADD failed: {}\n{}",
            got.stdout, got.stderr
        );
        assert_eq!(got.stdout, want.stdout, "{name}: the ADD results differ");
        let text = String::from_utf8_lossy(&got_rules);
        assert!(
            text.contains(if nft { "table inet" } else { "COMMIT" }),
            "{name}: no rules in the arm64 dry run: {text}"
        );
        pretty_assertions::assert_eq!(
            text,
            String::from_utf8_lossy(&want_rules),
            "{name}: the dry-run rules differ"
        );
    }
}

fn podman(args: &[&str]) -> String {
    let out = Command::new("podman")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("podman {args:?}: {e} (scripts/deps-image installs podman)"));
    assert!(
        out.status.success(),
        "podman {args:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Runs the arm64 image (runc and explicit limits: see tests/image_daemonset/podman.rs).
fn run_arm64_image(entrypoint: &str, args: &[&str]) -> String {
    use nix::sys::resource::{Resource, getrlimit};
    let nofile = getrlimit(Resource::RLIMIT_NOFILE).map_or(1024, |(_, hard)| hard);
    let nofile = format!("nofile={nofile}:{nofile}");
    let mut argv = vec!["run", "--rm", "--arch", "arm64", "--runtime", "runc"];
    argv.extend([
        "--ulimit",
        &nofile,
        "--ulimit",
        "nproc=4096:4096",
        "--network",
        "none",
    ]);
    argv.extend(["--entrypoint", entrypoint, ARM64_IMAGE]);
    argv.extend(args);
    podman(&argv)
}

#[test]
fn the_arm64_image_runs_install_cni_under_emulation() {
    cni_driver::require_root();
    arm64();
    assert!(
        Path::new("/proc/sys/fs/binfmt_misc/qemu-aarch64").exists(),
        "arm64 programs cannot run here: no qemu-aarch64 in binfmt_misc (run scripts/deps-image, \
         or apt-get install qemu-user-static binfmt-support)"
    );
    let t0 = std::time::Instant::now();
    let out = script(
        "image",
        &[
            ("PLATFORMS", "arm64"),
            ("STATIC_PROFILE", "static-test"),
            ("IMAGE", ARM64_IMAGE),
        ],
    );
    assert!(
        out.status.success(),
        "scripts/image PLATFORMS=arm64 failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("arm64 image built in {:?}", t0.elapsed());
    let arch = podman(&[
        "image",
        "inspect",
        "--format",
        "{{.Os}}/{{.Architecture}}",
        ARM64_IMAGE,
    ]);
    assert_eq!(arch, "linux/arm64");
    let layout = run_arm64_image(
        "/bin/sh",
        &[
            "-c",
            "uname -m; command -v install-cni; readlink -f /opt/cni/bin/istio-cni; \
             for t in iptables-legacy-restore iptables-nft-restore ip6tables-legacy-restore ipset ip; \
             do command -v $t >/dev/null || echo missing $t; done; \
             command -v nft >/dev/null && echo nft is in the image; true",
        ],
    );
    assert_eq!(
        layout, "aarch64\n/usr/local/bin/install-cni\n/usr/local/bin/install-cni",
        "the arm64 image's layout"
    );
    let version = run_arm64_image("/usr/local/bin/install-cni", &["--version"]);
    assert_eq!(
        version,
        format!("install-cni (istio-cni-rs) {}", env!("CARGO_PKG_VERSION"))
    );
}
