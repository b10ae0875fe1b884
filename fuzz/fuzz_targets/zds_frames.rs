//! ZDS frames ztunnel sends the agent: the hello and every reply, whole or truncated (a datagram
//! larger than the receive buffer). Properties: no panic; a whole NACK re-encodes to a frame that
//! decodes equal.
#![no_main]

use istio_cni::zds::proto::{self, Ack, Reply, WorkloadResponse, pb};
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|frame: &[u8]| {
    let _ = proto::decode_hello(frame);
    let _ = proto::decode_reply(frame, true);
    match proto::decode_reply(frame, false) {
        Ok(Reply::Nack { message, truncated }) => {
            assert!(!truncated, "a whole frame read as truncated");
            let again = WorkloadResponse {
                payload: Some(pb::workload_response::Payload::Ack(Ack {
                    error: message.clone(),
                })),
            }
            .encode_to_vec();
            assert_eq!(
                proto::decode_reply(&again, false),
                Ok(Reply::Nack {
                    message,
                    truncated: false
                })
            );
        }
        Ok(_) | Err(_) => {}
    }
});
