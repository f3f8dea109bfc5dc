//! `metronome sim --replay TIMELINE.json`: plays a captured stream timeline (the JSON of
//! metronome's `/streams/{id}`) back with its exact cadence and framing, so a stutter seen in
//! production can be reproduced on a laptop and gated in CI.
//!
//! Each captured frame becomes one frame sent at its `ingress_us` offset from the request's
//! arrival, completing the same number of events, of which the same number carry tokens, padded
//! with an SSE comment to about the same size. The events are an OpenAI chat stream: non-token
//! events before the first token event are a role chunk (then empty deltas), non-token events
//! after the last are a finish chunk, a usage chunk and `[DONE]` (as many of these as there are,
//! `[DONE]` always last), and any in between are empty deltas. A frame that completed no event
//! in the capture (part of an event) is a comment line. The frames are built once, when the file
//! is loaded; every request gets the same bytes.

use std::future::Future as _;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::time::{Instant, Sleep};

use super::server::SimShared;
use super::stats::StreamGuard;
use super::timeline::Record;
use crate::timeline_json::StreamTimeline;

/// The largest timeline file read.
pub const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;

/// The most frames a replay may have.
pub const MAX_FRAMES: usize = 100_000;

/// The largest frame a replay pads to.
pub const MAX_FRAME_BYTES: u64 = 1024 * 1024;

/// A captured stream, ready to be sent: the frames with their offsets and bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Replay {
    /// The frames in order.
    frames: Vec<ReplayFrame>,
    /// The capture's stream ID, for logs.
    source_id: String,
    /// Frames the capture left out (past the server's per-stream cap): the replay ends early.
    frames_dropped: u64,
}

/// One frame to send.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayFrame {
    /// When to send it, from the request's arrival.
    pub at: Duration,
    /// What to send.
    pub bytes: Bytes,
    /// Events it completes.
    pub events: u32,
    /// Of those, token events.
    pub token_events: u32,
}

/// A timeline that cannot be replayed; the message says what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ReplayError(pub String);

/// What one event of the replay is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Role,
    Token,
    Empty,
    Finish,
    Usage,
    Done,
}

// === impl Replay ===

impl Replay {
    /// Reads and prepares the timeline at `path`; `model` names the model in the chunks when the
    /// capture does not.
    pub fn load(path: &Path, model: &str) -> Result<Self, ReplayError> {
        let fail = |what: String| ReplayError(format!("cannot replay {}: {what}", path.display()));
        let size = std::fs::metadata(path)
            .map_err(|e| fail(e.to_string()))?
            .len();
        if size > MAX_FILE_BYTES {
            return Err(fail(format!(
                "it is {size} bytes, more than the {MAX_FILE_BYTES} a timeline may have"
            )));
        }
        let text = std::fs::read(path).map_err(|e| fail(e.to_string()))?;
        let timeline: StreamTimeline = serde_json::from_slice(&text).map_err(|e| {
            fail(format!(
                "it is not the JSON of /streams/{{id}} (docs/timelines.md): {e}"
            ))
        })?;
        Replay::from_timeline(&timeline, model).map_err(|e| fail(e.0))
    }

    /// Prepares a parsed timeline.
    pub fn from_timeline(timeline: &StreamTimeline, model: &str) -> Result<Self, ReplayError> {
        if timeline.frames.is_empty() {
            return Err(ReplayError("the timeline has no frames".to_owned()));
        }
        if timeline.frames.len() > MAX_FRAMES {
            return Err(ReplayError(format!(
                "it has {} frames, more than the {MAX_FRAMES} a replay may have",
                timeline.frames.len()
            )));
        }
        for (n, f) in timeline.frames.iter().enumerate() {
            if f.token_events > f.events {
                return Err(ReplayError(format!(
                    "frame {n} has more token events ({}) than events ({})",
                    f.token_events, f.events
                )));
            }
            if f.bytes.is_some_and(|b| b > MAX_FRAME_BYTES) {
                return Err(ReplayError(format!(
                    "frame {n} has {} bytes, more than the {MAX_FRAME_BYTES} a replay frame may have",
                    f.bytes.unwrap_or(0)
                )));
            }
        }
        let model = match timeline.model.as_deref() {
            Some(m) if !m.is_empty() && m != "other" => m,
            _ => model,
        };
        let head = chunk_head(model);
        let total_tokens = timeline.token_events();
        let mut token = 0u64;
        let events: Vec<Vec<u8>> = kinds(timeline)
            .into_iter()
            .map(|kind| {
                let mut event = BytesMut::new();
                write_event(&mut event, &head, kind, &mut token, total_tokens);
                event.to_vec()
            })
            .collect();
        let mut framer = Framer {
            events: &events,
            next: 0,
            offset: 0,
        };
        let frames = timeline
            .frames
            .iter()
            .map(|f| ReplayFrame {
                at: Duration::from_micros(f.ingress_us),
                bytes: framer.frame(
                    f.events as usize,
                    usize::try_from(f.bytes.unwrap_or(0)).unwrap_or(0),
                ),
                events: f.events,
                token_events: f.token_events,
            })
            .collect();
        Ok(Replay {
            frames,
            source_id: timeline.id.clone(),
            frames_dropped: timeline.frames_dropped,
        })
    }

