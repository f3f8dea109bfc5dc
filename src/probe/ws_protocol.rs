//! The two WebSocket APIs the probe drives (`--websocket`): what it sends for one response, and
//! how it reads what comes back.
//!
//! - The Responses API's WebSocket mode (`/v1/responses`): one `response.create` message per
//!   response; the response ends with `response.completed`, `response.incomplete`,
//!   `response.failed`, or an `error` message.
//! - The Realtime API (`/v1/realtime`): the request's messages as `conversation.item.create`s,
//!   then a `response.create`; the response ends with `response.done` or an `error`.
//!
//! The request is the body the probe would POST (the default chat request, `--body`, a
//! `--dataset` line), turned into these messages once before the run; a body that is a client
//! event already (it has a `type`) is sent as it is. Token events are found by the proxy's own
//! accountants ([`ResponsesAccounting`], [`RealtimeAccounting`]) on each message's JSON, so the
//! client's figures line up with the proxy's. The phase of a token event is read from the
//! message's `type`: reasoning deltas, function-call argument deltas, and content (text, a
//! transcript, audio).

use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::stream::Phase;
use crate::format::{Accounting, Classified, Format, RealtimeAccounting, ThinkState};
use crate::scan::Event;

/// Which WebSocket API a run speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WsProtocol {
    /// The Responses API's WebSocket mode (`/v1/responses`).
    Responses,
    /// The Realtime API (`/v1/realtime`).
    Realtime,
}

/// A request body that cannot become the API's messages: a usage error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the request body cannot be sent over the WebSocket: {0}")]
pub struct BodyError(String);

// === impl WsProtocol ===

impl WsProtocol {
    /// The API a URL path names (`…/realtime`, `…/responses`), if it names one.
    pub fn from_path(path: &str) -> Option<WsProtocol> {
        let path = path.trim_end_matches('/');
        if path.ends_with("/realtime") {
            Some(WsProtocol::Realtime)
        } else if path.ends_with("/responses") {
            Some(WsProtocol::Responses)
        } else {
            None
        }
    }

    /// The name in reports and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            WsProtocol::Responses => "responses",
            WsProtocol::Realtime => "realtime",
        }
    }
}

/// How the Realtime API's responses are asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RealtimeAsk {
    /// Spoken responses (audio and its transcript) rather than text.
    pub audio: bool,
    /// The beta interface's field names (`modalities`, `max_response_output_tokens`), for a
    /// run that sends `OpenAI-Beta: realtime=v1`.
    pub beta: bool,
}

/// The messages that ask for one response, from a request `body`.
pub fn messages_for(
    protocol: WsProtocol,
    body: &[u8],
    realtime: RealtimeAsk,
) -> Result<Vec<Bytes>, BodyError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| BodyError(format!("it is not JSON ({e})")))?;
    let Value::Object(mut fields) = value else {
        return Err(BodyError("it is not a JSON object".to_owned()));
    };
    if fields.contains_key("type") {
        return Ok(vec![Bytes::copy_from_slice(body)]);
    }
    match protocol {
        WsProtocol::Responses => Ok(vec![response_create(&mut fields)]),
        WsProtocol::Realtime => Ok(realtime_messages(&fields, realtime)),
    }
}

/// A Responses `response.create` from a request body (a chat request's `messages` become the
/// `input`, its `max_tokens` the `max_output_tokens`; the transport's fields go).
fn response_create(fields: &mut Map<String, Value>) -> Bytes {
    if let Some(messages) = fields.remove("messages") {
        fields.entry("input").or_insert(messages);
    }
    if let Some(max) = fields.remove("max_tokens") {
        fields.entry("max_output_tokens").or_insert(max);
    }
    for transport in ["stream", "stream_options", "background", "ignore_eos"] {
        fields.remove(transport);
    }
    let mut event = Map::new();
    event.insert("type".to_owned(), json!("response.create"));
    event.extend(std::mem::take(fields));
    Bytes::from(Value::Object(event).to_string())
}

