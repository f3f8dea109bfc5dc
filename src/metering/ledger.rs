//! The per-stream ledger: fixed-size state that is recorded into the metrics exactly once.
//!
//! A stream is seen at two points. The ingress reader owns an [`IngressLedger`] and updates it
//! without locks; the client connection's egress clock stamps frames into the stream's
//! [`EgressLedger`] as their bytes reach the socket. Both live in one [`StreamLedger`], shared by
//! the ingress reader, the egress body and the frames waiting for their egress stamp. Whichever of
//! them lets go last drops it, and `Drop` is the single place where the stream is recorded: after
//! a complete stream, a client that vanished, an upstream that failed, or a task that panicked.
//! Memory per stream is a few KiB whatever the stream's length.

use crate::poison::LockExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::format::{FinishReason, Format, Phase, PhaseMix};
use crate::metering::clock::{FrameStamp, Tick};
use crate::metrics::counter::add_saturating;
use crate::metrics::{
    BucketCounts, Exemplar, LocalHistogram, Metrics, NativeCounts, Outcome, Point, StreamSeries,
};
use crate::sketch::{GapBucket, GapSketch};
use crate::timeline::{
    as_micros, AtPoints, EgressStamps, FinishedStream, IngressTimeline, StreamFrames,
    StreamRegistry,
};

/// Streams with fewer gaps get no jank-ratio sample (docs/design.md section 3).
pub const MIN_GAPS_FOR_JANK: u32 = 8;

/// Per-stream samples of a histogram of whole numbers that are almost always small (events per
/// frame or socket write, tokens per event): a counter for each of the values 1 to 8, and a full
/// [`LocalHistogram`] made only for a stream that sees another value. 40 bytes where a
/// `LocalHistogram` takes 152, three times per stream.
///
/// What is merged is the same as if every sample had gone into a `LocalHistogram`: each bucket
/// gets the same count, and a sum of whole numbers is exact in any order (below 2^53), so it has
/// the same bits. A counter that would saturate sends its value to the full histogram instead.
#[derive(Debug, Default, Clone)]
pub struct SmallCounts {
    /// `counts[i]`: samples of value `i + 1`.
    counts: [u32; SMALL_VALUES],
    other: Option<Box<LocalHistogram>>,
}

/// The values [`SmallCounts`] counts without a full histogram: 1 to 8.
const SMALL_VALUES: usize = 8;

// === impl SmallCounts ===

impl SmallCounts {
    /// Adds one sample; `bounds` are the family's.
    #[inline]
    pub fn observe(&mut self, bounds: &[f64], value: u32) {
        let small = (value as usize)
            .checked_sub(1)
            .and_then(|i| self.counts.get_mut(i));
        match small {
            Some(count) if *count < u32::MAX => *count += 1,
            _ => self
                .other
                .get_or_insert_with(Box::default)
                .observe(bounds, f64::from(value)),
        }
    }

    /// The samples as a [`LocalHistogram`] of the family with `bounds`, to merge.
    pub fn to_local(&self, bounds: &[f64]) -> LocalHistogram {
        let mut local = self.other.as_deref().cloned().unwrap_or_default();
        for (i, count) in self.counts.iter().enumerate() {
            local.observe_n(bounds, (i + 1) as f64, *count);
        }
        local
    }
}

/// One point's view of a stream: token-event timing, gaps, stalls and framing.
///
/// The gaps that end at a content token event (every gap of most streams) are counted here; those
/// that end at a reasoning or tool-call event go to [`OtherPhases`], made at the first such event.
/// The content phase's count and sum are what is left of the whole stream's, so the common frame
/// does what it did before phases, plus one branch.
#[derive(Debug, Default, Clone)]
pub struct PointLedger {
    first_byte: Option<Tick>,
    first_token: Option<Tick>,
    last_token: Option<Tick>,
    /// The first token event that is not reasoning (TTFO's end).
    first_output: Option<Tick>,
    token_events: u64,
    /// The content gaps' buckets. Their sum is the span from the first token event to the last
    /// less the other phases' sums, and their count the token events but one less the other
    /// phases' counts, so neither is added up per gap.
    itl: BucketCounts,
    /// The content gaps' native buckets (when the family has them).
    itl_native: NativeCounts,
    /// The longest content gap, in nanoseconds: the exemplar's value.
    longest_gap: u64,
    /// Stalls of every phase.
    stalls: u64,
    /// Made at the first content stall: most streams have none. Classic and native counts.
    stall_durations: Option<Box<(LocalHistogram, NativeCounts)>>,
    /// The next gap overlaps backpressure (`metering::backpressure`): it is no stall. Read only
    /// when a gap is over the threshold; set and cleared by the stream's reader.
    gap_held: bool,
    events_per_frame: SmallCounts,
    /// Every gap, of every phase (the stream's quantiles); the content phase's jank is this less
    /// the other phases' sketches.
    gaps: GapSketch,
    /// The gaps of the reasoning and tool_call phases, made at the first such token event.
    others: Option<Box<OtherPhases>>,
    /// What earlier flushes merged already (`metrics.flush_interval`), so that every figure is
    /// merged exactly once.
    flushed: Flushed,
}

/// The gaps that end at reasoning and tool-call token events, and the reasoning span.
#[derive(Debug, Default, Clone)]
struct OtherPhases {
    /// `[reasoning, tool_call]`.
    phases: [PhaseGaps; 2],
    first_reasoning: Option<Tick>,
    last_reasoning: Option<Tick>,
}

// === impl OtherPhases ===

impl OtherPhases {
    /// The gaps of `phase` (reasoning or tool_call).
    fn of(&mut self, phase: Phase) -> &mut PhaseGaps {
        &mut self.phases[usize::from(phase == Phase::ToolCall)]
    }

    /// Gaps, their nanoseconds and stalls not yet flushed, over both phases.
    fn pending(&self) -> (u64, u64, u64) {
        self.phases.iter().fold((0, 0, 0), |(g, n, s), p| {
            (
                g + p.pending_gaps,
                n + p.pending_nanos,
                s + p.pending_stalls,
            )
        })
    }
}

/// One phase's gaps (other than content), counted in full since the last flush.
#[derive(Debug, Default, Clone)]
struct PhaseGaps {
    itl: BucketCounts,
    itl_native: NativeCounts,
    pending_gaps: u64,
    pending_nanos: u64,
    pending_stalls: u64,
    longest_gap: u64,
    stall_durations: Option<Box<(LocalHistogram, NativeCounts)>>,
    /// All its gaps, for its jank ratio.
    gaps: GapSketch,
}

// === impl PhaseGaps ===

impl PhaseGaps {
    /// A gap of `nanos` (0 for the later events of a frame), `n` times; returns whether it is
    /// a stall (never when `held`: the gap overlapped backpressure).
    fn add(&mut self, nanos: u64, n: u32, held: bool, metrics: &Metrics) -> bool {
        let seconds = nanos as f64 * 1e-9;
        let bucket = GapBucket::of(seconds);
        self.itl
            .add_at(metrics.itl_index.bucket(bucket, seconds), n);
        self.gaps.add_to(bucket, n);
        if let Some(native) = metrics.itl.native() {
            self.itl_native.add(native.bucket(seconds), n);
        }
        self.pending_gaps += u64::from(n);
        self.pending_nanos += nanos * u64::from(n);
        self.longest_gap = self.longest_gap.max(nanos);
        let stall = nanos > metrics.stall_threshold_nanos() && !held;
        if stall {
            self.pending_stalls += 1;
            let durations = self.stall_durations.get_or_insert_with(Box::default);
            durations
                .0
                .observe(metrics.stall_duration.bounds(), seconds);
            if let Some(native) = metrics.stall_duration.native() {
                durations.1.observe(native, seconds);
            }
        }
        stall
    }
}

