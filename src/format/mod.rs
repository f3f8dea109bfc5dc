//! Token accounting: which events of a stream carry output the reader sees, and how many tokens.
//!
//! A gap is only meaningful between events that show the reader something, so each streaming API
//! gets an accountant that classifies its events, one module per API:
//!
//! | module | API |
//! |---|---|
//! | [`openai`] | OpenAI-compatible chat and completions (vLLM, SGLang, llama.cpp, TGI, Ollama `/v1`) |
//! | [`tgi`] | TGI's native `/generate_stream` |
//! | [`llamacpp`] | llama.cpp's native `/completion` |
//! | [`sglang`] | SGLang's native `/generate` |
//! | [`ollama`] | Ollama's `/api/chat` and `/api/generate` (NDJSON) |
//! | [`responses`] | the OpenAI Responses API |
//! | [`anthropic`] | Anthropic Messages |
//! | [`gemini`] | Gemini `streamGenerateContent?alt=sse` |
//! | [`unknown`] | anything else: every event counts as a token event |
//!
//! [`whole`] reads a non-streaming answer's usage with the same accountants.
//!
//! A stream's accountant is chosen once ([`Accounting::select`]): a route's configured format
//! wins; otherwise [`detect`] decides from the response's content type, the request path and the
//! first event. Classifying borrows from the event and never allocates.

pub mod anthropic;
pub(crate) mod count;
pub mod detect;
pub mod finish;
pub mod gemini;
pub(crate) mod json;
pub mod llamacpp;
pub mod ollama;
pub mod openai;
pub mod phase;
pub mod realtime;
pub mod responses;
pub mod sglang;
pub mod tgi;
pub mod unknown;
pub mod whole;

use crate::scan::{Event, Framing};

pub use anthropic::AnthropicAccounting;
pub use detect::AutoAccounting;
pub use finish::FinishReason;
pub use gemini::GeminiAccounting;
pub use llamacpp::LlamaCppAccounting;
pub use ollama::OllamaAccounting;
pub use openai::OpenAiAccounting;
pub use phase::{Phase, PhaseMix, ThinkSettings, ThinkStart, ThinkState, ThinkTags};
pub use realtime::RealtimeAccounting;
pub use responses::ResponsesAccounting;
pub use sglang::SgLangAccounting;
pub use tgi::TgiAccounting;
pub use unknown::UnknownAccounting;

/// What one event means for the stream's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Classified<'a> {
    /// The event shows the reader output (text, reasoning, tool-call arguments).
    pub token_event: bool,
    /// The phase of a token event, as the API names it (content for anything else). The
    /// no-parser `<think>` shape is read apart, by the stream's [`ThinkState`].
    pub phase: Phase,
    /// A content token event's text, the raw inside of its JSON string (escapes and all), for
    /// the stream's [`ThinkState`]; `None` where the accountant does not lend it.
    pub text: Option<&'a [u8]>,
    /// Exact tokens this event carries, where the format says so; otherwise a token event is 1.
    /// On an event that is not a token event: tokens the server produced that show the reader
    /// nothing (TGI's special tokens), counted toward the stream's total only.
    pub tokens: Option<u32>,
    /// The stream's output-token total so far as the server reports it (`usage`), when present.
    pub usage_total: Option<u64>,
    /// The request's prompt (input) tokens as the server reports them (`usage.prompt_tokens`
    /// and each format's equivalent), when present.
    pub usage_prompt: Option<u64>,
    /// The reasoning tokens of the stream so far as the server reports them
    /// (`completion_tokens_details.reasoning_tokens`, `output_tokens_details.reasoning_tokens`,
    /// Gemini's `thoughtsTokenCount`), when present.
    pub usage_reasoning: Option<u64>,
    /// Why generation ended, on the event that says so (the last chunk and its kin).
    pub finish: Option<FinishReason>,
    /// The model the event names, when it names one (borrowed, without JSON escapes).
    pub model: Option<&'a str>,
    /// The event is the format's end marker (`[DONE]` and its kin).
    pub end: bool,
    /// The event reports an error from the server mid-stream.
    pub error: bool,
    /// The event could not be parsed (invalid JSON, or too long to inspect).
    pub unparsed: bool,
}

// === impl Classified ===

impl Classified<'_> {
    /// An event that could not be inspected.
    pub(crate) fn unparsed() -> Self {
        Classified {
            unparsed: true,
            ..Classified::default()
        }
    }

    /// The format's end marker.
    pub(crate) fn end() -> Self {
        Classified {
            end: true,
            ..Classified::default()
        }
    }
}

