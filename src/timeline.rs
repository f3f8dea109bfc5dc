//! Stream timelines: the frames of recent streams with their ingress and egress stamps, kept in a
//! bounded ring for `/streams`, `metronome probe --join` and `metronome sim --replay`.
//!
//! Memory stays flat however many streams pass: at most `max_streams` finished streams are kept,
//! each with at most `max_frames` frames; the set of stream IDs that may still send a browser
//! beacon is bounded the same way. docs/timelines.md is the wire contract.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

/// Times since a stream began, in microseconds, saturating (a u32 covers 71 minutes).
pub fn micros_since(start: Instant, at: Instant) -> u32 {
    u32::try_from(at.saturating_duration_since(start).as_micros()).unwrap_or(u32::MAX)
}

/// One frame as the ingress reader saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IngressFrame {
    /// When it was read, µs since the stream began.
    pub ingress_us: u32,
    /// Its length.
    pub bytes: u32,
    /// Events it completed.
    pub events: u16,
    /// Of those, token events.
    pub token_events: u16,
}

/// One frame of a finished stream, as `/streams/{id}` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FrameRecord {
    /// Read from the upstream, µs since the stream began.
    pub ingress_us: u32,
    /// Written to the client socket, µs since the stream began; `None` if it never was.
    pub egress_us: Option<u32>,
    /// Its length.
    pub bytes: u32,
    /// Events it completed.
    pub events: u16,
    /// Of those, token events.
    pub token_events: u16,
}

/// A figure at the ingress and egress points.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct AtPoints<T> {
    /// At ingress.
    pub ingress: T,
    /// At egress.
    pub egress: T,
}

/// What the ring keeps of a finished stream.
#[derive(Debug, Clone)]
pub struct FinishedStream {
    /// The stream ID of the response header.
    pub id: Arc<str>,
    /// Route label.
    pub route: Arc<str>,
    /// Model label.
    pub model: Arc<str>,
    /// Outcome label.
    pub outcome: &'static str,
    /// Wall-clock start, ms since the Unix epoch (for people; stamps are monotonic).
    pub started_unix_ms: u64,
    /// From receipt to the end of the stream.
    pub duration_us: u64,
    /// Frames read from the upstream.
    pub frames_total: u64,
    /// Frames not kept (beyond `max_frames`).
    pub frames_dropped: u64,
    /// Token events at ingress.
    pub token_events: u64,
    /// Output tokens (usage when reported).
    pub output_tokens: u64,
    /// Time to first token at each point.
    pub ttft_us: AtPoints<Option<u64>>,
    /// The stream's median gap at each point (from its sketch, within 2%).
    pub itl_p50_us: AtPoints<Option<u64>>,
    /// The stream's p99 gap at each point.
    pub itl_p99_us: AtPoints<Option<u64>>,
    /// Stalls at each point.
    pub stalls: AtPoints<u64>,
    /// The response content type.
    pub content_type: String,
    /// The request's `traceparent`, if any.
    pub traceparent: Option<String>,
    /// The request's `x-request-id`, if any.
    pub request_id: Option<String>,
    /// The kept frames.
    pub frames: Vec<FrameRecord>,
}

/// The summary line of `/streams`.
#[derive(Debug, Serialize)]
struct Summary<'a> {
    id: &'a str,
    route: &'a str,
    model: &'a str,
    outcome: &'a str,
    started_unix_ms: u64,
    duration_us: u64,
    frames: u64,
    frames_dropped: u64,
    token_events: u64,
    output_tokens: u64,
    ttft_us: AtPoints<Option<u64>>,
    itl_p50_us: AtPoints<Option<u64>>,
    itl_p99_us: AtPoints<Option<u64>>,
    stalls: AtPoints<u64>,
}

/// The body of `/streams/{id}`.
#[derive(Debug, Serialize)]
struct Detail<'a> {
    id: &'a str,
    route: &'a str,
    model: &'a str,
    outcome: &'a str,
    started_unix_ms: u64,
    duration_us: u64,
    content_type: &'a str,
    traceparent: Option<&'a str>,
    request_id: Option<&'a str>,
    frames: &'a [FrameRecord],
    frames_dropped: u64,
}

/// Who may still send a beacon for a stream.
#[derive(Debug, Clone)]
pub struct BeaconSlot {
    /// Route label of the stream.
    pub route: Arc<str>,
    /// Model label, once the stream has been recorded.
    pub model: Option<Arc<str>>,
    /// A beacon was accepted already.
    pub used: bool,
}

/// Why a beacon was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BeaconClaim {
    /// The stream is unknown or has left the window.
    Unknown,
    /// A beacon for this stream was accepted before.
    Duplicate,
}

#[derive(Debug, Default)]
struct Inner {
    finished: VecDeque<Arc<FinishedStream>>,
    slots: HashMap<Arc<str>, BeaconSlot>,
    slot_order: VecDeque<Arc<str>>,
}

/// The bounded registry of recent streams.
#[derive(Debug)]
pub struct StreamRegistry {
    /// Finished streams kept for `/streams`.
    max_streams: usize,
    /// Frames kept per stream.
    max_frames: usize,
    /// Streams that may still send a beacon.
    beacon_window: usize,
    inner: Mutex<Inner>,
}

// === impl StreamRegistry ===

