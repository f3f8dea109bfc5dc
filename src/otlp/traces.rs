//! One span per stream (`[otlp] traces = true`): the tail decision at the stream's end and the
//! bounded queue to the exporter (the W3C trace context itself is `crate::trace_context`).
//!
//! Per request: a `traceparent` parsed and one written (two random IDs). Per stream, at its
//! end and only when it is kept: what the span needs is copied into a bounded queue, which
//! drops (and counts the drop) rather than waits when the exporter falls behind. Nothing is
//! done per frame: the stall events are read from the stream's timeline after it ended.

use crate::poison::LockExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use prometheus::{IntCounterVec, Opts};

use crate::format::PhaseMix;
use crate::metrics::Metrics;
use crate::timeline::{FinishedSink, FinishedStream};
use crate::trace_context::SpanContext;

/// A gap longer than the stall threshold, as a span event.
#[derive(Debug, Clone, PartialEq)]
pub struct StallEvent {
    /// `ingress` or `egress`.
    pub point: &'static str,
    /// When the gap began (the token event before it), µs since the request arrived.
    pub start_us: u64,
    /// Its length in µs.
    pub length_us: u64,
    /// The phase of the token event that ended it.
    pub phase: &'static str,
}

/// What the span of one ended stream needs.
#[derive(Debug, Clone)]
pub struct EndedStream {
    /// Its trace context.
    pub context: SpanContext,
    /// When the request arrived, ns since the Unix epoch.
    pub start_unix_nanos: u64,
    /// How long it lasted, µs.
    pub duration_us: u64,
    /// The stream ID (`/streams/{id}`, the exemplars).
    pub stream_id: Arc<str>,
    /// The route label.
    pub route: Arc<str>,
    /// The model label.
    pub model: Arc<str>,
    /// The outcome label.
    pub outcome: &'static str,
    /// Time to the first token event at egress, µs.
    pub ttft_egress_us: Option<u64>,
    /// Time to the first output token (not reasoning) at egress, µs.
    pub ttfo_egress_us: Option<u64>,
    /// First to last reasoning token event at egress, µs, for a stream that reasoned.
    pub reasoning_egress_us: Option<u64>,
    /// Reasoning tokens, as the server's usage reported them.
    pub reasoning_tokens: Option<u64>,
    /// Output tokens (usage or counted).
    pub output_tokens: u64,
    /// Token events.
    pub token_events: u64,
    /// The stalls at both points among the frames the timeline kept, the first
    /// [`MAX_SPAN_STALLS`] by start.
    pub stalls: Vec<StallEvent>,
    /// Stalls beyond [`MAX_SPAN_STALLS`], left out (the span's `dropped_events_count`).
    pub dropped_stalls: u32,
}

/// Stall events one span carries at most: OpenTelemetry's default span event count limit
/// (`OTEL_SPAN_EVENT_COUNT_LIMIT`, 128). It bounds what a stream that stalls at every frame puts
/// in the queue and in an export (a few kilobytes rather than tens).
pub const MAX_SPAN_STALLS: usize = 128;

/// An ended stream waiting in the span queue, with its share of the queue's byte bound, given
/// back when it is dropped (sent, or refused by the receiver).
#[derive(Debug)]
pub struct Queued {
    /// The stream.
    pub stream: EndedStream,
    _charge: Charge,
}

