//! What the sim reads from a generation request: whether to stream, how many tokens, whether
//! usage was asked for, how long the prompt is, and what the output's phases should be (the
//! `sim_` fields, and the fields with which each API caps or switches off thinking). Everything
//! else in the body is ignored.

use std::time::Duration;

use clap::ValueEnum;
use serde_json::Value;

use super::config::{ReasoningField, ResponsesReasoning, ThinkTags};
use super::shapes::Api;

/// The parts of a generation request that change the response.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct GenRequest {
    /// The request's own phases, over the sim's flags.
    pub phases: PhaseRequest,
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

/// What a request says about its output's phases: `sim_` fields that set them outright, and the
/// API's own budget for thinking.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PhaseRequest {
    /// `sim_reasoning_tokens`.
    pub reasoning_tokens: Option<u64>,
    /// The most reasoning tokens the API's own fields allow (0: thinking switched off):
    /// `thinking_token_budget` and `chat_template_kwargs.enable_thinking` (vLLM), Anthropic's
    /// `thinking`, Ollama's `think`, Gemini's `thinkingConfig.thinkingBudget`, the Responses API's
    /// `reasoning.effort: "none"`.
    pub reasoning_budget: Option<u64>,
    /// `sim_think_pause_ms`.
    pub think_pause: Option<Duration>,
    /// `sim_tool_calls`.
    pub tool_calls: Option<u64>,
    /// `sim_tool_call_tokens` (at least 1).
    pub tool_call_tokens: Option<u64>,
    /// `sim_think_tags`: `parser`, `inline` or `open-in-prompt`.
    pub think_tags: Option<ThinkTags>,
    /// `sim_reasoning_field`: `reasoning_content`, `reasoning` or `both`.
    pub reasoning_field: Option<ReasoningField>,
    /// `sim_responses_reasoning`: `summary` or `text`.
    pub responses_reasoning: Option<ResponsesReasoning>,
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
        phases: phases(&value)?,
        ..GenRequest::default()
    };
    let text = |keys: &[&str]| keys.iter().map(|k| text_bytes(fields.get(*k))).sum::<u64>();
    match api {
        Api::Tgi => {
            request.stream = true;
            request.max_tokens = count(&value, &["parameters", "max_new_tokens"])?;
            request.prompt_bytes = text(&["inputs"]);
        }
        Api::Chat | Api::Completions | Api::Anthropic => {
            request.stream = stream(fields.get("stream"), false)?;
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
            request.prompt_bytes = text(&["messages", "prompt", "system"]);
        }
        Api::Responses => {
            request.stream = stream(fields.get("stream"), false)?;
            request.max_tokens = count(&value, &["max_output_tokens"])?;
            request.prompt_bytes = text(&["input", "instructions"]);
        }
        Api::Ollama => {
            request.stream = stream(fields.get("stream"), true)?;
            request.max_tokens = limit(&value, &["options", "num_predict"])?;
            request.prompt_bytes = text(&["messages", "prompt", "system"]);
        }
        Api::Gemini => {
            request.max_tokens = count(&value, &["generationConfig", "maxOutputTokens"])?;
            request.prompt_bytes = text(&["contents", "systemInstruction"]);
        }
        Api::Realtime => {
            // The `response` of a `response.create`: always streamed; `"inf"` is no limit.
            request.stream = true;
            request.max_tokens = match fields.get("max_output_tokens") {
                Some(Value::String(s)) if s == "inf" => None,
                Some(_) => count(&value, &["max_output_tokens"])?,
                None => limit_or_inf(&value, "max_response_output_tokens")?,
            };
            request.prompt_bytes = text(&["instructions", "input"]);
        }
    }
    request.phases.reasoning_budget = reasoning_budget(api, &value)?;
    Ok(request)
}

/// `stream` as a boolean, `default` when absent.
fn stream(value: Option<&Value>, default: bool) -> Result<bool, BadRequest> {
    match value {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(BadRequest("`stream` must be true or false.".to_owned())),
    }
}

/// The `sim_` fields that shape the phases.
fn phases(value: &Value) -> Result<PhaseRequest, BadRequest> {
    let tool_call_tokens = count(value, &["sim_tool_call_tokens"])?;
    if tool_call_tokens == Some(0) {
        return Err(BadRequest(
            "`sim_tool_call_tokens` must be at least 1.".to_owned(),
        ));
    }
    Ok(PhaseRequest {
        reasoning_tokens: count(value, &["sim_reasoning_tokens"])?,
        reasoning_budget: None,
        think_pause: count(value, &["sim_think_pause_ms"])?.map(Duration::from_millis),
        tool_calls: count(value, &["sim_tool_calls"])?,
        tool_call_tokens,
        think_tags: choice(value, "sim_think_tags")?,
        reasoning_field: choice(value, "sim_reasoning_field")?,
        responses_reasoning: choice(value, "sim_responses_reasoning")?,
    })
}

