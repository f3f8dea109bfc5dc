//! A response read whole: the usage a non-streaming answer (`"stream": false`) reports, by the
//! readers of its API's streaming events.
//!
//! Most APIs answer a non-streaming request with one object shaped like their last streaming
//! event, so the body is classified as one event by the API's own accountant: OpenAI's
//! `chat.completion` and `text_completion` (`usage`), Gemini's `generateContent`
//! (`usageMetadata`), Ollama's `done: true` object, TGI's `/generate` (`details`), llama.cpp's
//! `/completion` and SGLang's `/generate` (`meta_info`). Two differ, and their modules read them
//! with the structs their events already use: a Responses body is the `response` object that
//! `response.completed` wraps, and an Anthropic body is the message `message_start` wraps, with
//! its final usage.
//!
//! The API is the route's `format` when set; otherwise the body's shape decides as the first
//! event of a stream does ([`AutoAccounting`]), then a top-level `generated_text` (TGI's
//! `/generate`, a path SGLang uses too), then the request path. A body none of them names is
//! not read: nothing is said about it.

use super::detect::AutoAccounting;
use super::{anthropic, openai, responses};
use super::{Accounting, Classified, Format, OpenAiAccounting, TgiAccounting};
use crate::scan::Event;

/// What a whole response's body says: its usage figures (`usage_total`, `usage_prompt`,
/// `usage_reasoning`), `model` and `finish`, or `unparsed` for a body that is not a readable
/// object of its API. `None` when no API could be told, or the body is empty or an error report.
pub fn read(
    body: &[u8],
    configured: Option<Format>,
    path: Option<Format>,
) -> Option<Classified<'_>> {
    let data = body.trim_ascii();
    if data.is_empty() {
        return None;
    }
    let event = Event {
        kind: b"",
        data,
        truncated: false,
    };
    let format = configured.or_else(|| detected(&event, path))?;
    if !data.starts_with(b"{") {
        // serde fills a struct from an array as well; a whole answer is always an object.
        return Some(Classified::unparsed());
    }
    let classified = match format {
        Format::OpenAi => {
            let mut classified = OpenAiAccounting::default().classify(&event);
            // A completions choice's `text` makes the body a token event, for which the reader
            // leaves the prompt's and the reasoning tokens unread.
            if classified.token_event && classified.usage_total.is_some() {
                let (prompt, reasoning) = openai::usage_details_by_serde(data);
                classified.usage_prompt = prompt;
                classified.usage_reasoning = reasoning;
            }
            classified
        }
        Format::Responses | Format::ResponsesWebsocket => responses::whole(data),
        Format::Anthropic => anthropic::whole(data),
        Format::Realtime | Format::Unknown => return None,
        other => Accounting::for_format(other).classify(&event),
    };
    Some(classified)
}

/// The API a non-streaming request's path belongs to: [`Format::from_path`]'s, and Gemini for
/// `models/{model}:generateContent`, the non-streaming twin of `:streamGenerateContent`.
pub fn path_format(path: &str) -> Option<Format> {
    Format::from_path(path).or_else(|| path.contains(":generateContent").then_some(Format::Gemini))
}

