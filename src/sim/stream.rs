//! The response body of a streamed generation: decode steps on the cadence's schedule, written
//! into frames as a server (coalescing) and a buffering edge in front of it would write them.
//!
//! The body drives itself: hyper polls it, it sleeps until the next absolute deadline (the request's
//! arrival plus the planned offset, so lateness never accumulates), then hands over the frames
//! that are due. Nothing runs unless hyper polls, and when the client goes away hyper drops the
//! body: generation stops at once and the [`StreamGuard`] counts the stream cancelled.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use super::batch::{BatchSeat, SeatWake};
use super::cadence::{Step, StreamCadence};
use super::phases::Phase;
use super::replay::ReplayBody;
use super::server::SimShared;
use super::shapes::Wire;
use super::stats::StreamGuard;
use super::timeline::Record;

/// Bytes reserved at a time for frames; frames are split off this buffer, so most frames cost
/// no allocation of their own.
const FRAME_ARENA_BYTES: usize = 4096;

/// The body of every sim response: a ready-made one (JSON, errors) or a generated stream.
#[derive(Debug)]
pub(crate) enum SimBody {
    /// A whole body, sent as one frame.
    Full(Option<Bytes>),
    /// A generated stream.
    Stream(Box<SimStream>),
    /// A replayed capture.
    Replay(Box<ReplayBody>),
}

/// Token events of each phase, in a frame or served in all.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PhaseEvents {
    /// Reasoning token events.
    pub reasoning: u32,
    /// Answer token events.
    pub content: u32,
    /// Tool-call token events.
    pub tool_call: u32,
}

// === impl PhaseEvents ===

impl PhaseEvents {
    /// Counts `events` token events of `phase`.
    fn add(&mut self, phase: Phase, events: u32) {
        let slot = match phase {
            Phase::Reasoning => &mut self.reasoning,
            Phase::Content => &mut self.content,
            Phase::ToolCall => &mut self.tool_call,
        };
        *slot += events;
    }

    /// Adds another count to this one.
    fn merge(&mut self, other: PhaseEvents) {
        self.reasoning += other.reasoning;
        self.content += other.content;
        self.tool_call += other.tool_call;
    }
}

/// What one frame holds, for the timeline.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct FrameMeta {
    /// Token events sent before this frame.
    first_event: u64,
    /// Token events in the frame.
    events: u32,
    /// The frame's token events by phase (they add up to `events`).
    phases: PhaseEvents,
    /// Tokens in the frame.
    tokens: u32,
    /// `--engine batch`: other requests' prefill in the gap before the frame's token event.
    held: Duration,
    /// The stream's own stall in that gap (`--engine batch`).
    stalled: Duration,
    /// The think pause in that gap.
    paused: Duration,
}

// === impl FrameMeta ===

impl FrameMeta {
    /// Adds what another write holds (the edge gathers several into one frame).
    fn merge(&mut self, other: &FrameMeta) {
        self.events += other.events;
        self.phases.merge(other.phases);
        self.tokens += other.tokens;
        self.held += other.held;
        self.stalled += other.stalled;
        self.paused += other.paused;
    }
}

/// What happened in the gap before the next token event, gathered until a step writes one: the
/// batch's hold and the stream's stall, the think pause, and the tokens of steps that wrote
/// nothing (inside a tool call that the API sends whole).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct GapTruth {
    held: Duration,
    stalled: Duration,
    paused: Duration,
    unsent_tokens: u32,
}

/// Bytes written but not yet handed on, with what they hold.
#[derive(Debug, Default)]
struct Pending {
    bytes: BytesMut,
    meta: FrameMeta,
    /// Decode steps in `bytes` (the coalescing count).
    steps: u32,
}

/// Where a stream is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Progress {
    /// Decode steps are still to come.
    Generating,
    /// Everything is written; frames may still wait in the queue.
    Written,
    /// The last frame was handed over.
    Done,
}

/// The state of one generated stream.
#[derive(Debug)]
pub(crate) struct SimStream {
    shared: Arc<SimShared>,
    wire: Wire,
    cadence: StreamCadence,
    /// Counts the stream active until dropped, then completed or cancelled.
    guard: StreamGuard,
    /// The request's arrival: every deadline and timeline offset counts from here.
    start: Instant,
    /// Wall-clock microseconds at arrival, for the timeline.
    received_unix_us: u64,
    /// The one timer of the stream, reset to each next deadline.
    sleep: Pin<Box<Sleep>>,
    /// The next decode step, not yet due.
    next: Option<Step>,
    /// Token events written so far.
    events: u64,
    /// Output of the server not yet written as a frame (coalescing).
    server: Pending,
    /// Frames held by the buffering edge, when one is configured.
    edge: Pending,
    /// When the edge last flushed.
    edge_flushed: Instant,
    /// Frames due, waiting for hyper to take them.
    ready: VecDeque<(Bytes, FrameMeta)>,
    /// Spare buffer space that frames are split from.
    arena: BytesMut,
    progress: Progress,
    /// `--engine batch`: the stream's place in the shared loop, which sets its tokens' time.
    batch: Option<BatchSeat>,
    /// What happened in the gap before the next token event.
    gap_truth: GapTruth,
}

