//! The W3C trace context of a stream: the client's `traceparent` continued with metronome's own
//! span, and the `traceparent` injected upstream.
//!
//! A wire format below the proxy, the timelines and the OTLP exporter, which all carry it; per
//! request, one header parsed and one written (two random IDs).

use http::{HeaderMap, HeaderValue};
use rand::RngCore;

/// A span's place in its trace: what a `traceparent` carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanContext {
    /// The trace (the client's, or a new one).
    pub trace_id: [u8; 16],
    /// metronome's span for the stream.
    pub span_id: [u8; 8],
    /// The client's span, when it sent a `traceparent`.
    pub parent: Option<[u8; 8]>,
    /// Whether the trace is sampled: the parent's flag, or true for a new trace.
    pub sampled: bool,
}

/// A `traceparent` as W3C Trace Context level 1 reads it: what a continued trace takes from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    /// The trace, never all zero.
    pub trace_id: [u8; 16],
    /// The caller's span, never all zero.
    pub parent_id: [u8; 8],
    /// The sampled flag (the lowest bit of `trace-flags`; the other bits are not defined in
    /// version 00 and are ignored).
    pub sampled: bool,
}

/// The length of a version-00 `traceparent`: `vv-` 32 hex `-` 16 hex `-ff`.
const TRACEPARENT_LEN: usize = 55;

// === impl TraceParent ===

impl TraceParent {
    /// Parses a `traceparent` value exactly as the W3C recommendation says (its test suite's
    /// cases are this module's tests): optional spaces and tabs around it; a version of two
    /// lowercase hex digits other than `ff`; for version `00` exactly 55 characters; for a
    /// later version at least 55, the first 55 read as version 00 and anything after them
    /// starting with `-`; lowercase hex IDs of exact length, neither all zero. `None` is a
    /// header a receiver must not continue.
    pub fn parse(value: &str) -> Option<Self> {
        let value = value.trim_matches([' ', '\t']).as_bytes();
        let version = lower_hex::<1>(value.get(0..2)?)?[0];
        let fits = match version {
            0xff => false,
            0x00 => value.len() == TRACEPARENT_LEN,
            _ => value.len() == TRACEPARENT_LEN || value.get(TRACEPARENT_LEN) == Some(&b'-'),
        };
        if !fits || value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
            return None;
        }
        let trace_id = lower_hex::<16>(&value[3..35]).filter(|id| *id != [0; 16])?;
        let parent_id = lower_hex::<8>(&value[36..52]).filter(|id| *id != [0; 8])?;
        let flags = lower_hex::<1>(&value[53..55])?[0];
        Some(TraceParent {
            trace_id,
            parent_id,
            sampled: flags & 1 == 1,
        })
    }
}

