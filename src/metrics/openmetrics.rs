//! OpenMetrics text 1.0.0 (classic buckets, `# UNIT`, `_created`, exemplars), written straight
//! into one buffer: a histogram family of ours is read series by series under each series' lock
//! ([`HistogramFamily::scrape`]), its labels written once per series and copied onto each
//! sample, its numbers by [`super::numbers`], no `String` per sample.

use prometheus::proto as source;

use super::counter::CounterExemplars;
use super::histogram::{HistogramFamily, SeriesOrder, StoredExemplar};
use super::numbers::{push, push_escaped, push_millis, push_om, push_u64};
use super::text::bucket_prefix;

/// The unit a metric's name ends with, for `# UNIT`.
fn unit_of(name: &str) -> Option<&'static str> {
    name.ends_with("_seconds").then_some("seconds")
}

fn header(out: &mut Vec<u8>, name: &str, kind: &str, help: &str) {
    for (line, rest) in [("# TYPE ", kind), ("# UNIT ", unit_of(name).unwrap_or(""))] {
        if rest.is_empty() {
            continue;
        }
        push(out, line);
        push(out, name);
        out.push(b' ');
        push(out, rest);
        out.push(b'\n');
    }
    push(out, "# HELP ");
    push(out, name);
    out.push(b' ');
    push_escaped(out, help, false);
    out.push(b'\n');
}

/// `{a="1",b="2"` for these pairs, without the closing brace; nothing without pairs.
fn open_labels<'a>(out: &mut Vec<u8>, pairs: impl Iterator<Item = (&'a str, &'a str)>) {
    for (name, value) in pairs {
        out.push(if out.is_empty() { b'{' } else { b',' });
        push(out, name);
        push(out, "=\"");
        push_escaped(out, value, true);
        out.push(b'"');
    }
}

/// ` # {stream_id="…",trace_id="…"} value timestamp`.
fn exemplar(out: &mut Vec<u8>, exemplar: &StoredExemplar) {
    let stream_id = &*exemplar.stream_id;
    // OpenMetrics allows 128 characters of exemplar label names and values.
    let trace_id = exemplar.trace_id.as_deref().filter(|trace_id| {
        "stream_id".len() + stream_id.chars().count() + "trace_id".len() + trace_id.chars().count()
            <= 128
    });
    push(out, " # {stream_id=\"");
    push_escaped(out, stream_id, true);
    if let Some(trace_id) = trace_id {
        push(out, "\",trace_id=\"");
        push_escaped(out, trace_id, true);
    }
    push(out, "\"} ");
    push_om(out, exemplar.value);
    out.push(b' ');
    push_millis(out, exemplar.timestamp);
}

/// Appends a histogram family of ours; nothing when it has no series. Its exemplars count as
/// shown.
pub fn histogram(out: &mut Vec<u8>, family: &HistogramFamily) {
    let name = family.name();
    let names = family.label_names();
    let mut les: Vec<Vec<u8>> = family
        .bounds()
        .iter()
        .map(|b| {
            let mut le = Vec::new();
            push_om(&mut le, *b);
            le
        })
        .collect();
    les.push(b"+Inf".to_vec());
    let mut labels: Vec<u8> = Vec::new();
    let mut bucket: Vec<u8> = Vec::new();
    let mut first = true;
    family.scrape(SeriesOrder::ByValues, true, true, |series| {
        if first {
            header(out, name, "histogram", family.help());
            first = false;
        }
        labels.clear();
        let pairs = names.iter().map(String::as_str);
        open_labels(
            &mut labels,
            pairs.zip(series.label_values.iter().map(String::as_str)),
        );
        bucket_prefix(&mut bucket, name, &labels);
        let mut cumulative = 0u64;
        for (i, (count, le)) in series.counts.iter().zip(&les).enumerate() {
            cumulative += count;
            out.extend_from_slice(&bucket);
            out.extend_from_slice(le);
            push(out, "\"} ");
            push_u64(out, cumulative);
            if let Some(stored) = series.exemplars.get(i).and_then(Option::as_ref) {
                exemplar(out, stored);
            }
            out.push(b'\n');
        }
        if !labels.is_empty() {
            labels.push(b'}');
        }
        let mut line = |suffix: &str, value: &dyn Fn(&mut Vec<u8>)| {
            push(out, name);
            push(out, suffix);
            out.extend_from_slice(&labels);
            out.push(b' ');
            value(out);
            out.push(b'\n');
        };
        line("_count", &|out| push_u64(out, series.count));
        line("_sum", &|out| push_om(out, series.sum));
        line("_created", &|out| push_millis(out, series.created));
    });
}

