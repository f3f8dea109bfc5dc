//! The OpenAI Responses API (`POST /v1/responses` with `"stream": true`).
//!
//! Every event names itself in `type` (and in the SSE `event:` field, which some gateways drop,
//! so the data is what counts). Token events are the deltas of what the reader sees:
//! `response.output_text.delta`, `response.reasoning_text.delta`,
//! `response.function_call_arguments.delta`, `response.refusal.delta` (a refusal is output
//! text too) and `response.reasoning_summary_text.delta` (the reasoning summary a client shows
//! in place of the thinking), each with a non-empty `delta`, 1 token each; their phases are
//! content (text, refusal), reasoning (reasoning text and summary) and tool_call. `response.created` and
//! `response.in_progress` carry the model; `response.completed` and `response.incomplete` end
//! the stream and carry `usage.output_tokens`, the server's total, `usage.input_tokens`, the
//! prompt's, and `status` (with `incomplete_details.reason`: `max_output_tokens`,
//! `content_filter`), why it ended; `response.failed` ends it as
//! an upstream error, and so does an `error` event.

use serde::Deserialize;
use serde_json::value::RawValue;

use super::json::{non_empty_string, plain_string, string_inside};
use super::{Classified, FinishReason, Phase};
use crate::scan::Event;

/// The Responses accountant; the events need no memory of earlier ones.
#[derive(Debug, Default, Clone, Copy)]
pub struct ResponsesAccounting;

// === impl ResponsesAccounting ===

impl ResponsesAccounting {
    /// Classifies one event of the stream.
    pub fn classify<'a>(&mut self, event: &Event<'a>) -> Classified<'a> {
        if event.truncated {
            return Classified::unparsed();
        }
        let Ok(data) = serde_json::from_slice::<Data<'a>>(event.data) else {
            return Classified::unparsed();
        };
        let kind = data.kind.map_or("", RawValue::get);
        let (phase, end, error) = match kind {
            r#""response.output_text.delta""# | r#""response.refusal.delta""# => {
                (Some(Phase::Content), false, false)
            }
            r#""response.reasoning_text.delta""# | r#""response.reasoning_summary_text.delta""# => {
                (Some(Phase::Reasoning), false, false)
            }
            r#""response.function_call_arguments.delta""# => (Some(Phase::ToolCall), false, false),
            r#""response.completed""# | r#""response.incomplete""# => (None, true, false),
            r#""response.failed""# => (None, true, true),
            r#""error""# => (None, false, true),
            _ => (None, false, event.kind == b"error"),
        };
        let phase = phase.filter(|_| non_empty_string(data.delta));
        let response = data.response.as_ref();
        let usage = response.and_then(|r| r.usage.as_ref());
        Classified {
            token_event: phase.is_some(),
            phase: phase.unwrap_or_default(),
            text: string_inside(data.delta).filter(|_| phase == Some(Phase::Content)),
            tokens: None,
            usage_total: usage.and_then(|u| u.output_tokens),
            usage_prompt: usage.and_then(|u| u.input_tokens),
            usage_reasoning: usage
                .and_then(|u| u.output_tokens_details.as_ref())
                .and_then(|d| d.reasoning_tokens),
            finish: response.filter(|_| end).and_then(Response::finish),
            model: response.and_then(|r| plain_string(r.model?)),
            end,
            error,
            unparsed: false,
        }
    }
}

/// A whole (non-streaming) response, the answer to `POST /v1/responses` without `"stream":
/// true`: the `response` object that `response.completed` carries in a stream, read by the same
/// fields (`usage.output_tokens`, `input_tokens`, `output_tokens_details.reasoning_tokens`,
/// `model`, `status`). Unparsed when it is not a JSON object of that shape.
pub(super) fn whole(body: &[u8]) -> Classified<'_> {
    let Ok(response) = serde_json::from_slice::<Response<'_>>(body) else {
        return Classified::unparsed();
    };
    let usage = response.usage.as_ref();
    Classified {
        usage_total: usage.and_then(|u| u.output_tokens),
        usage_prompt: usage.and_then(|u| u.input_tokens),
        usage_reasoning: usage
            .and_then(|u| u.output_tokens_details.as_ref())
            .and_then(|d| d.reasoning_tokens),
        finish: response.finish(),
        model: response.model.and_then(plain_string),
        end: true,
        ..Classified::default()
    }
}

#[derive(Deserialize)]
struct Data<'a> {
    #[serde(borrow, default, rename = "type")]
    kind: Option<&'a RawValue>,
    #[serde(borrow, default)]
    delta: Option<&'a RawValue>,
    #[serde(borrow, default)]
    response: Option<Response<'a>>,
}

#[derive(Deserialize)]
struct Response<'a> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(borrow, default)]
    status: Option<&'a RawValue>,
    #[serde(borrow, default)]
    incomplete_details: Option<IncompleteDetails<'a>>,
}

impl Response<'_> {
    /// Why the response ended, from its final `status`.
    fn finish(&self) -> Option<FinishReason> {
        let reason = self.incomplete_details.as_ref().and_then(|d| d.reason);
        FinishReason::responses(
            self.status?.get().as_bytes(),
            reason.map(|r| r.get().as_bytes()),
        )
    }
}

#[derive(Deserialize)]
struct IncompleteDetails<'a> {
    #[serde(borrow, default)]
    reason: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens_details: Option<OutputDetails>,
}

