//! The per-frame work of metering at ingress: scan the frame for events, classify each one, and
//! update the stream's ingress ledger. The frame's bytes are only read.
//!
//! Kept apart from the reader task so that the benchmark measures exactly what the proxy runs.

use crate::format::{Accounting, Phase, ThinkState};
use crate::metering::clock::Tick;
use crate::metering::ledger::{FrameCounts, IngressLedger};
use crate::metrics::Metrics;
use crate::scan::{Event, EventSink, Scanner};
use crate::timeline::IngressFrame;

/// Scanner, accountant and ingress ledger of one stream.
#[derive(Debug)]
pub struct IngressMeter {
    scanner: Scanner,
    accounting: Accounting,
    /// The no-parser `<think>` reading of the stream's content.
    think: ThinkState,
    ledger: IngressLedger,
    /// When the stream began, for timeline stamps.
    received: Tick,
    /// Frames kept in the timeline.
    max_frames: usize,
}

// === impl IngressMeter ===

impl IngressMeter {
    /// A meter for a new stream that began at `received` and keeps `max_frames` frames in its
    /// timeline; `think` reads its content for the no-parser `<think>` shape.
    pub fn new(
        scanner: Scanner,
        accounting: Accounting,
        think: ThinkState,
        received: Tick,
        max_frames: usize,
    ) -> Self {
        IngressMeter {
            scanner,
            accounting,
            think,
            ledger: IngressLedger::default(),
            received,
            max_frames,
        }
    }

    /// Meters one frame read at `at`.
    #[inline]
    pub fn frame(&mut self, bytes: &[u8], at: Tick, metrics: &Metrics) -> FrameCounts {
        let mut sink = IngressSink {
            accounting: &mut self.accounting,
            think: &mut self.think,
            ledger: &mut self.ledger,
            metrics,
            counts: FrameCounts::default(),
        };
        self.scanner.feed(bytes, &mut sink);
        let counts = sink.counts;
        self.close_frame(bytes.len(), at, counts, metrics)
    }

    /// Classifies one whole event that arrived without a scanner (a WebSocket message) and adds
    /// it to `counts`, the counts of the frame (read) it came in; [`Self::close_frame`] then
    /// records that frame. Returns what the event meant for the stream's end.
    pub fn event(
        &mut self,
        event: &Event<'_>,
        metrics: &Metrics,
        counts: &mut FrameCounts,
    ) -> EventMeaning {
        let mut sink = IngressSink {
            accounting: &mut self.accounting,
            think: &mut self.think,
            ledger: &mut self.ledger,
            metrics,
            counts: *counts,
        };
        let meaning = sink.account(event);
        *counts = sink.counts;
        meaning
    }

    /// Records a frame of `bytes` bytes read at `at` whose events are `counts`: its timeline entry
    /// and its per-frame figures, as [`Self::frame`] does after its scan.
    #[inline(always)]
    pub fn close_frame(
        &mut self,
        bytes: usize,
        at: Tick,
        mut counts: FrameCounts,
        metrics: &Metrics,
    ) -> FrameCounts {
        let ledger = &mut self.ledger;
        if ledger.timeline.len() < self.max_frames {
            counts.seq = Some(ledger.timeline.len() as u32);
            ledger.timeline.push(IngressFrame {
                ingress_us: at.micros_since(self.received),
                bytes: u32::try_from(bytes).unwrap_or(u32::MAX),
                events: u16::try_from(counts.events).unwrap_or(u16::MAX),
                token_events: u16::try_from(counts.token_events).unwrap_or(u16::MAX),
                mix: counts.mix,
            });
        }
        ledger.frames_total += 1;
        let point = &mut ledger.point;
        point.bytes(at);
        point.events_in_frame(counts.events, metrics);
        point.token_events(at, counts.token_events, counts.mix, metrics);
        counts
    }

    /// The ledger so far, lent to the live flush (`metrics.flush_interval`).
    pub fn ledger_mut(&mut self) -> &mut IngressLedger {
        &mut self.ledger
    }

