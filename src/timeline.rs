//! Stream timelines: the frames of recent streams with their ingress and egress stamps, kept in a
//! bounded ring for `/streams`, `metronome probe --join` and `metronome sim --replay`.
//!
//! Memory stays flat however many streams pass: at most `max_streams` finished streams are kept,
//! each with at most `max_frames` frames; the set of stream IDs that may still send a browser
//! beacon is bounded the same way. docs/timelines.md is the wire contract.

use crate::poison::LockExt;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

use crate::format::PhaseMix;

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
    /// Their phases.
    pub mix: PhaseMix,
}

/// Appends `value` to `log` as an LEB128 varint (7 bits a byte, low bits first).
#[inline]
fn put_varint(log: &mut Vec<u8>, mut value: u64) {
    // Byte by byte: the callers made room, so each push is a store, where copying a buffer of
    // a length known only here would be a call to `memcpy` (two per frame on the ingress log).
    while value >= 0x80 {
        log.push(value as u8 | 0x80);
        value >>= 7;
    }
    log.push(value as u8);
}

/// Makes room in `log` for `n` more bytes, growing it by half rather than doubling it as `Vec`
/// does: a log grows for the whole stream, and doubling leaves it a third empty on average.
/// The growth stays geometric, so most frames still allocate nothing.
#[inline]
fn make_room(log: &mut Vec<u8>, n: usize) {
    if log.capacity() - log.len() < n {
        log.reserve_exact((log.len() / 2).max(n).max(64));
    }
}

/// Reads the varint at `*pos` and moves past it; `None` at the end of `log`.
fn get_varint(log: &[u8], pos: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    let mut shift = 0;
    loop {
        let byte = *log.get(*pos)?;
        *pos += 1;
        value |= u64::from(byte & 0x7F) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
        shift += 7;
    }
}

/// The zigzag form of a signed change: small either way stays small as a varint.
#[inline]
fn zigzag(change: u32) -> u64 {
    let change = change as i32;
    u64::from(((change << 1) ^ (change >> 31)) as u32)
}

/// The change a [`zigzag`] value stands for (wrapping).
#[inline]
fn unzigzag(value: u64) -> u32 {
    let value = value as u32;
    ((value >> 1) as i32 ^ -((value & 1) as i32)) as u32
}

/// The frames a stream keeps in its timeline, as the ingress reader saw them, in a compact log.
///
/// A frame is two to four varints: how much its gap since the previous frame's ingress stamp
/// differs from the previous frame's gap (µs); how much its length differs from the previous
/// frame's, shifted left by one, with the low bit set when its event counts are the previous
/// frame's (both changes zigzag and wrapping, so any frame comes back exactly); and, unless that
/// bit is set, its event counts (`events << 2 | 1` when every event is a token event, else
/// `events << 2` and then the token events; `| 2` and then the [`PhaseMix`] when its token events
/// are not all content). A server's cadence, frame sizes and events per
/// frame are steady, so a frame of a token stream takes about 3 bytes (a gap within 8 ms of the
/// last one, a length within 31 bytes), where an [`IngressFrame`] takes 12; the log grows as
/// frames come, as a `Vec` does (no allocation for most frames).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct IngressTimeline {
    log: Vec<u8>,
    frames: u32,
    last_us: u32,
    last_gap: u32,
    last_bytes: u32,
    last_events: (u16, u16, PhaseMix),
}

// === impl IngressTimeline ===

impl IngressTimeline {
    /// Appends a frame.
    #[inline]
    pub fn push(&mut self, frame: IngressFrame) {
        make_room(&mut self.log, 21); // the most a frame takes: 5 + 5 + 3 + 3 + 5
        let gap = frame.ingress_us.wrapping_sub(self.last_us);
        put_varint(&mut self.log, zigzag(gap.wrapping_sub(self.last_gap)));
        self.last_us = frame.ingress_us;
        self.last_gap = gap;
        let counts = (frame.events, frame.token_events, frame.mix);
        let same_counts = counts == self.last_events;
        put_varint(
            &mut self.log,
            zigzag(frame.bytes.wrapping_sub(self.last_bytes)) << 1 | u64::from(same_counts),
        );
        self.last_bytes = frame.bytes;
        self.last_events = counts;
        if !same_counts {
            let mixed = !frame.mix.is_all_content();
            let events = u64::from(frame.events) << 2 | u64::from(mixed) << 1;
            if frame.token_events == frame.events {
                put_varint(&mut self.log, events | 1);
            } else {
                put_varint(&mut self.log, events);
                put_varint(&mut self.log, u64::from(frame.token_events));
            }
            if mixed {
                put_varint(&mut self.log, u64::from(frame.mix.to_bits()));
            }
        }
        self.frames += 1;
    }

