//! Settings that parse but can never work (issue 20 §9), run through the real binary: install-cni
//! exits 1 before it touches anything, naming the setting and the value; the CNI config, the
//! binary dirs, the run dir and the log file are left exactly as they were.

#[path = "install_support.rs"]
mod support;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use support::*;

const T: Duration = Duration::from_secs(20);

/// Extra env, args, the setting the error must name, the value it must repeat.
type Case<'a> = (Vec<(&'a str, &'a str)>, Vec<&'a str>, &'a str, &'a str);

/// Every file under `dir` with its mode and content (empty when `dir` does not exist).
fn snapshot(dir: &Path) -> Vec<(String, u32, Vec<u8>)> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let meta = e.metadata().expect("metadata");
        let content = if meta.is_file() {
            fs::read(e.path()).expect("read")
        } else {
            Vec::new()
        };
        out.push((
            e.file_name().to_string_lossy().into_owned(),
            meta.permissions().mode(),
            content,
        ));
    }
    out.sort();
    out
}

#[test]
fn settings_that_can_never_work_stop_install_cni_before_it_touches_anything() {
    let long_run_dir = format!("/tmp/{}", "r".repeat(92));
    let cases: Vec<Case> = vec![
        (
            vec![("HOST_PROBE_SNAT_IP", "fd00::1")],
            vec![],
            "env HOST_PROBE_SNAT_IP",
            "fd00::1",
        ),
        (
            vec![("HOST_PROBE_SNAT_IPV6", "10.0.0.1")],
            vec![],
            "env HOST_PROBE_SNAT_IPV6",
            "10.0.0.1",
        ),
        (
            vec![("HOST_PROBE_SNAT_IP", "0.0.0.0")],
            vec![],
            "env HOST_PROBE_SNAT_IP",
            "0.0.0.0",
        ),
        (
            vec![("HOST_PROBE_SNAT_IPV6", "::")],
            vec![],
            "env HOST_PROBE_SNAT_IPV6",
            "::",
        ),
        (
            vec![("CNI_AGENT_RUN_DIR", long_run_dir.as_str())],
            vec![],
            "env CNI_AGENT_RUN_DIR",
            long_run_dir.as_str(),
        ),
        (
            vec![("KUBECONFIG_MODE", "0800")],
            vec![],
            "env KUBECONFIG_MODE",
            "0800",
        ),
        (
            vec![],
            vec!["--kubeconfig-mode=rw-r--r--"],
            "--kubeconfig-mode",
            "rw-r--r--",
        ),
        (
            vec![("AMBIENT_ENABLED", "maybe")],
            vec![],
            "env AMBIENT_ENABLED",
            "maybe",
        ),
        (
            vec![("REPAIR_INIT_CONTAINER_EXIT_CODE", "256")],
            vec![],
            "env REPAIR_INIT_CONTAINER_EXIT_CODE",
            "256",
        ),
        (
            vec![("REPAIR_BROKEN_POD_LABEL_KEY", "cni.istio.io/a/b")],
            vec![],
            "env REPAIR_BROKEN_POD_LABEL_KEY",
            "cni.istio.io/a/b",
        ),
        (
            vec![("REPAIR_BROKEN_POD_LABEL_VALUE", "yes please")],
            vec![],
            "env REPAIR_BROKEN_POD_LABEL_VALUE",
            "yes please",
        ),
        (
            vec![("REPAIR_SIDECAR_ANNOTATION", "Sidecar.Istio.io/status")],
            vec![],
            "env REPAIR_SIDECAR_ANNOTATION",
            "Sidecar.Istio.io/status",
        ),
        (
            vec![("SYSTEM_NAMESPACE", "Istio_System")],
            vec![],
            "env SYSTEM_NAMESPACE",
            "Istio_System",
        ),
        // HOST_PROC_DIR is a directory, not a procfs; checked because ambient reads pods' netns there.
        (
            vec![
                ("AMBIENT_ENABLED", "true"),
                ("NODE_NAME", "node-1"),
                ("HOST_PROC_DIR", "/tmp"),
            ],
            vec![],
            "env HOST_PROC_DIR",
            "/tmp",
        ),
    ];
    for (env_extra, args, name, value) in cases {
        let d = Dirs::new();
        d.put("10-list.conflist", &testdata("list.conflist"));
        let log_file = d.tmp.path().join("install-cni.log");
        let mut env = d.base_env();
        env.retain(|(k, _)| !env_extra.iter().any(|(e, _)| e == k));
        env.push(("LOG_TARGET".into(), log_file.display().to_string()));
        env.extend(
            env_extra
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string())),
        );
        let (net, bin) = (snapshot(&d.net), snapshot(&d.bin));
        let mut agent = start(&env, &args);
        let status = agent.wait(T);
        let out = agent.output();
        assert_eq!(status.code(), Some(1), "{name}={value:?} accepted:\n{out}");
        assert!(
            out.contains(name) && out.contains(&format!("{value:?}")),
            "{name}={value:?}: the message names neither:\n{out}"
        );
        assert_eq!(snapshot(&d.net), net, "{name}: the CNI config changed");
        assert_eq!(snapshot(&d.bin), bin, "{name}: a binary was installed");
        assert!(!d.run.exists(), "{name}: the run dir was created");
        assert!(!log_file.exists(), "{name}: the log file was written");
        if name == "env CNI_AGENT_RUN_DIR" {
            assert!(
                !Path::new(value).exists(),
                "{name}: the long run dir was created"
            );
        }
    }
}

