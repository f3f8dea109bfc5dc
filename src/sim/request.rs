//! What the sim reads from a generation request: whether to stream, how many tokens, whether
//! usage was asked for, and how long the prompt is. Everything else in the body is ignored.

use serde_json::Value;

use super::shapes::Api;

/// The parts of a generation request that change the response.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct GenRequest {
    /// The client asked for a stream (always true for TGI's `/generate_stream`).
    pub stream: bool,
    /// The output limit the request set, if it set one.
    pub max_tokens: Option<u64>,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// `stream_options.continuous_usage_stats` (vLLM).
    pub continuous_usage: bool,
    /// Bytes of prompt text: the messages' (or prompt's, or inputs') strings.
    pub prompt_bytes: u64,
    /// `sim_prompt_tokens`: the prompt's length in tokens, said outright (a sim extension, so a
    /// test can send a long prompt without its bytes).
    pub prompt_tokens: Option<u64>,
    /// `sim_stall_at`: a stall (`--stall` long) before this token event (from 1) of this stream
    /// only (a sim extension, so a test can place stream-local stalls where it wants them).
    pub stall_at: Option<u64>,
}

/// Why a request body was refused; the message goes back to the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct BadRequest(pub String);

/// Reads a request body for `api`.
pub(crate) fn parse(api: Api, body: &[u8]) -> Result<GenRequest, BadRequest> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| BadRequest(format!("The request body is not valid JSON: {e}.")))?;
    let Value::Object(fields) = &value else {
        return Err(BadRequest(
            "The request body must be a JSON object.".to_owned(),
        ));
    };
    let mut request = GenRequest {
        prompt_tokens: count(&value, &["sim_prompt_tokens"])?,
        stall_at: count(&value, &["sim_stall_at"])?,
        ..GenRequest::default()
    };
    match api {
        Api::Tgi => {
            request.stream = true;
            request.max_tokens = count(&value, &["parameters", "max_new_tokens"])?;
            request.prompt_bytes = text_bytes(fields.get("inputs"));
        }
        Api::Chat | Api::Completions | Api::Anthropic => {
            request.stream = match fields.get("stream") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => return Err(BadRequest("`stream` must be true or false.".to_owned())),
            };
            request.max_tokens = match count(&value, &["max_completion_tokens"])? {
                Some(n) => Some(n),
                None => count(&value, &["max_tokens"])?,
            };
            let options = |name: &str| {
                value
                    .get("stream_options")
                    .and_then(|o| o.get(name))
                    .and_then(Value::as_bool)
                    .unwrap_or(false)
            };
            request.include_usage = options("include_usage");
            request.continuous_usage = options("continuous_usage_stats");
            request.prompt_bytes = text_bytes(fields.get("messages"))
                + text_bytes(fields.get("prompt"))
                + text_bytes(fields.get("system"));
        }
    }
    Ok(request)
}

// === impl GenRequest ===

impl GenRequest {
    /// Prompt tokens: `sim_prompt_tokens` when given, else a token per 4 bytes (at least 1).
    pub(crate) fn prompt_tokens(&self) -> u64 {
        self.prompt_tokens
            .unwrap_or_else(|| self.prompt_bytes.div_ceil(4))
            .max(1)
    }
}

/// The non-negative integer at `path`, if present and not null.
fn count(value: &Value, path: &[&str]) -> Result<Option<u64>, BadRequest> {
    let mut at = value;
    for key in path {
        match at.get(key) {
            Some(next) => at = next,
            None => return Ok(None),
        }
    }
    match at {
        Value::Null => Ok(None),
        other => other.as_u64().map(Some).ok_or_else(|| {
            BadRequest(format!(
                "`{}` must be a non-negative integer.",
                path.join(".")
            ))
        }),
    }
}

/// Bytes of every string inside `value` (message contents, content parts, prompts), except
/// the values of `role` and `type` keys, which are not prompt text.
fn text_bytes(value: Option<&Value>) -> u64 {
    match value {
        Some(Value::String(s)) => s.len() as u64,
        Some(Value::Array(items)) => items.iter().map(|v| text_bytes(Some(v))).sum(),
        Some(Value::Object(fields)) => fields
            .iter()
            .filter(|(k, _)| k.as_str() != "role" && k.as_str() != "type")
            .map(|(_, v)| text_bytes(Some(v)))
            .sum(),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_request() {
        let body = br#"{"model":"x","stream":true,"max_tokens":40,
            "stream_options":{"include_usage":true},
            "messages":[{"role":"user","content":"12345678"},
                        {"role":"user","content":[{"type":"text","text":"abcd"}]}]}"#;
        let r = parse(Api::Chat, body).unwrap();
        assert!(r.stream && r.include_usage && !r.continuous_usage);
        assert_eq!(r.max_tokens, Some(40));
        assert_eq!(r.prompt_bytes, 12);
        assert_eq!(r.prompt_tokens(), 3);
    }

    #[test]
    fn sim_prompt_tokens_says_the_length_outright() {
        let body = br#"{"messages":[{"role":"user","content":"hi"}],"sim_prompt_tokens":4000}"#;
        assert_eq!(parse(Api::Chat, body).unwrap().prompt_tokens(), 4000);
        let body = br#"{"inputs":"hi","sim_prompt_tokens":7}"#;
        assert_eq!(parse(Api::Tgi, body).unwrap().prompt_tokens(), 7);
        assert!(parse(Api::Chat, br#"{"sim_prompt_tokens":"x"}"#).is_err());
        let body = br#"{"sim_stall_at":12}"#;
        assert_eq!(parse(Api::Chat, body).unwrap().stall_at, Some(12));
    }

    #[test]
    fn max_completion_tokens_wins() {
        let body = br#"{"max_tokens":40,"max_completion_tokens":7}"#;
        assert_eq!(parse(Api::Chat, body).unwrap().max_tokens, Some(7));
    }

    #[test]
    fn tgi_request() {
        let body = br#"{"inputs":"hello world!","parameters":{"max_new_tokens":9}}"#;
        let r = parse(Api::Tgi, body).unwrap();
        assert!(r.stream);
        assert_eq!(r.max_tokens, Some(9));
        assert_eq!(r.prompt_bytes, 12);
    }

    #[test]
    fn bad_bodies_are_refused() {
        assert!(parse(Api::Chat, b"{not json")
            .unwrap_err()
            .0
            .contains("not valid JSON"));
        assert!(parse(Api::Chat, b"[1]")
            .unwrap_err()
            .0
            .contains("JSON object"));
        let e = parse(Api::Chat, br#"{"max_tokens":-1}"#).unwrap_err();
        assert!(e.0.contains("max_tokens"));
        assert!(parse(Api::Chat, br#"{"stream":"yes"}"#).is_err());
    }
}
