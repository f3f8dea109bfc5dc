//! Anthropic Messages events (the "Streaming Messages" and "Extended thinking" documents).
//!
//! `message_start`, then per content block `content_block_start`, `content_block_delta`s and
//! `content_block_stop`: a `thinking` block of `thinking_delta`s closed by a `signature_delta`, a
//! `text` block of `text_delta`s, and per tool call a `tool_use` block whose `input_json_delta`s
//! start with an empty one; a `ping` after the first block opens; then `message_delta` with the
//! `stop_reason` (`tool_use` after tool calls) and the cumulative `output_tokens`, and
//! `message_stop`.

use std::fmt::Write as _;
use std::ops::Range;

use bytes::BytesMut;
use serde_json::json;

use super::{begin, end, Finish, SegmentEvents, Tags, Wire, TOOL_NAME};
use crate::sim::phases::Segment;

/// `message_start`, the first block's opening events and a `ping`.
pub(super) fn preamble_len(w: &Wire) -> usize {
    2 + opens(w.output.first_segment())
}

pub(super) fn write_preamble(w: &mut Wire, i: usize, buf: &mut BytesMut) {
    let first = w.output.first_segment();
    if i == 0 {
        begin(buf, Some("message_start"));
        let _ = write!(
            buf,
            r#"{{"type":"message_start","message":{{"id":"msg_sim_{}","type":"message","role":"assistant","model":{},"content":[],"stop_reason":null,"stop_sequence":null,"usage":{{"input_tokens":{},"output_tokens":1}}}}}}"#,
            w.seq, w.model_json, w.prompt_tokens
        );
        end(buf);
    } else if i <= opens(first) {
        open(w, first, i - 1, buf);
    } else {
        begin(buf, Some("ping"));
        buf.extend_from_slice(br#"{"type":"ping"}"#);
        end(buf);
    }
}

/// Events that open `segment`'s block: its start, and for a tool call the empty first
/// `input_json_delta`.
fn opens(segment: Segment) -> usize {
    match segment {
        Segment::ToolCall(_) => 2,
        Segment::Thinking | Segment::Text => 1,
    }
}

/// Events that close `segment`'s block: its stop, after the signature of a thinking block.
fn closes(segment: Segment) -> usize {
    match segment {
        Segment::Thinking => 2,
        Segment::Text | Segment::ToolCall(_) => 1,
    }
}

/// Opening event `j` of `segment`'s block.
fn open(w: &mut Wire, segment: Segment, j: usize, buf: &mut BytesMut) {
    let index = w.output.position(segment);
    match (segment, j) {
        (Segment::ToolCall(_), 1) => {
            begin(buf, Some("content_block_delta"));
            let _ = write!(
                buf,
                r#"{{"type":"content_block_delta","index":{index},"delta":{{"type":"input_json_delta","partial_json":""}}}}"#
            );
        }
        _ => {
            begin(buf, Some("content_block_start"));
            let _ = write!(
                buf,
                r#"{{"type":"content_block_start","index":{index},"content_block":"#
            );
            match segment {
                Segment::Thinking => {
                    buf.extend_from_slice(br#"{"type":"thinking","thinking":"","signature":""}"#);
                }
                Segment::Text => buf.extend_from_slice(br#"{"type":"text","text":""}"#),
                Segment::ToolCall(k) => {
                    let _ = write!(
                        buf,
                        r#"{{"type":"tool_use","id":"{}","name":"{TOOL_NAME}","input":{{}}}}"#,
                        w.call_id("toolu_sim_", k)
                    );
                }
            }
            buf.extend_from_slice(b"}");
        }
    }
    end(buf);
}

/// Closing event `j` of `segment`'s block.
fn close(w: &mut Wire, segment: Segment, j: usize, buf: &mut BytesMut) {
    let index = w.output.position(segment);
    if segment == Segment::Thinking && j == 0 {
        begin(buf, Some("content_block_delta"));
        let _ = write!(
            buf,
            r#"{{"type":"content_block_delta","index":{index},"delta":{{"type":"signature_delta","signature":"{}"}}}}"#,
            signature(w)
        );
    } else {
        begin(buf, Some("content_block_stop"));
        let _ = write!(buf, r#"{{"type":"content_block_stop","index":{index}}}"#);
    }
    end(buf);
}

/// A stand-in for the signature that authenticates a thinking block (base64 in the real API).
struct Signature(u64);

impl std::fmt::Display for Signature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "U2ltU2lnbmF0dXJl{:016x}", self.0)
    }
}

fn signature(w: &Wire) -> Signature {
    Signature(w.word_seed)
}

/// The events around each content block.
const SEGMENTS: SegmentEvents = SegmentEvents {
    opens,
    closes,
    open,
    close,
};

pub(super) fn write_step(w: &mut Wire, range: Range<u64>, buf: &mut BytesMut) -> u32 {
    SEGMENTS.cross(w, range.start, buf);
    let segment = w.output.segment(range.start);
    begin(buf, Some("content_block_delta"));
    let _ = write!(
        buf,
        r#"{{"type":"content_block_delta","index":{},"delta":"#,
        w.output.position(segment)
    );
    match segment {
        Segment::Thinking => {
            buf.extend_from_slice(br#"{"type":"thinking_delta","thinking":""#);
            w.write_text(range, Tags::Plain, buf);
        }
        Segment::Text => {
            buf.extend_from_slice(br#"{"type":"text_delta","text":""#);
            w.write_text(range, Tags::Plain, buf);
        }
        Segment::ToolCall(_) => {
            buf.extend_from_slice(br#"{"type":"input_json_delta","partial_json":""#);
            w.write_arguments(range, true, buf);
        }
    }
    buf.extend_from_slice(br#""}}"#);
    end(buf);
    1
}

/// The last block's closing events, `message_delta` and `message_stop`.
pub(super) fn trailer_len(w: &Wire) -> usize {
    closes(w.output.last_segment()) + 2
}

pub(super) fn write_trailer(w: &mut Wire, i: usize, buf: &mut BytesMut) {
    let last = w.output.last_segment();
    let closing = closes(last);
    if i < closing {
        close(w, last, i, buf);
    } else if i == closing {
        begin(buf, Some("message_delta"));
        let _ = write!(
            buf,
            r#"{{"type":"message_delta","delta":{{"stop_reason":"{}","stop_sequence":null}},"usage":{{"output_tokens":{}}}}}"#,
            stop_reason(w.finish),
            w.output.total()
        );
        end(buf);
    } else {
        begin(buf, Some("message_stop"));
        buf.extend_from_slice(br#"{"type":"message_stop"}"#);
        end(buf);
    }
}

fn stop_reason(finish: Finish) -> &'static str {
    match finish {
        Finish::Stop => "end_turn",
        Finish::Length => "max_tokens",
        Finish::ToolCalls => "tool_use",
    }
}

/// The non-streamed message.
pub(super) fn whole(w: &Wire, model: &str) -> serde_json::Value {
    let mut content = Vec::new();
    if let Some(thinking) = w.reasoning_text() {
        content.push(json!({"type": "thinking", "thinking": thinking, "signature": signature(w).to_string()}));
    }
    content.push(json!({"type": "text", "text": w.answer_text()}));
    for k in 0..w.output.tool_calls {
        let input: serde_json::Value =
            serde_json::from_str(&w.arguments_of(k)).unwrap_or(serde_json::Value::Null);
        content.push(json!({
            "type": "tool_use",
            "id": w.call_id("toolu_sim_", k).to_string(),
            "name": TOOL_NAME,
            "input": input,
        }));
    }
    json!({
        "id": w.id(),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(w.finish),
        "stop_sequence": null,
        "usage": {"input_tokens": w.prompt_tokens, "output_tokens": w.output.total()},
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::Api;
    use super::*;
    use crate::sim::config::ThinkTags;
    use crate::sim::phases::{Output, Phase};

    fn kinds(written: &Written) -> Vec<&str> {
        written.events.iter().map(|(k, _)| k.as_str()).collect()
    }

    #[test]
    fn anthropic_events_are_named() {
        let mut w = wire(Api::Anthropic, Output::answer(4));
        let written = write_all(&mut w);
        assert_eq!(
            kinds(&written),
            [
                "message_start",
                "content_block_start",
                "ping",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        for (kind, value) in &written.events {
            assert_eq!(value["type"], kind.as_str());
        }
        assert_eq!(written.events[6].1["usage"]["output_tokens"], 4);
        assert_eq!(written.events[6].1["delta"]["stop_reason"], "max_tokens");
    }

    #[test]
    fn a_thinking_block_a_text_block_and_tool_use_blocks() {
        let mut w = wire(Api::Anthropic, agent(3, 4, 2, 2, ThinkTags::Parser));
        w.finish = Finish::ToolCalls;
        let written = write_all(&mut w);
        assert_eq!(
            phase_runs(&written, Api::Anthropic),
            [
                (Phase::Reasoning, 3),
                (Phase::Content, 2),
                (Phase::ToolCall, 4)
            ]
        );
        for (kind, value) in &written.events {
            assert_eq!(value["type"], kind.as_str());
        }
        let blocks = opened(
            &written,
            "content_block_start",
            "index",
            "/content_block/type",
        );
        assert_eq!(
            blocks,
            [
                (0, "thinking"),
                (1, "text"),
                (2, "tool_use"),
                (3, "tool_use")
            ]
        );
        let stops: Vec<u64> = written
            .events
            .iter()
            .filter(|(k, _)| k == "content_block_stop")
            .map(|(_, v)| v["index"].as_u64().unwrap())
            .collect();
        assert_eq!(stops, [0, 1, 2, 3]);
        // The signature closes the thinking block, right before its stop.
        let at = written
            .events
            .iter()
            .position(|(_, v)| v["delta"]["type"] == "signature_delta")
            .unwrap();
        assert_eq!(
            written.events[at + 1].1,
            json!({"type": "content_block_stop", "index": 0})
        );
        assert_eq!(carries(Api::Anthropic, &written.events[at].1), None);
        // Each tool call starts with an empty input_json_delta, then its arguments.
        let args: String = written
            .events
            .iter()
            .filter(|(_, v)| v["index"] == 3 && v["delta"]["type"] == "input_json_delta")
            .map(|(_, v)| v["delta"]["partial_json"].as_str().unwrap())
            .collect();
        assert_eq!(args, w.arguments_of(1));
        assert_eq!(
            joined(
                &written,
                Api::Anthropic,
                Phase::Reasoning,
                "/delta/thinking"
            ),
            w.text_of(0..3)
        );
        let tail = &written.events[written.events.len() - 2].1;
        assert_eq!(tail["delta"]["stop_reason"], "tool_use");
        assert_eq!(tail["usage"]["output_tokens"], 3 + 4 + 4);
        let body = w.whole_body("claude");
        assert_eq!(body["content"][0]["type"], "thinking");
        assert_eq!(
            body["content"][2]["input"]["query"]
                .as_str()
                .unwrap()
                .split(' ')
                .count(),
            2
        );
    }

    #[test]
    fn without_thinking_blocks_the_thinking_is_text_between_tags() {
        let mut w = wire(Api::Anthropic, agent(3, 2, 0, 1, ThinkTags::Inline));
        let written = write_all(&mut w);
        let texts: Vec<&str> = written
            .events
            .iter()
            .filter_map(|(_, v)| v.pointer("/delta/text").and_then(|t| t.as_str()))
            .collect();
        assert_eq!(texts.len(), 3 + 2);
        assert_eq!((texts[0], texts[2]), ("<think>", "</think>"));
        assert!(written
            .events
            .iter()
            .all(|(_, v)| v["content_block"]["type"] != "thinking"));
    }
}
