//! The native server's request head reader (`http1::server::head::parse_request`): never panics; a
//! head it accepts is no longer than the input and the limit, reads the same from its own bytes,
//! and is never framed until close.
//! Input: 1 byte choosing the limit, then the wire.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    metronome_fuzz::check_request_head(data);
});