/// What a point's earlier flushes took: the gaps up to a token event, the stalls, and whether
/// the first byte and first token were observed.
#[derive(Debug, Default, Clone, Copy)]
struct Flushed {
    /// Gaps merged, and the token event the last of them ended at.
    gaps: u64,
    until: Option<Tick>,
    stalls: u64,
    first_byte: bool,
    first_token: bool,
    first_output: bool,
}

// === impl PointLedger ===

impl PointLedger {
    /// Body bytes were seen at `at`.
    #[inline]
    pub fn bytes(&mut self, at: Tick) {
        self.first_byte.get_or_insert(at);
    }

    /// `token_events` token events of the phases `mix` says were seen at `at` (one frame, or
    /// one socket write): the first one's gap runs from the previous token event, the others'
    /// gaps are 0, and each gap belongs to the phase of the event that ends it.
    #[inline]
    pub fn token_events(&mut self, at: Tick, token_events: u32, mix: PhaseMix, metrics: &Metrics) {
        if token_events == 0 {
            return;
        }
        if !mix.is_all_content() {
            return self.mixed_token_events(at, token_events, mix, metrics);
        }
        match self.last_token {
            Some(last) => {
                self.content_gap(at.nanos_since(last), metrics);
                if self.first_output.is_none() {
                    self.first_output = Some(at);
                }
            }
            None => {
                self.first_token = Some(at);
                self.first_output = Some(at);
            }
        }
        self.content_zero_gaps(token_events - 1, metrics);
        self.last_token = Some(at);
        self.token_events += u64::from(token_events);
    }

    /// A gap of `nanos` that ends at a content token event.
    #[inline(always)]
    fn content_gap(&mut self, nanos: u64, metrics: &Metrics) {
        let seconds = nanos as f64 * 1e-9;
        let bucket = GapBucket::of(seconds);
        self.itl
            .add_at(metrics.itl_index.bucket(bucket, seconds), 1);
        self.gaps.add_to(bucket, 1);
        if let Some(native) = metrics.itl.native() {
            self.itl_native.observe(native, seconds);
        }
        self.longest_gap = self.longest_gap.max(nanos);
        if nanos > metrics.stall_threshold_nanos() && !self.gap_held {
            self.stalls += 1;
            let stall = self.stall_durations.get_or_insert_with(Box::default);
            stall.0.observe(metrics.stall_duration.bounds(), seconds);
            if let Some(native) = metrics.stall_duration.native() {
                stall.1.observe(native, seconds);
            }
        }
    }

    /// `n` gaps of 0 that end at content token events.
    #[inline(always)]
    fn content_zero_gaps(&mut self, n: u32, metrics: &Metrics) {
        if n > 0 {
            self.itl
                .add_at(metrics.itl_index.bucket(GapBucket::ZERO, 0.0), n);
            self.gaps.add_to(GapBucket::ZERO, n);
            if let Some(native) = metrics.itl.native() {
                self.itl_native.add(native.bucket(0.0), n);
            }
        }
    }

    /// `n` gaps of `nanos` that end at token events of `phase`.
    fn phase_gaps(&mut self, phase: Phase, nanos: u64, n: u32, metrics: &Metrics) {
        if n == 0 {
            return;
        }
        if phase == Phase::Content {
            if nanos == 0 {
                self.content_zero_gaps(n, metrics);
            } else {
                self.content_gap(nanos, metrics);
            }
            return;
        }
        let held = self.gap_held;
        let others = self.others.get_or_insert_with(Box::default);
        let stall = others.of(phase).add(nanos, n, held, metrics);
        self.gaps.add_to(GapBucket::of(nanos as f64 * 1e-9), n);
        self.stalls += u64::from(stall);
    }

    /// A frame whose token events are not all content: off the common path.
    #[cold]
    #[inline(never)]
    fn mixed_token_events(&mut self, at: Tick, total: u32, mix: PhaseMix, metrics: &Metrics) {
        let counts = mix.counts(total);
        let first = mix.first();
        let others = self.others.get_or_insert_with(Box::default);
        if counts[Phase::Reasoning.index()] > 0 {
            others.first_reasoning.get_or_insert(at);
            others.last_reasoning = Some(at);
        }
        if counts[Phase::Reasoning.index()] < total && self.first_output.is_none() {
            self.first_output = Some(at);
        }
        match self.last_token {
            Some(last) => self.phase_gaps(first, at.nanos_since(last), 1, metrics),
            None => self.first_token = Some(at),
        }
        for phase in Phase::ALL {
            let zeros = counts[phase.index()] - u32::from(phase == first);
            self.phase_gaps(phase, 0, zeros, metrics);
        }
        self.last_token = Some(at);
        self.token_events += u64::from(total);
    }

    /// Whether the next gap overlaps backpressure, so is no stall (docs/design.md, section 3).
    pub fn hold_gap(&mut self, held: bool) {
        self.gap_held = held;
    }

    /// Asks for the lines of the gap sketch's buckets, which live apart from the ledger.
    #[inline]
    pub fn prefetch(&self) {
        self.gaps.prefetch();
    }

    /// A frame (ingress) or socket write (egress) completed `events` events.
    #[inline]
    pub fn events_in_frame(&mut self, events: u32, metrics: &Metrics) {
        if events > 0 {
            self.events_per_frame
                .observe(metrics.events_per_frame.bounds(), events);
        }
    }

    /// How many token events this point saw.
    pub fn token_event_count(&self) -> u64 {
        self.token_events
    }

    /// How many gaps exceeded the stall threshold.
    pub fn stall_count(&self) -> u64 {
        self.stalls
    }

    /// The content gaps recorded since the last flush: bucket counts, their sum (the span from
    /// the token event the last flush ended at, or the first, to the last, less the other
    /// phases' gaps) and their count (the token events but one, less those flushed and the other
    /// phases').
    pub fn itl(&self) -> LocalHistogram {
        let (other_gaps, other_nanos, _) = self.others.as_ref().map_or((0, 0, 0), |o| o.pending());
        let span = self.token_span().map_or(0, |(first, last)| {
            last.nanos_since(self.flushed.until.unwrap_or(first))
        });
        let sum = if other_nanos == 0 {
            self.token_span().map_or(0.0, |(first, last)| {
                last.secs_since(self.flushed.until.unwrap_or(first))
            })
        } else {
            span.saturating_sub(other_nanos) as f64 * 1e-9
        };
        let gaps = self.token_events.saturating_sub(1) - self.flushed.gaps;
        LocalHistogram::from_counts(&self.itl, sum, gaps.saturating_sub(other_gaps))
    }

    /// Per phase, how many gaps ended at its token events since the last flush.
    pub fn pending_gaps_by_phase(&self) -> [u64; 3] {
        let mut counts = [0; 3];
        counts[Phase::Content.index()] = self.itl().count();
        if let Some(others) = &self.others {
            counts[Phase::Reasoning.index()] = others.phases[0].pending_gaps;
            counts[Phase::ToolCall.index()] = others.phases[1].pending_gaps;
        }
        counts
    }

    /// Time to first token since `received`.
    pub fn ttft(&self, received: Tick) -> Option<Duration> {
        Some(self.first_token?.saturating_duration_since(received))
    }

    /// Time to first output token (the first token event that is not reasoning) since
    /// `received`; `None` for a stream that never got past its reasoning.
    pub fn ttfo(&self, received: Tick) -> Option<Duration> {
        Some(self.first_output?.saturating_duration_since(received))
    }

    /// The first and last reasoning token event, for a stream that reasoned.
    pub fn reasoning_span(&self) -> Option<(Tick, Tick)> {
        let others = self.others.as_deref()?;
        Some((others.first_reasoning?, others.last_reasoning?))
    }

    /// First to last reasoning token event, for a stream that reasoned.
    pub fn reasoning_duration(&self) -> Option<Duration> {
        let (first, last) = self.reasoning_span()?;
        Some(last.saturating_duration_since(first))
    }

