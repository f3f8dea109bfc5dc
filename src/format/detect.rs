//! Telling a stream's API from what is known of it: the response's framing, the request path and
//! the first events.
//!
//! The framing and the path are known before any event and give a hint ([`hint`]): each API
//! documents its path, and NDJSON is Ollama's alone. The first event is stronger evidence, since
//! gateways rewrite paths and `/generate` means different things to different servers, so
//! [`AutoAccounting`] waits for the first event it can read: when that event's shape is one
//! only a single API produces (a `choices` array, a TGI `token`, a Messages `type`, ...) the
//! stream is that API's; when the shape tells nothing, the hint decides; with no hint either,
//! the stream is [`Format::Unknown`]. Events before the decision are ones no accountant counts
//! (`[DONE]`, empty data, an error report), so nothing is lost by waiting, and the deciding event
//! is classified by the chosen accountant. Once decided, [`Accounting`](super::Accounting)
//! replaces the `Auto` accountant with the chosen one, so detection costs nothing afterwards.

use serde::Deserialize;
use serde_json::value::RawValue;

use super::{Classified, Format};
use crate::scan::{Event, Framing};

/// The format a stream's framing and request path suggest, if any.
pub fn hint(framing: Framing, path: &str) -> Option<Format> {
    hint_from(framing, Format::from_path(path))
}

/// [`hint`] for a path already looked up with [`Format::from_path`] (the forwarder looks it up
/// before the request, and its path, move on to the upstream).
pub fn hint_from(framing: Framing, by_path: Option<Format>) -> Option<Format> {
    match framing {
        Framing::Ndjson => by_path.or(Some(Format::Ollama)),
        Framing::Sse => by_path,
        // A compressed body has no readable events: nothing to detect, counted as unknown.
        Framing::Opaque => None,
    }
}

/// An accountant that has not seen an event telling the stream's API yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutoAccounting {
    hint: Option<Format>,
}

// === impl AutoAccounting ===

impl AutoAccounting {
    /// Detection with the framing and path's `hint`.
    pub fn new(hint: Option<Format>) -> Self {
        AutoAccounting { hint }
    }

    /// The format the framing and path suggest.
    pub fn hint(&self) -> Option<Format> {
        self.hint
    }

    /// Decides the stream's format at `event`, or tells what the event means while the format is
    /// still open (an end marker, an error, nothing).
    pub fn decide<'a>(&self, event: &Event<'a>) -> Result<Format, Classified<'a>> {
        let data = event.data.trim_ascii();
        if event.truncated {
            return Err(Classified::unparsed());
        }
        if data.is_empty() {
            return Err(Classified::default());
        }
        if data == b"[DONE]" {
            return Err(Classified::end());
        }
        let fallback = self.hint.unwrap_or(Format::Unknown);
        // Only an object has a shape (serde would also fill a struct from an array).
        let shape = data.starts_with(b"{").then(|| Shape::read(data)).flatten();
        let Some(shape) = shape else {
            return Ok(fallback);
        };
        if let Some(format) = shape.format().or_else(|| by_event_kind(event.kind)) {
            if self.hint.is_some_and(|hint| hint != format) {
                tracing::debug!(
                    hint = fallback.name(),
                    detected = format.name(),
                    "the first event's shape overrides the path's format"
                );
            }
            return Ok(format);
        }
        if shape.is_error(event.kind) {
            return Err(Classified {
                error: true,
                ..Classified::default()
            });
        }
        Ok(fallback)
    }
}

/// The SSE `event:` types only one API uses, for data that does not say.
fn by_event_kind(kind: &[u8]) -> Option<Format> {
    if kind.starts_with(b"response.") {
        Some(Format::Responses)
    } else if ANTHROPIC_TYPES.iter().any(|t| t.as_bytes() == kind) {
        Some(Format::Anthropic)
    } else {
        None
    }
}

const ANTHROPIC_TYPES: [&str; 7] = [
    "message_start",
    "message_delta",
    "message_stop",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "ping",
];

/// The top-level fields that tell the APIs apart, as their raw JSON text (`None` where absent or
/// `null`), borrowed and unparsed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Shape<'a> {
    kind: Option<&'a str>,
    object: Option<&'a str>,
    choices: Option<&'a str>,
    token: Option<&'a str>,
    candidates: Option<&'a str>,
    usage_metadata: Option<&'a str>,
    prompt_feedback: Option<&'a str>,
    meta_info: Option<&'a str>,
    done: Option<&'a str>,
    stop: Option<&'a str>,
    content: Option<&'a str>,
    error: Option<&'a str>,
}

