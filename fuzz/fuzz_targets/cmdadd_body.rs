//! `/cmdadd` bodies the plugin POSTs to the agent (pluginevent.sock). Properties: no panic; an
//! error names a field; a decoded event re-encodes to a body that decodes equal.
#![no_main]

use istio_cni::wire::event::PluginAddEvent;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|body: &[u8]| {
    match PluginAddEvent::decode(body) {
        Ok(event) => {
            let _ = event.pod_ips();
            let again = PluginAddEvent::decode(&event.to_json()).expect("our own encoding decodes");
            assert_eq!(again, event, "/cmdadd body does not round-trip");
        }
        Err(e) => assert!(!e.field.is_empty(), "an error naming no field: {e}"),
    }
});
