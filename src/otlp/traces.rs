//! One span per stream (`[otlp] traces = true`): the W3C trace context continued from the
//! client and injected upstream, and the tail decision at the stream's end.
//!
//! Per request: a `traceparent` parsed and one written (two random IDs). Per stream, at its
//! end and only when it is kept: what the span needs is copied into a bounded queue, which
//! drops (and counts the drop) rather than waits when the exporter falls behind. Nothing is
//! done per frame: the stall events are read from the stream's timeline after it ended.

use crate::poison::LockExt;
use std::sync::{Arc, Mutex};

use http::{HeaderMap, HeaderValue};
use prometheus::{IntCounterVec, Opts};
use rand::RngCore;

use crate::metrics::Metrics;
use crate::timeline::FinishedStream;

/// A span's place in its trace: what a `traceparent` carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanContext {
    /// The trace (the client's, or a new one).
    pub trace_id: [u8; 16],
    /// metronome's span for the stream.
    pub span_id: [u8; 8],
    /// The client's span, when it sent a `traceparent`.
    pub parent: Option<[u8; 8]>,
    /// Whether the trace is sampled: the parent's flag, or true for a new trace.
    pub sampled: bool,
}

fn hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Lowercase hex of `bytes`.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

// === impl SpanContext ===

impl SpanContext {
    /// The context of a new span under `traceparent` (`00-trace-parent-flags`); a new trace
    /// when there is none or it is malformed (all-zero IDs included).
    pub fn continue_from(traceparent: Option<&str>) -> Self {
        let mut rng = rand::thread_rng();
        let mut span_id = [0u8; 8];
        while span_id == [0; 8] {
            rng.fill_bytes(&mut span_id);
        }
        let parsed = traceparent.and_then(|t| {
            let mut parts = t.trim().split('-');
            let version = parts.next()?;
            let (trace, parent, flags) = (parts.next()?, parts.next()?, parts.next()?);
            if version.len() != 2 || version == "ff" || (version == "00" && parts.next().is_some())
            {
                return None;
            }
            let trace: [u8; 16] = hex(trace).filter(|t| *t != [0; 16])?;
            let parent: [u8; 8] = hex(parent).filter(|p| *p != [0; 8])?;
            let flags: [u8; 1] = hex(flags)?;
            Some((trace, parent, flags[0] & 1 == 1))
        });
        match parsed {
            Some((trace_id, parent, sampled)) => SpanContext {
                trace_id,
                span_id,
                parent: Some(parent),
                sampled,
            },
            None => {
                let mut trace_id = [0u8; 16];
                while trace_id == [0; 16] {
                    rng.fill_bytes(&mut trace_id);
                }
                SpanContext {
                    trace_id,
                    span_id,
                    parent: None,
                    sampled: true,
                }
            }
        }
    }

    /// The `traceparent` naming this span as the parent (what the upstream gets).
    pub fn traceparent(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            to_hex(&self.trace_id),
            to_hex(&self.span_id),
            u8::from(self.sampled)
        )
    }

    /// Puts this span's `traceparent` on the upstream request, in place of the client's.
    pub fn inject(&self, headers: &mut HeaderMap) {
        if let Ok(value) = HeaderValue::from_str(&self.traceparent()) {
            headers.insert("traceparent", value);
        }
    }
}

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

    /// The tail decision for a stream that ended: kept when its trace is sampled, it stalled or
    /// it failed; then queued, or dropped and counted when the queue is full.
    pub fn offer(&self, stream: &FinishedStream) {
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
    use super::*;

    #[test]
    fn a_client_traceparent_is_continued_with_a_new_span() {
        let incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let c = SpanContext::continue_from(Some(incoming));
        assert_eq!(to_hex(&c.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(
            c.parent.map(|p| to_hex(&p)).as_deref(),
            Some("00f067aa0ba902b7")
        );
        assert!(c.sampled);
        let out = c.traceparent();
        assert!(out.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));
        assert!(out.ends_with("-01"));
        assert_ne!(&out[36..52], "00f067aa0ba902b7");
        let unsampled = SpanContext::continue_from(Some(&incoming.replace("-01", "-00")));
        assert!(!unsampled.sampled && unsampled.traceparent().ends_with("-00"));
    }

    #[test]
    fn a_malformed_or_absent_traceparent_starts_a_sampled_trace() {
        for bad in [
            None,
            Some("garbage"),
            Some("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"),
            Some("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        ] {
            let c = SpanContext::continue_from(bad);
            assert_eq!(c.parent, None, "{bad:?}");
            assert!(c.sampled);
            assert_ne!(c.trace_id, [0; 16]);
        }
    }
}