/// Bytes held against the queue's bound while a [`Queued`] lives.
#[derive(Debug)]
struct Charge {
    bytes: usize,
    held: Arc<AtomicUsize>,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.held.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// What one queued stream holds in memory, estimated from what it owns: its slot in the channel
/// (the whole struct), its stall events' buffer, and its stream ID with the `Arc`'s counts (the
/// registry's ring may let go of the ID first). Its route and model are labels the metrics keep
/// anyway.
fn queued_bytes(stream: &EndedStream) -> usize {
    std::mem::size_of::<Queued>()
        + stream.stalls.capacity() * std::mem::size_of::<StallEvent>()
        + stream.stream_id.len()
        + 2 * std::mem::size_of::<usize>()
}

/// Whether a stream that ended this way is kept whatever its trace's sampling said.
pub fn failed(outcome: &str) -> bool {
    matches!(outcome, "upstream_error" | "upstream_timeout")
}

/// The stalls among a stream's kept frames: gaps between consecutive token-bearing frames
/// longer than `threshold_us`, at ingress and (for frames that got a stamp) at egress.
pub fn stalls(stream: &FinishedStream, threshold_us: u64) -> Vec<StallEvent> {
    let records = stream.frames.records();
    let mut out = Vec::new();
    for (point, stamps) in [
        (
            "ingress",
            records
                .iter()
                .filter(|f| f.token_events > 0)
                .map(|f| Some((f.ingress_us, f.mix)))
                .collect::<Vec<_>>(),
        ),
        (
            "egress",
            records
                .iter()
                .filter(|f| f.token_events > 0)
                .map(|f| f.egress_us.map(|at| (at, f.mix)))
                .collect(),
        ),
    ] {
        let stamps: Vec<(u64, PhaseMix)> = stamps
            .into_iter()
            .flatten()
            .map(|(at, mix)| (u64::from(at), mix))
            .collect();
        for pair in stamps.windows(2) {
            let gap = pair[1].0.saturating_sub(pair[0].0);
            if gap > threshold_us {
                out.push(StallEvent {
                    point,
                    start_us: pair[0].0,
                    length_us: gap,
                    phase: pair[1].1.first().as_str(),
                });
            }
        }
    }
    out
}

/// The producer side of the span queue: shared by every worker, fed at each stream's end.
/// Bounded twice: by streams (`otlp.traces_queue`, the channel's capacity) and by the bytes they
/// hold (`otlp.traces_queue_bytes`), until the exporter has sent them or given up on them.
pub struct SpanSink {
    metrics: Arc<Metrics>,
    sender: tokio::sync::mpsc::Sender<Queued>,
    /// Taken once by the exporter task.
    receiver: Mutex<Option<tokio::sync::mpsc::Receiver<Queued>>>,
    /// Bytes the queued streams (and a batch being sent) hold now.
    held: Arc<AtomicUsize>,
    /// The most `held` may reach.
    max_bytes: usize,
    /// `metronome_otlp_spans_dropped_total{reason}`.
    pub dropped: IntCounterVec,
}

impl std::fmt::Debug for SpanSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpanSink")
            .field("capacity", &self.sender.max_capacity())
            .finish()
    }
}

// === impl SpanSink ===

impl SpanSink {
    /// A queue of at most `capacity` ended streams holding at most `max_bytes`; registers the
    /// drop counter in `metrics`.
    pub fn new(
        metrics: Arc<Metrics>,
        capacity: usize,
        max_bytes: usize,
    ) -> prometheus::Result<Arc<Self>> {
        let dropped = IntCounterVec::new(
            Opts::new(
                "metronome_otlp_spans_dropped_total",
                "Stream spans not exported, by reason: queue_full (the export queue held otlp.traces_queue streams), queue_bytes (it held otlp.traces_queue_bytes), each dropped rather than waited for; export_failed (the receiver was down, slow or refused).",
            ),
            &["reason"],
        )?;
        for reason in ["queue_full", "queue_bytes", "export_failed"] {
            dropped.with_label_values(&[reason]);
        }
        metrics.register(Box::new(dropped.clone()))?;
        let (sender, receiver) = tokio::sync::mpsc::channel(capacity.max(1));
        Ok(Arc::new(SpanSink {
            metrics,
            sender,
            receiver: Mutex::new(Some(receiver)),
            held: Arc::new(AtomicUsize::new(0)),
            max_bytes,
            dropped,
        }))
    }

    /// The receiving end, for the exporter (once).
    pub fn take_receiver(&self) -> Option<tokio::sync::mpsc::Receiver<Queued>> {
        self.receiver.lock_or_recover().take()
    }

    /// Bytes the queued streams hold now (at most `otlp.traces_queue_bytes`).
    pub fn queued_bytes(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Queues `stream` when both bounds allow it; otherwise drops it and counts why.
    fn queue(&self, stream: EndedStream) {
        let bytes = queued_bytes(&stream);
        let max = self.max_bytes;
        let charged = self
            .held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                held.checked_add(bytes).filter(|after| *after <= max)
            });
        if charged.is_err() {
            self.dropped.with_label_values(&["queue_bytes"]).inc();
            return;
        }
        let queued = Queued {
            stream,
            _charge: Charge {
                bytes,
                held: self.held.clone(),
            },
        };
        // A refused send drops `queued`, and with it the charge.
        if self.sender.try_send(queued).is_err() {
            self.dropped.with_label_values(&["queue_full"]).inc();
        }
    }
}

