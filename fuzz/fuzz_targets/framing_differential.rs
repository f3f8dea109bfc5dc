//! Differential: the native chunk-size reader (strict, as for request bodies) against
//! httparse's `parse_chunk_size`, and the native request head reader against httparse's own
//! parse, on the same bytes. What the native side accepts, httparse reads the same way.
//! Input: the wire.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    metronome_fuzz::check_framing_differential(data);
});
