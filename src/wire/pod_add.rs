//! The one-round-trip ambient ADD on `pluginevent.sock` (ours, not Istio's): the plugin's
//! `POST /podadd` ([`PodAddRequest`]: the `/cmdadd` event and the pod's uid) and the agent's
//! answers — [`PodAddAnswer`] when it could decide, [`AddFailure`] when it did not enrol the pod.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::event::{EventDecodeError, PluginAddEvent, required, string_field};

/// The agent's path for the one-round-trip ambient ADD (ours, not Istio's: an agent without it
/// answers 404 and the plugin takes Istio's way, pod lookup then `/cmdadd`).
pub const POD_ADD_PATH: &str = "/podadd";

/// The `/podadd` body: the `/cmdadd` event and the pod's uid from CNI_ARGS (`K8S_POD_UID`), so
/// the agent answers from its pod store only for the very pod the runtime is setting up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodAddRequest {
    pub event: PluginAddEvent,
    pub uid: String,
}

impl PodAddRequest {
    /// The event's JSON object with a `PodUID` key added.
    pub fn to_json(&self) -> Vec<u8> {
        let mut value = serde_json::to_value(&self.event).unwrap_or_default();
        if let Some(obj) = value.as_object_mut() {
            obj.insert("PodUID".into(), Value::String(self.uid.clone()));
        }
        serde_json::to_vec(&value).unwrap_or_default()
    }

    /// Decodes as [`PluginAddEvent::decode`] does, and requires a non-empty `PodUID`.
    pub fn decode(body: &[u8]) -> Result<Self, EventDecodeError> {
        let event = PluginAddEvent::decode(body)?;
        // The event decoded, so the body is a JSON object.
        let value: Value = serde_json::from_slice(body).unwrap_or_default();
        let obj = value.as_object().cloned().unwrap_or_default();
        let uid = required(string_field(&obj, "PodUID", "PodUID")?, "PodUID")?;
        if uid.is_empty() {
            return Err(EventDecodeError {
                field: "PodUID".into(),
                reason: "empty".into(),
            });
        }
        Ok(PodAddRequest { event, uid })
    }
}

/// The agent's answer to `/podadd` when it could decide (HTTP 200); a failed or late enrolment
/// is a 500 or 504 with an [`AddFailure`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "camelCase")]
pub enum PodAddAnswer {
    /// In-pod rules in, ztunnel acked, probe set updated (the annotation follows).
    Enrolled,
    /// Not selected for ambient: the pod (trimmed by [`super::pod::trim_for_plugin`]) for the
    /// plugin's sidecar path.
    #[serde(rename_all = "camelCase")]
    NotAmbient {
        pod: Box<k8s_openapi::api::core::v1::Pod>,
    },
    /// The agent's stores cannot answer for this pod (not synced, not there yet, another uid):
    /// the plugin asks the API server, as without an agent.
    #[serde(rename_all = "camelCase")]
    Unknown { reason: String },
}

impl PodAddAnswer {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn decode(body: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(body)
    }
}

/// The agent's answer when it did not enrol the pod (`/podadd`'s 500 or 504, JSON): what kind of
/// failure, the pod and the cause. An older agent answers plain text, and `/cmdadd` (Istio's
/// wire) always does: [`AddFailure::read`] takes either.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AddFailure {
    pub kind: FailureKind,
    /// `namespace/name`.
    #[serde(default)]
    pub pod: String,
    /// The cause, as the agent words it (it names the pod and the step).
    #[serde(default)]
    pub message: String,
}

/// Whether the kubelet's next try of the ADD may succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FailureKind {
    /// Something that may clear by itself (ztunnel not connected yet, the stores behind, the
    /// agent slow): the next try may succeed.
    Transient,
    /// Nothing will change by trying the same again (the netns refused or not programmable, the
    /// pod not eligible): the next try fails the same way until something else changes.
    Permanent,
    /// An answer in plain text (an older agent, or `/cmdadd`), or a kind this plugin does not
    /// know (a newer agent).
    #[serde(other)]
    Unknown,
}

impl FailureKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Transient => "transient",
            FailureKind::Permanent => "permanent",
            FailureKind::Unknown => "unclassified",
        }
    }
}

