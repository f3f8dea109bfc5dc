//! Ollama's native API, `/api/chat` and `/api/generate`, streamed as NDJSON.
//!
//! Each line is `{"model":"llama3.2","created_at":"...","message":{"role":"assistant",
//! "content":"The"},"done":false}` (chat) or `{"model":...,"response":"The","done":false}`
//! (generate). A line with non-empty `message.content` or `response` is a token event, and so is
//! one with non-empty `thinking` (reasoning models) or with `message.tool_calls` (Ollama sends a
//! tool call whole, in one line). Each counts 1 token; the `done: true` line ends the stream and
//! its `eval_count` is the server's total, `prompt_eval_count` the prompt's tokens (absent when
//! the prompt was all cached) and `done_reason` why it ended (`stop`, `length`). A failure arrives as a line `{"error": "..."}`.

use serde::Deserialize;
use serde_json::value::RawValue;

use super::json::{non_empty_string, plain_string, present, string_inside, ArrayLen};
use super::{Classified, FinishReason, Phase};
use crate::scan::Event;

/// The Ollama accountant; its lines need no memory of earlier ones.
#[derive(Debug, Default, Clone, Copy)]
pub struct OllamaAccounting;

// === impl OllamaAccounting ===

impl OllamaAccounting {
    /// Classifies one line of the stream.
    pub fn classify<'a>(&mut self, event: &Event<'a>) -> Classified<'a> {
        if event.truncated {
            return Classified::unparsed();
        }
        let Ok(line) = serde_json::from_slice::<Line<'a>>(event.data) else {
            return Classified::unparsed();
        };
        let message = line.message.as_ref();
        let content = message.and_then(|m| m.content).or(line.response);
        let tool_calls = message.is_some_and(|m| m.tool_calls.0.is_some_and(|n| n > 0));
        let thinking =
            non_empty_string(message.and_then(|m| m.thinking)) || non_empty_string(line.thinking);
        // Content before tool_call before reasoning.
        let phase = if non_empty_string(content) {
            Some(Phase::Content)
        } else if tool_calls {
            Some(Phase::ToolCall)
        } else {
            thinking.then_some(Phase::Reasoning)
        };
        Classified {
            token_event: phase.is_some(),
            phase: phase.unwrap_or_default(),
            text: string_inside(content),
            tokens: None,
            usage_total: line.eval_count,
            usage_prompt: line.prompt_eval_count,
            finish: line
                .done_reason
                .and_then(|raw| FinishReason::ollama(raw.get().as_bytes())),
            model: line.model.and_then(plain_string),
            end: line.done == Some(true),
            error: present(line.error),
            ..Classified::default()
        }
    }
}

#[derive(Deserialize)]
struct Line<'a> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    message: Option<Message<'a>>,
    #[serde(borrow, default)]
    response: Option<&'a RawValue>,
    #[serde(borrow, default)]
    thinking: Option<&'a RawValue>,
    #[serde(default)]
    done: Option<bool>,
    #[serde(default)]
    eval_count: Option<u64>,
    #[serde(default)]
    prompt_eval_count: Option<u64>,
    #[serde(borrow, default)]
    done_reason: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    thinking: Option<&'a RawValue>,
    #[serde(default)]
    tool_calls: ArrayLen,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classify(data: &'static str) -> Classified<'static> {
        OllamaAccounting.classify(&Event {
            kind: b"",
            data: data.as_bytes(),
            truncated: false,
        })
    }

    #[test]
    fn chat_lines() {
        let token = classify(
            r#"{"model":"llama3.2","created_at":"2023-08-04T08:52:19.385406455-07:00","message":{"role":"assistant","content":"The"},"done":false}"#,
        );
        assert!(token.token_event && !token.end);
        assert_eq!(token.model, Some("llama3.2"));
        let last = classify(
            r#"{"model":"llama3.2","created_at":"2023-08-04T19:22:45.499127Z","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","total_duration":4883583458,"load_duration":1334875,"prompt_eval_count":26,"prompt_eval_duration":342546000,"eval_count":282,"eval_duration":4535599000}"#,
        );
        assert!(!last.token_event && last.end);
        assert_eq!(last.usage_total, Some(282));
        assert_eq!(last.usage_prompt, Some(26));
        assert_eq!(last.finish, Some(FinishReason::Stop));
        assert_eq!(token.finish, None);
        let thinking = classify(
            r#"{"model":"qwen3","created_at":"2025-05-29T09:35:56.836222Z","message":{"role":"assistant","content":"","thinking":"Let"},"done":false}"#,
        );
        assert!(thinking.token_event);
        let tool = classify(
            r#"{"model":"llama3.2","created_at":"2024-07-22T20:33:28.123648Z","message":{"role":"assistant","content":"","tool_calls":[{"function":{"name":"get_weather","arguments":{"city":"Paris"}}}]},"done":false}"#,
        );
        assert!(tool.token_event);
    }

    #[test]
    fn generate_lines() {
        assert!(classify(r#"{"model":"llama3.2","created_at":"2023-08-04T08:52:19.385406455-07:00","response":"The","done":false}"#).token_event);
        let last = classify(
            r#"{"model":"llama3.2","created_at":"2023-08-04T19:22:45.499127Z","response":"","done":true,"context":[1,2,3],"eval_count":259}"#,
        );
        assert!(!last.token_event && last.end);
        assert_eq!(last.usage_total, Some(259));
        let cut = classify(
            r#"{"model":"llama3.2","created_at":"2024-08-04T19:22:45.499127Z","response":"","done":true,"done_reason":"length","prompt_eval_count":14,"eval_count":64}"#,
        );
        assert_eq!(cut.finish, Some(FinishReason::Length));
        assert_eq!(cut.usage_prompt, Some(14));
    }

    #[test]
    fn errors_and_garbage() {
        assert!(
            classify(
                r#"{"error":"an error was encountered while running the model: unexpected EOF"}"#
            )
            .error
        );
        assert!(classify("not json").unparsed);
    }
}