    /// Asks for the line the next frame's entry goes to (see [`crate::prefetch`]).
    #[inline]
    pub fn prefetch(&self) {
        crate::prefetch::line(self.log.as_ptr().wrapping_add(self.log.len()));
    }

    /// Frames kept.
    pub fn len(&self) -> usize {
        self.frames as usize
    }

    /// True when no frame is kept.
    pub fn is_empty(&self) -> bool {
        self.frames == 0
    }

    /// The frames in order.
    pub fn iter(&self) -> impl Iterator<Item = IngressFrame> + '_ {
        let mut pos = 0;
        let (mut at, mut gap, mut bytes) = (0u32, 0u32, 0u32);
        let (mut events, mut token_events, mut mix) = (0u16, 0u16, PhaseMix::ALL_CONTENT);
        std::iter::from_fn(move || {
            let log = &self.log[..];
            gap = gap.wrapping_add(unzigzag(get_varint(log, &mut pos)?));
            at = at.wrapping_add(gap);
            let length = get_varint(log, &mut pos)?;
            bytes = bytes.wrapping_add(unzigzag(length >> 1));
            if length & 1 == 0 {
                let counts = get_varint(log, &mut pos)?;
                events = (counts >> 2) as u16;
                token_events = if counts & 1 == 1 {
                    events
                } else {
                    get_varint(log, &mut pos)? as u16
                };
                mix = if counts & 2 == 2 {
                    PhaseMix::from_bits(get_varint(log, &mut pos)? as u32)
                } else {
                    PhaseMix::ALL_CONTENT
                };
            }
            Some(IngressFrame {
                ingress_us: at,
                bytes,
                events,
                token_events,
                mix,
            })
        })
    }
}

/// The egress stamps of a stream's kept frames, by frame sequence, in a compact log: a varint per
/// frame, 0 for a frame without a stamp, else one plus the frame's time from its ingress stamp to
/// its egress stamp (µs, wrapping, so any stamp comes back exactly given the ingress one). That
/// time is the proxy's delay, tens of µs while the client keeps up: a frame takes one byte, where
/// its egress stamp since the stream began takes four as a `u32` (and three as a change from the
/// previous stamp, 50 ms before). Frames are stamped in order, so a stamp is appended (a stamp
/// for an earlier frame is still put in its place, by rewriting the log).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct EgressStamps {
    log: Vec<u8>,
    frames: u32,
}

// === impl EgressStamps ===

impl EgressStamps {
    /// Frame `seq`, read at `ingress_us`, reached the client socket at `egress_us` (both µs since
    /// the stream began, as the ingress timeline keeps `ingress_us`).
    #[inline]
    pub fn set(&mut self, seq: u32, ingress_us: u32, egress_us: u32) {
        self.put(seq, egress_us.wrapping_sub(ingress_us));
    }

    /// Puts frame `seq`'s time from ingress to egress.
    fn put(&mut self, seq: u32, delay_us: u32) {
        if seq < self.frames {
            // Not in order: rebuild the log with the stamp in its place.
            let mut delays: Vec<Option<u32>> = self.delays().collect();
            delays[seq as usize] = Some(delay_us);
            *self = EgressStamps::default();
            for (i, delay) in delays.into_iter().enumerate() {
                if let Some(delay) = delay {
                    self.put(i as u32, delay);
                }
            }
            return;
        }
        for _ in self.frames..seq {
            self.log.push(0);
        }
        make_room(&mut self.log, 5);
        put_varint(&mut self.log, u64::from(delay_us) + 1);
        self.frames = seq + 1;
    }

    /// Each frame's time from its ingress stamp to its egress stamp, from frame 0 to the last one
    /// stamped; `None` for a frame without one.
    pub fn delays(&self) -> impl Iterator<Item = Option<u32>> + '_ {
        let mut pos = 0;
        std::iter::from_fn(move || {
            let value = get_varint(&self.log, &mut pos)?;
            Some(value.checked_sub(1).map(|d| d as u32))
        })
    }
}

