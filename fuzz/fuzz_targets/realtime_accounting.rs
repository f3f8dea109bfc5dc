//! The Realtime API's accountant, which reads each WebSocket message a server sends: it
//! classifies arbitrary messages and never panics; an unparsed message is never a token event,
//! and only `response.done` ends a response.
//! Input: the message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use metronome::format::RealtimeAccounting;
use metronome::scan::Event;

fuzz_target!(|data: &[u8]| {
    for truncated in [false, true] {
        let event = Event {
            kind: b"",
            data,
            truncated,
        };
        let classified = RealtimeAccounting.classify(&event);
        if classified.unparsed {
            assert!(!classified.token_event, "an unparsed message counted as a token event");
        }
        if classified.end {
            assert!(!classified.token_event, "response.done counted as a token event");
        }
    }
});
