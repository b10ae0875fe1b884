//! Generated pods for the plugin differential: annotations (every `traffic.sidecar.istio.io/*`,
//! interception modes, inject and status shapes, the reroute interfaces), labels (inject, ambient),
//! the proxy container's env, args and IDs, init containers, host network, the namespace
//! (plain, ambient-labelled, excluded) and the plugin config (ambient on or off, nftables).
//! Seeded: the same seed and index give the same case.

use serde_json::{Value, json};

// One generator for the three differential tests; each uses part of it.
#[allow(dead_code)]
#[path = "rng.rs"]
mod rng;
pub use rng::Rng;

/// Which of the run's namespaces the pod is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Space {
    Plain,
    /// Labelled `istio.io/dataplane-mode=ambient`.
    Ambient,
    /// Listed in the plugin config's `exclude_namespaces`.
    Excluded,
}

/// One generated pod and plugin config. Every property is a named item, so a failing case can
/// be shrunk by dropping items one at a time.
#[derive(Clone, Debug)]
pub struct PodCase {
    pub annotations: Vec<(String, String)>,
    pub labels: Vec<(String, String)>,
    /// `istio-proxy` container env.
    pub env: Vec<(String, String)>,
    /// `istio-proxy` args (`proxy router`); empty: none.
    pub args: Vec<String>,
    pub run_as: Option<(i64, i64)>,
    pub proxy: bool,
    pub istio_init: bool,
    pub host_network: bool,
    pub space: Space,
    pub ambient_enabled: bool,
    pub native_nftables: bool,
}

const PORTS: &[&str] = &["80", "8080", "15020", "9090", "*", ""];
const BAD_PORTS: &[&str] = &["abc", "0", "70000", " 80", "1-100"];
const CIDRS: &[&str] = &[
    "10.0.0.0/8",
    "*",
    "",
    "192.168.1.1/32",
    "10.1.2.3/8",
    "fd00::/8",
    "0.0.0.0/0",
];
const BAD_CIDRS: &[&str] = &["bogus", "10.0.0.1", "10.0.0.0/33"];
const IFACES: &[&str] = &["eth1", "tun0", "tun+", "veth9", ""];
const BAD_IFACES: &[&str] = &["bad/if", "+"];
const MODES: &[&str] = &["REDIRECT", "TPROXY", "NONE", "tproxy", "", "foo"];
const BOOLS: &[&str] = &["true", "false", "1", "0", "True", "yes", ""];
const STATUS: &[&str] = &[
    r#"{"initContainers":["istio-validation"],"containers":["istio-proxy"],"volumes":[],"imagePullSecrets":null,"revision":"default"}"#,
    "true",
    "",
    "{}",
];

/// A comma list of 1..=3 items of `good`, now and then one of `bad` among them.
fn list(rng: &mut Rng, good: &[&str], bad: &[&str]) -> String {
    let n = 1 + rng.below(3);
    let mut items: Vec<String> = (0..n).map(|_| rng.pick(good).to_string()).collect();
    if rng.chance(8) {
        let at = rng.below(items.len() + 1);
        items.insert(at, rng.pick(bad).to_string());
    }
    items.join(",")
}

fn annotations(rng: &mut Rng) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut put = |key: &str, value: String| out.push((key.to_string(), value));
    let t = "traffic.sidecar.istio.io/";
    if rng.chance(85) {
        put("sidecar.istio.io/status", rng.pick(STATUS).to_string());
    }
    if rng.chance(35) {
        put(
            "sidecar.istio.io/interceptionMode",
            rng.pick(MODES).to_string(),
        );
    }
    if rng.chance(15) {
        put("sidecar.istio.io/inject", rng.pick(BOOLS).to_string());
    }
    for (key, good, bad) in [
        ("includeOutboundIPRanges", CIDRS, BAD_CIDRS),
        ("excludeOutboundIPRanges", CIDRS, BAD_CIDRS),
        ("includeInboundPorts", PORTS, BAD_PORTS),
        ("excludeInboundPorts", PORTS, BAD_PORTS),
        ("includeOutboundPorts", PORTS, BAD_PORTS),
        ("excludeOutboundPorts", PORTS, BAD_PORTS),
        ("excludeInterfaces", IFACES, BAD_IFACES),
        ("kubevirtInterfaces", IFACES, BAD_IFACES),
    ] {
        if rng.chance(25) {
            put(&format!("{t}{key}"), list(rng, good, bad));
        }
    }
    if rng.chance(15) {
        put(
            "istio.io/reroute-virtual-interfaces",
            list(rng, IFACES, BAD_IFACES),
        );
    }
    if rng.chance(10) {
        put("status.sidecar.istio.io/port", "15020".into());
    }
    out
}

/// The first cases of every run: a plain sidecar pod with one of these annotations, so each
/// deliberate difference shows in every run (the rest are drawn at random).
const PROBES: &[(&str, &str)] = &[
    ("traffic.sidecar.istio.io/kubevirtInterfaces", "tun+"),
    ("traffic.sidecar.istio.io/excludeInboundPorts", "0"),
    ("sidecar.istio.io/interceptionMode", "NONE"),
    (
        "traffic.sidecar.istio.io/excludeOutboundPorts",
        "80,9090,80",
    ),
    ("traffic.sidecar.istio.io/excludeInterfaces", "eth+"),
];

/// Case `index` of the run seeded with `seed`.
pub fn case(seed: u64, index: u64) -> PodCase {
    let mut case = drawn(seed, index);
    if let Some((key, value)) = PROBES.get(index as usize) {
        case.annotations = vec![
            ("sidecar.istio.io/status".into(), STATUS[0].into()),
            (key.to_string(), value.to_string()),
        ];
        (case.labels, case.env, case.args, case.run_as) =
            (Vec::new(), Vec::new(), Vec::new(), None);
        (case.proxy, case.istio_init, case.host_network) = (true, false, false);
        (case.space, case.ambient_enabled) = (Space::Plain, false);
    }
    case
}

