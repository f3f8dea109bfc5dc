//! Ollama's native `/api/chat`, streamed as NDJSON (`docs/api.md`, "Generate a chat completion",
//! and the "Thinking" capability).
//!
//! One line per decode step: `message.thinking` while the model thinks (a thinking model with
//! `think` on), `message.content` for the answer, and per tool call one line with the whole call
//! in `message.tool_calls` once its arguments are complete (Ollama parses a call before it sends
//! it, so the steps inside a call write nothing). The `done: true` line carries `done_reason` and
//! `eval_count`, the output tokens. Ollama's JSON is Go's `encoding/json`, which writes `<` and
//! `>` as `\u003c` and `\u003e`: so do the think tags here.

use std::fmt::Write as _;
use std::ops::Range;

use bytes::BytesMut;
use serde_json::json;

use super::{Finish, Tags, Wire, TOOL_NAME};
use crate::sim::phases::Segment;

/// `{"model":…,"created_at":"…","message":{"role":"assistant","content":"` of a line.
fn head(w: &Wire, buf: &mut BytesMut) {
    let _ = write!(buf, r#"{{"model":{},"created_at":""#, w.model_json);
    write_rfc3339(w.created, buf);
    buf.extend_from_slice(br#"","message":{"role":"assistant","content":""#);
}

pub(super) fn write_step(w: &mut Wire, range: Range<u64>, buf: &mut BytesMut) -> u32 {
    let segment = w.output.segment(range.start);
    match segment {
        Segment::ToolCall(k) => {
            let call = w.output.range(segment);
            if range.end != call.end {
                return 0;
            }
            head(w, buf);
            let _ = write!(
                buf,
                r#"","tool_calls":[{{"function":{{"name":"{TOOL_NAME}","arguments":"#
            );
            w.write_arguments(w.output.range(Segment::ToolCall(k)), false, buf);
            buf.extend_from_slice(br#"}}]},"done":false}"#);
        }
        Segment::Thinking => {
            head(w, buf);
            buf.extend_from_slice(br#"","thinking":""#);
            w.write_text(range, Tags::GoEscaped, buf);
            buf.extend_from_slice(br#""},"done":false}"#);
        }
        Segment::Text => {
            head(w, buf);
            w.write_text(range, Tags::GoEscaped, buf);
            buf.extend_from_slice(br#""},"done":false}"#);
        }
    }
    buf.extend_from_slice(b"\n");
    1
}

/// The `done: true` line.
pub(super) fn write_trailer(w: &mut Wire, buf: &mut BytesMut) {
    head(w, buf);
    let _ = write!(
        buf,
        r#""}},"done":true,"done_reason":"{}","total_duration":0,"load_duration":0,"prompt_eval_count":{},"prompt_eval_duration":0,"eval_count":{},"eval_duration":0}}"#,
        done_reason(w.finish),
        w.prompt_tokens,
        w.output.total()
    );
    buf.extend_from_slice(b"\n");
}

/// Ollama says `stop` after tool calls too.
fn done_reason(finish: Finish) -> &'static str {
    match finish {
        Finish::Length => "length",
        Finish::Stop | Finish::ToolCalls => "stop",
    }
}

/// The non-streamed answer (`"stream": false`).
pub(super) fn whole(w: &Wire, model: &str) -> serde_json::Value {
    let mut created = BytesMut::new();
    write_rfc3339(w.created, &mut created);
    let mut message = json!({"role": "assistant", "content": w.answer_text()});
    if let Some(thinking) = w.reasoning_text() {
        message["thinking"] = json!(thinking);
    }
    if w.output.tool_calls > 0 {
        let calls: Vec<serde_json::Value> = (0..w.output.tool_calls)
            .map(|k| {
                let arguments: serde_json::Value =
                    serde_json::from_str(&w.arguments_of(k)).unwrap_or(serde_json::Value::Null);
                json!({"function": {"name": TOOL_NAME, "arguments": arguments}})
            })
            .collect();
        message["tool_calls"] = json!(calls);
    }
    json!({
        "model": model,
        "created_at": String::from_utf8_lossy(&created),
        "message": message,
        "done": true,
        "done_reason": done_reason(w.finish),
        "prompt_eval_count": w.prompt_tokens,
        "eval_count": w.output.total(),
    })
}

/// Unix seconds as RFC 3339 UTC (`2025-01-14T09:21:03Z`), as Ollama's `created_at`.
fn write_rfc3339(unix_seconds: u64, buf: &mut BytesMut) {
    let days = unix_seconds / 86_400;
    let secs = unix_seconds % 86_400;
    let (year, month, day) = civil_from_days(days);
    let _ = write!(
        buf,
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    );
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, for days on or after the epoch).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::Api;
    use super::*;
    use crate::sim::config::ThinkTags;
    use crate::sim::phases::{Output, Phase};

    #[test]
    fn dates_are_rfc3339() {
        let mut buf = BytesMut::new();
        write_rfc3339(1_736_846_463, &mut buf);
        assert_eq!(&buf[..], b"2025-01-14T09:21:03Z");
        buf.clear();
        write_rfc3339(951_782_400, &mut buf);
        assert_eq!(&buf[..], b"2000-02-29T00:00:00Z");
    }

    #[test]
    fn thinking_then_content_then_whole_tool_calls() {
        let mut w = wire(Api::Ollama, agent(3, 4, 2, 3, ThinkTags::Parser));
        w.finish = Finish::ToolCalls;
        let written = write_all(&mut w);
        assert_eq!(
            phase_runs(&written, Api::Ollama),
            [
                (Phase::Reasoning, 3),
                (Phase::Content, 2),
                (Phase::ToolCall, 2)
            ]
        );
        // Each call's 3 steps: two that write nothing, then the whole call.
        assert_eq!(
            &written.step_events[written.step_events.len() - 6..],
            [0, 0, 1, 0, 0, 1]
        );
        let lines = written
            .bytes
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .count();
        assert_eq!(lines, written.events.len(), "one JSON object per line");
        let calls: Vec<&serde_json::Value> = written
            .events
            .iter()
            .filter_map(|(_, v)| v.pointer("/message/tool_calls/0/function"))
            .collect();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1]["name"], TOOL_NAME);
        let expected: serde_json::Value = serde_json::from_str(&w.arguments_of(1)).unwrap();
        assert_eq!(calls[1]["arguments"], expected);
        assert_eq!(
            joined(&written, Api::Ollama, Phase::Reasoning, "/message/thinking"),
            w.text_of(0..3)
        );
        let done = &written.events.last().unwrap().1;
        assert_eq!(done["done"], true);
        assert_eq!(done["done_reason"], "stop");
        assert_eq!(done["eval_count"], 3 + 4 + 6);
        assert_eq!(done["prompt_eval_count"], 5);
        assert_eq!(w.whole_body("m")["message"]["thinking"], w.text_of(0..3));
    }

    #[test]
    fn think_tags_are_escaped_as_go_writes_them() {
        let mut w = wire(Api::Ollama, agent(3, 1, 0, 1, ThinkTags::Inline));
        let written = write_all(&mut w);
        let text = String::from_utf8(written.bytes.clone()).unwrap();
        assert!(text.contains(r#""content":"\u003cthink\u003e""#), "{text}");
        assert!(!text.contains("<think>"));
        let contents: Vec<&str> = written
            .events
            .iter()
            .filter_map(|(_, v)| v.pointer("/message/content").and_then(|c| c.as_str()))
            .filter(|c| !c.is_empty())
            .collect();
        assert_eq!(
            contents,
            ["<think>", &w.text_of(1..2), "</think>", &w.text_of(3..4)]
        );
        let plain = wire(Api::Ollama, Output::answer(2));
        assert_eq!(
            plain.whole_body("m")["message"]["content"],
            plain.answer_text()
        );
    }
}
