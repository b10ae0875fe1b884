# Developer shortcuts; the README's commands are the scripts these call.

# run the demo (needs root)
demo:
    ./scripts/demo

# run every test (needs root)
test:
    ./scripts/test

# fuzz every parser of outside input, FUZZ_SECONDS each (default 30; needs nightly + cargo-fuzz)
fuzz *targets:
    ./scripts/fuzz {{targets}}

# benchmarks; results are written to docs/benchmarks.md
bench:
    ./scripts/bench

# fully static release binary in target/static/istio-cni-rs
build-static:
    ./scripts/build-static

fmt:
    cargo fmt

lint:
    cargo clippy --workspace --all-targets -- -D warnings

# the container image from the Containerfile with podman (root; local bases: see docs/deploy.md)
image:
    ./scripts/image