// === impl SimBody ===

impl Body for SimBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            SimBody::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            SimBody::Stream(stream) => stream
                .poll_next_frame(cx)
                .map(|b| b.map(|b| Ok(Frame::data(b)))),
            SimBody::Replay(replay) => replay
                .poll_next_frame(cx)
                .map(|b| b.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            SimBody::Full(bytes) => bytes.is_none(),
            SimBody::Stream(stream) => stream.progress == Progress::Done,
            SimBody::Replay(replay) => replay.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            SimBody::Full(Some(bytes)) => SizeHint::with_exact(bytes.len() as u64),
            SimBody::Full(None) => SizeHint::with_exact(0),
            SimBody::Stream(_) | SimBody::Replay(_) => SizeHint::default(),
        }
    }
}

// === impl SimStream ===

impl SimStream {
    /// A stream that starts generating from `start`, the request's arrival.
    pub(crate) fn new(
        shared: Arc<SimShared>,
        wire: Wire,
        mut cadence: StreamCadence,
        guard: StreamGuard,
        start: Instant,
        received_unix_us: u64,
    ) -> Self {
        let (next, batch, deadline) = match &shared.batch {
            Some(engine) => {
                let first = cadence.next_batch_step(&shared.config);
                let seat =
                    BatchSeat::join(engine.clone(), wire.seq, wire.prompt_tokens, start, first);
                (None, Some(seat), start)
            }
            None => {
                let next = cadence.next_step(&shared.config, guard.active());
                (next, None, next.map_or(start, |step| start + step.offset))
            }
        };
        SimStream {
            shared,
            wire,
            cadence,
            guard,
            start,
            received_unix_us,
            sleep: Box::pin(tokio::time::sleep_until(deadline)),
            next,
            events: 0,
            server: Pending::default(),
            edge: Pending::default(),
            edge_flushed: start,
            ready: VecDeque::with_capacity(4),
            arena: BytesMut::new(),
            progress: Progress::Generating,
            batch,
            gap_truth: GapTruth::default(),
        }
    }

    /// Whether the last frame was handed over.
    pub(crate) fn is_done(&self) -> bool {
        self.progress == Progress::Done
    }

    /// The stream's sequence number (its IDs, its timeline lines).
    pub(crate) fn seq(&self) -> u64 {
        self.wire.seq
    }