/// The kept frames of a finished stream: its ingress timeline and egress stamps, still compact;
/// [`StreamFrames::records`] gives them as `/streams/{id}` shows them.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StreamFrames {
    ingress: IngressTimeline,
    egress: EgressStamps,
}

// === impl StreamFrames ===

impl StreamFrames {
    /// A finished stream's frames (the logs are shrunk to fit: they are kept a while).
    pub fn new(mut ingress: IngressTimeline, mut egress: EgressStamps) -> Self {
        ingress.log.shrink_to_fit();
        egress.log.shrink_to_fit();
        StreamFrames { ingress, egress }
    }

    /// Frames kept.
    pub fn len(&self) -> usize {
        self.ingress.len()
    }

    /// True when no frame is kept.
    pub fn is_empty(&self) -> bool {
        self.ingress.is_empty()
    }

    /// Each kept frame with its egress stamp, if it has one.
    pub fn records(&self) -> Vec<FrameRecord> {
        let mut delays = self.egress.delays();
        self.ingress
            .iter()
            .map(|f| FrameRecord {
                ingress_us: f.ingress_us,
                // A stamp of u32::MAX (71 minutes, saturated) reads as no stamp, as it always did.
                egress_us: delays
                    .next()
                    .flatten()
                    .map(|d| f.ingress_us.wrapping_add(d))
                    .filter(|s| *s != u32::MAX),
                bytes: Some(f.bytes),
                events: f.events,
                token_events: f.token_events,
                phase: PhaseMark::of(f.mix, f.token_events),
                mix: f.mix,
            })
            .collect()
    }

    /// The runs of frames whose token events show one phase, in order: where the phases turn
    /// (`/streams/{id}`'s `phases`). A frame with token events of several phases counts in the
    /// phase most of them show.
    pub fn phase_runs(&self) -> Vec<PhaseRun> {
        let mut runs: Vec<PhaseRun> = Vec::new();
        for (i, f) in self.ingress.iter().enumerate() {
            let Some(phase) = f.mix.main(u32::from(f.token_events)) else {
                continue;
            };
            let events = u64::from(f.token_events);
            match runs.last_mut() {
                Some(run) if run.phase == phase.as_str() => {
                    run.last_frame = i as u32;
                    run.token_events += events;
                }
                _ => runs.push(PhaseRun {
                    phase: phase.as_str(),
                    first_frame: i as u32,
                    last_frame: i as u32,
                    from_us: f.ingress_us,
                    token_events: events,
                }),
            }
        }
        runs
    }
}

/// A frame's phase mark in `/streams/{id}`: the phase of its token events, and when they are of
/// several phases, how many of each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum PhaseMark {
    /// Every token event of the frame is of this phase.
    One(&'static str),
    /// Token events of several phases.
    Mixed {
        /// Reasoning token events.
        reasoning: u32,
        /// Content token events.
        content: u32,
        /// Tool-call token events.
        tool_call: u32,
    },
}

// === impl PhaseMark ===

impl PhaseMark {
    /// The mark of a frame with `token_events` of the phases `mix` says; `None` without any.
    fn of(mix: PhaseMix, token_events: u16) -> Option<PhaseMark> {
        let total = u32::from(token_events);
        let [reasoning, content, tool_call] = mix.counts(total);
        let phases = [reasoning, content, tool_call]
            .iter()
            .filter(|n| **n > 0)
            .count();
        match phases {
            0 => None,
            1 => mix.main(total).map(|p| PhaseMark::One(p.as_str())),
            _ => Some(PhaseMark::Mixed {
                reasoning,
                content,
                tool_call,
            }),
        }
    }
}

/// A run of frames of one phase (see [`StreamFrames::phase_runs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PhaseRun {
    /// The phase.
    pub phase: &'static str,
    /// Its first frame's index in `frames`.
    pub first_frame: u32,
    /// Its last frame's index.
    pub last_frame: u32,
    /// When its first frame was read, µs since the stream began.
    pub from_us: u32,
    /// Its token events.
    pub token_events: u64,
}

