//! The test API server as a process (tests, the demo and the benchmarks spawn it). It lives in the
//! test-only `istio-cni-testing` crate, so the shipped `istio-cni-rs` has neither the code nor the
//! role.

fn main() {
    std::process::exit(istio_cni_testing::apiserver::main(
        std::env::args().collect(),
    ));
}
