//! The GenAI semconv histograms on `/metrics` (`metrics.names = "otel"` or `"both"`), in
//! Prometheus's translation: `gen_ai.server.time_to_first_token` is
//! `gen_ai_server_time_to_first_token_seconds`, `gen_ai.operation.name` is
//! `gen_ai_operation_name`.
//!
//! Read from metronome's own families at each scrape, never recorded twice. The classic buckets
//! are the semconv's bucket advice where the family's bounds hold every advised bound (then the
//! counts are exact); otherwise the family's own bounds are kept rather than guessed.

use prometheus::core::{Collector, Desc};
use prometheus::proto;

use super::names::{prometheus_label, prometheus_name, Naming, Renamed, Value};
use crate::metrics::{HistogramFamily, SeriesSnapshot};

/// One semconv histogram read from one family.
struct Translated {
    family: HistogramFamily,
    renamed: Renamed,
    desc: Desc,
    /// The bounds published, and for each the index of the family's bound it equals.
    bounds: Vec<(f64, usize)>,
}

/// A collector of every semconv histogram of a [`Naming`].
pub struct SemconvCollector {
    translated: Vec<Translated>,
}

impl std::fmt::Debug for SemconvCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SemconvCollector")
            .field("families", &self.translated.len())
            .finish()
    }
}

/// The advised bounds, each with the index of the family's bound it equals, when every one is
/// among `family`'s; otherwise the family's own.
fn published_bounds(family: &[f64], advice: Option<&[f64]>) -> Vec<(f64, usize)> {
    let find = |b: f64| family.iter().position(|f| (f - b).abs() <= 1e-12 * b.abs());
    if let Some(advice) = advice {
        let found: Option<Vec<(f64, usize)>> =
            advice.iter().map(|b| find(*b).map(|i| (*b, i))).collect();
        if let Some(found) = found {
            return found;
        }
    }
    family.iter().copied().zip(0..).collect()
}

// === impl SemconvCollector ===

impl SemconvCollector {
    /// The collector of `naming`'s semconv histograms over `families`; `None` when there are
    /// none (`metrics.names = "metronome"`).
    pub fn new(naming: &Naming, families: &[HistogramFamily]) -> prometheus::Result<Option<Self>> {
        let mut translated = Vec::new();
        if naming.names() == crate::metrics::Names::Metronome {
            return Ok(None);
        }
        for family in families {
            for renamed in naming.semconv(family.name()) {
                let labels = renamed
                    .attributes(&[
                        ("route".into(), String::new()),
                        ("model".into(), String::new()),
                    ])
                    .into_iter()
                    .map(|(k, _)| prometheus_label(&k))
                    .collect();
                let desc = Desc::new(
                    prometheus_name(&renamed.name, renamed.unit),
                    format!(
                        "{} (OpenTelemetry GenAI semconv; read from {}).",
                        renamed.name,
                        family.name()
                    ),
                    labels,
                    Default::default(),
                )?;
                translated.push(Translated {
                    bounds: published_bounds(family.bounds(), renamed.advice),
                    family: family.clone(),
                    renamed,
                    desc,
                });
            }
        }
        Ok((!translated.is_empty()).then_some(SemconvCollector { translated }))
    }
}

fn metric(t: &Translated, s: &SeriesSnapshot) -> proto::Metric {
    let mut cumulative = 0u64;
    let mut next = 0usize;
    let mut buckets = Vec::with_capacity(t.bounds.len());
    for (bound, index) in &t.bounds {
        while next <= *index {
            cumulative += s.counts.get(next).copied().unwrap_or(0);
            next += 1;
        }
        let mut bucket = proto::Bucket::default();
        bucket.set_upper_bound(*bound);
        bucket.set_cumulative_count(cumulative);
        buckets.push(bucket);
    }
    let mut histogram = proto::Histogram::default();
    histogram.set_bucket(buckets);
    histogram.set_sample_sum(s.sum);
    histogram.set_sample_count(s.count);
    let mut labels: Vec<proto::LabelPair> = t
        .renamed
        .attributes(&s.labels)
        .into_iter()
        .map(|(k, v)| {
            let mut pair = proto::LabelPair::default();
            pair.set_name(prometheus_label(&k));
            pair.set_value(match v {
                Value::Str(s) => s,
                Value::Int(i) => i.to_string(),
            });
            pair
        })
        .collect();
    labels.sort_by(|a, b| a.name().cmp(b.name()));
    let mut metric = proto::Metric::from_label(labels);
    metric.set_histogram(histogram);
    metric
}