/// The streaming APIs metronome tells apart: the `format` label of
/// `metronome_stream_format_total` and the values of a route's `format` key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// OpenAI-compatible chat and completions chunks.
    OpenAi,
    /// TGI's native `/generate_stream`.
    Tgi,
    /// llama.cpp's native `/completion`.
    LlamaCpp,
    /// SGLang's native `/generate`.
    SgLang,
    /// Ollama's native NDJSON API.
    Ollama,
    /// The OpenAI Responses API.
    Responses,
    /// Anthropic Messages.
    Anthropic,
    /// Gemini `streamGenerateContent`.
    Gemini,
    /// The Responses API's WebSocket mode: each `response.create` on a socket is a stream.
    ResponsesWebsocket,
    /// The Realtime API (WebSocket): each response is a stream.
    Realtime,
    /// A stream no accountant recognised.
    Unknown,
}

// === impl Format ===

impl Format {
    /// Every format, `Unknown` last.
    pub const ALL: [Format; 11] = [
        Format::OpenAi,
        Format::Tgi,
        Format::LlamaCpp,
        Format::SgLang,
        Format::Ollama,
        Format::Responses,
        Format::Anthropic,
        Format::Gemini,
        Format::ResponsesWebsocket,
        Format::Realtime,
        Format::Unknown,
    ];

    /// The name operators see: the `format` label and the configuration value.
    pub fn name(self) -> &'static str {
        match self {
            Format::OpenAi => "openai",
            Format::Tgi => "tgi",
            Format::LlamaCpp => "llamacpp",
            Format::SgLang => "sglang",
            Format::Ollama => "ollama",
            Format::Responses => "responses",
            Format::Anthropic => "anthropic",
            Format::Gemini => "gemini",
            Format::ResponsesWebsocket => "responses_websocket",
            Format::Realtime => "realtime",
            Format::Unknown => "unknown",
        }
    }

    /// The format a route's `format` key names; `unknown` is an outcome of detection, not a
    /// choice, so it is not accepted.
    pub fn from_name(name: &str) -> Option<Format> {
        Format::ALL
            .into_iter()
            .find(|f| *f != Format::Unknown && f.name() == name)
    }

    /// The API a request path belongs to, by the path each server documents. Matched at the
    /// end of the path, so a gateway's prefix (`/llama/v1/chat/completions`) does not matter.
    pub fn from_path(path: &str) -> Option<Format> {
        let path = path.trim_end_matches('/');
        if path.contains(":streamGenerateContent") {
            Some(Format::Gemini)
        } else if path.ends_with("/api/chat") || path.ends_with("/api/generate") {
            Some(Format::Ollama)
        } else if path.ends_with("/chat/completions") || path.ends_with("/v1/completions") {
            Some(Format::OpenAi)
        } else if path.ends_with("/generate_stream") {
            Some(Format::Tgi)
        } else if path.ends_with("/completion") || path == "/completions" {
            Some(Format::LlamaCpp)
        } else if path.ends_with("/generate") {
            Some(Format::SgLang)
        } else if path.ends_with("/responses") {
            Some(Format::Responses)
        } else if path.ends_with("/messages") {
            Some(Format::Anthropic)
        } else {
            None
        }
    }
}

/// The accountant chosen for one stream.
#[derive(Debug)]
pub enum Accounting {
    /// OpenAI-compatible chat and completions chunks.
    OpenAi(OpenAiAccounting),
    /// TGI's native token events.
    Tgi(TgiAccounting),
    /// llama.cpp's native completion chunks (boxed, as SGLang's: their per-sequence counts would
    /// make every stream's accountant 392 bytes where the others need 16).
    LlamaCpp(Box<LlamaCppAccounting>),
    /// SGLang's native cumulative-text chunks.
    SgLang(Box<SgLangAccounting>),
    /// Ollama's NDJSON lines.
    Ollama(OllamaAccounting),
    /// OpenAI Responses API events.
    Responses(ResponsesAccounting),
    /// Anthropic Messages events.
    Anthropic(AnthropicAccounting),
    /// Gemini chunks.
    Gemini(GeminiAccounting),
    /// Realtime API server events (WebSocket messages).
    Realtime(RealtimeAccounting),
    /// A stream of unrecognised shape.
    Unknown(UnknownAccounting),
    /// Not decided yet: becomes one of the others at the first event that tells.
    Auto(AutoAccounting),
}

