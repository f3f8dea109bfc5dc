//! The native server's request body decoder (the strict chunked decoder, or a length): cut
//! anywhere, it decodes exactly as when it reads the input whole, never panics, and never
//! accepts a chunk-size line or chunk end that is not CRLF-terminated.
//! Input: 1 byte choosing the length, 8 bytes of cut seed, then the wire.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    metronome_fuzz::check_request_body(data);
});
