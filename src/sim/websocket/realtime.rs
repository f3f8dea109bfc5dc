//! The Realtime API (`GET /v1/realtime?model=…`, upgraded): a session that says
//! `session.created` first, takes `session.update`, `conversation.item.create`,
//! `response.create` and `response.cancel`, and streams each response as the Realtime server
//! events (see the shape, `shapes/realtime.rs`).
//!
//! A client that sends `OpenAI-Beta: realtime=v1` (or offers the `openai-beta.realtime-v1`
//! subprotocol) gets the beta interface's event names; any other the GA ones. A response speaks
//! (audio and its transcript) or writes text as the session's output modality says, unless the
//! `response.create` names its own. As the Realtime API does, a `response.create` while a
//! response runs is refused with an `error` (`conversation_already_has_active_response`), and
//! `response.cancel` ends the running one with a `response.done` whose status is `cancelled`.
//! Input audio is taken and ignored: the sim has no turn detection, so only `response.create`
//! starts a response.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Value};

use super::session::Ask;
use crate::sim::request::{self, GenRequest};
use crate::sim::shapes::{Api, RealtimeStyle};

/// One Realtime session's state: its interface, its output modality and the conversation's
/// prompt so far.
#[derive(Debug)]
pub(super) struct RealtimeSession {
    /// The session's number, in its IDs.
    number: u64,
    /// The beta interface's event names.
    beta: bool,
    /// The model the client asked for (`?model=`), or the sim's.
    model: String,
    /// The session's output modality: audio (with its transcript) or text.
    speaks: bool,
    /// Base64 of one token's audio.
    audio: Arc<str>,
    /// Session events sent so far (their `event_id`s).
    events: u64,
    /// Conversation items the client created (their IDs when it gave none).
    items: u64,
    /// Bytes of text in the conversation's items: the next response's prompt.
    prompt_bytes: u64,
}

// === impl RealtimeSession ===

impl RealtimeSession {
    /// A new session, number `number`, in the beta or GA interface; it speaks until told
    /// otherwise, as the API's sessions do.
    pub(super) fn new(number: u64, beta: bool, model: String, audio: Arc<str>) -> Self {
        RealtimeSession {
            number,
            beta,
            model,
            speaks: true,
            audio,
            events: 0,
            items: 0,
            prompt_bytes: 0,
        }
    }

    /// `session.created`, the first message of every session.
    pub(super) fn greeting(&mut self, out: &mut Vec<Bytes>) {
        let session = self.session();
        out.push(self.event("session.created", json!({ "session": session })));
    }

    /// Reads one client event: a response to start or cancel, or replies to send.
    pub(super) fn on_message(&mut self, text: &[u8], out: &mut Vec<Bytes>) -> Option<Ask> {
        let Ok(value @ Value::Object(_)) = serde_json::from_slice::<Value>(text) else {
            out.push(self.error("invalid_json", "An event must be a JSON object.", None));
            return None;
        };
        let client_event = value.get("event_id").and_then(Value::as_str);
        match value.get("type").and_then(Value::as_str).unwrap_or("") {
            "session.update" => {
                self.update(value.get("session"));
                let session = self.session();
                out.push(self.event("session.updated", json!({ "session": session })));
                None
            }
            "conversation.item.create" => {
                self.create_item(value.get("item"), out);
                None
            }
            "response.create" => self.create_response(value.get("response"), client_event, out),
            "response.cancel" => Some(Ask::Cancel),
            "input_audio_buffer.append" => None,
            "input_audio_buffer.clear" => {
                out.push(self.event("input_audio_buffer.cleared", json!({})));
                None
            }
            other => {
                let message = format!("The sim does not serve the client event `{other}`.");
                out.push(self.error("unknown_event_type", &message, client_event));
                None
            }
        }
    }

    /// The answer to a `response.create` while a response runs.
    pub(super) fn busy(&mut self, response_seq: u64, out: &mut Vec<Bytes>) {
        let message = format!(
            "Conversation already has an active response in progress: resp_sim_{response_seq}. \
             Wait until the response is finished before creating a new one."
        );
        out.push(self.error("conversation_already_has_active_response", &message, None));
    }

    /// The answer to a `response.cancel` with no response running.
    pub(super) fn nothing_to_cancel(&mut self, out: &mut Vec<Bytes>) {
        let message = "Cancellation failed: no active response found.";
        out.push(self.error("response_cancel_not_active", message, None));
    }

