//! The chart rendered by real Helm, and what the checks read from it: runs `helm.py` with the venv
//! that `scripts/deps-helm` installs (helm-python-sdk, Helm's Go SDK as a library), keeps the
//! rendered objects per value set, resolves the container environment as the kubelet would, and
//! answers RBAC questions over the rendered ClusterRoles as the API server's authorizer would.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

pub const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/charts/istio-cni");
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/chart_helm/helm.py");
/// The wheel version `scripts/deps-helm` pins; a different one fails the test (it changes Helm).
pub const SDK_VERSION: &str = "0.2.2";
pub const RELEASE: &str = "istio-cni";
pub const NAMESPACE: &str = "istio-system";
/// What the kubelet would fill into the DaemonSet's fieldRefs for one of its pods.
pub const NODE: &str = "node-1";
pub const POD: &str = "istio-cni-node-h7x2q";
/// The node's addresses (`status.hostIP`, `status.hostIPs`); the probe test gives its stand-in
/// node netns these.
pub const NODE_IP: &str = "10.250.0.10";
pub const NODE_IP6: &str = "fd00:250::10";
/// `resourceFieldRef: limits.memory` without a limit resolves to the node's allocatable memory.
const NODE_MEMORY: &str = "8589934592";

/// One value set: a name for messages, the values (as `-f values.yaml` would give them), and
/// whether Helm should also lint it (invalid sets are only rendered: lint reports `fail` as info).
pub struct Case {
    pub name: String,
    pub values: Value,
    pub lint: bool,
}

/// What Helm made of one case.
pub struct Rendered {
    pub name: String,
    /// The render error (a `fail` in a template), if any.
    pub error: Option<String>,
    /// (template, object) in template order.
    pub objects: Vec<(String, Value)>,
    /// template path -> hex sha256 of its rendered text (as Helm's `sha256sum` would hash it).
    pub sha256: BTreeMap<String, String>,
    /// `helm lint --strict` findings: `{"messages": [{severity, path, error}], "errors": [..]}`.
    pub lint: Option<Value>,
}

/// Everything Helm rendered, plus the Helm version that did it.
pub struct Helm {
    pub helm_version: String,
    pub cases: BTreeMap<String, Rendered>,
}

fn venv_python() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/target/helm-venv/bin/python"
    ))
}

/// Renders (and lints) every case in one Python process.
pub fn render(cases: &[Case]) -> Helm {
    let python = venv_python();
    assert!(
        python.exists(),
        "real Helm is required by this test: run scripts/deps (it installs helm-python-sdk=={SDK_VERSION} \
         into target/helm-venv; needs python3 with venv and pip)"
    );
    let request = json!({
        "chart": CHART, "release": RELEASE, "namespace": NAMESPACE,
        "cases": cases.iter().map(|c| json!({"name": c.name, "values": c.values, "lint": c.lint}))
            .collect::<Vec<_>>(),
    });
    let mut child = Command::new(&python)
        .arg(SCRIPT)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", python.display()));
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(request.to_string().as_bytes())
        .expect("write request");
    let out = child.wait_with_output().expect("helm.py");
    assert!(
        out.status.success(),
        "helm.py failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: Value = serde_json::from_slice(&out.stdout).expect("helm.py answers JSON");
    assert_eq!(
        answer["sdk"], SDK_VERSION,
        "the venv holds another helm-python-sdk; run scripts/deps"
    );
    let cases = answer["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| {
            let objects = c["objects"]
                .as_array()
                .expect("objects")
                .iter()
                .map(|o| {
                    let template = o["template"].as_str().expect("template").to_string();
                    (template, o["object"].clone())
                })
                .collect();
            let name = c["name"].as_str().expect("name").to_string();
            let rendered = Rendered {
                name: name.clone(),
                error: c["error"].as_str().map(str::to_string),
                objects,
                sha256: strings(&c["sha256"]),
                lint: Some(c["lint"].clone()).filter(|l| !l.is_null()),
            };
            (name, rendered)
        })
        .collect();
    Helm {
        helm_version: answer["helm"].as_str().unwrap_or_default().to_string(),
        cases,
    }
}