#[derive(Deserialize)]
struct OutputDetails {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classify(kind: &'static str, data: &'static str) -> Classified<'static> {
        ResponsesAccounting.classify(&Event {
            kind: kind.as_bytes(),
            data: data.as_bytes(),
            truncated: false,
        })
    }

    #[test]
    fn a_text_response() {
        let created = classify(
            "response.created",
            r#"{"type":"response.created","sequence_number":0,"response":{"id":"resp_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654","object":"response","created_at":1741290958,"status":"in_progress","error":null,"model":"gpt-4.1-2025-04-14","output":[],"usage":null}}"#,
        );
        assert!(
            !created.token_event,
            "response.created is not a token event"
        );
        assert_eq!(created.model, Some("gpt-4.1-2025-04-14"));
        assert_eq!(created.usage_total, None);
        let delta = classify(
            "response.output_text.delta",
            r#"{"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","output_index":0,"content_index":0,"delta":"Hi","logprobs":[]}"#,
        );
        assert!(delta.token_event);
        let done = classify(
            "response.output_text.done",
            r#"{"type":"response.output_text.done","sequence_number":6,"item_id":"msg_1","output_index":0,"content_index":0,"text":"Hi there!","logprobs":[]}"#,
        );
        assert!(!done.token_event);
        let completed = classify(
            "response.completed",
            r#"{"type":"response.completed","sequence_number":9,"response":{"id":"resp_1","object":"response","status":"completed","error":null,"model":"gpt-4.1-2025-04-14","usage":{"input_tokens":37,"input_tokens_details":{"cached_tokens":0},"output_tokens":11,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":48}}}"#,
        );
        assert!(completed.end && !completed.error);
        assert_eq!(completed.usage_total, Some(11));
        assert_eq!(completed.usage_prompt, Some(37));
        assert_eq!(completed.finish, Some(FinishReason::Stop));
        assert_eq!(
            created.finish, None,
            "in_progress is no reason, and not the end"
        );
    }

    #[test]
    fn an_incomplete_and_a_failed_response() {
        let incomplete = classify(
            "response.incomplete",
            r#"{"type":"response.incomplete","sequence_number":40,"response":{"id":"resp_2","object":"response","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"error":null,"model":"o4-mini","usage":{"input_tokens":12,"output_tokens":64,"total_tokens":76}}}"#,
        );
        assert!(incomplete.end);
        assert_eq!(incomplete.finish, Some(FinishReason::Length));
        assert_eq!(incomplete.usage_prompt, Some(12));
        let failed = classify(
            "response.failed",
            r#"{"type":"response.failed","sequence_number":3,"response":{"id":"resp_3","object":"response","status":"failed","error":{"code":"server_error","message":"The model failed to generate a response."},"incomplete_details":null,"model":"gpt-4.1","usage":null}}"#,
        );
        assert!(failed.error && failed.end);
        assert_eq!(failed.finish, Some(FinishReason::Error));
    }

    #[test]
    fn reasoning_function_arguments_and_refusals_are_token_events() {
        for (kind, data) in [
            (
                "response.reasoning_text.delta",
                r#"{"type":"response.reasoning_text.delta","item_id":"rs_1","output_index":0,"content_index":0,"delta":"Let","sequence_number":3}"#,
            ),
            (
                "response.function_call_arguments.delta",
                r#"{"type":"response.function_call_arguments.delta","item_id":"fc_1","output_index":0,"delta":"{\"loc","sequence_number":5}"#,
            ),
            (
                "response.refusal.delta",
                r#"{"type":"response.refusal.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":"I can't","sequence_number":5}"#,
            ),
        ] {
            assert!(classify(kind, data).token_event, "{kind}");
        }
        let empty = classify(
            "response.output_text.delta",
            r#"{"type":"response.output_text.delta","delta":"","sequence_number":5}"#,
        );
        assert!(!empty.token_event);
    }

    #[test]
    fn a_whole_response_is_read_by_the_same_fields() {
        let body = br#"{"id":"resp_1","object":"response","created_at":1741476777,"status":"completed","error":null,"incomplete_details":null,"model":"o4-mini-2025-04-16","output":[{"type":"reasoning","id":"rs_1","summary":[]},{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hi","annotations":[]}]}],"usage":{"input_tokens":328,"input_tokens_details":{"cached_tokens":0},"output_tokens":52,"output_tokens_details":{"reasoning_tokens":32},"total_tokens":380}}"#;
        let read = whole(body);
        assert!(!read.unparsed && !read.token_event);
        assert_eq!(
            (read.usage_total, read.usage_prompt, read.usage_reasoning),
            (Some(52), Some(328), Some(32))
        );
        assert_eq!(read.model, Some("o4-mini-2025-04-16"));
        assert_eq!(read.finish, Some(FinishReason::Stop));
        assert!(whole(b"{\"usage\":").unparsed);
    }

    #[test]
    fn failures_incomplete_and_error_events() {
        let failed = classify(
            "response.failed",
            r#"{"type":"response.failed","sequence_number":7,"response":{"id":"resp_1","status":"failed","error":{"code":"server_error","message":"The model failed to generate a response."},"model":"gpt-4.1","usage":null}}"#,
        );
        assert!(failed.end && failed.error);
        let incomplete = classify(
            "response.incomplete",
            r#"{"type":"response.incomplete","sequence_number":7,"response":{"id":"resp_1","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"model":"gpt-4.1","usage":{"output_tokens":16}}}"#,
        );
        assert!(incomplete.end && !incomplete.error);
        assert_eq!(incomplete.usage_total, Some(16));
        let error = classify(
            "error",
            r#"{"type":"error","code":"ERR_SOMETHING","message":"Something went wrong","param":null,"sequence_number":1}"#,
        );
        assert!(error.error);
    }
}