// === impl Accounting ===

impl Accounting {
    /// The accountant for an OpenAI-compatible stream.
    pub fn openai() -> Self {
        Accounting::OpenAi(OpenAiAccounting::default())
    }

    /// The accountant of `format`.
    pub fn for_format(format: Format) -> Self {
        match format {
            Format::OpenAi => Accounting::openai(),
            Format::Tgi => Accounting::Tgi(TgiAccounting),
            Format::LlamaCpp => Accounting::LlamaCpp(Box::default()),
            Format::SgLang => Accounting::SgLang(Box::default()),
            Format::Ollama => Accounting::Ollama(OllamaAccounting),
            Format::Responses | Format::ResponsesWebsocket => {
                Accounting::Responses(ResponsesAccounting)
            }
            Format::Realtime => Accounting::Realtime(RealtimeAccounting),
            Format::Anthropic => Accounting::Anthropic(AnthropicAccounting),
            Format::Gemini => Accounting::Gemini(GeminiAccounting::default()),
            Format::Unknown => Accounting::Unknown(UnknownAccounting),
        }
    }

    /// The accountant of a new stream: the route's configured format when it has one, otherwise
    /// detection from the content type's framing, the request path (as
    /// [`Format::from_path`] read it) and the first events.
    pub fn select(
        configured: Option<Format>,
        framing: Framing,
        path_format: Option<Format>,
    ) -> Self {
        match configured {
            Some(format) => Accounting::for_format(format),
            None => Accounting::Auto(AutoAccounting::new(detect::hint_from(framing, path_format))),
        }
    }

