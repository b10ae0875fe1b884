//! Is this pod broken? Pure: Istio's detection (the sidecar annotation, the validation init
//! container's name, its last termination's exit code and message) plus the operator's extra
//! label and field selectors, which Istio puts on its own informer and we check here because the
//! pod store is shared with the ambient agent (one watch of this node's pods).

use k8s_openapi::api::core::v1::Pod;

use super::RepairConfig;
use crate::kube::selector::{Selector, SelectorError};

/// Why the repair settings cannot be used; each names the variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilterError {
    #[error("REPAIR_LABEL_SELECTORS: {0}")]
    Labels(#[source] SelectorError),
    #[error(
        "REPAIR_FIELD_SELECTORS: term {term:?} is not <field>=<value>, <field>==<value> or \
         <field>!=<value> on a pod field the API server can select on"
    )]
    Field { term: String },
}

/// A pod field the API server lets a field selector name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PodField {
    Name,
    Namespace,
    NodeName,
    RestartPolicy,
    SchedulerName,
    ServiceAccountName,
    HostNetwork,
    Phase,
    PodIp,
    NominatedNodeName,
}

impl PodField {
    fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "metadata.name" => Self::Name,
            "metadata.namespace" => Self::Namespace,
            "spec.nodeName" => Self::NodeName,
            "spec.restartPolicy" => Self::RestartPolicy,
            "spec.schedulerName" => Self::SchedulerName,
            "spec.serviceAccountName" => Self::ServiceAccountName,
            "spec.hostNetwork" => Self::HostNetwork,
            "status.phase" => Self::Phase,
            "status.podIP" => Self::PodIp,
            "status.nominatedNodeName" => Self::NominatedNodeName,
            _ => return None,
        })
    }

    /// The field as the API server compares it (absent = empty; a bool as `true`/`false`).
    fn value(self, pod: &Pod) -> String {
        let spec = pod.spec.as_ref();
        let status = pod.status.as_ref();
        let s = |v: Option<&String>| v.cloned().unwrap_or_default();
        match self {
            Self::Name => s(pod.metadata.name.as_ref()),
            Self::Namespace => s(pod.metadata.namespace.as_ref()),
            Self::NodeName => s(spec.and_then(|p| p.node_name.as_ref())),
            Self::RestartPolicy => s(spec.and_then(|p| p.restart_policy.as_ref())),
            Self::SchedulerName => s(spec.and_then(|p| p.scheduler_name.as_ref())),
            Self::ServiceAccountName => s(spec.and_then(|p| p.service_account_name.as_ref())),
            Self::HostNetwork => spec
                .and_then(|p| p.host_network)
                .unwrap_or(false)
                .to_string(),
            Self::Phase => s(status.and_then(|p| p.phase.as_ref())),
            Self::PodIp => s(status.and_then(|p| p.pod_ip.as_ref())),
            Self::NominatedNodeName => s(status.and_then(|p| p.nominated_node_name.as_ref())),
        }
    }
}

/// One field-selector term.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FieldTerm {
    field: PodField,
    equal: bool,
    value: String,
}

/// The compiled detection settings.
#[derive(Debug, Clone)]
pub struct Detection {
    sidecar_annotation: String,
    init_container_name: String,
    termination_message: String,
    exit_code: i32,
    labels: Option<Selector>,
    fields: Vec<FieldTerm>,
}

/// Why a pod is broken (for the log line and the event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broken {
    pub container: String,
    pub exit_code: i32,
}

fn parse_fields(text: &str) -> Result<Vec<FieldTerm>, FilterError> {
    let mut terms = Vec::new();
    for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let bad = || FilterError::Field {
            term: term.to_string(),
        };
        let (field, equal, value) = if let Some((f, v)) = term.split_once("!=") {
            (f, false, v)
        } else if let Some((f, v)) = term.split_once("==") {
            (f, true, v)
        } else if let Some((f, v)) = term.split_once('=') {
            (f, true, v)
        } else {
            return Err(bad());
        };
        let field = PodField::parse(field.trim()).ok_or_else(bad)?;
        terms.push(FieldTerm {
            field,
            equal,
            value: value.trim().to_string(),
        });
    }
    Ok(terms)
}

