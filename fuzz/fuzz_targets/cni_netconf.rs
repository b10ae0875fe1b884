//! The CNI stdin config, its prevResult and the result conversions the plugin applies to it.
//! Properties: no panic; a config error says what is wrong; a parsed prevResult written in a
//! current layout reads back equal.
#![no_main]

use istio_cni::plugin::config::{self, NetConf};
use istio_cni::plugin::result::{self, CniResult};
use libfuzzer_sys::fuzz_target;

const VERSIONS: &[&str] = &[
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0", "9.9.9", "",
];

fuzz_target!(|stdin: &[u8]| {
    let version = config::config_version(stdin);
    let salvaged = config::salvage_run_dir(stdin);
    let conf = match NetConf::parse(stdin) {
        Ok(conf) => conf,
        Err(e) => {
            assert!(!e.msg.is_empty(), "an error without a message");
            return;
        }
    };
    // The version the plugin answers in comes from the same bytes: both readers agree.
    if let Ok(v) = &version {
        assert_eq!(
            v, &conf.cni_version,
            "config_version and NetConf::parse disagree"
        );
    }
    if let Some(dir) = &salvaged {
        assert_eq!(
            dir, &conf.cni_agent_run_dir,
            "salvage_run_dir and NetConf::parse disagree"
        );
    }
    let Some(prev) = &conf.prev_result else {
        return;
    };
    let _ = result::pass_through(Some(prev), &conf.cni_version);
    let Ok(parsed) = CniResult::parse(prev, result::source_version(prev, &conf.cni_version)) else {
        return;
    };
    let _ = parsed.addresses();
    for v in VERSIONS {
        let _ = parsed.to_version(v);
    }
    for v in ["0.4.0", "1.0.0"] {
        let written = parsed
            .to_version(v)
            .expect("a parsed result converts to a current version");
        let back = CniResult::parse(&written, v).expect("our own output re-parses");
        assert_eq!(back, parsed, "prevResult did not round-trip through {v}");
    }
});
