//! Istio's installer goldens reproduced by the real binary: merged, standalone and owned configs,
//! the plugin kubeconfig, and what cleanup leaves behind.

#[path = "install_support.rs"]
mod support;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use support::*;

const T: Duration = Duration::from_secs(30);

/// The goldens carry `cni_agent_run_dir: /path/to/kubeconfig`; ours is a temp dir.
fn normalise(d: &Dirs, content: &str) -> String {
    content.replace(&d.run.display().to_string(), "/path/to/kubeconfig")
}

/// Runs one case: conf-dir inputs, extra env, the file to compare with its golden, then SIGTERM
/// and the expected post-cleanup state (`None` = file removed).
fn case(
    inputs: &[(&str, &str)],
    env: &[(&str, &str)],
    result: &str,
    golden: &str,
    after: &[(&str, Option<&str>)],
) {
    let d = Dirs::new();
    for (name, src) in inputs {
        d.put(name, &testdata(src));
    }
    let mut e = d.base_env();
    e.push(("LOG_OUTPUT_LEVEL".into(), "info,cni-plugin:debug".into()));
    e.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let mut agent = start(&e, &[]);
    let expected = testdata_str(golden);
    let got = wait_for(T, || {
        d.read(result)
            .map(|c| normalise(&d, &c))
            .filter(|c| *c == expected)
    });
    if got.is_none() {
        panic!(
            "{result} never matched {golden}; dir {:?}, content:\n{}\noutput:\n{}",
            d.names(),
            d.read(result).unwrap_or_default(),
            agent.output()
        );
    }
    // The result validates: the guard settles instead of rewriting it again and again.
    agent.wait_line("istio-cni is installed; watching for changes", T);
    // Nothing half-written or temporary is left next to it.
    assert!(
        d.names().iter().all(|n| !n.contains(".tmp.")),
        "{:?}",
        d.names()
    );
    let st = agent.terminate(T);
    assert!(st.success(), "exit {st:?}\n{}", agent.output());
    for (name, want) in after {
        match want {
            None => assert!(
                d.read(name).is_none(),
                "{name} should be gone, dir {:?}",
                d.names()
            ),
            Some(src) => pretty_assertions::assert_eq!(
                d.read(name)
                    .unwrap_or_else(|| panic!("{name} missing after cleanup, dir {:?}", d.names())),
                testdata_str(src),
                "{name} after cleanup"
            ),
        }
    }
    assert!(!d.bin.join("istio-cni").exists(), "binary removed");
    assert!(
        !d.run.join("istio-cni-kubeconfig").exists(),
        "kubeconfig removed"
    );
}

#[test]
fn merge_into_list() {
    case(
        &[("10-list.conflist", "list.conflist")],
        &[],
        "10-list.conflist",
        "list.conflist.golden",
        &[("10-list.conflist", Some("list-no-istio.conflist"))],
    );
}

#[test]
fn merge_into_single_conf_converts_and_restores_it() {
    case(
        &[("bridge.conf", "bridge.conf")],
        &[],
        "bridge.conflist",
        "bridge.conf.golden",
        &[
            ("bridge.conf", Some("bridge.conf")),
            ("bridge.conflist", None),
        ],
    );
}

#[test]
fn named_conflist_falls_back_to_conf() {
    case(
        &[("bridge.conf", "bridge.conf")],
        &[("CNI_CONF_NAME", "bridge.conflist")],
        "bridge.conflist",
        "bridge.conf.golden",
        &[("bridge.conf", Some("bridge.conf"))],
    );
}

#[test]
fn named_undetectable_file() {
    case(
        &[("undetectable.file", "list.conflist")],
        &[("CNI_CONF_NAME", "undetectable.file")],
        "undetectable.file",
        "list.conflist.golden",
        &[("undetectable.file", Some("list-no-istio.conflist"))],
    );
}

#[test]
fn replaces_an_old_istio_entry() {
    case(
        &[("10-list.conflist", "list-with-istio.conflist")],
        &[],
        "10-list.conflist",
        "list-with-istio.conflist.golden",
        &[("10-list.conflist", Some("list-no-istio.conflist"))],
    );
}

