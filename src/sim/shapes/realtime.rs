//! The OpenAI Realtime API's server events for one response (the API reference's "Server
//! events"), in the names of the GA interface or, for a client that asked for `realtime=v1`, of
//! the beta one.
//!
//! Every event carries an `event_id` and, when it is about the response, its `response_id`.
//! `response.created` comes first; then one output item per segment: a `message` item opened by
//! `response.output_item.added`, `conversation.item.added` (beta: `conversation.item.created`)
//! and `response.content_part.added`, whose decode steps are `response.output_text.delta`s (beta:
//! `response.text.delta`) when the response writes text, or, when it speaks, a
//! `response.output_audio_transcript.delta` and a `response.output_audio.delta` of base64 audio
//! each (beta: `response.audio_transcript.delta`, `response.audio.delta`): two token events per
//! step. Each tool call is a `function_call` item of `response.function_call_arguments.delta`s.
//! An item closes with its `.done` events, `response.output_item.done` and (GA only)
//! `conversation.item.done`; `response.done` ends the response with the whole output and
//! `usage` (`output_token_details` splits text from audio tokens). The Realtime API streams no
//! reasoning, so the sim plans none for it.
//!
//! The events are written as SSE `data:` lines like every other shape, so the one stream
//! machinery drives them; the WebSocket session sends each event's data as one text message.

use std::fmt::Write as _;
use std::ops::Range;

use bytes::BytesMut;

use super::{begin, end, Finish, Tags, Wire, TOOL_NAME};
use crate::sim::phases::Segment;

/// `response.created` and the first item's opening events.
pub(super) fn preamble_len(w: &Wire) -> usize {
    1 + opens(w.output.first_segment())
}

pub(super) fn write_preamble(w: &mut Wire, i: usize, buf: &mut BytesMut) {
    if i == 0 {
        event(w, "response.created", buf);
        buf.extend_from_slice(br#","response":"#);
        response(w, "in_progress", false, buf);
        buf.extend_from_slice(b"}");
        end(buf);
    } else {
        open(w, w.output.first_segment(), i - 1, buf);
    }
}

/// The event names that differ between the GA and the beta interface.
#[derive(Clone, Copy)]
enum Name {
    TextDelta,
    TextDone,
    TranscriptDelta,
    TranscriptDone,
    AudioDelta,
    AudioDone,
    ItemAdded,
    ItemDone,
}

// === impl Name ===

impl Name {
    /// The name as the interface spells it; `None` for an event the beta interface lacks.
    fn of(self, beta: bool) -> Option<&'static str> {
        let (ga, old) = match self {
            Name::TextDelta => ("response.output_text.delta", "response.text.delta"),
            Name::TextDone => ("response.output_text.done", "response.text.done"),
            Name::TranscriptDelta => (
                "response.output_audio_transcript.delta",
                "response.audio_transcript.delta",
            ),
            Name::TranscriptDone => (
                "response.output_audio_transcript.done",
                "response.audio_transcript.done",
            ),
            Name::AudioDelta => ("response.output_audio.delta", "response.audio.delta"),
            Name::AudioDone => ("response.output_audio.done", "response.audio.done"),
            Name::ItemAdded => ("conversation.item.added", "conversation.item.created"),
            Name::ItemDone => ("conversation.item.done", ""),
        };
        let name = if beta { old } else { ga };
        (!name.is_empty()).then_some(name)
    }
}

/// Whether the response speaks (audio and its transcript) rather than writes text.
fn speaks(w: &Wire) -> bool {
    w.realtime.audio.is_some()
}

/// Events that open `segment`'s item: the item twice (in the response and in the
/// conversation), and for text its content part.
fn opens(segment: Segment) -> usize {
    match segment {
        Segment::Thinking | Segment::Text => 3,
        Segment::ToolCall(_) => 2,
    }
}

/// Events that close `segment`'s item: the text's (or the audio's and the transcript's)
/// `.done`, its part's, then the item's, and in the GA interface the conversation's.
fn closes(w: &Wire, segment: Segment) -> usize {
    let ga = usize::from(!w.realtime.beta);
    match segment {
        Segment::Thinking | Segment::Text => 3 + usize::from(speaks(w)) + ga,
        Segment::ToolCall(_) => 2 + ga,
    }
}

