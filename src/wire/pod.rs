//! The pod as the plugin reads it: both answers that carry a pod (the pod-facts socket's and
//! `/podadd`'s not-ambient answer) send it trimmed to what `sidecar::PodInfo` reads.

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod, PodSpec, SecurityContext};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The pod with only what the plugin reads (`sidecar::PodInfo`): identity, labels,
/// annotations, host network, and per container its name, args, literal env values and run-as
/// user/group.
pub fn trim_for_plugin(pod: &Pod) -> Pod {
    let m = &pod.metadata;
    let container = |c: &Container| Container {
        name: c.name.clone(),
        args: c.args.clone(),
        env: c.env.as_ref().map(|env| {
            env.iter()
                .map(|e| EnvVar {
                    name: e.name.clone(),
                    value: e.value.clone(),
                    value_from: None,
                })
                .collect()
        }),
        security_context: c.security_context.as_ref().map(|sc| SecurityContext {
            run_as_user: sc.run_as_user,
            run_as_group: sc.run_as_group,
            ..Default::default()
        }),
        ..Default::default()
    };
    Pod {
        metadata: ObjectMeta {
            name: m.name.clone(),
            namespace: m.namespace.clone(),
            uid: m.uid.clone(),
            resource_version: m.resource_version.clone(),
            labels: m.labels.clone(),
            annotations: m.annotations.clone(),
            ..Default::default()
        },
        spec: pod.spec.as_ref().map(|s| PodSpec {
            host_network: s.host_network,
            node_name: s.node_name.clone(),
            init_containers: s
                .init_containers
                .as_ref()
                .map(|cs| cs.iter().map(container).collect()),
            containers: s.containers.iter().map(container).collect(),
            ..Default::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                         "labels": {"app": "a"}, "annotations": {"sidecar.istio.io/status": "{}"},
                         "managedFields": [{"manager": "x"}], "ownerReferences": []},
            "spec": {"nodeName": "n1", "hostNetwork": false,
                     "initContainers": [{"name": "istio-validation", "image": "i"}],
                     "containers": [{"name": "istio-proxy", "image": "proxy", "args": ["proxy", "sidecar"],
                                     "env": [{"name": "A", "value": "1"},
                                             {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}],
                                     "securityContext": {"runAsUser": 1337, "runAsGroup": 1337, "privileged": false}}]},
            "status": {"phase": "Pending"}
        }))
        .unwrap()
    }

    #[test]
    fn trimming_keeps_what_the_plugin_reads() {
        let t = trim_for_plugin(&pod());
        assert!(t.metadata.managed_fields.is_none() && t.status.is_none());
        let proxy = &t.spec.as_ref().unwrap().containers[0];
        assert_eq!(proxy.args.as_deref().unwrap(), ["proxy", "sidecar"]);
        assert_eq!(proxy.image, None);
        let env = proxy.env.as_ref().unwrap();
        assert_eq!(
            (env[0].value.as_deref(), env[1].value.as_deref()),
            (Some("1"), None)
        );
        let sc = proxy.security_context.as_ref().unwrap();
        assert_eq!(
            (sc.run_as_user, sc.run_as_group, sc.privileged),
            (Some(1337), Some(1337), None)
        );
        assert_eq!(
            t.spec.as_ref().unwrap().init_containers.as_ref().unwrap()[0].name,
            "istio-validation"
        );
        assert_eq!(t.metadata.labels, pod().metadata.labels);
        assert_eq!(t.metadata.annotations, pod().metadata.annotations);
    }
}