impl FinishedSink for SpanSink {
    /// The tail decision for a stream that ended: kept when its trace is sampled, it stalled or
    /// it failed; then queued, or dropped and counted when the queue is full in streams or bytes.
    fn offer(&self, stream: &FinishedStream) {
        let Some(context) = stream.span else {
            return;
        };
        let stalled = stream.stalls.ingress + stream.stalls.egress > 0;
        if !(context.sampled || stalled || failed(stream.outcome)) {
            return;
        }
        let threshold_us = self.metrics.stall_threshold_nanos() / 1_000;
        let mut stall_events = if stalled {
            stalls(stream, threshold_us)
        } else {
            Vec::new()
        };
        let dropped_stalls = stall_events.len().saturating_sub(MAX_SPAN_STALLS);
        if dropped_stalls > 0 {
            stall_events.sort_by_key(|s| s.start_us);
            stall_events.truncate(MAX_SPAN_STALLS);
            stall_events.shrink_to_fit();
        }
        let ended = EndedStream {
            context,
            start_unix_nanos: stream.started_unix_nanos(),
            duration_us: stream.duration_us,
            stream_id: stream.id.clone(),
            route: stream.route.clone(),
            model: stream.model.clone(),
            outcome: stream.outcome,
            ttft_egress_us: stream.ttft_us.egress,
            ttfo_egress_us: stream.ttfo_us.egress,
            reasoning_egress_us: stream.reasoning_us.egress,
            reasoning_tokens: stream.reasoning_tokens,
            output_tokens: stream.output_tokens,
            token_events: stream.token_events,
            stalls: stall_events,
            dropped_stalls: u32::try_from(dropped_stalls).unwrap_or(u32::MAX),
        };
        self.queue(ended);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::timeline::tests as timeline;
    use crate::timeline::{
        EgressStamps, IngressFrame, IngressTimeline, StreamFrames, StreamRegistry,
    };

    #[test]
    fn finished_streams_feed_a_bounded_span_queue_that_drops_and_counts() {
        let metrics = metrics_with_stall_threshold(Duration::from_millis(200));
        let sink = SpanSink::new(metrics, 1, 1 << 20).unwrap();
        let registry = StreamRegistry::new(4, 16).with_sink(Some(sink.clone()));
        let sampled = SpanContext::continue_from(None);
        let unsampled = SpanContext {
            sampled: false,
            ..sampled
        };
        let with = |id: &str, span: SpanContext, outcome: &'static str| FinishedStream {
            span: Some(span),
            outcome,
            ..timeline::finished(id)
        };
        registry.finished(with("unsampled", unsampled, "complete"));
        registry.finished(with("first", sampled, "complete"));
        registry.finished(with("queue-full", sampled, "complete"));
        registry.finished(with("failed", unsampled, "upstream_error"));
        let mut queue = sink.take_receiver().unwrap();
        assert_eq!(&*queue.try_recv().unwrap().stream.stream_id, "first");
        assert!(queue.try_recv().is_err());
        // The unsampled stream was not kept; the two kept ones behind a full queue were dropped.
        assert_eq!(sink.dropped.with_label_values(&["queue_full"]).get(), 2);
    }

    fn metrics_with_stall_threshold(threshold: Duration) -> Arc<Metrics> {
        let models = crate::metrics::ModelLabels::new(&[], 8);
        let buckets = crate::metrics::Buckets::default();
        Arc::new(Metrics::new(&buckets, models, threshold).unwrap())
    }