/// The place in [`Shape`]'s order of the field named `name` in the event.
fn shape_field(name: &[u8]) -> Option<usize> {
    Some(match name {
        b"type" => 0,
        b"object" => 1,
        b"choices" => 2,
        b"token" => 3,
        b"candidates" => 4,
        b"usageMetadata" => 5,
        b"promptFeedback" => 6,
        b"meta_info" => 7,
        b"done" => 8,
        b"stop" => 9,
        b"content" => 10,
        b"error" => 11,
        _ => return None,
    })
}

/// The reference reader of [`Shape`]: serde, borrowing every field.
#[derive(Deserialize)]
struct SerdeShape<'a> {
    #[serde(borrow, default, rename = "type")]
    kind: Option<&'a RawValue>,
    #[serde(borrow, default)]
    object: Option<&'a RawValue>,
    #[serde(borrow, default)]
    choices: Option<&'a RawValue>,
    #[serde(borrow, default)]
    token: Option<&'a RawValue>,
    #[serde(borrow, default)]
    candidates: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "usageMetadata")]
    usage_metadata: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "promptFeedback")]
    prompt_feedback: Option<&'a RawValue>,
    #[serde(borrow, default)]
    meta_info: Option<&'a RawValue>,
    #[serde(borrow, default)]
    done: Option<&'a RawValue>,
    #[serde(borrow, default)]
    stop: Option<&'a RawValue>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

// === impl Shape ===

impl<'a> Shape<'a> {
    /// The shape of the object `data`, read in one pass by the OpenAI walker's grammar (serde's
    /// reading cost ~5,600 instructions per stream, callgrind's inclusive count in BENCHMARKS'
    /// instructions per request), or by serde where the walker is not sure to read it as serde
    /// does; `None` when `data` is not an object serde reads.
    fn read(data: &'a [u8]) -> Option<Self> {
        Self::by_walker(data).or_else(|| Self::by_serde(data))
    }

    /// The walker's reading; `None` where it leaves `data` to serde.
    fn by_walker(data: &'a [u8]) -> Option<Self> {
        super::openai::top_level_fields(data, shape_field).map(Self::from_fields)
    }

    /// serde's reading, the reference; `None` when `data` is not an object serde reads.
    fn by_serde(data: &'a [u8]) -> Option<Self> {
        let s = serde_json::from_slice::<SerdeShape<'a>>(data).ok()?;
        Some(Self::from_fields(
            [
                s.kind,
                s.object,
                s.choices,
                s.token,
                s.candidates,
                s.usage_metadata,
                s.prompt_feedback,
                s.meta_info,
                s.done,
                s.stop,
                s.content,
                s.error,
            ]
            .map(|raw| raw.map(RawValue::get)),
        ))
    }

