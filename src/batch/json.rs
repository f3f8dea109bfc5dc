//! The JSON of `/episodes`: each upstream's recent episodes, newest first, bounded (at most
//! [`super::tracker::MAX_EPISODES`] per upstream, each naming at most
//! [`super::tracker::MAX_CAUGHT_IDS`] streams and [`super::tracker::MAX_EPISODE_ARRIVALS`]
//! arrivals, with exact counts beside).

use serde_json::{json, Value};

use super::tracker::Episode;
use crate::format::Phase;
use crate::metering::clock::Tick;

/// Wall-clock milliseconds of a tick, given the tick and the wall clock read together now.
fn unix_ms(tick: i64, now_tick: i64, now_unix_ms: u64) -> u64 {
    let back_ms = (now_tick - tick).max(0) / 1_000_000;
    now_unix_ms.saturating_sub(u64::try_from(back_ms).unwrap_or(u64::MAX))
}

/// One episode as `/episodes` shows it.
pub fn episode(upstream: &str, e: &Episode, now_tick: i64, now_unix_ms: u64) -> Value {
    let ms = |nanos: i64| nanos as f64 / 1e6;
    json!({
        "upstream": upstream,
        "id": e.id,
        "open": e.end.is_none(),
        "start_unix_ms": unix_ms(e.start, now_tick, now_unix_ms),
        "end_unix_ms": e.end.map(|end| unix_ms(end, now_tick, now_unix_ms)),
        "duration_ms": ms(e.end.unwrap_or(now_tick) - e.start),
        "streams": e.streams,
        "stream_ids": e.stream_ids.iter().map(|id| id.as_ref()).collect::<Vec<_>>(),
        "arrivals": e.arrivals,
        "hitches_by_phase": Phase::ALL
            .iter()
            .map(|p| (p.as_str().to_owned(), Value::from(e.hitch_phases[p.index()])))
            .collect::<serde_json::Map<_, _>>(),
        "arrived": e.arrived.iter().map(|a| json!({
            "stream_id": a.id.as_ref(),
            "before_start_ms": ms(e.start - a.at),
            "body_bytes": a.body_bytes,
            "prompt_tokens": a.prompt_tokens,
        })).collect::<Vec<_>>(),
    })
}

/// The whole `/episodes` document from `(upstream, episode)` pairs, newest first.
pub fn document(episodes: &[(std::sync::Arc<str>, Episode)]) -> String {
    let now_tick = i64::try_from(Tick::now().nanos_since(Tick::default())).unwrap_or(i64::MAX);
    let now_unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0);
    let list: Vec<Value> = episodes
        .iter()
        .map(|(upstream, e)| episode(upstream, e, now_tick, now_unix_ms))
        .collect();
    json!({ "episodes": list }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wall_clock_counts_back_from_now() {
        assert_eq!(unix_ms(1_000_000_000, 3_000_000_000, 10_000), 8_000);
        assert_eq!(unix_ms(5_000_000_000, 3_000_000_000, 10_000), 10_000);
    }
}
