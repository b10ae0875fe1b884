//! What tests do to the real API server with the admin client: namespaces (with their `default`
//! ServiceAccount), nodes, pods, pod status the way a kubelet writes it, any object from a
//! manifest, bound service-account tokens (TokenRequest), kubeconfigs.

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};

use super::{ControlPlane, ControlPlaneError, pki::Pki};

fn api_error(call: impl Into<String>) -> impl FnOnce(kube::Error) -> ControlPlaneError {
    let call = call.into();
    move |source| ControlPlaneError::Api { call, source }
}

/// A DNS-1123 name unique in this test process: `prefix-<pid>-<n>`.
pub fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A pod with one container `app`, scheduled onto `node` (no scheduler runs).
pub fn pod_on_node(namespace: &str, name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "app:1"}]}
    }))
    .expect("pod")
}

pub(super) fn write_admin_kubeconfig(
    path: &Path,
    url: &str,
    pki: &Pki,
) -> Result<(), ControlPlaneError> {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let config = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "controlplane", "cluster": {
            "server": url, "certificate-authority-data": b64(&pki.ca_pem)}}],
        "users": [{"name": "admin", "user": {
            "client-certificate-data": b64(&pki.admin_cert_pem),
            "client-key-data": b64(&pki.admin_key_pem)}}],
        "contexts": [{"name": "admin", "context": {"cluster": "controlplane", "user": "admin"}}],
        "current-context": "admin",
    });
    write(path, &config.to_string())
}

pub(super) fn write(path: &Path, text: &str) -> Result<(), ControlPlaneError> {
    std::fs::write(path, text).map_err(|source| ControlPlaneError::Write {
        path: path.to_path_buf(),
        source,
    })
}

pub(super) async fn admin_client(kubeconfig: &Path) -> Result<kube::Client, ControlPlaneError> {
    let client_error = |e: &dyn std::fmt::Display| ControlPlaneError::Client(e.to_string());
    let config = kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| client_error(&e))?;
    let config = kube::Config::from_custom_kubeconfig(config, &Default::default())
        .await
        .map_err(|e| client_error(&e))?;
    kube::Client::try_from(config).map_err(|e| client_error(&e))
}

