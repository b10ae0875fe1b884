//! A release of the rendered chart on the real kube-apiserver (`istio_cni_testing::controlplane`,
//! shared by the test binary): the objects the DaemonSet's pod needs (ServiceAccount,
//! ClusterRoles, bindings, ConfigMap, the DaemonSet itself) created as rendered, in a namespace
//! of the release's own, the cluster-scoped ones under names suffixed with it, and a node of its
//! own; what the kubelet would give the pod (its fieldRefs, a bound token of the chart's
//! ServiceAccount, the CA); and the pod's requests as the server saw and authorized them (its
//! audit log).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use istio_cni_testing::controlplane::{ControlPlane, unique_name};
use serde_json::{Value, json};

use crate::chart::{ApiCall, NAMESPACE, Rendered};

/// The kinds applied (what the DaemonSet's pod needs from the release), in the order
/// `helm uninstall` deletes them.
const KINDS: [&str; 7] = [
    "DaemonSet",
    "RoleBinding",
    "Role",
    "ClusterRoleBinding",
    "ClusterRole",
    "ConfigMap",
    "ServiceAccount",
];

/// One release on the shared API server.
pub struct Release {
    pub cp: &'static ControlPlane,
    /// Where the rendered namespaced objects went (the chart renders them into [`NAMESPACE`]).
    pub namespace: String,
    /// The node the release's pod runs on.
    pub node: String,
    /// The DaemonSet pod's ServiceAccount.
    pub service_account: String,
    /// The names of the release's ClusterRoleBindings on the server.
    pub bindings: Vec<String>,
    /// The objects as created (what an uninstall deletes).
    objects: Vec<Value>,
    /// Audit entries before the release are not its concern.
    mark: usize,
}

/// One request of the release's pod as the API server resolved, authorized and answered it.
#[derive(Debug, Clone)]
pub struct Audited {
    /// The RBAC request it was (the server's own request-info: verb, group, resource/subresource,
    /// name).
    pub call: ApiCall,
    pub uri: String,
    pub code: u64,
    /// `allow` or `forbid`, and why (for RBAC: the binding and role that allowed it).
    pub decision: String,
    pub reason: String,
}

/// Creates `r`'s objects as a release of its own; each object passes through `edit` first.
/// `rbac_from` supplies the ClusterRoles and their bindings when `r` renders none (the
/// namespace-scoped half of a split release).
pub fn install(
    cp: &'static ControlPlane,
    r: &Rendered,
    rbac_from: Option<&Rendered>,
    edit: impl Fn(&mut Value),
) -> Release {
    let namespace = unique_name("istio-system");
    let node = unique_name("node");
    cp.create_namespace(&namespace, &[]);
    cp.create_node(&node, "192.0.2.1");
    label_as_kubelet(cp, &node);
    let cluster_scoped = |o: &&Value| o["kind"].as_str().is_some_and(|k| k.starts_with("Cluster"));
    let own: Vec<&Value> = r.objects.iter().map(|(_, o)| o).collect();
    let extra: Vec<&Value> = match rbac_from {
        Some(other) if !own.iter().any(cluster_scoped) => other
            .objects
            .iter()
            .map(|(_, o)| o)
            .filter(cluster_scoped)
            .collect(),
        _ => Vec::new(),
    };
    let mut bindings = Vec::new();
    let mut objects = Vec::new();
    for object in own.into_iter().chain(extra) {
        let kind = object["kind"].as_str().unwrap_or_default();
        if !KINDS.contains(&kind) {
            continue;
        }
        let mut o = for_release(object, &namespace);
        edit(&mut o);
        if kind == "ClusterRoleBinding" {
            bindings.push(o["metadata"]["name"].as_str().unwrap_or_default().into());
        }
        cp.create(&o);
        objects.push(o);
    }
    let service_account = r.pod_spec()["serviceAccountName"]
        .as_str()
        .expect("serviceAccountName")
        .to_string();
    Release {
        cp,
        namespace,
        node,
        service_account,
        bindings,
        objects,
        mark: 0,
    }
    .marked()
}

