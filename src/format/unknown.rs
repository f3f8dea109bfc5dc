//! Streams of a shape no accountant recognises: every event is a token event.
//!
//! Why every event: a stream that nobody has taught metronome still has a cadence, and for
//! streamed model output that cadence is almost always one event per piece of output. Counting
//! each event as one token event keeps TTFT, the gaps and stalls visible for it, which is what an
//! operator needs most; treating nothing as a token event would hide the stream entirely (no
//! TTFT, no gaps, outcome `no_token`). The price is that non-output events (a role chunk, a
//! usage summary) count too, so such figures are approximate; the stream is counted under
//! `metronome_stream_format_total{format="unknown"}`, so an operator can see it and set the
//! route's `format`. What is recognisable anyway is still used: `[DONE]` and empty events are not
//! token events, a JSON object with a non-null `error` (or sent as `event: error`) is an upstream
//! error, and a top-level `model` names the model. Each token event counts 1 token, as `counted`.

use serde::Deserialize;
use serde_json::value::RawValue;

use super::json::{plain_string, present};
use super::Classified;
use crate::scan::Event;

/// The accountant of unrecognised streams; it needs no memory of earlier events.
#[derive(Debug, Default, Clone, Copy)]
pub struct UnknownAccounting;

// === impl UnknownAccounting ===

impl UnknownAccounting {
    /// Classifies one event of the stream.
    pub fn classify<'a>(&mut self, event: &Event<'a>) -> Classified<'a> {
        let data = event.data.trim_ascii();
        if data == b"[DONE]" {
            return Classified::end();
        }
        if event.truncated {
            return Classified::unparsed();
        }
        if data.is_empty() {
            return Classified::default();
        }
        // Only an object is read for fields (serde would also fill a struct from an array).
        let object = data
            .starts_with(b"{")
            .then(|| serde_json::from_slice::<Object<'a>>(data).ok())
            .flatten();
        match object {
            Some(object) if present(object.error) || event.kind == b"error" => Classified {
                error: true,
                ..Classified::default()
            },
            Some(object) => Classified {
                token_event: true,
                model: object.model.and_then(plain_string),
                ..Classified::default()
            },
            // Not a JSON object (plain text, an array): still one event of output.
            None => Classified {
                token_event: true,
                ..Classified::default()
            },
        }
    }
}

#[derive(Deserialize)]
struct Object<'a> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classify(data: &'static str) -> Classified<'static> {
        UnknownAccounting.classify(&Event {
            kind: b"",
            data: data.as_bytes(),
            truncated: false,
        })
    }

    #[test]
    fn every_event_is_a_token_event_except_the_recognisable_ones() {
        assert!(classify("Hello").token_event);
        assert!(classify(r#"{"chunk":"Hello","model":"house-llm"}"#).token_event);
        assert_eq!(
            classify(r#"{"chunk":"x","model":"house-llm"}"#).model,
            Some("house-llm")
        );
        assert!(classify("[1,2]").token_event);
        let done = classify(" [DONE]");
        assert!(done.end && !done.token_event);
        assert!(!classify("  ").token_event);
        let error = classify(r#"{"error":"boom"}"#);
        assert!(error.error && !error.token_event);
        let typed = UnknownAccounting.classify(&Event {
            kind: b"error",
            data: br#"{"message":"boom"}"#,
            truncated: false,
        });
        assert!(typed.error && !typed.token_event);
        assert!(classify(r#"{"error":null,"chunk":"x"}"#).token_event);
    }
}
