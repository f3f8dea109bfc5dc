//! The span exporter: ended streams from the bounded queue become OTLP spans, POSTed in
//! batches to `{endpoint}/v1/traces`. A batch the receiver did not take is counted and dropped,
//! never retried into a growing backlog.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{
    span, status, ResourceSpans, ScopeSpans, Span, Status,
};
use prometheus::IntCounterVec;
use prost014::Message;
use tokio::sync::{mpsc, watch};

use super::names::{Naming, Value};
use super::traces::{failed, EndedStream, Queued, SpanSink};
use super::transport::{Signal, Transport};
use crate::batch::{BatchDetector, Episode, HitchMark};
use crate::metrics::counter::add_saturating;

/// Spans sent in one request at most.
const MAX_BATCH: usize = 512;
/// How long a span waits for others to share its request.
const FLUSH_EVERY: Duration = Duration::from_secs(1);

fn kv(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
        ..KeyValue::default()
    }
}

/// A batch episode (docs/batch.md) one stream was caught in, as an event of its span.
#[derive(Debug, Clone, PartialEq)]
pub struct EpisodeEvent {
    /// The upstream's label.
    pub upstream: Arc<str>,
    /// The episode's number on that upstream (as `/episodes` has it).
    pub episode: u64,
    /// When the stream's first hitch in it began, µs since the request arrived.
    pub start_us: u64,
    /// The stream's hitches in it, summed, µs.
    pub hitch_us: u64,
    /// The episode's figures while the detector still keeps it: streams caught, arrivals in its
    /// lookback, and its length once it has ended.
    pub episode_figures: Option<(usize, usize, Option<u64>)>,
}

/// The episodes a stream was caught in: its batch-scope hitches (`marks`, in order) grouped by
/// episode, with each episode's figures from `episodes` (the detector's) when it is still kept.
pub fn episode_events(marks: &[HitchMark], episodes: &[(Arc<str>, Episode)]) -> Vec<EpisodeEvent> {
    let mut out: Vec<EpisodeEvent> = Vec::new();
    for mark in marks {
        let Some(episode) = mark.episode else {
            continue;
        };
        let length = mark.to_us.saturating_sub(mark.from_us);
        if let Some(event) = out
            .iter_mut()
            .find(|e| e.episode == episode && e.upstream == mark.upstream)
        {
            event.hitch_us += length;
            continue;
        }
        let episode_figures = episodes
            .iter()
            .find(|(upstream, e)| e.id == episode && *upstream == mark.upstream)
            .map(|(_, e)| {
                let length = e
                    .end
                    .map(|end| u64::try_from((end - e.start) / 1_000).unwrap_or(0));
                (e.streams, e.arrivals, length)
            });
        out.push(EpisodeEvent {
            upstream: mark.upstream.clone(),
            episode,
            start_us: mark.from_us,
            hitch_us: length,
            episode_figures,
        });
    }
    out
}

fn episode_event(start_unix_nanos: u64, e: &EpisodeEvent) -> span::Event {
    let int = |n: u64| any_value::Value::IntValue(i64::try_from(n).unwrap_or(i64::MAX));
    let mut attributes = vec![
        kv(
            "metronome.batch.upstream",
            any_value::Value::StringValue(e.upstream.to_string()),
        ),
        kv("metronome.batch.episode", int(e.episode)),
        kv(
            "metronome.batch.hitch.length",
            any_value::Value::DoubleValue(e.hitch_us as f64 / 1e6),
        ),
    ];
    if let Some((streams, arrivals, length)) = e.episode_figures {
        attributes.push(kv("metronome.batch.episode.streams", int(streams as u64)));
        attributes.push(kv("metronome.batch.episode.arrivals", int(arrivals as u64)));
        if let Some(us) = length {
            attributes.push(kv(
                "metronome.batch.episode.length",
                any_value::Value::DoubleValue(us as f64 / 1e6),
            ));
        }
    }
    span::Event {
        time_unix_nano: start_unix_nanos + e.start_us * 1_000,
        name: "metronome.batch_episode".into(),
        attributes,
        ..span::Event::default()
    }
}