/// A Realtime conversation item per chat message, then a `response.create` with the output
/// modality and limit.
fn realtime_messages(fields: &Map<String, Value>, ask: RealtimeAsk) -> Vec<Bytes> {
    let mut out = Vec::new();
    let messages = fields.get("messages").and_then(Value::as_array);
    for message in messages.into_iter().flatten() {
        let role = message
            .get("role")
            .and_then(Value::as_str)
            .unwrap_or("user");
        let text = match message.get("content") {
            Some(Value::String(text)) => text.clone(),
            Some(other) => other.to_string(),
            None => String::new(),
        };
        let kind = if role == "assistant" {
            "output_text"
        } else {
            "input_text"
        };
        let item = json!({
            "type": "conversation.item.create",
            "item": {"type": "message", "role": role, "content": [{"type": kind, "text": text}]},
        });
        out.push(Bytes::from(item.to_string()));
    }
    let mut response = Map::new();
    let (modalities_key, limit_key) = if ask.beta {
        ("modalities", "max_response_output_tokens")
    } else {
        ("output_modalities", "max_output_tokens")
    };
    let modalities = match (ask.audio, ask.beta) {
        (true, true) => json!(["text", "audio"]),
        (true, false) => json!(["audio"]),
        (false, _) => json!(["text"]),
    };
    response.insert(modalities_key.to_owned(), modalities);
    if let Some(max) = fields
        .get("max_tokens")
        .or_else(|| fields.get("max_output_tokens"))
    {
        response.insert(limit_key.to_owned(), max.clone());
    }
    let create = json!({"type": "response.create", "response": response});
    out.push(Bytes::from(create.to_string()));
    out
}

/// What one server message means for the response being read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message {
    /// The message is a token event, of this phase.
    pub token_event: Option<Phase>,
    /// Tokens the event carries as the format says (1 per token event otherwise).
    pub tokens: Option<u32>,
    /// The response's output-token total, when the message reports it.
    pub usage_total: Option<u64>,
    /// The message ends the response.
    pub end: bool,
    /// The message reports an error (it also ends the response: the probe runs one at a time).
    pub error: bool,
    /// The message could not be parsed.
    pub unparsed: bool,
}

/// Reads the server messages of one socket with the API's accountant.
#[derive(Debug)]
pub enum MessageReader {
    /// The Responses accountant, through the proxy's `Accounting`.
    Responses(Accounting),
    /// The Realtime accountant.
    Realtime(RealtimeAccounting),
}

// === impl MessageReader ===

impl MessageReader {
    /// A reader for `protocol`.
    pub fn new(protocol: WsProtocol) -> Self {
        match protocol {
            WsProtocol::Responses => {
                MessageReader::Responses(Accounting::for_format(Format::Responses))
            }
            WsProtocol::Realtime => MessageReader::Realtime(RealtimeAccounting),
        }
    }

    /// Reads one text message of the response whose `<think>` reading is `think`.
    pub fn read(&mut self, think: &mut ThinkState, message: &[u8]) -> Message {
        let event = Event {
            kind: b"",
            data: message,
            truncated: false,
        };
        let classified: Classified<'_> = match self {
            MessageReader::Responses(accounting) => accounting.classify(&event),
            MessageReader::Realtime(accounting) => accounting.classify(&event),
        };
        let kind = message_type(message);
        let error = classified.error || kind == Some("error");
        Message {
            token_event: classified.token_event.then(|| think.phase(&classified)),
            tokens: classified.tokens,
            usage_total: classified.usage_total,
            end: classified.end || error,
            error,
            unparsed: classified.unparsed,
        }
    }
}

