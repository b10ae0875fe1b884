//! The Helm chart (deploy/charts/istio-cni) checked with real Helm: rendered and linted by Helm's
//! own engine for every value set docs/deploy.md documents, the rendered objects checked field by
//! field, the rendered RBAC checked against every API call the binary makes, and the rendered
//! DaemonSet's environment and args fed to the real `install-cni`, which must become ready on the
//! chart's probe port (ambient ones with the node agent running) against the real kube-apiserver,
//! its release's objects applied there and its only credential a bound token of the chart's
//! ServiceAccount: every request it makes must be allowed by the release's own ClusterRoles.
//!
//! Needs the venv from `scripts/deps` (helm-python-sdk), the control plane from
//! `scripts/build-controlplane`, and root (each run gets its own netns so the chart's fixed
//! ports 8000 and 15014 are free).

mod support;

#[path = "install_support.rs"]
mod install;

#[path = "chart_helm/cases.rs"]
mod cases;
#[path = "chart_helm/chart.rs"]
mod chart;
#[path = "chart_helm/release.rs"]
mod release;
#[path = "chart_helm/run.rs"]
mod run;

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Instant;

use serde_json::{Value, json};

use chart::{ApiCall, Helm, NAMESPACE, NODE, Rendered};

/// Rendered once per test binary (one Python process for every case).
fn helm() -> &'static Helm {
    static HELM: OnceLock<Helm> = OnceLock::new();
    HELM.get_or_init(|| {
        let t0 = Instant::now();
        let helm = chart::render(&cases::all());
        eprintln!(
            "Helm {} rendered and linted {} value sets in {:?}",
            helm.helm_version,
            helm.cases.len(),
            t0.elapsed()
        );
        helm
    })
}

fn is_ambient(r: &Rendered) -> bool {
    r.config_data()["AMBIENT_ENABLED"] == "true"
}

/// The cases that render a DaemonSet (every valid one but the cluster-scoped-only one).
fn with_daemonset() -> impl Iterator<Item = &'static Rendered> {
    helm()
        .cases
        .values()
        .filter(|r| r.error.is_none() && r.find("DaemonSet", "istio-cni-node").is_some())
}