    /// The stream's gap at quantile `q` at this point (within 2%).
    pub fn gap_quantile(&self, q: f64) -> Option<Duration> {
        self.gaps.quantile(q)
    }

    /// The first and last token event.
    pub fn token_span(&self) -> Option<(Tick, Tick)> {
        Some((self.first_token?, self.last_token?))
    }

    /// The gaps' native bucket counts (empty when the family has no native buckets).
    pub fn itl_native(&self) -> &NativeCounts {
        &self.itl_native
    }

    /// Merges what this point counted since its last flush into the metrics, and forgets it:
    /// TTFB and TTFT (only when `with_ttft`) once, the gaps, stalls and their durations, events
    /// per frame. `stream` names the stream for the exemplars (its `value` is replaced by each
    /// figure's own). Called every `metrics.flush_interval` while the stream runs and once more
    /// by [`PointLedger::record`] at its end, so a gap reaches `/metrics` within an interval of
    /// happening and is counted exactly once.
    pub(crate) fn flush(&mut self, to: &Target<'_>, point: Point) {
        let Target {
            metrics,
            series,
            received,
            with_ttft,
            ref stream,
            ..
        } = *to;
        if let Some(at) = self.first_byte.filter(|_| !self.flushed.first_byte) {
            series.ttfb(metrics, point).observe(at.secs_since(received));
            self.flushed.first_byte = true;
        }
        if let Some(at) = self
            .first_token
            .filter(|_| with_ttft && !self.flushed.first_token)
        {
            series
                .ttft(metrics, point)
                .observe_with(at.secs_since(received), Some(stream));
            self.flushed.first_token = true;
        }
        if let Some(at) = self
            .first_output
            .filter(|_| with_ttft && !self.flushed.first_output)
        {
            series
                .ttfo(metrics, point)
                .observe_with(at.secs_since(received), Some(stream));
            self.flushed.first_output = true;
        }
        let content = Phase::Content;
        let longest = Exemplar {
            value: self.longest_gap as f64 * 1e-9,
            ..*stream
        };
        let pending = self.itl();
        let (other_gaps, _, other_stalls) = self.others.as_ref().map_or((0, 0, 0), |o| o.pending());
        if pending.count() > 0 {
            series.itl(metrics, point, content).merge_with(
                &pending,
                &self.itl_native,
                (self.longest_gap > 0).then_some(&longest),
            );
            self.itl = BucketCounts::default();
            self.itl_native.clear();
        }
        let stalls = self.stalls - self.flushed.stalls - other_stalls;
        if stalls > 0 {
            add_saturating(series.stalls(metrics, point, content), stalls);
            if let Some(stall_durations) = self.stall_durations.as_deref_mut() {
                series.stall_duration(metrics, point, content).merge_with(
                    &stall_durations.0,
                    &stall_durations.1,
                    Some(&longest),
                );
                stall_durations.0 = LocalHistogram::default();
                stall_durations.1.clear();
            }
        }
        if let Some(others) = self.others.as_deref_mut() {
            others.flush(to, point);
        }
        self.flushed.gaps += pending.count() + other_gaps;
        self.flushed.until = self.last_token;
        self.flushed.stalls = self.stalls;
        self.longest_gap = 0;
        let bounds = metrics.events_per_frame.bounds();
        let events = std::mem::take(&mut self.events_per_frame).to_local(bounds);
        // Only a flush with frames makes the series (a slot's first use makes it).
        if events.count() > 0 {
            series.events_per_frame(metrics, point).merge(&events);
        }
    }

    /// Merges what is left of this point's figures at the stream's end ([`PointLedger::flush`])
    /// and the one figure that exists only for the whole stream, its jank ratio.
    pub(crate) fn record(&mut self, to: &Target<'_>, point: Point) {
        self.flush(to, point);
        let jank = |phase: Phase| to.series.jank(to.metrics, point, phase);
        let Some(others) = self.others.as_deref() else {
            if let Some(ratio) = self.gaps.jank_ratio(MIN_GAPS_FOR_JANK) {
                jank(Phase::Content).observe(ratio);
            }
            return;
        };
        let mut content = self.gaps.clone();
        for (phase, gaps) in [Phase::Reasoning, Phase::ToolCall]
            .iter()
            .zip(&others.phases)
        {
            content.subtract(&gaps.gaps);
            if let Some(ratio) = gaps.gaps.jank_ratio(MIN_GAPS_FOR_JANK) {
                jank(*phase).observe(ratio);
            }
        }
        if let Some(ratio) = content.jank_ratio(MIN_GAPS_FOR_JANK) {
            jank(Phase::Content).observe(ratio);
        }
        if let Some(reasoning) = self.reasoning_duration().filter(|_| to.with_ttft) {
            to.series
                .reasoning_duration(to.metrics, point)
                .observe_with(reasoning.as_secs_f64(), Some(&to.stream));
        }
    }
}

// === impl OtherPhases ===

impl OtherPhases {
    /// Merges each phase's gaps, stalls and stall durations since the last flush, and forgets
    /// them (see [`PointLedger::flush`]).
    fn flush(&mut self, to: &Target<'_>, point: Point) {
        let (metrics, series) = (to.metrics, to.series);
        for (&phase, gaps) in [Phase::Reasoning, Phase::ToolCall]
            .iter()
            .zip(&mut self.phases)
        {
            let longest = Exemplar {
                value: gaps.longest_gap as f64 * 1e-9,
                ..to.stream
            };
            if gaps.pending_gaps > 0 {
                let local = LocalHistogram::from_counts(
                    &gaps.itl,
                    gaps.pending_nanos as f64 * 1e-9,
                    gaps.pending_gaps,
                );
                series.itl(metrics, point, phase).merge_with(
                    &local,
                    &gaps.itl_native,
                    (gaps.longest_gap > 0).then_some(&longest),
                );
                gaps.itl = BucketCounts::default();
                gaps.itl_native.clear();
            }
            if gaps.pending_stalls > 0 {
                add_saturating(series.stalls(metrics, point, phase), gaps.pending_stalls);
                if let Some(durations) = gaps.stall_durations.as_deref_mut() {
                    series.stall_duration(metrics, point, phase).merge_with(
                        &durations.0,
                        &durations.1,
                        Some(&longest),
                    );
                    durations.0 = LocalHistogram::default();
                    durations.1.clear();
                }
            }
            gaps.pending_gaps = 0;
            gaps.pending_nanos = 0;
            gaps.pending_stalls = 0;
            gaps.longest_gap = 0;
        }
    }
}

/// Where a stream's figures are merged: the metrics, its labels, when it was received (the start
/// of TTFT and TTFB) and the stream its exemplars name.
#[derive(Clone, Copy)]
pub(crate) struct Target<'a> {
    /// The families merged into.
    pub metrics: &'a Metrics,
    /// The series of the stream's route and (bounded) model, found once per pair; it carries
    /// the two labels.
    pub series: &'a StreamSeries,
    /// When the request was received.
    pub received: Tick,
    /// TTFT is observed (the beacon's page may not know its first event's time).
    pub with_ttft: bool,
    /// The stream the exemplars name (its `value` replaced by each figure's own).
    pub stream: Exemplar<'a>,
}

/// Why the ingress reader stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IngressEnd {
    /// The upstream body ended.
    Complete,
    /// The client went away and the upstream request was dropped.
    ClientGone,
    /// The upstream body failed (reset, malformed HTTP).
    UpstreamError,
    /// The upstream sent nothing for longer than the idle timeout.
    UpstreamTimeout,
}

