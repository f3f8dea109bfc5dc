//! One stream as the client saw it: when it was meant to start, when each token event arrived,
//! how many tokens it carried and how it ended.
//!
//! Arrivals are stamped per body frame (`Instant::now()` once, as the frame is read) and every event
//! the frame completes shares that stamp, so two token events in one frame have a gap of 0: the
//! clump the reader sees. Events are found by the same scanner and token accounting the proxy
//! uses, so the client figures line up with the proxy's ingress and egress figures.

use std::time::{Duration, Instant};

use crate::format::{Accounting, ThinkSettings, ThinkState};
use crate::scan::{Event, EventSink, Framing, Scanner, DEFAULT_MAX_EVENT_BYTES};
use crate::units::format_duration;

/// At most this many body reads are kept per stream (see [`StreamRecord::reads`]); later ones are
/// counted in [`StreamRecord::reads_dropped`]. Well above the proxy's default of 1024 frames per
/// timeline, so a join never runs short on the client's side first.
pub const MAX_READS: usize = 8192;

/// The phase of a token event: the proxy's own, so both sides name phases alike.
pub use crate::format::Phase;

/// One body read at the client: when it arrived and what it completed. The clumping figure of a
/// join compares these with the upstream's frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Read {
    /// When the read returned.
    pub at: Instant,
    /// Events the read completed (an event split across reads belongs to the one that ends it).
    pub events: u32,
    /// Of those, the ones that carry output.
    pub token_events: u32,
}

/// Everything recorded about one stream; the raw material of every figure in the report.
#[derive(Debug, Clone)]
pub struct StreamRecord {
    /// The stream's number in start order (0-based).
    pub index: u64,
    /// The intended start: the scheduled time in open loop, the moment of sending in closed loop.
    /// TTFT counts from here, so a start held back by the client still shows as latency.
    pub scheduled: Instant,
    /// When the request was handed to the client (`None` if it never was).
    pub sent: Option<Instant>,
    /// The response status, once headers arrived.
    pub status: Option<u16>,
    /// The proxy's stream ID header, when the response carried one (to join with its timeline).
    pub stream_id: Option<String>,
    /// When the first body frame arrived.
    pub first_byte: Option<Instant>,
    /// Body frames received.
    pub frames: u64,
    /// Every body read in order, up to [`MAX_READS`]: the arrival and the event counts a join
    /// lines up with the proxy's frames.
    pub reads: Vec<Read>,
    /// Reads past [`MAX_READS`], counted but not kept (memory stays bounded).
    pub reads_dropped: u64,
    /// The arrival of each token event, in order (events of one frame share their frame's time).
    pub token_times: Vec<Instant>,
    /// The phase of each token event, in order, where the stream says it (WebSocket messages
    /// name it); empty where it does not, so per-phase figures leave the stream out.
    pub token_phases: Vec<Phase>,
    /// Output tokens counted from the token events (exact per-event counts where the format
    /// gives them, otherwise one per token event).
    pub counted_tokens: u64,
    /// The output-token total the server reported (`usage`), if it reported one.
    pub usage_tokens: Option<u64>,
    /// Events the accounting could not parse (the stream still counts).
    pub unparsed_events: u64,
    /// When the stream ended, successfully or not.
    pub finished: Option<Instant>,
    /// Why the stream counts as an error, if it does.
    pub error: Option<StreamError>,
    /// The start of the body of a non-2xx response (one line, truncated), what the server said.
    pub error_body: Option<String>,
}