    /// Classifies one event.
    #[inline]
    pub fn classify<'a>(&mut self, event: &Event<'a>) -> Classified<'a> {
        match self {
            Accounting::OpenAi(a) => a.classify(event),
            Accounting::Tgi(a) => a.classify(event),
            Accounting::LlamaCpp(a) => a.classify(event),
            Accounting::SgLang(a) => a.classify(event),
            Accounting::Ollama(a) => a.classify(event),
            Accounting::Responses(a) => a.classify(event),
            Accounting::Anthropic(a) => a.classify(event),
            Accounting::Gemini(a) => a.classify(event),
            Accounting::Realtime(a) => a.classify(event),
            Accounting::Unknown(a) => a.classify(event),
            Accounting::Auto(auto) => match auto.decide(event) {
                Ok(format) => {
                    *self = Accounting::for_format(format);
                    self.classify(event)
                }
                Err(undecided) => undecided,
            },
        }
    }

    /// An SSE line whose field name is not one of the four the standard knows. A line named
    /// `error` is an upstream error in every format: llama.cpp's native server reports failures
    /// mid-stream that way, and nothing uses the name for anything else. Returns whether the
    /// line reports an error.
    pub fn unknown_field(&mut self, name: &[u8], _value: &[u8]) -> bool {
        name == b"error"
    }

    /// Asks for the cache lines of the state the accountant keeps apart from itself: the OpenAI
    /// accountant's template, and the boxed accountants (see [`crate::prefetch`]).
    #[inline]
    pub fn prefetch(&self) {
        match self {
            Accounting::OpenAi(openai) => openai.prefetch(),
            Accounting::LlamaCpp(boxed) => crate::prefetch::value(&**boxed),
            Accounting::SgLang(boxed) => crate::prefetch::value(&**boxed),
            _ => {}
        }
    }

    /// The format of the stream: the one decided, or while undecided the one the path and
    /// content type suggest; `Unknown` when neither tells.
    pub fn format(&self) -> Format {
        match self {
            Accounting::OpenAi(_) => Format::OpenAi,
            Accounting::Tgi(_) => Format::Tgi,
            Accounting::LlamaCpp(_) => Format::LlamaCpp,
            Accounting::SgLang(_) => Format::SgLang,
            Accounting::Ollama(_) => Format::Ollama,
            Accounting::Responses(_) => Format::Responses,
            Accounting::Anthropic(_) => Format::Anthropic,
            Accounting::Gemini(_) => Format::Gemini,
            Accounting::Realtime(_) => Format::Realtime,
            Accounting::Unknown(_) => Format::Unknown,
            Accounting::Auto(auto) => auto.hint().unwrap_or(Format::Unknown),
        }
    }

    /// The format's name, as operators see it in logs and metrics.
    pub fn name(&self) -> &'static str {
        self.format().name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_accountant_is_small() {
        // Every metered stream holds one for its whole length: the largest inline state is the
        // OpenAI accountant's usage count and its boxed template.
        assert!(
            std::mem::size_of::<Accounting>() <= 24,
            "{}",
            std::mem::size_of::<Accounting>()
        );
    }

    #[test]
    fn names_round_trip_and_unknown_is_not_configurable() {
        for format in Format::ALL {
            let parsed = Format::from_name(format.name());
            if format == Format::Unknown {
                assert_eq!(parsed, None);
            } else {
                assert_eq!(parsed, Some(format));
            }
        }
        assert_eq!(Format::from_name("auto"), None);
        assert_eq!(Format::from_name("OpenAI"), None);
    }

    #[test]
    fn request_paths_of_each_api() {
        for (path, format) in [
            ("/v1/chat/completions", Some(Format::OpenAi)),
            ("/v1/completions", Some(Format::OpenAi)),
            ("/team-a/v1/chat/completions/", Some(Format::OpenAi)),
            ("/generate_stream", Some(Format::Tgi)),
            ("/completion", Some(Format::LlamaCpp)),
            ("/completions", Some(Format::LlamaCpp)),
            ("/generate", Some(Format::SgLang)),
            ("/api/chat", Some(Format::Ollama)),
            ("/api/generate", Some(Format::Ollama)),
            ("/v1/responses", Some(Format::Responses)),
            ("/v1/messages", Some(Format::Anthropic)),
            (
                "/v1beta/models/gemini-2.0-flash:streamGenerateContent",
                Some(Format::Gemini),
            ),
            ("/v1/embeddings", None),
            ("/", None),
        ] {
            assert_eq!(Format::from_path(path), format, "{path}");
        }
    }

    #[test]
    fn a_configured_format_is_used_as_is_and_auto_reports_its_hint_until_decided() {
        let select = |configured, framing, path| {
            Accounting::select(configured, framing, Format::from_path(path))
        };
        let configured = select(Some(Format::Tgi), Framing::Sse, "/v1/chat/completions");
        assert_eq!(configured.format(), Format::Tgi);
        let auto = select(None, Framing::Sse, "/v1/messages");
        assert!(matches!(auto, Accounting::Auto(_)));
        assert_eq!(auto.name(), "anthropic");
        assert_eq!(select(None, Framing::Ndjson, "/x").name(), "ollama");
        let unknown = select(None, Framing::Sse, "/stream");
        assert_eq!(unknown.name(), "unknown");
    }

    /// The phase of `data` read by `format`'s accountant, when it is a token event.
    fn phase_of(format: Format, data: &str) -> Option<Phase> {
        let classified = Accounting::for_format(format).classify(&Event {
            kind: b"",
            data: data.as_bytes(),
            truncated: false,
        });
        assert!(!classified.unparsed, "{data}");
        classified.token_event.then_some(classified.phase)
    }

    #[test]
    fn every_api_names_the_phase_of_its_token_events() {
        use Phase::{Content as C, Reasoning as R, ToolCall as T};
        let cases: &[(Format, &str, Option<Phase>)] = &[
            (
                Format::OpenAi,
                r#"{"choices":[{"delta":{"reasoning_content":"hm"}}]}"#,
                Some(R),
            ),
            (
                Format::OpenAi,
                r#"{"choices":[{"delta":{"reasoning":"hm"}}]}"#,
                Some(R),
            ),
            (
                Format::OpenAi,
                r#"{"choices":[{"delta":{"content":"Hi"}}]}"#,
                Some(C),
            ),
            (Format::OpenAi, r#"{"choices":[{"text":"Hi"}]}"#, Some(C)),
            (
                Format::OpenAi,
                r#"{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":"{"}}]}}]}"#,
                Some(T),
            ),
            (
                Format::OpenAi,
                r#"{"choices":[{"delta":{"reasoning":"a","tool_calls":[{"function":{"arguments":"{"}}]}}]}"#,
                Some(T),
            ),
            (
                Format::OpenAi,
                r#"{"choices":[{"delta":{"reasoning_content":"a","content":"b"}}]}"#,
                Some(C),
            ),
            (
                Format::OpenAi,
                r#"{"choices":[{"delta":{"reasoning_content":""}}]}"#,
                None,
            ),
            (
                Format::Responses,
                r#"{"type":"response.reasoning_text.delta","delta":"a"}"#,
                Some(R),
            ),
            (
                Format::Responses,
                r#"{"type":"response.reasoning_summary_text.delta","delta":"a"}"#,
                Some(R),
            ),
            (
                Format::Responses,
                r#"{"type":"response.output_text.delta","delta":"a"}"#,
                Some(C),
            ),
            (
                Format::Responses,
                r#"{"type":"response.refusal.delta","delta":"no"}"#,
                Some(C),
            ),
            (
                Format::Responses,
                r#"{"type":"response.function_call_arguments.delta","delta":"{"}"#,
                Some(T),
            ),
            (
                Format::Anthropic,
                r#"{"type":"content_block_delta","delta":{"type":"thinking_delta","thinking":"a"}}"#,
                Some(R),
            ),
            (
                Format::Anthropic,
                r#"{"type":"content_block_delta","delta":{"type":"text_delta","text":"a"}}"#,
                Some(C),
            ),
            (
                Format::Anthropic,
                r#"{"type":"content_block_delta","delta":{"type":"input_json_delta","partial_json":"{"}}"#,
                Some(T),
            ),
            (
                Format::Ollama,
                r#"{"message":{"role":"assistant","content":"","thinking":"a"},"done":false}"#,
                Some(R),
            ),
            (
                Format::Ollama,
                r#"{"message":{"content":"a"},"done":false}"#,
                Some(C),
            ),
            (Format::Ollama, r#"{"response":"a","done":false}"#, Some(C)),
            (
                Format::Ollama,
                r#"{"thinking":"a","response":"","done":false}"#,
                Some(R),
            ),
            (
                Format::Ollama,
                r#"{"message":{"content":"","tool_calls":[{"function":{"name":"f","arguments":{}}}]},"done":false}"#,
                Some(T),
            ),
            (
                Format::Gemini,
                r#"{"candidates":[{"content":{"parts":[{"text":"a","thought":true}]}}]}"#,
                Some(R),
            ),
            (
                Format::Gemini,
                r#"{"candidates":[{"content":{"parts":[{"text":"a"}]}}]}"#,
                Some(C),
            ),
            (
                Format::Gemini,
                r#"{"candidates":[{"content":{"parts":[{"functionCall":{"name":"f","args":{}}}]}}]}"#,
                Some(T),
            ),
            (
                Format::Tgi,
                r#"{"token":{"id":1,"text":"a","special":false}}"#,
                Some(C),
            ),
            (Format::LlamaCpp, r#"{"content":"a","stop":false}"#, Some(C)),
            (Format::SgLang, r#"{"text":"a","meta_info":{}}"#, Some(C)),
        ];
        for (format, data, want) in cases {
            assert_eq!(phase_of(*format, data), *want, "{format:?} {data}");
        }
    }

    #[test]
    fn content_text_is_lent_to_the_think_tags_in_every_api() {
        for (format, data) in [
            (
                Format::OpenAi,
                r#"{"choices":[{"delta":{"content":"<think>"}}]}"#,
            ),
            (
                Format::Responses,
                r#"{"type":"response.output_text.delta","delta":"<think>"}"#,
            ),
            (
                Format::Anthropic,
                r#"{"type":"content_block_delta","delta":{"type":"text_delta","text":"<think>"}}"#,
            ),
            (
                Format::Ollama,
                r#"{"message":{"content":"<think>"},"done":false}"#,
            ),
            (
                Format::Gemini,
                r#"{"candidates":[{"content":{"parts":[{"text":"<think>"}]}}]}"#,
            ),
            (
                Format::Tgi,
                r#"{"token":{"id":1,"text":"<think>","special":false}}"#,
            ),
            (Format::LlamaCpp, r#"{"content":"<think>","stop":false}"#),
            (Format::SgLang, r#"{"text":"<think>","meta_info":{}}"#),
        ] {
            let mut think = ThinkState::default();
            let classified = Accounting::for_format(format).classify(&Event {
                kind: b"",
                data: data.as_bytes(),
                truncated: false,
            });
            assert_eq!(think.phase(&classified), Phase::Reasoning, "{format:?}");
        }
    }

    #[test]
    fn an_error_line_is_an_error_in_every_format() {
        for format in Format::ALL {
            let mut accounting = Accounting::for_format(format);
            assert!(accounting.unknown_field(b"error", b"{\"code\":500}"));
            assert!(!accounting.unknown_field(b"x-trace", b"1"));
        }
    }
}
