//! What the pod store keeps of a pod: exactly what some reader of a stored pod reads, nothing
//! else. The pod watch's protobuf decoding (`kube::protobuf`) decodes this same subset, so a pod
//! stored from a JSON list and one stored from a protobuf watch event are the same object.
//!
//! The readers, and what each reads:
//! - the ambient agent (`agent::pod`, `agent::machine`, `agent::node_pods`): name, namespace,
//!   uid, labels, annotations, `spec.hostNetwork`, `spec.serviceAccountName`, `status.phase`,
//!   the IPs ([`super::pod_ips`]: `status.podIPs[].ip`, `status.podIP`), and the validation init
//!   container's state and last state (terminated exit code);
//! - the plugin's answers (`wire::pod::trim_for_plugin`, `sidecar::PodInfo`): identity,
//!   resourceVersion, labels, annotations, host network, node name, and per container (init and
//!   regular) its name, args, env names and literal values, and run-as user/group;
//! - the repair controller (`repair::detect`, `repair::controller`, `repair::drift`): the
//!   field-selector fields (name, namespace, `spec.nodeName`, `spec.restartPolicy`,
//!   `spec.schedulerName`, `spec.serviceAccountName`, `spec.hostNetwork`, `status.phase`,
//!   `status.podIP`, `status.nominatedNodeName`), labels, annotations, the controller owner
//!   reference (kind, name, controller), and per init container status its name and its state's
//!   and last state's termination (exit code, reason, message);
//! - the store itself and `kube::lookup`: name, namespace, uid, resourceVersion; pod events and
//!   delete preconditions (`kube::client`): name, namespace, uid, resourceVersion.

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateTerminated, ContainerStatus, EnvVar, Pod, PodIP,
    PodSpec, PodStatus, SecurityContext,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

/// The pod with only the kept fields (see the module doc).
pub fn pod(pod: Pod) -> Pod {
    Pod {
        metadata: metadata(pod.metadata),
        spec: pod.spec.map(spec),
        status: pod.status.map(status),
    }
}

fn metadata(m: ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        labels: m.labels,
        annotations: m.annotations,
        owner_references: m.owner_references.map(|owners| {
            owners
                .into_iter()
                .map(|o| OwnerReference {
                    kind: o.kind,
                    name: o.name,
                    controller: o.controller,
                    ..Default::default()
                })
                .collect()
        }),
        ..Default::default()
    }
}

fn spec(s: PodSpec) -> PodSpec {
    PodSpec {
        node_name: s.node_name,
        host_network: s.host_network,
        restart_policy: s.restart_policy,
        scheduler_name: s.scheduler_name,
        service_account_name: s.service_account_name,
        init_containers: s
            .init_containers
            .map(|cs| cs.into_iter().map(container).collect()),
        containers: s.containers.into_iter().map(container).collect(),
        ..Default::default()
    }
}

fn container(c: Container) -> Container {
    Container {
        name: c.name,
        args: c.args,
        env: c.env.map(|env| {
            env.into_iter()
                .map(|e| EnvVar {
                    name: e.name,
                    value: e.value,
                    value_from: None,
                })
                .collect()
        }),
        security_context: c.security_context.map(|sc| SecurityContext {
            run_as_user: sc.run_as_user,
            run_as_group: sc.run_as_group,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn status(s: PodStatus) -> PodStatus {
    PodStatus {
        phase: s.phase,
        pod_ip: s.pod_ip,
        pod_ips: s
            .pod_ips
            .map(|ips| ips.into_iter().map(|p| PodIP { ip: p.ip }).collect()),
        nominated_node_name: s.nominated_node_name,
        init_container_statuses: s
            .init_container_statuses
            .map(|sts| sts.into_iter().map(container_status).collect()),
        ..Default::default()
    }
}

fn container_status(s: ContainerStatus) -> ContainerStatus {
    ContainerStatus {
        name: s.name,
        state: s.state.map(state),
        last_state: s.last_state.map(state),
        ..Default::default()
    }
}

fn state(s: ContainerState) -> ContainerState {
    ContainerState {
        terminated: s.terminated.map(|t| ContainerStateTerminated {
            exit_code: t.exit_code,
            reason: t.reason,
            message: t.message,
            ..Default::default()
        }),
        ..Default::default()
    }
}
