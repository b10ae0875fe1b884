//! `CNI_ARGS` (`K=V;K=V`, set by the runtime). Properties: no panic; errors name a key; the
//! Kubernetes keys read back as given.
#![no_main]

use istio_cni::plugin::args::CniArgs;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The plugin reads CNI_ARGS through the environment as UTF-8; other bytes never reach here.
    let Ok(raw) = std::str::from_utf8(data) else {
        return;
    };
    match CniArgs::parse(raw) {
        Ok(args) => {
            if let Err(e) = args.check_kubernetes_names() {
                let text = e.to_string();
                assert!(
                    text.contains("K8S_POD_"),
                    "name error without its key: {text}"
                );
            }
            // Every known key reads back verbatim (the last one when given twice).
            for (key, got) in [
                ("K8S_POD_NAME", &args.pod_name),
                ("K8S_POD_NAMESPACE", &args.pod_namespace),
                ("K8S_POD_INFRA_CONTAINER_ID", &args.pod_infra_container_id),
                ("K8S_POD_UID", &args.pod_uid),
            ] {
                let last = raw
                    .split(';')
                    .filter_map(|kv| kv.split_once('='))
                    .filter(|(k, _)| *k == key)
                    .map(|(_, v)| v)
                    .last();
                assert_eq!(got, last.unwrap_or(""), "{key}");
            }
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