/// What the ingress reader learned about a stream.
#[derive(Debug, Default, Clone)]
pub struct IngressLedger {
    /// Timing at the ingress point.
    pub point: PointLedger,
    /// The bounded `model` label, once the stream names a model.
    pub model: Option<Arc<str>>,
    /// Tokens per token event.
    pub tokens_per_event: SmallCounts,
    /// Tokens counted from token events (exact per event where the format says so, else 1).
    pub counted_tokens: u64,
    /// The latest output-token total the server reported (`usage`).
    pub usage_tokens: Option<u64>,
    /// The prompt (input) tokens the server reported (`usage.prompt_tokens` and each format's
    /// equivalent), when it did.
    pub prompt_tokens: Option<u64>,
    /// The reasoning tokens the server reported (`completion_tokens_details.reasoning_tokens`
    /// and each format's equivalent), when it did.
    pub reasoning_tokens: Option<u64>,
    /// Why generation ended, as the last event that said so reported it.
    pub finish: Option<FinishReason>,
    /// The stream carried an error event.
    pub error_event: bool,
    /// Events that could not be parsed.
    pub unparsed_events: u64,
    /// Events too long to inspect.
    pub oversize_events: u64,
    /// Usage figures refused as implausible (`metering::usage`).
    pub usage_refusals: super::usage::UsageRefusals,
    /// Frames read from the upstream.
    pub frames_total: u64,
    /// The first `max_frames` frames, for the stream's timeline.
    pub timeline: IngressTimeline,
    /// The stream's API as detected (set when the ingress reader stops).
    pub format: Option<Format>,
    /// Events that completed only when the body ended (an NDJSON line without its newline):
    /// their bytes went out with the last frame, whose egress stamp they take.
    pub completed_at_end: FrameCounts,
}

// === impl IngressLedger ===

impl IngressLedger {
    /// Output tokens and where the figure comes from (`usage` or `counted`).
    pub fn output_tokens(&self) -> (u64, &'static str) {
        match self.usage_tokens {
            Some(n) => (n, "usage"),
            None => (self.counted_tokens, "counted"),
        }
    }
}

/// What one frame held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FrameCounts {
    /// Events the frame completed.
    pub events: u32,
    /// Of those, token events.
    pub token_events: u32,
    /// Their phases.
    pub mix: PhaseMix,
    /// The frame's place in the stream's timeline, when it is kept there.
    pub seq: Option<u32>,
}

/// What the egress clock learned about a stream.
#[derive(Debug, Default, Clone)]
pub struct EgressLedger {
    /// Timing at the egress point.
    pub point: PointLedger,
    /// Egress minus ingress, per frame.
    pub proxy_delay: LocalHistogram,
    /// The same delays' native buckets.
    pub proxy_delay_native: NativeCounts,
    /// The longest of them, in seconds: the exemplar's value.
    longest_delay: f64,
    /// The socket write the last stamped frame went out in, to count events per write.
    last_write: Option<u64>,
    /// Events in frames of that write so far.
    write_events: u32,
    /// Egress stamp of each kept frame (by frame sequence), µs since the stream began.
    stamps: EgressStamps,
    /// Frames whose bytes reached the client socket.
    frames_stamped: u64,
    /// When the last of them did.
    last_stamp: Option<Tick>,
}

// === impl EgressLedger ===

impl EgressLedger {
    /// A frame stamped `stamp` at ingress reached the client socket at `at`, in socket write
    /// `write_seq`; `received` is when the stream began (the timeline's origin).
    #[inline]
    pub fn frame(
        &mut self,
        at: Tick,
        write_seq: u64,
        stamp: &FrameStamp,
        received: Tick,
        metrics: &Metrics,
    ) {
        let FrameStamp {
            ingress,
            events,
            token_events,
            mix,
            seq,
        } = *stamp;
        if let Some(seq) = seq {
            // The same reading of the ingress stamp as the ingress timeline keeps.
            self.stamps.set(
                seq,
                ingress.micros_since(received),
                at.micros_since(received),
            );
        }
        self.frames_stamped += 1;
        self.last_stamp = Some(at);
        self.point.bytes(at);
        let delay = at.secs_since(ingress);
        let bucket = metrics
            .proxy_delay_index
            .bucket(GapBucket::of(delay), delay);
        self.proxy_delay.observe_in(bucket, delay);
        if let Some(native) = metrics.proxy_delay.native() {
            self.proxy_delay_native.observe(native, delay);
        }
        self.longest_delay = self.longest_delay.max(delay);
        if self.last_write != Some(write_seq) {
            self.point.events_in_frame(self.write_events, metrics);
            self.last_write = Some(write_seq);
            self.write_events = 0;
        }
        self.write_events += events;
        self.point.token_events(at, token_events, mix, metrics);
    }

    /// Merges the proxy delays counted since the last flush into the metrics, and forgets them.
    fn flush_delays(&mut self, to: &Target<'_>) {
        let longest_delay = Exemplar {
            value: self.longest_delay,
            ..to.stream
        };
        // Only a flush with delays makes the series (a slot's first use makes it).
        if self.proxy_delay.count() > 0 || !self.proxy_delay_native.is_empty() {
            to.series.proxy_delay(to.metrics).merge_with(
                &self.proxy_delay,
                &self.proxy_delay_native,
                Some(&longest_delay),
            );
        }
        self.proxy_delay = LocalHistogram::default();
        self.proxy_delay_native.clear();
        self.longest_delay = 0.0;
    }

    /// The stream is over. `completed_at_end` are the events that completed only when the body
    /// ended: their bytes were in the last frame, so they count in the last socket write, at its
    /// stamp (when every frame reached the socket; otherwise they never reached the client).
    fn finish(&mut self, completed_at_end: FrameCounts, delivered: bool, metrics: &Metrics) {
        if let Some(at) = self.last_stamp.filter(|_| delivered) {
            self.write_events += completed_at_end.events;
            self.point.token_events(
                at,
                completed_at_end.token_events,
                completed_at_end.mix,
                metrics,
            );
        }
        self.point.events_in_frame(self.write_events, metrics);
        self.write_events = 0;
    }
}

/// What is known of a stream when it starts.
#[derive(Debug, Clone)]
pub struct StreamInfo {
    /// Its ID, as the response header carries it.
    pub id: Arc<str>,
    /// Its route label.
    pub route: Arc<str>,
    /// When metronome received the request: the start of TTFT and TTFB.
    pub received: Tick,
    /// The same moment on the wall clock, ms since the Unix epoch (for people).
    pub started_unix_ms: u64,
    /// The response content type.
    pub content_type: String,
    /// The request's `traceparent`, if any (bounded).
    pub traceparent: Option<String>,
    /// The request's `x-request-id`, if any (bounded).
    pub request_id: Option<String>,
    /// The request's method, path (no query) and ID, for the access log.
    pub line: crate::logging::RequestLine,
    /// The response status sent to the client (for the access log).
    pub status: u16,
    /// The latency objectives the request carried (`x-llm-d-slo-*`), judged at the stream's end.
    pub slo: Option<crate::slo::StreamSlo>,
    /// metronome's span for the stream, when traces are on.
    pub span: Option<crate::trace_context::SpanContext>,
}

/// Everything known about one metered stream; recorded exactly once, when the last holder drops it.
#[derive(Debug)]
pub struct StreamLedger {
    metrics: Arc<Metrics>,
    registry: Arc<StreamRegistry>,
    /// Its route's `metronome_streams_active`, counted up at the open and down when recorded.
    active: prometheus::IntGauge,
    /// Its ID, route and start (`info.received`, read for every frame's timeline stamp).
    info: StreamInfo,
    /// Stamped by the client connection's egress clock, possibly from another task.
    egress: Mutex<EgressLedger>,
    /// Put here once by the ingress side when it stops (boxed: an empty slot costs a pointer,
    /// not a second ingress ledger's worth of memory for the whole stream).
    ingress: Mutex<Option<Box<(IngressLedger, IngressEnd)>>>,
    /// The stream's place among the requests in flight, held until it is recorded.
    in_flight: Option<tokio::sync::OwnedSemaphorePermit>,
}