/// Starts event `kind` (left open): `{"type":…,"event_id":…`.
fn event(w: &mut Wire, kind: &str, buf: &mut BytesMut) {
    begin(buf, None);
    let _ = write!(
        buf,
        r#"{{"type":"{kind}","event_id":"event_sim_{}_{}""#,
        w.seq, w.written
    );
    w.written += 1;
}

/// `,"response_id":…,"item_id":…,"output_index":…` of the events about `segment`'s item.
fn item_ref(w: &Wire, segment: Segment, buf: &mut BytesMut) {
    let _ = write!(
        buf,
        r#","response_id":"resp_sim_{}","item_id":"item_sim_{}_{}","output_index":{}"#,
        w.seq,
        w.seq,
        w.output.position(segment),
        w.output.position(segment)
    );
}

/// Opening event `j` of `segment`'s item.
fn open(w: &mut Wire, segment: Segment, j: usize, buf: &mut BytesMut) {
    match j {
        0 => {
            event(w, "response.output_item.added", buf);
            let _ = write!(
                buf,
                r#","response_id":"resp_sim_{}","output_index":{},"item":"#,
                w.seq,
                w.output.position(segment)
            );
            item(w, segment, false, buf);
        }
        1 => {
            let kind = Name::ItemAdded.of(w.realtime.beta).unwrap_or_default();
            event(w, kind, buf);
            buf.extend_from_slice(br#","previous_item_id":null,"item":"#);
            item(w, segment, false, buf);
        }
        _ => {
            event(w, "response.content_part.added", buf);
            item_ref(w, segment, buf);
            let part = if speaks(w) {
                r#","content_index":0,"part":{"type":"audio","transcript":""}"#
            } else {
                r#","content_index":0,"part":{"type":"text","text":""}"#
            };
            buf.extend_from_slice(part.as_bytes());
        }
    }
    buf.extend_from_slice(b"}");
    end(buf);
}

/// Closing event `j` of `segment`'s item.
fn close(w: &mut Wire, segment: Segment, j: usize, buf: &mut BytesMut) {
    let beta = w.realtime.beta;
    let range = w.output.range(segment);
    let item_done = closes(w, segment) - usize::from(!beta) - 1;
    if j == item_done {
        event(w, "response.output_item.done", buf);
        let _ = write!(
            buf,
            r#","response_id":"resp_sim_{}","output_index":{},"item":"#,
            w.seq,
            w.output.position(segment)
        );
        item(w, segment, true, buf);
    } else if j > item_done {
        let kind = Name::ItemDone.of(beta).unwrap_or_default();
        event(w, kind, buf);
        buf.extend_from_slice(br#","previous_item_id":null,"item":"#);
        item(w, segment, true, buf);
    } else if let Segment::ToolCall(k) = segment {
        event(w, "response.function_call_arguments.done", buf);
        item_ref(w, segment, buf);
        let _ = write!(
            buf,
            r#","call_id":"{}","name":"{TOOL_NAME}","arguments":""#,
            w.call_id("call_sim_", k)
        );
        w.write_arguments(range, true, buf);
        buf.extend_from_slice(b"\"");
    } else {
        close_text(w, segment, j, range, buf);
    }
    buf.extend_from_slice(b"}");
    end(buf);
}

/// Closing event `j` of a message item, before the item's own: the audio's, the transcript's
/// (or the text's) `.done`, then the content part's.
fn close_text(w: &mut Wire, segment: Segment, j: usize, range: Range<u64>, buf: &mut BytesMut) {
    let beta = w.realtime.beta;
    let part_done = closes(w, segment) - usize::from(!beta) - 2;
    let audio_done = speaks(w) && j == 0;
    if audio_done {
        event(w, Name::AudioDone.of(beta).unwrap_or_default(), buf);
        item_ref(w, segment, buf);
        buf.extend_from_slice(br#","content_index":0"#);
    } else if j < part_done {
        let (name, field) = if speaks(w) {
            (Name::TranscriptDone, "transcript")
        } else {
            (Name::TextDone, "text")
        };
        event(w, name.of(beta).unwrap_or_default(), buf);
        item_ref(w, segment, buf);
        let _ = write!(buf, r#","content_index":0,"{field}":""#);
        w.write_text(range, Tags::Plain, buf);
        buf.extend_from_slice(b"\"");
    } else {
        event(w, "response.content_part.done", buf);
        item_ref(w, segment, buf);
        buf.extend_from_slice(br#","content_index":0,"part":"#);
        content(w, range, false, buf);
    }
}

/// A message item's content part: text or the audio's transcript, whole. `in_item` spells the
/// type as a conversation item does (GA: `output_text`, `output_audio`).
fn content(w: &Wire, range: Range<u64>, in_item: bool, buf: &mut BytesMut) {
    let (kind, field) = match (speaks(w), in_item && !w.realtime.beta) {
        (true, true) => ("output_audio", "transcript"),
        (true, false) => ("audio", "transcript"),
        (false, true) => ("output_text", "text"),
        (false, false) => ("text", "text"),
    };
    let _ = write!(buf, r#"{{"type":"{kind}","{field}":""#);
    w.write_text(range, Tags::Plain, buf);
    buf.extend_from_slice(br#""}"#);
}

/// `segment`'s item: as added (empty, in progress) or done (whole).
fn item(w: &Wire, segment: Segment, done: bool, buf: &mut BytesMut) {
    let status = match (done, w.finish) {
        (false, _) => "in_progress",
        (true, Finish::Length) => "incomplete",
        (true, _) => "completed",
    };
    let _ = write!(
        buf,
        r#"{{"id":"item_sim_{}_{}","object":"realtime.item","status":"{status}","#,
        w.seq,
        w.output.position(segment)
    );
    let range = w.output.range(segment);
    match segment {
        Segment::Thinking | Segment::Text => {
            buf.extend_from_slice(br#""type":"message","role":"assistant","content":["#);
            if done {
                content(w, range, true, buf);
            }
            buf.extend_from_slice(b"]");
        }
        Segment::ToolCall(k) => {
            let _ = write!(
                buf,
                r#""type":"function_call","call_id":"{}","name":"{TOOL_NAME}","arguments":""#,
                w.call_id("call_sim_", k)
            );
            if done {
                w.write_arguments(range, true, buf);
            }
            buf.extend_from_slice(b"\"");
        }
    }
    buf.extend_from_slice(b"}");
}

/// The response object: in progress (no output yet), or finished with the whole output and usage.
fn response(w: &Wire, status: &str, finished: bool, buf: &mut BytesMut) {
    let _ = write!(
        buf,
        r#"{{"object":"realtime.response","id":"resp_sim_{}","status":"{status}","status_details":"#,
        w.seq
    );
    match (finished, w.finish) {
        (true, Finish::Length) => {
            buf.extend_from_slice(br#"{"type":"incomplete","reason":"max_output_tokens"}"#)
        }
        _ => buf.extend_from_slice(b"null"),
    }
    let _ = write!(
        buf,
        r#","conversation_id":"conv_sim_{}","#,
        w.realtime.session
    );
    let modalities = match (w.realtime.beta, speaks(w)) {
        (true, true) => r#""modalities":["text","audio"]"#,
        (true, false) => r#""modalities":["text"]"#,
        (false, true) => r#""output_modalities":["audio"]"#,
        (false, false) => r#""output_modalities":["text"]"#,
    };
    buf.extend_from_slice(modalities.as_bytes());
    buf.extend_from_slice(br#","output":["#);
    if finished {
        let calls = (0..w.output.tool_calls).map(Segment::ToolCall);
        for (i, segment) in std::iter::once(Segment::Text).chain(calls).enumerate() {
            if i > 0 {
                buf.extend_from_slice(b",");
            }
            item(w, segment, true, buf);
        }
    }
    buf.extend_from_slice(br#"],"usage":"#);
    if finished {
        usage(w, buf);
    } else {
        buf.extend_from_slice(b"null");
    }
    buf.extend_from_slice(b"}");
}

/// `usage`: every output token, the answer's as audio tokens when the response speaks.
fn usage(w: &Wire, buf: &mut BytesMut) {
    let (input, output) = (w.prompt_tokens, w.output.total());
    let audio = if speaks(w) {
        w.output.range(Segment::Text).end - w.output.range(Segment::Text).start
    } else {
        0
    };
    let _ = write!(
        buf,
        r#"{{"total_tokens":{},"input_tokens":{input},"output_tokens":{output},"input_token_details":{{"text_tokens":{input},"audio_tokens":0,"cached_tokens":0}},"output_token_details":{{"text_tokens":{},"audio_tokens":{audio}}}}}"#,
        input + output,
        output - audio
    );
}

pub(super) fn write_step(w: &mut Wire, range: Range<u64>, buf: &mut BytesMut) -> u32 {
    cross(w, range.start, buf);
    let segment = w.output.segment(range.start);
    let beta = w.realtime.beta;
    if let Segment::ToolCall(k) = segment {
        event(w, "response.function_call_arguments.delta", buf);
        item_ref(w, segment, buf);
        let _ = write!(
            buf,
            r#","call_id":"{}","delta":""#,
            w.call_id("call_sim_", k)
        );
        w.write_arguments(range, true, buf);
        buf.extend_from_slice(br#""}"#);
        end(buf);
        return 1;
    }
    let name = if speaks(w) {
        Name::TranscriptDelta
    } else {
        Name::TextDelta
    };
    event(w, name.of(beta).unwrap_or_default(), buf);
    item_ref(w, segment, buf);
    buf.extend_from_slice(br#","content_index":0,"delta":""#);
    w.write_text(range.clone(), Tags::Plain, buf);
    buf.extend_from_slice(br#""}"#);
    end(buf);
    let Some(audio) = w.realtime.audio.clone() else {
        return 1;
    };
    event(w, Name::AudioDelta.of(beta).unwrap_or_default(), buf);
    item_ref(w, segment, buf);
    buf.extend_from_slice(br#","content_index":0,"delta":""#);
    for _ in range {
        buf.extend_from_slice(audio.as_bytes());
    }
    buf.extend_from_slice(br#""}"#);
    end(buf);
    2
}

/// When token `token` starts a segment other than the first: the events that close the one
/// before and open the new one.
fn cross(w: &mut Wire, token: u64, buf: &mut BytesMut) {
    if let Some((closed, opened)) = w.output.boundary_at(token) {
        for j in 0..closes(w, closed) {
            close(w, closed, j, buf);
        }
        for j in 0..opens(opened) {
            open(w, opened, j, buf);
        }
    }
}

/// The last item's closing events and `response.done`.
pub(super) fn trailer_len(w: &Wire) -> usize {
    closes(w, w.output.last_segment()) + 1
}

pub(super) fn write_trailer(w: &mut Wire, i: usize, buf: &mut BytesMut) {
    let last = w.output.last_segment();
    if i < closes(w, last) {
        close(w, last, i, buf);
        return;
    }
    let status = match w.finish {
        Finish::Length => "incomplete",
        Finish::Stop | Finish::ToolCalls => "completed",
    };
    event(w, "response.done", buf);
    buf.extend_from_slice(br#","response":"#);
    response(w, status, true, buf);
    buf.extend_from_slice(b"}");
    end(buf);
}

/// Room `response.done` needs beyond a fixed head: the whole output, written twice (the items'
/// text and their transcript).
pub(super) fn trailer_size_hint(w: &Wire) -> usize {
    512 + usize::try_from(w.output.total()).unwrap_or(0) * 24
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::{Api, RealtimeStyle};
    use super::*;
    use crate::sim::config::ThinkTags;
    use crate::sim::phases::Output;

    fn kinds(written: &Written) -> Vec<&str> {
        written
            .events
            .iter()
            .map(|(_, v)| v["type"].as_str().unwrap())
            .collect()
    }

    fn speaking(beta: bool) -> RealtimeStyle {
        RealtimeStyle {
            beta,
            audio: Some("AAAA".into()),
            session: 7,
        }
    }

    #[test]
    fn a_text_response_in_the_ga_names() {
        let mut w = wire(Api::Realtime, Output::answer(2));
        w.finish = Finish::Stop;
        let written = write_in_steps(&mut w, |_| 1);
        assert_eq!(
            kinds(&written),
            [
                "response.created",
                "response.output_item.added",
                "conversation.item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "conversation.item.done",
                "response.done",
            ]
        );
        let ids: std::collections::BTreeSet<&str> = written
            .events
            .iter()
            .map(|(_, v)| v["event_id"].as_str().unwrap())
            .collect();
        assert_eq!(ids.len(), written.events.len(), "every event_id is its own");
        let done = &written.events.last().unwrap().1["response"];
        assert_eq!(done["status"], "completed");
        assert_eq!(done["output_modalities"], serde_json::json!(["text"]));
        assert_eq!(done["output"][0]["content"][0]["type"], "output_text");
        assert_eq!(done["output"][0]["content"][0]["text"], w.answer_text());
        assert_eq!(done["usage"]["output_tokens"], 2);
        assert_eq!(done["usage"]["output_token_details"]["text_tokens"], 2);
    }

    #[test]
    fn a_spoken_response_sends_a_transcript_and_audio_per_step() {
        let mut w = wire(Api::Realtime, Output::answer(3));
        w.realtime = speaking(false);
        let written = write_in_steps(&mut w, |t| if t == 1 { 2 } else { 1 });
        assert_eq!(written.step_events, [2, 2]);
        let kinds = kinds(&written);
        assert_eq!(
            &kinds[4..8],
            [
                "response.output_audio_transcript.delta",
                "response.output_audio.delta",
                "response.output_audio_transcript.delta",
                "response.output_audio.delta",
            ]
        );
        assert_eq!(
            &kinds[8..],
            [
                "response.output_audio.done",
                "response.output_audio_transcript.done",
                "response.content_part.done",
                "response.output_item.done",
                "conversation.item.done",
                "response.done",
            ]
        );
        // The second step carried two tokens: twice one token's audio.
        assert_eq!(written.events[7].1["delta"], "AAAAAAAA");
        let done = &written.events.last().unwrap().1["response"];
        assert_eq!(done["status"], "incomplete");
        assert_eq!(done["status_details"]["reason"], "max_output_tokens");
        assert_eq!(done["conversation_id"], "conv_sim_7");
        assert_eq!(done["output"][0]["content"][0]["type"], "output_audio");
        assert_eq!(
            done["output"][0]["content"][0]["transcript"],
            w.answer_text()
        );
        assert_eq!(done["usage"]["output_token_details"]["audio_tokens"], 3);
    }

    #[test]
    fn the_beta_names_and_tool_calls() {
        let mut w = wire(Api::Realtime, agent(0, 1, 1, 2, ThinkTags::Parser));
        w.realtime = speaking(true);
        w.finish = Finish::ToolCalls;
        let written = write_in_steps(&mut w, |_| 1);
        assert_eq!(
            kinds(&written),
            [
                "response.created",
                "response.output_item.added",
                "conversation.item.created",
                "response.content_part.added",
                "response.audio_transcript.delta",
                "response.audio.delta",
                "response.audio.done",
                "response.audio_transcript.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "conversation.item.created",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.done",
            ]
        );
        let args: String = written
            .events
            .iter()
            .filter(|(_, v)| v["type"] == "response.function_call_arguments.delta")
            .map(|(_, v)| v["delta"].as_str().unwrap())
            .collect();
        assert_eq!(args, w.arguments_of(0));
        let done = &written.events.last().unwrap().1["response"];
        assert_eq!(done["modalities"], serde_json::json!(["text", "audio"]));
        assert_eq!(done["output"][1]["type"], "function_call");
        assert_eq!(done["output"][1]["arguments"], w.arguments_of(0));
        assert_eq!(done["output"][0]["content"][0]["type"], "audio");
    }
}