/// Why a stream counts in `errors`. Errors never abort the run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    /// No connection to the server could be made.
    #[error("could not connect: {0}")]
    Connect(String),
    /// No connection was made, and hyper-util gave no reason of this stream's own ("request was
    /// canceled"): it does so when another stream's attempt to the same server failed first.
    /// Counted as `connect`; a report prefers another stream's reason as its example.
    #[error("could not connect: {0}")]
    ConnectCanceled(String),
    /// The request failed before a response arrived (after connecting).
    #[error("the request failed: {0}")]
    Request(String),
    /// The server answered with a non-2xx status.
    #[error("the server answered with status {0}")]
    Status(u16),
    /// The response body broke off.
    #[error("the response body failed: {0}")]
    Body(String),
    /// The stream did not end within the per-request timeout.
    #[error("the stream did not end within {}", format_duration(*.0))]
    Timeout(Duration),
    /// The stream ended without a single token event.
    #[error("the stream ended without any token event")]
    NoToken,
    /// The server reported an error inside the stream.
    #[error("the server sent an error event in the stream")]
    ErrorEvent,
}

// === impl StreamError ===

impl StreamError {
    /// A short, stable name for counting errors by kind in reports.
    pub fn kind(&self) -> &'static str {
        match self {
            StreamError::Connect(_) | StreamError::ConnectCanceled(_) => "connect",
            StreamError::Request(_) => "request",
            StreamError::Status(_) => "status",
            StreamError::Body(_) => "body",
            StreamError::Timeout(_) => "timeout",
            StreamError::NoToken => "no_token",
            StreamError::ErrorEvent => "error_event",
        }
    }

    /// Whether the error says why the stream failed, so that a report can show it as its kind's
    /// example (a canceled connect does not).
    pub fn explains(&self) -> bool {
        !matches!(self, StreamError::ConnectCanceled(_))
    }
}

// === impl StreamRecord ===

impl StreamRecord {
    /// An empty record for stream `index`, meant to start at `scheduled`.
    pub fn new(index: u64, scheduled: Instant) -> Self {
        StreamRecord {
            index,
            scheduled,
            sent: None,
            status: None,
            stream_id: None,
            first_byte: None,
            frames: 0,
            reads: Vec::new(),
            reads_dropped: 0,
            token_times: Vec::new(),
            token_phases: Vec::new(),
            counted_tokens: 0,
            usage_tokens: None,
            unparsed_events: 0,
            finished: None,
            error: None,
            error_body: None,
        }
    }

    /// Time to first token, from the intended start.
    pub fn ttft(&self) -> Option<Duration> {
        self.token_times
            .first()
            .map(|t| t.saturating_duration_since(self.scheduled))
    }

    /// Output tokens: the server's usage total if it reported one, else the counted tokens.
    pub fn output_tokens(&self) -> u64 {
        self.usage_tokens.unwrap_or(self.counted_tokens)
    }

    /// Each token event's arrival with its phase, when the stream says the phases of all.
    pub fn phased_tokens(&self) -> Option<impl Iterator<Item = (Instant, Phase)> + '_> {
        let known =
            !self.token_phases.is_empty() && self.token_phases.len() == self.token_times.len();
        known.then(|| {
            self.token_times
                .iter()
                .copied()
                .zip(self.token_phases.iter().copied())
        })
    }

    /// The gaps between consecutive token events (0 within a frame).
    pub fn gaps(&self) -> impl Iterator<Item = Duration> + '_ {
        self.token_times
            .windows(2)
            .map(|w| w[1].saturating_duration_since(w[0]))
    }

    /// The stream's reading speed: (output tokens − 1) / (last token event − first token event).
    /// The first token's wait is TTFT, not reading speed, hence the − 1. `None` when it is
    /// undefined: fewer than two tokens, or every token event arrived at the same instant.
    pub fn tokens_per_second(&self) -> Option<f64> {
        let (first, last) = (self.token_times.first()?, self.token_times.last()?);
        let span = last.saturating_duration_since(*first).as_secs_f64();
        let tokens = self.output_tokens();
        if tokens < 2 || span <= 0.0 {
            return None;
        }
        Some((tokens - 1) as f64 / span)
    }
}

