//! The body of the plugin's `POST /cmdadd` to the node agent on `pluginevent.sock`: Istio's
//! `CNIPluginAddEvent`, whose JSON uses the Go field names (no tags). One type for both ends: the
//! plugin encodes it, the agent decodes it. Decoding goes through [`PluginAddEvent::decode`],
//! which names the field that is wrong (the agent answers 400 with that text and changes nothing).

use std::net::IpAddr;

use base64::Engine;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

/// The agent's socket for plugin events, in its run dir (`CNI_AGENT_RUN_DIR`).
pub const PLUGIN_EVENT_SOCKET: &str = "pluginevent.sock";

/// Istio's path for the ambient ADD event.
pub const CMD_ADD_PATH: &str = "/cmdadd";

/// What the plugin tells the agent about a new pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginAddEvent {
    /// `CNI_NETNS` as the runtime gave it (a path in the host's mount namespace).
    #[serde(rename = "Netns", default)]
    pub netns: String,
    #[serde(rename = "PodName", default)]
    pub pod_name: String,
    #[serde(rename = "PodNamespace", default)]
    pub pod_namespace: String,
    /// The previous plugin's `ips`; empty when the plugin is first in the chain. Go writes a nil
    /// slice as `null`, so `null` reads as empty.
    #[serde(rename = "IPs", default, deserialize_with = "null_as_empty")]
    pub ips: Vec<EventIp>,
}

/// One address of the pod (Go `IPConfig` without tags).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventIp {
    #[serde(rename = "Interface", default)]
    pub interface: Option<i64>,
    #[serde(rename = "Address")]
    pub address: EventIpNet,
    /// Go's `net.IP` writes nil as `""`.
    #[serde(
        rename = "Gateway",
        default,
        serialize_with = "ip_or_empty",
        deserialize_with = "empty_or_ip"
    )]
    pub gateway: Option<IpAddr>,
}

/// Go's `net.IPNet`: the address and the mask bytes, base64 (standard, padded).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventIpNet {
    #[serde(rename = "IP")]
    pub ip: IpAddr,
    #[serde(rename = "Mask", with = "mask_base64")]
    pub mask: Vec<u8>,
}

impl EventIpNet {
    /// From a CIDR string such as `10.0.0.2/24` (the CNI result's form).
    pub fn from_cidr(cidr: &str) -> Option<Self> {
        let net: ipnet::IpNet = cidr.parse().ok()?;
        let mask = match net.netmask() {
            IpAddr::V4(m) => m.octets().to_vec(),
            IpAddr::V6(m) => m.octets().to_vec(),
        };
        Some(EventIpNet {
            ip: net.addr(),
            mask,
        })
    }
}

/// A body the agent cannot use; names the field (`IPs[1].Address.IP`) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid /cmdadd body: {field}: {reason}")]
pub struct EventDecodeError {
    pub field: String,
    pub reason: String,
}

impl PluginAddEvent {
    /// The JSON bytes the plugin sends.
    pub fn to_json(&self) -> Vec<u8> {
        // Serialising plain strings, numbers and arrays cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Decodes a body the way Go's decoder would (field names match case-insensitively, unknown
    /// fields are ignored), but stricter where the agent needs it: the pod's name and namespace
    /// must be present and every address must parse. Errors name the field.
    pub fn decode(body: &[u8]) -> Result<Self, EventDecodeError> {
        let bad = |field: &str, reason: String| EventDecodeError {
            field: field.to_string(),
            reason,
        };
        let value: Value =
            serde_json::from_slice(body).map_err(|e| bad("body", format!("not JSON: {e}")))?;
        let obj = value
            .as_object()
            .ok_or_else(|| bad("body", format!("expected an object, got {}", kind(&value))))?;
        let netns = string_field(obj, "Netns", "Netns")?.unwrap_or_default();
        let pod_name = required(string_field(obj, "PodName", "PodName")?, "PodName")?;
        let pod_namespace = required(
            string_field(obj, "PodNamespace", "PodNamespace")?,
            "PodNamespace",
        )?;
        let ips = match get(obj, "IPs") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, item)| decode_ip(item, &format!("IPs[{i}]")))
                .collect::<Result<_, _>>()?,
            Some(other) => {
                return Err(bad(
                    "IPs",
                    format!("expected an array, got {}", kind(other)),
                ));
            }
        };
        Ok(PluginAddEvent {
            netns,
            pod_name,
            pod_namespace,
            ips,
        })
    }

    /// The pod addresses the plugin saw (the agent uses only these, unmapped from v4-in-v6).
    pub fn pod_ips(&self) -> Vec<IpAddr> {
        self.ips
            .iter()
            .map(|ip| ip.address.ip.to_canonical())
            .collect()
    }
}

