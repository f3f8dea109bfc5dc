//! The encoders as they were before the exposition was written straight from the series
//! (`prometheus`'s `TextEncoder` over a registry that gathered every histogram series, the
//! OpenMetrics writer of one `format!` per sample, and `prost` over built messages), kept
//! verbatim for the tests (whatever the fast encoders become, they must write these bytes) and
//! for `benches/exposition.rs`, which times both in one run. Not part of the API.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use prometheus::core::Collector;
use prometheus::proto as source;

use super::counter::CounterExemplars;
use super::histogram::{HistogramFamily, SeriesSnapshot, StoredExemplar};
use super::{proto, Metrics};

/// A gathered family, with its histogram family of ours and that family's snapshot, or the
/// exemplars of a counter family of ours.
struct Gathered<'a> {
    family: source::MetricFamily,
    histogram: Option<(&'a HistogramFamily, Vec<SeriesSnapshot>)>,
    exemplars: Option<CounterExemplars>,
}

/// What the registry's `gather` returned when the histogram families were registered as
/// collectors of their own: every family sorted by name, empty ones pruned, each family's
/// metrics sorted by their label values.
pub fn gather(metrics: &Metrics) -> Vec<source::MetricFamily> {
    let mut by_name = BTreeMap::new();
    let ours = metrics.histograms.iter().flat_map(|h| h.collect());
    for family in metrics.registry.gather().into_iter().chain(ours) {
        if family.get_metric().is_empty() {
            continue;
        }
        by_name.insert(family.name().to_owned(), family);
    }
    by_name
        .into_values()
        .map(|mut family| {
            family.mut_metric().sort_by(|m1, m2| {
                let (l1, l2) = (m1.get_label(), m2.get_label());
                l1.len().cmp(&l2.len()).then_with(|| {
                    l1.iter()
                        .map(|l| l.value())
                        .cmp(l2.iter().map(|l| l.value()))
                })
            });
            family
        })
        .collect()
}

/// The text format 0.0.4, as `Metrics::encode` wrote it.
pub fn encode(metrics: &Metrics) -> String {
    let mut out = String::new();
    if let Err(e) = prometheus::TextEncoder::new().encode_utf8(&gather(metrics), &mut out) {
        tracing::error!(error = %e, "could not encode metrics");
    }
    out
}

fn families(metrics: &Metrics) -> Vec<Gathered<'_>> {
    gather(metrics)
        .into_iter()
        .map(|family| {
            let histogram = metrics
                .histograms
                .iter()
                .find(|h| h.name() == family.name())
                .map(|h| {
                    let mut snapshot = h.snapshot(true);
                    snapshot.sort_by(|a, b| {
                        a.labels
                            .iter()
                            .map(|l| &l.1)
                            .cmp(b.labels.iter().map(|l| &l.1))
                    });
                    (h, snapshot)
                });
            let exemplars = metrics
                .counter_family(family.name())
                .map(|c| c.exemplars(true));
            Gathered {
                family,
                histogram,
                exemplars,
            }
        })
        .collect()
}

/// The protobuf exposition, as `Metrics::encode_protobuf` wrote it.
pub fn encode_protobuf(metrics: &Metrics) -> Vec<u8> {
    let mut out = Vec::new();
    for gathered in families(metrics) {
        let message = match &gathered.histogram {
            Some((histogram, snapshot)) => proto::histogram_family(histogram, snapshot),
            None => proto::from_gathered(&gathered.family, gathered.exemplars.as_ref()),
        };
        proto::write_delimited(&message, &mut out);
    }
    out
}

/// The OpenMetrics text exposition, as `Metrics::encode_openmetrics` wrote it.
pub fn encode_openmetrics(metrics: &Metrics) -> String {
    let mut out = String::new();
    for gathered in families(metrics) {
        match &gathered.histogram {
            Some((histogram, snapshot)) => om_histogram(&mut out, histogram, snapshot),
            None => om_gathered(&mut out, &gathered.family, gathered.exemplars.as_ref()),
        }
    }
    out.push_str("# EOF\n");
    out
}

/// The unit a metric's name ends with, for `# UNIT`.
fn unit_of(name: &str) -> Option<&'static str> {
    name.ends_with("_seconds").then_some("seconds")
}

