//! The span exporter: ended streams from the bounded queue become OTLP spans, POSTed in
//! batches to `{endpoint}/v1/traces`. A batch the receiver did not take is counted and dropped,
//! never retried into a growing backlog.

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
use super::traces::{failed, EndedStream, SpanSink};
use super::transport::{Signal, Transport};

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

/// The span of one ended stream.
pub fn span(ended: &EndedStream, naming: &Naming) -> Span {
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
    let is_failure = failed(ended.outcome);
    if is_failure {
        attributes.push(kv(
            "error.type",
            any_value::Value::StringValue(ended.outcome.into()),
        ));
    }
    let start = ended.start_unix_nanos;
    let events = ended
        .stalls
        .iter()
        .map(|s| span::Event {
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
            ],
            ..span::Event::default()
        })
        .collect();
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
    pub receiver: mpsc::Receiver<EndedStream>,
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
                        batch.push(span(&ended, &self.naming));
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
                    batch.push(span(&ended, &self.naming));
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

    async fn send(&self, spans: Vec<Span>) {
        let n = spans.len() as u64;
        let body = request(spans, &self.resource).encode_to_vec();
        match self.transport.send(Signal::Traces, body).await {
            Ok(()) => self.exports.with_label_values(&["traces", "ok"]).inc(),
            Err(e) => {
                tracing::debug!(error = %e, spans = n, "OTLP traces export failed");
                self.exports.with_label_values(&["traces", "failed"]).inc();
                self.sink
                    .dropped
                    .with_label_values(&["export_failed"])
                    .inc_by(n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::otlp::config::Names;
    use crate::otlp::traces::{SpanContext, StallEvent};

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
            output_tokens: 7,
            token_events: 7,
            stalls: vec![StallEvent {
                point: "ingress",
                start_us: 100_000,
                length_us: 600_000,
            }],
        };
        let s = span(&ended, &Naming::with(Names::Metronome, false));
        assert_eq!(s.name, "chat m");
        assert_eq!(s.kind, span::SpanKind::Server as i32);
        assert_eq!(
            s.parent_span_id,
            [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]
        );
        assert_eq!(s.end_time_unix_nano - s.start_time_unix_nano, 2_000_000_000);
        assert_eq!(s.events.len(), 1);
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
        ] {
            assert!(keys.contains(&key), "{key} missing from {keys:?}");
        }
    }
}
