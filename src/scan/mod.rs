//! Incremental scanners for streamed response bodies.
//!
//! A scanner is fed the body's frames exactly as they arrive and reports every complete event to an
//! [`EventSink`]. It only reads the frames: the bytes that go to the client are the very `Bytes` the
//! upstream produced, so nothing here can alter, delay or re-chunk a stream. Frames may split
//! anywhere (inside a line ending, a UTF-8 character, a field name); the scanner carries at most a
//! bounded partial event between frames, so its memory does not depend on the stream's length.

mod ndjson;
mod sse;

pub use ndjson::NdjsonScanner;
pub use sse::SseScanner;

/// Default bound on the partial event a scanner carries between frames (64 KiB).
pub const DEFAULT_MAX_EVENT_BYTES: usize = 64 * 1024;

/// A carried buffer that grew beyond this for one long event is given back once that event is
/// done: a stream holds up to `max_event_bytes` only while a long event lasts, not for the rest of
/// its life. Events of usual size never reach it, so the common case allocates nothing.
const KEEP_CAPACITY: usize = 4096;

/// Frees `buf` (empty, between events) when a long event left it larger than [`KEEP_CAPACITY`].
#[inline]
fn release_if_large(buf: &mut Vec<u8>) {
    if buf.capacity() > KEEP_CAPACITY {
        *buf = Vec::new();
    }
}

/// One complete event: an SSE event (dispatched by a blank line) or one NDJSON line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event<'a> {
    /// The SSE `event:` field; empty when the event did not set one (the "message" default), and
    /// always empty for NDJSON.
    pub kind: &'a [u8],
    /// The event's data: SSE `data:` lines joined by `\n`, or the NDJSON line without its line end.
    pub data: &'a [u8],
    /// True when the event was longer than the scanner's bound: `data` holds only its beginning,
    /// so the event is counted but must not be inspected.
    pub truncated: bool,
}

/// Receives what a scanner finds. Called synchronously from [`Scanner::feed`].
pub trait EventSink {
    /// A complete event.
    fn on_event(&mut self, event: Event<'_>);

    /// An SSE line whose field name is none of `data`, `event`, `id`, `retry`. The WHATWG rules
    /// ignore it, but some servers (llama.cpp's legacy `error:` line) put meaning there.
    fn on_unknown_field(&mut self, _name: &[u8], _value: &[u8]) {}
}

/// How a stream's body is split into events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Framing {
    /// `text/event-stream`, by the WHATWG event-stream rules.
    Sse,
    /// `application/x-ndjson` (and JSON lines): one event per line.
    Ndjson,
    /// Bytes that cannot be read as events (a compressed body): frames are timed, never scanned.
    Opaque,
}

/// A scanner for either framing, chosen once per stream.
#[derive(Debug)]
pub enum Scanner {
    /// Server-sent events.
    Sse(SseScanner),
    /// Newline-delimited JSON.
    Ndjson(NdjsonScanner),
    /// Finds no events.
    Opaque,
}

// === impl Scanner ===

impl Scanner {
    /// A scanner for `framing` that carries at most `max_event_bytes` of a partial event.
    pub fn new(framing: Framing, max_event_bytes: usize) -> Self {
        match framing {
            Framing::Sse => Scanner::Sse(SseScanner::new(max_event_bytes)),
            Framing::Ndjson => Scanner::Ndjson(NdjsonScanner::new(max_event_bytes)),
            Framing::Opaque => Scanner::Opaque,
        }
    }

    /// Scans one frame, reporting each event that it completes.
    #[inline]
    pub fn feed(&mut self, frame: &[u8], sink: &mut impl EventSink) {
        match self {
            Scanner::Sse(s) => s.feed(frame, sink),
            Scanner::Ndjson(s) => s.feed(frame, sink),
            Scanner::Opaque => {}
        }
    }

    /// The body has ended: an NDJSON line without a final newline is still an event; an SSE event
    /// without its blank line is discarded, as the WHATWG rules say.
    pub fn finish(&mut self, sink: &mut impl EventSink) {
        match self {
            Scanner::Sse(s) => s.finish(sink),
            Scanner::Ndjson(s) => s.finish(sink),
            Scanner::Opaque => {}
        }
    }
}

/// A sink that keeps owned copies of every event: for tests, fuzzing and one-shot parses, never
/// for the proxy's hot path.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CollectedEvents {
    /// `(kind, data, truncated)` of each event in order.
    pub events: Vec<(Vec<u8>, Vec<u8>, bool)>,
    /// `(name, value)` of each unknown SSE field.
    pub unknown_fields: Vec<(Vec<u8>, Vec<u8>)>,
}

impl EventSink for CollectedEvents {
    fn on_event(&mut self, event: Event<'_>) {
        self.events
            .push((event.kind.to_vec(), event.data.to_vec(), event.truncated));
    }

    fn on_unknown_field(&mut self, name: &[u8], value: &[u8]) {
        self.unknown_fields.push((name.to_vec(), value.to_vec()));
    }
}

/// Scans a whole body in one call and returns its events: the reference the incremental scan is
/// checked against.
pub fn scan_all(framing: Framing, body: &[u8], max_event_bytes: usize) -> CollectedEvents {
    let mut sink = CollectedEvents::default();
    let mut scanner = Scanner::new(framing, max_event_bytes);
    scanner.feed(body, &mut sink);
    scanner.finish(&mut sink);
    sink
}

#[cfg(test)]
mod proptests;
