//! The OpenAI Realtime API's server events (`wss://…/v1/realtime`), one JSON message each.
//!
//! Every event names itself in `type`, in the GA interface's names or, for a client that asked
//! for `realtime=v1`, the beta ones. Token events are the deltas of what the user gets, each
//! with a non-empty `delta`, 1 token event each: text (`response.output_text.delta`, beta
//! `response.text.delta`), the spoken answer's transcript
//! (`response.output_audio_transcript.delta`, beta `response.audio_transcript.delta`), its audio
//! (`response.output_audio.delta`, beta `response.audio.delta`: base64, counted per delta, its
//! tokens known only from the usage) and tool-call arguments
//! (`response.function_call_arguments.delta`). `response.done` ends a response and carries
//! `usage.output_tokens` and `usage.input_tokens` and its `status`: `completed`, `incomplete`
//! (with `status_details.reason`), `cancelled` (the client's `response.cancel`) or `failed`,
//! an upstream error. An `error` event reports a failed client event; it ends no response.

use serde::Deserialize;
use serde_json::value::RawValue;

use super::json::non_empty_string;
use super::{Classified, FinishReason, Phase};
use crate::scan::Event;

/// The Realtime accountant; the events need no memory of earlier ones.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealtimeAccounting;

// === impl RealtimeAccounting ===

impl RealtimeAccounting {
    /// Classifies one server event (a WebSocket message's JSON in `event.data`).
    pub fn classify<'a>(&mut self, event: &Event<'a>) -> Classified<'a> {
        if event.truncated {
            return Classified::unparsed();
        }
        let Ok(data) = serde_json::from_slice::<Data<'a>>(event.data) else {
            return Classified::unparsed();
        };
        let kind = data.kind.map_or("", RawValue::get);
        let token_event = is_delta(kind) && non_empty_string(data.delta);
        let phase = if kind == r#""response.function_call_arguments.delta""# {
            Phase::ToolCall
        } else {
            Phase::Content
        };
        let done = kind == r#""response.done""#;
        let response = data.response.as_ref().filter(|_| done);
        let usage = response.and_then(|r| r.usage.as_ref());
        let finish = response.and_then(Response::finish);
        Classified {
            token_event,
            phase,
            usage_total: usage.and_then(|u| u.output_tokens),
            usage_prompt: usage.and_then(|u| u.input_tokens),
            finish,
            end: done,
            error: kind == r#""error""# || finish == Some(FinishReason::Error),
            ..Classified::default()
        }
    }
}

/// Whether `kind` (a raw JSON string) names a delta the user gets.
fn is_delta(kind: &str) -> bool {
    matches!(
        kind,
        r#""response.output_text.delta""#
            | r#""response.text.delta""#
            | r#""response.output_audio_transcript.delta""#
            | r#""response.audio_transcript.delta""#
            | r#""response.output_audio.delta""#
            | r#""response.audio.delta""#
            | r#""response.function_call_arguments.delta""#
    )
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
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(borrow, default)]
    status: Option<&'a RawValue>,
    #[serde(borrow, default)]
    status_details: Option<StatusDetails<'a>>,
}

impl Response<'_> {
    /// Why the response ended, from its final `status` (the Responses API's values).
    fn finish(&self) -> Option<FinishReason> {
        let reason = self.status_details.as_ref().and_then(|d| d.reason);
        FinishReason::responses(
            self.status?.get().as_bytes(),
            reason.map(|r| r.get().as_bytes()),
        )
    }
}

#[derive(Deserialize)]
struct StatusDetails<'a> {
    #[serde(borrow, default)]
    reason: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    input_tokens: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classify(data: &'static str) -> Classified<'static> {
        RealtimeAccounting.classify(&Event {
            kind: b"",
            data: data.as_bytes(),
            truncated: false,
        })
    }

    #[test]
    fn text_transcript_audio_and_arguments_are_token_events_in_both_interfaces() {
        for kind in [
            "response.output_text.delta",
            "response.text.delta",
            "response.output_audio_transcript.delta",
            "response.audio_transcript.delta",
            "response.output_audio.delta",
            "response.audio.delta",
            "response.function_call_arguments.delta",
        ] {
            let data = format!(
                r#"{{"type":"{kind}","event_id":"event_1","response_id":"resp_1","item_id":"item_1","output_index":0,"content_index":0,"delta":"Hi"}}"#
            );
            let data: &'static str = Box::leak(data.into_boxed_str());
            let classified = classify(data);
            assert!(classified.token_event && !classified.end, "{kind}");
        }
        let empty = classify(r#"{"type":"response.output_audio.delta","delta":""}"#);
        assert!(!empty.token_event);
        for other in [
            r#"{"type":"session.created","event_id":"e","session":{"model":"gpt-realtime"}}"#,
            r#"{"type":"response.output_text.done","text":"Hi there"}"#,
            r#"{"type":"response.created","response":{"status":"in_progress","usage":null}}"#,
        ] {
            let classified = classify(other);
            assert!(!classified.token_event && !classified.end, "{other}");
            assert_eq!(classified.finish, None, "{other}");
        }
    }

    #[test]
    fn response_done_ends_with_usage_and_status() {
        let done = classify(
            r#"{"type":"response.done","event_id":"e9","response":{"object":"realtime.response","id":"resp_1","status":"completed","status_details":null,"output":[],"usage":{"total_tokens":253,"input_tokens":132,"output_tokens":121,"output_token_details":{"text_tokens":30,"audio_tokens":91}}}}"#,
        );
        assert!(done.end && !done.error);
        assert_eq!(done.usage_total, Some(121));
        assert_eq!(done.usage_prompt, Some(132));
        assert_eq!(done.finish, Some(FinishReason::Stop));
        let cancelled = classify(
            r#"{"type":"response.done","response":{"status":"cancelled","status_details":{"type":"cancelled","reason":"client_cancelled"},"usage":null}}"#,
        );
        assert!(cancelled.end && !cancelled.error);
        assert_eq!(cancelled.finish, Some(FinishReason::Abort));
        let incomplete = classify(
            r#"{"type":"response.done","response":{"status":"incomplete","status_details":{"type":"incomplete","reason":"max_output_tokens"}}}"#,
        );
        assert_eq!(incomplete.finish, Some(FinishReason::Length));
        let failed = classify(
            r#"{"type":"response.done","response":{"status":"failed","status_details":{"type":"failed","error":{"type":"server_error"}}}}"#,
        );
        assert!(failed.end && failed.error);
    }

    #[test]
    fn an_error_event_is_an_error_and_junk_is_unparsed() {
        let error = classify(
            r#"{"type":"error","event_id":"e","error":{"type":"invalid_request_error","code":"conversation_already_has_active_response","message":"busy"}}"#,
        );
        assert!(error.error && !error.end);
        assert!(classify("not json").unparsed);
    }
}
