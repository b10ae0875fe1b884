//! The plugin's inputs: the stdin config and its prevResult, CNI_ARGS, and the `/cmdadd` body.

use istio_cni::plugin::args::{ArgsError, CniArgs};
use istio_cni::plugin::config::{self, NetConf};
use istio_cni::plugin::result::{self, CniResult};
use istio_cni::wire::event::{EventIp, EventIpNet, PluginAddEvent};
use proptest::prelude::*;
use serde_json::{Value, json};

use super::{any_json, config as cases, nasty_string, object_over, with_duplicate_key};

const NETCONF_KEYS: &[&str] = &[
    "cniVersion",
    "name",
    "type",
    "prevResult",
    "capabilities",
    "ipam",
    "dns",
    "plugin_log_level",
    "cni_agent_run_dir",
    "ambient_enabled",
    "enablement_selectors",
    "exclude_namespaces",
    "kubernetes",
    "pod_namespace",
    "native_nftables",
    "enable_ambient_detection_retry",
    "add_timeout_seconds",
    "kube_call_timeout_seconds",
    "pod_lookup_timeout_seconds",
];

const VERSIONS: &[&str] = &[
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0", "9.9.9", "",
];

/// String fields of the config, each given a wrong-typed value by the error-naming property.
const STRING_FIELDS: &[&str] = &[
    "type",
    "plugin_log_level",
    "cni_agent_run_dir",
    "pod_namespace",
];
const BOOL_FIELDS: &[&str] = &[
    "ambient_enabled",
    "native_nftables",
    "enable_ambient_detection_retry",
];
const SECONDS_FIELDS: &[&str] = &[
    "add_timeout_seconds",
    "kube_call_timeout_seconds",
    "pod_lookup_timeout_seconds",
];

fn valid_base() -> serde_json::Map<String, Value> {
    json!({"cniVersion": "0.3.1", "name": "k8s-pod-network", "type": "istio-cni"})
        .as_object()
        .cloned()
        .expect("object")
}

/// A prevResult shaped like a real one, with any values in its leaves.
fn prev_result() -> impl Strategy<Value = Value> {
    let cidr = prop_oneof![
        Just("10.0.0.2/24".to_string()),
        Just("fd00::2/64".to_string()),
        Just("10.0.0.2".to_string()),
        nasty_string(),
    ];
    (
        prop::sample::select(VERSIONS),
        prop::collection::vec((cidr.clone(), prop::option::of(0i64..3), any_json()), 0..3),
        prop::collection::vec((cidr, any_json()), 0..3),
        any_json(),
    )
        .prop_map(|(v, ips, routes, dns)| {
            let ips: Vec<Value> = ips
                .into_iter()
                .map(|(a, i, gw)| json!({"address": a, "interface": i, "gateway": gw}))
                .collect();
            let routes: Vec<Value> = routes
                .into_iter()
                .map(|(d, gw)| json!({"dst": d, "gw": gw}))
                .collect();
            json!({"cniVersion": v, "interfaces": [{"name": "eth0"}], "ips": ips, "routes": routes,
                   "ip4": {"ip": "10.0.0.2/24"}, "dns": dns})
        })
}

fn event() -> impl Strategy<Value = PluginAddEvent> {
    let ip = (
        prop_oneof![
            (any::<[u8; 4]>(), 0u8..=32)
                .prop_map(|(a, p)| format!("{}/{p}", std::net::Ipv4Addr::from(a))),
            (any::<[u8; 16]>(), 0u8..=128)
                .prop_map(|(a, p)| format!("{}/{p}", std::net::Ipv6Addr::from(a))),
        ],
        prop::option::of(any::<i64>()),
        prop::option::of(any::<[u8; 4]>().prop_map(std::net::IpAddr::from)),
    )
        .prop_map(|(cidr, interface, gateway)| EventIp {
            interface,
            address: EventIpNet::from_cidr(&cidr).expect("generated CIDR parses"),
            gateway,
        });
    (
        nasty_string(),
        "[a-z0-9.-]{1,30}",
        "[a-z0-9-]{1,30}",
        prop::collection::vec(ip, 0..4),
    )
        .prop_map(|(netns, pod_name, pod_namespace, ips)| PluginAddEvent {
            netns,
            pod_name,
            pod_namespace,
            ips,
        })
}