/// Istio-owned mode needs AMBIENT_ENABLED, so these run with the agent (against a test API
/// server, with the test-only fake data plane): the agent must be ready before install starts.
fn owned_case(
    inputs: &[(&str, &str)],
    filename_env: (&str, &str),
    golden: &str,
    primary: (&str, &str),
) {
    let api = ApiServer::start();
    let mut env = api.ambient_env();
    env.push(("ISTIO_OWNED_CNI_CONFIG".into(), "true".into()));
    env.push((filename_env.0.into(), filename_env.1.into()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    case(
        inputs,
        &env,
        "02-istio-conf.conflist",
        golden,
        &[
            ("02-istio-conf.conflist", None),
            (primary.0, Some(primary.1)),
        ],
    );
}

#[test]
fn owned_config_from_list_with_the_legacy_filename_key() {
    owned_case(
        &[("10-list.conflist", "list.conflist")],
        ("ISTIO_OWNED_CNI_CONF_FILENAME", "02-istio-conf.conflist"),
        "istio-owned.conflist.golden",
        ("10-list.conflist", "list.conflist"),
    );
}

#[test]
fn owned_config_from_bridge() {
    owned_case(
        &[("10-bridge.conf", "bridge.conf")],
        ("ISTIO_OWNED_CNI_CONFIG_FILENAME", "02-istio-conf.conflist"),
        "istio-owned-bridge.conflist.golden",
        ("10-bridge.conf", "bridge.conf"),
    );
}

#[test]
fn standalone_default_name() {
    case(
        &[],
        &[("CHAINED_CNI_PLUGIN", "false")],
        "YYY-istio-cni.conf",
        "istio-cni.conf",
        &[("YYY-istio-cni.conf", None)],
    );
}

#[test]
fn standalone_named() {
    case(
        &[("10-list.conflist", "list.conflist")],
        &[
            ("CHAINED_CNI_PLUGIN", "false"),
            ("CNI_CONF_NAME", "specific-name.conf"),
        ],
        "specific-name.conf",
        "istio-cni.conf",
        &[
            ("specific-name.conf", None),
            ("10-list.conflist", Some("list.conflist")),
        ],
    );
}

fn kubeconfig_case(env: &[(&str, &str)], golden: &str) {
    let d = Dirs::new();
    d.put("10-list.conflist", &testdata("list.conflist"));
    let mut e = d.base_env();
    e.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let mut agent = start(&e, &[]);
    let path = d.run.join("istio-cni-kubeconfig");
    let expected = testdata_str(golden);
    let ok = wait_for(T, || {
        std::fs::read_to_string(&path)
            .ok()
            .filter(|c| *c == expected)
    });
    assert!(
        ok.is_some(),
        "kubeconfig never matched {golden}:\n{}",
        std::fs::read_to_string(&path).unwrap_or_default()
    );
    let mode = std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777;
    let want_mode = env
        .iter()
        .find(|(k, _)| *k == "KUBECONFIG_MODE")
        .map_or(0o600, |(_, v)| {
            u32::from_str_radix(v.trim_start_matches('0'), 8).expect("octal")
        });
    assert_eq!(mode, want_mode);
    // Token rotation the way the kubelet does it: `token -> ..data/token`, and `..data` is a
    // symlink to a timestamped dir, swapped atomically with a rename. The kubeconfig follows.
    let swap = |version: &str, token_file: &str| {
        let dir = d.sa.join(format!("..{version}"));
        std::fs::create_dir(&dir).expect("version dir");
        std::fs::write(dir.join("token"), testdata(token_file)).expect("token");
        std::os::unix::fs::symlink(format!("..{version}"), d.sa.join("..data_tmp"))
            .expect("symlink");
        std::fs::rename(d.sa.join("..data_tmp"), d.sa.join("..data")).expect("swap");
    };
    swap("v1", "token-foo");
    std::fs::remove_file(d.sa.join("token")).expect("rm token");
    std::os::unix::fs::symlink("..data/token", d.sa.join("token")).expect("token link");
    let has_token = |t: &str| {
        std::fs::read_to_string(&path)
            .ok()
            .filter(|c| c.ends_with(&format!("    token: {t}\n")))
    };
    assert!(
        wait_for(T, || has_token("foo")).is_some(),
        "token rotation not picked up:\n{}",
        agent.output()
    );
    swap("v2", "token-bar");
    assert!(
        wait_for(T, || has_token("bar")).is_some(),
        "second rotation not picked up:\n{}",
        agent.output()
    );
    // Deleting it is repaired too (Istio does not watch it: L6).
    std::fs::remove_file(&path).expect("rm");
    assert!(
        wait_for(T, || std::fs::read_to_string(&path).ok()).is_some(),
        "deleted kubeconfig not repaired"
    );
    assert!(agent.terminate(T).success());
}

#[test]
fn kubeconfig_tls() {
    kubeconfig_case(&[("KUBECONFIG_MODE", "0640")], "kubeconfig-tls");
}

#[test]
fn kubeconfig_skip_tls() {
    kubeconfig_case(&[("SKIP_TLS_VERIFY", "true")], "kubeconfig-skip-tls");
}

#[test]
fn kubeconfig_newhost() {
    kubeconfig_case(
        &[("KUBERNETES_SERVICE_HOST", "50.76.2.1")],
        "kubeconfig-newhost",
    );
}