    /// The end of response `seq`, cancelled by the client before it was complete.
    pub(super) fn cancelled(&mut self, seq: u64, out: &mut Vec<Bytes>) {
        let modalities = if self.speaks {
            json!(["audio"])
        } else {
            json!(["text"])
        };
        let mut response = json!({
            "object": "realtime.response",
            "id": format!("resp_sim_{seq}"),
            "status": "cancelled",
            "status_details": {"type": "cancelled", "reason": "client_cancelled"},
            "conversation_id": format!("conv_sim_{}", self.number),
            "output": [],
            "usage": null,
        });
        let key = if self.beta {
            "modalities"
        } else {
            "output_modalities"
        };
        response[key] = modalities;
        out.push(self.event("response.done", json!({ "response": response })));
    }

    /// Takes the output modality of a `session.update`.
    fn update(&mut self, session: Option<&Value>) {
        if let Some(speaks) = session.and_then(|s| self.speaks_in(s)) {
            self.speaks = speaks;
        }
    }

    /// Whether `object` (a session or a response) asks for audio, if it says.
    fn speaks_in(&self, object: &Value) -> Option<bool> {
        let key = if self.beta {
            "modalities"
        } else {
            "output_modalities"
        };
        let modalities = object.get(key)?.as_array()?;
        Some(modalities.iter().any(|m| m == "audio"))
    }

    /// Adds a client's item to the conversation and says so.
    fn create_item(&mut self, item: Option<&Value>, out: &mut Vec<Bytes>) {
        self.items += 1;
        let mut item = item.cloned().unwrap_or_else(|| json!({}));
        self.prompt_bytes += text_bytes(&item);
        if item.get("id").is_none() {
            item["id"] = json!(format!("item_sim_s{}_{}", self.number, self.items));
        }
        item["object"] = json!("realtime.item");
        item["status"] = json!("completed");
        let added = json!({ "previous_item_id": null, "item": item });
        if self.beta {
            out.push(self.event("conversation.item.created", added));
        } else {
            out.push(self.event("conversation.item.added", added.clone()));
            out.push(self.event("conversation.item.done", added));
        }
    }

    /// Reads a `response.create`'s `response`: its limits, the sim's own fields, and its
    /// modality over the session's.
    fn create_response(
        &mut self,
        response: Option<&Value>,
        client_event: Option<&str>,
        out: &mut Vec<Bytes>,
    ) -> Option<Ask> {
        let fields = response.cloned().unwrap_or_else(|| json!({}));
        let request = match request::parse(Api::Realtime, fields.to_string().as_bytes()) {
            Ok(request) => request,
            Err(e) => {
                out.push(self.error("invalid_request_error", &e.0, client_event));
                return None;
            }
        };
        let speaks = self.speaks_in(&fields).unwrap_or(self.speaks);
        let style = RealtimeStyle {
            beta: self.beta,
            audio: speaks.then(|| self.audio.clone()),
            session: self.number,
        };
        let request = GenRequest {
            prompt_bytes: request.prompt_bytes + self.prompt_bytes,
            ..request
        };
        Some(Ask::Create(request, style))
    }

    /// The session object of `session.created` and `session.updated`.
    fn session(&self) -> Value {
        if self.beta {
            let modalities = if self.speaks {
                json!(["text", "audio"])
            } else {
                json!(["text"])
            };
            json!({
                "object": "realtime.session",
                "id": format!("sess_sim_{}", self.number),
                "model": self.model,
                "modalities": modalities,
                "voice": "alloy",
                "output_audio_format": "pcm16",
                "max_response_output_tokens": "inf",
                "tools": [],
                "turn_detection": null,
            })
        } else {
            let modalities = if self.speaks {
                json!(["audio"])
            } else {
                json!(["text"])
            };
            json!({
                "type": "realtime",
                "object": "realtime.session",
                "id": format!("sess_sim_{}", self.number),
                "model": self.model,
                "output_modalities": modalities,
                "max_output_tokens": "inf",
                "tools": [],
                "audio": {
                    "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "alloy"},
                    "input": {"turn_detection": null},
                },
            })
        }
    }

    /// A session event of `kind` with `fields`.
    fn event(&mut self, kind: &str, mut fields: Value) -> Bytes {
        fields["type"] = json!(kind);
        fields["event_id"] = json!(format!("event_sim_s{}_{}", self.number, self.events));
        self.events += 1;
        Bytes::from(fields.to_string())
    }