/// One frame of a finished stream, as `/streams/{id}` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FrameRecord {
    /// Read from the upstream, µs since the stream began.
    pub ingress_us: u32,
    /// Written to the client socket, µs since the stream began; `None` if it never was.
    pub egress_us: Option<u32>,
    /// Its length; `None` (left out of the JSON) unless `timeline.frame_sizes` is on: an SSE
    /// chat stream's frame sizes are its tokens' lengths, a side channel.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u32>,
    /// Events it completed.
    pub events: u16,
    /// Of those, token events.
    pub token_events: u16,
    /// The phase of its token events (`reasoning`, `content`, `tool_call`), or an object with
    /// the count of each when they are of several; absent from a frame without token events.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<PhaseMark>,
    /// Its token events' phases as the meter carried them (the phase of a stall that ends here
    /// is [`PhaseMix::first`]).
    #[serde(skip)]
    pub mix: PhaseMix,
}

/// A figure at the ingress and egress points.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct AtPoints<T> {
    /// At ingress.
    pub ingress: T,
    /// At egress.
    pub egress: T,
}

// === impl FinishedStream ===

impl FinishedStream {
    /// The wall-clock start in ns since the Unix epoch (at the ms the request was stamped).
    pub fn started_unix_nanos(&self) -> u64 {
        self.started_unix_ms.saturating_mul(1_000_000)
    }
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
    /// Time to first output token (the first token event that is not reasoning) at each point;
    /// `None` where the stream never got past its reasoning.
    pub ttfo_us: AtPoints<Option<u64>>,
    /// First to last reasoning token event at each point, for a stream that reasoned.
    pub reasoning_us: AtPoints<Option<u64>>,
    /// Reasoning tokens, as the server's usage reported them.
    pub reasoning_tokens: Option<u64>,
    /// The response content type.
    pub content_type: String,
    /// The request's `traceparent`, if any.
    pub traceparent: Option<String>,
    /// The request's `x-request-id`, if any.
    pub request_id: Option<String>,
    /// The kept frames.
    pub frames: StreamFrames,
    /// metronome's span for the stream, when traces are on (`[otlp] traces`).
    pub span: Option<crate::trace_context::SpanContext>,
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
    ttfo_us: AtPoints<Option<u64>>,
    reasoning_us: AtPoints<Option<u64>>,
    reasoning_tokens: Option<u64>,
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
    frames: Vec<FrameRecord>,
    frames_dropped: u64,
    phases: Vec<PhaseRun>,
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
    /// The key only the stream's own client received (`x-metronome-beacon-key`); never shown.
    key: Option<BeaconKey>,
    /// What metronome saw of the stream, once it was recorded: token events and duration.
    pub seen: Option<BeaconSeen>,
}

/// A beacon key: 128 random bits.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct BeaconKey(pub u128);

impl std::fmt::Debug for BeaconKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BeaconKey(..)")
    }
}

/// What a beacon is held against: what metronome saw of its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BeaconSeen {
    /// Token events metronome forwarded.
    pub token_events: u64,
    /// From the request's receipt to the stream's end, in microseconds.
    pub duration_us: u64,
}

/// Why a beacon was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BeaconClaim {
    /// The stream is unknown or has left the window.
    Unknown,
    /// A beacon for this stream was accepted before.
    Duplicate,
    /// The beacon carried no key.
    NoKey,
    /// The beacon's key is not the stream's.
    WrongKey,
}

#[derive(Debug, Default)]
struct Inner {
    finished: VecDeque<Arc<FinishedStream>>,
    slots: HashMap<Arc<str>, BeaconSlot>,
    slot_order: VecDeque<Arc<str>>,
}

/// Where a finished stream goes besides `/streams`: the span exporter's queue when
/// `[otlp] traces = true`. A trait, so that the timelines do not depend on the exporter that reads
/// them.
pub trait FinishedSink: Send + Sync + std::fmt::Debug {
    /// Takes what it needs of a stream that just finished, without waiting.
    fn offer(&self, stream: &FinishedStream);
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
    /// Whether `/streams/{id}` shows each frame's size (`timeline.frame_sizes`).
    frame_sizes: bool,
    /// Where each finished stream is offered besides `/streams` (the span queue, when traces are
    /// on).
    sink: Option<Arc<dyn FinishedSink>>,
    inner: Mutex<Inner>,
}

// === impl StreamRegistry ===