/// Finds the token events in a body, frame by frame, and writes them into a [`StreamRecord`].
#[derive(Debug)]
pub struct Recorder {
    /// The same incremental scanner as the proxy's ingress reader.
    scanner: Scanner,
    /// The same token accounting as the proxy's ledger.
    accounting: Accounting,
    /// The same reading of the no-parser `<think>` shape as the proxy's meter.
    think: ThinkState,
    /// Error events seen (an `error` chunk, or llama.cpp's legacy `error:` line).
    error_events: u64,
}

// === impl Recorder ===

impl Recorder {
    /// A recorder for a body of the given framing; the streaming API is detected from the first
    /// events exactly as the proxy detects it (OpenAI, TGI, Anthropic, Ollama, ...).
    pub fn new(framing: Framing) -> Self {
        Recorder::reading_think(framing, &ThinkSettings::default())
    }

    /// As [`Recorder::new`], content that carries the thinking inline read with `think` (the
    /// probe's `--think-tags` and `--think-starts-open`, as a route's keys).
    pub fn reading_think(framing: Framing, think: &ThinkSettings) -> Self {
        Recorder {
            scanner: Scanner::new(framing, DEFAULT_MAX_EVENT_BYTES),
            accounting: Accounting::select(None, framing, None),
            think: ThinkState::new(think),
            error_events: 0,
        }
    }

    /// Scans one body frame that arrived at `at`.
    pub fn frame(&mut self, frame: &[u8], at: Instant, record: &mut StreamRecord) {
        record.frames += 1;
        record.first_byte.get_or_insert(at);
        let mut sink = FrameSink {
            accounting: &mut self.accounting,
            think: &mut self.think,
            error_events: &mut self.error_events,
            record,
            at,
            events: 0,
            token_events: 0,
        };
        self.scanner.feed(frame, &mut sink);
        let (events, token_events) = (sink.events, sink.token_events);
        if record.reads.len() < MAX_READS {
            record.reads.push(Read {
                at,
                events,
                token_events,
            });
        } else {
            record.reads_dropped += 1;
        }
    }

    /// The body ended at `at`: flushes the scanner and decides whether the stream is an error.
    pub fn finish(&mut self, at: Instant, record: &mut StreamRecord) {
        let mut sink = FrameSink {
            accounting: &mut self.accounting,
            think: &mut self.think,
            error_events: &mut self.error_events,
            record,
            at,
            events: 0,
            token_events: 0,
        };
        self.scanner.finish(&mut sink);
        if self.error_events > 0 {
            record.error = Some(StreamError::ErrorEvent);
        } else if record.token_times.is_empty() {
            record.error = Some(StreamError::NoToken);
        }
    }
}

/// The scanner's sink for one frame: every event it completes arrived at `at`.
struct FrameSink<'r> {
    /// The stream's accountant (it carries usage state from event to event).
    accounting: &'r mut Accounting,
    /// The stream's `<think>` reading.
    think: &'r mut ThinkState,
    /// The recorder's error-event count, decided on at the end of the stream.
    error_events: &'r mut u64,
    /// Where token events and counts go.
    record: &'r mut StreamRecord,
    /// The frame's arrival, shared by every event it completes.
    at: Instant,
    /// Events this frame completed.
    events: u32,
    /// Token events this frame completed.
    token_events: u32,
}

// === impl FrameSink ===