impl Detection {
    /// Compiles the settings; a selector the API server would refuse is refused here, at startup.
    pub fn new(cfg: &RepairConfig) -> Result<Detection, FilterError> {
        let labels = match cfg.label_selectors.trim() {
            "" => None,
            text => Some(Selector::parse(text).map_err(FilterError::Labels)?),
        };
        Ok(Detection {
            sidecar_annotation: cfg.sidecar_annotation.clone(),
            init_container_name: cfg.init_container_name.clone(),
            termination_message: cfg.init_container_termination_message.clone(),
            exit_code: cfg.init_container_exit_code,
            labels,
            fields: parse_fields(&cfg.field_selectors)?,
        })
    }

    /// Whether the pod passes REPAIR_LABEL_SELECTORS and REPAIR_FIELD_SELECTORS.
    pub fn selected(&self, pod: &Pod) -> bool {
        let labels_ok = self.labels.as_ref().is_none_or(|sel| {
            let labels = pod.metadata.labels.clone().unwrap_or_default();
            sel.matches(&labels)
        });
        labels_ok
            && self
                .fields
                .iter()
                .all(|t| (t.field.value(pod) == t.value) == t.equal)
    }

    /// Istio's test: the pod carries the sidecar annotation (when one is configured), and a
    /// matching init container (any, when no name is configured) that is not now completed last
    /// terminated with the configured exit code (any when 0) and message (any when empty,
    /// compared trimmed).
    pub fn broken(&self, pod: &Pod) -> Option<Broken> {
        if !self.selected(pod) {
            return None;
        }
        if !self.sidecar_annotation.is_empty()
            && !pod
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(&self.sidecar_annotation))
        {
            return None;
        }
        let statuses = pod.status.as_ref()?.init_container_statuses.as_ref()?;
        let wanted = self.termination_message.trim();
        for st in statuses {
            if !self.init_container_name.is_empty() && st.name != self.init_container_name {
                continue;
            }
            let now = st.state.as_ref().and_then(|s| s.terminated.as_ref());
            if now.is_some_and(|t| t.reason.as_deref() == Some("Completed") || t.exit_code == 0) {
                continue;
            }
            // Under `restartPolicy: Never` the failed run is the current state: the container
            // never runs again, so there is no last state.
            let never = cannot_restart(pod);
            let last = st.last_state.as_ref().and_then(|s| s.terminated.as_ref());
            let Some(last) = last.or(now.filter(|_| never)) else {
                continue;
            };
            let message_ok =
                wanted.is_empty() || last.message.as_deref().unwrap_or_default().trim() == wanted;
            let code_ok = self.exit_code == 0 || last.exit_code == self.exit_code;
            if message_ok && code_ok {
                return Some(Broken {
                    container: st.name.clone(),
                    exit_code: last.exit_code,
                });
            }
        }
        None
    }
}

