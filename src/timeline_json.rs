//! The JSON of `GET /streams/{id}` as its readers see it (docs/timelines.md is the contract):
//! `metronome probe --join` lines a client's arrivals up with it, and `metronome sim --replay`
//! plays it back. Only what the readers use is declared; unknown keys are ignored, so the server
//! may add figures without breaking older clients.

use serde::{Deserialize, Serialize};

/// One stream's timeline: its frames in upstream order, stamped at ingress and egress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamTimeline {
    /// The stream ID (the value of the `x-metronome-stream-id` response header).
    pub id: String,
    /// The route the stream was proxied under.
    #[serde(default)]
    pub route: Option<String>,
    /// The model label of the stream.
    #[serde(default)]
    pub model: Option<String>,
    /// How the stream ended (`complete`, `client_cancelled`, ...).
    #[serde(default)]
    pub outcome: Option<String>,
    /// The response's content type (`text/event-stream`, `application/x-ndjson`).
    #[serde(default)]
    pub content_type: Option<String>,
    /// One entry per frame read from the upstream, in order.
    pub frames: Vec<TimelineFrame>,
    /// Frames past the server's per-stream cap, counted but not listed.
    #[serde(default)]
    pub frames_dropped: u64,
    /// The stream's hitches at ingress with their scope (docs/batch.md); absent from servers
    /// without the batch detector and from streams that had none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hitches: Vec<TimelineHitch>,
    /// The intervals the client held the stream back (docs/timelines.md); absent from servers
    /// that do not mark them and from streams never held back.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backpressure: Vec<TimelineBackpressure>,
}

/// One backpressure episode of a stream as `/streams/{id}` marks it, in microseconds from the
/// stream's receipt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimelineBackpressure {
    /// When the reader first parked on a full queue.
    pub from_us: u64,
    /// When the queue was empty again (or the upstream side ended).
    pub to_us: u64,
    /// The time the upstream was not read at all.
    #[serde(default)]
    pub held_us: u64,
}

/// One hitch of a stream as `/streams/{id}` marks it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimelineHitch {
    /// The index (from 0) of the token event that ended the gap.
    pub event: u64,
    /// `batch` (it overlaps an episode of the upstream) or `stream`.
    pub scope: String,
    /// The episode it overlaps, when batch.
    #[serde(default)]
    pub episode: Option<u64>,
}

/// One frame as metronome saw it. Times are microseconds since metronome received the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimelineFrame {
    /// When the frame's bytes were read from the upstream.
    pub ingress_us: u64,
    /// When they reached the client's socket; `None` if they never did (the client went away).
    pub egress_us: Option<u64>,
    /// The frame's size; absent unless the server has `timeline.frame_sizes = true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// Events the frame completed.
    pub events: u32,
    /// Of those, the ones that carry output (token events).
    pub token_events: u32,
}

// === impl StreamTimeline ===

impl StreamTimeline {
    /// Token events in the kept frames.
    pub fn token_events(&self) -> u64 {
        self.frames.iter().map(|f| u64::from(f.token_events)).sum()
    }

    /// Whether the gap ending at token event `event` (from 0) was a batch-wide hitch.
    pub fn batch_hitch(&self, event: u64) -> bool {
        self.hitches
            .iter()
            .any(|h| h.event == event && h.scope == "batch")
    }

    /// Whether an ingress gap from `from_us` to `to_us` overlaps a backpressure mark: the client
    /// held the stream back, so the gap is not generation's.
    pub fn held_back(&self, from_us: u64, to_us: u64) -> bool {
        self.backpressure
            .iter()
            .any(|b| from_us < b.to_us && to_us > b.from_us)
    }

    /// The `(ingress_us, egress_us)` of every token event, in order: events of one frame share
    /// its stamps.
    pub fn token_stamps(&self) -> impl Iterator<Item = (u64, Option<u64>)> + '_ {
        self.frames
            .iter()
            .flat_map(|f| std::iter::repeat_n((f.ingress_us, f.egress_us), f.token_events as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_contract_example_parses() {
        let json = r#"{"id": "5f3a9c1e000000000042", "route": "chat", "model": "sim-model",
            "outcome": "complete", "started_unix_ms": 1764430000123,
            "content_type": "text/event-stream", "traceparent": null, "request_id": "abc-123",
            "frames": [
              {"ingress_us": 100980, "egress_us": 101010, "bytes": 231, "events": 1, "token_events": 0},
              {"ingress_us": 101234, "egress_us": 101301, "bytes": 229, "events": 1, "token_events": 1},
              {"ingress_us": 131234, "egress_us": null, "bytes": 458, "events": 2, "token_events": 2}
            ],
            "frames_dropped": 0,
            "hitches": [{"event": 2, "from_us": 101234, "to_us": 131234, "scope": "batch",
                         "upstream": "default", "episode": 3}]}"#;
        let timeline: StreamTimeline = serde_json::from_str(json).unwrap();
        assert_eq!(timeline.id, "5f3a9c1e000000000042");
        assert_eq!(timeline.frames.len(), 3);
        assert_eq!(timeline.token_events(), 3);
        assert!(timeline.batch_hitch(2) && !timeline.batch_hitch(1));
        let stamps: Vec<_> = timeline.token_stamps().collect();
        assert_eq!(
            stamps,
            [(101234, Some(101301)), (131234, None), (131234, None)]
        );
    }
}