proptest! {
    #![proptest_config(cases())]

    #[test]
    fn netconf_never_panics_on_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = NetConf::parse(&bytes);
        let _ = config::config_version(&bytes);
        let _ = config::salvage_run_dir(&bytes);
    }

    #[test]
    fn netconf_never_panics_on_near_valid_objects(
        extra in object_over(NETCONF_KEYS),
        prev in prop::option::of(prev_result()),
        dup in any_json(),
    ) {
        let mut obj = valid_base();
        obj.extend(extra);
        if let Some(p) = prev {
            obj.insert("prevResult".into(), p);
        }
        let bytes = with_duplicate_key(&obj, &dup);
        if let Ok(conf) = NetConf::parse(&bytes)
            && let Some(prev) = &conf.prev_result
        {
            let _ = result::pass_through(Some(prev), &conf.cni_version);
        }
        let _ = config::salvage_run_dir(&bytes);
    }

    #[test]
    fn netconf_type_errors_name_the_field(
        field in prop::sample::select([STRING_FIELDS, BOOL_FIELDS, SECONDS_FIELDS].concat()),
        wrong in prop_oneof![Just(json!([1])), Just(json!({"a": 1})), Just(json!("text"))],
    ) {
        let mut obj = valid_base();
        // A string is the right type for string fields; give those a number instead.
        let wrong = if STRING_FIELDS.contains(&field) && wrong.is_string() { json!(7) } else { wrong };
        obj.insert(field.to_string(), wrong);
        let err = NetConf::parse(&serde_json::to_vec(&obj).unwrap()).expect_err("wrong type accepted");
        prop_assert!(err.msg.contains(field), "{field}: {}", err.msg);
    }

    #[test]
    fn prev_result_parse_and_convert_never_panic(prev in prop_oneof![prev_result(), any_json()],
                                                 version in prop::sample::select(VERSIONS)) {
        let _ = result::pass_through(Some(&prev), version);
        if let Ok(r) = CniResult::parse(&prev, result::source_version(&prev, version)) {
            for v in VERSIONS {
                let _ = r.to_version(v);
            }
        }
    }

    #[test]
    fn prev_result_round_trips_through_current_layouts(prev in prev_result(),
                                                       to in prop::sample::select(&["0.4.0", "1.0.0"][..])) {
        if let Ok(r) = CniResult::parse(&prev, result::source_version(&prev, "1.0.0")) {
            let written = r.to_version(to).expect("a parsed result converts to a current version");
            prop_assert_eq!(CniResult::parse(&written, to).expect("re-parse"), r);
        }
    }

    #[test]
    fn cni_args_never_panic(raw in nasty_string()) {
        if let Ok(args) = CniArgs::parse(&raw) {
            let _ = args.check_kubernetes_names();
        }
    }

    #[test]
    fn cni_args_known_keys_round_trip(
        name in "[^;=]{0,20}", ns in "[^;=]{0,20}", id in "[^;=]{0,20}", uid in "[^;=]{0,20}",
        ignore in prop::sample::select(&["1", "true", "TRUE", "0", "false", "False"][..]),
        unknown in prop::option::of("[A-Z_]{1,8}"),
    ) {
        let mut raw = format!("IgnoreUnknown={ignore};K8S_POD_NAME={name};K8S_POD_NAMESPACE={ns};K8S_POD_INFRA_CONTAINER_ID={id};K8S_POD_UID={uid}");
        if let Some(key) = &unknown {
            raw.push_str(&format!(";X{key}=v"));
        }
        let ignore_unknown = matches!(ignore, "1" | "true" | "TRUE");
        match CniArgs::parse(&raw) {
            Ok(args) => {
                prop_assert!(unknown.is_none() || ignore_unknown);
                prop_assert_eq!(args, CniArgs { ignore_unknown, pod_name: name, pod_namespace: ns,
                    pod_infra_container_id: id, pod_uid: uid });
            }
            Err(ArgsError::Unknown(keys)) => {
                prop_assert!(!ignore_unknown);
                let key = unknown.expect("error only with an unknown key");
                prop_assert_eq!(keys, vec![format!("X{key}=v")]);
            }
            Err(e) => prop_assert!(false, "unexpected error {e}"),
        }
    }

    #[test]
    fn cni_args_bad_values_are_named(value in "[^;=]{0,10}") {
        prop_assume!(!["1", "0", "true", "false"].contains(&value.to_ascii_lowercase().as_str()));
        let err = CniArgs::parse(&format!("IgnoreUnknown={value}")).expect_err("bad bool accepted");
        prop_assert!(err.to_string().contains("IgnoreUnknown"), "{err}");
    }

    #[test]
    fn plugin_event_decode_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..256),
                                        obj in object_over(&["Netns", "PodName", "PodNamespace", "IPs"])) {
        let _ = PluginAddEvent::decode(&bytes);
        if let Ok(e) = PluginAddEvent::decode(&serde_json::to_vec(&obj).unwrap()) {
            let _ = e.pod_ips();
        }
    }

    #[test]
    fn plugin_event_round_trips(e in event()) {
        prop_assert_eq!(PluginAddEvent::decode(&e.to_json()).expect("decode"), e);
    }

    #[test]
    fn plugin_event_errors_name_the_field(e in event(), index in any::<prop::sample::Index>(),
                                          leaf in prop::sample::select(&["Address", "IP", "Mask", "Gateway", "Interface"][..]),
                                          wrong in prop_oneof![Just(json!("not an address")), Just(json!([1])), Just(json!({}))]) {
        prop_assume!(!e.ips.is_empty());
        let i = index.index(e.ips.len());
        let mut v: Value = serde_json::from_slice(&e.to_json()).unwrap();
        let item = &mut v["IPs"][i];
        let path = match leaf {
            "IP" | "Mask" => { item["Address"][leaf] = wrong; format!("IPs[{i}].Address.{leaf}") }
            _ => { item[leaf] = wrong; format!("IPs[{i}].{leaf}") }
        };
        if let Err(err) = PluginAddEvent::decode(&serde_json::to_vec(&v).unwrap()) {
            prop_assert!(err.field.starts_with(&path), "{path}: {err}");
        } else {
            // Only the interface may legitimately stay valid (`{}`/`[1]` are not numbers).
            prop_assert!(false, "{path} accepted a wrong value");
        }
    }
}
