//! `/metrics` in the format the scraper asks for with its `Accept` header: Prometheus protobuf
//! (classic and native buckets, exemplars), OpenMetrics text 1.0.0 (classic buckets, `# UNIT`,
//! `_created`, exemplars, `# EOF`), or the text format 0.0.4 exactly as before for anything else.
//!
//! The histogram families are read from their own series ([`HistogramFamily::snapshot`]); the
//! counters and gauges from the `prometheus` crate's registry.

use std::fmt::Write as _;

use prometheus::proto as source;

use super::counter::CounterExemplars;
use super::histogram::{HistogramFamily, SeriesSnapshot, StoredExemplar};
use super::{proto, Metrics};

/// The content type of the OpenMetrics text exposition.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A format of the exposition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Length-delimited `io.prometheus.client.MetricFamily` messages.
    Protobuf,
    /// OpenMetrics text 1.0.0.
    OpenMetrics,
    /// The Prometheus text format 0.0.4.
    Text,
}

// === impl Format ===

impl Format {
    /// The format an `Accept` header asks for: the listed media type of highest `q` that
    /// metronome speaks (protobuf only with `proto=io.prometheus.client.MetricFamily` and
    /// `encoding=delimited`, OpenMetrics at version 1.0.0 or unversioned), text otherwise.
    pub fn from_accept(accept: Option<&str>) -> Format {
        let Some(accept) = accept else {
            return Format::Text;
        };
        let mut best: Option<(f64, usize, Format)> = None;
        for (position, range) in accept.split(',').enumerate() {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or("").to_ascii_lowercase();
            let mut q = 1.0;
            let (mut proto, mut encoding, mut version) = (None, None, None);
            for param in parts {
                let Some((key, value)) = param.split_once('=') else {
                    continue;
                };
                let value = value.trim().trim_matches('"');
                match key.trim().to_ascii_lowercase().as_str() {
                    "q" => q = value.parse().unwrap_or(0.0),
                    "proto" => proto = Some(value.to_string()),
                    "encoding" => encoding = Some(value.to_ascii_lowercase()),
                    "version" => version = Some(value.to_string()),
                    _ => {}
                }
            }
            let format = match media.as_str() {
                "application/vnd.google.protobuf"
                    if proto.as_deref() == Some("io.prometheus.client.MetricFamily")
                        && encoding.as_deref() == Some("delimited") =>
                {
                    Format::Protobuf
                }
                "application/openmetrics-text"
                    if version.as_deref().is_none_or(|v| v == "1.0.0") =>
                {
                    Format::OpenMetrics
                }
                "text/plain" | "*/*" | "text/*" => Format::Text,
                _ => continue,
            };
            if q <= 0.0 {
                continue;
            }
            // The highest q wins; among equals, the first listed.
            if best.is_none_or(|(bq, _, _)| q > bq) {
                best = Some((q, position, format));
            }
        }
        best.map_or(Format::Text, |(_, _, format)| format)
    }

    /// The response's content type.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Protobuf => proto::CONTENT_TYPE,
            Format::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
            Format::Text => super::TEXT_CONTENT_TYPE,
        }
    }
}

/// A gathered family, with its histogram family of ours and that family's snapshot, or the
/// exemplars of a counter family of ours.
struct Gathered<'a> {
    family: source::MetricFamily,
    histogram: Option<(&'a HistogramFamily, Vec<SeriesSnapshot>)>,
    exemplars: Option<CounterExemplars>,
}

// === impl Metrics (exposition) ===

impl Metrics {
    /// Every metric in `format`.
    pub fn encode_as(&self, format: Format) -> Vec<u8> {
        match format {
            Format::Text => self.encode().into_bytes(),
            Format::Protobuf => self.encode_protobuf(),
            Format::OpenMetrics => self.encode_openmetrics().into_bytes(),
        }
    }

