//! One real node for a test: the control plane, our image (scripts/image, the image test's
//! profile), the node with that image imported, and the chart rendered by real Helm and applied
//! with the node's CNI dirs. Tests take [`serial`] first: the node's bridge and the chart's fixed
//! host paths are the machine's.

use std::collections::BTreeMap;
use std::time::Duration;

use istio_cni_testing::controlplane::ControlPlane;
use istio_cni_testing::node::Node;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

use crate::chart::{self, Case};
use crate::podman;

pub const T: Duration = Duration::from_secs(120);

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

pub struct Cluster {
    // Field order is drop order: the node goes before the control plane it talks to.
    pub node: Node,
    pub cp: ControlPlane,
    pub image: String,
}

impl Cluster {
    pub fn start() -> Cluster {
        Self::start_with_tags(&[])
    }

    /// A node that also has our image under each of `tags` (podman tags of the built image).
    pub fn start_with_tags(tags: &[&str]) -> Cluster {
        let t0 = std::time::Instant::now();
        let built = podman::build();
        eprintln!("image {} built in {:?}", built.image, built.took);
        let mut images = vec![built.image.as_str()];
        for tag in tags {
            let ok = std::process::Command::new("podman")
                .args(["tag", &built.image, tag])
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "podman tag {} {tag}", built.image);
            images.push(tag);
        }
        let cp = ControlPlane::start().unwrap_or_else(|e| panic!("control plane: {e}"));
        let node = Node::start(&cp, &images).unwrap_or_else(|e| panic!("node: {e}"));
        eprintln!(
            "node {} Ready in {:?} (everything in {:?})",
            node.name(),
            node.start_took(),
            t0.elapsed()
        );
        Cluster {
            node,
            cp,
            image: built.image,
        }
    }

    /// The chart's values for this node: our image and the node's CNI dirs.
    pub fn values(&self, extra: Value) -> Value {
        let mut v = json!({
            "image": self.image,
            "cniBinDir": self.node.cni_bin_dir(),
            "cniConfDir": self.node.cni_conf_dir(),
            "cniNetnsDir": istio_cni_testing::node::NETNS_DIR_ON_NODE,
        });
        merge(&mut v, extra);
        v
    }

    /// Renders the chart with real Helm and creates every object it rendered (the namespace
    /// first). Returns the rendered objects.
    pub fn install_chart(&self, extra: Value) -> Vec<Value> {
        let case = Case {
            name: "real-node".into(),
            values: self.values(extra),
            lint: false,
        };
        let mut helm = chart::render(&[case]);
        let r = helm.cases.remove("real-node").expect("rendered case");
        assert!(r.error.is_none(), "render failed: {:?}", r.error);
        self.create_namespace(chart::NAMESPACE, &[]);
        let objects: Vec<Value> = r.objects.into_iter().map(|(_, o)| o).collect();
        for o in &objects {
            self.cp.create(o);
        }
        objects
    }

    /// A namespace (its `default` ServiceAccount comes from the controller-manager).
    pub fn create_namespace(&self, name: &str, labels: &[(&str, &str)]) {
        let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
        let ns = json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": labels}});
        let exists = {
            let client = self.cp.client();
            let n = name.to_string();
            self.cp.block_on(async move {
                Api::<k8s_openapi::api::core::v1::Namespace>::all(client)
                    .get_opt(&n)
                    .await
                    .ok()
                    .flatten()
                    .is_some()
            })
        };
        if !exists {
            self.cp.create(&ns);
        }
    }

    /// Sets (`Some`) or removes (`None`) one label of a namespace.
    pub fn label_namespace(&self, name: &str, key: &str, value: Option<&str>) {
        use kube::api::{Patch, PatchParams};
        let (client, n) = (self.cp.client(), name.to_string());
        let patch = json!({"metadata": {"labels": {key: value}}});
        self.cp
            .block_on(async move {
                Api::<k8s_openapi::api::core::v1::Namespace>::all(client)
                    .patch(&n, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
            })
            .unwrap_or_else(|e| panic!("label namespace {name}: {e}"));
    }

    /// Sets the image of the DaemonSet's container (a strategic merge by container name).
    pub fn set_daemonset_image(&self, image: &str) {
        use k8s_openapi::api::apps::v1::DaemonSet;
        use kube::api::{Patch, PatchParams};
        let client = self.cp.client();
        let patch = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "install-cni", "image": image}]}}}});
        self.cp
            .block_on(async move {
                Api::<DaemonSet>::namespaced(client, chart::NAMESPACE)
                    .patch(
                        "istio-cni-node",
                        &PatchParams::default(),
                        &Patch::Strategic(&patch),
                    )
                    .await
            })
            .unwrap_or_else(|e| panic!("patch the DaemonSet's image: {e}"));
    }

    /// Deletes a pod without waiting for it to go.
    pub fn delete_pod_nowait(&self, namespace: &str, name: &str) {
        use kube::api::DeleteParams;
        let (client, ns, n) = (self.cp.client(), namespace.to_string(), name.to_string());
        self.cp
            .block_on(async move {
                Api::<Pod>::namespaced(client, &ns)
                    .delete(&n, &DeleteParams::default())
                    .await
            })
            .unwrap_or_else(|e| panic!("delete pod {namespace}/{name}: {e}"));
    }

    /// The pods in `namespace` on the node.
    pub fn pods(&self, namespace: &str) -> Vec<Pod> {
        let (client, ns) = (self.cp.client(), namespace.to_string());
        self.cp
            .block_on(async move {
                Api::<Pod>::namespaced(client, &ns)
                    .list(&ListParams::default())
                    .await
            })
            .map(|l| l.items)
            .unwrap_or_default()
    }

    /// Waits for the DaemonSet's pod on the node to be ready; returns it.
    pub fn wait_agent_ready(&self) -> Pod {
        let mut name = None;
        let deadline = std::time::Instant::now() + T;
        while name.is_none() && std::time::Instant::now() < deadline {
            name = self
                .pods(chart::NAMESPACE)
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .find_map(|p| p.metadata.name);
            std::thread::sleep(Duration::from_millis(300));
        }
        let name = name.unwrap_or_else(|| {
            panic!(
                "no DaemonSet pod created; controller-manager log:\n{}",
                self.node.log_tail("kube-controller-manager", 20)
            )
        });
        self.node
            .wait_pod_ready(&self.cp, chart::NAMESPACE, &name, T)
            .unwrap_or_else(|e| {
                panic!(
                    "agent pod: {e}\ncontainerd:\n{}",
                    self.node.log_tail("containerd", 20)
                )
            })
    }

    /// Deletes every object `install_chart` created (`helm uninstall`), the DaemonSet first.
    pub fn uninstall_chart(&self, objects: &[Value]) {
        for o in objects.iter().rev() {
            let (client, o) = (self.cp.client(), o.clone());
            self.cp
                .block_on(async move { delete_object(&client, &o).await })
                .unwrap_or_else(|e| panic!("uninstall: {e}"));
        }
    }

    /// Creates a pod from its manifest.
    pub fn create_pod(&self, pod: Value) {
        self.cp.create(&pod);
    }

    /// The `type` of every plugin in the node's conflist, in order.
    pub fn conflist_types(&self) -> Vec<String> {
        let path = self.node.cni_conf_dir().join("10-bridge.conflist");
        let text = std::fs::read_to_string(&path).expect("the node's conflist");
        let conflist: Value = serde_json::from_str(&text).expect("conflist JSON");
        conflist["plugins"]
            .as_array()
            .unwrap_or_else(|| panic!("no plugins in {text}"))
            .iter()
            .filter_map(|p| p["type"].as_str().map(str::to_string))
            .collect()
    }
}

fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (slot, v) => *slot = v,
    }
}

/// A pod running the workload image: each entry of `containers` is (name, args).
pub fn workload_pod(
    namespace: &str,
    name: &str,
    annotations: Value,
    containers: &[(&str, &[&str])],
) -> Value {
    let containers: Vec<Value> = containers
        .iter()
        .map(|(n, args)| {
            json!({"name": n, "image": istio_cni_testing::node::WORKLOAD_IMAGE,
                   "imagePullPolicy": "Never", "args": args})
        })
        .collect();
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {"containers": containers, "terminationGracePeriodSeconds": 2,
                 "automountServiceAccountToken": false}})
}

/// The pod's IPv4 address.
pub fn pod_ip(pod: &Pod) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .expect("pod IP")
}

/// Connects to `addr` and reads the workload's one-line answer.
pub fn ask(addr: &str) -> Result<String, String> {
    use std::io::Read as _;
    let sock: std::net::SocketAddr = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
    let mut s = std::net::TcpStream::connect_timeout(&sock, Duration::from_secs(5))
        .map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let mut out = String::new();
    s.read_to_string(&mut out)
        .map_err(|e| format!("read {addr}: {e}"))?;
    Ok(out.trim().to_string())
}

/// `iptables-save` and `nft list ruleset` as seen in process `pid`'s network namespace.
pub fn netns_rules(pid: u32) -> String {
    istio_cni_testing::node::in_netns(pid, || {
        let mut all = String::new();
        for (prog, args) in [
            ("iptables-save", &[][..]),
            ("iptables-legacy-save", &[][..]),
            ("nft", &["list", "ruleset"][..]),
        ] {
            if let Ok(o) = std::process::Command::new(prog).args(args).output() {
                all.push_str(&String::from_utf8_lossy(&o.stdout));
            }
        }
        all
    })
    .expect("enter the pod netns")
}

async fn delete_object(client: &kube::Client, object: &Value) -> Result<(), String> {
    use kube::api::{DeleteParams, DynamicObject};
    use kube::core::GroupVersionKind;
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let kind = object["kind"].as_str().unwrap_or_default();
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, caps) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .map_err(|e| format!("{kind}: {e}"))?;
    let api: Api<DynamicObject> = match object["metadata"]["namespace"].as_str() {
        Some(ns) if caps.scope == kube::discovery::Scope::Namespaced => {
            Api::namespaced_with(client.clone(), ns, &resource)
        }
        _ => Api::all_with(client.clone(), &resource),
    };
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(format!("delete {kind} {name}: {e}")),
    }
}
