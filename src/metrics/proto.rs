//! Prometheus's protobuf exposition: length-delimited `io.prometheus.client.MetricFamily`
//! messages, with the classic buckets, the native fields and the exemplars.
//!
//! The messages are written out by hand from prometheus/client_model's `metrics.proto` (the
//! fields metronome sends, with their numbers), and `prost`'s derive encodes them, so no
//! `protoc` is needed. Scalars are proto3-style (a zero value is left out), which a proto2
//! reader takes as the field's default of zero; repeated numbers are packed, which proto2
//! readers accept.

use prometheus::proto as source;

use super::counter::CounterExemplars;
use super::histogram::{HistogramFamily, SeriesSnapshot, StoredExemplar};

/// `io.prometheus.client.LabelPair`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LabelPair {
    /// The label's name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Its value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `google.protobuf.Timestamp`.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct Timestamp {
    /// Whole seconds since the Unix epoch.
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    /// The nanoseconds past them.
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

/// `io.prometheus.client.Gauge`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Gauge {
    /// The value.
    #[prost(double, tag = "1")]
    pub value: f64,
}

/// `io.prometheus.client.Counter`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Counter {
    /// The value.
    #[prost(double, tag = "1")]
    pub value: f64,
    /// The series' exemplar (its value the increment, 1; see `metrics::counter`).
    #[prost(message, optional, tag = "2")]
    pub exemplar: Option<Exemplar>,
}

/// `io.prometheus.client.Untyped`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Untyped {
    /// The value.
    #[prost(double, tag = "1")]
    pub value: f64,
}

/// `io.prometheus.client.Exemplar`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Exemplar {
    /// `stream_id` and, when known, `trace_id`.
    #[prost(message, repeated, tag = "1")]
    pub label: Vec<LabelPair>,
    /// The sample.
    #[prost(double, tag = "2")]
    pub value: f64,
    /// When it was taken (native histograms' exemplars must have one).
    #[prost(message, optional, tag = "3")]
    pub timestamp: Option<Timestamp>,
}

/// `io.prometheus.client.Bucket`: a classic bucket.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Bucket {
    /// Samples at most `upper_bound`.
    #[prost(uint64, tag = "1")]
    pub cumulative_count: u64,
    /// The bucket's `le`.
    #[prost(double, tag = "2")]
    pub upper_bound: f64,
    /// The bucket's exemplar.
    #[prost(message, optional, tag = "3")]
    pub exemplar: Option<Exemplar>,
}

/// `io.prometheus.client.BucketSpan`: consecutive native buckets.
#[derive(Clone, PartialEq, prost::Message)]
pub struct BucketSpan {
    /// The gap from the previous span's end (the first span: its first index).
    #[prost(sint32, tag = "1")]
    pub offset: i32,
    /// How many consecutive buckets.
    #[prost(uint32, tag = "2")]
    pub length: u32,
}

/// `io.prometheus.client.Histogram`: classic and native together.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Histogram {
    /// Samples counted.
    #[prost(uint64, tag = "1")]
    pub sample_count: u64,
    /// Their sum.
    #[prost(double, tag = "2")]
    pub sample_sum: f64,
    /// The classic buckets (without `+Inf`: the count is its cumulative count).
    #[prost(message, repeated, tag = "3")]
    pub bucket: Vec<Bucket>,
    /// The native schema.
    #[prost(sint32, tag = "5")]
    pub schema: i32,
    /// The zero bucket's threshold.
    #[prost(double, tag = "6")]
    pub zero_threshold: f64,
    /// The zero bucket's count.
    #[prost(uint64, tag = "7")]
    pub zero_count: u64,
    /// The positive native buckets' spans (a no-op span when there are none).
    #[prost(message, repeated, tag = "12")]
    pub positive_span: Vec<BucketSpan>,
    /// Each positive bucket's count minus the previous one's.
    #[prost(sint64, repeated, tag = "13")]
    pub positive_delta: Vec<i64>,
    /// When the series was made.
    #[prost(message, optional, tag = "15")]
    pub created_timestamp: Option<Timestamp>,
    /// The native histogram's exemplars (each with a timestamp).
    #[prost(message, repeated, tag = "16")]
    pub exemplars: Vec<Exemplar>,
}

/// `io.prometheus.client.Metric`: one series.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Metric {
    /// Its labels.
    #[prost(message, repeated, tag = "1")]
    pub label: Vec<LabelPair>,
    /// A gauge's value.
    #[prost(message, optional, tag = "2")]
    pub gauge: Option<Gauge>,
    /// A counter's value.
    #[prost(message, optional, tag = "3")]
    pub counter: Option<Counter>,
    /// An untyped value.
    #[prost(message, optional, tag = "5")]
    pub untyped: Option<Untyped>,
    /// A histogram.
    #[prost(message, optional, tag = "7")]
    pub histogram: Option<Histogram>,
}

/// `io.prometheus.client.MetricFamily`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct MetricFamily {
    /// The family's name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Its help text.
    #[prost(string, tag = "2")]
    pub help: String,
    /// Its type.
    #[prost(enumeration = "MetricType", tag = "3")]
    pub r#type: i32,
    /// Its series.
    #[prost(message, repeated, tag = "4")]
    pub metric: Vec<Metric>,
}

/// `io.prometheus.client.MetricType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum MetricType {
    /// A counter.
    Counter = 0,
    /// A gauge.
    Gauge = 1,
    /// A summary (metronome has none).
    Summary = 2,
    /// Untyped.
    Untyped = 3,
    /// A histogram.
    Histogram = 4,
}

/// The content type of this exposition.
pub const CONTENT_TYPE: &str =
    "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited";

