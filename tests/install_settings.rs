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
            vec![],
            vec!["--cni-agent-run-dir=var/run/istio-cni"],
            "--cni-agent-run-dir",
            "var/run/istio-cni",
        ),
        (
            vec![("CNI_AGENT_RUN_DIR", long_run_dir.as_str())],
            vec![],
            "env CNI_AGENT_RUN_DIR",
            long_run_dir.as_str(),
        ),
        (
            vec![("MOUNTED_CNI_NET_DIR", "etc/cni/net.d")],
            vec![],
            "env MOUNTED_CNI_NET_DIR",
            "etc/cni/net.d",
        ),
        (
            vec![("KUBECONFIG_MODE", "0644")],
            vec![],
            "env KUBECONFIG_MODE",
            "0644",
        ),
        (
            vec![],
            vec!["--kubeconfig-mode=04600"],
            "--kubeconfig-mode",
            "04600",
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
