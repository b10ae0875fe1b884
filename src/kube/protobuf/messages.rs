//! The Kubernetes protobuf messages of a pod watch, hand-written with only the fields the pod
//! store keeps (`stores::kept`); prost skips every other field unread. Field numbers are those
//! of Kubernetes' `generated.proto` files (core/v1, meta/v1, runtime).
//!
//! Kubernetes writes every non-pointer string, bool and struct field, empty or not, where its
//! JSON leaves empty ones out; the conversions below read an empty one as absent, so the pod is
//! the one its JSON would give.

use std::collections::BTreeMap;

use bytes::Bytes;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;

/// meta/v1 WatchEvent: one frame of a protobuf watch stream.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchEvent {
    #[prost(string, tag = "1")]
    pub r#type: String,
    #[prost(message, optional, tag = "2")]
    pub object: Option<RawExtension>,
}

/// runtime RawExtension: the event's object, `k8s\0` + [`Unknown`].
#[derive(Clone, PartialEq, prost::Message)]
pub struct RawExtension {
    #[prost(bytes = "bytes", tag = "1")]
    pub raw: Bytes,
}

/// runtime Unknown: the object's type and its own encoding.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Unknown {
    #[prost(message, optional, tag = "1")]
    pub type_meta: Option<TypeMeta>,
    #[prost(bytes = "bytes", tag = "2")]
    pub raw: Bytes,
    #[prost(string, tag = "3")]
    pub content_encoding: String,
    #[prost(string, tag = "4")]
    pub content_type: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeMeta {
    #[prost(string, tag = "1")]
    pub api_version: String,
    #[prost(string, tag = "2")]
    pub kind: String,
}

