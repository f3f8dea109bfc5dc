//! The OpenAI Responses API's streaming events (the API reference's "Streaming events").
//!
//! Every event names itself twice (the SSE `event:` line and `type`) and carries the stream's
//! running `sequence_number`. `response.created` and `response.in_progress` come first; then one
//! output item per segment, each opened by `response.output_item.added` and closed by
//! `response.output_item.done`: a `reasoning` item (a summary part with
//! `response.reasoning_summary_text.delta`s, or a `reasoning_text` content part with
//! `response.reasoning_text.delta`s), a `message` item (an `output_text` part with
//! `response.output_text.delta`s) and a `function_call` item per tool call
//! (`response.function_call_arguments.delta`s). Each `.done` event repeats its whole text, and
//! `response.completed` (or `response.incomplete` at the token limit) the whole output with
//! `usage.output_tokens_details.reasoning_tokens`.

use std::fmt::Write as _;
use std::ops::Range;

use bytes::BytesMut;

use super::{begin, end, Finish, SegmentEvents, Tags, Wire, TOOL_NAME};
use crate::sim::config::ResponsesReasoning;
use crate::sim::phases::Segment;

/// `response.created`, `response.in_progress` and the first item's opening events.
pub(super) fn preamble_len(w: &Wire) -> usize {
    2 + opens(w.output.first_segment())
}