fn om_header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# TYPE {name} {kind}");
    if let Some(unit) = unit_of(name) {
        let _ = writeln!(out, "# UNIT {name} {unit}");
    }
    let _ = writeln!(out, "# HELP {name} {}", escape(help, false));
}

/// Escapes a label value (`quote`: `"` too) or help text: `\`, newline and `"`.
fn escape(text: &str, quote: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quote => out.push_str("\\\""),
            c => out.push(c),
        }
    }
    out
}

/// `{a="1",b="2"}` with `extra` last (`le`), or nothing without labels.
fn labels(pairs: &[(String, String)], extra: Option<(&str, &str)>) -> String {
    let mut parts: Vec<String> = pairs
        .iter()
        .map(|(n, v)| format!("{n}=\"{}\"", escape(v, true)))
        .collect();
    if let Some((n, v)) = extra {
        parts.push(format!("{n}=\"{v}\""));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", parts.join(","))
    }
}

/// A number as OpenMetrics writes it: integers with `.0`, `+Inf`, `NaN`.
fn number(value: f64) -> String {
    if value.is_infinite() {
        return if value > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    if value.is_nan() {
        return "NaN".into();
    }
    if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{value:.1}")
    } else {
        format!("{value}")
    }
}

fn om_exemplar(exemplar: &StoredExemplar) -> String {
    let mut pairs = vec![("stream_id".to_string(), exemplar.stream_id.to_string())];
    if let Some(trace_id) = &exemplar.trace_id {
        pairs.push(("trace_id".to_string(), trace_id.to_string()));
    }
    // OpenMetrics allows 128 characters of exemplar label names and values.
    let length: usize = pairs.iter().map(|(n, v)| n.len() + v.chars().count()).sum();
    if length > 128 {
        pairs.truncate(1);
    }
    format!(
        " # {} {} {}",
        labels(&pairs, None),
        number(exemplar.value),
        number_ts(exemplar.timestamp)
    )
}

/// A timestamp in seconds with millisecond precision.
fn number_ts(unix_seconds: f64) -> String {
    format!("{unix_seconds:.3}")
}

fn om_histogram(out: &mut String, family: &HistogramFamily, snapshot: &[SeriesSnapshot]) {
    let name = family.name();
    om_header(out, name, "histogram", family.help());
    for series in snapshot {
        let mut cumulative = 0u64;
        let bounds = family.bounds();
        for (i, count) in series.counts.iter().enumerate() {
            cumulative += count;
            let le = bounds.get(i).map_or("+Inf".to_string(), |b| number(*b));
            let _ = write!(
                out,
                "{name}_bucket{} {cumulative}",
                labels(&series.labels, Some(("le", &le)))
            );
            if let Some(exemplar) = series.exemplars.get(i).and_then(Option::as_ref) {
                out.push_str(&om_exemplar(exemplar));
            }
            out.push('\n');
        }
        let plain = labels(&series.labels, None);
        let _ = writeln!(out, "{name}_count{plain} {}", series.count);
        let _ = writeln!(out, "{name}_sum{plain} {}", number(series.sum));
        let _ = writeln!(out, "{name}_created{plain} {}", number_ts(series.created));
    }
}