/// meta/v1 Status (an ERROR event's object, an error response's body).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Status {
    #[prost(string, tag = "2")]
    pub status: String,
    #[prost(string, tag = "3")]
    pub message: String,
    #[prost(string, tag = "4")]
    pub reason: String,
    #[prost(int32, tag = "6")]
    pub code: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Pod {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ObjectMeta>,
    #[prost(message, optional, tag = "2")]
    pub spec: Option<PodSpec>,
    #[prost(message, optional, tag = "3")]
    pub status: Option<PodStatus>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ObjectMeta {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "3")]
    pub namespace: String,
    #[prost(string, tag = "5")]
    pub uid: String,
    #[prost(string, tag = "6")]
    pub resource_version: String,
    #[prost(btree_map = "string, string", tag = "11")]
    pub labels: BTreeMap<String, String>,
    #[prost(btree_map = "string, string", tag = "12")]
    pub annotations: BTreeMap<String, String>,
    #[prost(message, repeated, tag = "13")]
    pub owner_references: Vec<OwnerReference>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct OwnerReference {
    #[prost(string, tag = "1")]
    pub kind: String,
    #[prost(string, tag = "3")]
    pub name: String,
    /// A pointer in Kubernetes: written when set, false included.
    #[prost(bool, optional, tag = "6")]
    pub controller: Option<bool>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSpec {
    #[prost(message, repeated, tag = "2")]
    pub containers: Vec<Container>,
    #[prost(string, tag = "3")]
    pub restart_policy: String,
    #[prost(string, tag = "8")]
    pub service_account_name: String,
    #[prost(string, tag = "10")]
    pub node_name: String,
    #[prost(bool, tag = "11")]
    pub host_network: bool,
    #[prost(string, tag = "19")]
    pub scheduler_name: String,
    #[prost(message, repeated, tag = "20")]
    pub init_containers: Vec<Container>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Container {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, repeated, tag = "4")]
    pub args: Vec<String>,
    #[prost(message, repeated, tag = "7")]
    pub env: Vec<EnvVar>,
    #[prost(message, optional, tag = "15")]
    pub security_context: Option<SecurityContext>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct EnvVar {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SecurityContext {
    #[prost(int64, optional, tag = "4")]
    pub run_as_user: Option<i64>,
    #[prost(int64, optional, tag = "8")]
    pub run_as_group: Option<i64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodStatus {
    #[prost(string, tag = "1")]
    pub phase: String,
    #[prost(string, tag = "6")]
    pub pod_ip: String,
    #[prost(message, repeated, tag = "10")]
    pub init_container_statuses: Vec<ContainerStatus>,
    #[prost(string, tag = "11")]
    pub nominated_node_name: String,
    #[prost(message, repeated, tag = "12")]
    pub pod_ips: Vec<PodIp>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodIp {
    #[prost(string, tag = "1")]
    pub ip: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStatus {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub state: Option<ContainerState>,
    #[prost(message, optional, tag = "3")]
    pub last_state: Option<ContainerState>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerState {
    #[prost(message, optional, tag = "3")]
    pub terminated: Option<ContainerStateTerminated>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStateTerminated {
    #[prost(int32, tag = "1")]
    pub exit_code: i32,
    #[prost(string, tag = "3")]
    pub reason: String,
    #[prost(string, tag = "4")]
    pub message: String,
}

fn text(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

fn list<T, U>(items: Vec<T>, f: impl FnMut(T) -> U) -> Option<Vec<U>> {
    (!items.is_empty()).then(|| items.into_iter().map(f).collect())
}

fn map(m: BTreeMap<String, String>) -> Option<BTreeMap<String, String>> {
    (!m.is_empty()).then_some(m)
}

impl From<Pod> for core::Pod {
    fn from(p: Pod) -> Self {
        core::Pod {
            metadata: p.metadata.map(Into::into).unwrap_or_default(),
            spec: p.spec.map(Into::into),
            status: p.status.map(Into::into),
        }
    }
}

impl From<ObjectMeta> for meta::ObjectMeta {
    fn from(m: ObjectMeta) -> Self {
        meta::ObjectMeta {
            name: text(m.name),
            namespace: text(m.namespace),
            uid: text(m.uid),
            resource_version: text(m.resource_version),
            labels: map(m.labels),
            annotations: map(m.annotations),
            owner_references: list(m.owner_references, |o| meta::OwnerReference {
                kind: o.kind,
                name: o.name,
                controller: o.controller,
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

impl From<PodSpec> for core::PodSpec {
    fn from(s: PodSpec) -> Self {
        core::PodSpec {
            containers: s.containers.into_iter().map(Into::into).collect(),
            init_containers: list(s.init_containers, Into::into),
            restart_policy: text(s.restart_policy),
            service_account_name: text(s.service_account_name),
            node_name: text(s.node_name),
            host_network: s.host_network.then_some(true),
            scheduler_name: text(s.scheduler_name),
            ..Default::default()
        }
    }
}

impl From<Container> for core::Container {
    fn from(c: Container) -> Self {
        core::Container {
            name: c.name,
            args: list(c.args, |a| a),
            env: list(c.env, |e| core::EnvVar {
                name: e.name,
                value: text(e.value),
                value_from: None,
            }),
            security_context: c.security_context.map(|sc| core::SecurityContext {
                run_as_user: sc.run_as_user,
                run_as_group: sc.run_as_group,
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

impl From<PodStatus> for core::PodStatus {
    fn from(s: PodStatus) -> Self {
        core::PodStatus {
            phase: text(s.phase),
            pod_ip: text(s.pod_ip),
            pod_ips: list(s.pod_ips, |p| core::PodIP { ip: p.ip }),
            nominated_node_name: text(s.nominated_node_name),
            init_container_statuses: list(s.init_container_statuses, |st| core::ContainerStatus {
                name: st.name,
                state: st.state.map(Into::into),
                last_state: st.last_state.map(Into::into),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

impl From<ContainerState> for core::ContainerState {
    fn from(s: ContainerState) -> Self {
        core::ContainerState {
            terminated: s.terminated.map(|t| core::ContainerStateTerminated {
                exit_code: t.exit_code,
                reason: text(t.reason),
                message: text(t.message),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

impl Status {
    /// The Status as its JSON (`kind: Status`), the form kube reads an error in.
    pub fn to_json(&self) -> serde_json::Value {
        let mut object = serde_json::json!({"apiVersion": "v1", "kind": "Status"});
        // kube reads only these two values of `status`; anything else is left out.
        if matches!(self.status.as_str(), "Success" | "Failure") {
            object["status"] = self.status.clone().into();
        }
        if !self.message.is_empty() {
            object["message"] = self.message.clone().into();
        }
        if !self.reason.is_empty() {
            object["reason"] = self.reason.clone().into();
        }
        if let Ok(code) = u16::try_from(self.code)
            && code != 0
        {
            object["code"] = code.into();
        }
        object
    }
}
