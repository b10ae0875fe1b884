//! Istio's logging defaults and its accepted-but-unused settings: install-cni logs to stdout
//! unless told otherwise (as Istio's agent: a platform that files stderr lines as errors must not
//! see every info line as one), and each setting it accepts without giving it an effect is named
//! once at start as ignored.

#[path = "install_support.rs"]
mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::*;

/// Runs install-cni with `env` and `args` until it is listening, then stops it; its (stdout,
/// stderr) lines.
fn run_split(env: &[(String, String)], args: &[&str]) -> (Vec<String>, Vec<String>) {
    let mut child = Command::new(bin())
        .arg("install-cni")
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn install-cni");
    let collect = |stream: Box<dyn std::io::Read + Send>| {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                sink.lock().expect("lines").push(line);
            }
        });
        (lines, reader)
    };
    let (out, out_reader) = collect(Box::new(child.stdout.take().expect("stdout")));
    let (err, err_reader) = collect(Box::new(child.stderr.take().expect("stderr")));
    let listening = wait_for(Duration::from_secs(30), || {
        let out = out.lock().expect("lines");
        let err = err.lock().expect("lines");
        out.iter()
            .chain(err.iter())
            .any(|l| l.contains("istio-cni is installed"))
            .then_some(())
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("kill");
    let status = child.wait().expect("wait");
    out_reader.join().expect("stdout reader");
    err_reader.join().expect("stderr reader");
    let (out, err) = (
        out.lock().expect("lines").clone(),
        err.lock().expect("lines").clone(),
    );
    assert!(listening.is_some(), "never installed:\n{out:?}\n{err:?}");
    assert!(status.success(), "{status:?}\n{out:?}\n{err:?}");
    (out, err)
}

#[test]
fn logs_go_to_stdout_by_default_and_to_stderr_when_asked() {
    let d = Dirs::new();
    d.put("10-list.conflist", &testdata("list.conflist"));
    let (out, err) = run_split(&d.base_env(), &[]);
    assert!(
        out.iter()
            .any(|l| l.contains("\tinfo\tcni-agent\tstarting install-cni")),
        "{out:?}"
    );
    // Nothing at all on stderr on a clean start, not even a bare newline from the allocator.
    assert!(err.is_empty(), "lines on stderr by default: {err:?}");

    let d = Dirs::new();
    d.put("10-list.conflist", &testdata("list.conflist"));
    let (out, err) = run_split(&d.base_env(), &["--log_target=stderr"]);
    assert!(out.iter().all(String::is_empty), "{out:?}");
    assert!(
        err.iter().any(|l| l.contains("starting install-cni")),
        "{err:?}"
    );
}

/// Every setting install-cni accepts for Istio's sake without an effect here.
/// Given in Istio's underscore spelling; named in the dash spelling of our `--help`.
const IGNORED: [(&str, &str); 5] = [
    ("--log_stacktrace_level", "error"),
    ("--log_caller", "default"),
    ("--ctrlz_port", "9876"),
    ("--ctrlz_address", "localhost"),
    ("--log_level", "info"),
];

#[test]
fn each_accepted_setting_without_an_effect_is_named_once_at_start() {
    let d = Dirs::new();
    d.put("10-list.conflist", &testdata("list.conflist"));
    let args: Vec<String> = IGNORED.iter().map(|(f, v)| format!("{f}={v}")).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (out, _) = run_split(&d.base_env(), &args);
    for (flag, _) in IGNORED {
        let flag = flag.replace('_', "-");
        let named: Vec<&String> = out
            .iter()
            .filter(|l| l.contains("\twarn\t") && l.contains(&format!("{flag} is accepted")))
            .collect();
        assert_eq!(named.len(), 1, "{flag}: {named:?}\n{out:?}");
        assert!(named[0].contains("ignored"), "{}", named[0]);
    }
    // Set through the environment, the variable is named.
    let d = Dirs::new();
    d.put("10-list.conflist", &testdata("list.conflist"));
    let mut env = d.base_env();
    env.push(("CTRLZ_ADDRESS".into(), "0.0.0.0".into()));
    let (out, _) = run_split(&env, &[]);
    assert!(
        out.iter()
            .any(|l| l.contains("CTRLZ_ADDRESS is accepted for compatibility and ignored")),
        "{out:?}"
    );
}

/// The backups of `<dir>/agent.log`, sorted (oldest first: the time is in the name).
fn backups(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("log dir")
        .map(|e| e.expect("entry").file_name().into_string().expect("name"))
        .filter(|n| n.starts_with("agent-") && n.ends_with(".log"))
        .collect();
    names.sort();
    names
}

#[test]
fn log_rotate_gets_every_record_and_rotates_past_its_size_keeping_the_backup_count() {
    let d = Dirs::new();
    d.put("10-list.conflist", &testdata("list.conflist"));
    let logs = tempfile::tempdir().expect("log dir");
    let path = logs.path().join("agent.log");
    // Three old backups, and a current file already at the 1 MB limit: the first record rotates
    // it, and two backups are kept (the oldest go).
    for stamp in [
        "2026-01-01T00-00-00.000",
        "2026-01-02T00-00-00.000",
        "2026-01-03T00-00-00.000",
    ] {
        std::fs::write(logs.path().join(format!("agent-{stamp}.log")), "old\n").expect("backup");
    }
    let full = vec![b'x'; 1 << 20];
    std::fs::write(&path, &full).expect("full log");
    let args = [
        format!("--log_rotate={}", path.display()),
        "--log_rotate_max_size=1".to_string(),
        "--log_rotate_max_backups=2".to_string(),
        // Backups dated 2026-01 are within a year: the age limit keeps them.
        "--log_rotate_max_age=3650".to_string(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (out, err) = run_split(&d.base_env(), &args);
    assert!(err.is_empty(), "{err:?}");
    // The target still gets every record; the rotating file gets them too.
    assert!(
        out.iter().any(|l| l.contains("starting install-cni")),
        "{out:?}"
    );
    let current = std::fs::read_to_string(&path).expect("current log");
    assert!(
        current.contains("\tinfo\tcni-agent\tstarting install-cni"),
        "{current}"
    );
    assert!(
        !current.contains("xxxx"),
        "the full file was not rotated away"
    );
    let kept = backups(logs.path());
    assert_eq!(kept.len(), 2, "{kept:?}");
    assert_eq!(kept[0], "agent-2026-01-03T00-00-00.000.log", "{kept:?}");
    let rotated = std::fs::read(logs.path().join(&kept[1])).expect("rotated");
    assert_eq!(rotated, full, "the rotated backup holds the full file");
    for (flag, _) in [("--log_rotate", ""), ("--log_rotate_max_size", "")] {
        let flag = flag.replace('_', "-");
        assert!(
            !out.iter()
                .any(|l| l.contains(&format!("{flag} is accepted"))),
            "{flag} is honoured, not ignored: {out:?}"
        );
    }
}