/// Values Istio's agent starts with and ours reads more safely: install-cni starts, applies the
/// safe reading, names each setting, the value and what it applied, and counts each.
#[test]
fn lenient_values_start_the_agent_warn_and_count() {
    let d = Dirs::new();
    d.put("10-list.conflist", &testdata("list.conflist"));
    let mut env = d.base_env();
    let relative_net = d
        .net
        .display()
        .to_string()
        .trim_start_matches('/')
        .to_string();
    let lenient = [
        ("KUBECONFIG_MODE", "0644".to_string(), "\"0640\""),
        ("CHAINED_CNI_PLUGIN", "yes".to_string(), "\"true\""),
        ("CNI_CONF_GROUP_READ", "Off".to_string(), "\"false\""),
        ("MOUNTED_CNI_NET_DIR", relative_net, "the path from /"),
    ];
    env.retain(|(k, _)| !lenient.iter().any(|(e, _, _)| e == k));
    env.push(("MONITORING_PORT".into(), free_port().to_string()));
    env.extend(lenient.iter().map(|(k, v, _)| (k.to_string(), v.clone())));
    let mut agent = start(&env, &[]);
    let metrics = agent.port("metrics server");
    agent.wait_line("istio-cni is installed", T);
    let out = agent.output();
    for (var, given, _) in &lenient {
        let line = out
            .lines()
            .find(|l| {
                l.contains("\twarn\t") && l.contains(&format!("env {var}={given:?} is read as"))
            })
            .unwrap_or_else(|| panic!("{var}: no warning:\n{out}"));
        if *var == "MOUNTED_CNI_NET_DIR" {
            assert!(
                line.contains(&format!("{:?}", d.net.display().to_string())),
                "{line}"
            );
        }
    }
    assert!(out.contains("is read as \"0640\""), "{out}");
    assert!(out.contains("is read as \"true\""), "{out}");
    assert!(out.contains("is read as \"false\""), "{out}");
    // The safe readings are what was applied: the chained entry in the configured (rooted) dir,
    // the kubeconfig without access for others.
    let conf = d.read("10-list.conflist").expect("conflist");
    assert!(has_istio_entry(&conf), "{conf}");
    let kubeconfig = d.run.join("istio-cni-kubeconfig");
    assert!(
        wait_for(T, || kubeconfig.exists().then_some(())).is_some(),
        "no kubeconfig"
    );
    let mode = fs::metadata(&kubeconfig)
        .expect("kubeconfig")
        .permissions()
        .mode()
        & 0o7777;
    assert_eq!(mode, 0o640, "{mode:o}");
    let (_, body) = http_get(metrics, "/metrics").expect("metrics");
    for (var, _, _) in &lenient {
        let series = format!("istio_cni_settings_adjusted_total{{setting=\"{var}\"}} 1");
        assert!(body.contains(&series), "{series}:\n{body}");
    }
    let status = agent.terminate(T);
    assert!(status.success(), "{status:?}\n{}", agent.output());
}
