//! OpenAI-compatible streaming chunks (`chat.completion.chunk` and `text_completion`).
//!
//! A token event is a chunk in which some choice carries non-empty `delta.content`,
//! `delta.reasoning_content` / `delta.reasoning`, tool-call `arguments`, or (completions) `text`.
//! Role-only and empty deltas (vLLM sends empty `content` for special tokens and for bytes held
//! back until they form valid UTF-8), finish chunks, usage-only chunks and `[DONE]` are not.
//! When vLLM or SGLang send continuous usage stats, the growth of `usage.completion_tokens` since
//! the previous token event is that event's exact token count. When vLLM returns `token_ids`
//! (`return_token_ids`), their number is the exact count of the event, and ids on an event that
//! shows nothing (a held-back byte, a special token) count toward the total only.
//! `[DONE]` (with or without a space after `data:`) ends the stream; `{"error": ...}` or
//! `{"object": "error"}` mid-stream is an upstream error.

use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::count::RunningCount;
use super::json::{is_literal, non_empty_string, plain_string, present, ArrayLen};
use super::Classified;
use crate::scan::Event;

/// Per-stream state of the OpenAI-compatible accountant.
#[derive(Debug, Default, Clone)]
pub struct OpenAiAccounting {
    /// `usage.completion_tokens` at the previous token event, for exact per-event counts.
    usage: RunningCount,
}

// === impl OpenAiAccounting ===

impl OpenAiAccounting {
    /// Classifies one event of the stream.
    pub fn classify<'a>(&mut self, event: &Event<'a>) -> Classified<'a> {
        let data = event.data.trim_ascii();
        if data == b"[DONE]" {
            return Classified {
                end: true,
                ..Classified::default()
            };
        }
        if event.truncated {
            return Classified {
                unparsed: true,
                ..Classified::default()
            };
        }
        let Ok(chunk) = serde_json::from_slice::<Chunk<'a>>(data) else {
            return Classified {
                unparsed: true,
                ..Classified::default()
            };
        };
        let error = present(chunk.error) || is_literal(chunk.object, r#""error""#);
        let usage_total = chunk.usage.and_then(|u| u.completion_tokens);
        let token_event = chunk.choices.token_event;
        let mut tokens = chunk.choices.token_ids.filter(|n| *n > 0);
        if token_event {
            if let Some(now) = usage_total {
                let grew = self.usage.token_event(now);
                tokens = tokens.or(grew);
            }
        }
        Classified {
            token_event,
            tokens,
            usage_total,
            model: chunk.model.and_then(plain_string),
            end: false,
            error,
            unparsed: false,
        }
    }
}

#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    object: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
    #[serde(default)]
    choices: ChoicesSummary,
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    completion_tokens: Option<u64>,
}

/// The `choices` array folded to what matters, without collecting it.
#[derive(Default)]
struct ChoicesSummary {
    /// Some choice shows the reader output.
    token_event: bool,
    /// The `token_ids` of all choices together, when any choice has them.
    token_ids: Option<u32>,
}

impl<'de> Deserialize<'de> for ChoicesSummary {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ChoicesVisitor;
        impl<'de> Visitor<'de> for ChoicesVisitor {
            type Value = ChoicesSummary;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array of choices")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(ChoicesSummary::default())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut summary = ChoicesSummary::default();
                while let Some(choice) = seq.next_element::<Choice<'de>>()? {
                    summary.token_event |= choice.shows_output();
                    if let Some(n) = choice.token_ids.0 {
                        summary.token_ids = Some(summary.token_ids.unwrap_or(0).saturating_add(n));
                    }
                }
                Ok(summary)
            }
        }
        deserializer.deserialize_any(ChoicesVisitor)
    }
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(borrow, default)]
    delta: Option<Delta<'a>>,
    #[serde(borrow, default)]
    text: Option<&'a RawValue>,
    /// vLLM's `return_token_ids`: the ids of the tokens this choice's delta carries.
    #[serde(default)]
    token_ids: ArrayLen,
}

impl Choice<'_> {
    fn shows_output(&self) -> bool {
        non_empty_string(self.text) || self.delta.as_ref().is_some_and(Delta::shows_output)
    }
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    reasoning_content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    reasoning: Option<&'a RawValue>,
    #[serde(default)]
    tool_calls: ToolCallsSummary,
}

impl Delta<'_> {
    fn shows_output(&self) -> bool {
        non_empty_string(self.content)
            || non_empty_string(self.reasoning_content)
            || non_empty_string(self.reasoning)
            || self.tool_calls.has_arguments
    }
}

/// `delta.tool_calls` folded to "does any call carry argument text".
#[derive(Default)]
struct ToolCallsSummary {
    has_arguments: bool,
}

impl<'de> Deserialize<'de> for ToolCallsSummary {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct CallsVisitor;
        impl<'de> Visitor<'de> for CallsVisitor {
            type Value = ToolCallsSummary;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array of tool calls")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(ToolCallsSummary::default())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut summary = ToolCallsSummary::default();
                while let Some(call) = seq.next_element::<ToolCall<'de>>()? {
                    summary.has_arguments |= call
                        .function
                        .as_ref()
                        .is_some_and(|f| non_empty_string(f.arguments));
                }
                Ok(summary)
            }
        }
        deserializer.deserialize_any(CallsVisitor)
    }
}

#[derive(Deserialize)]
struct ToolCall<'a> {
    #[serde(borrow, default)]
    function: Option<Function<'a>>,
}

