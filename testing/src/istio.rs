//! Istio's own binaries (istio-cni, install-cni, pilot-agent), built from the `istio.io/istio`
//! module by `scripts/build-istio` into `target/istio/` (or `ISTIO_BIN_DIR`): the oracle of the
//! differential tests and the baseline of the side-by-side benchmarks.

use std::path::{Path, PathBuf};

/// The path of Istio's binary `name`; panics naming the script when it was not built.
pub fn istio_bin(name: &str) -> PathBuf {
    let dir = std::env::var_os("ISTIO_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/istio"));
    let bin = dir.join(name);
    assert!(
        bin.is_file(),
        "{} is missing: run scripts/build-istio (scripts/test does) to build Istio's binaries",
        bin.display()
    );
    bin
}