// === impl StreamLedger ===

impl StreamLedger {
    /// Opens the ledger of a new stream and counts it as active. Its beacon slot is the
    /// caller's to take ([`StreamRegistry::started`]), before the stream's head is written.
    pub fn open(
        metrics: Arc<Metrics>,
        registry: Arc<StreamRegistry>,
        info: StreamInfo,
        in_flight: impl Into<Option<tokio::sync::OwnedSemaphorePermit>>,
    ) -> Arc<Self> {
        let active = metrics.streams_active.with_label_values(&[&info.route]);
        active.inc();
        Arc::new(StreamLedger {
            metrics,
            registry,
            active,
            info,
            egress: Mutex::new(EgressLedger::default()),
            ingress: Mutex::new(None),
            in_flight: in_flight.into(),
        })
    }

    /// The live flush (`metrics.flush_interval`): merges what both points counted since the last
    /// flush into the metrics, while the stream runs. `ingress` is the ingress side's ledger,
    /// lent by whoever holds it (the metered body's state, under its lock); the egress ledger is
    /// taken under its own lock, after. At the stream's end `Drop` merges what is left, so
    /// every figure is merged exactly once.
    pub fn flush_live(&self, ingress: &mut IngressLedger) {
        let metrics = &*self.metrics;
        let route = &*self.info.route;
        let model_label = ingress
            .model
            .clone()
            .unwrap_or_else(|| metrics.models.resolve(None));
        let model = &*model_label;
        let trace_id = self
            .info
            .traceparent
            .as_deref()
            .and_then(crate::metrics::trace_id);
        let stream = Exemplar {
            stream_id: &self.info.id,
            trace_id,
            value: 0.0,
        };
        let series = metrics.stream_series.get(route, model);
        let to = Target {
            metrics,
            series: &series,
            received: self.info.received,
            with_ttft: true,
            stream,
        };
        ingress.point.flush(&to, Point::Ingress);
        let mut egress = self.egress.lock_or_recover();
        egress.point.flush(&to, Point::Egress);
        egress.flush_delays(&to);
    }

    /// The metrics this stream records into.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The stream's route label.
    pub fn route(&self) -> &str {
        &self.info.route
    }

    /// The stream's ID.
    pub fn id(&self) -> &Arc<str> {
        &self.info.id
    }

    /// When metronome received the request.
    pub fn received(&self) -> Tick {
        self.info.received
    }

    /// Frames a stream keeps in its timeline.
    pub fn max_frames(&self) -> usize {
        self.registry.max_frames()
    }

    /// A frame reached the client socket at `at`, in socket write `write_seq`.
    pub fn egress_frame(&self, at: Tick, write_seq: u64, stamp: &FrameStamp) {
        let mut egress = self.egress.lock_or_recover();
        egress.frame(at, write_seq, stamp, self.info.received, &self.metrics);
    }

    /// Asks for the cache lines the egress clock will touch when this stream's next frame
    /// reaches the client socket: the egress ledger (not what it points to, which only its lock
    /// may read) and the reference count the clock's queue entry takes (see
    /// [`crate::prefetch`]).
    #[inline]
    pub fn prefetch_egress(self: &Arc<Self>) {
        crate::prefetch::value(&self.egress);
        // The reference counts sit just before the value in the `Arc`'s allocation.
        crate::prefetch::line(Arc::as_ptr(self).cast::<u8>().wrapping_sub(16));
    }

    /// The ingress reader stopped; it hands over what it learned.
    pub fn ingress_finished(&self, ledger: IngressLedger, end: IngressEnd) {
        *self.ingress.lock_or_recover() = Some(Box::new((ledger, end)));
    }

    /// How the stream ended. It was delivered when every frame read from the upstream reached
    /// the client socket: whether the connection asked the body for its end does not matter (with a
    /// `content-length` it never does).
    fn outcome(
        &self,
        ingress: Option<&(IngressLedger, IngressEnd)>,
        frames_stamped: u64,
    ) -> Outcome {
        let Some((ledger, end)) = ingress else {
            return Outcome::UpstreamError; // the ingress reader never reported: it failed
        };
        match end {
            IngressEnd::UpstreamError => Outcome::UpstreamError,
            IngressEnd::UpstreamTimeout => Outcome::UpstreamTimeout,
            IngressEnd::ClientGone => Outcome::ClientCancelled,
            IngressEnd::Complete if ledger.error_event => Outcome::UpstreamError,
            IngressEnd::Complete if frames_stamped < ledger.frames_total => {
                Outcome::ClientCancelled
            }
            IngressEnd::Complete if ledger.point.token_event_count() == 0 => Outcome::NoToken,
            IngressEnd::Complete => Outcome::Complete,
        }
    }
}

impl StreamLedger {
    /// What the registry keeps of this stream (the frames' logs move there).
    fn finished(
        &mut self,
        ingress: Option<&mut IngressLedger>,
        model: Arc<str>,
        outcome: Outcome,
    ) -> FinishedStream {
        let received = self.info.received;
        let egress = self.egress.get_mut_or_recover();
        let us = |d: Option<Duration>| d.map(as_micros);
        let mut empty = IngressLedger::default();
        let ingress = ingress.unwrap_or(&mut empty);
        let frames = StreamFrames::new(
            std::mem::take(&mut ingress.timeline),
            std::mem::take(&mut egress.stamps),
        );
        let (tokens, _) = ingress.output_tokens();
        FinishedStream {
            id: self.info.id.clone(),
            route: self.info.route.clone(),
            model,
            outcome: outcome.as_str(),
            started_unix_ms: self.info.started_unix_ms,
            duration_us: as_micros(Tick::now().saturating_duration_since(received)),
            frames_total: ingress.frames_total,
            frames_dropped: ingress.frames_total.saturating_sub(frames.len() as u64),
            token_events: ingress.point.token_event_count(),
            output_tokens: tokens,
            ttft_us: AtPoints {
                ingress: us(ingress.point.ttft(received)),
                egress: us(egress.point.ttft(received)),
            },
            itl_p50_us: AtPoints {
                ingress: us(ingress.point.gap_quantile(0.5)),
                egress: us(egress.point.gap_quantile(0.5)),
            },
            itl_p99_us: AtPoints {
                ingress: us(ingress.point.gap_quantile(0.99)),
                egress: us(egress.point.gap_quantile(0.99)),
            },
            stalls: AtPoints {
                ingress: ingress.point.stall_count(),
                egress: egress.point.stall_count(),
            },
            ttfo_us: AtPoints {
                ingress: us(ingress.point.ttfo(received)),
                egress: us(egress.point.ttfo(received)),
            },
            reasoning_us: AtPoints {
                ingress: us(ingress.point.reasoning_duration()),
                egress: us(egress.point.reasoning_duration()),
            },
            reasoning_tokens: ingress.reasoning_tokens,
            content_type: std::mem::take(&mut self.info.content_type),
            traceparent: self.info.traceparent.take(),
            request_id: self.info.request_id.take(),
            frames,
            span: self.info.span,
        }
    }
}

impl Drop for StreamLedger {
    fn drop(&mut self) {
        self.record();
    }
}

/// What the end of a stream is recorded with: the labels, the exemplar and the lent handles,
/// owned so that the ledger can be taken mutably while they are read.
struct Ending {
    metrics: Arc<Metrics>,
    model: Arc<str>,
    series: Arc<StreamSeries>,
    id: Arc<str>,
    traceparent: Option<String>,
}

// === impl Ending ===

impl Ending {
    /// Where the stream's figures go.
    fn target(&self, received: Tick) -> Target<'_> {
        Target {
            metrics: &self.metrics,
            series: &self.series,
            received,
            with_ttft: true,
            stream: Exemplar {
                stream_id: &self.id,
                trace_id: self
                    .traceparent
                    .as_deref()
                    .and_then(crate::metrics::trace_id),
                value: 0.0,
            },
        }
    }
}