impl StreamRegistry {
    /// A registry keeping `max_streams` streams of `max_frames` frames each.
    pub fn new(max_streams: usize, max_frames: usize) -> Self {
        StreamRegistry {
            max_streams,
            max_frames,
            beacon_window: max_streams.max(4096),
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Frames a stream may keep.
    pub fn max_frames(&self) -> usize {
        self.max_frames
    }

    /// A stream started: it may send one beacon while it stays in the window.
    pub fn started(&self, id: &Arc<str>, route: &Arc<str>) {
        let mut inner = self.lock();
        if inner.slot_order.len() >= self.beacon_window {
            if let Some(old) = inner.slot_order.pop_front() {
                inner.slots.remove(&old);
            }
        }
        inner.slots.insert(
            id.clone(),
            BeaconSlot {
                route: route.clone(),
                model: None,
                used: false,
            },
        );
        inner.slot_order.push_back(id.clone());
    }

    /// A stream finished: keep it for `/streams`, and give its beacon slot the model label.
    pub fn finished(&self, stream: FinishedStream) {
        let mut inner = self.lock();
        if let Some(slot) = inner.slots.get_mut(&stream.id) {
            slot.model = Some(stream.model.clone());
        }
        if self.max_streams == 0 {
            return;
        }
        if inner.finished.len() >= self.max_streams {
            inner.finished.pop_front();
        }
        inner.finished.push_back(Arc::new(stream));
    }

    /// Claims the one beacon a stream may send.
    pub fn claim_beacon(&self, id: &str) -> Result<BeaconSlot, BeaconClaim> {
        let mut inner = self.lock();
        let slot = inner.slots.get_mut(id).ok_or(BeaconClaim::Unknown)?;
        if slot.used {
            return Err(BeaconClaim::Duplicate);
        }
        slot.used = true;
        Ok(slot.clone())
    }

    /// `/streams`: summaries, newest first.
    pub fn list_json(&self) -> String {
        let finished: Vec<Arc<FinishedStream>> =
            self.lock().finished.iter().rev().cloned().collect();
        let summaries: Vec<Summary<'_>> = finished
            .iter()
            .map(|s| Summary {
                id: &s.id,
                route: &s.route,
                model: &s.model,
                outcome: s.outcome,
                started_unix_ms: s.started_unix_ms,
                duration_us: s.duration_us,
                frames: s.frames_total,
                frames_dropped: s.frames_dropped,
                token_events: s.token_events,
                output_tokens: s.output_tokens,
                ttft_us: s.ttft_us,
                itl_p50_us: s.itl_p50_us,
                itl_p99_us: s.itl_p99_us,
                stalls: s.stalls,
            })
            .collect();
        serde_json::json!({ "streams": summaries }).to_string()
    }

    /// `/streams/{id}`: the stream's frames, or `None` when it is not (or no longer) kept.
    pub fn detail_json(&self, id: &str) -> Option<String> {
        let stream = self
            .lock()
            .finished
            .iter()
            .find(|s| &*s.id == id)
            .cloned()?;
        let detail = Detail {
            id: &stream.id,
            route: &stream.route,
            model: &stream.model,
            outcome: stream.outcome,
            started_unix_ms: stream.started_unix_ms,
            duration_us: stream.duration_us,
            content_type: &stream.content_type,
            traceparent: stream.traceparent.as_deref(),
            request_id: stream.request_id.as_deref(),
            frames: &stream.frames,
            frames_dropped: stream.frames_dropped,
        };
        serde_json::to_string(&detail).ok()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A duration in whole microseconds.
pub fn as_micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finished(id: &str) -> FinishedStream {
        FinishedStream {
            id: Arc::from(id),
            route: Arc::from("chat"),
            model: Arc::from("m"),
            outcome: "complete",
            started_unix_ms: 1,
            duration_us: 2,
            frames_total: 1,
            frames_dropped: 0,
            token_events: 1,
            output_tokens: 1,
            ttft_us: AtPoints::default(),
            itl_p50_us: AtPoints::default(),
            itl_p99_us: AtPoints::default(),
            stalls: AtPoints::default(),
            content_type: "text/event-stream".into(),
            traceparent: None,
            request_id: None,
            frames: vec![FrameRecord {
                ingress_us: 5,
                egress_us: None,
                bytes: 10,
                events: 1,
                token_events: 1,
            }],
        }
    }

    #[test]
    fn the_ring_keeps_the_newest_streams_only() {
        let registry = StreamRegistry::new(2, 16);
        for id in ["a", "b", "c"] {
            registry.finished(finished(id));
        }
        let list: serde_json::Value = serde_json::from_str(&registry.list_json()).unwrap();
        let ids: Vec<&str> = list["streams"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, vec!["c", "b"]);
        assert!(registry.detail_json("a").is_none());
        let detail: serde_json::Value =
            serde_json::from_str(&registry.detail_json("c").unwrap()).unwrap();
        assert_eq!(detail["frames"][0]["egress_us"], serde_json::Value::Null);
        assert_eq!(detail["frames"][0]["ingress_us"], 5);
    }

    #[test]
    fn a_beacon_is_claimed_once_and_only_for_a_known_stream() {
        let registry = StreamRegistry::new(2, 16);
        let id: Arc<str> = Arc::from("s1");
        registry.started(&id, &Arc::from("chat"));
        assert_eq!(
            registry.claim_beacon("nope").unwrap_err(),
            BeaconClaim::Unknown
        );
        assert!(registry.claim_beacon("s1").is_ok());
        assert_eq!(
            registry.claim_beacon("s1").unwrap_err(),
            BeaconClaim::Duplicate
        );
    }

    #[test]
    fn the_beacon_window_is_bounded() {
        let registry = StreamRegistry::new(1, 1);
        let route: Arc<str> = Arc::from("chat");
        for i in 0..5000 {
            registry.started(&Arc::from(format!("s{i}")), &route);
        }
        assert_eq!(registry.lock().slots.len(), 4096);
        assert_eq!(
            registry.claim_beacon("s0").unwrap_err(),
            BeaconClaim::Unknown
        );
        assert!(registry.claim_beacon("s4999").is_ok());
    }
}
