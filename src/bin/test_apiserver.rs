//! The test API server as a process (tests and the demo spawn it); built only with the
//! `testserver` feature, so the shipped `istio-cni-rs` has neither the code nor the role.

fn main() {
    std::process::exit(istio_cni::kube::testserver::main(
        std::env::args().collect(),
    ));
}
