//! Pod-facts request lines the plugin sends install-cni (podfacts/pod.sock) and the answer lines
//! it reads back. Properties: no panic; a request that decodes re-encodes to one line that
//! decodes equal; an answer that decodes re-encodes to one that decodes equal.
#![no_main]

use istio_cni::wire::pod_facts::{PodFactsAnswer, PodFactsRequest};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|line: &[u8]| {
    if let Ok(req) = PodFactsRequest::decode(line) {
        let again = req.encode();
        assert_eq!(
            again.iter().filter(|b| **b == b'\n').count(),
            1,
            "not one line"
        );
        assert_eq!(
            PodFactsRequest::decode(&again).expect("our own request decodes"),
            req
        );
    }
    if let Ok(answer) = PodFactsAnswer::decode(line) {
        let again = answer.encode();
        assert_eq!(
            again.iter().filter(|b| **b == b'\n').count(),
            1,
            "not one line"
        );
        let back = PodFactsAnswer::decode(&again).expect("our own answer decodes");
        assert_eq!(back.encode(), again, "answer does not round-trip");
    }
});