/// The API of a body on a route without a `format`: by its shape, by TGI's `generated_text`,
/// then by the request path.
fn detected(event: &Event<'_>, path: Option<Format>) -> Option<Format> {
    match AutoAccounting::new(None).decide(event) {
        Ok(Format::Unknown) => {}
        Ok(format) => return Some(format),
        // An error report: whatever the API, it reports no usage.
        Err(_) => return None,
    }
    if TgiAccounting.classify(event).end {
        return Some(Format::Tgi);
    }
    path.filter(|format| *format != Format::Unknown)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The usage figures, model and whether the body was unreadable.
    type Figures<'a> = (Option<u64>, Option<u64>, Option<u64>, Option<&'a str>, bool);

    fn figures(classified: Classified<'_>) -> Figures<'_> {
        (
            classified.usage_total,
            classified.usage_prompt,
            classified.usage_reasoning,
            classified.model,
            classified.unparsed,
        )
    }

    fn auto<'a>(body: &'a str, path: &str) -> Option<Figures<'a>> {
        read(body.as_bytes(), None, path_format(path)).map(figures)
    }

    #[test]
    fn gemini_non_streaming_path_is_named() {
        let path = "/v1beta/models/gemini-2.5-flash:generateContent";
        assert_eq!(path_format(path), Some(Format::Gemini));
        assert_eq!(path_format("/v1/chat/completions"), Some(Format::OpenAi));
        assert_eq!(path_format("/v1/embeddings"), None);
    }

    #[test]
    fn every_api_answer_is_read_by_shape_or_path() {
        let cases: &[(&str, &str, Figures<'static>)] = &[
            (
                "/v1/chat/completions",
                r#"{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"message":{"role":"assistant","content":"Hi","reasoning_content":"hm"},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"total_tokens":40,"completion_tokens":28,"completion_tokens_details":{"reasoning_tokens":20},"prompt_tokens_details":null}}"#,
                (Some(28), Some(12), Some(20), Some("Qwen/Qwen3-8B"), false),
            ),
            (
                "/v1/completions",
                r#"{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" world","logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":3,"total_tokens":19,"completion_tokens":16}}"#,
                (Some(16), Some(3), None, Some("m"), false),
            ),
            (
                "/v1/responses",
                r#"{"id":"resp_1","object":"response","status":"completed","model":"gpt-4.1","output":[],"usage":{"input_tokens":37,"output_tokens":11,"output_tokens_details":{"reasoning_tokens":4},"total_tokens":48}}"#,
                (Some(11), Some(37), Some(4), Some("gpt-4.1"), false),
            ),
            (
                "/v1/messages",
                r#"{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"Hi"}],"model":"claude-x","stop_reason":"end_turn","usage":{"input_tokens":25,"output_tokens":15}}"#,
                (Some(15), Some(25), None, Some("claude-x"), false),
            ),
            (
                "/v1beta/models/gemini-2.5-flash:generateContent",
                r#"{"candidates":[{"content":{"parts":[{"text":"Hi"}],"role":"model"},"finishReason":"STOP","index":0}],"usageMetadata":{"promptTokenCount":9,"candidatesTokenCount":11,"totalTokenCount":50,"thoughtsTokenCount":30},"modelVersion":"gemini-2.5-flash"}"#,
                (Some(11), Some(9), Some(30), Some("gemini-2.5-flash"), false),
            ),
            (
                "/api/chat",
                r#"{"model":"llama3.2","created_at":"2023-12-12T14:13:43.416799Z","message":{"role":"assistant","content":"Hello!"},"done":true,"done_reason":"stop","total_duration":5191566416,"prompt_eval_count":26,"eval_count":298}"#,
                (Some(298), Some(26), None, Some("llama3.2"), false),
            ),
            (
                "/generate",
                r#"{"generated_text":"Deep learning is","details":{"finish_reason":"length","generated_tokens":20,"seed":null,"prefill":[],"tokens":[]}}"#,
                (Some(20), None, None, None, false),
            ),
            (
                "/generate",
                r#"{"text":"Paris.","meta_info":{"id":"1","finish_reason":{"type":"stop"},"prompt_tokens":7,"completion_tokens":3}}"#,
                (Some(3), Some(7), None, None, false),
            ),
            (
                "/completion",
                r#"{"content":"Paris","model":"qwen","stop":true,"tokens_predicted":5,"tokens_evaluated":9,"stop_type":"eos"}"#,
                (Some(5), Some(9), None, Some("qwen"), false),
            ),
        ];
        for (path, body, want) in cases {
            assert_eq!(auto(body, path), Some(*want), "{path} {body}");
        }
    }

    #[test]
    fn a_shape_overrides_the_path_and_a_configured_format_both() {
        let chat = r#"{"model":"m","choices":[{"message":{"content":"x"}}],"usage":{"completion_tokens":4,"prompt_tokens":2}}"#;
        assert_eq!(
            auto(chat, "/gateway/generate"),
            Some((Some(4), Some(2), None, Some("m"), false))
        );
        let ollama = br#"{"model":"m","done":true,"eval_count":7}"#;
        let configured = read(ollama, Some(Format::Ollama), Some(Format::OpenAi)).map(figures);
        assert_eq!(configured, Some((Some(7), None, None, Some("m"), false)));
    }

    #[test]
    fn unreadable_bodies_say_so_and_unknown_ones_say_nothing() {
        let invalid = (None, None, None, None, true);
        assert_eq!(
            auto(r#"{"choices":[{"#, "/v1/chat/completions"),
            Some(invalid)
        );
        assert_eq!(auto("[1,2]", "/v1/messages"), Some(invalid));
        assert_eq!(auto("not json", "/v1/chat/completions"), Some(invalid));
        assert_eq!(
            auto(
                r#"{"data":[],"usage":{"prompt_tokens":3}}"#,
                "/v1/embeddings"
            ),
            None
        );
        assert_eq!(auto("", "/v1/chat/completions"), None);
        assert_eq!(auto(" \r\n", "/v1/chat/completions"), None);
        assert_eq!(
            auto(r#"{"error":{"message":"no"}}"#, "/v1/chat/completions"),
            None
        );
        assert_eq!(read(b"{}", Some(Format::Realtime), None).map(figures), None);
    }
}