/// Whether the kubelet will never run the pod's init containers again (`restartPolicy: Never`):
/// its failed validation container stays failed and the pod ends `Failed`, so rules programmed in
/// its netns now would serve nothing.
pub fn cannot_restart(pod: &Pod) -> bool {
    pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) == Some("Never")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cfg() -> RepairConfig {
        crate::repair::test_config()
    }

    /// A sidecar pod whose validation container has `state` now and last terminated with `last`.
    fn pod(state: serde_json::Value, last: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "labels": {"app": "a"},
                         "annotations": {"sidecar.istio.io/status": "{}"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "app"}]},
            "status": {"phase": "Pending", "initContainerStatuses": [{
                "name": "istio-validation", "ready": false, "restartCount": 2,
                "image": "i", "imageID": "", "state": state, "lastState": last}]}
        }))
        .unwrap()
    }

    fn terminated(code: i32, message: &str) -> serde_json::Value {
        json!({"terminated": {"exitCode": code, "message": message, "reason": "Error"}})
    }

    fn waiting() -> serde_json::Value {
        json!({"waiting": {"reason": "CrashLoopBackOff"}})
    }

    #[test]
    fn a_never_restarting_pod_is_broken_by_its_current_state() {
        let d = Detection::new(&cfg()).unwrap();
        let mut never = pod(terminated(126, ""), json!({}));
        never.spec.as_mut().unwrap().restart_policy = Some("Never".into());
        assert_eq!(d.broken(&never).map(|b| b.exit_code), Some(126));
        // A pod that restarts waits for its next run's verdict, as Istio's.
        let always = pod(terminated(126, ""), json!({}));
        assert!(d.broken(&always).is_none());
        // Another exit code stays fine under Never too.
        let mut other = pod(terminated(1, ""), json!({}));
        other.spec.as_mut().unwrap().restart_policy = Some("Never".into());
        assert!(d.broken(&other).is_none());
    }

    #[test]
    fn istio_detection_cases() {
        let d = Detection::new(&cfg()).unwrap();
        // Waiting to restart after a 126, and terminated again with 126: both broken.
        assert!(d.broken(&pod(waiting(), terminated(126, ""))).is_some());
        assert!(
            d.broken(&pod(terminated(126, ""), terminated(126, "")))
                .is_some()
        );
        // Died before, completed now: fine.
        let done = json!({"terminated": {"exitCode": 0, "reason": "Completed"}});
        assert!(d.broken(&pod(done, terminated(126, ""))).is_none());
        // Another exit code, no last termination, no status at all: fine.
        assert!(d.broken(&pod(waiting(), terminated(1, ""))).is_none());
        assert!(d.broken(&pod(waiting(), json!({}))).is_none());
        let mut bare = pod(waiting(), terminated(126, ""));
        bare.status = None;
        assert!(d.broken(&bare).is_none());
        // No sidecar annotation: not ours.
        let mut plain = pod(waiting(), terminated(126, ""));
        plain.metadata.annotations = None;
        assert!(d.broken(&plain).is_none());
        // Another container name: not the validation container.
        let mut other = pod(waiting(), terminated(126, ""));
        other
            .status
            .as_mut()
            .unwrap()
            .init_container_statuses
            .as_mut()
            .unwrap()[0]
            .name = "init".into();
        assert!(d.broken(&other).is_none());
        // Exit code 0 configured: any code counts.
        let any = Detection::new(&RepairConfig {
            init_container_exit_code: 0,
            ..cfg()
        })
        .unwrap();
        assert_eq!(
            any.broken(&pod(waiting(), terminated(7, ""))),
            Some(Broken {
                container: "istio-validation".into(),
                exit_code: 7
            })
        );
    }

    #[test]
    fn termination_message_is_compared_trimmed() {
        let d = Detection::new(&RepairConfig {
            init_container_termination_message: " no redirect ".into(),
            ..cfg()
        })
        .unwrap();
        assert!(
            d.broken(&pod(waiting(), terminated(126, "no redirect\n")))
                .is_some()
        );
        assert!(
            d.broken(&pod(waiting(), terminated(126, "other")))
                .is_none()
        );
    }

    #[test]
    fn label_and_field_selectors_narrow_the_pods() {
        let broken = pod(waiting(), terminated(126, ""));
        let with = |labels: &str, fields: &str| {
            Detection::new(&RepairConfig {
                label_selectors: labels.into(),
                field_selectors: fields.into(),
                ..cfg()
            })
        };
        assert!(with("app=a", "").unwrap().broken(&broken).is_some());
        assert!(with("app=b", "").unwrap().broken(&broken).is_none());
        let d = with("", "metadata.namespace=ns,status.phase!=Running").unwrap();
        assert!(d.broken(&broken).is_some());
        let d = with("", "metadata.namespace==other").unwrap();
        assert!(d.broken(&broken).is_none());
        let err = with("", "spec.bogus=1").unwrap_err().to_string();
        assert!(err.contains("REPAIR_FIELD_SELECTORS"), "{err}");
        let err = with("a in (", "").unwrap_err().to_string();
        assert!(err.contains("REPAIR_LABEL_SELECTORS"), "{err}");
    }
}