    /// The frames, in order.
    pub fn frames(&self) -> &[ReplayFrame] {
        &self.frames
    }

    /// The stream ID of the capture.
    pub fn source_id(&self) -> &str {
        &self.source_id
    }

    /// One line saying what is replayed, and whether the capture is incomplete.
    pub fn describe(&self) -> String {
        let tokens: u64 = self.frames.iter().map(|f| u64::from(f.token_events)).sum();
        let span = self.frames.last().map_or(Duration::ZERO, |f| f.at);
        let mut text = format!(
            "replaying stream {}: {} frames, {tokens} token events over {}",
            self.source_id,
            self.frames.len(),
            crate::units::format_duration(span)
        );
        if self.frames_dropped > 0 {
            text.push_str(&format!(
                " (the capture left out its last {} frames; raise timeline.max_frames to keep them)",
                self.frames_dropped
            ));
        }
        text
    }
}

/// The kind of every event, in order. Within a frame, non-token events come first until the
/// stream's first token event has been placed, and after the frame's token events from then on,
/// so role chunks lead and finish chunks trail as a server sends them.
fn kinds(timeline: &StreamTimeline) -> Vec<Kind> {
    let mut kinds = Vec::new();
    let mut seen_token = false;
    for f in &timeline.frames {
        let tokens = f.token_events as usize;
        let others = f.events.saturating_sub(f.token_events) as usize;
        let token_run = std::iter::repeat_n(Kind::Token, tokens);
        let other_run = std::iter::repeat_n(Kind::Empty, others);
        if seen_token {
            kinds.extend(token_run.chain(other_run));
        } else {
            kinds.extend(other_run.chain(token_run));
        }
        seen_token |= tokens > 0;
    }
    let first = kinds.iter().position(|k| *k == Kind::Token);
    let last = kinds.iter().rposition(|k| *k == Kind::Token);
    let trailing_start = match (first, last) {
        (Some(first), Some(last)) => {
            if first > 0 {
                kinds[0] = Kind::Role;
            }
            last + 1
        }
        // No token at all: a role chunk (if there is room for one), then the trailer.
        _ if kinds.len() >= 2 => {
            kinds[0] = Kind::Role;
            1
        }
        _ => 0,
    };
    let trailer = &mut kinds[trailing_start..];
    let n = trailer.len();
    if n >= 1 {
        trailer[n - 1] = Kind::Done;
    }
    if n >= 2 {
        trailer[0] = Kind::Finish;
    }
    if n >= 3 {
        trailer[1] = Kind::Usage;
    }
    kinds
}

/// `data: {"id":...,"model":...,` — the start of every chunk.
fn chunk_head(model: &str) -> String {
    let model = serde_json::to_string(model).unwrap_or_else(|_| "\"sim-model\"".to_owned());
    format!(
        "data: {{\"id\":\"chatcmpl-replay\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":{model},"
    )
}

