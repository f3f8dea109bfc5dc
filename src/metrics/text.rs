//! The Prometheus text format 0.0.4, written straight into one buffer: byte for byte what the
//! `prometheus` crate's `TextEncoder` writes for the same families, without its per-series
//! messages, its per-sample `String`s or a sort per scrape.
//!
//! A histogram family of ours is read from its series in the order the crate's registry would
//! sort them ([`SeriesOrder::ByNames`], cached by the family); each series' labels are written
//! once and copied onto each of its samples.

use prometheus::proto as source;

use super::histogram::{HistogramFamily, SeriesOrder};
use super::numbers::{push, push_count, push_display, push_escaped};

/// The `# HELP` (when there is help) and `# TYPE` lines.
fn header(out: &mut Vec<u8>, name: &str, help: &str, kind: &str) {
    if !help.is_empty() {
        push(out, "# HELP ");
        push(out, name);
        push(out, " ");
        push_escaped(out, help, false);
        push(out, "\n");
    }
    push(out, "# TYPE ");
    push(out, name);
    push(out, " ");
    push(out, kind);
    push(out, "\n");
}

/// Appends a histogram family of ours; nothing when it has no series (the registry prunes
/// empty families).
pub fn histogram(out: &mut Vec<u8>, family: &HistogramFamily) {
    let name = family.name();
    let names = family.label_names();
    let mut by_name: Vec<usize> = (0..names.len()).collect();
    by_name.sort_by_key(|i| &names[*i]);
    let bounds = family.bounds();
    let les: Vec<Vec<u8>> = bounds
        .iter()
        .map(|b| {
            let mut le = Vec::new();
            push_escaped(&mut le, &b.to_string(), true);
            le
        })
        .collect();
    let inf_seen = bounds
        .iter()
        .any(|b| b.is_sign_positive() && b.is_infinite());
    // `{a="1",b="2"` of the series at hand (empty without labels), then the bucket's prefix.
    let mut labels: Vec<u8> = Vec::new();
    let mut bucket: Vec<u8> = Vec::new();
    let mut first = true;
    family.scrape(SeriesOrder::ByNames, false, false, |series| {
        if first {
            header(out, name, family.help(), "histogram");
            first = false;
        }
        labels.clear();
        for i in by_name.iter().filter(|i| **i < series.label_values.len()) {
            labels.push(if labels.is_empty() { b'{' } else { b',' });
            push(&mut labels, &names[*i]);
            push(&mut labels, "=\"");
            push_escaped(&mut labels, &series.label_values[*i], true);
            labels.push(b'"');
        }
        bucket_prefix(&mut bucket, name, &labels);
        let mut cumulative = 0u64;
        for (le, count) in les.iter().zip(series.counts) {
            cumulative += count;
            out.extend_from_slice(&bucket);
            out.extend_from_slice(le);
            push(out, "\"} ");
            push_count(out, cumulative);
            out.push(b'\n');
        }
        if !inf_seen {
            out.extend_from_slice(&bucket);
            push(out, "+Inf\"} ");
            push_count(out, series.count);
            out.push(b'\n');
        }
        if !labels.is_empty() {
            labels.push(b'}');
        }
        for (suffix, count) in [("_sum", None), ("_count", Some(series.count))] {
            push(out, name);
            push(out, suffix);
            out.extend_from_slice(&labels);
            out.push(b' ');
            match count {
                Some(count) => push_count(out, count),
                None => push_display(out, series.sum),
            }
            out.push(b'\n');
        }
    });
}

/// One sample of a gathered family: `name` `suffix` `{labels,extra}` `value` `timestamp`.
fn sample(
    out: &mut Vec<u8>,
    name: &str,
    suffix: &str,
    metric: &source::Metric,
    extra: Option<(&str, &str)>,
    value: f64,
) {
    push(out, name);
    push(out, suffix);
    let pairs = metric.get_label();
    if !pairs.is_empty() || extra.is_some() {
        let mut separator = b'{';
        let named = pairs.iter().map(|l| (l.name(), l.value()));
        for (n, v) in named.chain(extra) {
            out.push(separator);
            push(out, n);
            push(out, "=\"");
            push_escaped(out, v, true);
            out.push(b'"');
            separator = b',';
        }
        out.push(b'}');
    }
    out.push(b' ');
    push_display(out, value);
    let timestamp = metric.timestamp_ms();
    if timestamp != 0 {
        out.push(b' ');
        push(out, &timestamp.to_string());
    }
    out.push(b'\n');
}

/// Appends a family the `prometheus` crate gathered (never empty: its registry prunes those),
/// as its `TextEncoder` writes it. An untyped family, which that encoder cannot write (it
/// panics), is written as a gauge's samples under `# TYPE … untyped`.
#[allow(deprecated)] // `Untyped`: see `exposition::om_gathered`.
pub fn gathered(out: &mut Vec<u8>, family: &source::MetricFamily) {
    let name = family.name();
    let kind = family.get_field_type();
    header(
        out,
        name,
        family.help(),
        match kind {
            source::MetricType::COUNTER => "counter",
            source::MetricType::GAUGE => "gauge",
            source::MetricType::SUMMARY => "summary",
            source::MetricType::UNTYPED => "untyped",
            source::MetricType::HISTOGRAM => "histogram",
        },
    );
    for m in family.get_metric() {
        match kind {
            source::MetricType::COUNTER => {
                sample(out, name, "", m, None, m.get_counter().get_value())
            }
            source::MetricType::GAUGE => sample(out, name, "", m, None, m.get_gauge().get_value()),
            source::MetricType::UNTYPED => {
                sample(out, name, "", m, None, m.get_untyped().get_value())
            }
            source::MetricType::HISTOGRAM => {
                let h = m.get_histogram();
                let mut inf_seen = false;
                for b in h.get_bucket() {
                    let upper = b.upper_bound();
                    let le = upper.to_string();
                    let count = b.cumulative_count() as f64;
                    sample(out, name, "_bucket", m, Some(("le", &le)), count);
                    inf_seen |= upper.is_sign_positive() && upper.is_infinite();
                }
                let count = h.get_sample_count() as f64;
                if !inf_seen {
                    sample(out, name, "_bucket", m, Some(("le", "+Inf")), count);
                }
                sample(out, name, "_sum", m, None, h.get_sample_sum());
                sample(out, name, "_count", m, None, count);
            }
            source::MetricType::SUMMARY => {
                let s = m.get_summary();
                for q in s.get_quantile() {
                    let quantile = q.quantile().to_string();
                    sample(out, name, "", m, Some(("quantile", &quantile)), q.value());
                }
                sample(out, name, "_sum", m, None, s.sample_sum());
                sample(out, name, "_count", m, None, s.sample_count() as f64);
            }
        }
    }
}

/// `NAME_bucket{LABELS,le="` into `bucket` (emptied first): the start of every bucket line of a
/// series, in both text formats, followed by the bound and the count.
pub(super) fn bucket_prefix(bucket: &mut Vec<u8>, name: &str, labels: &[u8]) {
    bucket.clear();
    push(bucket, name);
    push(bucket, "_bucket");
    if labels.is_empty() {
        bucket.push(b'{');
    } else {
        bucket.extend_from_slice(labels);
        bucket.push(b',');
    }
    push(bucket, "le=\"");
}
