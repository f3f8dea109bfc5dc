//! OpenAI chat and completions chunks as vLLM writes them (`serving_chat.py`,
//! `serving_completion.py`).
//!
//! Chat: a role chunk, then one chunk per decode step whose delta carries `reasoning_content`
//! and/or `reasoning` (a reasoning parser), `content`, or a tool call's `arguments` (each call
//! opened by a chunk with its `id`, `type` and `function.name`); a finish chunk
//! (`finish_reason: "tool_calls"` after tool calls), a usage chunk with `choices: []` and, when a
//! reasoning parser counted them, `completion_tokens_details.reasoning_tokens`, then `[DONE]`.
//! Completions have no reasoning field and no tools: `text` only, thinking inline.

use std::fmt::Write as _;
use std::ops::Range;

use bytes::BytesMut;
use serde_json::json;

use super::{begin, end, Api, Finish, Tags, Wire, TOOL_NAME};
use crate::sim::config::ReasoningField;
use crate::sim::phases::Segment;

/// The role chunk, and a tool call's opening chunk when the stream starts with one.
pub(super) fn preamble_len(w: &Wire) -> usize {
    match w.api {
        Api::Chat => 1 + opens(w.output.first_segment()),
        _ => 0,
    }
}

pub(super) fn write_preamble(w: &mut Wire, i: usize, buf: &mut BytesMut) {
    if i == 0 {
        head(w, buf);
        buf.extend_from_slice(
            br#""choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#,
        );
        end(buf);
    } else {
        open(w, w.output.first_segment(), buf);
    }
}

/// Chunks that open `segment`: a tool call's id and name.
fn opens(segment: Segment) -> usize {
    usize::from(matches!(segment, Segment::ToolCall(_)))
}

fn open(w: &Wire, segment: Segment, buf: &mut BytesMut) {
    if let Segment::ToolCall(k) = segment {
        head(w, buf);
        let _ = write!(
            buf,
            r#""choices":[{{"index":0,"delta":{{"tool_calls":[{{"id":"{}","type":"function","index":{k},"function":{{"name":"{TOOL_NAME}"}}}}]}},"logprobs":null,"finish_reason":null}}]}}"#,
            w.call_id("chatcmpl-tool-sim-", k)
        );
        end(buf);
    }
}