    /// The families in the registry's order (sorted by name), each histogram family of ours
    /// with its snapshot and each counter family of ours with its exemplars (both then count as
    /// shown).
    fn families(&self) -> Vec<Gathered<'_>> {
        self.registry
            .gather()
            .into_iter()
            .map(|family| {
                let histogram = self
                    .histograms
                    .iter()
                    .find(|h| h.name() == family.name())
                    .map(|h| (h, h.snapshot(true)));
                let exemplars = self
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

    /// The protobuf exposition.
    pub fn encode_protobuf(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for gathered in self.families() {
            let message = match &gathered.histogram {
                Some((histogram, snapshot)) => proto::histogram_family(histogram, snapshot),
                None => proto::from_gathered(&gathered.family, gathered.exemplars.as_ref()),
            };
            proto::write_delimited(&message, &mut out);
        }
        out
    }

    /// The OpenMetrics text exposition.
    pub fn encode_openmetrics(&self) -> String {
        let mut out = String::new();
        for gathered in self.families() {
            match &gathered.histogram {
                Some((histogram, snapshot)) => om_histogram(&mut out, histogram, snapshot),
                None => om_gathered(&mut out, &gathered.family, gathered.exemplars.as_ref()),
            }
        }
        out.push_str("# EOF\n");
        out
    }
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
    use super::*;

    #[test]
    fn accept_headers_choose_the_format() {
        let prom = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.6,application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
        assert_eq!(Format::from_accept(Some(prom)), Format::Protobuf);
        let om = "application/openmetrics-text;version=1.0.0;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::from_accept(Some(om)), Format::OpenMetrics);
        assert_eq!(
            Format::from_accept(Some("application/openmetrics-text; version=0.0.1")),
            Format::Text
        );
        assert_eq!(
            Format::from_accept(Some("application/vnd.google.protobuf")),
            Format::Text,
            "without proto= and encoding=delimited"
        );
        assert_eq!(Format::from_accept(None), Format::Text);
        assert_eq!(Format::from_accept(Some("*/*")), Format::Text);
        assert_eq!(Format::from_accept(Some("text/plain")), Format::Text);
        assert_eq!(
            Format::from_accept(Some("application/openmetrics-text;q=0,text/plain")),
            Format::Text
        );
    }

    fn metrics() -> Metrics {
        Metrics::new(
            &super::super::Buckets::default(),
            super::super::ModelLabels::new(&[], 8),
            std::time::Duration::from_millis(500),
        )
        .unwrap()
    }

    const HELP: &str = "Hitches, by scope.";

    /// Two hitches and an event without an exemplar, in a family with exemplars.
    fn hitches(metrics: &Metrics) -> super::super::CounterFamily {
        let family =
            super::super::CounterFamily::new("hitches_total", HELP, &["route", "scope"]).unwrap();
        metrics.register_counter(&family).unwrap();
        for (stream_id, rank) in [("s-short", 0.05), ("s-long", 0.4)] {
            let exemplar = super::super::CounterExemplar {
                stream_id,
                trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736"),
                rank,
            };
            family.inc(&["chat", "stream"], Some(&exemplar));
        }
        family.inc(&["chat", "batch"], None);
        family
    }

    #[test]
    fn counter_exemplars_leave_the_text_format_as_a_plain_counter_writes_it() {
        let with = metrics();
        hitches(&with);
        let plain = metrics();
        let vec = prometheus::IntCounterVec::new(
            prometheus::Opts::new("hitches_total", HELP),
            &["route", "scope"],
        )
        .unwrap();
        plain.register(Box::new(vec.clone())).unwrap();
        vec.with_label_values(&["chat", "stream"]).inc_by(2);
        vec.with_label_values(&["chat", "batch"]).inc();
        assert_eq!(with.encode(), plain.encode());
        assert!(with
            .encode()
            .contains("hitches_total{route=\"chat\",scope=\"stream\"} 2\n"));
    }

    #[test]
    fn openmetrics_puts_the_counter_exemplar_on_its_total_sample() {
        let metrics = metrics();
        hitches(&metrics);
        let text = metrics.encode_openmetrics();
        let line = text
            .lines()
            .find(|l| l.starts_with("hitches_total{route=\"chat\",scope=\"stream\"}"))
            .unwrap();
        let (sample, exemplar) = line.split_once(" # ").expect(line);
        assert_eq!(sample, "hitches_total{route=\"chat\",scope=\"stream\"} 2.0");
        let rest = exemplar
            .strip_prefix(
                "{stream_id=\"s-long\",trace_id=\"4bf92f3577b34da6a3ce929d0e0e4736\"} 1.0 ",
            )
            .expect(line);
        let timestamp: f64 = rest.parse().unwrap();
        assert!(timestamp > 1.0e9, "{line}");
        let batch = text
            .lines()
            .find(|l| l.starts_with("hitches_total{route=\"chat\",scope=\"batch\"}"))
            .unwrap();
        assert_eq!(batch, "hitches_total{route=\"chat\",scope=\"batch\"} 1.0");
        assert!(text.contains("# TYPE hitches counter\n"), "{text}");
    }

    #[test]
    fn protobuf_carries_the_counter_exemplar_and_decodes_back() {
        use prost::Message;
        let metrics = metrics();
        hitches(&metrics);
        let mut body = bytes::Bytes::from(metrics.encode_protobuf());
        let mut families = Vec::new();
        while !body.is_empty() {
            families.push(proto::MetricFamily::decode_length_delimited(&mut body).unwrap());
        }
        let family = families.iter().find(|f| f.name == "hitches_total").unwrap();
        assert_eq!(family.r#type, proto::MetricType::Counter as i32);
        let scope = |m: &proto::Metric| {
            m.label
                .iter()
                .find(|l| l.name == "scope")
                .map(|l| l.value.clone())
        };
        let stream = family
            .metric
            .iter()
            .find(|m| scope(m).as_deref() == Some("stream"))
            .unwrap();
        let counter = stream.counter.as_ref().unwrap();
        assert_eq!(counter.value, 2.0);
        let exemplar = counter.exemplar.as_ref().expect("the stream's exemplar");
        assert_eq!(exemplar.value, 1.0);
        let labels: Vec<(&str, &str)> = exemplar
            .label
            .iter()
            .map(|l| (l.name.as_str(), l.value.as_str()))
            .collect();
        assert_eq!(
            labels,
            [
                ("stream_id", "s-long"),
                ("trace_id", "4bf92f3577b34da6a3ce929d0e0e4736")
            ]
        );
        assert!(exemplar.timestamp.unwrap().seconds > 1_000_000_000);
        let batch = family
            .metric
            .iter()
            .find(|m| scope(m).as_deref() == Some("batch"))
            .unwrap();
        assert_eq!(batch.counter.as_ref().unwrap().exemplar, None);
        // The other counters carry none.
        let build = families
            .iter()
            .find(|f| f.name == "metronome_build_info")
            .unwrap();
        assert!(build.metric[0].gauge.is_some());
    }

    #[test]
    fn numbers_as_openmetrics_writes_them() {
        assert_eq!(number(1.0), "1.0");
        assert_eq!(number(0.25), "0.25");
        assert_eq!(number(0.00001), "0.00001");
        assert_eq!(number(f64::INFINITY), "+Inf");
        assert_eq!(escape("a\"b\\c\nd", true), "a\\\"b\\\\c\\nd");
    }
}