impl StreamRegistry {
    /// A registry keeping `max_streams` streams of `max_frames` frames each.
    pub fn new(max_streams: usize, max_frames: usize) -> Self {
        let beacon_window = max_streams.max(4096);
        StreamRegistry {
            max_streams,
            max_frames,
            beacon_window,
            frame_sizes: false,
            sink: None,
            inner: Mutex::new(Inner {
                finished: VecDeque::new(),
                // Sized at start for twice the window. The window churns (a stream in, the oldest
                // out), and a hash table churned at more than half its room grows once, late:
                // sized for the window alone, the slots doubled from 1 to 2 MB after about
                // 33,000 streams (the soak's one step in resident memory). At twice the window
                // it only ever rehashes in place.
                slots: HashMap::with_capacity(2 * beacon_window),
                slot_order: VecDeque::with_capacity(beacon_window),
            }),
        }
    }

    /// Shows each frame's size in `/streams/{id}` (`timeline.frame_sizes`; off by default).
    pub fn with_frame_sizes(mut self, on: bool) -> Self {
        self.frame_sizes = on;
        self
    }

    /// Offers each finished stream to `sink` too (the span queue, `[otlp] traces = true`).
    pub fn with_sink(mut self, sink: Option<Arc<dyn FinishedSink>>) -> Self {
        self.sink = sink;
        self
    }

    /// Frames a stream may keep.
    pub fn max_frames(&self) -> usize {
        self.max_frames
    }

    /// A stream started: it may send one beacon while it stays in the window, with `key` when
    /// it has one (only a beacon with it may speak for the stream; a stream given none, a
    /// WebSocket tunnel's, cannot be spoken for).
    pub fn started(&self, id: &Arc<str>, route: &Arc<str>, key: Option<BeaconKey>) {
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
                key,
                seen: None,
            },
        );
        inner.slot_order.push_back(id.clone());
    }

    /// The window's slots and its order's length (which must agree).
    #[cfg(test)]
    pub(crate) fn window_len(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.slots.len(), inner.slot_order.len())
    }

    /// Stream `id`, started before its response was known, is not a stream after all (the
    /// answer was not one, or there was none): its slot leaves the window. Its place in the
    /// window's order is looked for from the newest end, where it is, by the `Arc` it was started
    /// with (a pointer compared, not the text).
    pub fn withdraw(&self, id: &Arc<str>) {
        let mut inner = self.lock();
        if inner.slots.remove(id).is_none() {
            return;
        }
        if let Some(at) = inner.slot_order.iter().rposition(|s| Arc::ptr_eq(s, id)) {
            inner.slot_order.remove(at);
        }
    }

    /// A stream finished: keep it for `/streams`, and give its beacon slot the model label.
    pub fn finished(&self, stream: FinishedStream) {
        if let Some(sink) = &self.sink {
            sink.offer(&stream);
        }
        let mut inner = self.lock();
        if let Some(slot) = inner.slots.get_mut(&stream.id) {
            slot.model = Some(stream.model.clone());
            slot.seen = Some(BeaconSeen {
                token_events: stream.token_events,
                duration_us: stream.duration_us,
            });
        }
        if self.max_streams == 0 {
            return;
        }
        if inner.finished.len() >= self.max_streams {
            inner.finished.pop_front();
        }
        inner.finished.push_back(Arc::new(stream));
    }

    /// The beacon slot of stream `id` if `key` is its key, without taking it: a refused beacon
    /// never takes the stream's one place.
    pub fn beacon_slot(&self, id: &str, key: Option<BeaconKey>) -> Result<BeaconSlot, BeaconClaim> {
        let inner = self.lock();
        let slot = inner.slots.get(id).ok_or(BeaconClaim::Unknown)?;
        let given = key.ok_or(BeaconClaim::NoKey)?;
        match slot.key {
            // Compared without an early exit on the first differing bit.
            Some(own) if (own.0 ^ given.0) == 0 => {}
            _ => return Err(BeaconClaim::WrongKey),
        }
        if slot.used {
            return Err(BeaconClaim::Duplicate);
        }
        Ok(slot.clone())
    }

    /// Claims the one beacon a stream may send, once [`Self::beacon_slot`] let it in and its
    /// content was found plausible.
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
        self.list_json_where(|_| true, usize::MAX)
    }

    /// `/streams?…`: the summaries of the streams `keep` accepts, newest first, at most `limit`.
    pub fn list_json_where(&self, keep: impl Fn(&FinishedStream) -> bool, limit: usize) -> String {
        let finished: Vec<Arc<FinishedStream>> = (self.lock().finished.iter().rev())
            .filter(|s| keep(s))
            .take(limit)
            .cloned()
            .collect();
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
                ttfo_us: s.ttfo_us,
                reasoning_us: s.reasoning_us,
                reasoning_tokens: s.reasoning_tokens,
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
            frames: self.shown(stream.frames.records()),
            frames_dropped: stream.frames_dropped,
            phases: stream.frames.phase_runs(),
        };
        serde_json::to_string(&detail).ok()
    }

    /// `records` as `/streams/{id}` may show them: without sizes unless they are opted in.
    fn shown(&self, mut records: Vec<FrameRecord>) -> Vec<FrameRecord> {
        if !self.frame_sizes {
            for record in &mut records {
                record.bytes = None;
            }
        }
        records
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock_or_recover()
    }
}