fn timestamp(unix_seconds: f64) -> Timestamp {
    let seconds = unix_seconds.floor();
    Timestamp {
        seconds: seconds as i64,
        nanos: ((unix_seconds - seconds) * 1e9) as i32,
    }
}

fn pairs(labels: &[(String, String)]) -> Vec<LabelPair> {
    labels
        .iter()
        .map(|(name, value)| LabelPair {
            name: name.clone(),
            value: value.clone(),
        })
        .collect()
}

/// An exemplar's message.
pub(crate) fn exemplar(stored: &StoredExemplar) -> Exemplar {
    let mut label = vec![LabelPair {
        name: "stream_id".into(),
        value: stored.stream_id.to_string(),
    }];
    if let Some(trace_id) = &stored.trace_id {
        label.push(LabelPair {
            name: "trace_id".into(),
            value: trace_id.to_string(),
        });
    }
    Exemplar {
        label,
        value: stored.value,
        timestamp: Some(timestamp(stored.timestamp)),
    }
}

/// One series of a [`HistogramFamily`] as a `Metric`.
pub fn histogram_metric(bounds: &[f64], series: &SeriesSnapshot) -> Metric {
    let mut cumulative = 0u64;
    let bucket = bounds
        .iter()
        .zip(&series.counts)
        .enumerate()
        .map(|(i, (bound, count))| {
            cumulative += count;
            Bucket {
                cumulative_count: cumulative,
                upper_bound: *bound,
                exemplar: series
                    .exemplars
                    .get(i)
                    .and_then(Option::as_ref)
                    .map(exemplar),
            }
        })
        .collect();
    let mut histogram = Histogram {
        sample_count: series.count,
        sample_sum: series.sum,
        bucket,
        created_timestamp: Some(timestamp(series.created)),
        ..Histogram::default()
    };
    if let Some(native) = &series.native {
        let (spans, deltas) = native.spans_and_deltas();
        histogram.schema = i32::from(native.schema);
        histogram.zero_threshold = native.zero_threshold;
        histogram.zero_count = native.zero_count;
        histogram.positive_span = if spans.is_empty() {
            vec![BucketSpan::default()]
        } else {
            spans
                .into_iter()
                .map(|(offset, length)| BucketSpan { offset, length })
                .collect()
        };
        histogram.positive_delta = deltas;
        histogram.exemplars = series.exemplars.iter().flatten().map(exemplar).collect();
    }
    Metric {
        label: pairs(&series.labels),
        histogram: Some(histogram),
        ..Metric::default()
    }
}

/// A histogram family's message.
pub fn histogram_family(family: &HistogramFamily, snapshot: &[SeriesSnapshot]) -> MetricFamily {
    MetricFamily {
        name: family.name().to_string(),
        help: family.help().to_string(),
        r#type: MetricType::Histogram as i32,
        metric: snapshot
            .iter()
            .map(|s| histogram_metric(family.bounds(), s))
            .collect(),
    }
}

/// A family the `prometheus` crate gathered (counters, gauges, other collectors' histograms)
/// in these messages; a counter's series carry `exemplars`.
#[allow(deprecated)] // `Untyped`: see `exposition::om_gathered`.
pub fn from_gathered(
    family: &source::MetricFamily,
    exemplars: Option<&CounterExemplars>,
) -> MetricFamily {
    let kind = match family.get_field_type() {
        source::MetricType::COUNTER => MetricType::Counter,
        source::MetricType::GAUGE => MetricType::Gauge,
        source::MetricType::HISTOGRAM => MetricType::Histogram,
        // metronome has no summaries; another collector's would lose its quantiles.
        source::MetricType::SUMMARY | source::MetricType::UNTYPED => MetricType::Untyped,
    };
    let metric = family
        .get_metric()
        .iter()
        .map(|m| {
            let label: Vec<LabelPair> = m
                .get_label()
                .iter()
                .map(|l| LabelPair {
                    name: l.name().to_string(),
                    value: l.value().to_string(),
                })
                .collect();
            let counter_exemplar = || {
                let named: Vec<(String, String)> = label
                    .iter()
                    .map(|l| (l.name.clone(), l.value.clone()))
                    .collect();
                exemplars.and_then(|e| e.of(&named)).map(exemplar)
            };
            let mut out = Metric::default();
            match kind {
                MetricType::Counter => {
                    out.counter = Some(Counter {
                        value: m.get_counter().get_value(),
                        exemplar: counter_exemplar(),
                    })
                }
                MetricType::Gauge => {
                    out.gauge = Some(Gauge {
                        value: m.get_gauge().get_value(),
                    })
                }
                MetricType::Histogram => {
                    let h = m.get_histogram();
                    out.histogram = Some(Histogram {
                        sample_count: h.get_sample_count(),
                        sample_sum: h.get_sample_sum(),
                        bucket: h
                            .get_bucket()
                            .iter()
                            .map(|b| Bucket {
                                cumulative_count: b.cumulative_count(),
                                upper_bound: b.upper_bound(),
                                exemplar: None,
                            })
                            .collect(),
                        ..Histogram::default()
                    })
                }
                MetricType::Summary | MetricType::Untyped => {
                    out.untyped = Some(Untyped {
                        value: m.get_untyped().get_value(),
                    })
                }
            }
            out.label = label;
            out
        })
        .collect();
    MetricFamily {
        name: family.name().to_string(),
        help: family.help().to_string(),
        r#type: kind as i32,
        metric,
    }
}

/// Appends `family` to `out`, length-delimited.
pub fn write_delimited(family: &MetricFamily, out: &mut Vec<u8>) {
    // Encoding into a Vec cannot run out of room.
    let _ = prost::Message::encode_length_delimited(family, out);
}