fn drawn(seed: u64, index: u64) -> PodCase {
    let mut rng = Rng::new(seed ^ index.wrapping_mul(0x2545_f491_4f6c_dd1d));
    let annotations = annotations(&mut rng);
    let mut labels = Vec::new();
    if rng.chance(20) {
        let mode = *rng.pick(&["ambient", "none"]);
        labels.push(("istio.io/dataplane-mode".to_string(), mode.to_string()));
    }
    if rng.chance(10) {
        let v = *rng.pick(&["true", "false"]);
        labels.push(("sidecar.istio.io/inject".to_string(), v.to_string()));
    }
    let mut env = Vec::new();
    for var in [
        "ISTIO_META_DNS_CAPTURE",
        "ISTIO_DUAL_STACK",
        "INVALID_DROP",
        "DISABLE_ENVOY",
    ] {
        let percent = if var == "DISABLE_ENVOY" { 5 } else { 15 };
        if rng.chance(percent) {
            env.push((var.to_string(), rng.pick(BOOLS).to_string()));
        }
    }
    let args = match rng.below(10) {
        0 => vec!["proxy".into(), "router".into()],
        1 => vec!["proxy".into(), "sidecar".into()],
        _ => Vec::new(),
    };
    let run_as = rng
        .chance(15)
        .then(|| (*rng.pick(&[0, 1000, 1337]), *rng.pick(&[0, 2000, 1337])));
    let space = match rng.below(10) {
        0 => Space::Excluded,
        1 | 2 => Space::Ambient,
        _ => Space::Plain,
    };
    PodCase {
        annotations,
        labels,
        env,
        args,
        run_as,
        proxy: rng.chance(92),
        istio_init: rng.chance(5),
        host_network: rng.chance(5),
        space,
        ambient_enabled: rng.chance(15),
        native_nftables: rng.chance(30),
    }
}

impl PodCase {
    /// The pod object, named `name` in `namespace`.
    pub fn pod(&self, namespace: &str, name: &str) -> Value {
        let map = |items: &[(String, String)]| {
            Value::Object(
                items
                    .iter()
                    .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                    .collect(),
            )
        };
        let mut containers = vec![json!({"name": "app", "image": "app:1"})];
        if self.proxy {
            let env: Vec<Value> = self
                .env
                .iter()
                .map(|(k, v)| json!({"name": k, "value": v}))
                .collect();
            let mut proxy = json!({"name": "istio-proxy", "image": "proxyv2:1", "env": env});
            if !self.args.is_empty() {
                proxy["args"] = json!(self.args);
            }
            if let Some((uid, gid)) = self.run_as {
                proxy["securityContext"] = json!({"runAsUser": uid, "runAsGroup": gid});
            }
            containers.push(proxy);
        }
        let mut spec = json!({"containers": containers, "hostNetwork": self.host_network});
        if self.istio_init {
            spec["initContainers"] = json!([{"name": "istio-init", "image": "proxyv2:1"}]);
        }
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": name, "namespace": namespace,
                "annotations": map(&self.annotations), "labels": map(&self.labels),
            },
            "spec": spec,
        })
    }

    /// Every item as `key=value` words, for the allowlist's `input` matches and the report.
    pub fn words(&self) -> Vec<String> {
        let mut w: Vec<String> = self
            .annotations
            .iter()
            .chain(&self.labels)
            .chain(&self.env)
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        w.extend(self.args.iter().map(|a| format!("arg={a}")));
        if let Some((u, g)) = self.run_as {
            w.push(format!("runAsUser={u},runAsGroup={g}"));
        }
        for (on, word) in [
            (!self.proxy, "no-istio-proxy"),
            (self.istio_init, "istio-init"),
            (self.host_network, "hostNetwork"),
            (self.ambient_enabled, "ambient_enabled"),
            (self.native_nftables, "native_nftables"),
        ] {
            if on {
                w.push(word.to_string());
            }
        }
        w.push(format!("namespace={:?}", self.space));
        w
    }

    /// The cases one step smaller: each annotation, label, env var or other item dropped alone.
    pub fn smaller(&self) -> Vec<PodCase> {
        let mut out = Vec::new();
        for (field, len) in [
            (0, self.annotations.len()),
            (1, self.labels.len()),
            (2, self.env.len()),
        ] {
            for i in 0..len {
                let mut c = self.clone();
                match field {
                    0 => c.annotations.remove(i),
                    1 => c.labels.remove(i),
                    _ => c.env.remove(i),
                };
                out.push(c);
            }
        }
        let mut flip = |f: fn(&mut PodCase) -> bool| {
            let mut c = self.clone();
            if f(&mut c) {
                out.push(c);
            }
        };
        flip(|c| {
            !c.args.is_empty() && {
                c.args.clear();
                true
            }
        });
        flip(|c| c.run_as.take().is_some());
        flip(|c| {
            c.istio_init && {
                c.istio_init = false;
                true
            }
        });
        flip(|c| {
            c.host_network && {
                c.host_network = false;
                true
            }
        });
        flip(|c| {
            c.ambient_enabled && {
                c.ambient_enabled = false;
                true
            }
        });
        flip(|c| {
            c.native_nftables && {
                c.native_nftables = false;
                true
            }
        });
        flip(|c| {
            c.space != Space::Plain && {
                c.space = Space::Plain;
                true
            }
        });
        out
    }
}