impl StreamLedger {
    /// Records the stream, exactly once (from `Drop`): the ingress figures, the egress figures,
    /// the latency objectives, the duration, the registry's entry and the access log, and last
    /// the counts of the stream itself.
    fn record(&mut self) {
        let mut ingress = self.ingress.get_mut_or_recover().take().map(|boxed| *boxed);
        let frames_stamped = self.egress.get_mut_or_recover().frames_stamped;
        let outcome = self.outcome(ingress.as_ref(), frames_stamped);
        let model = ingress
            .as_ref()
            .and_then(|(l, _)| l.model.clone())
            .unwrap_or_else(|| self.metrics.models.resolve(None));
        let ending = Ending {
            metrics: self.metrics.clone(),
            series: self.metrics.stream_series.get(&self.info.route, &model),
            model,
            id: self.info.id.clone(),
            traceparent: self.info.traceparent.clone(),
        };
        let to = ending.target(self.info.received);
        let mut ingress_ledger = ingress.as_mut().map(|(l, _)| l);
        if let Some(ledger) = &mut ingress_ledger {
            record_ingress(ledger, &to);
        }
        self.record_egress(ingress_ledger.as_deref(), &to);
        self.judge_slo(ingress_ledger.as_deref(), outcome, &to);
        let metrics = to.metrics;
        to.series
            .request_duration(metrics)
            .observe(Tick::now().secs_since(self.info.received));
        self.active.dec();
        let format = ingress_ledger
            .as_ref()
            .and_then(|l| l.format)
            .unwrap_or(Format::Unknown);
        let finish = ingress_ledger.as_ref().and_then(|l| l.finish);
        let finished = self.finished(ingress_ledger, ending.model.clone(), outcome);
        self.log(&finished, format, outcome.finish_label(finish));
        self.registry.finished(finished);
        drop(self.in_flight.take());

        // The two counts of the stream itself go last, after its figures, its place in
        // `/streams` and its place among the requests in flight. A scrape gathers the families
        // one after another (in no fixed order) while streams are recorded, so one scrape can
        // hold part of a stream; anything that starts after a scrape saw these counts finds all
        // of the stream.
        let finish = outcome.finish_label(finish);
        to.series.count_stream(metrics, outcome.as_str(), finish);
        to.series.count_format(metrics, format.name());
    }

    /// The egress point's figures: the events that completed at the body's end, the gaps and the
    /// proxy delays not yet merged.
    fn record_egress(&mut self, ingress: Option<&IngressLedger>, to: &Target<'_>) {
        let egress = self.egress.get_mut_or_recover();
        let (completed_at_end, delivered) = match ingress {
            Some(ledger) => (
                ledger.completed_at_end,
                egress.frames_stamped >= ledger.frames_total,
            ),
            None => (FrameCounts::default(), false),
        };
        egress.finish(completed_at_end, delivered, to.metrics);
        egress.point.record(to, Point::Egress);
        egress.flush_delays(to);
    }

    /// Judges the latency objectives the request carried against what the client was delivered.
    fn judge_slo(&mut self, ingress: Option<&IngressLedger>, outcome: Outcome, to: &Target<'_>) {
        let Some(slo) = &self.info.slo else {
            return;
        };
        let egress = self.egress.get_mut_or_recover();
        let tokens = ingress.map_or(0, |l| l.output_tokens().0);
        let delivered = crate::slo::Delivered {
            complete: outcome == Outcome::Complete,
            ttft: egress.point.ttft(self.info.received),
            tpot: egress
                .point
                .token_span()
                .filter(|_| tokens >= 2)
                .map(|(first, last)| {
                    let gaps = u32::try_from(tokens - 1).unwrap_or(u32::MAX);
                    last.saturating_duration_since(first) / gaps
                }),
        };
        for verdict in slo.judge(&delivered) {
            to.metrics
                .slo_streams
                .with_label_values(&[
                    to.series.route(),
                    to.series.model(),
                    verdict.objective,
                    verdict.result(),
                ])
                .inc();
        }
    }

    /// The debug event and the access-log line of a recorded stream, and a warning naming both
    /// IDs when the upstream failed it mid-stream (a reset, a malformed chunk, an error event).
    fn log(&self, finished: &FinishedStream, format: Format, finish_reason: &str) {
        if finished.outcome == Outcome::UpstreamError.as_str() {
            tracing::warn!(
                stream_id = &*finished.id,
                request_id = finished.request_id.as_deref(),
                route = &*finished.route,
                model = &*finished.model,
                output_tokens = finished.output_tokens,
                "the upstream failed mid-stream (reset or malformed); the client's stream was cut"
            );
        }
        tracing::debug!(
            stream_id = &*finished.id,
            route = &*finished.route,
            model = &*finished.model,
            format = format.name(),
            outcome = finished.outcome,
            traceparent = finished.traceparent.as_deref(),
            request_id = finished.request_id.as_deref(),
            "stream recorded"
        );
        crate::logging::access(&crate::logging::AccessRecord {
            line: Some(&self.info.line),
            route: &finished.route,
            model: Some(&finished.model),
            status: self.info.status,
            duration: Some(Duration::from_micros(finished.duration_us)),
            ttft: finished.ttft_us.egress.map(Duration::from_micros),
            ttfo: finished.ttfo_us.egress.map(Duration::from_micros),
            reasoning: finished.reasoning_us.egress.map(Duration::from_micros),
            stalls: finished.stalls.egress,
            outcome: finished.outcome,
            stream_id: Some(&finished.id),
            output_tokens: Some(finished.output_tokens),
            finish_reason: Some(finish_reason),
        });
    }
}