/// The span of one ended stream, with an event per stall and per batch episode it was caught in.
pub fn span(ended: &EndedStream, naming: &Naming, episodes: &[EpisodeEvent]) -> Span {
    let labels = [
        ("route".to_string(), ended.route.to_string()),
        ("model".to_string(), ended.model.to_string()),
    ];
    let mut operation = "chat".to_string();
    let mut attributes: Vec<KeyValue> = naming
        .genai_attributes(&labels)
        .into_iter()
        .map(|(k, v)| match v {
            Value::Str(s) => {
                if k == "gen_ai.operation.name" {
                    operation = s.clone();
                }
                kv(&k, any_value::Value::StringValue(s))
            }
            Value::Int(i) => kv(&k, any_value::Value::IntValue(i)),
        })
        .collect();
    let int = |n: u64| any_value::Value::IntValue(i64::try_from(n).unwrap_or(i64::MAX));
    attributes.extend([
        kv("gen_ai.request.stream", any_value::Value::BoolValue(true)),
        kv("gen_ai.usage.output_tokens", int(ended.output_tokens)),
        kv("metronome.token_events", int(ended.token_events)),
        kv(
            "metronome.stream_id",
            any_value::Value::StringValue(ended.stream_id.to_string()),
        ),
        kv(
            "metronome.outcome",
            any_value::Value::StringValue(ended.outcome.into()),
        ),
    ]);
    if let Some(ttft) = ended.ttft_egress_us {
        attributes.push(kv(
            "gen_ai.response.time_to_first_chunk",
            any_value::Value::DoubleValue(ttft as f64 / 1e6),
        ));
    }
    let seconds = |us: u64| any_value::Value::DoubleValue(us as f64 / 1e6);
    if let Some(ttfo) = ended.ttfo_egress_us {
        attributes.push(kv("metronome.time_to_first_output_token", seconds(ttfo)));
    }
    if let Some(reasoning) = ended.reasoning_egress_us {
        attributes.push(kv("metronome.reasoning.duration", seconds(reasoning)));
    }
    if let Some(tokens) = ended.reasoning_tokens {
        attributes.push(kv("gen_ai.usage.reasoning.output_tokens", int(tokens)));
    }
    let is_failure = failed(ended.outcome);
    if is_failure {
        attributes.push(kv(
            "error.type",
            any_value::Value::StringValue(ended.outcome.into()),
        ));
    }
    let start = ended.start_unix_nanos;
    let stall_events = ended.stalls.iter().map(|s| span::Event {
        time_unix_nano: start + s.start_us * 1_000,
        name: "metronome.stall".into(),
        attributes: vec![
            kv(
                "metronome.stall.point",
                any_value::Value::StringValue(s.point.into()),
            ),
            kv(
                "metronome.stall.length",
                any_value::Value::DoubleValue(s.length_us as f64 / 1e6),
            ),
            kv(
                "metronome.stall.phase",
                any_value::Value::StringValue(s.phase.into()),
            ),
        ],
        ..span::Event::default()
    });
    let mut events: Vec<span::Event> = stall_events
        .chain(episodes.iter().map(|e| episode_event(start, e)))
        .collect();
    events.sort_by_key(|e| e.time_unix_nano);
    Span {
        trace_id: ended.context.trace_id.to_vec(),
        span_id: ended.context.span_id.to_vec(),
        parent_span_id: ended.context.parent.map(|p| p.to_vec()).unwrap_or_default(),
        flags: 0x100 | u32::from(ended.context.sampled),
        name: format!("{operation} {}", ended.model),
        kind: span::SpanKind::Server as i32,
        start_time_unix_nano: start,
        end_time_unix_nano: start + ended.duration_us * 1_000,
        attributes,
        events,
        dropped_events_count: ended.dropped_stalls,
        status: is_failure.then(|| Status {
            message: ended.outcome.into(),
            code: status::StatusCode::Error as i32,
        }),
        ..Span::default()
    }
}

