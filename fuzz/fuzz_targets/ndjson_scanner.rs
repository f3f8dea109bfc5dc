//! The NDJSON scanner: cut anywhere, it reports exactly the lines of a one-shot scan, within its
//! bound, and never panics. Input: 1 byte of bound, 8 bytes of cut seed, then the stream.
#![no_main]

use libfuzzer_sys::fuzz_target;
use metronome::scan::Framing;

fuzz_target!(|data: &[u8]| {
    metronome_fuzz::check_scanner(Framing::Ndjson, data);
});