    /// The next frame once it is due; `None` after the last.
    pub(crate) fn poll_next_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        loop {
            if let Some((bytes, meta)) = self.ready.pop_front() {
                self.record_frame(meta);
                if self.ready.is_empty() && self.progress == Progress::Written {
                    self.progress = Progress::Done;
                    self.guard.complete();
                }
                return Poll::Ready(Some(bytes));
            }
            if self.progress != Progress::Generating {
                if self.progress == Progress::Written {
                    // Nothing at all was written (cannot happen: every stream has a trailer),
                    // but end cleanly rather than hang.
                    self.progress = Progress::Done;
                    self.guard.complete();
                }
                return Poll::Ready(None);
            }
            ready!(self.sleep.as_mut().poll(cx));
            self.wake(Instant::now());
        }
    }

    /// Does whatever is due at `now` and sets the timer for what comes next.
    fn wake(&mut self, now: Instant) {
        if self.batch.is_some() {
            self.wake_in_batch(now);
            return;
        }
        if let Some(step) = self.next.filter(|s| self.start + s.offset <= now) {
            self.decode_step(step, now);
        }
        if let Some(interval) = self.shared.config.edge_flush_interval {
            if !self.edge.bytes.is_empty() && now >= self.edge_flushed + interval {
                self.flush_edge(now);
            }
        }
        let mut deadline = self.next.map(|s| self.start + s.offset);
        if let Some(interval) = self.shared.config.edge_flush_interval {
            if !self.edge.bytes.is_empty() {
                let flush = self.edge_flushed + interval;
                deadline = Some(deadline.map_or(flush, |d| d.min(flush)));
            }
        }
        if let Some(deadline) = deadline {
            self.sleep.as_mut().reset(deadline);
        }
    }

    /// `--engine batch`: writes the tokens the shared loop gave since the last wake, and sets
    /// the timer for the end of the step in progress (or the end of the stream's stall).
    fn wake_in_batch(&mut self, now: Instant) {
        let deadline = loop {
            let Some(seat) = self.batch.as_mut() else {
                return;
            };
            match seat.wake(now) {
                SeatWake::Token {
                    step,
                    held,
                    stalled,
                } => {
                    self.gap_truth.held += held;
                    self.gap_truth.stalled += stalled;
                    self.decode_step(step, now);
                    let next = if self.progress == Progress::Generating {
                        self.cadence.next_batch_step(&self.shared.config)
                    } else {
                        None
                    };
                    if let Some(seat) = self.batch.as_mut() {
                        seat.plan(next, now);
                    }
                }
                SeatWake::Wait(at) => break at.unwrap_or(now + self.shared.config.gap),
                SeatWake::Done => return,
            }
        };
        self.record_prefills();
        self.sleep.as_mut().reset(deadline);
    }

    /// Logs what the loop's steps prefilled, if a timeline is kept.
    fn record_prefills(&self) {
        let (Some(timeline), Some(seat)) = (&self.shared.timeline, &self.batch) else {
            return;
        };
        for chunk in seat.take_chunks() {
            timeline.record(Record::Prefill {
                stream: chunk.seq,
                step: chunk.step,
                tokens: chunk.tokens,
                step_held_us: micros(chunk.step_hold),
            });
        }
    }

    /// Writes one decode step (with the preamble before the first, the trailer after the last).
    fn decode_step(&mut self, step: Step, now: Instant) {
        let coalesce = self.shared.config.coalesce;
        if step.event == 1 {
            for i in 0..self.wire.preamble_len() {
                self.wire.write_preamble(i, reserve(&mut self.arena, 256));
                let bytes = self.arena.split().freeze();
                let meta = self.meta_without_events();
                self.emit(bytes, meta, now);
            }
        }
        if self.server.bytes.is_empty() {
            self.server.meta = self.meta_without_events();
        }
        self.gap_truth.paused += step.pause;
        let events = self.wire.write_step(
            step.first_token,
            step.tokens,
            reserve(&mut self.server.bytes, 256 + 32 * step.tokens as usize),
        );
        if events == 0 {
            self.gap_truth.unsent_tokens += step.tokens;
        } else {
            let truth = std::mem::take(&mut self.gap_truth);
            let meta = &mut self.server.meta;
            meta.events += events;
            meta.phases.add(step.phase, events);
            meta.tokens += step.tokens + truth.unsent_tokens;
            meta.held += truth.held;
            meta.stalled += truth.stalled;
            meta.paused += truth.paused;
            self.events += u64::from(events);
        }
        self.server.steps += 1;
        let last = step.first_token + u64::from(step.tokens) >= self.wire.output.total();
        if self.server.steps >= coalesce || last {
            self.server.steps = 0;
            if !self.server.bytes.is_empty() {
                let bytes = self.server.bytes.split().freeze();
                self.emit(bytes, self.server.meta, now);
            }
        }
        if last {
            for i in 0..self.wire.trailer_len() {
                let size = self.wire.trailer_size_hint(i);
                self.wire.write_trailer(i, reserve(&mut self.arena, size));
                let bytes = self.arena.split().freeze();
                let meta = self.meta_without_events();
                self.emit(bytes, meta, now);
            }
            self.flush_edge(now);
            self.next = None;
            self.progress = Progress::Written;
        } else if self.batch.is_none() {
            self.next = self
                .cadence
                .next_step(&self.shared.config, self.guard.active());
        }
    }

    /// Hands a server write on: straight out as a frame, or into the edge's buffer.
    fn emit(&mut self, bytes: Bytes, meta: FrameMeta, now: Instant) {
        let config = &self.shared.config;
        if config.edge_flush_bytes.is_none() && config.edge_flush_interval.is_none() {
            self.ready.push_back((bytes, meta));
            return;
        }
        if self.edge.bytes.is_empty() {
            self.edge.meta = meta;
        } else {
            self.edge.meta.merge(&meta);
        }
        self.edge.bytes.extend_from_slice(&bytes);
        let full = config
            .edge_flush_bytes
            .is_some_and(|n| self.edge.bytes.len() >= n);
        let timed_out = config
            .edge_flush_interval
            .is_some_and(|t| now >= self.edge_flushed + t);
        if full || timed_out {
            self.flush_edge(now);
        }
    }

    /// The edge sends everything it holds as one frame.
    fn flush_edge(&mut self, now: Instant) {
        if self.edge.bytes.is_empty() {
            return;
        }
        let bytes = self.edge.bytes.split().freeze();
        self.ready.push_back((bytes, self.edge.meta));
        self.edge_flushed = now;
    }

    /// Meta of a frame that carries no token event.
    fn meta_without_events(&self) -> FrameMeta {
        FrameMeta {
            first_event: self.events,
            ..FrameMeta::default()
        }
    }

    /// Counts a frame handed to hyper, and logs it if a timeline is kept.
    fn record_frame(&self, meta: FrameMeta) {
        if meta.events > 0 {
            self.shared.stats.served(meta.phases);
        }
        let Some(timeline) = &self.shared.timeline else {
            return;
        };
        let t_us = micros(Instant::now().saturating_duration_since(self.start));
        timeline.record(Record::Frame {
            stream: self.wire.seq,
            event: meta.first_event,
            events: meta.events,
            phases: meta.phases,
            tokens: meta.tokens,
            t_us,
            unix_us: self.received_unix_us + t_us,
            held_us: micros(meta.held),
            stalled_us: micros(meta.stalled),
            paused_us: micros(meta.paused),
        });
    }
}

/// `buf` with room for `size` more bytes, taking a fresh arena-sized block when it runs out.
fn reserve(buf: &mut BytesMut, size: usize) -> &mut BytesMut {
    if buf.capacity() - buf.len() < size {
        buf.reserve(size.max(FRAME_ARENA_BYTES));
    }
    buf
}

/// A duration in whole microseconds, saturating.
pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
