//! The chart's RBAC enforced by a real kube-apiserver (`istio_cni_testing::controlplane`): the
//! chart rendered by real Helm, its ServiceAccount, ClusterRoles, bindings, ConfigMap and
//! DaemonSet applied to the API server, and the real `install-cni` run with a bound token of the
//! chart's `istio-cni` ServiceAccount and nothing more, in each mode the chart renders: it must
//! become ready, do its work (repair's label/delete/event, ambient's annotation patch) and shut
//! down cleanly without one request refused. With a verb taken out of the rendered ClusterRole,
//! install-cni fails naming the resource and the verb.
//!
//! Each run is its own release (`chart_helm/release.rs`): the namespaced objects go into a
//! namespace of its own, the cluster-scoped ones get its name as a suffix (the shared API server
//! holds every run), and the node is a name of its own. install-cni runs in the host netns (the API server listens on host
//! loopback) on free ports, ambient on the test-only fake data plane: what is checked here is
//! what the API server allows, not the rules.
//!
//! Needs the venv from `scripts/deps` (real Helm) and the control plane from
//! `scripts/build-controlplane`.

mod support;

#[path = "install_support.rs"]
mod install;

#[path = "chart_helm/cases.rs"]
mod cases;
#[path = "chart_helm/chart.rs"]
mod chart;
#[path = "chart_helm/release.rs"]
mod release;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use istio_cni_testing::controlplane::{self, ControlPlane, pod_on_node, unique_name};
use serde_json::{Value, json};

use chart::{Helm, Rendered};
use install::{Agent, Dirs, free_port, has_istio_entry, http_get, start, testdata};
use release::{Release, create_broken_sidecar_pod, events_about};
use support::Netns;
use support::node_proc::NodeProc;

const T: Duration = Duration::from_secs(60);

/// The value sets with a mode of their own: sidecar with each repair mode, ambient.
const MODES: [&str; 5] = [
    "default",
    "repair-label",
    "repair-delete",
    "repair-off",
    "ambient-profile",
];

fn helm() -> &'static Helm {
    static HELM: OnceLock<Helm> = OnceLock::new();
    HELM.get_or_init(|| {
        let wanted: Vec<_> = cases::all()
            .into_iter()
            .filter(|c| MODES.contains(&c.name.as_str()))
            .map(|mut c| {
                c.lint = false;
                c
            })
            .collect();
        chart::render(&wanted)
    })
}

/// install-cni as the DaemonSet's pod would run it, with a bound token of the chart's service
/// account as its only credential (the agent's kubeconfig and the service-account mount).
struct Run {
    agent: Agent,
    /// Before `dirs`: its mount is under their temp dir and is detached first.
    _node_proc: NodeProc,
    _node_ns: Netns,
    dirs: Dirs,
    health: u16,
}

fn run_install_cni(cp: &ControlPlane, r: &Rendered, release: &Release) -> Run {
    let dirs = Dirs::new();
    let node_ns = Netns::new("rbac");
    let node_proc = NodeProc::start(&node_ns.path(), dirs.tmp.path());
    let sa = r.pod_spec()["serviceAccountName"]
        .as_str()
        .expect("serviceAccountName");
    let token = cp.token(&release.namespace, sa, Duration::from_secs(3600));
    std::fs::write(dirs.sa.join("token"), &token).expect("token");
    std::fs::write(dirs.sa.join("ca.crt"), cp.ca_pem()).expect("ca.crt");
    let kubeconfig = dirs.tmp.path().join("agent-kubeconfig");
    cp.write_kubeconfig(&kubeconfig, &token);
    let (netns_dir, zds_dir) = (
        dirs.tmp.path().join("netns"),
        dirs.tmp.path().join("ztunnel"),
    );
    for dir in [&netns_dir, &zds_dir] {
        std::fs::create_dir_all(dir).expect("mkdir");
    }
    let health = free_port();
    let path = |p: &std::path::Path| p.display().to_string();
    let mut env = r.container_env();
    let provided = [
        ("KUBERNETES_SERVICE_HOST", "127.0.0.1".to_string()),
        ("KUBERNETES_SERVICE_PORT", cp.port().to_string()),
        ("SERVICE_ACCOUNT_DIR", path(&dirs.sa)),
        ("KUBECONFIG", path(&kubeconfig)),
        ("MOUNTED_CNI_NET_DIR", path(&dirs.net)),
        ("CNI_BIN_DIRS", path(&dirs.bin)),
        ("CNI_AGENT_RUN_DIR", path(&dirs.run)),
        // A fresh node's: a kubelet in a netns of its own and no pods (see `NodeProc`).
        ("HOST_PROC_DIR", path(&node_proc.dir)),
        ("HOST_NETNS_DIR", path(&netns_dir)),
        ("ZTUNNEL_UDS_ADDRESS", path(&zds_dir.join("ztunnel.sock"))),
        // The host netns: free ports instead of the chart's fixed ones.
        ("HEALTH_PORT", health.to_string()),
        ("MONITORING_PORT", free_port().to_string()),
        // The fieldRefs, resolved for this release.
        ("NODE_NAME", release.node.clone()),
        ("POD_NAMESPACE", release.namespace.clone()),
    ];
    env.extend(provided.map(|(k, v)| (k.to_string(), v)));
    if env.contains_key("REPAIR_NODE_NAME") {
        env.insert("REPAIR_NODE_NAME".into(), release.node.clone());
    }
    if env.get("AMBIENT_ENABLED").map(String::as_str) == Some("true") {
        env.insert("ISTIO_CNI_RS_TEST_FAKE_DATAPLANE".into(), "1".into());
    }
    if env["CHAINED_CNI_PLUGIN"] != "false" {
        dirs.put("10-list.conflist", &testdata("list.conflist"));
    }
    let env: Vec<(String, String)> = env.into_iter().collect();
    let args = r.args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent = start(&env, &args);
    Run {
        agent,
        _node_proc: node_proc,
        _node_ns: node_ns,
        dirs,
        health,
    }
}

