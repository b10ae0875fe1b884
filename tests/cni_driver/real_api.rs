//! The plugin tests' API server helpers on the real kube-apiserver
//! (`istio_cni_testing::controlplane`, one per test binary): the same calls as the test API
//! server's `FakeApiServer` (`put_pod`, `put_namespace`, `write_kubeconfig`), for the happy-path
//! tests; fault injection stays on the test API server.
//!
//! The server is shared by every test of the binary, so each `RealApi` keeps its objects apart:
//! a namespace `amb` is created as `amb-<suffix>` ([`RealApi::ns`] names it for the CNI args and
//! the assertions), and pods are moved into their namespace's real name. The plugin's
//! kubeconfig carries a bound token of a ServiceAccount granted what the chart grants the
//! plugin's reads (get pods and namespaces), so RBAC is enforced on every GET.

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use istio_cni_testing::controlplane::{self, ControlPlane, unique_name};
use parking_lot::Mutex;
use serde_json::{Value, json};

/// A test's corner of the shared real API server.
pub struct RealApi {
    pub cp: &'static ControlPlane,
    suffix: String,
    /// The real namespace names made so far.
    created: Mutex<HashSet<String>>,
    /// The namespace holding the plugin's ServiceAccount.
    home: String,
}

impl RealApi {
    pub fn start() -> RealApi {
        let cp = controlplane::shared();
        let home = unique_name("cni");
        let suffix = home.trim_start_matches("cni-").to_string();
        cp.create_namespace(&home, &[]);
        cp.create(&json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "istio-cni", "namespace": home}}));
        let role = format!("plugin-reads-{home}");
        cp.create(
            &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": role},
            "rules": [{"apiGroups": [""], "resources": ["pods", "namespaces"], "verbs": ["get"]}]}),
        );
        cp.create(&json!({"apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding", "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": "istio-cni", "namespace": home}]}));
        RealApi {
            cp,
            suffix,
            created: Mutex::new(HashSet::new()),
            home,
        }
    }

    /// The real name of the test's namespace `name`.
    pub fn ns(&self, name: &str) -> String {
        format!("{name}-{}", self.suffix)
    }

    pub fn put_namespace(&self, name: &str, labels: Value) {
        let real = self.ns(name);
        let labels: Vec<(String, String)> = labels
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
            .collect();
        let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (&**k, &**v)).collect();
        self.cp.create_namespace(&real, &labels);
        self.created.lock().insert(real);
    }

    /// Creates the pod in its namespace's real name (made, unlabelled, when the test did not);
    /// containers without an image get one (the real server requires it).
    pub fn put_pod(&self, mut pod: Value) {
        let ns = pod["metadata"]["namespace"].as_str().unwrap_or("default");
        let real = self.ns(ns);
        if !self.created.lock().contains(&real) {
            self.put_namespace(ns, json!({}));
        }
        pod["metadata"]["namespace"] = json!(real);
        for list in ["containers", "initContainers"] {
            for c in pod["spec"][list].as_array_mut().into_iter().flatten() {
                if c.get("image").is_none() {
                    c["image"] = json!("registry.invalid/test:1");
                }
            }
        }
        let pod = serde_json::from_value(pod).expect("a valid Pod");
        self.cp.create_pod(&pod);
    }

    /// Writes `istio-cni-kubeconfig` into `run_dir` as install-cni does for the plugin: this
    /// server, its CA and a bound token of the plugin's ServiceAccount.
    pub fn write_kubeconfig(&self, run_dir: &Path) {
        let token = self
            .cp
            .token(&self.home, "istio-cni", Duration::from_secs(3600));
        self.cp
            .write_kubeconfig(&run_dir.join("istio-cni-kubeconfig"), &token);
    }
}

/// [`super::api_and_run_dir`] on the real API server.
pub fn real_api_and_run_dir() -> (RealApi, tempfile::TempDir) {
    let api = RealApi::start();
    let dir = tempfile::tempdir().unwrap();
    api.write_kubeconfig(dir.path());
    (api, dir)
}
