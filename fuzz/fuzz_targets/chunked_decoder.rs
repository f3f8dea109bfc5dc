//! The HTTP/1.1 body decoder (`http1::decode`, lenient as for upstream responses; chunked,
//! length, until close): cut anywhere, it decodes exactly as when it reads the input whole, and
//! never panics.
//! Input: 1 byte choosing the length, 8 bytes of cut seed, then the wire.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    metronome_fuzz::check_decoder(data);
});
