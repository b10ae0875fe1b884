//! The agent tests' API server on the real kube-apiserver (`istio_cni_testing::controlplane`,
//! one per test binary) behind the calls they make of the test API server: `add_namespace`
//! (create or replace the labels), `add_pod` (create, then the status through the `status`
//! subresource as a kubelet writes it), `pod`, `write_kubeconfig`, and the request log
//! (`requests`, `clear_requests`) read from the server's audit log.
//!
//! The server is shared by every test of the binary, so each `RealCluster` keeps its objects
//! apart: namespace `shop` is `shop-<suffix>` and node `node-1` is `node-1-<suffix>` on the
//! server ([`RealCluster::ns`], [`RealCluster::node`] name them for the agent's settings and
//! the assertions). The agent authenticates with a bound token of a ServiceAccount of its own,
//! so its requests are told apart from the test's, and may do what the chart grants and nothing
//! more: the chart rendered by real Helm once per test binary (`chart_helm/chart.rs`) with
//! ambient and repair on (repair's default mode grants the union of its modes' verbs), its
//! ClusterRoles and ClusterRoleBindings created under names suffixed with the cluster's own
//! namespace, the bindings' subject that namespace's `istio-cni` ServiceAccount. A request the
//! chart does not allow is refused here as in a cluster (`chart_rbac` shows each mode's role on
//! its own and the missing-verb failures).
#![allow(dead_code)]

// Test binaries that render the chart themselves load it again at their root.
#[allow(clippy::duplicate_mod)]
#[path = "../chart_helm/chart.rs"]
mod chart;

use std::collections::HashSet;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use istio_cni_testing::controlplane::{self, ControlPlane, unique_name};
use k8s_openapi::api::core::v1::{Event, Namespace, Pod};
use kube::api::{Api, PostParams};
use parking_lot::Mutex;
use serde_json::{Value, json};

pub struct RealCluster {
    pub cp: &'static ControlPlane,
    suffix: String,
    home: String,
    namespaces: Mutex<HashSet<String>>,
    accounts: Mutex<HashSet<(String, String)>>,
    /// Audit entries before this are not the test's concern ([`RealCluster::clear_requests`]).
    mark: Mutex<usize>,
}

