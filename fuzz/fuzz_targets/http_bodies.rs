//! The node's HTTP body decoders (`/v1/check`, `/v1/check/batch`, `/v1/refund`) on arbitrary
//! bytes, through their fuzz entry points: nothing panics, and a batch body the fast path
//! reads means the same checks to the reference decoder.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    levee_node::http::fuzz_check_body(data);
    levee_node::http::fuzz_refund_body(data);
    levee_node::http::fuzz_batch_body(data, 1_000);
    levee_node::http::fuzz_batch_body(data, 2);
});