/// The labels a kubelet puts on its node (the chart's DaemonSet selects `kubernetes.io/os`).
fn label_as_kubelet(cp: &ControlPlane, node: &str) {
    use k8s_openapi::api::core::v1::Node;
    let (client, name) = (cp.client(), node.to_string());
    let labels = json!({"metadata": {"labels": {"kubernetes.io/os": "linux"}}});
    cp.block_on(async move {
        kube::api::Api::<Node>::all(client)
            .patch(&name, &Default::default(), &kube::api::Patch::Merge(labels))
            .await
            .map(|_| ())
    })
    .unwrap_or_else(|e| panic!("label node {node}: {e}"));
}

/// `object` moved into the release: namespaced objects into `namespace`, cluster-scoped ones
/// (and the roles bindings name) suffixed with it, bindings' subjects in the chart's namespace
/// pointed at it.
fn for_release(object: &Value, namespace: &str) -> Value {
    let suffixed = |name: &Value| json!(format!("{}-{namespace}", name.as_str().expect("name")));
    let kind = object["kind"].as_str().unwrap_or_default();
    let mut o = object.clone();
    if o["metadata"]["namespace"].is_string() {
        o["metadata"]["namespace"] = json!(namespace);
    }
    if kind.starts_with("Cluster") {
        o["metadata"]["name"] = suffixed(&o["metadata"]["name"]);
    }
    if kind.ends_with("Binding") {
        if o["roleRef"]["kind"] == "ClusterRole" {
            o["roleRef"]["name"] = suffixed(&o["roleRef"]["name"]);
        }
        for s in o["subjects"].as_array_mut().into_iter().flatten() {
            if s["namespace"] == NAMESPACE {
                s["namespace"] = json!(namespace);
            }
        }
    }
    o
}

impl Release {
    fn marked(mut self) -> Release {
        self.mark = self.cp.audit_mark();
        self
    }

    /// The pod's user name on the server.
    pub fn user(&self) -> String {
        format!(
            "system:serviceaccount:{}:{}",
            self.namespace, self.service_account
        )
    }

    /// A bound token of the chart's ServiceAccount (TokenRequest), as the kubelet projects one.
    pub fn token(&self) -> String {
        self.cp.token(
            &self.namespace,
            &self.service_account,
            Duration::from_secs(3600),
        )
    }

    /// The service-account mount: a bound token, the server's CA, the namespace.
    pub fn write_service_account(&self, dir: &Path) {
        std::fs::write(dir.join("token"), self.token()).expect("token");
        std::fs::write(dir.join("ca.crt"), self.cp.ca_pem()).expect("ca.crt");
        std::fs::write(dir.join("namespace"), &self.namespace).expect("namespace");
    }

    /// A kubeconfig for the pod's own client: the server at `url` (a relay into the node's
    /// netns), its CA, a bound token.
    pub fn write_kubeconfig(&self, path: &Path, url: &str) {
        use base64::Engine as _;
        let ca = base64::engine::general_purpose::STANDARD.encode(self.cp.ca_pem());
        let config = json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": url, "certificate-authority-data": ca}}],
            "users": [{"name": "u", "user": {"token": self.token()}}],
            "contexts": [{"name": "u", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "u",
        });
        std::fs::write(path, config.to_string()).expect("write kubeconfig");
    }

    /// The rendered environment's fieldRefs as the kubelet resolves them for this release's pod
    /// (the chart resolves them for [`NAMESPACE`] and `chart::NODE`).
    pub fn resolve(&self, env: &mut BTreeMap<String, String>) {
        for key in ["NODE_NAME", "REPAIR_NODE_NAME"] {
            if env.contains_key(key) {
                env.insert(key.into(), self.node.clone());
            }
        }
        env.insert("POD_NAMESPACE".into(), self.namespace.clone());
    }

    /// `helm uninstall`: every object of the release deleted, in Helm's uninstall order (the
    /// DaemonSet first, the ServiceAccount last). No controller runs here: the test stops the pod.
    pub fn uninstall(&self) {
        let order = |o: &Value| {
            KINDS
                .iter()
                .position(|k| o["kind"] == *k)
                .unwrap_or(KINDS.len())
        };
        let mut objects: Vec<&Value> = self.objects.iter().collect();
        objects.sort_by_key(|o| order(o));
        for o in objects {
            self.cp.delete(o);
        }
    }