    /// The shape from its fields' raw texts in [`shape_field`]'s order.
    fn from_fields(fields: [Option<&'a str>; 12]) -> Self {
        let [kind, object, choices, token, candidates, usage_metadata, prompt_feedback, meta_info, done, stop, content, error] =
            fields;
        Shape {
            kind,
            object,
            choices,
            token,
            candidates,
            usage_metadata,
            prompt_feedback,
            meta_info,
            done,
            stop,
            content,
            error,
        }
    }

    /// An error report (`{"error": ...}`, `{"type": "error"}`, `event: error`), which every API
    /// can send before its first output and which therefore tells nothing about the API.
    fn is_error(&self, event_kind: &[u8]) -> bool {
        present(self.error) || self.kind == Some(r#""error""#) || event_kind == b"error"
    }

    /// The API whose events look like this, when only one does.
    fn format(&self) -> Option<Format> {
        let kind = self.kind.unwrap_or("");
        let kind = kind.trim_matches('"');
        if kind.starts_with("response.") {
            return Some(Format::Responses);
        }
        if ANTHROPIC_TYPES.contains(&kind) {
            return Some(Format::Anthropic);
        }
        let object = self.object.unwrap_or("");
        if present(self.choices)
            || object == r#""chat.completion.chunk""#
            || object == r#""text_completion""#
        {
            return Some(Format::OpenAi);
        }
        if self.token.is_some_and(|t| t.starts_with('{')) {
            return Some(Format::Tgi);
        }
        if present(self.candidates) || present(self.usage_metadata) || present(self.prompt_feedback)
        {
            return Some(Format::Gemini);
        }
        if present(self.meta_info) {
            return Some(Format::SgLang);
        }
        if is_bool(self.done) {
            return Some(Format::Ollama);
        }
        if is_bool(self.stop) && self.content.is_some() {
            return Some(Format::LlamaCpp);
        }
        None
    }
}

/// A raw value that is there and not `null` (as `json::present`).
fn present(raw: Option<&str>) -> bool {
    raw.is_some_and(|r| r != "null")
}

fn is_bool(raw: Option<&str>) -> bool {
    raw.is_some_and(|r| matches!(r, "true" | "false"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Accounting;

    fn event(kind: &'static str, data: &'static str) -> Event<'static> {
        Event {
            kind: kind.as_bytes(),
            data: data.as_bytes(),
            truncated: false,
        }
    }

    fn detect(hint: Option<Format>, kind: &'static str, data: &'static str) -> Option<Format> {
        AutoAccounting::new(hint).decide(&event(kind, data)).ok()
    }

    #[test]
    fn the_first_event_of_each_api_tells_it_apart() {
        for (kind, data, format) in [
            (
                "",
                r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
                Format::OpenAi,
            ),
            (
                "",
                r#"{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"Hi"}]}"#,
                Format::OpenAi,
            ),
            (
                "",
                r#"{"index":1,"token":{"id":1533,"text":" Deep","logprob":-0.5,"special":false},"generated_text":null,"details":null}"#,
                Format::Tgi,
            ),
            (
                "",
                r#"{"index":0,"content":" Paris","tokens":[],"stop":false,"id_slot":0,"tokens_predicted":1,"tokens_evaluated":6}"#,
                Format::LlamaCpp,
            ),
            (
                "",
                r#"{"content":" Hello","multimodal":false,"slot_id":0,"stop":false}"#,
                Format::LlamaCpp,
            ),
            (
                "",
                r#"{"text":" Paris","meta_info":{"id":"a","finish_reason":null,"prompt_tokens":7,"completion_tokens":1,"cached_tokens":0},"index":0}"#,
                Format::SgLang,
            ),
            (
                "",
                r#"{"model":"llama3.2","created_at":"2023-08-04T08:52:19.385406455-07:00","message":{"role":"assistant","content":"The"},"done":false}"#,
                Format::Ollama,
            ),
            (
                "",
                r#"{"model":"llama3.2","created_at":"2023-08-04T08:52:19.385406455-07:00","response":"The","done":false}"#,
                Format::Ollama,
            ),
            (
                "response.created",
                r#"{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","status":"in_progress","model":"gpt-4.1"}}"#,
                Format::Responses,
            ),
            (
                "message_start",
                r#"{"type":"message_start","message":{"id":"msg_1","model":"claude-sonnet-4-5","usage":{"input_tokens":25,"output_tokens":1}}}"#,
                Format::Anthropic,
            ),
            (
                "",
                r#"{"candidates": [{"content": {"parts": [{"text": "The"}],"role": "model"},"index": 0}],"modelVersion": "gemini-2.0-flash"}"#,
                Format::Gemini,
            ),
            ("ping", r#"{}"#, Format::Anthropic),
        ] {
            assert_eq!(detect(None, kind, data), Some(format), "{data}");
            // The shape wins over a path that says otherwise.
            assert_eq!(
                detect(Some(Format::SgLang), kind, data),
                Some(format),
                "{data}"
            );
        }
    }

    #[test]
    fn the_walker_declines_shapes_it_cannot_read_exactly() {
        for data in [
            r#"{"type":"a","type":"b"}"#,
            r#"{"typ\u0065":"message_start"}"#,
            r#"{"done":false} x"#,
            r#"["choices"]"#,
            r#"{"done":tru}"#,
        ] {
            assert_eq!(Shape::by_walker(data.as_bytes()), None, "{data}");
        }
        let read =
            Shape::by_walker(br#" {"choices" : null, "done": false, "x": [1, {"y": "z"}]} "#);
        assert_eq!(
            read,
            Some(Shape {
                done: Some("false"),
                ..Shape::default()
            })
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4096))]
        /// Random edits of each API's first events: wherever the walker reads a shape, serde
        /// reads the same.
        #[test]
        fn the_walker_never_reads_a_shape_serde_does_not(
            base in 0usize..6,
            edits in proptest::collection::vec((0usize..300, 0usize..3, 0usize..27), 0..4),
        ) {
            const BASES: [&str; 6] = [
                r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
                r#"{"index":1,"token":{"id":1533,"text":" Deep","logprob":-0.5,"special":false},"generated_text":null,"details":null}"#,
                r#"{"index":0,"content":" Paris","tokens":[],"stop":false,"id_slot":0}"#,
                r#"{"text":" Paris","meta_info":{"id":"a","prompt_tokens":7},"index":0,"done":false}"#,
                r#"{"type":"message_start","message":{"id":"msg_1","usage":{"input_tokens":25}},"error":null}"#,
                r#"{"candidates": [{"content": {"parts": [{"text": "The"}]}}],"usageMetadata":{},"promptFeedback":null}"#,
            ];
            const PIECES: [&str; 27] = [
                "{", "}", "[", "]", ",", ":", "\"", "\\", " ", "null", "1", "-", "true", "e",
                "\"type\"", "\"object\"", "\"choices\"", "\"token\"", "\"done\"",
                "\"stop\"", "\"content\"", "\"error\"", "\u{e9}", "\"\"",
                "\"done\":true,", ",\"error\":{}", "\"type\":\"ping\",",
            ];
            let data = crate::format::json::edited(BASES[base], &edits, &PIECES);
            if let Some(fast) = Shape::by_walker(data.as_bytes()) {
                proptest::prop_assert_eq!(Some(fast), Shape::by_serde(data.as_bytes()), "{}", data);
            }
        }
    }

    #[test]
    fn a_shape_that_tells_nothing_falls_back_to_the_hint_then_unknown() {
        let plain = r#"{"chunk":"Hello"}"#;
        assert_eq!(detect(Some(Format::Tgi), "", plain), Some(Format::Tgi));
        assert_eq!(detect(None, "", plain), Some(Format::Unknown));
        assert_eq!(detect(None, "", "just text"), Some(Format::Unknown));
        assert_eq!(
            detect(None, "", r#"["response.x", 1]"#),
            Some(Format::Unknown)
        );
        assert_eq!(
            detect(Some(Format::Ollama), "", "just text"),
            Some(Format::Ollama)
        );
    }

    #[test]
    fn end_markers_empty_data_and_errors_wait_for_a_later_event() {
        let auto = AutoAccounting::new(Some(Format::OpenAi));
        assert_eq!(auto.decide(&event("", "[DONE]")), Err(Classified::end()));
        assert_eq!(auto.decide(&event("", "  ")), Err(Classified::default()));
        for (kind, data) in [
            ("", r#"{"error":{"message":"overloaded","code":503}}"#),
            (
                "error",
                r#"{"type":"error","code":"ERR_SOMETHING","message":"Something went wrong","param":null,"sequence_number":1}"#,
            ),
            (
                "error",
                r#"{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}"#,
            ),
        ] {
            assert!(auto.decide(&event(kind, data)).unwrap_err().error, "{data}");
        }
        let truncated = Event {
            truncated: true,
            ..event("", "{\"choi")
        };
        assert!(auto.decide(&truncated).unwrap_err().unparsed);
    }

    #[test]
    fn hints_from_framing_and_path() {
        assert_eq!(hint(Framing::Ndjson, "/api/chat"), Some(Format::Ollama));
        assert_eq!(hint(Framing::Ndjson, "/stream"), Some(Format::Ollama));
        assert_eq!(hint(Framing::Sse, "/generate_stream"), Some(Format::Tgi));
        assert_eq!(hint(Framing::Sse, "/stream"), None);
    }

    #[test]
    fn auto_becomes_the_detected_accountant_and_classifies_the_deciding_event() {
        let mut accounting = Accounting::Auto(AutoAccounting::new(None));
        let done = accounting.classify(&event("", "[DONE]"));
        assert!(done.end);
        assert_eq!(accounting.name(), "unknown", "undecided without a hint");
        let role = accounting.classify(&event(
            "",
            r#"{"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
        ));
        assert!(
            !role.token_event,
            "a role chunk decides the format but shows nothing"
        );
        assert_eq!(role.model, Some("m"));
        assert!(matches!(accounting, Accounting::OpenAi(_)));
        let token = accounting.classify(&event(
            "",
            r#"{"model":"m","choices":[{"index":0,"delta":{"content":"Hi"}}]}"#,
        ));
        assert!(token.token_event);
        assert_eq!(accounting.name(), "openai");
    }
}