// `Untyped` is deprecated in the crate's proto, which still gathers it for untyped collectors.
/// A family the `prometheus` crate gathered; a counter's `_total` samples carry `exemplars`.
#[allow(deprecated)]
fn om_gathered(
    out: &mut String,
    family: &source::MetricFamily,
    exemplars: Option<&CounterExemplars>,
) {
    let pairs = |m: &source::Metric| -> Vec<(String, String)> {
        m.get_label()
            .iter()
            .map(|l| (l.name().to_string(), l.value().to_string()))
            .collect()
    };
    match family.get_field_type() {
        source::MetricType::COUNTER => {
            let name = family.name();
            let base = name.strip_suffix("_total").unwrap_or(name);
            om_header(out, base, "counter", family.help());
            for m in family.get_metric() {
                let l = pairs(m);
                let _ = write!(
                    out,
                    "{base}_total{} {}",
                    labels(&l, None),
                    number(m.get_counter().get_value())
                );
                if let Some(exemplar) = exemplars.and_then(|e| e.of(&l)) {
                    out.push_str(&om_exemplar(exemplar));
                }
                out.push('\n');
            }
        }
        source::MetricType::GAUGE => {
            let name = family.name();
            om_header(out, name, "gauge", family.help());
            for m in family.get_metric() {
                let _ = writeln!(
                    out,
                    "{name}{} {}",
                    labels(&pairs(m), None),
                    number(m.get_gauge().get_value())
                );
            }
        }
        source::MetricType::HISTOGRAM => {
            let name = family.name();
            om_header(out, name, "histogram", family.help());
            for m in family.get_metric() {
                let h = m.get_histogram();
                let l = pairs(m);
                for b in h.get_bucket() {
                    let le = number(b.upper_bound());
                    let _ = writeln!(
                        out,
                        "{name}_bucket{} {}",
                        labels(&l, Some(("le", &le))),
                        b.cumulative_count()
                    );
                }
                let _ = writeln!(
                    out,
                    "{name}_bucket{} {}",
                    labels(&l, Some(("le", "+Inf"))),
                    h.get_sample_count()
                );
                let _ = writeln!(
                    out,
                    "{name}_count{} {}",
                    labels(&l, None),
                    h.get_sample_count()
                );
                let _ = writeln!(
                    out,
                    "{name}_sum{} {}",
                    labels(&l, None),
                    number(h.get_sample_sum())
                );
            }
        }
        source::MetricType::SUMMARY | source::MetricType::UNTYPED => {
            let name = family.name();
            om_header(out, name, "unknown", family.help());
            for m in family.get_metric() {
                let _ = writeln!(
                    out,
                    "{name}{} {}",
                    labels(&pairs(m), None),
                    number(m.get_untyped().get_value())
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::exposition::Format;
    use super::super::{
        Buckets, CounterExemplar, CounterFamily, Exemplar, ExemplarPolicy, FamilyOptions,
        LocalHistogram, ModelLabels, NativeCounts, NativeSettings,
    };
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;

    /// Label values that take every escape, non-ASCII text and the empty value.
    const ODD: [&str; 6] = ["", "a\"b", "back\\slash", "new\nline", "modèle-ü", "x,y=z}"];

    fn metrics() -> Metrics {
        Metrics::new(
            &Buckets::default(),
            ModelLabels::new(&[], 1_000),
            Duration::from_millis(500),
        )
        .unwrap()
    }

    /// A stream's samples (`values`) merged into `family`'s series `labels`, with an exemplar
    /// named `stream` (a trace ID on every other one).
    fn merge(family: &HistogramFamily, labels: &[&str], values: &[f64], stream: &str, n: usize) {
        let mut local = LocalHistogram::default();
        let mut native = NativeCounts::default();
        for v in values {
            local.observe(family.bounds(), *v);
            if let Some(index) = family.native() {
                native.observe(index, *v);
            }
        }
        let exemplar = Exemplar {
            stream_id: stream,
            trace_id: (n % 2 == 0).then_some("4bf92f3577b34da6a3ce929d0e0e4736"),
            value: values.iter().copied().fold(0.0, f64::max),
        };
        family.merge_with(labels, &local, &native, Some(&exemplar));
    }

    /// Every kind of family metronome exposes, and the odd ones an embedder may add.
    fn populate(metrics: &mut Metrics, series: usize, seed: u64) {
        let mut x = seed | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        // A family without labels, and one whose values are odd.
        let bare = HistogramFamily::with_options(
            "embedder_bare_seconds",
            "No labels; a \\ and a\nnewline in the help.",
            &[],
            &[0.5, 1.0, 2.0],
            FamilyOptions {
                native: Some(NativeSettings::default()),
                exemplars: ExemplarPolicy::Latest,
            },
        )
        .unwrap();
        metrics.histograms.push(bare.clone());
        merge(&bare, &[], &[0.0, 0.25, 1.5, 9.0], "bare", 0);
        for (n, family) in metrics.histograms.iter().enumerate() {
            let arity = family.label_names().len();
            for i in 0..series {
                let values: Vec<String> = (0..arity)
                    .map(|l| match (i + l + n) % 9 {
                        k @ 0..=5 => ODD[k].to_string(),
                        k => format!("v{}-{}", k, i % 37),
                    })
                    .collect();
                let labels: Vec<&str> = values.iter().map(String::as_str).collect();
                let samples: Vec<f64> = (0..(next() % 40))
                    .map(|_| match next() % 50 {
                        0 => 0.0,
                        1 => 1e6,
                        2 => 12.0,
                        r => (next() % 100_000) as f64 * 1e-5 * r as f64,
                    })
                    .collect();
                let stream = if i % 7 == 0 {
                    "s".repeat(100 + i % 30)
                } else {
                    format!("stream-{i}-\"{}\"", next() % 1000)
                };
                merge(family, &labels, &samples, &stream, i);
            }
        }
        // Odd sums: not a number, infinite.
        let itl = &metrics.itl;
        itl.observe(&["nan", "m", "ingress", "content"], f64::NAN);
        itl.observe(&["inf", "m", "ingress", "content"], f64::INFINITY);
        // Counters, gauges, a counter family with exemplars and another collector's histogram.
        for i in 0..series {
            let model = format!("model-{}", i % 11);
            metrics
                .stalls
                .with_label_values(&["chat", &model, "egress", ODD[i % 6]])
                .inc_by(next() % 5 + 1);
            metrics
                .streams_active
                .with_label_values(&[ODD[i % 6]])
                .set(next() as i64 % 100 - 50);
        }
        let hitches =
            CounterFamily::new("hitches_total", "Hitches, by scope.", &["route", "scope"]).unwrap();
        metrics.register_counter(&hitches).unwrap();
        for i in 0..series {
            let stream = format!("hitch-{i}");
            let exemplar = CounterExemplar {
                stream_id: &stream,
                trace_id: (i % 3 == 0).then_some("4bf92f3577b34da6a3ce929d0e0e4736"),
                rank: (next() % 100) as f64,
            };
            let scope = ODD[i % 6];
            hitches.inc(&["chat", scope], (i % 4 != 0).then_some(&exemplar));
        }
        let other = prometheus::HistogramVec::new(
            prometheus::HistogramOpts::new("embedder_other_seconds", "Another collector's.")
                .buckets(vec![0.1, 1.0]),
            &["b", "a"],
        )
        .unwrap();
        metrics.register(Box::new(other.clone())).unwrap();
        for i in 0..series {
            other
                .with_label_values(&[ODD[i % 6], &format!("a{}", i % 5)])
                .observe((next() % 3_000) as f64 * 1e-3);
        }
    }

    /// The first line where `got` and `want` differ, with its number.
    fn same_lines(got: &str, want: &str) {
        for (n, (g, w)) in got.lines().zip(want.lines()).enumerate() {
            assert_eq!(g, w, "line {n}");
        }
        assert_eq!(got.lines().count(), want.lines().count());
        assert!(got == want);
    }

    fn assert_same(metrics: &Metrics) {
        let text = metrics.encode_as(Format::Text);
        same_lines(&String::from_utf8(text).unwrap(), &encode(metrics));
        let om = metrics.encode_as(Format::OpenMetrics);
        same_lines(
            &String::from_utf8(om).unwrap(),
            &encode_openmetrics(metrics),
        );
        assert!(
            metrics.encode_as(Format::Protobuf) == encode_protobuf(metrics),
            "the protobuf bytes differ"
        );
    }

    #[test]
    fn every_format_writes_the_bytes_the_old_encoders_wrote() {
        let mut metrics = metrics();
        populate(&mut metrics, 400, 7);
        assert_same(&metrics);
        // A series added after a scrape takes its place in the cached orders.
        metrics
            .itl
            .observe(&["aaa-new", "m", "egress", "content"], 0.04);
        metrics.ttft.observe(&["zzz-new", "m", "egress"], 0.04);
        assert_same(&metrics);
    }

    #[test]
    fn an_empty_registry_writes_what_it_wrote() {
        assert_same(&metrics());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn any_registry_is_written_as_the_old_encoders_wrote_it(
            series in 0usize..40,
            seed in any::<u64>(),
        ) {
            let mut metrics = metrics();
            populate(&mut metrics, series, seed);
            assert_same(&metrics);
        }
    }
}
