//! The kubeconfig install-cni writes and the plugin and agent read (also hand-written ones).
//! Read through the product's entry point, a file, as in production. Properties: no panic;
//! every error names the file.
#![no_main]

use std::sync::OnceLock;

use istio_cni::kube::config_from_kubeconfig_file;
use libfuzzer_sys::fuzz_target;

/// One scratch file for the whole run (statics are never dropped: scripts/fuzz points TMPDIR
/// at a directory it removes afterwards).
struct Scratch {
    dir: tempfile::TempDir,
    rt: tokio::runtime::Runtime,
}

fn scratch() -> &'static Scratch {
    static S: OnceLock<Scratch> = OnceLock::new();
    S.get_or_init(|| Scratch {
        dir: tempfile::tempdir().expect("scratch dir"),
        rt: tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime"),
    })
}

fuzz_target!(|data: &[u8]| {
    let s = scratch();
    let path = s.dir.path().join("istio-cni-kubeconfig");
    std::fs::write(&path, data).expect("write the kubeconfig");
    if let Err(e) = s.rt.block_on(config_from_kubeconfig_file(&path)) {
        let text = e.to_string();
        assert!(
            text.contains(&*path.to_string_lossy()),
            "error without the file: {text}"
        );
    }
});
