//! Numbers and label values written straight into an exposition's buffer, byte for byte as the
//! `format!` calls the encoders used before wrote them, without a `String` per number.
//!
//! The integral values (counts, most counters) take `itoa`; anything else falls back to the
//! standard library's formatting, so every byte stays what `Display` or `{:.3}` writes.

use std::io::Write as _;

/// 2^53: below it every integer is an exact `f64`, and `Display` writes its digits.
const EXACT_INTEGERS: f64 = 9_007_199_254_740_992.0;

/// Appends `text`.
#[inline]
pub fn push(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(text.as_bytes());
}

/// Appends `value`'s decimal digits (`u64`'s `Display`).
#[inline]
pub fn push_u64(out: &mut Vec<u8>, value: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
}

/// Appends `value` as `f64`'s `Display` writes it (the text format 0.0.4's numbers): the digits
/// of an integer, the shortest decimal that reads back otherwise, never an exponent.
#[inline]
pub fn push_display(out: &mut Vec<u8>, value: f64) {
    if value.fract() == 0.0 && value.abs() < EXACT_INTEGERS && !is_negative_zero(value) {
        out.extend_from_slice(itoa::Buffer::new().format(value as i64).as_bytes());
    } else {
        let _ = write!(out, "{value}");
    }
}

/// Appends a count as the text format 0.0.4 writes it: the `f64` it converts to, in `Display`.
#[inline]
pub fn push_count(out: &mut Vec<u8>, count: u64) {
    if count < 1 << 53 {
        push_u64(out, count);
    } else {
        push_display(out, count as f64);
    }
}

/// Appends a number as OpenMetrics writes it: `+Inf`, `-Inf`, `NaN`, an integer below 10^15
/// with `.0`, anything else as `Display` writes it.
#[inline]
pub fn push_om(out: &mut Vec<u8>, value: f64) {
    if value.is_infinite() {
        push(out, if value > 0.0 { "+Inf" } else { "-Inf" });
    } else if value.is_nan() {
        push(out, "NaN");
    } else if value.fract() == 0.0 && value.abs() < 1e15 {
        if is_negative_zero(value) {
            push(out, "-0.0");
        } else {
            out.extend_from_slice(itoa::Buffer::new().format(value as i64).as_bytes());
            push(out, ".0");
        }
    } else {
        push_display(out, value);
    }
}

/// Appends a Unix time in seconds with millisecond precision, as `{:.3}` writes it.
///
/// `{:.3}` rounds the exact binary value to the nearest thousandth. Below 2^42 thousandths
/// (the year 2109) `value * 1000` is within 2^-11 of the exact product, so unless the product
/// lies within a thousandth of a half (a tie, or near one), rounding it gives the same
/// thousandth; those rare cases, negative and larger values take `{:.3}` itself.
#[inline]
pub fn push_millis(out: &mut Vec<u8>, value: f64) {
    const LIMIT: f64 = 4_398_046_511_104.0; // 2^42
    let scaled = value * 1000.0;
    if value.is_sign_positive() && (0.0..LIMIT).contains(&scaled) {
        let whole = scaled.floor();
        let fraction = scaled - whole;
        if (fraction - 0.5).abs() > 1e-3 {
            let millis = whole as u64 + u64::from(fraction > 0.5);
            push_u64(out, millis / 1000);
            let rest = millis % 1000;
            let digit = |d: u64| b'0' + d as u8;
            out.extend_from_slice(&[
                b'.',
                digit(rest / 100),
                digit(rest / 10 % 10),
                digit(rest % 10),
            ]);
            return;
        }
    }
    let _ = write!(out, "{value:.3}");
}

fn is_negative_zero(value: f64) -> bool {
    value == 0.0 && value.is_sign_negative()
}

/// Appends a label value (`quote`: `"` escaped too) or help text with `\`, newline and `"`
/// escaped, as both text formats escape them.
#[inline]
pub fn push_escaped(out: &mut Vec<u8>, text: &str, quote: bool) {
    let bytes = text.as_bytes();
    let special = |b: &u8| *b == b'\\' || *b == b'\n' || (quote && *b == b'"');
    if !bytes.iter().any(special) {
        out.extend_from_slice(bytes);
        return;
    }
    for b in bytes {
        match b {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'"' if quote => out.extend_from_slice(b"\\\""),
            b => out.push(*b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn with(f: impl FnOnce(&mut Vec<u8>)) -> String {
        let mut out = Vec::new();
        f(&mut out);
        String::from_utf8(out).unwrap()
    }

    /// OpenMetrics' number, as the encoder wrote it with `format!`.
    fn om_reference(value: f64) -> String {
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

    fn check(value: f64) {
        assert_eq!(with(|o| push_display(o, value)), format!("{value}"));
        assert_eq!(with(|o| push_om(o, value)), om_reference(value));
        assert_eq!(
            with(|o| push_millis(o, value)),
            format!("{value:.3}"),
            "{value:e}"
        );
    }

    #[test]
    fn edges_are_written_as_format_writes_them() {
        for value in [
            0.0,
            -0.0,
            1.0,
            -1.0,
            0.5,
            0.0005,
            0.0015,
            2.5e-3,
            1e15,
            1e15 - 1.0,
            EXACT_INTEGERS,
            EXACT_INTEGERS - 1.0,
            1e300,
            f64::MAX,
            f64::MIN_POSITIVE,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            1_764_892_800.000_5,
            1_764_892_800.123_5,
            4_398_046_511.104_5,
        ] {
            check(value);
        }
        for count in [0, 1, 201, (1 << 53) - 1, 1 << 53, (1 << 53) + 1, u64::MAX] {
            assert_eq!(with(|o| push_count(o, count)), (count as f64).to_string());
        }
        assert_eq!(
            with(|o| push_escaped(o, "a\"b\\c\nd", true)),
            "a\\\"b\\\\c\\nd"
        );
        assert_eq!(
            with(|o| push_escaped(o, "a\"b\\c\nd", false)),
            "a\"b\\\\c\\nd"
        );
    }

    proptest! {
        #[test]
        fn any_number_is_written_as_format_writes_it(bits in any::<u64>()) {
            check(f64::from_bits(bits));
        }

        #[test]
        fn any_timestamp_is_written_as_format_writes_it(
            seconds in 0u64..4_400_000_000,
            millis in 0u64..1_000_000,
        ) {
            // Unix times with sub-millisecond parts, and exact thousandths and ties.
            check(seconds as f64 + millis as f64 * 1e-6);
            check(seconds as f64 + (millis / 1000) as f64 * 1e-3);
            check(seconds as f64 + (millis / 1000) as f64 * 1e-3 + 0.0005);
        }

        #[test]
        fn any_small_number_is_written_as_format_writes_it(value in -1e6f64..1e6) {
            check(value);
        }

        #[test]
        fn any_text_is_escaped_as_before(text in ".*", quote in any::<bool>()) {
            let mut want = String::new();
            for c in text.chars() {
                match c {
                    '\\' => want.push_str("\\\\"),
                    '\n' => want.push_str("\\n"),
                    '"' if quote => want.push_str("\\\""),
                    c => want.push(c),
                }
            }
            prop_assert_eq!(with(|o| push_escaped(o, &text, quote)), want);
        }
    }
}
