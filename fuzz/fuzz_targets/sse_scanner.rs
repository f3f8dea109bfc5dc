//! The SSE scanner: cut anywhere (at fuzzer-chosen frame boundaries and byte by byte), it
//! reports exactly the events of a one-shot scan, within its bound, and never panics.
//! Input: 1 byte of bound, 8 bytes of cut seed, then the stream.
#![no_main]

use libfuzzer_sys::fuzz_target;
use metronome::scan::Framing;

fuzz_target!(|data: &[u8]| {
    metronome_fuzz::check_scanner(Framing::Sse, data);
});