fn decode_ip(item: &Value, path: &str) -> Result<EventIp, EventDecodeError> {
    let bad = |field: String, reason: String| EventDecodeError { field, reason };
    let obj = item.as_object().ok_or_else(|| {
        bad(
            path.into(),
            format!("expected an object, got {}", kind(item)),
        )
    })?;
    let interface = match get(obj, "Interface") {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.as_i64().ok_or_else(|| {
            bad(
                format!("{path}.Interface"),
                format!("expected an integer or null, got {}", kind(v)),
            )
        })?),
    };
    let addr_path = format!("{path}.Address");
    let address = match get(obj, "Address") {
        Some(Value::Object(a)) => a,
        Some(other) => {
            return Err(bad(
                addr_path,
                format!("expected an object, got {}", kind(other)),
            ));
        }
        None => return Err(bad(addr_path, "missing".into())),
    };
    let ip_path = format!("{addr_path}.IP");
    let ip_text = string_field(address, "IP", &ip_path)?.unwrap_or_default();
    let ip: IpAddr = ip_text
        .parse()
        .map_err(|_| bad(ip_path, format!("{ip_text:?} is not an IP address")))?;
    let mask_path = format!("{addr_path}.Mask");
    let mask = match string_field(address, "Mask", &mask_path)? {
        None => Vec::new(),
        Some(text) => base64::engine::general_purpose::STANDARD
            .decode(&text)
            .map_err(|e| bad(mask_path, format!("{text:?} is not base64: {e}")))?,
    };
    let gw_path = format!("{path}.Gateway");
    let gateway = match string_field(obj, "Gateway", &gw_path)? {
        None => None,
        Some(text) if text.is_empty() => None,
        Some(text) => Some(
            text.parse()
                .map_err(|_| bad(gw_path, format!("{text:?} is not an IP address")))?,
        ),
    };
    Ok(EventIp {
        interface,
        address: EventIpNet { ip, mask },
        gateway,
    })
}

/// Go matches JSON keys to field names case-insensitively (an exact match first).
fn get<'a>(obj: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    obj.get(name).or_else(|| {
        obj.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    })
}

pub(super) fn string_field(
    obj: &Map<String, Value>,
    name: &str,
    path: &str,
) -> Result<Option<String>, EventDecodeError> {
    match get(obj, name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(EventDecodeError {
            field: path.to_string(),
            reason: format!("expected a string, got {}", kind(other)),
        }),
    }
}

pub(super) fn required(value: Option<String>, field: &str) -> Result<String, EventDecodeError> {
    value
        .filter(|v| !v.is_empty())
        .ok_or_else(|| EventDecodeError {
            field: field.to_string(),
            reason: "missing or empty".into(),
        })
}

/// How a JSON value's type is named in errors ("got a number").
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn null_as_empty<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

fn ip_or_empty<S: Serializer>(ip: &Option<IpAddr>, s: S) -> Result<S::Ok, S::Error> {
    match ip {
        Some(ip) => s.collect_str(ip),
        None => s.serialize_str(""),
    }
}

fn empty_or_ip<'de, D: Deserializer<'de>>(d: D) -> Result<Option<IpAddr>, D::Error> {
    let text = Option::<String>::deserialize(d)?.unwrap_or_default();
    if text.is_empty() {
        return Ok(None);
    }
    text.parse().map(Some).map_err(serde::de::Error::custom)
}

mod mask_base64 {
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(mask: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(mask))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = Option::<String>::deserialize(d)?.unwrap_or_default();
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    /// The event whose bytes the `/cmdadd` and `/podadd` tests pin: one IPv4 address with its
    /// interface index and no gateway.
    pub(crate) fn pinned_event() -> PluginAddEvent {
        PluginAddEvent {
            netns: "/var/run/netns/x".into(),
            pod_name: "p".into(),
            pod_namespace: "ns".into(),
            ips: vec![EventIp {
                interface: Some(2),
                address: EventIpNet::from_cidr("10.0.0.2/24").unwrap(),
                gateway: None,
            }],
        }
    }

    /// What Istio's plugin sends for a dual-stack pod (Go's encoding/json of CNIPluginAddEvent).
    fn istio_body() -> Value {
        json!({
            "Netns": "/var/run/netns/cni-1234",
            "PodName": "web-0",
            "PodNamespace": "shop",
            "IPs": [
                {"Interface": 2, "Address": {"IP": "10.244.1.7", "Mask": "////AA=="}, "Gateway": "10.244.1.1"},
                {"Interface": null, "Address": {"IP": "fd00::7", "Mask": "//////////////////////8="}, "Gateway": ""}
            ]
        })
    }

