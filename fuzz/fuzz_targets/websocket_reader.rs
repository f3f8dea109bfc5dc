//! The WebSocket frame reader (`websocket::FrameReader`, either direction, with or without
//! permessage-deflate): cut anywhere, it reports exactly what it reports reading the input whole,
//! within its bound, and never panics.
//! Input: 1 byte of settings, 1 byte of bound, 8 bytes of cut seed, then one direction's bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    metronome_fuzz::check_websocket_reader(data);
});