/// A duration in whole microseconds.
pub fn as_micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A finished stream of one frame, for tests here and of what reads finished streams.
    pub(crate) fn finished(id: &str) -> FinishedStream {
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
            ttfo_us: AtPoints::default(),
            reasoning_us: AtPoints::default(),
            reasoning_tokens: None,
            content_type: "text/event-stream".into(),
            traceparent: None,
            request_id: None,
            span: None,
            frames: {
                let mut ingress = IngressTimeline::default();
                ingress.push(IngressFrame {
                    ingress_us: 5,
                    bytes: 10,
                    events: 1,
                    token_events: 1,
                    mix: Default::default(),
                });
                StreamFrames::new(ingress, EgressStamps::default())
            },
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
        registry.started(&id, &Arc::from("chat"), None);
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

    /// The beacon window's table never grows once the window is full, however long the churn:
    /// its memory is there from the first 4,096 streams, not added as a step later.
    #[test]
    fn the_beacon_window_keeps_its_size_under_churn() {
        let registry = StreamRegistry::new(256, 1);
        let route: Arc<str> = Arc::from("chat");
        for i in 0..4096 {
            registry.started(&Arc::from(format!("s{i}")), &route, None);
        }
        let full = {
            let inner = registry.lock();
            (inner.slots.capacity(), inner.slot_order.capacity())
        };
        for i in 4096..100_000 {
            registry.started(&Arc::from(format!("s{i}")), &route, None);
        }
        let inner = registry.lock();
        assert_eq!(inner.slots.len(), 4096);
        // `capacity()` counts the room left, which the churn's tombstones lower between in-place
        // rehashes; a table that grew would show about twice `full`.
        assert!(
            inner.slots.capacity() <= full.0,
            "{} > {}",
            inner.slots.capacity(),
            full.0
        );
        assert_eq!(inner.slot_order.capacity(), full.1);
    }

    #[test]
    fn the_beacon_window_is_bounded() {
        let registry = StreamRegistry::new(1, 1);
        let route: Arc<str> = Arc::from("chat");
        for i in 0..5000 {
            registry.started(&Arc::from(format!("s{i}")), &route, None);
        }
        assert_eq!(registry.lock().slots.len(), 4096);
        assert_eq!(
            registry.claim_beacon("s0").unwrap_err(),
            BeaconClaim::Unknown
        );
        assert!(registry.claim_beacon("s4999").is_ok());
    }

    #[test]
    fn the_ingress_log_gives_back_every_frame_exactly() {
        let frames = [
            (0, 0, 0, 0),
            (5, 10, 1, 1),
            (5, 230, 1, 0),
            (50_123, 70_000, 3, 2),
            (4_000_000_000, u32::MAX, u16::MAX, u16::MAX),
            (u32::MAX, 1, u16::MAX, 0),
            (17, 128, 64, 64), // stamps that go back (never seen) still come back exactly
            (20, 128, 64, 64), // the counts of the frame before: not written again
            (25, 0, 64, 64),
            (26, 1, 64, 63),
        ];
        let mut timeline = IngressTimeline::default();
        let mut expected = Vec::new();
        for (ingress_us, bytes, events, token_events) in frames {
            let frame = IngressFrame {
                ingress_us,
                bytes,
                events,
                token_events,
                mix: PhaseMix::ALL_CONTENT,
            };
            timeline.push(frame);
            expected.push(frame);
        }
        assert_eq!(timeline.len(), expected.len());
        assert_eq!(timeline.iter().collect::<Vec<_>>(), expected);
    }

    #[test]
    fn a_token_frame_at_a_jittery_cadence_takes_three_bytes() {
        let mut timeline = IngressTimeline::default();
        let mut expected = Vec::new();
        let mut at = 100_000u32;
        let mut seed = 7u32;
        for _ in 0..1000 {
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            let jitter = (seed >> 8) % 6_000; // the gap: 47 to 53 ms
            at += 47_000 + jitter;
            let frame = IngressFrame {
                ingress_us: at,
                bytes: 220 + (seed >> 20) % 30,
                events: 1,
                token_events: 1,
                mix: PhaseMix::ALL_CONTENT,
            };
            timeline.push(frame);
            expected.push(frame);
        }
        // The first frame takes 6 bytes (its counts, a 100 ms gap, a length from 0), the second 4
        // (its gap is half the first's).
        assert!(timeline.log.len() <= 3 * 1000 + 4, "{}", timeline.log.len());
        assert_eq!(timeline.iter().collect::<Vec<_>>(), expected);
        // Grown by half at a time: never more than half again what it holds.
        assert!(timeline.log.capacity() <= timeline.log.len() * 3 / 2 + 16);
    }

    proptest::proptest! {
        /// Whatever the stamps, lengths and counts, the log gives every frame back exactly.
        #[test]
        fn any_frames_come_back_exactly(
            frames in proptest::collection::vec(
                (proptest::prelude::any::<u32>(), proptest::prelude::any::<u32>(),
                 proptest::prelude::any::<u16>(), proptest::prelude::any::<u16>(),
                 proptest::prelude::any::<u32>()),
                0..64,
            )
        ) {
            let mut timeline = IngressTimeline::default();
            let frames: Vec<IngressFrame> = frames
                .into_iter()
                .map(|(ingress_us, bytes, events, token_events, mix)| IngressFrame {
                    ingress_us,
                    bytes,
                    events,
                    token_events,
                    // Half the frames all content, as most are.
                    mix: PhaseMix::from_bits(if mix % 2 == 0 { 0 } else { mix }),
                })
                .collect();
            for frame in &frames {
                timeline.push(*frame);
            }
            proptest::prop_assert_eq!(timeline.len(), frames.len());
            proptest::prop_assert_eq!(timeline.iter().collect::<Vec<_>>(), frames);
        }
    }

    #[test]
    fn egress_stamps_come_back_in_their_places() {
        let mut stamps = EgressStamps::default();
        stamps.set(0, 0, 10);
        stamps.set(1, 60_000, 60_010);
        stamps.set(3, 4, 5); // a hole at 2
        stamps.set(4, 7, u32::MAX);
        stamps.set(5, u32::MAX - 1, 3); // wrapped: comes back exactly all the same
        stamps.set(6, 9, 9);
        assert_eq!(
            stamps.delays().collect::<Vec<_>>(),
            vec![
                Some(10),
                Some(10),
                None,
                Some(1),
                Some(u32::MAX - 7),
                Some(5),
                Some(0)
            ]
        );
        // A frame the proxy held for 200 ms (a slow client) takes 3 bytes; one it passed on
        // within 127 µs takes one.
        assert_eq!(stamps.log.len(), 1 + 1 + 1 + 1 + 5 + 1 + 1);
        stamps.set(2, 100, 107); // out of order: rewritten in place
        stamps.set(1, 60_000, 60_008); // stamped again: the later stamp wins, as with an array
        assert_eq!(
            stamps.delays().collect::<Vec<_>>(),
            vec![
                Some(10),
                Some(8),
                Some(7),
                Some(1),
                Some(u32::MAX - 7),
                Some(5),
                Some(0)
            ]
        );
    }

    #[test]
    fn records_join_ingress_and_egress_as_before() {
        let mut ingress = IngressTimeline::default();
        let mut egress = EgressStamps::default();
        for i in 0..4u32 {
            ingress.push(IngressFrame {
                ingress_us: i * 100,
                bytes: 10 + i,
                events: 1,
                token_events: u16::from(i % 2 == 0),
                mix: PhaseMix::ALL_CONTENT,
            });
        }
        egress.set(0, 0, 150);
        egress.set(1, 100, u32::MAX); // saturated: reads as no stamp
        egress.set(2, 200, 260);
        let frames = StreamFrames::new(ingress, egress);
        assert_eq!(frames.len(), 4);
        let egress_us: Vec<_> = frames.records().iter().map(|f| f.egress_us).collect();
        assert_eq!(egress_us, vec![Some(150), None, Some(260), None]);
        let records = frames.records();
        assert_eq!(records[3].bytes, Some(13));
        assert_eq!(records[1].token_events, 0);
        assert_eq!(records[2].ingress_us, 200);
    }
}