impl ControlPlane {
    /// Creates namespace `name` with `labels`, and its `default` ServiceAccount.
    pub fn create_namespace(&self, name: &str, labels: &[(&str, &str)]) -> Namespace {
        let labels: serde_json::Map<String, Value> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), Value::from(*v)))
            .collect();
        let ns: Namespace = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": labels}
        }))
        .expect("namespace");
        let client = self.client();
        let namespace = name.to_string();
        self.block_on(async move {
            let created = Api::<Namespace>::all(client.clone())
                .create(&PostParams::default(), &ns)
                .await
                .map_err(api_error(format!("create namespace {namespace}")))?;
            let sa: ServiceAccount = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}
            }))
            .expect("service account");
            Api::<ServiceAccount>::namespaced(client, &namespace)
                .create(&PostParams::default(), &sa)
                .await
                .map_err(api_error(format!(
                    "create {namespace}/default ServiceAccount"
                )))?;
            Ok::<_, ControlPlaneError>(created)
        })
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Creates a Node named `name` (Ready, with the given InternalIP).
    pub fn create_node(&self, name: &str, internal_ip: &str) -> Node {
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        }))
        .expect("node");
        let client = self.client();
        let (name, ip) = (name.to_string(), internal_ip.to_string());
        self.block_on(async move {
            let nodes = Api::<Node>::all(client);
            nodes
                .create(&PostParams::default(), &node)
                .await
                .map_err(api_error(format!("create node {name}")))?;
            let status = json!({"status": {
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                "addresses": [{"type": "InternalIP", "address": ip}]}});
            nodes
                .patch_status(&name, &PatchParams::default(), &Patch::Strategic(status))
                .await
                .map_err(api_error(format!("set node {name} status")))
        })
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Creates `pod` as given (its status is the server's: set it with [`Self::set_pod_status`]).
    pub fn create_pod(&self, pod: &Pod) -> Pod {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let (client, pod) = (self.client(), pod.clone());
        self.block_on(async move {
            Api::<Pod>::namespaced(client, &namespace)
                .create(&PostParams::default(), &pod)
                .await
                .map_err(api_error(format!("create pod {namespace}/{name}")))
        })
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Writes a pod's status as a kubelet does: a patch of the `status` subresource (`status` is
    /// a PodStatus as JSON: phase, podIP/podIPs, container statuses) after which each list given
    /// is the list stored. A JSON merge patch, not a strategic one: that would merge `podIPs` by
    /// address, so a sandbox's new IP would join the old one where a kubelet's patch replaces it
    /// (and the server refuses two addresses of one family).
    pub fn set_pod_status(&self, namespace: &str, name: &str, status: Value) -> Pod {
        let (client, namespace, name) = (self.client(), namespace.to_string(), name.to_string());
        self.block_on(async move {
            Api::<Pod>::namespaced(client, &namespace)
                .patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "status": status })),
                )
                .await
                .map_err(api_error(format!("set pod {namespace}/{name} status")))
        })
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The pod as stored now, `None` when it is gone.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Pod> {
        let (client, namespace, name) = (self.client(), namespace.to_string(), name.to_string());
        self.block_on(async move {
            Api::<Pod>::namespaced(client, &namespace)
                .get_opt(&name)
                .await
                .map_err(api_error(format!("get pod {namespace}/{name}")))
        })
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Creates any object from its manifest (the kind's resource found by discovery); returns
    /// it as stored.
    pub fn create(&self, object: &Value) -> Value {
        let client = self.client();
        let object = object.clone();
        self.block_on(async move {
            let what = format!(
                "create {} {}/{}",
                object["kind"].as_str().unwrap_or("?"),
                object["metadata"]["namespace"].as_str().unwrap_or(""),
                object["metadata"]["name"].as_str().unwrap_or("?")
            );
            let api = dynamic_api(&client, &object)
                .await
                .map_err(api_error(what.clone()))?;
            let dynamic: DynamicObject = serde_json::from_value(object)
                .map_err(|e| ControlPlaneError::Client(format!("{what}: {e}")))?;
            let created = api
                .create(&PostParams::default(), &dynamic)
                .await
                .map_err(api_error(what.clone()))?;
            serde_json::to_value(created).map_err(|e| ControlPlaneError::Client(e.to_string()))
        })
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Deletes the object `object`'s manifest names (its kind's resource found by discovery);
    /// one already gone is fine.
    pub fn delete(&self, object: &Value) {
        let client = self.client();
        let object = object.clone();
        self.block_on(async move {
            let name = object["metadata"]["name"].as_str().unwrap_or_default();
            let what = format!(
                "delete {} {}/{name}",
                object["kind"].as_str().unwrap_or("?"),
                object["metadata"]["namespace"].as_str().unwrap_or(""),
            );
            let api = dynamic_api(&client, &object)
                .await
                .map_err(api_error(what.clone()))?;
            match api.delete(name, &Default::default()).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
                Err(e) => Err(api_error(what)(e)),
            }
        })
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// A bound token (TokenRequest API) for ServiceAccount `namespace/name`, valid `validity`.
    pub fn token(&self, namespace: &str, name: &str, validity: Duration) -> String {
        let (client, namespace, name) = (self.client(), namespace.to_string(), name.to_string());
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: vec![super::ISSUER.to_string()],
                expiration_seconds: Some(validity.as_secs() as i64),
                ..Default::default()
            },
            ..Default::default()
        };
        self.block_on(async move {
            Api::<ServiceAccount>::namespaced(client, &namespace)
                .create_token_request(&name, &PostParams::default(), &request)
                .await
                .map_err(api_error(format!("token for {namespace}/{name}")))
        })
        .map(|t| t.status.map(|s| s.token).unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Writes a kubeconfig for this API server authenticating with `token`.
    pub fn write_kubeconfig(&self, path: &Path, token: &str) {
        use base64::Engine as _;
        let config = json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "controlplane", "cluster": {
                "server": self.url(),
                "certificate-authority-data":
                    base64::engine::general_purpose::STANDARD.encode(self.ca_pem())}}],
            "users": [{"name": "user", "user": {"token": token}}],
            "contexts": [{"name": "user", "context": {"cluster": "controlplane", "user": "user"}}],
            "current-context": "user",
        });
        write(path, &config.to_string()).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// The API for `object`'s kind, in its namespace when it has one.
async fn dynamic_api(client: &kube::Client, object: &Value) -> kube::Result<Api<DynamicObject>> {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, object["kind"].as_str().unwrap_or_default());
    let (resource, caps) = kube::discovery::pinned_kind(client, &gvk).await?;
    Ok(match object["metadata"]["namespace"].as_str() {
        Some(ns) if caps.scope == kube::discovery::Scope::Namespaced => {
            Api::namespaced_with(client.clone(), ns, &resource)
        }
        _ => Api::all_with(client.clone(), &resource),
    })
}