    /// What the server answers `token` asking for the release's DaemonSet (the shutdown's
    /// question): whether it exists, or the refusal.
    pub fn ask_with(&self, token: &str) -> Result<bool, istio_cni::kube::KubeError> {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("kubeconfig");
        self.cp.write_kubeconfig(&path, token);
        let namespace = self.namespace.clone();
        self.cp.block_on(async move {
            let client = istio_cni::kube::KubeClient::from_kubeconfig_file(&path).await?;
            client
                .get_daemonset(&namespace, "istio-cni-node", Duration::from_secs(10))
                .await
                .map(|ds| ds.is_some())
        })
    }

    /// Every request the release's pod made so far, as the server resolved and answered it.
    pub fn requests(&self) -> Vec<Audited> {
        self.cp
            .audit_of(&self.user(), self.mark)
            .iter()
            .map(audited)
            .collect()
    }

    /// Panics unless the server allowed every request of the pod through one of the release's
    /// own ClusterRoleBindings and answered none of them 401 or 403.
    pub fn assert_all_allowed_by_its_rbac(&self, what: &str, calls: &[Audited]) {
        for a in calls {
            let by_ours = self
                .bindings
                .iter()
                .any(|b| a.reason.contains(&format!("ClusterRoleBinding \"{b}\"")));
            assert!(
                a.decision == "allow" && by_ours && a.code != 401 && a.code != 403,
                "{what}: {} {} was {} ({}), answered {}; the release's bindings: {:?}",
                a.call.verb,
                a.uri,
                a.decision,
                a.reason,
                a.code,
                self.bindings
            );
        }
    }
}

/// An audit entry in the terms of the chart's RBAC.
fn audited(e: &Value) -> Audited {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let object = &e["objectRef"];
    let resource = match object["subresource"].as_str() {
        Some(sub) => format!("{}/{sub}", text(&object["resource"])),
        None => text(&object["resource"]),
    };
    let name = object["name"].as_str();
    Audited {
        call: ApiCall::new(
            e["verb"].as_str().unwrap_or_default(),
            object["apiGroup"].as_str().unwrap_or_default(),
            &resource,
            name,
        ),
        uri: text(&e["requestURI"]),
        code: e["responseStatus"]["code"].as_u64().unwrap_or_default(),
        decision: text(&e["annotations"]["authorization.k8s.io/decision"]),
        reason: text(&e["annotations"]["authorization.k8s.io/reason"]),
    }
}

/// A sidecar pod `namespace/broken` on `node` whose `istio-validation` init container last
/// exited 126 (it started before the plugin), its status written as the kubelet writes it.
pub fn create_broken_sidecar_pod(cp: &ControlPlane, namespace: &str, node: &str) {
    let mut pod = istio_cni_testing::controlplane::pod_on_node(namespace, "broken", node);
    pod.metadata.annotations = Some([("sidecar.istio.io/status".into(), "{}".into())].into());
    let spec = pod.spec.as_mut().expect("spec");
    spec.init_containers = Some(vec![
        serde_json::from_value(json!({"name": "istio-validation", "image": "proxyv2"}))
            .expect("container"),
    ]);
    spec.containers.push(
        serde_json::from_value(json!({"name": "istio-proxy", "image": "proxyv2"})).expect("c"),
    );
    cp.create_pod(&pod);
    cp.set_pod_status(
        namespace,
        "broken",
        json!({"phase": "Pending", "podIP": "10.250.0.3", "podIPs": [{"ip": "10.250.0.3"}],
               "initContainerStatuses": [{
                   "name": "istio-validation", "ready": false, "restartCount": 2,
                   "image": "proxyv2", "imageID": "",
                   "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                   "lastState": {"terminated": {"exitCode": 126, "reason": "Error"}}}]}),
    );
}

/// The events in `namespace` about the object named `name`, as stored on the server.
pub fn events_about(cp: &ControlPlane, namespace: &str, name: &str) -> Vec<Value> {
    use k8s_openapi::api::core::v1::Event;
    let (client, ns, name) = (cp.client(), namespace.to_string(), name.to_string());
    cp.block_on(async move {
        kube::api::Api::<Event>::namespaced(client, &ns)
            .list(&Default::default())
            .await
            .expect("list events")
            .items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(name.as_str()))
            .map(|e| serde_json::to_value(e).expect("event JSON"))
            .collect()
    })
}
