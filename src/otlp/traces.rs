//! One span per stream (`[otlp] traces = true`): the tail decision at the stream's end and the
//! bounded queue to the exporter (the W3C trace context itself is `crate::trace_context`).
//!
//! Per request: a `traceparent` parsed and one written (two random IDs). Per stream, at its
//! end and only when it is kept: what the span needs is copied into a bounded queue, which
//! drops (and counts the drop) rather than waits when the exporter falls behind. Nothing is
//! done per frame: the stall events are read from the stream's timeline after it ended.

use crate::poison::LockExt;
use std::sync::{Arc, Mutex};

use prometheus::{IntCounterVec, Opts};

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
    /// Output tokens (usage or counted).
    pub output_tokens: u64,
    /// Token events.
    pub token_events: u64,
    /// Every stall at both points, among the frames the timeline kept.
    pub stalls: Vec<StallEvent>,
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
                .map(|f| Some(f.ingress_us))
                .collect::<Vec<_>>(),
        ),
        (
            "egress",
            records
                .iter()
                .filter(|f| f.token_events > 0)
                .map(|f| f.egress_us)
                .collect(),
        ),
    ] {
        let stamps: Vec<u64> = stamps.into_iter().flatten().map(u64::from).collect();
        for pair in stamps.windows(2) {
            let gap = pair[1].saturating_sub(pair[0]);
            if gap > threshold_us {
                out.push(StallEvent {
                    point,
                    start_us: pair[0],
                    length_us: gap,
                });
            }
        }
    }
    out
}

/// The producer side of the span queue: shared by every worker, fed at each stream's end.
pub struct SpanSink {
    metrics: Arc<Metrics>,
    sender: tokio::sync::mpsc::Sender<EndedStream>,
    /// Taken once by the exporter task.
    receiver: Mutex<Option<tokio::sync::mpsc::Receiver<EndedStream>>>,
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
    /// A queue of at most `capacity` ended streams; registers the drop counter in `metrics`.
    pub fn new(metrics: Arc<Metrics>, capacity: usize) -> prometheus::Result<Arc<Self>> {
        let dropped = IntCounterVec::new(
            Opts::new(
                "metronome_otlp_spans_dropped_total",
                "Stream spans not exported, by reason: queue_full (the bounded export queue was full, the span was dropped rather than waited for) or export_failed (the receiver was down, slow or refused).",
            ),
            &["reason"],
        )?;
        for reason in ["queue_full", "export_failed"] {
            dropped.with_label_values(&[reason]);
        }
        metrics.register(Box::new(dropped.clone()))?;
        let (sender, receiver) = tokio::sync::mpsc::channel(capacity.max(1));
        Ok(Arc::new(SpanSink {
            metrics,
            sender,
            receiver: Mutex::new(Some(receiver)),
            dropped,
        }))
    }

    /// The receiving end, for the exporter (once).
    pub fn take_receiver(&self) -> Option<tokio::sync::mpsc::Receiver<EndedStream>> {
        self.receiver.lock_or_recover().take()
    }
}

impl FinishedSink for SpanSink {
    /// The tail decision for a stream that ended: kept when its trace is sampled, it stalled or
    /// it failed; then queued, or dropped and counted when the queue is full.
    fn offer(&self, stream: &FinishedStream) {
        let Some(context) = stream.span else {
            return;
        };
        let stalled = stream.stalls.ingress + stream.stalls.egress > 0;
        if !(context.sampled || stalled || failed(stream.outcome)) {
            return;
        }
        let threshold_us = self.metrics.stall_threshold_nanos() / 1_000;
        let ended = EndedStream {
            context,
            start_unix_nanos: stream.started_unix_nanos(),
            duration_us: stream.duration_us,
            stream_id: stream.id.clone(),
            route: stream.route.clone(),
            model: stream.model.clone(),
            outcome: stream.outcome,
            ttft_egress_us: stream.ttft_us.egress,
            output_tokens: stream.output_tokens,
            token_events: stream.token_events,
            stalls: if stalled {
                stalls(stream, threshold_us)
            } else {
                Vec::new()
            },
        };
        if self.sender.try_send(ended).is_err() {
            self.dropped.with_label_values(&["queue_full"]).inc();
        }
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
        let metrics = Arc::new(
            crate::metrics::Metrics::new(
                &crate::metrics::Buckets::default(),
                crate::metrics::ModelLabels::new(&[], 8),
                Duration::from_millis(200),
            )
            .unwrap(),
        );
        let sink = SpanSink::new(metrics, 1).unwrap();
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
        assert_eq!(&*queue.try_recv().unwrap().stream_id, "first");
        assert!(queue.try_recv().is_err());
        // The unsampled stream was not kept; the two kept ones behind a full queue were dropped.
        assert_eq!(sink.dropped.with_label_values(&["queue_full"]).get(), 2);
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
                length_us: 700_000
            }]
        );
    }
}