impl Run {
    /// Waits for 200 on the readiness probe's path; panics if install-cni exits first.
    fn wait_ready(&mut self, r: &Rendered) {
        let path = r.container()["readinessProbe"]["httpGet"]["path"]
            .as_str()
            .expect("probe path");
        let deadline = Instant::now() + T;
        loop {
            let answer = http_get(self.health, path);
            if answer.as_ref().map(|(s, _)| *s) == Some(200) {
                return;
            }
            if let Some(st) = self.agent.child.try_wait().expect("try_wait") {
                std::thread::sleep(Duration::from_millis(50));
                panic!(
                    "{}: install-cni exited ({st}):\n{}",
                    r.name,
                    self.agent.output()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{}: not ready within {T:?} (:{}{path} answers {answer:?}):\n{}",
                r.name,
                self.health,
                self.agent.output()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn wait_until(what: &str, agent: &Agent, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + T;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "{what}: not within {T:?}; install-cni:\n{}",
            agent.output()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// What each mode does with the API, checked on the server.
fn exercise(cp: &ControlPlane, r: &Rendered, release: &Release, run: &Run) {
    let data = r.config_data();
    let on = |k: &str| data.get(k).is_some_and(|v| v == "true");
    let apps = unique_name("shop");
    if on("AMBIENT_ENABLED") {
        cp.create_namespace(&apps, &[("istio.io/dataplane-mode", "ambient")]);
        let pod = cp.create_pod(&pod_on_node(&apps, "app", &release.node));
        assert!(pod.metadata.uid.is_some());
        cp.set_pod_status(
            &apps,
            "app",
            json!({"phase": "Running", "podIP": "10.244.1.7", "podIPs": [{"ip": "10.244.1.7"}]}),
        );
        wait_until(
            &format!("{}: the redirection annotation", r.name),
            &run.agent,
            || {
                cp.pod(&apps, "app")
                    .and_then(|p| p.metadata.annotations)
                    .is_some_and(|a| a.contains_key("ambient.istio.io/redirection"))
            },
        );
    } else if on("REPAIR_ENABLED") {
        cp.create_namespace(&apps, &[]);
        create_broken_sidecar_pod(cp, &apps, &release.node);
        let key = data
            .get("REPAIR_BROKEN_POD_LABEL_KEY")
            .cloned()
            .unwrap_or_else(|| "cni.istio.io/uninitialized".into());
        let what = format!("{}: the repair controller's work", r.name);
        wait_until(&what, &run.agent, || {
            let pod = cp.pod(&apps, "broken");
            if on("REPAIR_REPAIR_PODS") {
                !events_about(cp, &apps, "broken").is_empty()
            } else if on("REPAIR_DELETE_PODS") {
                pod.is_none_or(|p| p.metadata.deletion_timestamp.is_some())
            } else {
                pod.and_then(|p| p.metadata.labels)
                    .is_some_and(|l| l.contains_key(&key))
            }
        });
    }
    // The plugin's own calls, with the kubeconfig install-cni wrote for it.
    let kubeconfig = run.dirs.run.join("istio-cni-kubeconfig");
    let ns = release.namespace.clone();
    let answer = cp.block_on(async move {
        let client = istio_cni::kube::KubeClient::from_kubeconfig_file(&kubeconfig).await?;
        client.get_namespace(&ns, Duration::from_secs(10)).await?;
        match client.get_pod(&ns, "absent", Duration::from_secs(10)).await {
            Err(e) if e.to_string().contains("not found") => Ok(()),
            other => other.map(|_| ()),
        }
    });
    answer.unwrap_or_else(|e| panic!("{}: the plugin's kubeconfig: {e}", r.name));
}

#[test]
fn install_cni_works_with_only_the_charts_service_account_in_each_mode() {
    let cp = controlplane::shared();
    for name in MODES {
        let r = helm().case(name);
        let release = release::install(cp, r, None, |_| {});
        let mut run = run_install_cni(cp, r, &release);
        run.wait_ready(r);
        assert!(run.dirs.bin.join("istio-cni").is_file(), "{name}");
        if r.container_env()["CHAINED_CNI_PLUGIN"] != "false" {
            let conf = run.dirs.read("10-list.conflist").unwrap_or_default();
            assert!(has_istio_entry(&conf), "{name}: not chained:\n{conf}");
        }
        exercise(cp, r, &release, &run);
        let st = run.agent.terminate(T);
        let out = run.agent.output();
        assert!(st.success(), "{name}: exit {st}:\n{out}");
        assert!(
            !out.contains("forbidden") && !out.contains("Forbidden"),
            "{name}: a request was refused:\n{out}"
        );
    }
}

/// The rules with `verb` taken out where they grant it on `resource`.
fn without_verb(o: &mut Value, resource: &str, verb: &str) {
    if o["kind"] != "ClusterRole" {
        return;
    }
    for rule in o["rules"].as_array_mut().into_iter().flatten() {
        let grants = rule["resources"]
            .as_array()
            .is_some_and(|r| r.iter().any(|v| v == resource));
        if grants && let Some(verbs) = rule["verbs"].as_array_mut() {
            verbs.retain(|v| v != verb);
        }
    }
}

/// The chart without `list` on pods (the rule that grants it also names namespaces): on a
/// server that streams a watch's initial state (the WatchList feature, on in this one), the
/// agent's stores sync over their watches alone, as Istio's informers do, and install-cni becomes
/// ready without one pod list. A server that cannot stream needs `list` (see kube_client's
/// `a_server_without_streaming_lists_is_listed_then_watched`); the chart grants both.
#[test]
fn without_list_on_pods_the_stores_stream_their_initial_state_and_install_cni_is_ready() {
    let cp = controlplane::shared();
    let r = helm().case("ambient-profile");
    let release = release::install(cp, r, None, |o| without_verb(o, "pods", "list"));
    let mark = cp.audit_mark();
    let mut run = run_install_cni(cp, r, &release);
    run.wait_ready(r);
    let sa = r.pod_spec()["serviceAccountName"].as_str().expect("sa");
    let user = format!("system:serviceaccount:{}:{sa}", release.namespace);
    let pod_reads: Vec<(String, String)> = cp
        .requests_of(&user, mark)
        .into_iter()
        .filter(|(verb, uri)| uri.starts_with("/api/v1/pods?") && verb != "get")
        .collect();
    assert!(
        pod_reads
            .iter()
            .any(|(verb, uri)| verb == "watch" && uri.contains("sendInitialEvents=true")),
        "{pod_reads:?}"
    );
    assert!(
        pod_reads.iter().all(|(verb, _)| verb == "watch"),
        "{pod_reads:?}"
    );
}

/// The chart without `watch` on pods: the stores cannot start (they stream their initial state
/// over the watch, and would see no change without one). install-cni must not report ready; its
/// readiness and its log name the store, the verb, the resource and the ClusterRole; granted
/// `watch` again, it becomes ready and sees new pods.
#[test]
fn install_cni_is_not_ready_while_its_pod_watch_is_refused() {
    let cp = controlplane::shared();
    let r = helm().case("default");
    let release = release::install(cp, r, None, |o| without_verb(o, "pods", "watch"));
    let mut run = run_install_cni(cp, r, &release);
    let path = r.container()["readinessProbe"]["httpGet"]["path"]
        .as_str()
        .expect("probe path");
    let mut body = String::new();
    wait_until("readiness naming the refused watch", &run.agent, || {
        body = http_get(run.health, path)
            .map(|(_, b)| b)
            .unwrap_or_default();
        body.contains("cannot watch pods")
    });
    for part in ["pod store", "forbidden", "ClusterRole"] {
        assert!(body.contains(part), "{part:?} missing: {body}");
    }
    // Still not ready a while later (the watch is retried and probed meanwhile).
    std::thread::sleep(Duration::from_secs(3));
    let probe = http_get(run.health, path);
    assert_eq!(
        probe.as_ref().map(|(s, _)| *s),
        Some(503),
        "ready while its watch is refused ({probe:?}):\n{}",
        run.agent.output()
    );
    assert!(
        run.agent.output().lines().any(|l| l.contains("cni-agent")
            && l.contains("cannot watch pods")
            && l.contains("ClusterRole")),
        "logged:\n{}",
        run.agent.output()
    );
    // `watch` granted again: ready, and a new pod of the node is seen.
    let sa = r.pod_spec()["serviceAccountName"].as_str().expect("sa");
    let grant = format!("watch-pods-{}", release.namespace);
    cp.create(&json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": grant},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["watch"]}],
    }));
    cp.create(&json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": grant},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": grant},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": release.namespace}],
    }));
    run.wait_ready(r);
    let apps = unique_name("shop");
    cp.create_namespace(&apps, &[]);
    cp.create_pod(&pod_on_node(&apps, "late", &release.node));
    wait_until("the new pod in /debug/pods", &run.agent, || {
        http_get(run.health, "/debug/pods").is_some_and(|(_, b)| b.contains("late"))
    });
}

/// The plugin's own GETs with the kubeconfig install-cni wrote for it, as the chart's account.
fn plugin_kubeconfig_gets(cp: &ControlPlane, run: &Run, namespace: &str) -> Result<(), String> {
    let kubeconfig = run.dirs.run.join("istio-cni-kubeconfig");
    let ns = namespace.to_string();
    cp.block_on(async move {
        let client = istio_cni::kube::KubeClient::from_kubeconfig_file(&kubeconfig).await?;
        client.get_namespace(&ns, Duration::from_secs(10)).await?;
        Ok::<_, istio_cni::kube::KubeError>(())
    })
    .map_err(|e| e.to_string())
}

/// Start to ready on the real API server, then the service-account token rotated the way the
/// kubelet does it (`token -> ..data/token`, `..data` swapped by a rename) with a fresh bound
/// token each time: the plugin's kubeconfig follows, and the API server accepts what it holds.
#[test]
fn the_plugin_kubeconfig_follows_bound_token_rotation() {
    let cp = controlplane::shared();
    let r = helm().case("repair-off");
    let release = release::install(cp, r, None, |_| {});
    let mut run = run_install_cni(cp, r, &release);
    run.wait_ready(r);
    plugin_kubeconfig_gets(cp, &run, &release.namespace).expect("first token");
    let sa = run.dirs.sa.clone();
    let kubeconfig = run.dirs.run.join("istio-cni-kubeconfig");
    for version in ["v1", "v2"] {
        let token = cp.token(&release.namespace, "istio-cni", Duration::from_secs(3600));
        let dir = sa.join(format!("..{version}"));
        std::fs::create_dir(&dir).expect("version dir");
        std::fs::write(dir.join("token"), &token).expect("token");
        std::os::unix::fs::symlink(format!("..{version}"), sa.join("..data_tmp")).expect("link");
        std::fs::rename(sa.join("..data_tmp"), sa.join("..data")).expect("swap");
        if version == "v1" {
            std::fs::remove_file(sa.join("token")).expect("rm token");
            std::os::unix::fs::symlink("..data/token", sa.join("token")).expect("token link");
        }
        wait_until(&format!("rotation {version}"), &run.agent, || {
            std::fs::read_to_string(&kubeconfig).is_ok_and(|c| c.contains(&token))
        });
        plugin_kubeconfig_gets(cp, &run, &release.namespace)
            .unwrap_or_else(|e| panic!("after rotation {version}: {e}"));
    }
    // A token the API server did not issue is refused (401) through the same kubeconfig.
    let text = std::fs::read_to_string(&kubeconfig).expect("kubeconfig");
    let bogus = sa.join("..v3");
    std::fs::create_dir(&bogus).expect("dir");
    std::fs::write(bogus.join("token"), "not-a-token").expect("token");
    std::os::unix::fs::symlink("..v3", sa.join("..data_tmp")).expect("link");
    std::fs::rename(sa.join("..data_tmp"), sa.join("..data")).expect("swap");
    wait_until("rotation to a bogus token", &run.agent, || {
        std::fs::read_to_string(&kubeconfig).is_ok_and(|c| c != text && c.contains("not-a-token"))
    });
    let refused = plugin_kubeconfig_gets(cp, &run, &release.namespace)
        .expect_err("a token the API server never issued");
    assert!(
        refused.to_lowercase().contains("unauthorized") || refused.contains("401"),
        "{refused}"
    );
    assert!(run.agent.terminate(T).success(), "{}", run.agent.output());
}
