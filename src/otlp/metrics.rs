//! metronome's metric families read as OTLP, once per export interval.
//!
//! Nothing is recorded twice: the export reads the same families `/metrics` encodes (cumulative
//! temporality, as a scrape is), so no frame and no stream does any work for OTLP. A histogram
//! with native buckets becomes an exponential histogram of the same resolution (native schema
//! `s` is OTLP scale `s`; native bucket `i`, (b^(i-1), b^i], is OTLP bucket `i - 1`); the
//! count-valued histograms that keep no native buckets go as explicit-bucket histograms with
//! their classic bounds; counters as monotonic sums, gauges as gauges.

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{
    exponential_histogram_data_point::Buckets, metric::Data, number_data_point,
    AggregationTemporality, ExponentialHistogram, ExponentialHistogramDataPoint, Gauge, Histogram,
    HistogramDataPoint, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prometheus::proto::MetricType;

use super::names::{Naming, Renamed, Value};
use super::resource::string_kv;
use crate::metrics::native::NativeState;
use crate::metrics::{HistogramFamily, Metrics, SeriesSnapshot};
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue};

const CUMULATIVE: i32 = AggregationTemporality::Cumulative as i32;

/// The times every data point of one export carries, in nanoseconds since the Unix epoch.
#[derive(Debug, Clone, Copy)]
pub struct Times {
    /// When the counters started counting (the exporter's start; counters keep no creation
    /// time of their own).
    pub start: u64,
    /// Now.
    pub now: u64,
}

/// One export request with every family of `metrics`, named as `naming` says.
pub fn request(
    metrics: &Metrics,
    resource: &Resource,
    naming: &Naming,
    times: Times,
) -> ExportMetricsServiceRequest {
    let mut out = Vec::new();
    for family in &metrics.histograms {
        for renamed in naming.histogram(family.name()) {
            out.push(histogram(family, &family.snapshot(false), &renamed, times));
        }
    }
    for gathered in metrics.registry.gather() {
        let kind = gathered.get_field_type();
        if !matches!(kind, MetricType::COUNTER | MetricType::GAUGE) {
            continue;
        }
        for renamed in naming.scalar(gathered.name()) {
            out.push(scalar(&gathered, kind, &renamed, times));
        }
    }
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(resource.clone()),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(InstrumentationScope {
                    name: "metronome".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..InstrumentationScope::default()
                }),
                metrics: out,
                schema_url: naming.schema_url().into(),
            }],
            schema_url: String::new(),
        }],
    }
}

/// A series' labels as attributes, renamed (and some dropped or added) as `renamed` says.
fn attributes(labels: &[(String, String)], renamed: &Renamed) -> Vec<KeyValue> {
    renamed
        .attributes(labels)
        .into_iter()
        .map(|(k, v)| match v {
            Value::Str(s) => string_kv(&k, s),
            Value::Int(i) => KeyValue {
                key: k,
                value: Some(AnyValue {
                    value: Some(any_value::Value::IntValue(i)),
                }),
                ..KeyValue::default()
            },
        })
        .collect()
}

fn nanos(seconds: f64) -> u64 {
    (seconds.max(0.0) * 1e9) as u64
}

fn histogram(
    family: &HistogramFamily,
    series: &[SeriesSnapshot],
    renamed: &Renamed,
    times: Times,
) -> Metric {
    let keep = |s: &&SeriesSnapshot| renamed.keeps(&s.labels);
    let data = if family.native().is_some() {
        Data::ExponentialHistogram(ExponentialHistogram {
            data_points: series
                .iter()
                .filter(keep)
                .map(|s| exponential_point(s, renamed, times))
                .collect(),
            aggregation_temporality: CUMULATIVE,
        })
    } else {
        Data::Histogram(Histogram {
            data_points: series
                .iter()
                .filter(keep)
                .map(|s| HistogramDataPoint {
                    attributes: attributes(&s.labels, renamed),
                    start_time_unix_nano: nanos(s.created),
                    time_unix_nano: times.now,
                    count: s.count,
                    sum: Some(s.sum),
                    bucket_counts: s.counts.clone(),
                    explicit_bounds: family.bounds().to_vec(),
                    ..HistogramDataPoint::default()
                })
                .collect(),
            aggregation_temporality: CUMULATIVE,
        })
    };
    Metric {
        name: renamed.name.clone(),
        description: family.help().into(),
        unit: renamed.unit.into(),
        data: Some(data),
        ..Metric::default()
    }
}

fn exponential_point(
    s: &SeriesSnapshot,
    renamed: &Renamed,
    times: Times,
) -> ExponentialHistogramDataPoint {
    let (scale, zero_threshold, zero_count, positive) = match &s.native {
        Some(native) => (
            i32::from(native.schema),
            native.zero_threshold,
            native.zero_count,
            Some(buckets(native)),
        ),
        None => (0, 0.0, 0, None),
    };
    ExponentialHistogramDataPoint {
        attributes: attributes(&s.labels, renamed),
        start_time_unix_nano: nanos(s.created),
        time_unix_nano: times.now,
        count: s.count,
        sum: Some(s.sum),
        scale,
        zero_count,
        positive,
        zero_threshold,
        ..ExponentialHistogramDataPoint::default()
    }
}