impl Collector for SemconvCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.translated.iter().map(|t| &t.desc).collect()
    }

    fn collect(&self) -> Vec<proto::MetricFamily> {
        self.translated
            .iter()
            .map(|t| {
                let metrics = t
                    .family
                    .snapshot(false)
                    .iter()
                    .filter(|s| t.renamed.keeps(&s.labels))
                    .map(|s| metric(t, s))
                    .collect();
                let mut family = proto::MetricFamily::default();
                family.set_name(t.desc.fq_name.clone());
                family.set_help(t.desc.help.clone());
                family.set_field_type(proto::MetricType::HISTOGRAM);
                family.set_metric(metrics);
                family
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Names;
    use crate::metrics::{Buckets, Metrics, ModelLabels};
    use std::time::Duration;

    #[test]
    fn advised_bounds_are_used_when_the_family_holds_them() {
        assert_eq!(
            published_bounds(&[0.1, 0.2, 0.5, 1.0], Some(&[0.2, 1.0])),
            vec![(0.2, 1), (1.0, 3)]
        );
        assert_eq!(
            published_bounds(&[0.1, 0.2], Some(&[0.3])),
            vec![(0.1, 0), (0.2, 1)]
        );
    }

    #[test]
    fn the_ttft_histogram_appears_under_its_semconv_name_with_the_advice() {
        let m = Metrics::new(
            &Buckets::default(),
            ModelLabels::new(&[], 8),
            Duration::from_secs(1),
        )
        .unwrap();
        for v in [0.003, 0.3, 30.0] {
            m.ttft.observe(&["chat", "m1", "ingress"], v);
        }
        m.ttft.observe(&["chat", "m1", "egress"], 0.31);
        let collector = SemconvCollector::new(&Naming::with(Names::Otel, false), &m.histograms)
            .unwrap()
            .unwrap();
        m.register(Box::new(collector)).unwrap();
        let text = m.encode();
        let ttft = "gen_ai_server_time_to_first_token_seconds";
        let line = |suffix: &str| {
            text.lines()
                .find(|l| l.starts_with(&format!("{ttft}{suffix}")))
                .unwrap_or_else(|| panic!("no {ttft}{suffix} in\n{text}"))
                .to_string()
        };
        assert!(line("_count").ends_with(" 3"), "{}", line("_count"));
        assert!(line("_count").contains(r#"gen_ai_operation_name="chat""#));
        assert!(line("_count").contains(r#"gen_ai_response_model="m1""#));
        // The advice's bounds exactly: 0.005 holds 1, 0.5 holds 2, 10 (the last) still 2.
        assert!(line(r#"_bucket{gen_ai_operation_name="chat""#).contains(r#"le="0.001""#));
        let bucket = |le: &str| {
            text.lines()
                .find(|l| {
                    l.starts_with(&format!("{ttft}_bucket")) && l.contains(&format!("le=\"{le}\""))
                })
                .map(|l| l.rsplit(' ').next().unwrap().to_string())
        };
        assert_eq!(bucket("0.005").as_deref(), Some("1"));
        assert_eq!(bucket("0.5").as_deref(), Some("2"));
        assert_eq!(bucket("10").as_deref(), Some("2"));
        assert_eq!(bucket("20"), None, "20 s is not advised");
        assert!(text.contains("gen_ai_client_operation_time_to_first_chunk_seconds_count"));
    }
}