pub(super) fn write_step(w: &mut Wire, range: Range<u64>, buf: &mut BytesMut) -> u32 {
    if let Some((_, opened)) = w.output.boundary_at(range.start) {
        open(w, opened, buf);
    }
    let last = range.end;
    head(w, buf);
    if w.api == Api::Completions {
        buf.extend_from_slice(br#""choices":[{"index":0,"text":""#);
        w.write_text(range, Tags::Plain, buf);
        buf.extend_from_slice(br#"","logprobs":null,"finish_reason":null,"stop_reason":null}]"#);
    } else {
        buf.extend_from_slice(br#""choices":[{"index":0,"delta":{"#);
        match w.output.segment(range.start) {
            Segment::Thinking => {
                let fields: &[&str] = match w.reasoning_field {
                    ReasoningField::ReasoningContent => &["reasoning_content"],
                    ReasoningField::Reasoning => &["reasoning"],
                    ReasoningField::Both => &["reasoning", "reasoning_content"],
                };
                for (i, field) in fields.iter().enumerate() {
                    if i > 0 {
                        buf.extend_from_slice(b",");
                    }
                    let _ = write!(buf, r#""{field}":""#);
                    w.write_text(range.clone(), Tags::Plain, buf);
                    buf.extend_from_slice(b"\"");
                }
            }
            Segment::Text => {
                buf.extend_from_slice(br#""content":""#);
                w.write_text(range, Tags::Plain, buf);
                buf.extend_from_slice(b"\"");
            }
            Segment::ToolCall(k) => {
                let _ = write!(
                    buf,
                    r#""tool_calls":[{{"index":{k},"function":{{"arguments":""#
                );
                w.write_arguments(range, true, buf);
                buf.extend_from_slice(br#""}}]"#);
            }
        }
        buf.extend_from_slice(br#"},"logprobs":null,"finish_reason":null}]"#);
    }
    if w.continuous_usage {
        buf.extend_from_slice(b",");
        usage_object(w, last, false, buf);
    }
    buf.extend_from_slice(b"}");
    end(buf);
    1
}

/// The finish chunk, the usage chunk (when sent) and `[DONE]`.
pub(super) fn trailer_len(w: &Wire) -> usize {
    2 + usize::from(w.usage)
}

pub(super) fn write_trailer(w: &mut Wire, i: usize, buf: &mut BytesMut) {
    match (i, w.usage) {
        (0, _) => {
            head(w, buf);
            let choice = if w.api == Api::Chat {
                r#""choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"#
            } else {
                r#""choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"#
            };
            buf.extend_from_slice(choice.as_bytes());
            let _ = write!(buf, r#""{}","stop_reason":null}}]}}"#, reason(w.finish));
            end(buf);
        }
        (1, true) => {
            head(w, buf);
            buf.extend_from_slice(br#""choices":[],"#);
            usage_object(w, w.output.total(), true, buf);
            buf.extend_from_slice(b"}");
            end(buf);
        }
        _ => buf.extend_from_slice(b"data: [DONE]\n\n"),
    }
}

/// The `finish_reason` of `finish`.
fn reason(finish: Finish) -> &'static str {
    match finish {
        Finish::Stop => "stop",
        Finish::Length => "length",
        Finish::ToolCalls => "tool_calls",
    }
}

/// `data: {"id":…,"object":…,"created":…,"model":…,` of a chunk.
fn head(w: &Wire, buf: &mut BytesMut) {
    begin(buf, None);
    let (prefix, object) = match w.api {
        Api::Completions => ("cmpl", "text_completion"),
        _ => ("chatcmpl", "chat.completion.chunk"),
    };
    let _ = write!(
        buf,
        r#"{{"id":"{prefix}-sim-{}","object":"{object}","created":{},"model":{},"#,
        w.seq, w.created, w.model_json
    );
}

/// `"usage":{…}` with `completion_tokens` output tokens; the final one adds the reasoning tokens
/// a reasoning parser counted, when there are any (as vLLM does).
fn usage_object(w: &Wire, completion_tokens: u64, last: bool, buf: &mut BytesMut) {
    let _ = write!(
        buf,
        r#""usage":{{"prompt_tokens":{},"total_tokens":{},"completion_tokens":{}"#,
        w.prompt_tokens,
        w.prompt_tokens + completion_tokens,
        completion_tokens
    );
    let reasoning = w.reported_reasoning_tokens();
    if last && reasoning > 0 {
        let _ = write!(
            buf,
            r#","completion_tokens_details":{{"reasoning_tokens":{reasoning}}}"#
        );
    }
    buf.extend_from_slice(b"}");
}

/// The non-streamed answer.
pub(super) fn whole(w: &Wire, model: &str) -> serde_json::Value {
    let (prompt, output) = (w.prompt_tokens, w.output.total());
    let mut usage = json!({
        "prompt_tokens": prompt,
        "total_tokens": prompt + output,
        "completion_tokens": output,
    });
    if w.reported_reasoning_tokens() > 0 {
        usage["completion_tokens_details"] =
            json!({"reasoning_tokens": w.reported_reasoning_tokens()});
    }
    let text = w.answer_text();
    if w.api == Api::Completions {
        return json!({
            "id": w.id(),
            "object": "text_completion",
            "created": w.created,
            "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": reason(w.finish)}],
            "usage": usage,
        });
    }
    let mut message = json!({"role": "assistant", "content": text});
    if let Some(reasoning) = w.reasoning_text() {
        match w.reasoning_field {
            ReasoningField::ReasoningContent => message["reasoning_content"] = json!(reasoning),
            ReasoningField::Reasoning => message["reasoning"] = json!(reasoning),
            ReasoningField::Both => {
                message["reasoning_content"] = json!(reasoning);
                message["reasoning"] = json!(reasoning);
            }
        }
    }
    if w.output.tool_calls > 0 {
        let calls: Vec<serde_json::Value> = (0..w.output.tool_calls)
            .map(|k| {
                json!({
                    "id": w.call_id("chatcmpl-tool-sim-", k).to_string(),
                    "type": "function",
                    "function": {"name": TOOL_NAME, "arguments": w.arguments_of(k)},
                })
            })
            .collect();
        message["tool_calls"] = json!(calls);
    }
    json!({
        "id": w.id(),
        "object": "chat.completion",
        "created": w.created,
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": reason(w.finish)}],
        "usage": usage,
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;
    use crate::sim::config::ThinkTags;
    use crate::sim::phases::{Output, Phase};

    #[test]
    fn chat_stream_is_vllm_shaped() {
        let mut w = wire(Api::Chat, Output::answer(4));
        let events = write_all(&mut w).events;
        assert_eq!(events.len(), 6);
        assert_eq!(events[0].1["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(events[0].1["object"], "chat.completion.chunk");
        let content = events[2].1["choices"][0]["delta"]["content"]
            .as_str()
            .unwrap();
        assert_eq!(content.split_whitespace().count(), 3);
        assert_eq!(events[3].1["choices"][0]["finish_reason"], "length");
        assert_eq!(events[4].1["usage"]["completion_tokens"], 4);
        assert_eq!(events[4].1["usage"]["total_tokens"], 9);
        assert!(events[4].1["usage"]
            .get("completion_tokens_details")
            .is_none());
        assert_eq!(events[5].1, serde_json::Value::Null);
    }

    #[test]
    fn chat_reasons_answers_and_calls_tools_in_that_order() {
        let mut w = wire(Api::Chat, agent(5, 4, 2, 3, ThinkTags::Parser));
        w.finish = Finish::ToolCalls;
        let written = write_all(&mut w);
        // Reasoning 5 steps, answer 1 + one of 3 tokens, two calls of 3 argument deltas.
        assert_eq!(
            phase_runs(&written, Api::Chat),
            [
                (Phase::Reasoning, 5),
                (Phase::Content, 2),
                (Phase::ToolCall, 6)
            ]
        );
        let reasoning = joined(
            &written,
            Api::Chat,
            Phase::Reasoning,
            "/choices/0/delta/reasoning_content",
        );
        assert_eq!(reasoning, w.text_of(0..5));
        let events = &written.events;
        let openers: Vec<&serde_json::Value> = events
            .iter()
            .filter_map(|(_, v)| v.pointer("/choices/0/delta/tool_calls/0"))
            .filter(|call| call.get("id").is_some())
            .collect();
        assert_eq!(openers.len(), 2);
        assert_eq!(openers[1]["index"], 1);
        assert_eq!(openers[1]["type"], "function");
        assert_eq!(openers[1]["function"]["name"], TOOL_NAME);
        assert!(openers[1]["function"].get("arguments").is_none());
        for k in 0..2u64 {
            let args: String = events
                .iter()
                .filter_map(|(_, v)| v.pointer("/choices/0/delta/tool_calls/0"))
                .filter(|call| call["index"] == k && call.get("id").is_none())
                .filter_map(|call| call["function"]["arguments"].as_str())
                .collect();
            assert_eq!(args, w.arguments_of(k));
        }
        let finish = events.iter().find_map(|(_, v)| {
            v.pointer("/choices/0/finish_reason")
                .filter(|f| !f.is_null())
        });
        assert_eq!(finish.unwrap(), "tool_calls");
        let usage = events.iter().find_map(|(_, v)| v.get("usage")).unwrap();
        assert_eq!(usage["completion_tokens"], 5 + 4 + 6);
        assert_eq!(usage["completion_tokens_details"]["reasoning_tokens"], 5);
    }

    #[test]
    fn the_reasoning_field_is_chosen() {
        for (field, keys) in [
            (ReasoningField::Reasoning, vec!["reasoning"]),
            (ReasoningField::Both, vec!["reasoning", "reasoning_content"]),
        ] {
            let mut w = wire(Api::Chat, agent(2, 1, 0, 1, ThinkTags::Parser));
            w.reasoning_field = field;
            let written = write_all(&mut w);
            let delta = &written.events[1].1["choices"][0]["delta"];
            let mut present: Vec<&str> = delta
                .as_object()
                .unwrap()
                .keys()
                .map(String::as_str)
                .collect();
            present.sort_unstable();
            assert_eq!(present, keys);
            assert_eq!(
                carries(Api::Chat, &written.events[1].1),
                Some(Carries::Reasoning)
            );
        }
    }

    #[test]
    fn without_a_parser_the_thinking_is_content_between_tags() {
        let mut w = wire(Api::Chat, agent(4, 3, 0, 1, ThinkTags::Inline));
        let written = write_all(&mut w);
        let contents: Vec<&str> = written
            .events
            .iter()
            .filter_map(|(_, v)| {
                v.pointer("/choices/0/delta/content")
                    .and_then(|c| c.as_str())
            })
            .filter(|c| !c.is_empty())
            .collect();
        assert_eq!(contents.len(), 4 + 2);
        assert_eq!(contents[0], "<think>");
        assert_eq!(contents[3], "</think>");
        assert!(contents[4].starts_with(" tok"));
        let usage = written
            .events
            .iter()
            .find_map(|(_, v)| v.get("usage"))
            .unwrap();
        assert!(
            usage.get("completion_tokens_details").is_none(),
            "no parser, no count"
        );
        let mut open = wire(Api::Chat, agent(3, 1, 0, 1, ThinkTags::OpenInPrompt));
        let all: String = write_all(&mut open)
            .events
            .iter()
            .filter_map(|(_, v)| {
                v.pointer("/choices/0/delta/content")
                    .and_then(|c| c.as_str())
            })
            .collect();
        assert!(
            !all.contains("<think>") && all.contains("</think> tok"),
            "{all}"
        );
    }

    #[test]
    fn completions_use_text_and_inline_thinking() {
        let mut w = Wire {
            continuous_usage: true,
            usage: false,
            ..wire(Api::Completions, agent(2, 4, 0, 1, ThinkTags::Parser))
        };
        let events = write_all(&mut w).events;
        assert_eq!(events.len(), 2 + 2 + 2);
        assert_eq!(events[0].1["object"], "text_completion");
        assert_eq!(events[0].1["choices"][0]["text"], "<think>");
        assert_eq!(events[1].1["choices"][0]["text"], "</think>");
        assert!(events[2].1["choices"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with(" tok"));
        assert_eq!(events[3].1["usage"]["completion_tokens"], 6);
    }

    #[test]
    fn the_whole_answer_has_every_part() {
        let mut w = wire(Api::Chat, agent(3, 2, 1, 2, ThinkTags::Parser));
        w.finish = Finish::ToolCalls;
        let body = w.whole_body("m");
        let message = &body["choices"][0]["message"];
        assert_eq!(message["reasoning_content"], w.text_of(0..3));
        assert_eq!(message["content"], w.text_of(3..5));
        assert_eq!(
            message["tool_calls"][0]["function"]["arguments"],
            w.arguments_of(0)
        );
        assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(body["usage"]["completion_tokens"], 7);
        assert_eq!(
            body["usage"]["completion_tokens_details"]["reasoning_tokens"],
            3
        );
    }
}