/// The value of `key` among a flag's values (`reasoning_content` and `reasoning-content` alike).
fn choice<T: ValueEnum>(value: &Value, key: &str) -> Result<Option<T>, BadRequest> {
    let Some(raw) = value.get(key).filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let names = || {
        T::value_variants()
            .iter()
            .filter_map(|v| v.to_possible_value())
            .map(|v| format!("`{}`", v.get_name()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    raw.as_str()
        .and_then(|s| T::from_str(&s.replace('_', "-"), false).ok())
        .map(Some)
        .ok_or_else(|| BadRequest(format!("`{key}` must be one of {}.", names())))
}

/// The cap an API's own fields put on the reasoning (0: thinking off), if any.
fn reasoning_budget(api: Api, value: &Value) -> Result<Option<u64>, BadRequest> {
    let off = |on: Option<bool>| (on == Some(false)).then_some(0);
    let budget = match api {
        Api::Chat | Api::Completions => {
            let enabled = value
                .pointer("/chat_template_kwargs/enable_thinking")
                .and_then(Value::as_bool);
            off(enabled).or(count(value, &["thinking_token_budget"])?)
        }
        Api::Anthropic => match value.pointer("/thinking/type").and_then(Value::as_str) {
            Some("disabled") => Some(0),
            _ => count(value, &["thinking", "budget_tokens"])?,
        },
        Api::Ollama => off(value.get("think").and_then(Value::as_bool)),
        Api::Gemini => limit(
            value,
            &["generationConfig", "thinkingConfig", "thinkingBudget"],
        )?,
        Api::Responses => {
            let effort = value.pointer("/reasoning/effort").and_then(Value::as_str);
            (effort == Some("none")).then_some(0)
        }
        Api::Tgi | Api::Realtime => None,
    };
    Ok(budget)
}

/// An integer at `path` where a negative value means "no limit" (Ollama's `num_predict: -1`,
/// Gemini's dynamic `thinkingBudget: -1`).
fn limit(value: &Value, path: &[&str]) -> Result<Option<u64>, BadRequest> {
    match at_path(value, path) {
        Some(Value::Number(n)) if n.as_i64().is_some_and(|n| n < 0) => Ok(None),
        _ => count(value, path),
    }
}

/// The beta Realtime interface's `max_response_output_tokens`: a count, or `"inf"` for none.
fn limit_or_inf(value: &Value, key: &str) -> Result<Option<u64>, BadRequest> {
    match value.get(key) {
        Some(Value::String(s)) if s == "inf" => Ok(None),
        _ => count(value, &[key]),
    }
}

/// The value at `path`, if every key on the way is there.
fn at_path<'a>(value: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(value, |at, key| at.get(key))
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
    match at_path(value, path) {
        None | Some(Value::Null) => Ok(None),
        Some(other) => other.as_u64().map(Some).ok_or_else(|| {
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
    use proptest::prelude::*;

    const APIS: [Api; 8] = Api::ALL;

    /// JSON made of the field names the sim reads, with values of every type, nested.
    fn request_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            (0u64..5000).prop_map(Value::from),
            prop::sample::select(vec![
                "",
                "inline",
                "open_in_prompt",
                "both",
                "text",
                "none",
                "disabled"
            ])
            .prop_map(Value::from),
        ];
        let keys = prop::sample::select(vec![
            "sim_reasoning_tokens",
            "sim_think_pause_ms",
            "sim_tool_calls",
            "sim_tool_call_tokens",
            "sim_think_tags",
            "sim_reasoning_field",
            "sim_responses_reasoning",
            "thinking_token_budget",
            "chat_template_kwargs",
            "enable_thinking",
            "thinking",
            "type",
            "budget_tokens",
            "think",
            "generationConfig",
            "thinkingConfig",
            "thinkingBudget",
            "maxOutputTokens",
            "reasoning",
            "effort",
            "options",
            "num_predict",
            "max_tokens",
            "max_output_tokens",
            "stream",
            "input",
            "messages",
            "contents",
        ]);
        leaf.prop_recursive(3, 24, 6, move |inner| {
            prop::collection::vec((keys.clone(), inner), 0..6).prop_map(|pairs| {
                Value::Object(pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
            })
        })
    }

    proptest! {
        /// Whatever a client sends, the sim reads it or says why not; it never panics, and what
        /// it accepts keeps the tool calls' tokens at 1 or more.
        #[test]
        fn any_body_is_read_or_refused(api in 0..APIS.len(), body in request_json(), bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            let _ = parse(APIS[api], &bytes);
            let text = serde_json::to_vec(&body).unwrap();
            if let Ok(request) = parse(APIS[api], &text) {
                prop_assert_ne!(request.phases.tool_call_tokens, Some(0));
            }
        }
    }

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
    fn sim_fields_set_the_phases() {
        let body = br#"{"sim_reasoning_tokens":40,"sim_think_pause_ms":500,"sim_tool_calls":2,
            "sim_tool_call_tokens":6,"sim_think_tags":"open-in-prompt",
            "sim_reasoning_field":"reasoning_content","sim_responses_reasoning":"text"}"#;
        let phases = parse(Api::Chat, body).unwrap().phases;
        assert_eq!(phases.reasoning_tokens, Some(40));
        assert_eq!(phases.think_pause, Some(Duration::from_millis(500)));
        assert_eq!(
            (phases.tool_calls, phases.tool_call_tokens),
            (Some(2), Some(6))
        );
        assert_eq!(phases.think_tags, Some(ThinkTags::OpenInPrompt));
        assert_eq!(
            phases.reasoning_field,
            Some(ReasoningField::ReasoningContent)
        );
        assert_eq!(phases.responses_reasoning, Some(ResponsesReasoning::Text));
        let e = parse(Api::Chat, br#"{"sim_think_tags":"sometimes"}"#).unwrap_err();
        assert!(
            e.0.contains("`parser`, `inline`, `open-in-prompt`"),
            "{}",
            e.0
        );
        assert!(parse(Api::Chat, br#"{"sim_tool_call_tokens":0}"#).is_err());
        assert!(parse(Api::Chat, br#"{"sim_think_pause_ms":"1s"}"#).is_err());
    }

    #[test]
    fn each_api_caps_or_switches_off_thinking_its_own_way() {
        let budget = |api: Api, body: &[u8]| parse(api, body).unwrap().phases.reasoning_budget;
        assert_eq!(
            budget(Api::Chat, br#"{"thinking_token_budget":32}"#),
            Some(32)
        );
        let off =
            br#"{"chat_template_kwargs":{"enable_thinking":false},"thinking_token_budget":9}"#;
        assert_eq!(budget(Api::Chat, off), Some(0));
        let anthropic = br#"{"thinking":{"type":"enabled","budget_tokens":1024}}"#;
        assert_eq!(budget(Api::Anthropic, anthropic), Some(1024));
        assert_eq!(
            budget(Api::Anthropic, br#"{"thinking":{"type":"disabled"}}"#),
            Some(0)
        );
        assert_eq!(budget(Api::Ollama, br#"{"think":false}"#), Some(0));
        assert_eq!(budget(Api::Ollama, br#"{"think":true}"#), None);
        let gemini = br#"{"generationConfig":{"thinkingConfig":{"thinkingBudget":-1}}}"#;
        assert_eq!(budget(Api::Gemini, gemini), None);
        let gemini = br#"{"generationConfig":{"thinkingConfig":{"thinkingBudget":0}}}"#;
        assert_eq!(budget(Api::Gemini, gemini), Some(0));
        assert_eq!(
            budget(Api::Responses, br#"{"reasoning":{"effort":"none"}}"#),
            Some(0)
        );
        assert_eq!(
            budget(Api::Responses, br#"{"reasoning":{"effort":"high"}}"#),
            None
        );
    }

    #[test]
    fn the_new_apis_read_their_own_fields() {
        let r = parse(
            Api::Responses,
            br#"{"stream":true,"max_output_tokens":9,"input":"abcdefgh"}"#,
        )
        .unwrap();
        assert!(r.stream);
        assert_eq!((r.max_tokens, r.prompt_bytes), (Some(9), 8));
        let o = parse(
            Api::Ollama,
            br#"{"messages":[{"role":"user","content":"hi"}]}"#,
        )
        .unwrap();
        assert!(o.stream, "Ollama streams unless told not to");
        assert_eq!(o.max_tokens, None);
        let o = parse(
            Api::Ollama,
            br#"{"stream":false,"options":{"num_predict":-1}}"#,
        )
        .unwrap();
        assert!(!o.stream);
        assert_eq!(o.max_tokens, None);
        let o = parse(Api::Ollama, br#"{"options":{"num_predict":12}}"#).unwrap();
        assert_eq!(o.max_tokens, Some(12));
        let body = br#"{"contents":[{"role":"user","parts":[{"text":"abcd"}]}],
            "generationConfig":{"maxOutputTokens":20}}"#;
        let g = parse(Api::Gemini, body).unwrap();
        assert_eq!((g.max_tokens, g.prompt_bytes), (Some(20), 4));
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
