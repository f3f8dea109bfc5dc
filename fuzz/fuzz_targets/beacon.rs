//! The browser beacon parser on arbitrary bodies: never panics; what it accepts is version 1,
//! at most MAX_GAPS gaps, every time finite and within an hour, so the recording arithmetic
//! (durations from milliseconds, added up) cannot panic either.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use metronome::proxy::beacon::{key_text, parse, read_key, MAX_GAPS};

fuzz_target!(|data: &[u8]| {
    let Ok(beacon) = parse(data) else {
        return;
    };
    assert_eq!(beacon.v, 1);
    // A key reads only from 32 hex digits, and reads back to the same text in lower case.
    if let Some(text) = beacon.key.as_deref() {
        if let Some(key) = read_key(text) {
            assert_eq!(key_text(key), text.to_ascii_lowercase());
        }
    }
    assert!(beacon.gaps_ms.len() <= MAX_GAPS);
    let ok = |ms: f64| ms.is_finite() && (0.0..=3_600_000.0).contains(&ms);
    assert!(beacon.ttft_ms.is_none_or(ok));
    assert!(beacon.gaps_ms.iter().all(|g| ok(*g)));
    // What beacon::record does with the times.
    let mut at = Duration::from_secs_f64(beacon.ttft_ms.unwrap_or(0.0) / 1e3);
    for gap in &beacon.gaps_ms {
        at += Duration::from_secs_f64(gap / 1e3);
    }
    assert!(at <= Duration::from_secs(3600 * (MAX_GAPS as u64 + 1)));
});