    /// A finished stream of `frames` token frames 1 ms apart at ingress and egress, every gap
    /// a stall at a 0.5 ms threshold.
    fn stalling_at_every_frame(id: &str, frames: u32) -> FinishedStream {
        let mut ingress = IngressTimeline::default();
        let mut egress = EgressStamps::default();
        for i in 0..frames {
            ingress.push(IngressFrame {
                ingress_us: i * 1_000,
                bytes: 10,
                events: 1,
                token_events: 1,
                mix: Default::default(),
            });
            egress.set(i, i * 1_000, i * 1_000 + 10);
        }
        let mut stream = FinishedStream {
            span: Some(SpanContext::continue_from(None)),
            frames: StreamFrames::new(ingress, egress),
            ..timeline::finished(id)
        };
        stream.stalls.ingress = u64::from(frames) - 1;
        stream
    }

    #[test]
    fn the_span_queue_holds_at_most_its_bytes_and_counts_every_stream_it_drops() {
        let metrics = metrics_with_stall_threshold(Duration::from_micros(500));
        let bound = 64 * 1024;
        let sink = SpanSink::new(metrics, 4096, bound).unwrap();
        // Nothing takes from the queue: a receiver that never answers holds its batch as long.
        let mut queue = sink.take_receiver().unwrap();
        let offered = 200;
        for i in 0..offered {
            sink.offer(&stalling_at_every_frame(&format!("s{i}"), 1024));
            assert!(sink.queued_bytes() <= bound, "{}", sink.queued_bytes());
        }
        let mut kept = Vec::new();
        while let Ok(queued) = queue.try_recv() {
            kept.push(queued);
        }
        let dropped = sink.dropped.with_label_values(&["queue_bytes"]).get();
        assert_eq!(kept.len() as u64 + dropped, offered);
        assert!(kept.len() >= 10, "{} streams kept", kept.len());
        let first = &kept[0].stream;
        assert_eq!(first.stalls.len(), MAX_SPAN_STALLS);
        assert_eq!(first.dropped_stalls, 2 * 1023 - 128);
        assert!(first
            .stalls
            .windows(2)
            .all(|w| w[0].start_us <= w[1].start_us));
        // Sent (or given up on), the streams give their bytes back.
        drop(kept);
        assert_eq!(sink.queued_bytes(), 0);
    }

    /// A measurement, not a check (RELIABILITY.md): the resident set the span queue adds when
    /// 4,096 streams stalling at each of 1,024 frames end and nothing takes them (a receiver
    /// that never answers), at the default bounds. Run alone:
    /// `cargo test --lib queue_memory_at_the_default_bounds -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement of this process's memory: run alone"]
    fn queue_memory_at_the_default_bounds() {
        let rss = || {
            let status = std::fs::read_to_string("/proc/self/status").unwrap();
            let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
            line.split_whitespace()
                .nth(1)
                .unwrap()
                .parse::<u64>()
                .unwrap()
                * 1024
        };
        let metrics = metrics_with_stall_threshold(Duration::from_micros(500));
        let defaults = crate::config::otlp::RawOtlp::default();
        let sink =
            SpanSink::new(metrics, defaults.traces_queue, defaults.traces_queue_bytes).unwrap();
        let _queue = sink.take_receiver().unwrap();
        let stream = stalling_at_every_frame("s", 1024);
        let before = rss();
        for _ in 0..4096 {
            sink.offer(&stream);
        }
        let dropped = |reason| sink.dropped.with_label_values(&[reason]).get();
        println!(
            "4096 stall-heavy streams queued: resident set +{} KiB, {} bytes accounted, dropped {} for bytes and {} for count",
            (rss() - before) / 1024,
            sink.queued_bytes(),
            dropped("queue_bytes"),
            dropped("queue_full")
        );
    }

    #[test]
    fn stall_events_are_the_long_gaps_between_token_frames() {
        let mut ingress = IngressTimeline::default();
        for (at, tokens) in [(0, 1), (10_000, 1), (20_000, 0), (710_000, 1)] {
            ingress.push(IngressFrame {
                ingress_us: at,
                bytes: 10,
                events: 1,
                token_events: tokens,
                mix: Default::default(),
            });
        }
        let stream = FinishedStream {
            frames: StreamFrames::new(ingress, EgressStamps::default()),
            ..timeline::finished("s")
        };
        let stalls = stalls(&stream, 200_000);
        assert_eq!(
            stalls,
            [StallEvent {
                point: "ingress",
                start_us: 10_000,
                length_us: 700_000,
                phase: "content",
            }]
        );
    }
}
