//! Anthropic Messages (`POST /v1/messages` with `"stream": true`).
//!
//! The stream is `message_start` (with the model), then per content block `content_block_start`,
//! `content_block_delta`s and `content_block_stop`, then `message_delta` (`delta.stop_reason`:
//! `end_turn`, `max_tokens`, `tool_use` …, and the cumulative `usage.output_tokens`) and `message_stop`, with `ping`s anywhere. A token event is
//! a `content_block_delta` whose delta is a non-empty `text_delta`, `thinking_delta` or
//! `input_json_delta` (tool-use arguments); a `signature_delta` or `citations_delta` shows no
//! output. Each counts 1 token; the last `message_delta`'s `output_tokens` is the server's total
//! (the `output_tokens` in `message_start` is a placeholder, so it is not used). `message_stop`
//! ends the stream; an `error` event (`overloaded_error` and kin) is an upstream error.

use serde::Deserialize;
use serde_json::value::RawValue;

use super::json::{non_empty_string, plain_string, string_inside};
use super::{Classified, FinishReason, Phase};
use crate::scan::Event;

/// The Anthropic accountant; the events need no memory of earlier ones.
#[derive(Debug, Default, Clone, Copy)]
pub struct AnthropicAccounting;

// === impl AnthropicAccounting ===

impl AnthropicAccounting {
    /// Classifies one event of the stream.
    pub fn classify<'a>(&mut self, event: &Event<'a>) -> Classified<'a> {
        if event.truncated {
            return Classified::unparsed();
        }
        let Ok(data) = serde_json::from_slice::<Data<'a>>(event.data) else {
            return Classified::unparsed();
        };
        let mut classified = Classified::default();
        match data.kind.map_or("", RawValue::get) {
            r#""content_block_delta""# => {
                if let Some(phase) = data.delta.as_ref().and_then(Delta::phase) {
                    classified.token_event = true;
                    classified.phase = phase;
                    classified.text = data.delta.as_ref().and_then(|d| string_inside(d.text));
                }
            }
            r#""message_start""# => {
                classified.usage_prompt = data
                    .message
                    .as_ref()
                    .and_then(|m| m.usage.as_ref()?.input_tokens);
                classified.model = data.message.and_then(|m| plain_string(m.model?));
            }
            r#""message_delta""# => {
                classified.usage_total = data.usage.and_then(|u| u.output_tokens);
                classified.finish = data
                    .delta
                    .and_then(|d| d.stop_reason)
                    .and_then(|raw| FinishReason::anthropic(raw.get().as_bytes()));
            }
            r#""message_stop""# => classified.end = true,
            r#""error""# => classified.error = true,
            _ => classified.error = event.kind == b"error",
        }
        classified
    }
}

/// A whole (non-streaming) message, the answer to `POST /v1/messages` without `"stream": true`:
/// the object `message_start` carries in a stream, read by the same fields, except that here
/// `usage.output_tokens` is the final count rather than a placeholder, and `stop_reason` says
/// why it ended. Unparsed when it is not a JSON object of that shape.
pub(super) fn whole(body: &[u8]) -> Classified<'_> {
    let Ok(message) = serde_json::from_slice::<WholeMessage<'_>>(body) else {
        return Classified::unparsed();
    };
    let usage = message.usage.as_ref();
    Classified {
        usage_total: usage.and_then(|u| u.output_tokens),
        usage_prompt: usage.and_then(|u| u.input_tokens),
        finish: message
            .stop_reason
            .and_then(|raw| FinishReason::anthropic(raw.get().as_bytes())),
        model: message.model.and_then(plain_string),
        end: true,
        ..Classified::default()
    }
}

#[derive(Deserialize)]
struct Data<'a> {
    #[serde(borrow, default, rename = "type")]
    kind: Option<&'a RawValue>,
    #[serde(borrow, default)]
    delta: Option<Delta<'a>>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(borrow, default)]
    message: Option<Message<'a>>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(borrow, default, rename = "type")]
    kind: Option<&'a RawValue>,
    #[serde(borrow, default)]
    text: Option<&'a RawValue>,
    #[serde(borrow, default)]
    thinking: Option<&'a RawValue>,
    #[serde(borrow, default)]
    partial_json: Option<&'a RawValue>,
    /// `message_delta` only.
    #[serde(borrow, default)]
    stop_reason: Option<&'a RawValue>,
}