pub(super) fn write_preamble(w: &mut Wire, i: usize, buf: &mut BytesMut) {
    match i {
        0 | 1 => {
            let kind = if i == 0 {
                "response.created"
            } else {
                "response.in_progress"
            };
            event(w, kind, buf);
            buf.extend_from_slice(br#","response":"#);
            response(w, "in_progress", false, buf);
            buf.extend_from_slice(b"}");
            end(buf);
        }
        _ => open(w, w.output.first_segment(), i - 2, buf),
    }
}

/// Events that open `segment`'s item: the item, and for text its content part.
fn opens(segment: Segment) -> usize {
    match segment {
        Segment::Thinking | Segment::Text => 2,
        Segment::ToolCall(_) => 1,
    }
}

/// Events that close `segment`'s item: the text's `.done` and its part's, then the item's.
fn closes(segment: Segment) -> usize {
    match segment {
        Segment::Thinking | Segment::Text => 3,
        Segment::ToolCall(_) => 2,
    }
}

/// Starts event `kind`: its SSE lines and `{"type":…,"sequence_number":…` (left open).
fn event(w: &mut Wire, kind: &str, buf: &mut BytesMut) {
    begin(buf, Some(kind));
    let _ = write!(buf, r#"{{"type":"{kind}","sequence_number":{}"#, w.written);
    w.written += 1;
}

/// `,"item_id":…,"output_index":…` of the events about `segment`'s item.
fn item_ref(w: &Wire, segment: Segment, buf: &mut BytesMut) {
    buf.extend_from_slice(br#","item_id":""#);
    item_id(w, segment, buf);
    let _ = write!(buf, r#"","output_index":{}"#, w.output.position(segment));
}

fn item_id(w: &Wire, segment: Segment, buf: &mut BytesMut) {
    let _ = match segment {
        Segment::Thinking => write!(buf, "rs_sim_{}", w.seq),
        Segment::Text => write!(buf, "msg_sim_{}", w.seq),
        Segment::ToolCall(k) => write!(buf, "fc_sim_{}_{k}", w.seq),
    };
}

/// Opening event `j` of `segment`'s item.
fn open(w: &mut Wire, segment: Segment, j: usize, buf: &mut BytesMut) {
    let summary = w.responses_reasoning == ResponsesReasoning::Summary;
    match (segment, j) {
        (_, 0) => item_event(w, "response.output_item.added", segment, false, buf),
        (Segment::Thinking, _) if summary => {
            event(w, "response.reasoning_summary_part.added", buf);
            item_ref(w, segment, buf);
            buf.extend_from_slice(
                br#","summary_index":0,"part":{"type":"summary_text","text":""}"#,
            );
        }
        (Segment::Thinking, _) => {
            event(w, "response.content_part.added", buf);
            item_ref(w, segment, buf);
            buf.extend_from_slice(
                br#","content_index":0,"part":{"type":"reasoning_text","text":""}"#,
            );
        }
        _ => {
            event(w, "response.content_part.added", buf);
            item_ref(w, segment, buf);
            buf.extend_from_slice(
                br#","content_index":0,"part":{"type":"output_text","annotations":[],"logprobs":[],"text":""}"#,
            );
        }
    }
    buf.extend_from_slice(b"}");
    end(buf);
}

/// Closing event `j` of `segment`'s item.
fn close(w: &mut Wire, segment: Segment, j: usize, buf: &mut BytesMut) {
    let summary = w.responses_reasoning == ResponsesReasoning::Summary;
    let range = w.output.range(segment);
    let last = closes(segment) - 1;
    match (segment, j) {
        (_, j) if j == last => item_event(w, "response.output_item.done", segment, true, buf),
        (Segment::ToolCall(_), _) => {
            event(w, "response.function_call_arguments.done", buf);
            item_ref(w, segment, buf);
            buf.extend_from_slice(br#","arguments":""#);
            w.write_arguments(range, true, buf);
            buf.extend_from_slice(b"\"");
        }
        (Segment::Thinking, 0) => {
            let kind = if summary {
                "response.reasoning_summary_text.done"
            } else {
                "response.reasoning_text.done"
            };
            event(w, kind, buf);
            item_ref(w, segment, buf);
            let index = if summary {
                "summary_index"
            } else {
                "content_index"
            };
            let _ = write!(buf, r#","{index}":0,"text":""#);
            w.write_text(range, Tags::Plain, buf);
            buf.extend_from_slice(b"\"");
        }
        (Segment::Thinking, _) => {
            let (kind, index, part) = if summary {
                (
                    "response.reasoning_summary_part.done",
                    "summary_index",
                    "summary_text",
                )
            } else {
                (
                    "response.content_part.done",
                    "content_index",
                    "reasoning_text",
                )
            };
            event(w, kind, buf);
            item_ref(w, segment, buf);
            let _ = write!(buf, r#","{index}":0,"part":{{"type":"{part}","text":""#);
            w.write_text(range, Tags::Plain, buf);
            buf.extend_from_slice(br#""}"#);
        }
        (_, 0) => {
            event(w, "response.output_text.done", buf);
            item_ref(w, segment, buf);
            buf.extend_from_slice(br#","content_index":0,"text":""#);
            w.write_text(range, Tags::Plain, buf);
            buf.extend_from_slice(br#"","logprobs":[]"#);
        }
        _ => {
            event(w, "response.content_part.done", buf);
            item_ref(w, segment, buf);
            buf.extend_from_slice(
                br#","content_index":0,"part":{"type":"output_text","annotations":[],"logprobs":[],"text":""#,
            );
            w.write_text(range, Tags::Plain, buf);
            buf.extend_from_slice(br#""}"#);
        }
    }
    buf.extend_from_slice(b"}");
    end(buf);
}

/// `response.output_item.added` or `.done` (left open): the item, empty or whole.
fn item_event(w: &mut Wire, kind: &str, segment: Segment, done: bool, buf: &mut BytesMut) {
    event(w, kind, buf);
    let _ = write!(
        buf,
        r#","output_index":{},"item":"#,
        w.output.position(segment)
    );
    item(w, segment, done, buf);
}

/// `segment`'s output item: as added (empty, in progress) or done (whole, completed).
fn item(w: &Wire, segment: Segment, done: bool, buf: &mut BytesMut) {
    let range = w.output.range(segment);
    buf.extend_from_slice(br#"{"id":""#);
    item_id(w, segment, buf);
    match segment {
        Segment::Thinking => {
            buf.extend_from_slice(br#"","type":"reasoning","summary":["#);
            let summary = w.responses_reasoning == ResponsesReasoning::Summary;
            if done && summary {
                buf.extend_from_slice(br#"{"type":"summary_text","text":""#);
                w.write_text(range.clone(), Tags::Plain, buf);
                buf.extend_from_slice(br#""}"#);
            }
            buf.extend_from_slice(b"]");
            if done && !summary {
                buf.extend_from_slice(br#","content":[{"type":"reasoning_text","text":""#);
                w.write_text(range, Tags::Plain, buf);
                buf.extend_from_slice(br#""}]"#);
            }
        }
        Segment::Text => {
            let status = if done { "completed" } else { "in_progress" };
            let _ = write!(buf, r#"","type":"message","status":"{status}","content":["#);
            if done {
                buf.extend_from_slice(
                    br#"{"type":"output_text","annotations":[],"logprobs":[],"text":""#,
                );
                w.write_text(range, Tags::Plain, buf);
                buf.extend_from_slice(br#""}"#);
            }
            buf.extend_from_slice(br#"],"role":"assistant""#);
        }
        Segment::ToolCall(k) => {
            let status = if done { "completed" } else { "in_progress" };
            let _ = write!(
                buf,
                r#"","type":"function_call","status":"{status}","arguments":""#
            );
            if done {
                w.write_arguments(range, true, buf);
            }
            let _ = write!(
                buf,
                r#"","call_id":"{}","name":"{TOOL_NAME}""#,
                w.call_id("call_sim_", k)
            );
        }
    }
    buf.extend_from_slice(b"}");
}

/// The response object: in progress (no output yet), or finished with the whole output and usage.
fn response(w: &Wire, status: &str, finished: bool, buf: &mut BytesMut) {
    let _ = write!(
        buf,
        r#"{{"id":"resp_sim_{}","object":"response","created_at":{},"status":"{status}","error":null,"incomplete_details":"#,
        w.seq, w.created
    );
    if finished && w.finish == Finish::Length {
        buf.extend_from_slice(br#"{"reason":"max_output_tokens"}"#);
    } else {
        buf.extend_from_slice(b"null");
    }
    let _ = write!(buf, r#","model":{},"output":["#, w.model_json);
    if finished {
        let thinking = w.output.has_thinking_segment().then_some(Segment::Thinking);
        let calls = (0..w.output.tool_calls).map(Segment::ToolCall);
        for (i, segment) in thinking
            .into_iter()
            .chain(std::iter::once(Segment::Text))
            .chain(calls)
            .enumerate()
        {
            if i > 0 {
                buf.extend_from_slice(b",");
            }
            item(w, segment, true, buf);
        }
    }
    buf.extend_from_slice(br#"],"usage":"#);
    if finished {
        let (input, output) = (w.prompt_tokens, w.output.total());
        let _ = write!(
            buf,
            r#"{{"input_tokens":{input},"input_tokens_details":{{"cached_tokens":0}},"output_tokens":{output},"output_tokens_details":{{"reasoning_tokens":{}}},"total_tokens":{}}}"#,
            w.reported_reasoning_tokens(),
            input + output
        );
    } else {
        buf.extend_from_slice(b"null");
    }
    buf.extend_from_slice(b"}");
}

/// The events around each output item.
const SEGMENTS: SegmentEvents = SegmentEvents {
    opens,
    closes,
    open,
    close,
};

pub(super) fn write_step(w: &mut Wire, range: Range<u64>, buf: &mut BytesMut) -> u32 {
    SEGMENTS.cross(w, range.start, buf);
    let segment = w.output.segment(range.start);
    let summary = w.responses_reasoning == ResponsesReasoning::Summary;
    let (kind, index) = match segment {
        Segment::Thinking if summary => ("response.reasoning_summary_text.delta", "summary_index"),
        Segment::Thinking => ("response.reasoning_text.delta", "content_index"),
        Segment::Text => ("response.output_text.delta", "content_index"),
        Segment::ToolCall(_) => ("response.function_call_arguments.delta", ""),
    };
    event(w, kind, buf);
    item_ref(w, segment, buf);
    if !index.is_empty() {
        let _ = write!(buf, r#","{index}":0"#);
    }
    buf.extend_from_slice(br#","delta":""#);
    if let Segment::ToolCall(_) = segment {
        w.write_arguments(range, true, buf);
    } else {
        w.write_text(range, Tags::Plain, buf);
    }
    buf.extend_from_slice(b"\"");
    if segment == Segment::Text {
        buf.extend_from_slice(br#","logprobs":[]"#);
    }
    buf.extend_from_slice(b"}");
    end(buf);
    1
}

/// The last item's closing events and `response.completed` (or `response.incomplete`).
pub(super) fn trailer_len(w: &Wire) -> usize {
    closes(w.output.last_segment()) + 1
}

pub(super) fn write_trailer(w: &mut Wire, i: usize, buf: &mut BytesMut) {
    let last = w.output.last_segment();
    if i < closes(last) {
        close(w, last, i, buf);
        return;
    }
    let (kind, status) = match w.finish {
        Finish::Length => ("response.incomplete", "incomplete"),
        Finish::Stop | Finish::ToolCalls => ("response.completed", "completed"),
    };
    event(w, kind, buf);
    buf.extend_from_slice(br#","response":"#);
    response(w, status, true, buf);
    buf.extend_from_slice(b"}");
    end(buf);
}

/// The non-streamed response object.
pub(super) fn whole(w: &Wire, _model: &str) -> serde_json::Value {
    let status = match w.finish {
        Finish::Length => "incomplete",
        Finish::Stop | Finish::ToolCalls => "completed",
    };
    let mut buf = BytesMut::new();
    response(w, status, true, &mut buf);
    serde_json::from_slice(&buf).unwrap_or(serde_json::Value::Null)
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::Api;
    use super::*;
    use crate::sim::config::ThinkTags;
    use crate::sim::phases::{Output, Phase};

    fn check_named_and_numbered(written: &Written) {
        for (i, (kind, value)) in written.events.iter().enumerate() {
            assert_eq!(value["type"], kind.as_str());
            assert_eq!(value["sequence_number"], i as u64, "{kind}");
        }
    }

    #[test]
    fn a_plain_answer_is_one_message_item() {
        let mut w = wire(Api::Responses, Output::answer(4));
        w.finish = Finish::Stop;
        let written = write_all(&mut w);
        check_named_and_numbered(&written);
        let kinds: Vec<&str> = written.events.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        let done = &written.events[9].1["response"];
        assert_eq!(done["status"], "completed");
        assert_eq!(done["output"][0]["content"][0]["text"], w.answer_text());
        assert_eq!(done["usage"]["output_tokens"], 4);
        assert_eq!(
            done["usage"]["output_tokens_details"]["reasoning_tokens"],
            0
        );
    }

    #[test]
    fn reasoning_summary_then_message_then_function_calls() {
        let mut w = wire(Api::Responses, agent(4, 3, 2, 3, ThinkTags::Parser));
        w.finish = Finish::ToolCalls;
        let written = write_all(&mut w);
        check_named_and_numbered(&written);
        assert_eq!(
            phase_runs(&written, Api::Responses),
            [
                (Phase::Reasoning, 4),
                (Phase::Content, 2),
                (Phase::ToolCall, 6)
            ]
        );
        let added = opened(
            &written,
            "response.output_item.added",
            "output_index",
            "/item/type",
        );
        assert_eq!(
            added,
            [
                (0, "reasoning"),
                (1, "message"),
                (2, "function_call"),
                (3, "function_call")
            ]
        );
        let summary = joined(&written, Api::Responses, Phase::Reasoning, "/delta");
        assert_eq!(summary, w.text_of(0..4));
        let done = written
            .events
            .iter()
            .find(|(k, _)| k == "response.reasoning_summary_text.done")
            .unwrap();
        assert_eq!(done.1["text"], summary);
        for k in 0..2u64 {
            let args: String = written
                .events
                .iter()
                .filter(|(k2, v)| {
                    k2 == "response.function_call_arguments.delta" && v["output_index"] == 2 + k
                })
                .map(|(_, v)| v["delta"].as_str().unwrap())
                .collect();
            assert_eq!(args, w.arguments_of(k));
        }
        let (kind, last) = written.events.last().unwrap();
        assert_eq!(kind, "response.completed");
        let response = &last["response"];
        assert_eq!(response["output"].as_array().unwrap().len(), 4);
        assert_eq!(response["output"][0]["summary"][0]["text"], summary);
        assert_eq!(response["output"][3]["arguments"], w.arguments_of(1));
        assert_eq!(response["usage"]["output_tokens"], 4 + 3 + 6);
        assert_eq!(
            response["usage"]["output_tokens_details"]["reasoning_tokens"],
            4
        );
        assert_eq!(w.whole_body("m")["output"][2]["name"], TOOL_NAME);
    }

    #[test]
    fn reasoning_text_is_a_content_part_of_the_reasoning_item() {
        let mut w = wire(Api::Responses, agent(3, 2, 0, 1, ThinkTags::Parser));
        w.responses_reasoning = ResponsesReasoning::Text;
        let written = write_all(&mut w);
        check_named_and_numbered(&written);
        let deltas = written
            .events
            .iter()
            .filter(|(k, _)| k == "response.reasoning_text.delta")
            .count();
        assert_eq!(deltas, 3);
        assert!(written.events.iter().all(|(k, _)| !k.contains("summary")));
        let (kind, last) = written.events.last().unwrap();
        assert_eq!(kind, "response.incomplete", "the token limit was reached");
        assert_eq!(
            last["response"]["incomplete_details"]["reason"],
            "max_output_tokens"
        );
        assert_eq!(
            last["response"]["output"][0]["content"][0]["text"],
            w.text_of(0..3)
        );
    }

    #[test]
    fn inline_thinking_is_output_text() {
        let mut w = wire(Api::Responses, agent(3, 2, 0, 1, ThinkTags::OpenInPrompt));
        let written = write_all(&mut w);
        let texts: Vec<&str> = written
            .events
            .iter()
            .filter(|(k, _)| k == "response.output_text.delta")
            .map(|(_, v)| v["delta"].as_str().unwrap())
            .collect();
        assert_eq!(texts.len(), 3 + 2);
        assert_eq!(texts[2], "</think>");
        let usage = &written.events.last().unwrap().1["response"]["usage"];
        assert_eq!(usage["output_tokens_details"]["reasoning_tokens"], 0);
    }
}
