//! Gemini's `models/{model}:streamGenerateContent?alt=sse` (the API reference's
//! `GenerateContentResponse` and the "Thinking" guide), with the API's own spelling: `": "`
//! after each key and CRLF line ends.
//!
//! One chunk per decode step: a part `{"text": …, "thought": true}` while the model thinks
//! (thought summaries, `includeThoughts`), text parts for the answer, and per tool call one
//! `functionCall` part with the whole call once its arguments are complete (Gemini sends a call
//! whole, so the steps inside a call write nothing). Every chunk's `usageMetadata` has the running
//! `candidatesTokenCount` (answer and calls) and `thoughtsTokenCount` (thinking, apart); a last
//! chunk with an empty text part carries the `finishReason`.

use std::fmt::Write as _;
use std::ops::Range;

use bytes::BytesMut;
use serde_json::json;

use super::{Finish, Tags, Wire, TOOL_NAME};
use crate::sim::phases::Segment;

/// Starts a chunk: `data: {"candidates": [{"content": {"parts": [`.
fn begin(buf: &mut BytesMut) {
    buf.extend_from_slice(br#"data: {"candidates": [{"content": {"parts": ["#);
}

/// Ends a chunk after its parts: the candidate's rest, the usage after token `upto`, the model.
fn end(w: &Wire, finish: Option<Finish>, upto: u64, buf: &mut BytesMut) {
    buf.extend_from_slice(br#"],"role": "model"},"#);
    if let Some(finish) = finish {
        let _ = write!(buf, r#""finishReason": "{}","#, finish_reason(finish));
    }
    buf.extend_from_slice(br#""index": 0}],"usageMetadata": "#);
    usage(w, upto, buf);
    let _ = write!(
        buf,
        r#","modelVersion": {},"responseId": "sim-{}"}}"#,
        w.model_json, w.seq
    );
    buf.extend_from_slice(b"\r\n\r\n");
}

/// `usageMetadata` once tokens `0..upto` are out: thinking apart from the rest.
fn usage(w: &Wire, upto: u64, buf: &mut BytesMut) {
    let (thoughts, candidates) = split(w, upto);
    let _ = write!(buf, r#"{{"promptTokenCount": {}"#, w.prompt_tokens);
    if candidates > 0 {
        let _ = write!(buf, r#","candidatesTokenCount": {candidates}"#);
    }
    let _ = write!(buf, r#","totalTokenCount": {}"#, w.prompt_tokens + upto);
    if thoughts > 0 {
        let _ = write!(buf, r#","thoughtsTokenCount": {thoughts}"#);
    }
    buf.extend_from_slice(b"}");
}

/// Of tokens `0..upto`, the thoughts (reasoning with a part of its own) and the candidates.
fn split(w: &Wire, upto: u64) -> (u64, u64) {
    let thoughts = if w.output.has_thinking_segment() {
        upto.min(w.output.reasoning)
    } else {
        0
    };
    (thoughts, upto - thoughts)
}

fn finish_reason(finish: Finish) -> &'static str {
    match finish {
        Finish::Length => "MAX_TOKENS",
        Finish::Stop | Finish::ToolCalls => "STOP",
    }
}

pub(super) fn write_step(w: &mut Wire, range: Range<u64>, buf: &mut BytesMut) -> u32 {
    let segment = w.output.segment(range.start);
    let upto = range.end;
    match segment {
        Segment::ToolCall(_) => {
            let call = w.output.range(segment);
            if range.end != call.end {
                return 0;
            }
            begin(buf);
            let _ = write!(buf, r#"{{"functionCall": {{"name": "{TOOL_NAME}","args": "#);
            w.write_arguments(call, false, buf);
            buf.extend_from_slice(b"}}");
        }
        Segment::Thinking => {
            begin(buf);
            buf.extend_from_slice(br#"{"text": ""#);
            w.write_text(range, Tags::Plain, buf);
            buf.extend_from_slice(br#"","thought": true}"#);
        }
        Segment::Text => {
            begin(buf);
            buf.extend_from_slice(br#"{"text": ""#);
            w.write_text(range, Tags::Plain, buf);
            buf.extend_from_slice(br#""}"#);
        }
    }
    end(w, None, upto, buf);
    1
}

/// The last chunk: an empty text part, the finish reason and the final usage.
pub(super) fn write_trailer(w: &mut Wire, buf: &mut BytesMut) {
    begin(buf);
    buf.extend_from_slice(br#"{"text": ""}"#);
    end(w, Some(w.finish), w.output.total(), buf);
}

/// The non-streamed answer of `:generateContent`.
pub(super) fn whole(w: &Wire, model: &str) -> serde_json::Value {
    let mut parts = Vec::new();
    if let Some(thinking) = w.reasoning_text() {
        parts.push(json!({"text": thinking, "thought": true}));
    }
    parts.push(json!({"text": w.answer_text()}));
    for k in 0..w.output.tool_calls {
        let args: serde_json::Value =
            serde_json::from_str(&w.arguments_of(k)).unwrap_or(serde_json::Value::Null);
        parts.push(json!({"functionCall": {"name": TOOL_NAME, "args": args}}));
    }
    let total = w.output.total();
    let (thoughts, candidates) = split(w, total);
    let mut usage = json!({
        "promptTokenCount": w.prompt_tokens,
        "candidatesTokenCount": candidates,
        "totalTokenCount": w.prompt_tokens + total,
    });
    if thoughts > 0 {
        usage["thoughtsTokenCount"] = json!(thoughts);
    }
    json!({
        "candidates": [{
            "content": {"parts": parts, "role": "model"},
            "finishReason": finish_reason(w.finish),
            "index": 0,
        }],
        "usageMetadata": usage,
        "modelVersion": model,
        "responseId": w.id(),
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::Api;
    use super::*;
    use crate::sim::config::ThinkTags;
    use crate::sim::phases::{Output, Phase};

    #[test]
    fn thoughts_then_text_then_whole_function_calls() {
        let mut w = wire(Api::Gemini, agent(3, 4, 2, 2, ThinkTags::Parser));
        w.finish = Finish::ToolCalls;
        let written = write_all(&mut w);
        assert_eq!(
            phase_runs(&written, Api::Gemini),
            [
                (Phase::Reasoning, 3),
                (Phase::Content, 2),
                (Phase::ToolCall, 2)
            ]
        );
        assert_eq!(
            &written.step_events[written.step_events.len() - 4..],
            [0, 1, 0, 1]
        );
        let text = String::from_utf8(written.bytes.clone()).unwrap();
        assert_eq!(
            text.matches("\r\n\r\n").count(),
            written.events.len(),
            "CRLF line ends"
        );
        assert!(text.starts_with(r#"data: {"candidates": [{"content": {"parts": [{"text": ""#));
        // Thoughts are counted apart; candidates count the answer and the calls.
        let usages: Vec<(u64, u64)> = written
            .events
            .iter()
            .map(|(_, v)| {
                let u = &v["usageMetadata"];
                (
                    u["thoughtsTokenCount"].as_u64().unwrap_or(0),
                    u["candidatesTokenCount"].as_u64().unwrap_or(0),
                )
            })
            .collect();
        assert_eq!(usages[0], (1, 0));
        assert_eq!(usages[2], (3, 0));
        assert_eq!(usages[3], (3, 1));
        let last = &written.events.last().unwrap().1;
        assert_eq!(usages.last().unwrap(), &(3, 4 + 4));
        assert_eq!(last["usageMetadata"]["totalTokenCount"], 5 + 3 + 4 + 4);
        assert_eq!(last["candidates"][0]["finishReason"], "STOP");
        assert_eq!(carries(Api::Gemini, last), None);
        let call = written
            .events
            .iter()
            .filter_map(|(_, v)| v.pointer("/candidates/0/content/parts/0/functionCall"))
            .nth(1)
            .unwrap();
        let expected: serde_json::Value = serde_json::from_str(&w.arguments_of(1)).unwrap();
        assert_eq!(call["args"], expected);
        assert_eq!(
            joined(
                &written,
                Api::Gemini,
                Phase::Reasoning,
                "/candidates/0/content/parts/0/text"
            ),
            w.text_of(0..3)
        );
        assert_eq!(w.whole_body("m")["usageMetadata"]["thoughtsTokenCount"], 3);
    }

    #[test]
    fn a_plain_answer_has_no_thoughts() {
        let mut w = wire(Api::Gemini, Output::answer(3));
        let written = write_all(&mut w);
        assert_eq!(written.events.len(), 2 + 1);
        let first = &written.events[0].1;
        assert!(first["usageMetadata"].get("thoughtsTokenCount").is_none());
        assert_eq!(first["usageMetadata"]["candidatesTokenCount"], 1);
        assert_eq!(
            written.events[2].1["candidates"][0]["finishReason"],
            "MAX_TOKENS"
        );
        let mut inline = wire(Api::Gemini, agent(2, 1, 0, 1, ThinkTags::Inline));
        let events = write_all(&mut inline).events;
        assert_eq!(
            events[0].1["candidates"][0]["content"]["parts"][0]["text"],
            "<think>"
        );
        assert!(events[0].1["candidates"][0]["content"]["parts"][0]
            .get("thought")
            .is_none());
    }
}
