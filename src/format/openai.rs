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
//! A choice's `finish_reason` (`stop`, `length`, `tool_calls`, `content_filter`, vLLM's `abort`)
//! is read by both readers as they pass it; the template path never sees one, since the chunk
//! that carries it differs from the template in more than its text.
//! `[DONE]` (with or without a space after `data:`) ends the stream; `{"error": ...}` or
//! `{"object": "error"}` mid-stream is an upstream error.

mod grammar;
mod reference;
mod template;
mod walker;

pub(super) use reference::usage_details_by_serde;
pub(super) use walker::top_level_fields;

use super::count::RunningCount;
use super::{Classified, FinishReason, Phase};
use crate::scan::Event;

/// Per-stream state of the OpenAI-compatible accountant.
#[derive(Debug, Default, Clone)]
pub struct OpenAiAccounting {
    /// `usage.completion_tokens` at the previous token event, for exact per-event counts.
    usage: RunningCount,
    /// The last token event the walker read, to read the next ones by comparison (boxed: made
    /// at the stream's first token event, and most accountants' state is a few words).
    template: Option<Box<template::Template>>,
}

// === impl OpenAiAccounting ===

impl OpenAiAccounting {
    /// Asks for the cache lines of the kept template: the next chunk is compared with its bytes.
    #[inline]
    pub fn prefetch(&self) {
        if let Some(template) = &self.template {
            template.prefetch();
        }
    }

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
        // A chunk that differs from the previous token event only in its text reads as that one
        // did; the walker reads the usual chunk in one pass; anything it is not sure to read
        // exactly as serde does goes to serde, which has the last word.
        let template = self.template.as_deref().and_then(|t| t.read(data));
        let mut walked_details = None;
        let Some(chunk) = template
            .or_else(|| {
                let (summary, details) = self.walk(data)?;
                walked_details = details;
                Some(summary)
            })
            .or_else(|| Summary::by_serde(data))
        else {
            return Classified {
                unparsed: true,
                ..Classified::default()
            };
        };
        let usage_total = chunk.usage_total;
        let token_event = chunk.token_event;
        let mut tokens = chunk.token_ids.filter(|n| *n > 0);
        if token_event {
            if let Some(now) = usage_total {
                let grew = self.usage.token_event(now);
                tokens = tokens.or(grew);
            }
        }
        // The prompt's and the reasoning tokens come with the usage chunk at the end (once per
        // stream): read there only, by the walker when it was sure of them, else by serde.
        let (usage_prompt, usage_reasoning) = match usage_total {
            Some(_) if !token_event => {
                walked_details.unwrap_or_else(|| usage_details_by_serde(data))
            }
            _ => (None, None),
        };
        Classified {
            token_event,
            phase: chunk.phase,
            text: chunk.text,
            tokens,
            usage_total,
            usage_prompt,
            usage_reasoning,
            finish: chunk.finish,
            model: chunk.model,
            end: false,
            error: chunk.error,
            unparsed: false,
        }
    }

    /// The walker's reading of `data` and of its usage details (`None`: serde's to read); a
    /// token event it read becomes the template.
    fn walk<'a>(&mut self, data: &'a [u8]) -> Option<(Summary<'a>, Option<walker::UsageDetails>)> {
        let walker::Walked {
            summary,
            text,
            usage_details,
        } = walker::walk(data)?;
        if let Some(text) = text {
            match &mut self.template {
                Some(template) => template.keep(data, text, &summary),
                None => {
                    self.template = Some(Box::new(template::Template::new(data, text, &summary)))
                }
            }
        }
        Some((summary, usage_details))
    }
}

