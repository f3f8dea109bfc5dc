//! The native upstream client's response head reader (`http1::client::parse_head`):
//! never panics; a head it accepts is consumed exactly, and a response framed by
//! transfer-encoding carries no content-length on.
//! Input: 1 byte (bit 0: the request was HEAD), then the wire.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    metronome_fuzz::check_response_head(data);
});