impl RealCluster {
    pub fn start() -> RealCluster {
        // Started off any runtime: its start blocks on one of its own.
        let cp = std::thread::spawn(controlplane::shared)
            .join()
            .expect("the control plane starts");
        let home = unique_name("agent");
        let suffix = home.trim_start_matches("agent-").to_string();
        cp.create_namespace(&home, &[]);
        cp.create(&json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "istio-cni", "namespace": home}}));
        for object in chart_rbac() {
            cp.create(&for_namespace(object, &home));
        }
        let mark = Mutex::new(cp.audit_mark());
        RealCluster {
            cp,
            suffix,
            home,
            namespaces: Mutex::new(HashSet::new()),
            accounts: Mutex::new(HashSet::new()),
            mark,
        }
    }

    /// The server's name of the test's namespace `name`.
    pub fn ns(&self, name: &str) -> String {
        format!("{name}-{}", self.suffix)
    }

    /// The server's name of the test's node `name`.
    pub fn node(&self, name: &str) -> String {
        format!("{name}-{}", self.suffix)
    }

    /// The agent's user name on the server.
    pub fn user(&self) -> String {
        format!("system:serviceaccount:{}:istio-cni", self.home)
    }

    /// Creates the namespace, or replaces its labels when it exists.
    pub fn add_namespace(&self, ns: Namespace) -> Result<(), String> {
        let name = self.ns(ns.metadata.name.as_deref().unwrap_or_default());
        let labels = ns.metadata.labels.clone().unwrap_or_default();
        if self.namespaces.lock().insert(name.clone()) {
            let labels: Vec<(&str, &str)> = labels
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            self.cp.create_namespace(&name, &labels);
            return Ok(());
        }
        let client = self.cp.client();
        self.cp.block_on(async move {
            let api = Api::<Namespace>::all(client);
            let mut current = api.get(&name).await.map_err(|e| e.to_string())?;
            current.metadata.labels = Some(labels);
            api.replace(&name, &PostParams::default(), &current)
                .await
                .map(|_| ())
                .map_err(|e| format!("replace namespace {name}: {e}"))
        })
    }

    /// Creates the pod in the server's names of its namespace (made when the test did not) and
    /// node, its ServiceAccount made when missing; then its status, when it has one.
    pub fn add_pod(&self, mut pod: Pod) -> Result<(), String> {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let real = self.ns(&ns);
        if !self.namespaces.lock().contains(&real) {
            self.add_namespace(Namespace {
                metadata: kube::api::ObjectMeta {
                    name: Some(ns),
                    ..Default::default()
                },
                ..Default::default()
            })?;
        }
        pod.metadata.namespace = Some(real.clone());
        let spec = pod.spec.as_mut().ok_or("a pod without spec")?;
        if let Some(node) = spec.node_name.as_mut() {
            *node = self.node(node);
        }
        let sa = spec.service_account_name.clone().unwrap_or_default();
        if !sa.is_empty()
            && sa != "default"
            && self.accounts.lock().insert((real.clone(), sa.clone()))
        {
            self.cp
                .create(&json!({"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": sa, "namespace": real}}));
        }
        let status = pod.status.take();
        let name = pod.metadata.name.clone().unwrap_or_default();
        self.cp.create_pod(&pod);
        if let Some(status) = status {
            let status = serde_json::to_value(status).map_err(|e| e.to_string())?;
            self.cp.set_pod_status(&real, &name, status);
        }
        Ok(())
    }

    /// The pod `namespace/name` (the test's namespace name) as stored now.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Pod> {
        self.cp.pod(&self.ns(namespace), name)
    }

    /// A kubeconfig for the agent: this server, its CA, a bound token of the agent's account.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<(), String> {
        self.cp.write_kubeconfig(path, &self.token());
        Ok(())
    }

    /// A bound token of the agent's account.
    pub fn token(&self) -> String {
        self.cp
            .token(&self.home, "istio-cni", Duration::from_secs(3600))
    }

    /// A kubeconfig for this server reached at `url` (a relay into a netns), with `token`.
    pub fn write_kubeconfig_for(&self, path: &Path, url: &str, token: &str) {
        use base64::Engine as _;
        let ca = base64::engine::general_purpose::STANDARD.encode(self.cp.ca_pem());
        let config = json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": url, "certificate-authority-data": ca}}],
            "users": [{"name": "u", "user": {"token": token}}],
            "contexts": [{"name": "u", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "u",
        });
        std::fs::write(path, config.to_string()).expect("write kubeconfig");
    }

    /// Deletes the pod `namespace/name` (the test's namespace name) at once.
    pub fn delete_pod(&self, namespace: &str, name: &str) {
        let (client, ns, name) = (self.cp.client(), self.ns(namespace), name.to_string());
        self.cp
            .block_on(async move {
                let params = kube::api::DeleteParams {
                    grace_period_seconds: Some(0),
                    ..Default::default()
                };
                Api::<Pod>::namespaced(client, &ns)
                    .delete(&name, &params)
                    .await
                    .map(|_| ())
            })
            .unwrap_or_else(|e| panic!("delete pod: {e}"));
    }

    /// The agent's requests since the start or the last [`RealCluster::clear_requests`]:
    /// (verb, requestURI), from the server's audit log.
    pub fn requests(&self) -> Vec<(String, String)> {
        self.cp.requests_of(&self.user(), *self.mark.lock())
    }

    pub fn clear_requests(&self) {
        *self.mark.lock() = self.cp.audit_mark();
    }

    /// The core/v1 Events stored in the test's namespace `namespace`, oldest first.
    pub fn events(&self, namespace: &str) -> Vec<Event> {
        let (client, ns) = (self.cp.client(), self.ns(namespace));
        self.cp
            .block_on(async move {
                Api::<Event>::namespaced(client, &ns)
                    .list(&Default::default())
                    .await
                    .map(|list| list.items)
            })
            .unwrap_or_else(|e| panic!("list events: {e}"))
    }

    /// A JSON merge patch of the pod `namespace/name` (the test's namespace name) by the admin,
    /// as a user's `kubectl annotate` or `kubectl label` does.
    pub fn merge_patch_pod(&self, namespace: &str, name: &str, patch: Value) -> Pod {
        let (client, ns, name) = (self.cp.client(), self.ns(namespace), name.to_string());
        self.cp
            .block_on(async move {
                Api::<Pod>::namespaced(client, &ns)
                    .patch(&name, &Default::default(), &kube::api::Patch::Merge(patch))
                    .await
            })
            .unwrap_or_else(|e| panic!("patch pod: {e}"))
    }
}

/// The chart's ClusterRoles and ClusterRoleBindings as real Helm renders them with ambient and
/// repair on (rendered once per test binary).
fn chart_rbac() -> &'static [Value] {
    static RBAC: OnceLock<Vec<Value>> = OnceLock::new();
    RBAC.get_or_init(|| {
        let case = chart::Case {
            name: "agent".into(),
            values: json!({"profile": "ambient", "repair": {"enabled": true}}),
            lint: false,
        };
        let helm = chart::render(&[case]);
        let rendered = helm.case("agent");
        let rbac: Vec<Value> = ["ClusterRole", "ClusterRoleBinding"]
            .into_iter()
            .flat_map(|kind| rendered.all(kind))
            .cloned()
            .collect();
        assert!(
            rbac.iter().any(|o| o["kind"] == "ClusterRoleBinding"),
            "the chart renders no ClusterRoleBinding"
        );
        rbac
    })
}

/// `object` (a rendered ClusterRole or ClusterRoleBinding) for the agent's account in
/// `namespace`: its name and the role it binds suffixed with the namespace (every cluster of the
/// binary has its own), the chart's ServiceAccount subject moved into the namespace.
fn for_namespace(object: &Value, namespace: &str) -> Value {
    let mut o = object.clone();
    let suffixed = |name: &Value| json!(format!("{}-{namespace}", name.as_str().expect("name")));
    o["metadata"]["name"] = suffixed(&o["metadata"]["name"]);
    if o["kind"] == "ClusterRoleBinding" {
        o["roleRef"]["name"] = suffixed(&o["roleRef"]["name"]);
        for s in o["subjects"].as_array_mut().into_iter().flatten() {
            if s["kind"] == "ServiceAccount" && s["namespace"] == chart::NAMESPACE {
                s["namespace"] = json!(namespace);
            }
        }
    }
    o
}
