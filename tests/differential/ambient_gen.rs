//! Generated ambient inputs: the node's settings (data-plane backend, DNS capture, excluded
//! namespaces) and a handful of pods in namespaces labelled for ambient or not, each with the
//! labels and annotations that decide enrolment and shape its in-pod rules (dataplane-mode,
//! sidecar status, inbound bypass, per-pod DNS capture, reroute interfaces), its service account,
//! whether a container process runs in it (what a restarted agent's /proc scan finds), whether
//! it is taken out of the mesh by a label later and whether it is torn down and deleted at the end. Seeded: the same seed gives the same cases.

#[allow(dead_code)]
#[path = "rng.rs"]
mod rng;
pub use rng::Rng;

use serde_json::{Map, Value, json};

/// The namespaces every case has: (name, its `istio.io/dataplane-mode` label).
pub const NAMESPACES: &[(&str, Option<&str>)] = &[
    ("mesh", Some("ambient")),
    ("plain", None),
    ("off", Some("none")),
];

#[derive(Clone, Debug)]
pub struct GenPod {
    pub name: String,
    /// Index into [`NAMESPACES`].
    pub ns: usize,
    pub labels: Vec<(String, String)>,
    pub annotations: Vec<(String, String)>,
    pub service_account: Option<String>,
    /// A container process in its netns, in a cgroup naming its UID.
    pub process: bool,
    /// Relabelled `istio.io/dataplane-mode=none` after the agent's restart (out of the mesh).
    pub unenrol: bool,
    /// Torn down (CNI DEL) and deleted from the API server at the end.
    pub delete: bool,
}

#[derive(Clone, Debug)]
pub struct Case {
    pub nftables: bool,
    pub dns_capture: Option<bool>,
    pub exclude: Option<String>,
    pub pods: Vec<GenPod>,
}

impl Case {
    /// The node settings both agents get (besides the harness's own); `ns` gives a namespace's
    /// name on the API server.
    pub fn env(&self, ns: impl Fn(&str) -> String) -> Vec<(String, String)> {
        let mut env = Vec::new();
        if let Some(d) = self.dns_capture {
            env.push(("AMBIENT_DNS_CAPTURE".to_string(), d.to_string()));
        }
        if let Some(e) = &self.exclude {
            let names: Vec<String> = e.split(',').map(&ns).collect();
            env.push(("EXCLUDE_NAMESPACES".to_string(), names.join(",")));
        }
        // Both agents reconcile in-pod rules of enrolled pods at start (the chart's default).
        env.push((
            "AMBIENT_RECONCILE_POD_RULES_ON_STARTUP".to_string(),
            "true".to_string(),
        ));
        env
    }

    pub fn namespace(&self, pod: &GenPod) -> &'static str {
        NAMESPACES[pod.ns].0
    }

    /// The pod as created on the API server (its namespace and node are the test's names).
    pub fn pod_json(&self, pod: &GenPod, node: &str) -> Value {
        let map = |kv: &[(String, String)]| {
            kv.iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect::<Map<String, Value>>()
        };
        let mut spec = json!({"nodeName": node,
            "containers": [{"name": "app", "image": "registry.invalid/app:1"}]});
        if let Some(sa) = &pod.service_account {
            spec["serviceAccountName"] = json!(sa);
        }
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod.name, "namespace": self.namespace(pod),
                "labels": map(&pod.labels), "annotations": map(&pod.annotations)},
            "spec": spec})
    }

    /// Smaller cases that may still fail the same way, simplest first.
    pub fn shrinks(&self) -> Vec<Case> {
        let mut out = Vec::new();
        for i in 0..self.pods.len() {
            let mut c = self.clone();
            c.pods.remove(i);
            out.push(c);
        }
        if self.dns_capture.is_some() {
            out.push(Case {
                dns_capture: None,
                ..self.clone()
            });
        }
        if self.exclude.is_some() {
            out.push(Case {
                exclude: None,
                ..self.clone()
            });
        }
        for i in 0..self.pods.len() {
            for j in 0..self.pods[i].annotations.len() {
                let mut c = self.clone();
                c.pods[i].annotations.remove(j);
                out.push(c);
            }
            if self.pods[i].process || self.pods[i].delete || self.pods[i].unenrol {
                let mut c = self.clone();
                c.pods[i].process = false;
                c.pods[i].delete = false;
                c.pods[i].unenrol = false;
                out.push(c);
            }
        }
        out
    }

    pub fn describe(&self) -> String {
        let mut s = format!(
            "backend {}, env {:?}\n",
            if self.nftables {
                "nftables"
            } else {
                "iptables"
            },
            self.env(str::to_string)
        );
        for p in &self.pods {
            s += &format!(
                "pod {}/{}: labels {:?} annotations {:?} sa {:?} process {} unenrol {} delete {}\n",
                self.namespace(p),
                p.name,
                p.labels,
                p.annotations,
                p.service_account,
                p.process,
                p.unenrol,
                p.delete
            );
        }
        s
    }
}

fn bool_annotation(rng: &mut Rng) -> String {
    rng.word(&["true", "false", "true", "yes", "TRUE", "1", ""])
        .to_string()
}

fn pod(rng: &mut Rng, i: usize) -> GenPod {
    let ns = if rng.chance(60) {
        0
    } else {
        rng.below(NAMESPACES.len())
    };
    let mut labels = Vec::new();
    if rng.chance(35) {
        let mode = rng.word(&["ambient", "none", "ambient", "sidecar"]);
        labels.push(("istio.io/dataplane-mode".to_string(), mode.to_string()));
    }
    if rng.chance(20) {
        labels.push(("app".to_string(), format!("app{i}")));
    }
    let mut annotations = Vec::new();
    if rng.chance(8) {
        annotations.push((
            "sidecar.istio.io/status".to_string(),
            r#"{"initContainers":["istio-init"],"containers":["istio-proxy"]}"#.to_string(),
        ));
    }
    if rng.chance(25) {
        annotations.push((
            "ambient.istio.io/bypass-inbound-capture".to_string(),
            bool_annotation(rng),
        ));
    }
    if rng.chance(30) {
        annotations.push((
            "ambient.istio.io/dns-capture".to_string(),
            bool_annotation(rng),
        ));
    }
    if rng.chance(20) {
        let v = rng.word(&["tun0", "tun0,veth1", " tun0 , ,eth9", ","]);
        annotations.push((
            "istio.io/reroute-virtual-interfaces".to_string(),
            v.to_string(),
        ));
    }
    GenPod {
        name: format!("p{i}"),
        ns,
        labels,
        annotations,
        service_account: rng.chance(40).then(|| "app-sa".to_string()),
        process: rng.chance(50),
        delete: rng.chance(30),
        unenrol: rng.chance(20),
    }
}

/// Case `index` of a run: the backend alternates so every run covers both.
pub fn case(rng: &mut Rng, index: u64) -> Case {
    let n = 2 + rng.below(4);
    Case {
        nftables: index % 2 == 1,
        dns_capture: match rng.below(3) {
            0 => None,
            1 => Some(true),
            _ => Some(false),
        },
        exclude: rng.chance(20).then(|| "plain,kube-system".to_string()),
        pods: (0..n).map(|i| pod(rng, i)).collect(),
    }
}