impl EventSink for FrameSink<'_> {
    fn on_event(&mut self, event: Event<'_>) {
        let classified = self.accounting.classify(&event);
        self.events = self.events.saturating_add(1);
        if classified.token_event {
            self.token_events = self.token_events.saturating_add(1);
            self.record.token_times.push(self.at);
            self.record.token_phases.push(self.think.phase(&classified));
            self.record.counted_tokens += u64::from(classified.tokens.unwrap_or(1));
        }
        if let Some(total) = classified.usage_total {
            self.record.usage_tokens = Some(total);
        }
        if classified.error {
            *self.error_events += 1;
        }
        if classified.unparsed {
            self.record.unparsed_events += 1;
        }
    }

    fn on_unknown_field(&mut self, name: &[u8], _value: &[u8]) {
        if name == b"error" {
            *self.error_events += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(text: &str) -> String {
        format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n")
    }

    #[test]
    fn events_of_one_frame_share_its_arrival() {
        let t0 = Instant::now();
        let mut record = StreamRecord::new(0, t0);
        let mut recorder = Recorder::new(Framing::Sse);
        let role = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n";
        recorder.frame(role.as_bytes(), t0 + Duration::from_millis(5), &mut record);
        let two = format!("{}{}", chunk("a"), chunk("b"));
        recorder.frame(two.as_bytes(), t0 + Duration::from_millis(10), &mut record);
        // An event split across frames arrives with the frame that completes it.
        let third = chunk("c");
        let (head, tail) = third.split_at(12);
        recorder.frame(head.as_bytes(), t0 + Duration::from_millis(20), &mut record);
        recorder.frame(tail.as_bytes(), t0 + Duration::from_millis(40), &mut record);
        let usage =
            "data: {\"choices\":[],\"usage\":{\"completion_tokens\":7}}\n\ndata: [DONE]\n\n";
        recorder.frame(
            usage.as_bytes(),
            t0 + Duration::from_millis(41),
            &mut record,
        );
        recorder.finish(t0 + Duration::from_millis(41), &mut record);

        assert_eq!(record.error, None);
        assert_eq!(record.frames, 5);
        let counts: Vec<_> = record
            .reads
            .iter()
            .map(|r| (r.events, r.token_events))
            .collect();
        assert_eq!(counts, [(1, 0), (2, 2), (0, 0), (1, 1), (2, 0)]);
        assert_eq!(record.reads[3].at, t0 + Duration::from_millis(40));
        assert_eq!(record.ttft(), Some(Duration::from_millis(10)));
        let gaps: Vec<_> = record.gaps().collect();
        assert_eq!(gaps, [Duration::ZERO, Duration::from_millis(30)]);
        assert_eq!(record.counted_tokens, 3);
        assert_eq!(record.output_tokens(), 7);
        // (7 − 1) tokens over 30 ms.
        assert!((record.tokens_per_second().unwrap() - 200.0).abs() < 1e-9);
    }

    #[test]
    fn reads_are_bounded() {
        let t0 = Instant::now();
        let mut record = StreamRecord::new(0, t0);
        let mut recorder = Recorder::new(Framing::Sse);
        for _ in 0..MAX_READS + 5 {
            recorder.frame(b": keep-alive\n", t0, &mut record);
        }
        assert_eq!(record.frames, MAX_READS as u64 + 5);
        assert_eq!(record.reads.len(), MAX_READS);
        assert_eq!(record.reads_dropped, 5);
    }

    #[test]
    fn streams_without_tokens_or_with_errors_are_errors() {
        let t0 = Instant::now();
        let mut record = StreamRecord::new(0, t0);
        let mut recorder = Recorder::new(Framing::Sse);
        recorder.frame(b"data: [DONE]\n\n", t0, &mut record);
        recorder.finish(t0, &mut record);
        assert_eq!(record.error, Some(StreamError::NoToken));
        assert_eq!(record.tokens_per_second(), None);

        let mut record = StreamRecord::new(1, t0);
        let mut recorder = Recorder::new(Framing::Sse);
        recorder.frame(chunk("a").as_bytes(), t0, &mut record);
        recorder.frame(
            b"data: {\"error\":{\"message\":\"overloaded\"}}\n\n",
            t0,
            &mut record,
        );
        recorder.finish(t0, &mut record);
        assert_eq!(record.error, Some(StreamError::ErrorEvent));
        assert_eq!(
            record.error.as_ref().map(StreamError::kind),
            Some("error_event")
        );
    }
}
