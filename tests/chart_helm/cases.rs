//! The value sets the chart test renders: every one docs/deploy.md and deploy/README.md document,
//! and the invalid ones the chart must refuse.

use serde_json::{Value, json};

use crate::chart::Case;

/// Valid sets are also linted; invalid ones only rendered (lint reports a `fail` as info).
pub fn all() -> Vec<Case> {
    let ok = |name: &str, values: Value| Case {
        name: name.to_string(),
        values,
        lint: true,
    };
    let bad = |name: &str, values: Value| Case {
        name: name.to_string(),
        values,
        lint: false,
    };
    let mut v = vec![
        ok("default", json!({})),
        ok("ambient-profile", json!({"profile": "ambient"})),
        ok("ambient-enabled", json!({"ambient": {"enabled": true}})),
        ok(
            "ambient-host-network",
            json!({"profile": "ambient", "ambient": {"shareHostNetworkNamespace": true}}),
        ),
        ok(
            "ambient-owned-config",
            json!({"profile": "ambient", "istioOwnedCNIConfig": true,
                   "istioOwnedCNIConfigFileName": "03-istio.conflist"}),
        ),
        ok(
            "cni-conf-file-name",
            json!({"cniConfFileName": "10-calico.conflist"}),
        ),
        ok(
            "custom-dirs",
            json!({"cniBinDir": "/opt/custom/bin", "cniConfDir": "/etc/custom/net.d",
                   "cniNetnsDir": "/run/custom-netns"}),
        ),
        ok(
            "repair-delete",
            json!({"repair": {"repairPods": false, "deletePods": true}}),
        ),
        ok(
            "repair-label",
            json!({"repair": {"repairPods": false, "labelPods": true}}),
        ),
        ok("repair-off", json!({"repair": {"enabled": false}})),
        // Ambient without repair: the agent's own role must grant what it calls (its events).
        ok(
            "ambient-repair-off",
            json!({"profile": "ambient", "repair": {"enabled": false}}),
        ),
        ok(
            "logging",
            json!({"logging": {"level": "debug"}, "global": {"logAsJson": true}}),
        ),
        ok(
            "native-nftables",
            json!({"global": {"nativeNftables": true}}),
        ),
        ok(
            "extra-env",
            json!({"env": {"SYSTEM_NAMESPACE": "mesh-system", "FORCE_IPTABLES_BINARY": "legacy"}}),
        ),
        // Values files written for Istio's chart nest everything under `cni:`.
        ok(
            "cni-prefix",
            json!({"cni": {"excludeNamespaces": ["kube-system", "mesh-system"],
                           "logging": {"level": "warn"}}}),
        ),
        ok("compat-1.24", json!({"compatibilityVersion": "1.24"})),
        // `compatibilityVersion: 1.30` in a values file is the number 1.3.
        ok("compat-1.30-number", json!({"compatibilityVersion": 1.30})),
        ok(
            "network-policy",
            json!({"global": {"networkPolicy": {"enabled": true}}}),
        ),
        ok(
            "scope-cluster",
            json!({"global": {"resourceScope": "cluster"}}),
        ),
        ok(
            "scope-namespace",
            json!({"global": {"resourceScope": "namespace"}}),
        ),
        ok(
            "security-options",
            json!({"seLinuxOptions": {"level": "s0"}, "seccompProfile": {"type": "RuntimeDefault"},
                   "useAppArmorAnnotation": false}),
        ),
        ok(
            "image",
            json!({"image": "registry.example.com/mesh/istio-cni-rs:0.1.0",
                   "global": {"imagePullPolicy": "Always"}}),
        ),
        ok("platform-top-level-k3s", json!({"platform": "k3s"})),
        // Probes under Cilium's kube-proxy replacement: SNAT to the node's own addresses.
        ok(
            "ambient-probe-node-ip",
            json!({"profile": "ambient", "useHostIPForProbeSnat": true}),
        ),
        bad("unknown-profile", json!({"profile": "nope"})),
        bad("unknown-platform", json!({"global": {"platform": "nope"}})),
        bad("unknown-compat", json!({"compatibilityVersion": "1.2"})),
        bad(
            "defaults-key",
            json!({"defaults": {"ambient": {"enabled": true}}}),
        ),
        bad(
            "bad-scope",
            json!({"global": {"resourceScope": "everything"}}),
        ),
    ];
    for p in [
        "default",
        "demo",
        "gatewayapi",
        "openshift",
        "openshift-ambient",
        "preview",
        "remote",
        "stable",
    ] {
        v.push(ok(&format!("profile-{p}"), json!({"profile": p})));
    }
    for p in ["gke", "k3d", "k3s", "microk8s", "minikube", "openshift"] {
        v.push(ok(
            &format!("platform-{p}"),
            json!({"global": {"platform": p}}),
        ));
    }
    v
}
