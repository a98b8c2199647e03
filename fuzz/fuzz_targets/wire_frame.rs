//! The wire frame decoder on arbitrary bytes: it never panics, and whatever it accepts
//! encodes back into a frame that decodes to the same message.
#![no_main]

use levee_proto::{decode_frame, decode_payload_of, encode_frame};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(msg) = decode_frame(data) {
        let frame = encode_frame(&msg).expect("a decoded message encodes");
        assert_eq!(decode_frame(&frame).expect("an encoded frame decodes"), msg);
    }
    // The payload decoders of every version, without the header's length to get right.
    if let Some((&version, payload)) = data.split_first() {
        if let Ok(msg) = decode_payload_of(version % 4, payload) {
            let frame = encode_frame(&msg).expect("a decoded message encodes");
            assert_eq!(decode_frame(&frame).expect("an encoded frame decodes"), msg);
        }
    }
});
