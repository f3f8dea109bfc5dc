//! A histogram family of ours as a length-delimited `io.prometheus.client.MetricFamily`,
//! written straight from its series: byte for byte what `prost` encodes for the messages of
//! [`super::proto::histogram_family`] (fields in tag order, proto3 defaults left out, repeated
//! numbers packed), without building them, their `String`s or a snapshot.
//!
//! The small messages (label pairs, timestamps, exemplars, buckets, spans) have their lengths
//! worked out before they are written; a series' `Histogram` is written into a scratch buffer
//! (its length comes before it), and the family's series into another, once.

use super::histogram::{HistogramFamily, SeriesOrder, SeriesView, StoredExemplar};
use super::native::NativeState;
use super::proto::MetricType;

/// Wire type of a varint.
const VARINT: u32 = 0;
/// Wire type of a fixed 64-bit number.
const FIXED64: u32 = 1;
/// Wire type of a length-delimited field.
const LEN: u32 = 2;

fn varint_len(value: u64) -> usize {
    // One byte per 7 bits, at least one.
    (64 - (value | 1).leading_zeros() as usize).div_ceil(7)
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn key_len(tag: u32) -> usize {
    varint_len(u64::from(tag << 3))
}

fn put_key(out: &mut Vec<u8>, tag: u32, wire: u32) {
    put_varint(out, u64::from(tag << 3 | wire));
}

fn zigzag32(value: i32) -> u64 {
    u64::from(((value << 1) ^ (value >> 31)) as u32)
}

fn zigzag64(value: i64) -> u64 {
    ((value << 1) ^ (value >> 63)) as u64
}

/// A `uint64`/`int64`/`int32` field's bytes (negative numbers as ten-byte varints), or none for
/// zero.
fn varint_field_len(tag: u32, value: u64) -> usize {
    if value == 0 {
        0
    } else {
        key_len(tag) + varint_len(value)
    }
}

fn put_varint_field(out: &mut Vec<u8>, tag: u32, value: u64) {
    if value != 0 {
        put_key(out, tag, VARINT);
        put_varint(out, value);
    }
}

/// A `double` field's bytes, or none for zero (NaN is written, as `prost` writes it).
fn double_field_len(tag: u32, value: f64) -> usize {
    if value != 0.0 {
        key_len(tag) + 8
    } else {
        0
    }
}

fn put_double_field(out: &mut Vec<u8>, tag: u32, value: f64) {
    if value != 0.0 {
        put_key(out, tag, FIXED64);
        out.extend_from_slice(&value.to_le_bytes());
    }
}

/// An embedded message's bytes: key, length, body.
fn message_len(tag: u32, body: usize) -> usize {
    key_len(tag) + varint_len(body as u64) + body
}

fn put_message_head(out: &mut Vec<u8>, tag: u32, body: usize) {
    put_key(out, tag, LEN);
    put_varint(out, body as u64);
}

fn string_field_len(tag: u32, text: &str) -> usize {
    if text.is_empty() {
        0
    } else {
        message_len(tag, text.len())
    }
}

fn put_string_field(out: &mut Vec<u8>, tag: u32, text: &str) {
    if !text.is_empty() {
        put_message_head(out, tag, text.len());
        out.extend_from_slice(text.as_bytes());
    }
}

fn label_pair_len(name: &str, value: &str) -> usize {
    string_field_len(1, name) + string_field_len(2, value)
}

fn put_label_pair(out: &mut Vec<u8>, tag: u32, name: &str, value: &str) {
    put_message_head(out, tag, label_pair_len(name, value));
    put_string_field(out, 1, name);
    put_string_field(out, 2, value);
}

/// `google.protobuf.Timestamp` of a Unix time in seconds, as `proto::timestamp` makes it.
fn timestamp(unix_seconds: f64) -> (u64, u64) {
    let seconds = unix_seconds.floor();
    let nanos = ((unix_seconds - seconds) * 1e9) as i32;
    (seconds as i64 as u64, i64::from(nanos) as u64)
}

fn timestamp_len(unix_seconds: f64) -> usize {
    let (seconds, nanos) = timestamp(unix_seconds);
    varint_field_len(1, seconds) + varint_field_len(2, nanos)
}

fn put_timestamp(out: &mut Vec<u8>, tag: u32, unix_seconds: f64) {
    let (seconds, nanos) = timestamp(unix_seconds);
    put_message_head(out, tag, timestamp_len(unix_seconds));
    put_varint_field(out, 1, seconds);
    put_varint_field(out, 2, nanos);
}

fn exemplar_len(stored: &StoredExemplar) -> usize {
    let mut len = message_len(1, label_pair_len("stream_id", &stored.stream_id));
    if let Some(trace_id) = &stored.trace_id {
        len += message_len(1, label_pair_len("trace_id", trace_id));
    }
    len + double_field_len(2, stored.value) + message_len(3, timestamp_len(stored.timestamp))
}

fn put_exemplar(out: &mut Vec<u8>, tag: u32, stored: &StoredExemplar) {
    put_message_head(out, tag, exemplar_len(stored));
    put_label_pair(out, 1, "stream_id", &stored.stream_id);
    if let Some(trace_id) = &stored.trace_id {
        put_label_pair(out, 1, "trace_id", trace_id);
    }
    put_double_field(out, 2, stored.value);
    put_timestamp(out, 3, stored.timestamp);
}

/// The native fields (5, 6, 7, 12, 13): schema, zero bucket, spans and deltas; `deltas` is
/// scratch for the packed deltas.
fn put_native(out: &mut Vec<u8>, native: &NativeState, deltas: &mut Vec<u8>) {
    put_varint_field(out, 5, zigzag32(i32::from(native.schema)));
    put_double_field(out, 6, native.zero_threshold);
    put_varint_field(out, 7, native.zero_count);
    let (spans, counts) = native.spans_and_deltas();
    if spans.is_empty() {
        // A no-op span: an empty message.
        put_message_head(out, 12, 0);
    }
    for (offset, length) in spans {
        let offset = zigzag32(offset);
        let length = u64::from(length);
        put_message_head(
            out,
            12,
            varint_field_len(1, offset) + varint_field_len(2, length),
        );
        put_varint_field(out, 1, offset);
        put_varint_field(out, 2, length);
    }
    if !counts.is_empty() {
        deltas.clear();
        for delta in counts {
            put_varint(deltas, zigzag64(delta));
        }
        put_message_head(out, 13, deltas.len());
        out.extend_from_slice(deltas);
    }
}

/// One series' `Histogram` message body.
fn put_histogram(out: &mut Vec<u8>, bounds: &[f64], series: &SeriesView<'_>, deltas: &mut Vec<u8>) {
    put_varint_field(out, 1, series.count);
    put_double_field(out, 2, series.sum);
    let mut cumulative = 0u64;
    for (i, (bound, count)) in bounds.iter().zip(series.counts).enumerate() {
        cumulative += count;
        let exemplar = series.exemplars.get(i).and_then(Option::as_ref);
        let body = varint_field_len(1, cumulative)
            + double_field_len(2, *bound)
            + exemplar.map_or(0, |e| message_len(3, exemplar_len(e)));
        put_message_head(out, 3, body);
        put_varint_field(out, 1, cumulative);
        put_double_field(out, 2, *bound);
        if let Some(stored) = exemplar {
            put_exemplar(out, 3, stored);
        }
    }
    if let Some(native) = series.native {
        put_native(out, native, deltas);
    }
    put_timestamp(out, 15, series.created);
    if series.native.is_some() {
        for stored in series.exemplars.iter().flatten() {
            put_exemplar(out, 16, stored);
        }
    }
}

/// Appends a histogram family of ours, length-delimited; nothing when it has no series. Its
/// exemplars count as shown.
pub fn histogram_family(out: &mut Vec<u8>, family: &HistogramFamily) {
    let names = family.label_names();
    let bounds = family.bounds();
    let mut metrics: Vec<u8> = Vec::new();
    let mut histogram: Vec<u8> = Vec::new();
    let mut deltas: Vec<u8> = Vec::new();
    family.scrape(SeriesOrder::ByValues, true, true, |series| {
        histogram.clear();
        put_histogram(&mut histogram, bounds, series, &mut deltas);
        let pairs = || names.iter().zip(series.label_values);
        let labels: usize = pairs()
            .map(|(n, v)| message_len(1, label_pair_len(n, v)))
            .sum();
        put_message_head(&mut metrics, 4, labels + message_len(7, histogram.len()));
        for (name, value) in pairs() {
            put_label_pair(&mut metrics, 1, name, value);
        }
        put_message_head(&mut metrics, 7, histogram.len());
        metrics.extend_from_slice(&histogram);
    });
    if metrics.is_empty() {
        return;
    }
    let kind = MetricType::Histogram as u64;
    let head = string_field_len(1, family.name())
        + string_field_len(2, family.help())
        + varint_field_len(3, kind);
    put_varint(out, (head + metrics.len()) as u64);
    put_string_field(out, 1, family.name());
    put_string_field(out, 2, family.help());
    put_varint_field(out, 3, kind);
    out.extend_from_slice(&metrics);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_are_as_long_as_their_bytes() {
        for value in [
            0,
            1,
            127,
            128,
            16_383,
            16_384,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            let mut out = Vec::new();
            put_varint(&mut out, value);
            assert_eq!(out.len(), varint_len(value), "{value}");
            let mut want = Vec::new();
            prost::encoding::encode_varint(value, &mut want);
            assert_eq!(out, want, "{value}");
        }
        assert_eq!(zigzag32(-1), 1);
        assert_eq!(zigzag32(1), 2);
        assert_eq!(zigzag32(i32::MIN), u64::from(u32::MAX));
        assert_eq!(zigzag64(-2), 3);
    }
}