impl AddFailure {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The answer's body as the plugin received it: the typed JSON, or plain text (an older
    /// agent's, `/cmdadd`'s) taken as the message of an unclassified failure of `pod`.
    pub fn read(body: &str, pod: &str) -> AddFailure {
        match serde_json::from_str::<AddFailure>(body) {
            Ok(mut failure) => {
                if failure.pod.is_empty() {
                    failure.pod = pod.to_string();
                }
                failure
            }
            Err(_) => AddFailure {
                kind: FailureKind::Unknown,
                pod: pod.to_string(),
                message: body.trim_end().to_string(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_podadd_body_is_the_event_with_the_uid_and_needs_it() {
        let event = PluginAddEvent {
            netns: "/var/run/netns/x".into(),
            pod_name: "p".into(),
            pod_namespace: "ns".into(),
            ips: vec![],
        };
        let request = PodAddRequest {
            event: event.clone(),
            uid: "u-1".into(),
        };
        let body = request.to_json();
        assert_eq!(PodAddRequest::decode(&body), Ok(request));
        // Istio's decoder (and ours for /cmdadd) ignores the extra key.
        assert_eq!(PluginAddEvent::decode(&body), Ok(event.clone()));
        let err = PodAddRequest::decode(&event.to_json()).unwrap_err();
        assert_eq!(err.field, "PodUID", "{err}");
        let answer = PodAddAnswer::Unknown {
            reason: "not yet".into(),
        };
        assert_eq!(
            answer.to_json(),
            r#"{"answer":"unknown","reason":"not yet"}"#
        );
        assert_eq!(PodAddAnswer::decode(&answer.to_json()).unwrap(), answer);
        assert_eq!(PodAddAnswer::Enrolled.to_json(), r#"{"answer":"enrolled"}"#);
    }

    #[test]
    fn an_add_failure_reads_typed_from_a_newer_agent_and_as_text_from_an_older_one() {
        let typed = AddFailure {
            kind: FailureKind::Transient,
            pod: "ns/p".into(),
            message: "ztunnel is not connected".into(),
        };
        assert_eq!(AddFailure::read(&typed.to_json(), "ns/q"), typed);
        // An older agent (or /cmdadd): plain text, the pod from the plugin's own arguments.
        let text = AddFailure::read("pod ns/p: no netns found\n", "ns/p");
        assert_eq!(text.kind, FailureKind::Unknown);
        assert_eq!(text.pod, "ns/p");
        assert_eq!(text.message, "pod ns/p: no netns found");
        // A kind this plugin does not know yet, from a newer agent.
        let newer = AddFailure::read(
            r#"{"kind": "quota", "pod": "ns/p", "message": "m", "extra": 1}"#,
            "ns/p",
        );
        assert_eq!(newer.kind, FailureKind::Unknown);
        assert_eq!(newer.message, "m");
    }

    /// The bytes on the wire, as older and newer plugins and agents exchange them.
    #[test]
    fn the_podadd_bytes_are_pinned() {
        let request = PodAddRequest {
            event: super::super::event::tests::pinned_event(),
            uid: "u-1".into(),
        };
        assert_eq!(
            String::from_utf8(request.to_json()).unwrap(),
            r#"{"IPs":[{"Address":{"IP":"10.0.0.2","Mask":"////AA=="},"Gateway":"","Interface":2}],"Netns":"/var/run/netns/x","PodName":"p","PodNamespace":"ns","PodUID":"u-1"}"#
        );
        let pod: k8s_openapi::api::core::v1::Pod =
            serde_json::from_str(r#"{"metadata":{"name":"p","namespace":"ns"}}"#).unwrap();
        let not_ambient = PodAddAnswer::NotAmbient { pod: Box::new(pod) };
        let json = r#"{"answer":"notAmbient","pod":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"ns"}}}"#;
        assert_eq!(not_ambient.to_json(), json);
        assert_eq!(PodAddAnswer::decode(json).unwrap(), not_ambient);
        let failure = AddFailure {
            kind: FailureKind::Permanent,
            pod: "ns/p".into(),
            message: "m".into(),
        };
        let json = r#"{"kind":"permanent","pod":"ns/p","message":"m"}"#;
        assert_eq!(failure.to_json(), json);
        assert_eq!(AddFailure::read(json, "?"), failure);
    }
}