fn write_event(out: &mut BytesMut, head: &str, kind: Kind, token: &mut u64, total: u64) {
    if kind == Kind::Done {
        out.put_slice(b"data: [DONE]\n\n");
        return;
    }
    out.put_slice(head.as_bytes());
    let choice = |delta: &str, finish: &str| {
        format!(
            "\"choices\":[{{\"index\":0,\"delta\":{delta},\"logprobs\":null,\"finish_reason\":{finish}}}]}}\n\n"
        )
    };
    let rest = match kind {
        Kind::Role => choice(r#"{"role":"assistant","content":""}"#, "null"),
        Kind::Token => {
            let text = format!(r#"{{"content":" tok{}"}}"#, *token);
            *token += 1;
            choice(&text, "null")
        }
        Kind::Empty => choice(r#"{"content":""}"#, "null"),
        Kind::Finish => choice("{}", "\"stop\""),
        Kind::Usage => format!(
            "\"choices\":[],\"usage\":{{\"prompt_tokens\":1,\"completion_tokens\":{total},\"total_tokens\":{}}}}}\n\n",
            total + 1
        ),
        Kind::Done => String::new(),
    };
    out.put_slice(rest.as_bytes());
}

/// Cuts the stream's events into frames: each frame completes its number of events and is
/// padded to about its size with a comment line (`: xxx`, which completes no event). A frame that
/// completed no event in the capture carries the head of the next event, whose tail then
/// completes it in a later frame, as an event split across reads does.
struct Framer<'e> {
    /// Every event of the stream, in order.
    events: &'e [Vec<u8>],
    /// The next event not yet completed.
    next: usize,
    /// Bytes of `events[next]` already sent (its head, in earlier frames).
    offset: usize,
}

// === impl Framer ===

impl Framer<'_> {
    /// The next frame: completes `events` events, about `target` bytes.
    fn frame(&mut self, events: usize, target: usize) -> Bytes {
        let mut out = BytesMut::with_capacity(target.max(64));
        if events == 0 {
            if let Some(event) = self.events.get(self.next) {
                // Keep at least the event's last byte back, so it does not complete here.
                let take = (event.len() - self.offset - 1).min(target);
                if self.offset == 0 {
                    pad(&mut out, target - take);
                }
                out.put_slice(&event[self.offset..self.offset + take]);
                self.offset += take;
            } else {
                pad(&mut out, target);
            }
            if out.is_empty() && self.offset == 0 {
                // A frame is never empty: at an event boundary, a bare comment line.
                out.put_slice(b":\n");
            }
            return out.freeze();
        }
        let mut done = 0;
        if self.offset > 0 {
            if let Some(event) = self.events.get(self.next) {
                out.put_slice(&event[self.offset..]);
            }
            self.next += 1;
            self.offset = 0;
            done = 1;
        }
        let whole = self.events.iter().skip(self.next).take(events - done);
        let size: usize = out.len() + whole.clone().map(Vec::len).sum::<usize>();
        // The pad goes at an event boundary: after the tail of a split event, before the rest.
        pad(&mut out, target.saturating_sub(size));
        for event in whole {
            out.put_slice(event);
            self.next += 1;
        }
        out.freeze()
    }
}

/// Appends a comment line of `missing` bytes (`: xxx\n`); nothing when fewer than 3 are missing.
fn pad(out: &mut BytesMut, missing: usize) {
    if missing < 3 {
        return;
    }
    out.put_slice(b": ");
    out.put_bytes(b'x', missing - 3);
    out.put_slice(b"\n");
}

/// The response body of one replayed stream: each frame at its offset from the request's arrival.
#[derive(Debug)]
pub(crate) struct ReplayBody {
    shared: Arc<SimShared>,
    replay: Arc<Replay>,
    /// Counts the stream active until dropped, then completed or cancelled.
    guard: StreamGuard,
    /// The request's arrival.
    start: Instant,
    /// Wall-clock microseconds at arrival, for the timeline file.
    received_unix_us: u64,
    /// The stream's sequence number.
    seq: u64,
    /// The next frame to send.
    next: usize,
    /// Token events sent so far.
    sent_tokens: u64,
    /// The one timer, reset to each frame's deadline.
    sleep: Pin<Box<Sleep>>,
}

// === impl ReplayBody ===

impl ReplayBody {
    /// A body that starts replaying from `start`.
    pub(crate) fn new(
        shared: Arc<SimShared>,
        replay: Arc<Replay>,
        guard: StreamGuard,
        start: Instant,
        received_unix_us: u64,
        seq: u64,
    ) -> Self {
        let first = replay.frames.first().map_or(start, |f| start + f.at);
        ReplayBody {
            shared,
            replay,
            guard,
            start,
            received_unix_us,
            seq,
            next: 0,
            sent_tokens: 0,
            sleep: Box::pin(tokio::time::sleep_until(first)),
        }
    }

    /// The next frame once it is due; `None` after the last.
    pub(crate) fn poll_next_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        // A frame the framer could not fill (several event-less frames in a row, larger than the
        // event they split) is skipped: an empty chunk would end an HTTP/1.1 body.
        while self
            .replay
            .frames
            .get(self.next)
            .is_some_and(|f| f.bytes.is_empty())
        {
            self.next += 1;
        }
        let Some(frame) = self.replay.frames.get(self.next) else {
            self.guard.complete();
            return Poll::Ready(None);
        };
        let deadline = self.start + frame.at;
        if self.sleep.deadline() != deadline {
            self.sleep.as_mut().reset(deadline);
        }
        if self.sleep.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        let (bytes, tokens) = (frame.bytes.clone(), frame.token_events);
        self.record_frame(tokens);
        self.next += 1;
        self.sent_tokens += u64::from(tokens);
        if self.is_end_stream() {
            self.guard.complete();
        }
        Poll::Ready(Some(bytes))
    }

    /// Whether every frame was sent.
    pub(crate) fn is_end_stream(&self) -> bool {
        self.next >= self.replay.frames.len()
    }

    fn record_frame(&self, tokens: u32) {
        // A replay writes every token event as answer text.
        let phases = super::stream::PhaseEvents {
            content: tokens,
            ..Default::default()
        };
        if tokens > 0 {
            self.shared.stats.served(phases);
        }
        let Some(timeline) = &self.shared.timeline else {
            return;
        };
        let t_us = super::stream::micros(Instant::now().saturating_duration_since(self.start));
        timeline.record(Record::Frame {
            stream: self.seq,
            event: self.sent_tokens,
            events: tokens,
            phases,
            tokens,
            t_us,
            unix_us: self.received_unix_us + t_us,
            held_us: 0,
            stalled_us: 0,
            paused_us: 0,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::stream::{Recorder, StreamRecord};
    use crate::scan::Framing;
    use crate::timeline_json::TimelineFrame;

    fn frame(ingress_us: u64, bytes: u64, events: u32, token_events: u32) -> TimelineFrame {
        TimelineFrame {
            ingress_us,
            egress_us: Some(ingress_us + 10),
            bytes: Some(bytes),
            events,
            token_events,
        }
    }

    fn timeline(frames: Vec<TimelineFrame>) -> StreamTimeline {
        StreamTimeline {
            hitches: Vec::new(),
            backpressure: Vec::new(),
            id: "abc".into(),
            route: Some("chat".into()),
            model: Some("llama".into()),
            outcome: Some("complete".into()),
            content_type: Some("text/event-stream".into()),
            frames,
            frames_dropped: 0,
        }
    }

    /// Scans the replay's frames with the probe's recorder: events and token events per frame.
    fn scanned(replay: &Replay) -> (Vec<(u32, u32)>, StreamRecord) {
        let t0 = std::time::Instant::now();
        let mut record = StreamRecord::new(0, t0);
        let mut recorder = Recorder::new(Framing::Sse);
        for f in replay.frames() {
            recorder.frame(&f.bytes, t0, &mut record);
        }
        recorder.finish(t0, &mut record);
        let counts = record
            .reads
            .iter()
            .map(|r| (r.events, r.token_events))
            .collect();
        (counts, record)
    }

    #[test]
    fn a_vllm_capture_replays_event_for_event() {
        let tl = timeline(vec![
            frame(100_000, 240, 1, 0),
            frame(130_000, 230, 1, 1),
            frame(160_000, 460, 2, 2),
            frame(190_000, 230, 1, 1),
            frame(190_500, 9, 0, 0),
            frame(220_000, 700, 3, 1),
            frame(221_000, 250, 1, 0),
            frame(221_500, 14, 1, 0),
        ]);
        let replay = Replay::from_timeline(&tl, "sim-model").unwrap();
        let (counts, record) = scanned(&replay);
        let want: Vec<(u32, u32)> = tl
            .frames
            .iter()
            .map(|f| (f.events, f.token_events))
            .collect();
        assert_eq!(counts, want);
        assert_eq!(record.error, None);
        // Five token events, and the usage chunk says so.
        assert_eq!(record.counted_tokens, 5);
        assert_eq!(record.usage_tokens, Some(5));
        for (f, r) in tl.frames.iter().zip(replay.frames()) {
            assert_eq!(r.at, Duration::from_micros(f.ingress_us));
            let len = r.bytes.len() as u64;
            assert!(
                len.abs_diff(f.bytes.unwrap_or(0)) <= 2,
                "{len} bytes, captured {}",
                f.bytes.unwrap_or(0)
            );
        }
        let text: String = replay
            .frames()
            .iter()
            .map(|f| String::from_utf8_lossy(&f.bytes).into_owned())
            .collect();
        assert!(text.contains(r#""delta":{"role":"assistant","content":""}"#));
        assert!(text.contains(r#""model":"llama""#));
        assert!(text.ends_with("data: [DONE]\n\n"));
        let finish = text.find(r#""finish_reason":"stop""#).unwrap();
        assert!(finish > text.find(" tok4").unwrap());
        assert!(text.find(r#""usage""#).unwrap() > finish);
    }

    #[test]
    fn an_event_split_across_frames_stays_split() {
        // Captured: the head of a token event in one frame, its tail 10 ms later.
        let tl = timeline(vec![
            frame(0, 231, 1, 0),
            frame(10_000, 120, 0, 0),
            frame(20_000, 109, 1, 1),
            frame(30_000, 14, 1, 0),
        ]);
        let replay = Replay::from_timeline(&tl, "m").unwrap();
        let sizes: Vec<usize> = replay.frames().iter().map(|f| f.bytes.len()).collect();
        assert_eq!(sizes, [231, 120, 109, 14]);
        let head = &replay.frames()[1].bytes;
        assert!(head.starts_with(b"data: {"), "{head:?}");
        assert!(!head.windows(2).any(|w| w == b"\n\n"));
        let (counts, record) = scanned(&replay);
        assert_eq!(counts, [(1, 0), (0, 0), (1, 1), (1, 0)]);
        assert_eq!(record.counted_tokens, 1);
    }

    #[test]
    fn event_kinds_lead_and_trail_like_a_server() {
        use Kind::*;
        let kinds_of = |frames| kinds(&timeline(frames));
        assert_eq!(
            kinds_of(vec![frame(0, 0, 2, 1), frame(1, 0, 3, 1)]),
            [Role, Token, Token, Finish, Done]
        );
        assert_eq!(
            kinds_of(vec![
                frame(0, 0, 1, 1),
                frame(1, 0, 1, 0),
                frame(2, 0, 1, 1)
            ]),
            [Token, Empty, Token]
        );
        assert_eq!(
            kinds_of(vec![frame(0, 0, 1, 1), frame(1, 0, 4, 0)]),
            [Token, Finish, Usage, Empty, Done]
        );
        assert_eq!(kinds_of(vec![frame(0, 0, 1, 0)]), [Done]);
        assert_eq!(kinds_of(vec![frame(0, 0, 3, 0)]), [Role, Finish, Done]);
    }

    #[test]
    fn bad_timelines_say_why() {
        let e = Replay::from_timeline(&timeline(vec![]), "m").unwrap_err();
        assert_eq!(e.0, "the timeline has no frames");
        let e = Replay::from_timeline(&timeline(vec![frame(0, 10, 1, 2)]), "m").unwrap_err();
        assert!(e.0.contains("more token events (2) than events (1)"), "{e}");
        let e = Replay::from_timeline(&timeline(vec![frame(0, MAX_FRAME_BYTES + 1, 1, 1)]), "m")
            .unwrap_err();
        assert!(e.0.contains("bytes"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.json");
        std::fs::write(&path, "{\"frames\": 3}").unwrap();
        let e = Replay::load(&path, "m").unwrap_err();
        assert!(e.0.contains("not the JSON of /streams/{id}"), "{e}");
        let e = Replay::load(&dir.path().join("missing.json"), "m").unwrap_err();
        assert!(e.0.starts_with("cannot replay"), "{e}");
    }
}