    /// The body ended: events that complete only at the end (an NDJSON line without its newline)
    /// are counted, and the ledger is handed over.
    pub fn finish(mut self, at: Tick, metrics: &Metrics) -> IngressLedger {
        let mut sink = IngressSink {
            accounting: &mut self.accounting,
            think: &mut self.think,
            ledger: &mut self.ledger,
            metrics,
            counts: FrameCounts::default(),
        };
        self.scanner.finish(&mut sink);
        let counts = sink.counts;
        if counts.events > 0 {
            self.ledger.point.events_in_frame(counts.events, metrics);
            self.ledger
                .point
                .token_events(at, counts.token_events, counts.mix, metrics);
            self.ledger.completed_at_end = counts;
        }
        self.ledger.format = Some(self.accounting.format());
        self.ledger
    }

    /// Asks for the cache lines the next frame's metering will touch: the meter itself, the
    /// accountant's kept state, the gap sketch's buckets and the timeline's tail (see
    /// [`crate::prefetch`]).
    #[inline]
    pub fn prefetch(&self) {
        crate::prefetch::value(self);
        self.accounting.prefetch();
        self.ledger.point.prefetch();
        self.ledger.timeline.prefetch();
    }

    /// The ledger so far.
    pub fn ledger(&self) -> &IngressLedger {
        &self.ledger
    }
}

/// Classifies each event into the ingress ledger as the scanner finds it.
struct IngressSink<'a> {
    accounting: &'a mut Accounting,
    think: &'a mut ThinkState,
    ledger: &'a mut IngressLedger,
    metrics: &'a Metrics,
    counts: FrameCounts,
}

/// What one event meant for its stream's end, for a caller that ends streams itself (the
/// WebSocket tunnel, where one connection carries many).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventMeaning {
    /// The format's end marker.
    pub end: bool,
    /// An error from the server.
    pub error: bool,
}

impl IngressSink<'_> {
    /// Counts and classifies one event into the ledger.
    #[inline(always)]
    fn account(&mut self, event: &Event<'_>) -> EventMeaning {
        self.counts.events += 1;
        if event.truncated {
            self.ledger.oversize_events += 1;
            return EventMeaning::default();
        }
        let classified = self.accounting.classify(event);
        if classified.unparsed {
            self.ledger.unparsed_events += 1;
            return EventMeaning::default();
        }
        self.ledger.error_event |= classified.error;
        if let Some(total) = classified.usage_total {
            let kept = self.ledger.usage_tokens;
            self.ledger.usage_tokens = self.ledger.usage_refusals.accept(kept, total);
        }
        if let Some(prompt) = classified.usage_prompt {
            let kept = self.ledger.prompt_tokens;
            self.ledger.prompt_tokens = self.ledger.usage_refusals.accept(kept, prompt);
        }
        if let Some(reasoning) = classified.usage_reasoning {
            let kept = self.ledger.reasoning_tokens;
            self.ledger.reasoning_tokens = self.ledger.usage_refusals.accept(kept, reasoning);
        }
        if classified.finish.is_some() {
            self.ledger.finish = classified.finish;
        }
        if self.ledger.model.is_none() {
            if let Some(model) = classified.model {
                self.ledger.model = Some(self.metrics.models.resolve(Some(model)));
            }
        }
        if classified.token_event {
            let phase = self.think.phase(&classified);
            if phase != Phase::Content {
                self.counts.mix.add(phase, self.counts.token_events == 0);
            }
            self.counts.token_events += 1;
            let tokens = classified.tokens.unwrap_or(1);
            self.ledger.counted_tokens += u64::from(tokens);
            self.ledger
                .tokens_per_event
                .observe(self.metrics.tokens_per_event.bounds(), tokens);
        } else if let Some(unseen) = classified.tokens {
            // Tokens that show the reader nothing (a special token) count toward the total only.
            self.ledger.counted_tokens += u64::from(unseen);
        }
        EventMeaning {
            end: classified.end,
            error: classified.error,
        }
    }
}

impl EventSink for IngressSink<'_> {
    #[inline]
    fn on_event(&mut self, event: Event<'_>) {
        self.account(&event);
    }

    /// llama.cpp's legacy `error:` line is not an SSE field; the accountant says what it means.
    fn on_unknown_field(&mut self, name: &[u8], value: &[u8]) {
        if self.accounting.unknown_field(name, value) {
            self.ledger.error_event = true;
        }
    }
}