    #[test]
    fn decodes_istio_json_and_round_trips() {
        let body = serde_json::to_vec(&istio_body()).unwrap();
        let ev = PluginAddEvent::decode(&body).unwrap();
        assert_eq!(ev.pod_name, "web-0");
        assert_eq!(ev.ips[0].interface, Some(2));
        assert_eq!(ev.ips[0].address.mask, vec![255, 255, 255, 0]);
        assert_eq!(ev.ips[0].gateway, Some("10.244.1.1".parse().unwrap()));
        assert_eq!(ev.ips[1].gateway, None);
        assert_eq!(
            ev.pod_ips(),
            vec![
                "10.244.1.7".parse::<IpAddr>().unwrap(),
                "fd00::7".parse().unwrap()
            ]
        );
        // Encoding gives Istio's shape back, byte-for-byte as JSON values.
        let back: Value = serde_json::from_slice(&ev.to_json()).unwrap();
        assert_eq!(back, istio_body());
        // serde's derive agrees with the field-naming decoder.
        let derived: PluginAddEvent = serde_json::from_slice(&body).unwrap();
        assert_eq!(derived, ev);
    }

    #[test]
    fn go_decoder_leniency_is_kept() {
        let ev = PluginAddEvent::decode(
            br#"{"netns":"n","podname":"p","PODNAMESPACE":"ns","IPs":null,"Extra":1}"#,
        )
        .unwrap();
        assert_eq!((ev.netns.as_str(), ev.ips.len()), ("n", 0));
        let mapped = PluginAddEvent::decode(
            br#"{"PodName":"p","PodNamespace":"ns","IPs":[{"Address":{"IP":"::ffff:10.0.0.1","Mask":""}}]}"#,
        )
        .unwrap();
        assert_eq!(
            mapped.pod_ips(),
            vec!["10.0.0.1".parse::<IpAddr>().unwrap()]
        );
    }

    #[test]
    fn errors_name_the_field() {
        let field = |body: Value| {
            PluginAddEvent::decode(&serde_json::to_vec(&body).unwrap())
                .unwrap_err()
                .field
        };
        assert_eq!(field(json!({"PodNamespace": "ns"})), "PodName");
        assert_eq!(
            field(json!({"PodName": 3, "PodNamespace": "ns"})),
            "PodName"
        );
        assert_eq!(field(json!({"PodName": "p"})), "PodNamespace");
        assert_eq!(
            field(json!({"PodName": "p", "PodNamespace": "n", "IPs": {}})),
            "IPs"
        );
        let mut b = istio_body();
        b["IPs"][1]["Address"]["IP"] = json!("nope");
        assert_eq!(field(b), "IPs[1].Address.IP");
        let mut b = istio_body();
        b["IPs"][0]["Address"]["Mask"] = json!("***");
        assert_eq!(field(b), "IPs[0].Address.Mask");
        let mut b = istio_body();
        b["IPs"][0]["Gateway"] = json!("x");
        assert_eq!(field(b), "IPs[0].Gateway");
        let mut b = istio_body();
        b["IPs"][0]["Interface"] = json!("eth0");
        assert_eq!(field(b), "IPs[0].Interface");
        assert_eq!(field(json!([1])), "body");
        let err = PluginAddEvent::decode(b"{").unwrap_err();
        assert_eq!(err.field, "body");
        assert!(
            err.to_string()
                .starts_with("invalid /cmdadd body: body: not JSON")
        );
    }

    #[test]
    fn cidr_conversion() {
        let net = EventIpNet::from_cidr("10.0.0.2/24").unwrap();
        assert_eq!(net.mask, vec![255, 255, 255, 0]);
        assert_eq!(
            EventIpNet::from_cidr("fd00::2/64").unwrap().mask,
            [vec![255u8; 8], vec![0u8; 8]].concat()
        );
        assert_eq!(EventIpNet::from_cidr("bogus"), None);
    }

    /// The `/cmdadd` bytes as Istio's agent and ours read them.
    #[test]
    fn the_cmdadd_bytes_are_pinned() {
        let event = pinned_event();
        let json = r#"{"Netns":"/var/run/netns/x","PodName":"p","PodNamespace":"ns","IPs":[{"Interface":2,"Address":{"IP":"10.0.0.2","Mask":"////AA=="},"Gateway":""}]}"#;
        assert_eq!(String::from_utf8(event.to_json()).unwrap(), json);
        assert_eq!(PluginAddEvent::decode(json.as_bytes()).unwrap(), event);
    }
}