#[test]
fn every_documented_value_set_renders_and_lints_clean_with_real_helm() {
    let helm = helm();
    assert!(
        helm.helm_version.starts_with("v4."),
        "{}",
        helm.helm_version
    );
    let namespaced = [
        "DaemonSet",
        "ConfigMap",
        "ServiceAccount",
        "NetworkPolicy",
        "ResourceQuota",
    ];
    for case in cases::all().iter().filter(|c| c.lint) {
        let r = helm.case(&case.name);
        let lint = r.lint.as_ref().expect("linted");
        assert_eq!(lint["errors"], json!([]), "{}: {lint}", r.name);
        // Severity 1 is info ("icon is recommended"); 2 warning, 3 error.
        let findings: Vec<&Value> = lint["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .filter(|m| m["severity"].as_u64() != Some(1))
            .collect();
        assert!(
            findings.is_empty(),
            "{}: helm lint --strict: {findings:?}",
            r.name
        );
        assert!(!r.objects.is_empty(), "{}: nothing rendered", r.name);
        for (template, o) in &r.objects {
            assert!(
                o["apiVersion"].is_string() && o["metadata"]["name"].is_string(),
                "{}: {template}: {o}",
                r.name
            );
            if namespaced.contains(&o["kind"].as_str().unwrap_or_default()) {
                assert_eq!(
                    o["metadata"]["namespace"], NAMESPACE,
                    "{}: {template}",
                    r.name
                );
            }
        }
    }
    // The scopes split the objects between them.
    assert!(helm.case("scope-cluster").all("DaemonSet").is_empty());
    assert!(!helm.case("scope-cluster").all("ClusterRole").is_empty());
    assert!(helm.case("scope-namespace").all("ClusterRole").is_empty());
    assert!(!helm.case("scope-namespace").all("DaemonSet").is_empty());
    assert_eq!(helm.case("network-policy").all("NetworkPolicy").len(), 1);
    assert_eq!(helm.case("platform-gke").all("ResourceQuota").len(), 1);
    assert_eq!(
        helm.case("platform-openshift")
            .all("NetworkAttachmentDefinition")
            .len(),
        1
    );
}

#[test]
fn invalid_values_fail_the_render_naming_what_is_wrong() {
    for (name, needle) in [
        ("unknown-profile", "unknown profile \"nope\""),
        ("unknown-platform", "unknown platform \"nope\""),
        ("unknown-compat", "unknown compatibility version \"1.2\""),
        ("defaults-key", "values under `defaults` are not read"),
        ("bad-scope", "global.resourceScope must be one of"),
    ] {
        let r = &helm().cases[name];
        let error = r
            .error
            .as_deref()
            .unwrap_or_else(|| panic!("{name} rendered"));
        assert!(error.contains(needle), "{name}: {error}");
    }
}

#[test]
fn daemonset_follows_the_values() {
    let helm = helm();
    // (case, cni-bin-dir, cni-net-dir, cni-netns-dir) host paths.
    for (name, bin, net, netns) in [
        (
            "default",
            "/opt/cni/bin",
            "/etc/cni/net.d",
            "/var/run/netns",
        ),
        (
            "platform-gke",
            "/home/kubernetes/bin",
            "/etc/cni/net.d",
            "/var/run/netns",
        ),
        (
            "platform-k3d",
            "/bin",
            "/var/lib/rancher/k3s/agent/etc/cni/net.d",
            "/var/run/netns",
        ),
        (
            "platform-k3s",
            "/var/lib/rancher/k3s/data/cni",
            "/var/lib/rancher/k3s/agent/etc/cni/net.d",
            "/var/run/netns",
        ),
        (
            "platform-top-level-k3s",
            "/var/lib/rancher/k3s/data/cni",
            "/var/lib/rancher/k3s/agent/etc/cni/net.d",
            "/var/run/netns",
        ),
        (
            "platform-microk8s",
            "/var/snap/microk8s/current/opt/cni/bin",
            "/var/snap/microk8s/current/args/cni-network",
            "/var/run/netns",
        ),
        (
            "platform-minikube",
            "/opt/cni/bin",
            "/etc/cni/net.d",
            "/var/run/docker/netns",
        ),
        (
            "platform-openshift",
            "/var/lib/cni/bin",
            "/etc/cni/multus/net.d",
            "/var/run/netns",
        ),
        (
            "profile-openshift",
            "/var/lib/cni/bin",
            "/etc/cni/multus/net.d",
            "/var/run/netns",
        ),
        (
            "custom-dirs",
            "/opt/custom/bin",
            "/etc/custom/net.d",
            "/run/custom-netns",
        ),
    ] {
        let paths = helm.case(name).host_paths();
        assert_eq!(paths["cni-bin-dir"], bin, "{name}");
        assert_eq!(paths["cni-net-dir"], net, "{name}");
        assert_eq!(paths["cni-netns-dir"], netns, "{name}");
        assert_eq!(paths["cni-socket-dir"], "/var/run/istio-cni", "{name}");
        assert_eq!(paths["cni-results-dir"], "/var/lib/cni/results", "{name}");
    }
    for r in with_daemonset() {
        let c = r.container();
        let name = &r.name;
        assert_eq!(c["command"], json!(["install-cni"]), "{name}");
        let image = if name == "image" {
            "registry.example.com/mesh/istio-cni-rs:0.1.0"
        } else {
            "localhost/istio-cni-rs:0.1.0"
        };
        assert_eq!(c["image"], image, "{name}");
        assert_eq!(
            c["imagePullPolicy"].as_str(),
            (name == "image").then_some("Always")
        );
        let args = match name.as_str() {
            "logging" => vec!["--log_output_level=debug", "--log_as_json"],
            "cni-prefix" => vec!["--log_output_level=warn"],
            _ => vec!["--log_output_level=info"],
        };
        assert_eq!(r.args(), args, "{name}");
        assert_eq!(
            c["readinessProbe"]["httpGet"],
            json!({"path": "/readyz", "port": 8000})
        );
        let ambient = is_ambient(r);
        let data = r.config_data();
        let mounts = r.mounts();
        for volume in [
            "cni-bin-dir",
            "cni-net-dir",
            "cni-socket-dir",
            "cni-results-dir",
        ] {
            assert!(mounts.contains_key(volume), "{name}: {volume} not mounted");
        }
        for volume in ["cni-netns-dir", "cni-ztunnel-sock-dir"] {
            assert_eq!(mounts.contains_key(volume), ambient, "{name}: {volume}");
        }
        let host_proc = ambient || data["REPAIR_REPAIR_PODS"] == "true";
        assert_eq!(mounts.contains_key("cni-host-procfs"), host_proc, "{name}");
        let host_network = name == "ambient-host-network";
        assert_eq!(
            r.pod_spec()["hostNetwork"].as_bool() == Some(true),
            host_network,
            "{name}"
        );
        let env = r.container_env();
        assert_eq!(
            env.contains_key("ALLOW_SWITCH_TO_HOST_NS"),
            !host_network,
            "{name}"
        );
        assert_eq!(env["NODE_NAME"], NODE, "{name}");
        assert_eq!(env["REPAIR_NODE_NAME"], NODE, "{name}");
        assert_eq!(env["POD_NAMESPACE"], NAMESPACE, "{name}");
        let caps = &c["securityContext"]["capabilities"];
        assert_eq!(caps["drop"], json!(["ALL"]), "{name}");
        assert_eq!(
            caps["add"],
            json!([
                "NET_ADMIN",
                "NET_RAW",
                "SYS_PTRACE",
                "SYS_ADMIN",
                "DAC_OVERRIDE"
            ]),
            "{name}"
        );
    }
    let extra = helm.case("extra-env").container_env();
    assert_eq!(extra["SYSTEM_NAMESPACE"], "mesh-system");
    assert_eq!(extra["FORCE_IPTABLES_BINARY"], "legacy");
    let sec = &helm.case("security-options").container()["securityContext"];
    assert_eq!(
        sec["seLinuxOptions"],
        json!({"level": "s0", "type": "spc_t"})
    );
    assert_eq!(sec["seccompProfile"], json!({"type": "RuntimeDefault"}));
    assert_eq!(sec["appArmorProfile"], json!({"type": "Unconfined"}));
}

#[test]
fn configmap_carries_the_settings_the_agent_reads() {
    let helm = helm();
    let default = helm.case("default").config_data();
    let expected_default: BTreeMap<String, String> = [
        ("AMBIENT_DNS_CAPTURE", "true"),
        ("AMBIENT_ENABLED", "false"),
        ("AMBIENT_IPV6", "true"),
        ("AMBIENT_RECONCILE_POD_RULES_ON_STARTUP", "true"),
        ("CHAINED_CNI_PLUGIN", "true"),
        ("CURRENT_AGENT_VERSION", "latest"),
        ("ENABLE_AMBIENT_DETECTION_RETRY", "false"),
        ("EXCLUDE_NAMESPACES", "kube-system"),
        ("ISTIO_OWNED_CNI_CONFIG", "false"),
        ("NATIVE_NFTABLES", "false"),
        ("REPAIR_BROKEN_POD_LABEL_KEY", "cni.istio.io/uninitialized"),
        ("REPAIR_BROKEN_POD_LABEL_VALUE", "true"),
        ("REPAIR_DELETE_PODS", "false"),
        ("REPAIR_ENABLED", "true"),
        ("REPAIR_INIT_CONTAINER_NAME", "istio-validation"),
        ("REPAIR_LABEL_PODS", "false"),
        ("REPAIR_REPAIR_PODS", "true"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .chain([(
        "AMBIENT_ENABLEMENT_SELECTOR".to_string(),
        default["AMBIENT_ENABLEMENT_SELECTOR"].clone(),
    )])
    .collect();
    assert_eq!(default, expected_default);
    // The selector is the documented YAML list the agent parses.
    assert!(default["AMBIENT_ENABLEMENT_SELECTOR"].contains("istio.io/dataplane-mode: ambient"));

    // Each case: the keys that differ from the default ConfigMap (None = key absent).
    for (name, changes) in [
        ("ambient-profile", vec![("AMBIENT_ENABLED", Some("true"))]),
        ("ambient-enabled", vec![("AMBIENT_ENABLED", Some("true"))]),
        (
            "ambient-owned-config",
            vec![
                ("AMBIENT_ENABLED", Some("true")),
                ("ISTIO_OWNED_CNI_CONFIG", Some("true")),
                ("ISTIO_OWNED_CNI_CONFIG_FILENAME", Some("03-istio.conflist")),
                ("ISTIO_OWNED_CNI_CONF_FILENAME", Some("03-istio.conflist")),
            ],
        ),
        (
            "cni-conf-file-name",
            vec![("CNI_CONF_NAME", Some("10-calico.conflist"))],
        ),
        (
            "platform-openshift",
            vec![
                ("CHAINED_CNI_PLUGIN", Some("false")),
                ("CNI_CONF_NAME", Some("istio-cni.conf")),
            ],
        ),
        (
            "repair-delete",
            vec![
                ("REPAIR_REPAIR_PODS", Some("false")),
                ("REPAIR_DELETE_PODS", Some("true")),
            ],
        ),
        (
            "repair-label",
            vec![
                ("REPAIR_REPAIR_PODS", Some("false")),
                ("REPAIR_LABEL_PODS", Some("true")),
            ],
        ),
        ("repair-off", vec![("REPAIR_ENABLED", Some("false"))]),
        ("native-nftables", vec![("NATIVE_NFTABLES", Some("true"))]),
        (
            "extra-env",
            vec![
                ("SYSTEM_NAMESPACE", Some("mesh-system")),
                ("FORCE_IPTABLES_BINARY", Some("legacy")),
            ],
        ),
        (
            "cni-prefix",
            vec![("EXCLUDE_NAMESPACES", Some("kube-system,mesh-system"))],
        ),
        (
            "compat-1.24",
            vec![
                ("AMBIENT_DNS_CAPTURE", Some("false")),
                ("AMBIENT_RECONCILE_POD_RULES_ON_STARTUP", Some("false")),
            ],
        ),
        ("compat-1.30-number", vec![]),
        ("custom-dirs", vec![]),
    ] {
        let mut want = default.clone();
        for (k, v) in changes {
            match v {
                Some(v) => want.insert(k.to_string(), v.to_string()),
                None => want.remove(k),
            };
        }
        assert_eq!(helm.case(name).config_data(), want, "{name}");
    }
}

/// The API calls the binary makes with the agent's service account (the plugin on the host uses
/// the same token through its kubeconfig), by feature, given the rendered settings.
fn calls_made(data: &BTreeMap<String, String>) -> Vec<(&'static str, ApiCall)> {
    let on = |k: &str| data.get(k).is_some_and(|v| v == "true");
    let call = ApiCall::new;
    let mut calls = vec![
        (
            "plugin: the pod being added",
            call("get", "", "pods", Some("p")),
        ),
        (
            "plugin: its namespace",
            call("get", "", "namespaces", Some("n")),
        ),
        (
            "install-cni shutdown: is the DaemonSet still there (sidecar mode too)",
            call("get", "apps", "daemonsets", Some("istio-cni-node")),
        ),
        (
            "install-cni shutdown: does it still target this node",
            call("get", "", "nodes", Some(NODE)),
        ),
    ];
    if on("AMBIENT_ENABLED") {
        for verb in ["list", "watch"] {
            calls.push((
                "ambient agent: node pod store",
                call(verb, "", "pods", None),
            ));
            calls.push((
                "ambient agent: namespace store",
                call(verb, "", "namespaces", None),
            ));
        }
        calls.push((
            "ambient agent: the redirection annotation",
            call("patch", "", "pods/status", Some("p")),
        ));
        calls.push((
            "ambient agent: an event per drift healed or not healable",
            call("create", "", "events", None),
        ));
    }
    if on("REPAIR_ENABLED") {
        for verb in ["list", "watch"] {
            calls.push((
                "repair: broken pods on this node",
                call(verb, "", "pods", None),
            ));
        }
        calls.push((
            "repair: an event per repair",
            call("create", "", "events", None),
        ));
        // The first true mode wins (Istio's precedence).
        if on("REPAIR_REPAIR_PODS") {
            // A broken pod under restartPolicy Never: deleted (controller) or labelled (bare).
            calls.push((
                "repair mode: a pod that cannot restart, with a controller",
                call("delete", "", "pods", Some("p")),
            ));
            calls.push((
                "repair mode: a bare pod that cannot restart",
                call("patch", "", "pods/status", Some("p")),
            ));
        } else if on("REPAIR_DELETE_PODS") {
            calls.push(("repair: delete mode", call("delete", "", "pods", Some("p"))));
        } else if on("REPAIR_LABEL_PODS") {
            calls.push((
                "repair: label mode",
                call("patch", "", "pods/status", Some("p")),
            ));
        }
    }
    calls
}

#[test]
fn rbac_grants_every_api_call_the_binary_makes() {
    let mut checked = 0;
    for r in with_daemonset().filter(|r| !r.all("ClusterRole").is_empty()) {
        for (why, call) in calls_made(&r.config_data()) {
            assert!(
                r.allows(&call),
                "{}: RBAC does not grant {call:?} ({why})",
                r.name
            );
        }
        checked += 1;
    }
    assert!(checked > 20, "only {checked} value sets checked");
    // And no more than the chosen repair mode needs (repair mode: both, for pods that cannot
    // restart; Istio's chart grants it neither).
    let delete = ApiCall::new("delete", "", "pods", Some("p"));
    let label = ApiCall::new("patch", "", "pods/status", Some("p"));
    assert!(helm().case("default").allows(&delete));
    assert!(helm().case("default").allows(&label));
    assert!(!helm().case("repair-off").allows(&delete));
    assert!(!helm().case("repair-label").allows(&delete));
    assert!(!helm().case("repair-delete").allows(&label));
}

#[test]
fn chart_mounts_are_where_install_cni_looks_by_default() {
    let defaults = run::binary_defaults();
    let default = |var: &str| {
        defaults
            .get(var)
            .unwrap_or_else(|| panic!("install-cni --help names no default for {var}"))
    };
    let r = helm().case("ambient-profile");
    let mounts = r.mounts();
    assert_eq!(&mounts["cni-net-dir"], default("MOUNTED_CNI_NET_DIR"));
    let bin_dirs = default("CNI_BIN_DIRS");
    assert_eq!(
        Some(mounts["cni-bin-dir"].as_str()),
        bin_dirs.split(',').next()
    );
    assert_eq!(&mounts["cni-socket-dir"], default("CNI_AGENT_RUN_DIR"));
    assert_eq!(&mounts["cni-results-dir"], default("CNI_RESULTS_DIR"));
    assert_eq!(&mounts["cni-host-procfs"], default("HOST_PROC_DIR"));
    assert_eq!(&mounts["cni-netns-dir"], default("HOST_NETNS_DIR"));
    let zds = std::path::Path::new(default("ZTUNNEL_UDS_ADDRESS"));
    assert_eq!(
        Some(std::path::Path::new(&mounts["cni-ztunnel-sock-dir"])),
        zds.parent()
    );
    // The probe and the scrape target are the binary's default ports.
    assert_eq!(default("HEALTH_PORT"), "8000");
    assert_eq!(default("MONITORING_PORT"), "15014");
    let annotations = &r.daemonset()["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/port"], "15014");
    assert_eq!(r.container()["ports"][0]["containerPort"], 15014);
}

#[test]
fn install_cni_becomes_ready_with_each_rendered_sidecar_environment() {
    let t0 = Instant::now();
    let groups = run::by_environment(with_daemonset().filter(|r| !is_ambient(r)));
    let cases: usize = groups.iter().map(Vec::len).sum();
    assert!(
        cases > 20 && groups.len() >= 10,
        "{cases} in {} groups",
        groups.len()
    );
    run::each_in_parallel(&groups, run::expect_ready);
    eprintln!(
        "{} distinct environments of {cases} sidecar value sets ran ready in {:?}",
        groups.len(),
        t0.elapsed()
    );
}

/// The ambient value sets become ready exactly like the sidecar ones: the node agent starts (its
/// stores synced against the real API server with the chart's RBAC, the real data plane in the
/// run's netns, ZDS served on the redirected socket) before the plugin is installed.
#[test]
fn install_cni_becomes_ready_with_each_rendered_ambient_environment() {
    let t0 = Instant::now();
    let groups = run::by_environment(with_daemonset().filter(|r| is_ambient(r)));
    let cases: usize = groups.iter().map(Vec::len).sum();
    assert!(cases >= 5, "{cases}");
    run::each_in_parallel(&groups, run::expect_ready);
    eprintln!(
        "{} distinct environments of {cases} ambient value sets ran ready in {:?}",
        groups.len(),
        t0.elapsed()
    );
}

/// A difference from Istio's chart (docs/deploy.md): the agent reads its ConfigMap once, through
/// `envFrom` at start, so the pod template carries the hash of the rendered ConfigMap and a
/// changed setting rolls the DaemonSet instead of waiting for the next unrelated restart.
#[test]
fn daemonset_rolls_when_its_configmap_changes() {
    let helm = helm();
    let checksum = |r: &Rendered| -> String {
        let annotations = &r.daemonset()["spec"]["template"]["metadata"]["annotations"];
        annotations["checksum/config"]
            .as_str()
            .unwrap_or_else(|| panic!("{}: no checksum/config annotation", r.name))
            .to_string()
    };
    let mut checked = 0;
    for r in with_daemonset() {
        let rendered = r
            .sha256
            .iter()
            .find(|(t, _)| t.ends_with("/templates/configmap-cni.yaml"))
            .map(|(_, h)| h.clone())
            .unwrap_or_else(|| panic!("{}: no rendered configmap-cni.yaml", r.name));
        assert_eq!(checksum(r), rendered, "{}: hash of another text", r.name);
        checked += 1;
    }
    assert!(checked > 20, "only {checked} value sets checked");
    let default = checksum(helm.case("default"));
    // A setting the agent reads changes the pod template ...
    for name in [
        "ambient-enabled",
        "repair-delete",
        "native-nftables",
        "extra-env",
    ] {
        assert_ne!(checksum(helm.case(name)), default, "{name}");
    }
    // ... values that only touch the DaemonSet itself do not.
    for name in ["image", "security-options"] {
        assert_eq!(checksum(helm.case(name)), default, "{name}");
    }
    // The full set of pod annotations: Istio's, plus the checksum (the reason above).
    let annotations =
        &helm.case("default").daemonset()["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(
        annotations,
        &json!({
            "sidecar.istio.io/inject": "false",
            "prometheus.io/scrape": "true",
            "prometheus.io/port": "15014",
            "prometheus.io/path": "/metrics",
            "container.apparmor.security.beta.kubernetes.io/install-cni": "unconfined",
            "checksum/config": default,
        })
    );
}

/// Kubelet probes under Cilium's kube-proxy replacement (its BPF routing drops the pod's reply to
/// the link-local SNAT address): with `useHostIPForProbeSnat` the chart hands the agent the
/// node's addresses from the downward API, and the host probe rules the real agent writes SNAT a
/// probe to the node's own address, whose reply routes back like any node traffic.
#[test]
fn probes_are_snated_to_the_node_address_with_use_host_ip_for_probe_snat() {
    let r = helm().case("ambient-probe-node-ip");
    let env = r.container_env();
    let node_ips = format!("{},{}", chart::NODE_IP, chart::NODE_IP6);
    assert_eq!(env["HOST_PROBE_SNAT_NODE_IPS"], node_ips);
    assert!(
        !helm()
            .case("ambient-profile")
            .container_env()
            .contains_key("HOST_PROBE_SNAT_NODE_IPS")
    );
    run::while_ready(r, |node| {
        let v4 = String::from_utf8_lossy(&node.exec("iptables-save", &["-t", "nat"]).stdout)
            .into_owned();
        let v6 = String::from_utf8_lossy(&node.exec("ip6tables-save", &["-t", "nat"]).stdout)
            .into_owned();
        assert!(
            v4.contains(&format!("-j SNAT --to-source {}", chart::NODE_IP)),
            "{v4}"
        );
        assert!(!v4.contains("169.254.7.127"), "{v4}");
        assert!(
            v6.contains(&format!("-j SNAT --to-source {}", chart::NODE_IP6)),
            "{v6}"
        );
        // A probe: the node's address local to the node netns but on no link the pod shares, the
        // pod on a veth of another subnet (its reply to the node's address takes the default
        // route back, as on a real node).
        node.exec(
            "ip",
            &[
                "addr",
                "add",
                &format!("{}/32", chart::NODE_IP),
                "dev",
                "lo",
            ],
        );
        let pod = support::Netns::new("probe-pod");
        support::wire_veth(
            |p, a| {
                pod.exec(p, a);
            },
            node,
            ("eth0", "vprobe0"),
            ("10.250.7.2", "10.250.7.1"),
        );
        pod.exec("ip", &["route", "add", "default", "via", "10.250.7.1"]);
        node.exec(
            "ipset",
            &[
                "add",
                "-exist",
                "istio-inpod-probes-v4",
                "10.250.7.2",
                "comment",
                "probe-test",
            ],
        );
        let listener = pod.listen("0.0.0.0:8080");
        let peer = pod.spawn(move || {
            listener.set_nonblocking(false).expect("blocking");
            listener.accept().map(|(_, peer)| peer.ip().to_string())
        });
        assert!(node.connect("10.250.7.2:8080"), "probe connect");
        let peer = peer.join().expect("accept thread").expect("accept");
        assert_eq!(
            peer,
            chart::NODE_IP,
            "the probe's source as the pod sees it"
        );
        node.exec("ipset", &["del", "istio-inpod-probes-v4", "10.250.7.2"]);
    });
}