#[derive(Deserialize)]
struct Function<'a> {
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classify(acc: &mut OpenAiAccounting, data: &str) -> Classified<'static> {
        let data: &'static [u8] = Box::leak(data.as_bytes().to_vec().into_boxed_slice());
        acc.classify(&Event {
            kind: b"",
            data,
            truncated: false,
        })
    }

    #[test]
    fn chat_chunks_from_vllm() {
        let mut acc = OpenAiAccounting::default();
        let role = classify(
            &mut acc,
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#,
        );
        assert!(!role.token_event);
        assert_eq!(role.model, Some("meta-llama/Llama-3.1-8B-Instruct"));
        let token = classify(
            &mut acc,
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" Hello\n"},"logprobs":null,"finish_reason":null}]}"#,
        );
        assert!(token.token_event);
        assert_eq!(token.tokens, None);
        let held_back = classify(
            &mut acc,
            r#"{"model":"m","choices":[{"index":0,"delta":{"content":""},"finish_reason":null}]}"#,
        );
        assert!(!held_back.token_event);
        let finish = classify(
            &mut acc,
            r#"{"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
        );
        assert!(!finish.token_event);
        let usage = classify(
            &mut acc,
            r#"{"model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":40,"total_tokens":45}}"#,
        );
        assert!(!usage.token_event);
        assert_eq!(usage.usage_total, Some(40));
        assert!(classify(&mut acc, "[DONE]").end);
        assert!(classify(&mut acc, " [DONE]").end);
    }

    #[test]
    fn reasoning_tool_arguments_and_completions_text_are_token_events() {
        let mut acc = OpenAiAccounting::default();
        for data in [
            r#"{"choices":[{"delta":{"reasoning_content":"hmm"}}]}"#,
            r#"{"choices":[{"delta":{"reasoning":"hmm"}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a"}}]}}]}"#,
            r#"{"object":"text_completion","choices":[{"index":0,"text":"Hi","finish_reason":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":""}},{"index":1,"delta":{"content":"x"}}]}"#,
        ] {
            assert!(classify(&mut acc, data).token_event, "{data}");
        }
        for data in [
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c1","function":{"name":"f","arguments":""}}]}}]}"#,
            r#"{"choices":[{"delta":{"content":null}}]}"#,
            r#"{"choices":null}"#,
            r#"{"object":"text_completion","choices":[{"index":0,"text":"","finish_reason":"length"}]}"#,
        ] {
            assert!(!classify(&mut acc, data).token_event, "{data}");
        }
    }

    #[test]
    fn continuous_usage_stats_give_exact_tokens_per_event() {
        let mut acc = OpenAiAccounting::default();
        let a = classify(
            &mut acc,
            r#"{"choices":[{"delta":{"content":"a"}}],"usage":{"completion_tokens":1}}"#,
        );
        assert_eq!(a.tokens, Some(1));
        let held = classify(
            &mut acc,
            r#"{"choices":[{"delta":{"content":""}}],"usage":{"completion_tokens":2}}"#,
        );
        assert!(!held.token_event);
        let b = classify(
            &mut acc,
            r#"{"choices":[{"delta":{"content":"bcd"}}],"usage":{"completion_tokens":5}}"#,
        );
        assert_eq!(b.tokens, Some(4));
    }

    #[test]
    fn errors_mid_stream_and_garbage() {
        let mut acc = OpenAiAccounting::default();
        assert!(classify(&mut acc, r#"{"error":{"message":"overloaded","code":503}}"#).error);
        assert!(classify(&mut acc, r#"{"object":"error","message":"x","code":400}"#).error);
        assert!(!classify(&mut acc, r#"{"error":null,"choices":[]}"#).error);
        assert!(classify(&mut acc, "{not json").unparsed);
        let escaped = classify(&mut acc, r#"{"model":"a\"b","choices":[]}"#);
        assert_eq!(escaped.model, None);
    }

    #[test]
    fn done_with_and_without_a_space() {
        // The scanner drops one space after `data:`; a second one, or none, reaches the accountant.
        let mut acc = OpenAiAccounting::default();
        for data in ["[DONE]", " [DONE]", "[DONE]\r", "  [DONE]  "] {
            let done = classify(&mut acc, data);
            assert!(done.end && !done.token_event && !done.unparsed, "{data:?}");
        }
    }

    #[test]
    fn token_ids_are_the_exact_count_of_their_event() {
        let mut acc = OpenAiAccounting::default();
        let two = classify(
            &mut acc,
            r#"{"choices":[{"index":0,"delta":{"content":"Hello"},"token_ids":[9906,0]}]}"#,
        );
        assert!(two.token_event);
        assert_eq!(two.tokens, Some(2));
        let held = classify(
            &mut acc,
            r#"{"choices":[{"index":0,"delta":{"content":""},"token_ids":[127]}]}"#,
        );
        assert!(!held.token_event);
        assert_eq!(held.tokens, Some(1), "counted toward the total only");
        let both = classify(
            &mut acc,
            r#"{"choices":[{"index":0,"text":"a","token_ids":[1]},{"index":1,"text":"b","token_ids":[2,3,4]}]}"#,
        );
        assert_eq!(both.tokens, Some(4), "all choices of the chunk");
        let with_usage = classify(
            &mut acc,
            r#"{"choices":[{"index":0,"delta":{"content":"x"},"token_ids":[5]}],"usage":{"completion_tokens":9}}"#,
        );
        assert_eq!(
            with_usage.tokens,
            Some(1),
            "the ids win over the usage growth"
        );
        assert_eq!(with_usage.usage_total, Some(9));
        let none = classify(
            &mut acc,
            r#"{"choices":[{"index":0,"delta":{"content":"x"},"token_ids":null}]}"#,
        );
        assert_eq!(none.tokens, None);
    }
}