fn request(spans: Vec<Span>, resource: &Resource) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(resource.clone()),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "metronome".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..InstrumentationScope::default()
                }),
                spans,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

/// What the span exporter task needs.
pub struct SpanExporter {
    /// The queue's receiving end.
    pub receiver: mpsc::Receiver<Queued>,
    /// The queue's producer (for the drop counter).
    pub sink: Arc<SpanSink>,
    /// Where the batches go.
    pub transport: Transport,
    /// The resource of every batch.
    pub resource: Resource,
    /// The span attributes' naming.
    pub naming: Naming,
    /// `metronome_otlp_exports_total`.
    pub exports: IntCounterVec,
    /// The batch detector, whose settled hitches give each span its episode events.
    pub batch: Arc<BatchDetector>,
    /// Whether the last export failed, so a failing receiver is logged once, not per batch.
    pub failing: bool,
}

// === impl SpanExporter ===

impl SpanExporter {
    /// Exports until `stop` turns true, then sends what is queued and returns.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let mut batch = Vec::new();
        let mut ticks = tokio::time::interval(FLUSH_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let stopping = tokio::select! {
                ended = self.receiver.recv() => match ended {
                    Some(ended) => {
                        batch.push(ended);
                        if batch.len() < MAX_BATCH {
                            continue;
                        }
                        false
                    }
                    None => true,
                },
                _ = ticks.tick() => false,
                _ = stop.wait_for(|s| *s) => true,
            };
            if stopping {
                while let Ok(ended) = self.receiver.try_recv() {
                    batch.push(ended);
                }
            }
            if !batch.is_empty() {
                self.send(std::mem::take(&mut batch)).await;
            }
            if stopping {
                return;
            }
        }
    }

    /// The spans of `ended`, built now rather than as each stream ended: by the batch's flush
    /// (up to [`FLUSH_EVERY`] later) a stream's last hitches have their scope, so the episodes
    /// it was caught in are known. One pass over the detector's marks for the whole batch.
    fn spans(&self, queued: &[Queued]) -> Vec<Span> {
        let ended = queued.iter().map(|q| &q.stream);
        let ids: HashSet<&str> = ended.clone().map(|e| e.stream_id.as_ref()).collect();
        let marks = self.batch.batch_hitches_of(&ids);
        let episodes = if marks.is_empty() {
            Vec::new()
        } else {
            self.batch.episodes()
        };
        ended
            .map(|e| {
                let caught = marks
                    .get(&e.stream_id)
                    .map(|m| episode_events(m, &episodes))
                    .unwrap_or_default();
                span(e, &self.naming, &caught)
            })
            .collect()
    }

    /// Sends one batch; its streams give their bytes back to the queue's bound when `queued`
    /// is dropped, after the receiver answered or the export failed.
    async fn send(&mut self, queued: Vec<Queued>) {
        let spans = self.spans(&queued);
        let n = spans.len() as u64;
        let body = request(spans, &self.resource).encode_to_vec();
        match self.transport.send(Signal::Traces, body).await {
            Ok(()) => {
                self.exports.with_label_values(&["traces", "ok"]).inc();
                if std::mem::take(&mut self.failing) {
                    tracing::info!("OTLP traces export works again");
                }
            }
            Err(e) => {
                if !std::mem::replace(&mut self.failing, true) {
                    tracing::warn!(error = %e, spans = n, "OTLP traces export failed (counted in metronome_otlp_exports_total and metronome_otlp_spans_dropped_total; logged again once it recovers)");
                }
                self.exports.with_label_values(&["traces", "failed"]).inc();
                add_saturating(&self.sink.dropped.with_label_values(&["export_failed"]), n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Names;
    use crate::otlp::traces::StallEvent;
    use crate::trace_context::SpanContext;

    #[test]
    fn a_stalled_stream_becomes_a_server_span_with_its_stall_events() {
        let context = SpanContext::continue_from(Some(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
        ));
        let ended = EndedStream {
            context,
            start_unix_nanos: 1_000_000_000,
            duration_us: 2_000_000,
            stream_id: "s1".into(),
            route: "chat".into(),
            model: "m".into(),
            outcome: "upstream_error",
            ttft_egress_us: Some(50_000),
            ttfo_egress_us: Some(900_000),
            reasoning_egress_us: Some(800_000),
            reasoning_tokens: Some(40),
            output_tokens: 7,
            token_events: 7,
            stalls: vec![StallEvent {
                point: "ingress",
                start_us: 100_000,
                length_us: 600_000,
                phase: "content",
            }],
            dropped_stalls: 2,
        };
        let s = span(&ended, &Naming::with(Names::Metronome, false), &[]);
        assert_eq!(s.name, "chat m");
        assert_eq!(s.kind, span::SpanKind::Server as i32);
        assert_eq!(
            s.parent_span_id,
            [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]
        );
        assert_eq!(s.end_time_unix_nano - s.start_time_unix_nano, 2_000_000_000);
        assert_eq!(s.events.len(), 1);
        assert_eq!(s.dropped_events_count, 2);
        assert_eq!(s.events[0].time_unix_nano, 1_100_000_000);
        assert_eq!(
            s.status.as_ref().map(|st| st.code),
            Some(status::StatusCode::Error as i32)
        );
        let keys: Vec<&str> = s.attributes.iter().map(|a| a.key.as_str()).collect();
        for key in [
            "gen_ai.request.stream",
            "metronome.stream_id",
            "error.type",
            "gen_ai.response.time_to_first_chunk",
            "metronome.time_to_first_output_token",
            "metronome.reasoning.duration",
            "gen_ai.usage.reasoning.output_tokens",
        ] {
            assert!(keys.contains(&key), "{key} missing from {keys:?}");
        }
    }

    #[test]
    fn a_streams_hitches_are_grouped_into_one_event_per_episode() {
        use crate::batch::Scope;
        let mark = |episode: Option<u64>, from_us: u64, to_us: u64| HitchMark {
            event: 0,
            phase: crate::format::Phase::Content,
            from_us,
            to_us,
            scope: if episode.is_some() {
                Scope::Batch
            } else {
                Scope::Stream
            },
            episode,
            upstream: "default".into(),
        };
        let marks = [
            mark(Some(3), 100, 400),
            mark(None, 500, 900),
            mark(Some(3), 1_000, 1_200),
            mark(Some(4), 2_000, 2_100),
        ];
        let mut kept = Episode::default();
        (kept.id, kept.start, kept.end) = (3, 10_000, Some(510_000));
        (kept.streams, kept.arrivals) = (5, 2);
        let events = episode_events(&marks, &[("default".into(), kept)]);
        assert_eq!(events.len(), 2);
        assert_eq!(
            (events[0].episode, events[0].start_us, events[0].hitch_us),
            (3, 100, 500)
        );
        assert_eq!(events[0].episode_figures, Some((5, 2, Some(500))));
        assert_eq!((events[1].episode, events[1].episode_figures), (4, None));
        let ended = EndedStream {
            context: SpanContext::continue_from(None),
            start_unix_nanos: 1_000_000_000,
            duration_us: 3_000,
            stream_id: "s1".into(),
            route: "chat".into(),
            model: "m".into(),
            outcome: "complete",
            ttft_egress_us: None,
            ttfo_egress_us: None,
            reasoning_egress_us: None,
            reasoning_tokens: None,
            output_tokens: 1,
            token_events: 1,
            stalls: Vec::new(),
            dropped_stalls: 0,
        };
        let s = span(&ended, &Naming::with(Names::Metronome, false), &events);
        let names: Vec<&str> = s.events.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["metronome.batch_episode"; 2]);
        assert_eq!(s.events[0].time_unix_nano, 1_000_100_000);
    }
}