/// The positive buckets, dense from the first non-empty one (a series holds at most
/// `max_buckets` of them, so the run is short).
pub fn buckets(native: &NativeState) -> Buckets {
    let (Some((&first, _)), Some((&last, _))) = (
        native.positive.first_key_value(),
        native.positive.last_key_value(),
    ) else {
        return Buckets::default();
    };
    let mut counts = vec![0u64; (last - first + 1) as usize];
    for (index, count) in &native.positive {
        counts[(index - first) as usize] = *count;
    }
    Buckets {
        offset: first - 1,
        bucket_counts: counts,
    }
}

fn scalar(
    family: &prometheus::proto::MetricFamily,
    kind: MetricType,
    renamed: &Renamed,
    times: Times,
) -> Metric {
    let points = family
        .get_metric()
        .iter()
        .filter_map(|m| {
            let labels: Vec<(String, String)> = m
                .get_label()
                .iter()
                .map(|l| (l.name().to_string(), l.value().to_string()))
                .collect();
            if !renamed.keeps(&labels) {
                return None;
            }
            let value = match kind {
                MetricType::COUNTER => m.get_counter().get_value(),
                _ => m.get_gauge().get_value(),
            };
            Some(NumberDataPoint {
                attributes: attributes(&labels, renamed),
                start_time_unix_nano: times.start,
                time_unix_nano: times.now,
                value: Some(number_data_point::Value::AsInt(value as i64)),
                ..NumberDataPoint::default()
            })
        })
        .collect();
    let data = match kind {
        MetricType::COUNTER => Data::Sum(Sum {
            data_points: points,
            aggregation_temporality: CUMULATIVE,
            is_monotonic: true,
        }),
        _ => Data::Gauge(Gauge {
            data_points: points,
        }),
    };
    Metric {
        name: renamed.name.clone(),
        description: family.help().into(),
        unit: renamed.unit.into(),
        data: Some(data),
        ..Metric::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{Buckets as Bounds, ModelLabels};
    use std::time::Duration;

    fn metrics() -> Metrics {
        Metrics::new(
            &Bounds::default(),
            ModelLabels::new(&[], 8),
            Duration::from_secs(1),
        )
        .unwrap()
    }

    fn find<'a>(req: &'a ExportMetricsServiceRequest, name: &str) -> &'a Metric {
        req.resource_metrics[0].scope_metrics[0]
            .metrics
            .iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("no {name}"))
    }

    #[test]
    fn a_native_histogram_becomes_an_exponential_one_with_the_same_buckets() {
        let m = metrics();
        let labels = ["chat", "m", "ingress"];
        for v in [0.01, 0.01, 0.02, 0.5] {
            m.itl.observe(&labels, v);
        }
        let times = Times { start: 1, now: 2 };
        let req = request(&m, &Resource::default(), &Naming::metronome(), times);
        let metric = find(&req, "metronome_inter_token_latency_seconds");
        assert_eq!(metric.unit, "s");
        let Some(Data::ExponentialHistogram(h)) = &metric.data else {
            panic!("not exponential: {:?}", metric.data);
        };
        assert_eq!(h.aggregation_temporality, CUMULATIVE);
        let p = &h.data_points[0];
        assert_eq!((p.count, p.scale), (4, 4));
        assert!((p.sum.unwrap() - 0.54).abs() < 1e-9);
        let b = p.positive.as_ref().unwrap();
        assert_eq!(b.bucket_counts.iter().sum::<u64>(), 4);
        // Each sample lies in its OTLP bucket (base^i, base^(i+1)], base = 2^(1/16).
        let base = 2f64.powf(1.0 / 16.0);
        for (v, n) in [(0.01f64, 2), (0.02, 1), (0.5, 1)] {
            let i = v.log(base).ceil() as i32 - 1;
            assert!(base.powi(i) < v && v <= base.powi(i + 1));
            assert_eq!(b.bucket_counts[(i - b.offset) as usize], n, "{v}");
        }
        let attrs: Vec<&str> = p.attributes.iter().map(|kv| kv.key.as_str()).collect();
        assert_eq!(attrs, ["route", "model", "point"]);
    }

    #[test]
    fn counters_and_gauges_keep_their_values() {
        let m = metrics();
        m.streams
            .with_label_values(&["chat", "m", "complete", "stop"])
            .inc_by(3);
        m.streams_active.with_label_values(&["chat"]).set(2);
        let req = request(
            &m,
            &Resource::default(),
            &Naming::metronome(),
            Times { start: 1, now: 2 },
        );
        let Some(Data::Sum(sum)) = &find(&req, "metronome_streams_total").data else {
            panic!("not a sum");
        };
        assert!(sum.is_monotonic);
        assert_eq!(
            sum.data_points[0].value,
            Some(number_data_point::Value::AsInt(3))
        );
        let Some(Data::Gauge(g)) = &find(&req, "metronome_streams_active").data else {
            panic!("not a gauge");
        };
        assert_eq!(
            g.data_points[0].value,
            Some(number_data_point::Value::AsInt(2))
        );
        // Without native buckets: an explicit-bucket histogram with the classic bounds.
        m.tokens_per_event.observe(&["chat", "m"], 3.0);
        let req = request(
            &m,
            &Resource::default(),
            &Naming::metronome(),
            Times { start: 1, now: 2 },
        );
        let Some(Data::Histogram(h)) = &find(&req, "metronome_tokens_per_event").data else {
            panic!("not explicit");
        };
        assert_eq!(h.data_points[0].count, 1);
        assert_eq!(
            h.data_points[0].explicit_bounds,
            m.tokens_per_event.bounds()
        );
    }
}
