//! Pod sidecar annotations (and the proxy's env and securityContext): the redirect derivation.
//! The derivation lives in the pure `sidecar` room, shared by the plugin and the repair controller.

use std::collections::BTreeMap;

use istio_cni::sidecar::PodInfo;
use istio_cni::sidecar::redirect::{self as sc, EngineEnv, Redirect, RedirectError};
use proptest::prelude::*;

use super::{config as cases, nasty_string};

const ANNOTATIONS: &[&str] = &[
    sc::ANN_INJECT,
    sc::ANN_STATUS,
    sc::ANN_INTERCEPTION_MODE,
    sc::ANN_INCLUDE_OUTBOUND_IP_RANGES,
    sc::ANN_EXCLUDE_OUTBOUND_IP_RANGES,
    sc::ANN_INCLUDE_INBOUND_PORTS,
    sc::ANN_EXCLUDE_INBOUND_PORTS,
    sc::ANN_INCLUDE_OUTBOUND_PORTS,
    sc::ANN_EXCLUDE_OUTBOUND_PORTS,
    sc::ANN_EXCLUDE_INTERFACES,
    sc::ANN_REROUTE_VIRTUAL_INTERFACES,
    sc::ANN_KUBEVIRT_INTERFACES,
];

fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(
            &[
                "*",
                "",
                "REDIRECT",
                "TPROXY",
                "NONE",
                "80,443",
                "0",
                "65536",
                "10.0.0.0/8",
                "::/0",
                "eth0",
                "true",
                " , "
            ][..]
        )
        .prop_map(str::to_string),
        nasty_string(),
    ]
}

fn pod() -> impl Strategy<Value = PodInfo> {
    (
        prop::collection::btree_map(
            prop::sample::select(ANNOTATIONS).prop_map(str::to_string),
            value(),
            0..6,
        ),
        prop::collection::btree_map(
            prop::sample::select(
                &[
                    sc::ENV_DISABLE_ENVOY,
                    sc::ENV_DNS_CAPTURE,
                    sc::ENV_DUAL_STACK,
                    sc::ENV_INVALID_DROP,
                ][..],
            )
            .prop_map(str::to_string),
            value(),
            0..3,
        ),
        prop::option::of(prop_oneof![Just(-1i64), Just(0), Just(1337), any::<i64>()]),
        prop::option::of(prop_oneof![Just(-1i64), Just(4_294_967_295), any::<i64>()]),
    )
        .prop_map(|(annotations, proxy_env, proxy_uid, proxy_gid)| PodInfo {
            containers: ["istio-proxy".to_string(), "app".to_string()].into(),
            labels: BTreeMap::new(),
            annotations,
            proxy_type: Some("sidecar".into()),
            proxy_env,
            proxy_uid,
            proxy_gid,
            host_network: false,
        })
}

proptest! {
    #![proptest_config(cases())]

    #[test]
    fn annotations_never_panic_and_derived_values_reach_the_kernel_checked(pod in pod()) {
        let _ = sc::skip_reason(&pod);
        match sc::redirect(&pod, &EngineEnv::default()) {
            Ok(Redirect::Capture(settings)) => prop_assert_eq!(settings.config.validate(), Ok(())),
            Ok(Redirect::None) => {}
            Err(RedirectError::Annotation(e)) => {
                prop_assert!(pod.annotations.contains_key(e.annotation), "{e}");
                prop_assert!(e.to_string().contains(e.annotation));
            }
            Err(RedirectError::Value(_)) => {}
        }
    }
}
