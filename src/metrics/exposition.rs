//! `/metrics` in the format the scraper asks for with its `Accept` header: Prometheus protobuf
//! (classic and native buckets, exemplars), OpenMetrics text 1.0.0 (classic buckets, `# UNIT`,
//! `_created`, exemplars, `# EOF`), or the text format 0.0.4 exactly as before for anything else.
//!
//! The histogram families are read from their own series, each format written straight into one
//! buffer (`text`, `openmetrics`, `proto_wire`); the counters and gauges from the `prometheus`
//! crate's registry. `reference` keeps the encoders as they were, which the tests hold these to
//! byte for byte.

use std::sync::atomic::{AtomicUsize, Ordering};

use prometheus::proto as source;

use super::histogram::HistogramFamily;
use super::{openmetrics, proto, proto_wire, text, Metrics};

/// The content type of the OpenMetrics text exposition.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A format of the exposition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
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

/// A family as the encoders take it: one of ours, read from its series, or one the
/// `prometheus` crate's registry gathered (counters, gauges, other collectors).
enum Part<'a> {
    Ours(&'a HistogramFamily),
    Gathered(source::MetricFamily),
}

/// Room for the next exposition of a format: the last one's size, and a little more.
fn room(last: &AtomicUsize) -> usize {
    let last = last.load(Ordering::Relaxed);
    last + last / 16
}

// === impl Metrics (exposition) ===

impl Metrics {
    /// Every metric in `format`, written into one buffer sized by the last exposition in it.
    pub fn encode_as(&self, format: Format) -> Vec<u8> {
        let last = &self.exposition_sizes[format as usize];
        let mut out = Vec::with_capacity(room(last));
        for part in self.parts() {
            match (format, &part) {
                (Format::Text, Part::Ours(family)) => text::histogram(&mut out, family),
                (Format::Text, Part::Gathered(family)) => text::gathered(&mut out, family),
                (Format::OpenMetrics, Part::Ours(family)) => {
                    openmetrics::histogram(&mut out, family)
                }
                (Format::OpenMetrics, Part::Gathered(family)) => {
                    let exemplars = self
                        .counter_family(family.name())
                        .map(|c| c.exemplars(true));
                    openmetrics::gathered(&mut out, family, exemplars.as_ref());
                }
                (Format::Protobuf, Part::Ours(family)) => {
                    proto_wire::histogram_family(&mut out, family)
                }
                (Format::Protobuf, Part::Gathered(family)) => {
                    let exemplars = self
                        .counter_family(family.name())
                        .map(|c| c.exemplars(true));
                    let message = proto::from_gathered(family, exemplars.as_ref());
                    proto::write_delimited(&message, &mut out);
                }
            }
        }
        if format == Format::OpenMetrics {
            out.extend_from_slice(b"# EOF\n");
        }
        last.store(out.len(), Ordering::Relaxed);
        out
    }

    /// The families in the order the registry gathers them (by name): its own (our histogram
    /// families hold only their names there) merged with our histogram families, each of ours
    /// before a gathered family of the same name.
    fn parts(&self) -> Vec<Part<'_>> {
        let mut ours: Vec<&HistogramFamily> = self.histograms.iter().collect();
        ours.sort_by(|a, b| a.name().cmp(b.name()));
        let mut ours = ours.into_iter().peekable();
        let mut parts = Vec::with_capacity(self.histograms.len() + 32);
        for family in self.registry.gather() {
            while let Some(mine) = ours.next_if(|h| h.name() <= family.name()) {
                parts.push(Part::Ours(mine));
            }
            parts.push(Part::Gathered(family));
        }
        parts.extend(ours.map(Part::Ours));
        parts
    }

    /// The protobuf exposition.
    pub fn encode_protobuf(&self) -> Vec<u8> {
        self.encode_as(Format::Protobuf)
    }

    /// The OpenMetrics text exposition.
    pub fn encode_openmetrics(&self) -> String {
        into_string(self.encode_as(Format::OpenMetrics))
    }

    /// Encodes every metric in the Prometheus text format (version 0.0.4).
    pub fn encode(&self) -> String {
        into_string(self.encode_as(Format::Text))
    }
}

/// A text exposition as a `String`; the encoders write only UTF-8 (names, escaped label values
/// and help texts, ASCII numbers).
fn into_string(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
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
}
