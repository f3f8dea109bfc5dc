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

fn hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Lowercase hex of `bytes`.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

// === impl SpanContext ===

impl SpanContext {
    /// The context of a new span under `traceparent` (`00-trace-parent-flags`); a new trace
    /// when there is none or it is malformed (all-zero IDs included).
    pub fn continue_from(traceparent: Option<&str>) -> Self {
        let mut rng = rand::thread_rng();
        let mut span_id = [0u8; 8];
        while span_id == [0; 8] {
            rng.fill_bytes(&mut span_id);
        }
        let parsed = traceparent.and_then(|t| {
            let mut parts = t.trim().split('-');
            let version = parts.next()?;
            let (trace, parent, flags) = (parts.next()?, parts.next()?, parts.next()?);
            if version.len() != 2 || version == "ff" || (version == "00" && parts.next().is_some())
            {
                return None;
            }
            let trace: [u8; 16] = hex(trace).filter(|t| *t != [0; 16])?;
            let parent: [u8; 8] = hex(parent).filter(|p| *p != [0; 8])?;
            let flags: [u8; 1] = hex(flags)?;
            Some((trace, parent, flags[0] & 1 == 1))
        });
        match parsed {
            Some((trace_id, parent, sampled)) => SpanContext {
                trace_id,
                span_id,
                parent: Some(parent),
                sampled,
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
            to_hex(&self.trace_id),
            to_hex(&self.span_id),
            u8::from(self.sampled)
        )
    }

    /// Puts this span's `traceparent` on the upstream request, in place of the client's.
    pub fn inject(&self, headers: &mut HeaderMap) {
        if let Ok(value) = HeaderValue::from_str(&self.traceparent()) {
            headers.insert("traceparent", value);
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
        assert_eq!(to_hex(&c.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(
            c.parent.map(|p| to_hex(&p)).as_deref(),
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