/// The `type` of a message, borrowed (the other fields are skipped unread).
fn message_type(message: &[u8]) -> Option<&str> {
    #[derive(serde::Deserialize)]
    struct Typed<'a> {
        #[serde(borrow, rename = "type")]
        kind: Option<&'a str>,
    }
    serde_json::from_slice::<Typed<'_>>(message).ok()?.kind
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(messages: &[Bytes]) -> Vec<Value> {
        messages
            .iter()
            .map(|m| serde_json::from_slice(m).unwrap())
            .collect()
    }

    const CHAT: &[u8] = br#"{"model":"m","messages":[{"role":"user","content":"Hi"}],"max_tokens":9,"stream":true,"stream_options":{"include_usage":true}}"#;

    #[test]
    fn a_chat_request_becomes_a_response_create() {
        let messages = messages_for(WsProtocol::Responses, CHAT, RealtimeAsk::default()).unwrap();
        let create = &parsed(&messages)[0];
        assert_eq!(create["type"], "response.create");
        assert_eq!(create["model"], "m");
        assert_eq!(create["input"][0]["content"], "Hi");
        assert_eq!(create["max_output_tokens"], 9);
        assert!(create.get("stream").is_none() && create.get("stream_options").is_none());
        let own = br#"{"type":"response.create","model":"x","stream":true}"#;
        let as_is = messages_for(WsProtocol::Responses, own, RealtimeAsk::default()).unwrap();
        assert_eq!(as_is, [Bytes::from_static(own)]);
        assert!(messages_for(WsProtocol::Responses, b"[1]", RealtimeAsk::default()).is_err());
    }

    #[test]
    fn a_chat_request_becomes_conversation_items_and_a_response_create() {
        let ask = RealtimeAsk {
            audio: true,
            beta: false,
        };
        let messages = parsed(&messages_for(WsProtocol::Realtime, CHAT, ask).unwrap());
        assert_eq!(messages[0]["type"], "conversation.item.create");
        assert_eq!(messages[0]["item"]["content"][0]["text"], "Hi");
        assert_eq!(messages[1]["type"], "response.create");
        assert_eq!(
            messages[1]["response"]["output_modalities"],
            json!(["audio"])
        );
        assert_eq!(messages[1]["response"]["max_output_tokens"], 9);
        let beta = RealtimeAsk {
            audio: false,
            beta: true,
        };
        let messages = parsed(&messages_for(WsProtocol::Realtime, CHAT, beta).unwrap());
        assert_eq!(messages[1]["response"]["modalities"], json!(["text"]));
        assert_eq!(messages[1]["response"]["max_response_output_tokens"], 9);
    }

    #[test]
    fn messages_are_read_with_their_phase_and_end() {
        let mut reader = MessageReader::new(WsProtocol::Responses);
        let mut think = ThinkState::default();
        let text = reader.read(
            &mut think,
            br#"{"type":"response.output_text.delta","delta":"Hi"}"#,
        );
        assert_eq!(text.token_event, Some(Phase::Content));
        let reasoning = reader.read(
            &mut think,
            br#"{"type":"response.reasoning_text.delta","delta":"x"}"#,
        );
        assert_eq!(reasoning.token_event, Some(Phase::Reasoning));
        let args = reader.read(
            &mut think,
            br#"{"type":"response.function_call_arguments.delta","delta":"{"}"#,
        );
        assert_eq!(args.token_event, Some(Phase::ToolCall));
        let done = reader.read(
            &mut think,
            br#"{"type":"response.completed","response":{"status":"completed","usage":{"output_tokens":3}}}"#,
        );
        assert!(done.end && !done.error);
        assert_eq!(done.usage_total, Some(3));
        let error = reader.read(
            &mut think,
            br#"{"type":"error","status":400,"error":{"message":"no"}}"#,
        );
        assert!(error.end && error.error);
        let mut realtime = MessageReader::new(WsProtocol::Realtime);
        let audio = realtime.read(
            &mut think,
            br#"{"type":"response.output_audio.delta","delta":"AAAA"}"#,
        );
        assert_eq!(audio.token_event, Some(Phase::Content));
        let done = realtime.read(
            &mut think,
            br#"{"type":"response.done","response":{"status":"completed"}}"#,
        );
        assert!(done.end);
        let summary = br#"{"type":"response.reasoning_summary_text.delta","delta":"x"}"#;
        let summary = reader.read(&mut think, summary);
        assert_eq!(summary.token_event, Some(Phase::Reasoning));

        // Content that carries the thinking inline, read with the route's or probe's tags.
        let tags = crate::format::ThinkTags::new("<r>", "</r>").map(std::sync::Arc::new);
        let settings = crate::format::ThinkSettings {
            tags,
            ..Default::default()
        };
        let mut think = ThinkState::new(&settings);
        let phases: Vec<_> = [r#"<r>hm"#, r#"</r>"#, r#"Hi"#]
            .iter()
            .map(|delta| {
                let event = format!(r#"{{"type":"response.output_text.delta","delta":"{delta}"}}"#);
                reader.read(&mut think, event.as_bytes()).token_event
            })
            .collect();
        let (r, c) = (Some(Phase::Reasoning), Some(Phase::Content));
        assert_eq!(phases, [r, r, c]);
    }
}