/// The ingress point's figures: its gaps, tokens per event, token counts, TPOT and the events
/// that could not be read.
fn record_ingress(ledger: &mut IngressLedger, to: &Target<'_>) {
    let (metrics, series) = (to.metrics, to.series);
    let route = series.route();
    ledger.point.record(to, Point::Ingress);
    let bounds = metrics.tokens_per_event.bounds();
    let tokens_per_event = ledger.tokens_per_event.to_local(bounds);
    // Only a stream with token events makes the series (a slot's first use makes it).
    if tokens_per_event.count() > 0 {
        series.tokens_per_event(metrics).merge(&tokens_per_event);
    }
    let (tokens, source) = ledger.output_tokens();
    // A counted figure (a server's running count) is bounded like a reported one.
    let tokens = ledger.usage_refusals.bound(tokens).unwrap_or(0);
    if tokens > 0 {
        series.add_output_tokens(metrics, source, tokens);
    }
    if let Some(prompt) = ledger.prompt_tokens.filter(|n| *n > 0) {
        add_saturating(series.prompt_tokens(metrics), prompt);
    }
    if let Some(reasoning) = ledger.reasoning_tokens.filter(|n| *n > 0) {
        add_saturating(series.reasoning_tokens(metrics), reasoning);
    }
    if let Some(prompt) = ledger.prompt_tokens {
        series.request_tokens(metrics, true).observe(prompt as f64);
    }
    if tokens > 0 || ledger.usage_tokens.is_some() {
        series.request_tokens(metrics, false).observe(tokens as f64);
    }
    if let Some((first, last)) = ledger.point.token_span() {
        if tokens >= 2 {
            let tpot = last.saturating_duration_since(first).as_secs_f64() / (tokens - 1) as f64;
            series.tpot(metrics).observe(tpot);
        }
    }
    let [over_bound, decreased] = ledger.usage_refusals.by_reason();
    for (count, kind) in [
        (ledger.unparsed_events, "invalid"),
        (ledger.oversize_events, "oversize"),
        over_bound,
        decreased,
    ] {
        if count > 0 {
            add_saturating(
                &metrics.unparsed_events.with_label_values(&[route, kind]),
                count,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::HistogramFamily;

    /// Merges the same samples through a `LocalHistogram` (label "full") and through
    /// `SmallCounts` (label "small") and compares what the family holds.
    fn same_merge(values: &[u32]) {
        let bounds = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 12.0, 16.0, 32.0, 64.0];
        let family = HistogramFamily::new("t", "help", &["kind"], &bounds).unwrap();
        let mut full = LocalHistogram::default();
        let mut small = SmallCounts::default();
        for value in values {
            full.observe(&bounds, f64::from(*value));
            small.observe(&bounds, *value);
        }
        let local = small.to_local(&bounds);
        assert_eq!(local.count(), full.count());
        assert_eq!(local.sum().to_bits(), full.sum().to_bits());
        family.merge(&["full"], &full);
        family.merge(&["small"], &local);
        let (full_counts, full_sum) = family.totals(&[(0, "full")]);
        let (small_counts, small_sum) = family.totals(&[(0, "small")]);
        assert_eq!(small_counts, full_counts);
        assert_eq!(small_sum.to_bits(), full_sum.to_bits());
    }

    /// The metrics with the default buckets, as a test's ledgers record into.
    fn default_metrics() -> Metrics {
        Metrics::new(
            &crate::metrics::Buckets::default(),
            crate::metrics::ModelLabels::new(&[], 10),
            Duration::from_millis(200),
        )
        .unwrap()
    }

    /// One xorshift step: the tests' reproducible stream of pseudo-random numbers.
    fn next(x: &mut u64) {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
    }

    /// What a family holds, for comparing two metrics: per series, the classic counts, the
    /// native buckets and the sum.
    fn held(family: &HistogramFamily) -> Vec<(Vec<u64>, Option<String>, f64)> {
        family
            .snapshot(false)
            .into_iter()
            .map(|s| (s.counts, s.native.map(|n| format!("{n:?}")), s.sum))
            .collect()
    }

    proptest::proptest! {
        /// The live flush splits a stream's figures at any frames; what the metrics hold at the
        /// end is what one record at the end gives: every gap, stall and frame counted once.
        #[test]
        fn flushing_at_any_frames_counts_every_figure_exactly_once(
            frames in proptest::collection::vec(
                (0u64..600_000_000, proptest::collection::vec(0usize..3, 0..4)),
                1..200,
            ),
            flushes in proptest::collection::vec(proptest::bool::weighted(0.2), 200),
        ) {
            let (flushed, once) = (default_metrics(), default_metrics());
            let (fs, os) = (flushed.stream_series.get("r", "m"), once.stream_series.get("r", "m"));
            let (mut a, mut b) = (PointLedger::default(), PointLedger::default());
            let received = Tick::now();
            let stream = Exemplar { stream_id: "s", trace_id: None, value: 0.0 };
            let to = |metrics, series| Target { metrics, series, received, with_ttft: true, stream };
            let mut at = received;
            for (i, (gap, phases)) in frames.iter().enumerate() {
                at = at.saturating_add(Duration::from_nanos(*gap));
                let (events, mix) = mix_of(phases);
                for (point, metrics) in [(&mut a, &flushed), (&mut b, &once)] {
                    point.bytes(at);
                    point.token_events(at, events, mix, metrics);
                    point.events_in_frame(events, metrics);
                }
                if flushes[i] {
                    a.flush(&to(&flushed, &fs), Point::Ingress);
                }
            }
            a.record(&to(&flushed, &fs), Point::Ingress);
            b.record(&to(&once, &os), Point::Ingress);
            for (x, y) in [
                (&flushed.itl, &once.itl),
                (&flushed.ttft, &once.ttft),
                (&flushed.ttfo, &once.ttfo),
                (&flushed.reasoning_duration, &once.reasoning_duration),
                (&flushed.ttfb, &once.ttfb),
                (&flushed.stall_duration, &once.stall_duration),
                (&flushed.events_per_frame, &once.events_per_frame),
                (&flushed.jank, &once.jank),
            ] {
                let (x, y) = (held(x), held(y));
                proptest::prop_assert_eq!(x.len(), y.len());
                for (x, y) in x.iter().zip(&y) {
                    proptest::prop_assert_eq!((&x.0, &x.1), (&y.0, &y.1));
                    // Flushes add the same gaps' sum in pieces: equal up to rounding.
                    proptest::prop_assert!((x.2 - y.2).abs() <= 1e-9 * y.2.abs().max(1.0));
                }
            }
            let stalls = |m: &Metrics| -> u64 {
                Phase::ALL
                    .iter()
                    .map(|p| m.stalls.with_label_values(&["r", "m", "ingress", p.as_str()]).get())
                    .sum()
            };
            proptest::prop_assert_eq!(stalls(&flushed), stalls(&once));
            proptest::prop_assert_eq!(stalls(&flushed), a.stall_count());
        }

        /// For any sequence of token events of any phases in any frames, flushed at any
        /// frames, the per-phase gaps and stalls sum to what the same frames give without phases
        /// (bucket for bucket), and each phase gets exactly the gaps that end at its events.
        #[test]
        fn per_phase_counts_sum_to_the_counts_without_phases(
            frames in proptest::collection::vec(
                (0u64..600_000_000, proptest::collection::vec(0usize..3, 0..5)),
                1..150,
            ),
            flushes in proptest::collection::vec(proptest::bool::weighted(0.2), 150),
        ) {
            let (phased, plain) = (default_metrics(), default_metrics());
            let (ps, ls) = (phased.stream_series.get("r", "m"), plain.stream_series.get("r", "m"));
            let (mut a, mut b) = (PointLedger::default(), PointLedger::default());
            let received = Tick::now();
            let stream = Exemplar { stream_id: "s", trace_id: None, value: 0.0 };
            let to = |metrics, series| Target { metrics, series, received, with_ttft: true, stream };
            let mut at = received;
            let mut want = [0u64; 3];
            let mut seen_token = false;
            for (i, (gap, phases)) in frames.iter().enumerate() {
                at = at.saturating_add(Duration::from_nanos(*gap));
                let (events, mix) = mix_of(phases);
                a.token_events(at, events, mix, &phased);
                b.token_events(at, events, PhaseMix::ALL_CONTENT, &plain);
                for (k, p) in phases.iter().enumerate() {
                    // Every token event but the stream's first ends a gap, in its phase.
                    if seen_token || k > 0 {
                        want[*p] += 1;
                    }
                }
                seen_token |= events > 0;
                if flushes[i] {
                    a.flush(&to(&phased, &ps), Point::Ingress);
                }
            }
            a.record(&to(&phased, &ps), Point::Ingress);
            b.record(&to(&plain, &ls), Point::Ingress);
            let (all_counts, all_sum) = plain.itl.totals(&[]);
            let (counts, sum) = phased.itl.totals(&[]);
            proptest::prop_assert_eq!(&counts, &all_counts);
            proptest::prop_assert!((sum - all_sum).abs() <= 1e-9 * all_sum.abs().max(1.0));
            for phase in Phase::ALL {
                let (counts, _) = phased.itl.totals(&[(3, phase.as_str())]);
                proptest::prop_assert_eq!(counts.iter().sum::<u64>(), want[phase.index()], "{:?}", phase);
            }
            let stalls = |m: &Metrics| -> u64 {
                Phase::ALL
                    .iter()
                    .map(|p| m.stalls.with_label_values(&["r", "m", "ingress", p.as_str()]).get())
                    .sum()
            };
            proptest::prop_assert_eq!(stalls(&phased), stalls(&plain));
            let (stall_counts, _) = phased.stall_duration.totals(&[]);
            proptest::prop_assert_eq!(stall_counts, plain.stall_duration.totals(&[]).0);
            // TTFO: at the first frame with an event that is not reasoning.
            let first_output = frames
                .iter()
                .scan(received, |at, (gap, phases)| {
                    *at = at.saturating_add(Duration::from_nanos(*gap));
                    Some((*at, phases))
                })
                .find(|(_, phases)| phases.iter().any(|p| *p != 0))
                .map(|(at, _)| at.saturating_duration_since(received));
            proptest::prop_assert_eq!(a.ttfo(received), first_output);
        }
    }

    /// The token event count and mix of a frame whose token events have the phases `phases`
    /// (indices into `Phase::ALL`), as the meter builds it.
    fn mix_of(phases: &[usize]) -> (u32, PhaseMix) {
        let mut mix = PhaseMix::ALL_CONTENT;
        for (i, p) in phases.iter().enumerate() {
            let phase = Phase::ALL[*p];
            if phase != Phase::Content {
                mix.add(phase, i == 0);
            }
        }
        (phases.len() as u32, mix)
    }

    /// A flush or a record with nothing to merge makes no series: `/metrics` shows a series
    /// only once something was counted in it (a slot of the stream's series is made on first
    /// use, so the callers check before they take one).
    #[test]
    fn merging_nothing_makes_no_series() {
        let metrics = default_metrics();
        let series = metrics.stream_series.get("r", "m");
        let to = Target {
            metrics: &metrics,
            series: &series,
            received: Tick::now(),
            with_ttft: true,
            stream: Exemplar {
                stream_id: "s",
                trace_id: None,
                value: 0.0,
            },
        };
        PointLedger::default().flush(&to, Point::Ingress);
        EgressLedger::default().flush_delays(&to);
        record_ingress(&mut IngressLedger::default(), &to);
        for family in [
            &metrics.events_per_frame,
            &metrics.proxy_delay,
            &metrics.tokens_per_event,
            &metrics.itl,
            &metrics.ttft,
            &metrics.ttfb,
        ] {
            assert!(family.snapshot(false).is_empty(), "{}", family.name());
        }
    }

    #[test]
    fn a_reasoning_stream_has_ttfo_at_its_answer_and_a_reasoning_duration() {
        let metrics = default_metrics();
        let mut point = PointLedger::default();
        let received = Tick::now();
        let ms = |n| received.saturating_add(Duration::from_millis(n));
        let (_, reasoning) = mix_of(&[0]);
        let (_, answer) = mix_of(&[1]);
        for i in 0..4 {
            point.token_events(ms(100 + i * 10), 1, reasoning, &metrics);
        }
        assert_eq!(
            point.ttfo(received),
            None,
            "cut off while reasoning: no TTFO"
        );
        point.token_events(ms(500), 1, answer, &metrics);
        point.token_events(ms(510), 1, PhaseMix::ALL_CONTENT, &metrics);
        assert_eq!(point.ttft(received), Some(Duration::from_millis(100)));
        assert_eq!(point.ttfo(received), Some(Duration::from_millis(500)));
        assert_eq!(point.reasoning_duration(), Some(Duration::from_millis(30)));
        assert_eq!(point.pending_gaps_by_phase(), [3, 2, 0]);
        assert_eq!(
            point.stall_count(),
            1,
            "the think pause ends at an answer event"
        );
    }

    #[test]
    fn small_counts_merge_exactly_as_a_local_histogram() {
        same_merge(&[]);
        same_merge(&[1; 1000]);
        let mut x: u64 = 11;
        let values: Vec<u32> = (0..5000)
            .map(|_| {
                next(&mut x);
                match x % 10 {
                    0 => (x >> 20) as u32, // any value, up to u32::MAX
                    1 => 0,
                    2..=4 => 1,
                    _ => (x % 100) as u32,
                }
            })
            .collect();
        same_merge(&values);
        assert!(std::mem::size_of::<SmallCounts>() <= 40);
    }

    #[test]
    fn the_gap_histogram_is_what_adding_each_gap_would_give() {
        let metrics = default_metrics();
        let bounds = metrics.itl.bounds().to_vec();
        let mut point = PointLedger::default();
        let mut each = LocalHistogram::default();
        let mut at = Tick::now();
        let mut last: Option<Tick> = None;
        let mut x: u64 = 7;
        for _ in 0..2_000 {
            next(&mut x);
            // Gaps from 0 to about 1 s, now and then a stall; 1 to 4 token events a frame, now
            // and then a frame without one.
            at = at.saturating_add(Duration::from_nanos(match x % 50 {
                0 => 300_000_000,
                _ => (x >> 12) % 1_000_000_000,
            }));
            let token_events = ((x >> 40) % 5) as u32;
            point.token_events(at, token_events, PhaseMix::ALL_CONTENT, &metrics);
            if token_events > 0 {
                if let Some(last) = last {
                    each.observe(&bounds, at.secs_since(last));
                }
                // The frame's other token events came with the first: gaps of 0.
                each.observe_n(&bounds, 0.0, token_events - 1);
                last = Some(at);
            }
        }
        let itl = point.itl();
        assert_eq!(itl.count(), each.count());
        assert_eq!(itl.count(), point.token_event_count() - 1);
        let (sum, expected) = (itl.sum(), each.sum());
        assert!(
            (sum - expected).abs() < 1e-9 * expected,
            "{sum} against {expected}"
        );
        let family = HistogramFamily::new("t", "help", &["how"], &bounds).unwrap();
        family.merge(&["kept"], &itl);
        family.merge(&["each"], &each);
        assert_eq!(
            family.totals(&[(0, "kept")]).0,
            family.totals(&[(0, "each")]).0
        );
        assert_eq!(PointLedger::default().itl().count(), 0);
    }

    #[test]
    fn the_proxy_delay_histogram_is_what_observing_each_delay_would_give() {
        let metrics = default_metrics();
        let bounds = metrics.proxy_delay.bounds().to_vec();
        let mut egress = EgressLedger::default();
        let mut each = LocalHistogram::default();
        let mut at = Tick::now();
        let mut x: u64 = 11;
        for write in 0..2_000u64 {
            next(&mut x);
            at = at.saturating_add(Duration::from_millis(1));
            // Delays from 0 to about 2 s, spread over every power of ten, each bound exactly
            // now and then.
            let delay = match x % 8 {
                0 => Duration::from_secs_f64(bounds[(x >> 8) as usize % bounds.len()]),
                _ => Duration::from_nanos(((x >> 12) % 2_000_000_000) >> ((x >> 4) % 30)),
            };
            let ingress = Tick::from_instant(at.to_instant() - delay);
            let stamp = FrameStamp {
                ingress,
                events: 1,
                token_events: 1,
                mix: PhaseMix::ALL_CONTENT,
                seq: None,
            };
            egress.frame(at, write, &stamp, at, &metrics);
            each.observe(&bounds, at.secs_since(ingress));
        }
        assert_eq!(egress.proxy_delay.count(), each.count());
        let family = HistogramFamily::new("t", "help", &["how"], &bounds).unwrap();
        family.merge(&["kept"], &egress.proxy_delay);
        family.merge(&["each"], &each);
        let (kept, each) = (
            family.totals(&[(0, "kept")]).0,
            family.totals(&[(0, "each")]).0,
        );
        assert_eq!(kept, each);
        assert!(
            each.iter().filter(|c| **c > 0).count() > bounds.len() / 2,
            "{each:?}"
        );
    }

    #[test]
    fn a_counter_that_would_saturate_goes_to_the_full_histogram() {
        let bounds = [1.0, 2.0];
        let mut small = SmallCounts::default();
        small.counts[0] = u32::MAX - 1;
        small.observe(&bounds, 1);
        small.observe(&bounds, 1);
        small.observe(&bounds, 1);
        assert_eq!(small.counts[0], u32::MAX);
        let local = small.to_local(&bounds);
        assert_eq!(local.count(), u64::from(u32::MAX) + 2);
        assert_eq!(local.sum(), f64::from(u32::MAX) + 2.0);
    }
}
