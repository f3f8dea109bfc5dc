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

/// What one frame holds, for the timeline.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct FrameMeta {
    /// Token events sent before this frame.
    first_event: u64,
    /// Token events in the frame.
    events: u32,
    /// Tokens in the frame.
    tokens: u32,
    /// `--engine batch`: other requests' prefill in the gap before the frame's token event.
    held: Duration,
    /// The stream's own stall in that gap (`--engine batch`).
    stalled: Duration,
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
enum Phase {
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
    phase: Phase,
    /// `--engine batch`: the stream's place in the shared loop, which sets its tokens' time.
    batch: Option<BatchSeat>,
    /// The batch's hold and the stream's stall in the gap before the token being written.
    gap_truth: (Duration, Duration),
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
            SimBody::Stream(stream) => stream.phase == Phase::Done,
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
            phase: Phase::Generating,
            batch,
            gap_truth: (Duration::ZERO, Duration::ZERO),
        }
    }

    /// The next frame once it is due; `None` after the last.
    fn poll_next_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        loop {
            if let Some((bytes, meta)) = self.ready.pop_front() {
                self.record_frame(meta);
                if self.ready.is_empty() && self.phase == Phase::Written {
                    self.phase = Phase::Done;
                    self.guard.complete();
                }
                return Poll::Ready(Some(bytes));
            }
            if self.phase != Phase::Generating {
                if self.phase == Phase::Written {
                    // Nothing at all was written (cannot happen: every stream has a trailer),
                    // but end cleanly rather than hang.
                    self.phase = Phase::Done;
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
                    self.gap_truth = (held, stalled);
                    self.decode_step(step, now);
                    let next = if self.phase == Phase::Generating {
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
        let config = &self.shared.config;
        let coalesce = config.coalesce;
        if step.event == 1 {
            for i in 0..self.wire.preamble_len() {
                self.wire.write_preamble(i, reserve(&mut self.arena, 256));
                let bytes = self.arena.split().freeze();
                let meta = self.meta_without_events();
                self.emit(bytes, meta, now);
            }
        }
        let events = self.wire.events_per_step(step.tokens);
        if self.server.bytes.is_empty() {
            self.server.meta = self.meta_without_events();
        }
        self.wire.write_step(
            step.first_token,
            step.tokens,
            reserve(&mut self.server.bytes, 64 + 32 * step.tokens as usize),
        );
        self.server.meta.events += events;
        self.server.meta.tokens += step.tokens;
        let (held, stalled) = std::mem::take(&mut self.gap_truth);
        self.server.meta.held += held;
        self.server.meta.stalled += stalled;
        self.server.steps += 1;
        self.events += u64::from(events);
        let last = step.first_token + u64::from(step.tokens) >= self.wire.completion_tokens;
        if self.server.steps >= coalesce || last {
            self.server.steps = 0;
            let bytes = self.server.bytes.split().freeze();
            self.emit(bytes, self.server.meta, now);
        }
        if last {
            for i in 0..self.wire.trailer_len() {
                let size = 256 + if i == 0 { self.tgi_text_bytes() } else { 0 };
                self.wire.write_trailer(i, reserve(&mut self.arena, size));
                let bytes = self.arena.split().freeze();
                let meta = self.meta_without_events();
                self.emit(bytes, meta, now);
            }
            self.flush_edge(now);
            self.next = None;
            self.phase = Phase::Written;
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
            self.edge.meta.events += meta.events;
            self.edge.meta.tokens += meta.tokens;
            self.edge.meta.held += meta.held;
            self.edge.meta.stalled += meta.stalled;
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
            events: 0,
            tokens: 0,
            held: Duration::ZERO,
            stalled: Duration::ZERO,
        }
    }

    /// Room TGI's final event needs for `generated_text`.
    fn tgi_text_bytes(&self) -> usize {
        usize::try_from(self.wire.completion_tokens).unwrap_or(0) * 8
    }

    /// Logs a frame handed to hyper, if a timeline is kept.
    fn record_frame(&self, meta: FrameMeta) {
        let Some(timeline) = &self.shared.timeline else {
            return;
        };
        let t_us = micros(Instant::now().saturating_duration_since(self.start));
        timeline.record(Record::Frame {
            stream: self.wire.seq,
            event: meta.first_event,
            events: meta.events,
            tokens: meta.tokens,
            t_us,
            unix_us: self.received_unix_us + t_us,
            held_us: micros(meta.held),
            stalled_us: micros(meta.stalled),
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