/// `2 * N` lowercase hex digits as `N` bytes; `None` for any other length or character
/// (`u8::from_str_radix` would also take upper case and a leading `+`).
fn lower_hex<const N: usize>(text: &[u8]) -> Option<[u8; N]> {
    if text.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (byte, pair) in out.iter_mut().zip(text.chunks_exact(2)) {
        *byte = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

// === impl SpanContext ===

impl SpanContext {
    /// The context of a new span under `traceparent`; a new trace when there is none or it
    /// is not one to continue ([`TraceParent::parse`]).
    pub fn continue_from(traceparent: Option<&str>) -> Self {
        let mut rng = rand::thread_rng();
        let mut span_id = [0u8; 8];
        while span_id == [0; 8] {
            rng.fill_bytes(&mut span_id);
        }
        match traceparent.and_then(TraceParent::parse) {
            Some(parent) => SpanContext {
                trace_id: parent.trace_id,
                span_id,
                parent: Some(parent.parent_id),
                sampled: parent.sampled,
            },
            None => {
                let mut trace_id = [0u8; 16];
                while trace_id == [0; 16] {
                    rng.fill_bytes(&mut trace_id);
                }
                SpanContext {
                    trace_id,
                    span_id,
                    parent: None,
                    sampled: true,
                }
            }
        }
    }

    /// The `traceparent` naming this span as the parent (what the upstream gets).
    pub fn traceparent(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            crate::hex::bytes_text(&self.trace_id),
            crate::hex::bytes_text(&self.span_id),
            u8::from(self.sampled)
        )
    }

    /// Puts this span's `traceparent` on the upstream request, in place of the client's; the
    /// client's `tracestate` goes along only when its trace is continued (a vendor's state of
    /// another trace must not ride on a new one: the W3C processing model drops it).
    pub fn inject(&self, headers: &mut HeaderMap) {
        if let Ok(value) = HeaderValue::from_str(&self.traceparent()) {
            headers.insert("traceparent", value);
        }
        if self.parent.is_none() {
            headers.remove("tracestate");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_traceparent_is_continued_with_a_new_span() {
        let incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let c = SpanContext::continue_from(Some(incoming));
        assert_eq!(
            crate::hex::bytes_text(&c.trace_id),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(
            c.parent.map(|p| crate::hex::bytes_text(&p)).as_deref(),
            Some("00f067aa0ba902b7")
        );
        assert!(c.sampled);
        let out = c.traceparent();
        assert!(out.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));
        assert!(out.ends_with("-01"));
        assert_ne!(&out[36..52], "00f067aa0ba902b7");
        let unsampled = SpanContext::continue_from(Some(&incoming.replace("-01", "-00")));
        assert!(!unsampled.sampled && unsampled.traceparent().ends_with("-00"));
    }

    const ID: &str = "12345678901234567890123456789012";

    /// The `traceparent` cases of the W3C trace-context test suite (test/test.py), each with
    /// whether the trace is continued.
    const W3C_CASES: &[(&str, bool)] = &[
        (
            "00-12345678901234567890123456789012-1234567890123456-01",
            true,
        ),
        (
            "00-12345678901234567890123456789012-1234567890123456-01.",
            false,
        ),
        (
            "00-12345678901234567890123456789012-1234567890123456-01-what-the-future-will-be-like",
            false,
        ),
        (
            "cc-12345678901234567890123456789012-1234567890123456-01",
            true,
        ),
        (
            "cc-12345678901234567890123456789012-1234567890123456-01-what-the-future-will-be-like",
            true,
        ),
        (
            "cc-12345678901234567890123456789012-1234567890123456-01.what-the-future-will-be-like",
            false,
        ),
        (
            "ff-12345678901234567890123456789012-1234567890123456-01",
            false,
        ),
        (
            ".0-12345678901234567890123456789012-1234567890123456-01",
            false,
        ),
        (
            "0.-12345678901234567890123456789012-1234567890123456-01",
            false,
        ),
        (
            "000-12345678901234567890123456789012-1234567890123456-01",
            false,
        ),
        (
            "0000-12345678901234567890123456789012-1234567890123456-01",
            false,
        ),
        (
            "0-12345678901234567890123456789012-1234567890123456-01",
            false,
        ),
        (
            "00-00000000000000000000000000000000-1234567890123456-01",
            false,
        ),
        (
            "00-.2345678901234567890123456789012-1234567890123456-01",
            false,
        ),
        (
            "00-1234567890123456789012345678901.-1234567890123456-01",
            false,
        ),
        (
            "00-123456789012345678901234567890123-1234567890123456-01",
            false,
        ),
        (
            "00-1234567890123456789012345678901-1234567890123456-01",
            false,
        ),
        (
            "00-12345678901234567890123456789012-0000000000000000-01",
            false,
        ),
        (
            "00-12345678901234567890123456789012-.234567890123456-01",
            false,
        ),
        (
            "00-12345678901234567890123456789012-123456789012345.-01",
            false,
        ),
        (
            "00-12345678901234567890123456789012-12345678901234567-01",
            false,
        ),
        (
            "00-12345678901234567890123456789012-123456789012345-01",
            false,
        ),
        (
            "00-12345678901234567890123456789012-1234567890123456-.0",
            false,
        ),
        (
            "00-12345678901234567890123456789012-1234567890123456-0.",
            false,
        ),
        (
            "00-12345678901234567890123456789012-1234567890123456-001",
            false,
        ),
        (
            "00-12345678901234567890123456789012-1234567890123456-1",
            false,
        ),
        (
            " 00-12345678901234567890123456789012-1234567890123456-01",
            true,
        ),
        (
            "\t00-12345678901234567890123456789012-1234567890123456-01",
            true,
        ),
        (
            "00-12345678901234567890123456789012-1234567890123456-01 ",
            true,
        ),
        (
            "00-12345678901234567890123456789012-1234567890123456-01\t",
            true,
        ),
        (
            "\t 00-12345678901234567890123456789012-1234567890123456-01 \t",
            true,
        ),
    ];

    #[test]
    fn the_w3c_test_suites_traceparent_cases_continue_exactly_when_it_says() {
        for (value, continued) in W3C_CASES {
            let c = SpanContext::continue_from(Some(value));
            assert_eq!(c.parent.is_some(), *continued, "{value:?}");
            assert_eq!(
                crate::hex::bytes_text(&c.trace_id) == ID,
                *continued,
                "{value:?}"
            );
            assert_eq!(TraceParent::parse(value).is_some(), *continued, "{value:?}");
        }
    }

    #[test]
    fn upper_case_and_signed_hex_are_not_continued() {
        for value in [
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01",
            "00-+a+a+a+a+a+a+a+a+a+a+a+a+a+a+a+a-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-+a+a+a+a+a+a+a+a-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-+1",
            "0A-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(value), None, "{value}");
        }
    }

    #[test]
    fn tracestate_rides_only_on_a_continued_trace() {
        let mut headers = HeaderMap::new();
        headers.insert("tracestate", HeaderValue::from_static("foo=1"));
        let continued = SpanContext::continue_from(Some(
            "00-12345678901234567890123456789012-1234567890123456-00",
        ));
        continued.inject(&mut headers);
        assert_eq!(headers["tracestate"], "foo=1");
        assert!(headers["traceparent"]
            .to_str()
            .unwrap()
            .starts_with("00-12345678901234567890123456789012-"));
        let restarted = SpanContext::continue_from(Some(
            "00-1234567890123456789012345678901A-1234567890123456-00",
        ));
        restarted.inject(&mut headers);
        assert!(headers.get("tracestate").is_none());
    }

    #[test]
    fn a_malformed_or_absent_traceparent_starts_a_sampled_trace() {
        for bad in [
            None,
            Some("garbage"),
            Some("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"),
            Some("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        ] {
            let c = SpanContext::continue_from(bad);
            assert_eq!(c.parent, None, "{bad:?}");
            assert!(c.sampled);
            assert_ne!(c.trace_id, [0; 16]);
        }
    }
}
