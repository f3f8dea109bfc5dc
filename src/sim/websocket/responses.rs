//! The Responses API's WebSocket mode (`GET /v1/responses`, upgraded): each `response.create`
//! message from the client starts a response, streamed back as the same events the SSE shape
//! sends, one JSON message each.
//!
//! The message carries the fields of `POST /v1/responses` at its top level (`stream` is
//! implied; a client that wraps them in a `response` object is read too). OpenAI runs the
//! responses of one socket one at a time, in order ("processed FIFO"), so a `response.create`
//! that arrives while one runs waits for it, up to [`MAX_QUEUED`]. Anything else the client
//! sends is answered with an `error` message and changes nothing; the WebSocket mode has no
//! `response.cancel`: a client stops a response by closing the socket.

use bytes::Bytes;
use serde_json::{json, Value};

use super::session::Ask;
use crate::sim::request::{self, GenRequest};
use crate::sim::shapes::{Api, RealtimeStyle};

/// `response.create` messages that may wait behind the running response; one more is refused
/// with an `error` message, so a client cannot make the sim hold an unbounded queue.
pub(super) const MAX_QUEUED: usize = 16;

/// Reads one client message: a response to start, or the `error` message that answers it.
pub(super) fn on_message(text: &[u8], out: &mut Vec<Bytes>) -> Option<Ask> {
    let value: Value = match serde_json::from_slice(text) {
        Ok(value @ Value::Object(_)) => value,
        _ => {
            out.push(error("invalid_json", "A message must be a JSON object."));
            return None;
        }
    };
    match value.get("type").and_then(Value::as_str) {
        Some("response.create") => {}
        other => {
            let message = format!(
                "The sim's Responses WebSocket reads `response.create` messages only, not {}.",
                other.map_or_else(|| "one without a `type`".to_owned(), |t| format!("`{t}`"))
            );
            out.push(error("unknown_event_type", &message));
            return None;
        }
    }
    let fields = match value.get("response") {
        Some(inner @ Value::Object(_)) => inner,
        _ => &value,
    };
    match request::parse(Api::Responses, fields.to_string().as_bytes()) {
        Ok(request) => Some(Ask::Create(
            GenRequest {
                stream: true,
                ..request
            },
            RealtimeStyle::default(),
        )),
        Err(e) => {
            out.push(error("invalid_request_error", &e.0));
            None
        }
    }
}

/// The answer to a `response.create` beyond [`MAX_QUEUED`].
pub(super) fn queue_full() -> Bytes {
    error(
        "too_many_queued_responses",
        "Too many `response.create` messages wait behind the running response.",
    )
}

/// An `error` message as the WebSocket mode sends one.
fn error(code: &str, message: &str) -> Bytes {
    let body = json!({
        "type": "error",
        "status": 400,
        "error": {"type": "invalid_request_error", "code": code, "message": message},
    });
    Bytes::from(body.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_create_message_is_a_responses_request() {
        let mut out = Vec::new();
        let ask = on_message(
            br#"{"type":"response.create","model":"m","input":"hi","max_output_tokens":7,"sim_tool_calls":1}"#,
            &mut out,
        );
        let Some(Ask::Create(request, _)) = ask else {
            panic!("{ask:?}");
        };
        assert!(out.is_empty());
        assert!(request.stream);
        assert_eq!(request.max_tokens, Some(7));
        assert_eq!(request.phases.tool_calls, Some(1));
        let wrapped = on_message(
            br#"{"type":"response.create","response":{"max_output_tokens":3}}"#,
            &mut out,
        );
        assert!(matches!(wrapped, Some(Ask::Create(r, _)) if r.max_tokens == Some(3)));
    }

    #[test]
    fn anything_else_is_an_error_message() {
        for text in [
            &b"not json"[..],
            br#"{"type":"response.cancel"}"#,
            br#"{"model":"m"}"#,
            br#"{"type":"response.create","max_output_tokens":-1}"#,
        ] {
            let mut out = Vec::new();
            assert!(on_message(text, &mut out).is_none());
            let error: Value = serde_json::from_slice(&out[0]).unwrap();
            assert_eq!(error["type"], "error", "{}", String::from_utf8_lossy(text));
            assert!(error["error"]["message"].as_str().is_some());
        }
    }
}