/// What a chunk says, as either reader finds it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Summary<'a> {
    /// `model`, when it is a string without escapes.
    model: Option<&'a str>,
    /// A non-null `error`, or `"object": "error"`.
    error: bool,
    /// Some choice shows the reader output.
    token_event: bool,
    /// The phase of a token event (content before tool_call before reasoning over the choices).
    phase: Phase,
    /// The raw inside of the last non-empty content (or completions `text`) string.
    text: Option<&'a [u8]>,
    /// The `token_ids` of all choices together, when any choice has them.
    token_ids: Option<u32>,
    /// `usage.completion_tokens`.
    usage_total: Option<u64>,
    /// The last `finish_reason` of the choices that have one.
    finish: Option<FinishReason>,
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
        assert_eq!(usage.usage_prompt, Some(5));
        assert_eq!(finish.usage_prompt, None);
        // The details as the walker reads them, and as serde does where the walker declines the
        // chunk (an escaped field name).
        for (data, reader) in [
            (
                r#"{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":41,"completion_tokens_details":{"reasoning_tokens":30}}}"#,
                "walker",
            ),
            (
                r#"{"choices":[],"\u0078":1,"usage":{"prompt_tokens":7,"completion_tokens":41,"completion_tokens_details":{"reasoning_tokens":30}}}"#,
                "serde",
            ),
        ] {
            assert_eq!(
                walker::walk(data.as_bytes()).is_some(),
                reader == "walker",
                "{data}"
            );
            let details = classify(&mut OpenAiAccounting::default(), data);
            assert_eq!(
                (details.usage_prompt, details.usage_reasoning),
                (Some(7), Some(30)),
                "{reader}"
            );
        }
        assert_eq!(finish.finish, Some(FinishReason::Stop));
        assert_eq!(
            (role.finish, token.finish, usage.finish),
            (None, None, None)
        );
        assert!(classify(&mut acc, "[DONE]").end);
        assert!(classify(&mut acc, " [DONE]").end);
    }

    #[test]
    fn finish_reasons_as_each_reader_finds_them() {
        // vLLM's last token event carries its text and the reason together: the template
        // (kept from the chunk before) cannot vouch for it, so the walker reads it.
        let mut acc = OpenAiAccounting::default();
        let chunk = |content: &str, finish: &str| {
            format!(
                r#"{{"id":"chatcmpl-9","object":"chat.completion.chunk","created":7,"model":"m","choices":[{{"index":0,"delta":{{"content":"{content}"}},"logprobs":null,"finish_reason":{finish}}}]}}"#
            )
        };
        assert_eq!(classify(&mut acc, &chunk("a", "null")).finish, None);
        assert_eq!(classify(&mut acc, &chunk("b", "null")).finish, None);
        let last = classify(&mut acc, &chunk("c", r#""length""#));
        assert!(last.token_event);
        assert_eq!(last.finish, Some(FinishReason::Length));
        for (data, reason) in [
            (
                r#"{"id":"c","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"tool_calls"}]}"#,
                FinishReason::ToolCalls,
            ),
            (
                r#"{"choices":[{"index":0,"delta":{},"finish_reason":"function_call"}]}"#,
                FinishReason::ToolCalls,
            ),
            (
                r#"{"choices":[{"index":0,"delta":{},"finish_reason":"content_filter"}]}"#,
                FinishReason::ContentFilter,
            ),
            (
                r#"{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"abort","stop_reason":null}]}"#,
                FinishReason::Abort,
            ),
            (
                r#"{"choices":[{"index":0,"delta":{},"finish_reason":"eos"}]}"#,
                FinishReason::Other,
            ),
            // Two choices: the last reason that names one.
            (
                r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"},{"index":1,"delta":{},"finish_reason":null}]}"#,
                FinishReason::Stop,
            ),
        ] {
            assert_eq!(
                walker::summary(data.as_bytes()).and_then(|s| s.finish),
                Some(reason),
                "{data}"
            );
            assert_eq!(
                Summary::by_serde(data.as_bytes()).and_then(|s| s.finish),
                Some(reason),
                "{data}"
            );
            let mut acc = OpenAiAccounting::default();
            assert_eq!(classify(&mut acc, data).finish, Some(reason), "{data}");
        }
        // A reason spelled with an escape is not unescaped: both readers call it other.
        let escaped = r#"{"choices":[{"delta":{},"finish_reason":"st\u006fp"}]}"#;
        let other = Some(FinishReason::Other);
        assert_eq!(walker::summary(escaped.as_bytes()).unwrap().finish, other);
        assert_eq!(Summary::by_serde(escaped.as_bytes()).unwrap().finish, other);
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

    pub(super) const VLLM_CHUNK: &str = r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" Hi"},"logprobs":null,"finish_reason":null}]}"#;

    #[test]
    fn a_stream_reads_the_same_with_its_template() {
        // One accountant over the stream (its template in use) against a fresh accountant per
        // chunk (never a template).
        let chunks: Vec<String> = [" a", " b", "", r#"\""#, " c", "d", r#"x\"#]
            .iter()
            .map(|t| VLLM_CHUNK.replace(" Hi", t))
            .chain([VLLM_CHUNK.replace(r#""model":"m""#, r#""model":"other""#)])
            .collect();
        let mut streamed = OpenAiAccounting::default();
        for chunk in &chunks {
            let with = classify(&mut streamed, chunk);
            let alone = classify(&mut OpenAiAccounting::default(), chunk);
            assert_eq!(with, alone, "{chunk}");
        }
        assert!(streamed.template.is_some());
    }
}