impl Helm {
    pub fn case(&self, name: &str) -> &Rendered {
        let r = self
            .cases
            .get(name)
            .unwrap_or_else(|| panic!("no case {name}"));
        assert!(r.error.is_none(), "{name}: render failed: {:?}", r.error);
        r
    }
}

impl Rendered {
    pub fn all(&self, kind: &str) -> Vec<&Value> {
        self.objects
            .iter()
            .map(|(_, o)| o)
            .filter(|o| o["kind"] == kind)
            .collect()
    }

    pub fn find(&self, kind: &str, name: &str) -> Option<&Value> {
        self.all(kind)
            .into_iter()
            .find(|o| o["metadata"]["name"] == name)
    }

    pub fn daemonset(&self) -> &Value {
        self.find("DaemonSet", "istio-cni-node")
            .unwrap_or_else(|| panic!("{}: no DaemonSet istio-cni-node", self.name))
    }

    pub fn pod_spec(&self) -> &Value {
        &self.daemonset()["spec"]["template"]["spec"]
    }

    /// The one container, `install-cni`.
    pub fn container(&self) -> &Value {
        let containers = self.pod_spec()["containers"]
            .as_array()
            .expect("containers");
        assert_eq!(containers.len(), 1, "{}: one container", self.name);
        assert_eq!(containers[0]["name"], "install-cni");
        &containers[0]
    }

    pub fn config_data(&self) -> BTreeMap<String, String> {
        let cm = self
            .find("ConfigMap", "istio-cni-config")
            .unwrap_or_else(|| panic!("{}: no ConfigMap istio-cni-config", self.name));
        strings(&cm["data"])
    }

    /// The container's args as strings.
    pub fn args(&self) -> Vec<String> {
        self.container()["args"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|v| v.as_str().expect("arg").to_string())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// volume name -> host path.
    pub fn host_paths(&self) -> BTreeMap<String, String> {
        self.pod_spec()["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .map(|v| {
                let path = v["hostPath"]["path"].as_str().expect("hostPath volume");
                (v["name"].as_str().expect("name").to_string(), path.into())
            })
            .collect()
    }

    /// volume name -> mount path in the container.
    pub fn mounts(&self) -> BTreeMap<String, String> {
        self.container()["volumeMounts"]
            .as_array()
            .expect("volumeMounts")
            .iter()
            .map(|m| {
                let path = m["mountPath"].as_str().expect("mountPath");
                (m["name"].as_str().expect("name").to_string(), path.into())
            })
            .collect()
    }

    /// The container's environment as the kubelet builds it: `envFrom` first, then `env` (which
    /// wins), with `valueFrom` resolved for a pod named [`POD`] on [`NODE`].
    pub fn container_env(&self) -> BTreeMap<String, String> {
        let c = self.container();
        let mut env = BTreeMap::new();
        for from in c["envFrom"].as_array().into_iter().flatten() {
            let name = from["configMapRef"]["name"]
                .as_str()
                .unwrap_or_else(|| panic!("{}: unsupported envFrom {from}", self.name));
            let cm = self.find("ConfigMap", name).unwrap_or_else(|| {
                panic!("{}: envFrom names a missing ConfigMap {name}", self.name)
            });
            env.extend(strings(&cm["data"]));
        }
        for e in c["env"].as_array().into_iter().flatten() {
            let key = e["name"].as_str().expect("env name").to_string();
            let value = match (&e["value"], &e["valueFrom"]) {
                (Value::String(v), Value::Null) => v.clone(),
                (Value::Null, Value::Null) => String::new(),
                (Value::Null, from) => self.value_from(&key, from),
                _ => panic!(
                    "{}: env {key}: neither a string value nor valueFrom: {e}",
                    self.name
                ),
            };
            env.insert(key, value);
        }
        env
    }

