//! The configuration parser on arbitrary text: never panics; a refusal names at least one key;
//! a configuration it accepts is within its documented bounds, its durations make deadlines
//! that do not overflow, and it starts (metrics, routes, the pooled client).
#![no_main]

use libfuzzer_sys::fuzz_target;
use metronome::config::Config;
use metronome::proxy::ProxyState;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Config::from_toml(text) {
        Ok(config) => {
            assert!((256..=16 * 1024 * 1024).contains(&config.metering.max_event_bytes));
            assert!((1024..=256 * 1024 * 1024).contains(&config.metering.buffer_bytes));
            assert!((1..=1 << 20).contains(&config.metering.buffer_frames));
            assert!(config
                .routes
                .iter()
                .all(|r| r.name != "other" && !r.name.is_empty()));
            // Every duration becomes a deadline `now + duration` somewhere.
            let now = std::time::Instant::now();
            for d in [
                config.server.drain_grace,
                config.timeouts.connect,
                config.timeouts.first_byte,
                config.timeouts.idle,
                config.metering.stall_threshold,
            ] {
                assert!(
                    now.checked_add(d).is_some(),
                    "a deadline {d:?} away overflows"
                );
            }
            if let Err(e) = ProxyState::new(config) {
                panic!("a configuration that validates does not start: {e}");
            }
        }
        Err(e) => {
            assert!(!e.0.is_empty(), "a refusal without a reason");
            assert!(e
                .0
                .iter()
                .all(|p| !p.key.is_empty() && !p.reason.is_empty()));
            let _ = e.to_string();
        }
    }
});