// === impl Delta ===

impl Delta<'_> {
    /// The phase of the output the delta shows, when it shows any.
    fn phase(&self) -> Option<Phase> {
        let (raw, phase) = match self.kind.map_or("", RawValue::get) {
            r#""text_delta""# => (self.text, Phase::Content),
            r#""thinking_delta""# => (self.thinking, Phase::Reasoning),
            r#""input_json_delta""# => (self.partial_json, Phase::ToolCall),
            _ => return None,
        };
        non_empty_string(raw).then_some(phase)
    }
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    input_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(default)]
    usage: Option<Usage>,
}

/// A whole message: `message_start`'s object with its final `usage` and `stop_reason` (a
/// struct of its own, so that reading a stream's `message_start` stays as it was).
#[derive(Deserialize)]
struct WholeMessage<'a> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(borrow, default)]
    stop_reason: Option<&'a RawValue>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classify(kind: &'static str, data: &'static str) -> Classified<'static> {
        AnthropicAccounting.classify(&Event {
            kind: kind.as_bytes(),
            data: data.as_bytes(),
            truncated: false,
        })
    }

    #[test]
    fn a_text_message() {
        let start = classify(
            "message_start",
            r#"{"type":"message_start","message":{"id":"msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5-20250929","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"output_tokens":1}}}"#,
        );
        assert!(!start.token_event, "message_start is not a token event");
        assert_eq!(start.model, Some("claude-sonnet-4-5-20250929"));
        assert_eq!(start.usage_prompt, Some(25));
        assert_eq!(
            start.usage_total, None,
            "its output_tokens is a placeholder"
        );
        let block = classify(
            "content_block_start",
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        );
        assert!(!block.token_event);
        assert!(!classify("ping", r#"{"type": "ping"}"#).token_event);
        let delta = classify(
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}"#,
        );
        assert!(delta.token_event);
        let usage = classify(
            "message_delta",
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}"#,
        );
        assert!(!usage.token_event);
        assert_eq!(usage.usage_total, Some(15));
        assert_eq!(usage.finish, Some(FinishReason::Stop));
        assert_eq!(delta.finish, None);
        let cut = classify(
            "message_delta",
            r#"{"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence":null},"usage":{"output_tokens":64}}"#,
        );
        assert_eq!(cut.finish, Some(FinishReason::Length));
        let tool = classify(
            "message_delta",
            r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":89}}"#,
        );
        assert_eq!(tool.finish, Some(FinishReason::ToolCalls));
        assert!(classify("message_stop", r#"{"type":"message_stop"}"#).end);
    }

    #[test]
    fn thinking_and_tool_arguments_are_token_events_signatures_are_not() {
        for data in [
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Let me solve this"}}"#,
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"location\": \"San Fra"}}"#,
        ] {
            assert!(classify("content_block_delta", data).token_event, "{data}");
        }
        for data in [
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"}}"#,
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":""}}"#,
        ] {
            assert!(!classify("content_block_delta", data).token_event, "{data}");
        }
    }

    #[test]
    fn a_whole_message_is_read_with_its_final_usage() {
        let body = br#"{"id":"msg_01XFDUDYJgAACzvnptvVoYEL","type":"message","role":"assistant","content":[{"type":"text","text":"Hello!"}],"model":"claude-sonnet-4-5-20250929","stop_reason":"max_tokens","stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":6}}"#;
        let read = whole(body);
        assert!(!read.unparsed && !read.token_event);
        assert_eq!((read.usage_total, read.usage_prompt), (Some(6), Some(12)));
        assert_eq!(read.model, Some("claude-sonnet-4-5-20250929"));
        assert_eq!(read.finish, Some(FinishReason::Length));
        assert!(whole(b"{\"usage\":3}").unparsed);
    }

    #[test]
    fn error_events() {
        let error = classify(
            "error",
            r#"{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}"#,
        );
        assert!(error.error && !error.token_event);
    }
}