    fn value_from(&self, key: &str, from: &Value) -> String {
        if let Some(path) = from["fieldRef"]["fieldPath"].as_str() {
            return match path {
                "spec.nodeName" => NODE.into(),
                "metadata.name" => POD.into(),
                "status.hostIP" => NODE_IP.into(),
                "status.hostIPs" => format!("{NODE_IP},{NODE_IP6}"),
                // The pod runs where its DaemonSet is.
                "metadata.namespace" => self.daemonset()["metadata"]["namespace"]
                    .as_str()
                    .expect("DaemonSet namespace")
                    .into(),
                other => panic!(
                    "{}: env {key}: fieldRef {other} not resolved here",
                    self.name
                ),
            };
        }
        if from["resourceFieldRef"]["resource"] == "limits.memory" {
            return NODE_MEMORY.into();
        }
        if let Some(cm) = from["configMapKeyRef"]["name"].as_str() {
            let k = from["configMapKeyRef"]["key"].as_str().expect("key");
            return self
                .find("ConfigMap", cm)
                .and_then(|o| o["data"][k].as_str())
                .unwrap_or_else(|| panic!("{}: env {key}: no key {k} in ConfigMap {cm}", self.name))
                .into();
        }
        panic!("{}: env {key}: unsupported valueFrom {from}", self.name)
    }

    /// Whether the rendered RBAC lets the DaemonSet's service account make `call`: the rules of
    /// every ClusterRole bound to it by a rendered ClusterRoleBinding (no aggregation, no
    /// wildcards needed beyond `*`).
    pub fn allows(&self, call: &ApiCall) -> bool {
        let sa = self.pod_spec()["serviceAccountName"].as_str().expect("SA");
        let ns = self.daemonset()["metadata"]["namespace"]
            .as_str()
            .expect("ns");
        let bound =
            self.all("ClusterRoleBinding").into_iter().filter(|b| {
                b["subjects"].as_array().into_iter().flatten().any(|s| {
                    s["kind"] == "ServiceAccount" && s["name"] == sa && s["namespace"] == ns
                })
            });
        let has = |list: &Value, want: &str| {
            list.as_array()
                .into_iter()
                .flatten()
                .any(|v| v == want || v == "*")
        };
        bound
            .filter(|b| b["roleRef"]["kind"] == "ClusterRole")
            .filter_map(|b| self.find("ClusterRole", b["roleRef"]["name"].as_str()?))
            .flat_map(|role| role["rules"].as_array().into_iter().flatten())
            .any(|rule| {
                has(&rule["apiGroups"], &call.group)
                    && has(&rule["resources"], &call.resource)
                    && has(&rule["verbs"], &call.verb)
                    && match (rule["resourceNames"].as_array(), &call.name) {
                        (None, _) => true,
                        (Some(names), Some(n)) => names.iter().any(|v| v == n.as_str()),
                        (Some(names), None) => names.is_empty(),
                    }
            })
    }
}

fn strings(map: &Value) -> BTreeMap<String, String> {
    map.as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_str().expect("string value").to_string()))
        .collect()
}

/// One API request in RBAC terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiCall {
    pub verb: String,
    /// "" for the core group.
    pub group: String,
    /// `pods`, or `pods/status` for a subresource.
    pub resource: String,
    pub name: Option<String>,
}

impl ApiCall {
    pub fn new(verb: &str, group: &str, resource: &str, name: Option<&str>) -> Self {
        ApiCall {
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            name: name.map(str::to_string),
        }
    }

    /// The request an HTTP call to the API server is, as its RBAC request-info resolver sees it.
    pub fn from_http(method: &str, path: &str, watch: bool) -> ApiCall {
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (group, rest) = match parts.as_slice() {
            ["api", _version, rest @ ..] => ("", rest),
            ["apis", group, _version, rest @ ..] => (*group, rest),
            _ => panic!("not an API path: {path}"),
        };
        let rest = match rest {
            ["namespaces", _ns, more @ ..] if !more.is_empty() => more,
            other => other,
        };
        let (resource, name) = match rest {
            [resource] => (resource.to_string(), None),
            [resource, name] => (resource.to_string(), Some(*name)),
            [resource, name, sub] => (format!("{resource}/{sub}"), Some(*name)),
            _ => panic!("unexpected API path: {path}"),
        };
        let verb = match (method, name.is_some(), watch) {
            ("GET", _, true) => "watch",
            ("GET", true, false) => "get",
            ("GET", false, false) => "list",
            ("POST", _, _) => "create",
            ("PATCH", _, _) => "patch",
            ("PUT", _, _) => "update",
            ("DELETE", _, _) => "delete",
            other => panic!("unexpected method {other:?} on {path}"),
        };
        ApiCall::new(verb, group, &resource, name)
    }
}
