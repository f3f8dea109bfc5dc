//! The `traceparent` reader (`trace_context::TraceParent::parse`) on any header text: never
//! panics; what it accepts is the W3C form (optional spaces and tabs around, a lowercase hex
//! version other than `ff`, exactly 55 characters for version 00, lowercase hex IDs that are not
//! all zero), its fields are the text's, and the exemplars' trace ID reader agrees with it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use metronome::hex::bytes_text as to_hex;
use metronome::trace_context::TraceParent;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = TraceParent::parse(text);
    assert_eq!(
        parsed.map(|p| to_hex(&p.trace_id)).as_deref(),
        metronome::metrics::trace_id(text)
    );
    let Some(parent) = parsed else {
        return;
    };
    let value = text.trim_matches([' ', '\t']);
    let lower_hex = |s: &str| s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    assert!(lower_hex(&value[..2]) && &value[..2] != "ff");
    assert!(value.len() == 55 || (&value[..2] != "00" && value.as_bytes()[55] == b'-'));
    assert_eq!(&value[3..35], to_hex(&parent.trace_id));
    assert_eq!(&value[36..52], to_hex(&parent.parent_id));
    assert!(lower_hex(&value[53..55]));
    assert_ne!(parent.trace_id, [0; 16]);
    assert_ne!(parent.parent_id, [0; 8]);
});