    /// An `error` event, naming the client event it answers when that had an `event_id`.
    fn error(&mut self, code: &str, message: &str, client_event: Option<&str>) -> Bytes {
        let error = json!({
            "type": "invalid_request_error",
            "code": code,
            "message": message,
            "param": null,
            "event_id": client_event,
        });
        self.event("error", json!({ "error": error }))
    }
}

/// Bytes of text in a conversation item (its content's `text` and `transcript` strings).
fn text_bytes(item: &Value) -> u64 {
    let Some(content) = item.get("content").and_then(Value::as_array) else {
        return 0;
    };
    content
        .iter()
        .flat_map(|part| ["text", "transcript"].map(|k| part.get(k)))
        .flatten()
        .filter_map(Value::as_str)
        .map(|s| s.len() as u64)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(beta: bool) -> RealtimeSession {
        RealtimeSession::new(4, beta, "m".to_owned(), "AAAA".into())
    }

    fn parsed(out: &[Bytes]) -> Vec<Value> {
        out.iter()
            .map(|m| serde_json::from_slice(m).unwrap())
            .collect()
    }

    #[test]
    fn a_session_says_hello_takes_updates_items_and_responses() {
        let mut s = session(false);
        let mut out = Vec::new();
        s.greeting(&mut out);
        let update =
            br#"{"type":"session.update","session":{"type":"realtime","output_modalities":["text"]}}"#;
        assert!(s.on_message(update, &mut out).is_none());
        let item = br#"{"type":"conversation.item.create","item":{"type":"message","role":"user","content":[{"type":"input_text","text":"12345678"}]}}"#;
        assert!(s.on_message(item, &mut out).is_none());
        let events = parsed(&out);
        let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "session.created",
                "session.updated",
                "conversation.item.added",
                "conversation.item.done"
            ]
        );
        assert_eq!(events[0]["session"]["output_modalities"], json!(["audio"]));
        assert_eq!(events[1]["session"]["output_modalities"], json!(["text"]));
        assert_eq!(events[2]["item"]["id"], "item_sim_s4_1");
        let create = br#"{"type":"response.create","response":{"max_output_tokens":5,"output_modalities":["audio"]}}"#;
        let Some(Ask::Create(request, style)) = s.on_message(create, &mut out) else {
            panic!("no response");
        };
        assert_eq!(request.max_tokens, Some(5));
        assert_eq!(request.prompt_bytes, 8, "the conversation is the prompt");
        assert!(style.audio.is_some(), "the response's own modality wins");
        let plain = br#"{"type":"response.create"}"#;
        let Some(Ask::Create(_, style)) = s.on_message(plain, &mut out) else {
            panic!("no response");
        };
        assert!(style.audio.is_none(), "the session writes text");
        assert!(matches!(
            s.on_message(br#"{"type":"response.cancel"}"#, &mut out),
            Some(Ask::Cancel)
        ));
    }

    #[test]
    fn the_beta_interface_and_errors() {
        let mut s = session(true);
        let mut out = Vec::new();
        s.greeting(&mut out);
        let item = br#"{"type":"conversation.item.create","item":{"id":"mine","type":"message","content":[]}}"#;
        s.on_message(item, &mut out);
        s.busy(9, &mut out);
        s.nothing_to_cancel(&mut out);
        s.cancelled(9, &mut out);
        s.on_message(
            br#"{"type":"transcription_session.update","event_id":"c1"}"#,
            &mut out,
        );
        let events = parsed(&out);
        assert_eq!(events[0]["session"]["modalities"], json!(["text", "audio"]));
        assert_eq!(events[1]["type"], "conversation.item.created");
        assert_eq!(events[1]["item"]["id"], "mine");
        assert_eq!(
            events[2]["error"]["code"],
            "conversation_already_has_active_response"
        );
        assert_eq!(events[3]["error"]["code"], "response_cancel_not_active");
        assert_eq!(events[4]["type"], "response.done");
        assert_eq!(events[4]["response"]["status"], "cancelled");
        assert_eq!(events[4]["response"]["id"], "resp_sim_9");
        assert_eq!(events[5]["error"]["event_id"], "c1");
        let ids: std::collections::BTreeSet<&str> = events
            .iter()
            .map(|e| e["event_id"].as_str().unwrap())
            .collect();
        assert_eq!(ids.len(), events.len());
    }
}