/// One sample of a gathered family: `name` `suffix` `{labels,extra}` `value`, no newline.
fn sample(
    out: &mut Vec<u8>,
    name: &str,
    suffix: &str,
    metric: &source::Metric,
    extra: Option<(&str, &str)>,
    value: &dyn Fn(&mut Vec<u8>),
) {
    push(out, name);
    push(out, suffix);
    let pairs = metric.get_label().iter().map(|l| (l.name(), l.value()));
    let mut any = false;
    for (n, v) in pairs {
        out.push(if any { b',' } else { b'{' });
        any = true;
        push(out, n);
        push(out, "=\"");
        push_escaped(out, v, true);
        out.push(b'"');
    }
    if let Some((n, v)) = extra {
        out.push(if any { b',' } else { b'{' });
        any = true;
        push(out, n);
        push(out, "=\"");
        push(out, v);
        out.push(b'"');
    }
    if any {
        out.push(b'}');
    }
    out.push(b' ');
    value(out);
}

/// Appends a family the `prometheus` crate gathered; a counter's `_total` samples carry
/// `exemplars`.
// `Untyped` is deprecated in the crate's proto, which still gathers it for untyped collectors.
#[allow(deprecated)]
pub fn gathered(
    out: &mut Vec<u8>,
    family: &source::MetricFamily,
    exemplars: Option<&CounterExemplars>,
) {
    let name = family.name();
    match family.get_field_type() {
        source::MetricType::COUNTER => {
            let base = name.strip_suffix("_total").unwrap_or(name);
            header(out, base, "counter", family.help());
            for m in family.get_metric() {
                let value = m.get_counter().get_value();
                sample(out, base, "_total", m, None, &|out| push_om(out, value));
                if let Some(stored) = exemplars.and_then(|e| e.of_pairs(m.get_label())) {
                    exemplar(out, stored);
                }
                out.push(b'\n');
            }
        }
        source::MetricType::GAUGE => {
            header(out, name, "gauge", family.help());
            for m in family.get_metric() {
                let value = m.get_gauge().get_value();
                sample(out, name, "", m, None, &|out| push_om(out, value));
                out.push(b'\n');
            }
        }
        source::MetricType::HISTOGRAM => {
            header(out, name, "histogram", family.help());
            for m in family.get_metric() {
                let h = m.get_histogram();
                for b in h.get_bucket() {
                    let mut le = Vec::new();
                    push_om(&mut le, b.upper_bound());
                    let le = String::from_utf8_lossy(&le);
                    let count = b.cumulative_count();
                    sample(out, name, "_bucket", m, Some(("le", &le)), &|out| {
                        push_u64(out, count)
                    });
                    out.push(b'\n');
                }
                let count = h.get_sample_count();
                let sum = h.get_sample_sum();
                sample(out, name, "_bucket", m, Some(("le", "+Inf")), &|out| {
                    push_u64(out, count)
                });
                out.push(b'\n');
                sample(out, name, "_count", m, None, &|out| push_u64(out, count));
                out.push(b'\n');
                sample(out, name, "_sum", m, None, &|out| push_om(out, sum));
                out.push(b'\n');
            }
        }
        source::MetricType::SUMMARY | source::MetricType::UNTYPED => {
            header(out, name, "unknown", family.help());
            for m in family.get_metric() {
                let value = m.get_untyped().get_value();
                sample(out, name, "", m, None, &|out| push_om(out, value));
                out.push(b'\n');
            }
        }
    }
}
