//! The sim's HTTP surface: which path does what, and the ready-made (non-streamed) responses.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use serde_json::json;
use tokio::time::Instant;

use super::cadence::StreamCadence;
use super::config::SimConfig;
use super::phases::Output;
use super::replay::ReplayBody;
use super::request::{self, GenRequest};
use super::server::SimShared;
use super::shapes::{Api, Finish, RealtimeStyle, Wire};
use super::stats::StreamGuard;
use super::stream::{micros, SimBody, SimStream};
use super::timeline::Record;
use super::websocket::{is_upgrade, upgrade, Endpoint, NOT_AN_UPGRADE};

/// Largest request body read; a prompt beyond this is refused rather than buffered.
const MAX_REQUEST_BYTES: usize = 16 * 1024 * 1024;

/// The header that carries a response's stream sequence number, to join a client's
/// measurement with the sim's timeline.
pub const STREAM_HEADER: &str = "x-sim-stream";

/// The paths the sim serves, for a clear 405 on the wrong method.
const KNOWN_PATHS: [&str; 9] = [
    "/health",
    "/v1/models",
    "/v1/chat/completions",
    "/v1/completions",
    "/generate_stream",
    "/v1/messages",
    "/v1/responses",
    "/api/chat",
    "/v1/realtime",
];

/// Answers one request.
pub(crate) async fn handle(
    shared: Arc<SimShared>,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<SimBody>, Infallible> {
    let start = Instant::now();
    let path = req.uri().path();
    if let (&Method::GET, Some(endpoint)) = (req.method(), Endpoint::of(path)) {
        return Ok(websocket(&shared, endpoint, req));
    }
    let gemini = gemini_method(path);
    let api = match (req.method(), path) {
        (&Method::GET, "/health") => return Ok(full(StatusCode::OK, "text/plain", "ok")),
        (&Method::GET, "/v1/models") => return Ok(models(&shared)),
        (&Method::POST, "/v1/chat/completions") => Api::Chat,
        (&Method::POST, "/v1/completions") => Api::Completions,
        (&Method::POST, "/generate_stream") => Api::Tgi,
        (&Method::POST, "/v1/messages") => Api::Anthropic,
        (&Method::POST, "/v1/responses") => Api::Responses,
        (&Method::POST, "/api/chat") => Api::Ollama,
        (&Method::POST, _) if gemini.is_some() => Api::Gemini,
        (method, path) => {
            let known = KNOWN_PATHS.contains(&path) || gemini.is_some();
            let (status, kind) = if known {
                (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed")
            } else {
                (StatusCode::NOT_FOUND, "not_found")
            };
            let message = format!("The sim does not serve {method} {path}.");
            return Ok(error(Api::Chat, status, kind, &message));
        }
    };
    let gemini_stream = gemini == Some(GeminiMethod::Stream);
    if gemini_stream && !query_has(req.uri().query(), "alt=sse") {
        let message = "The sim streams Gemini as server-sent events only: add `?alt=sse`.";
        return Ok(error(
            api,
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            message,
        ));
    }
    let body = match Limited::new(req.into_body(), MAX_REQUEST_BYTES)
        .collect()
        .await
    {
        Ok(collected) => collected.to_bytes(),
        Err(e) => {
            let message = format!("The request body could not be read: {e}.");
            return Ok(error(
                api,
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                &message,
            ));
        }
    };
    let request = match request::parse(api, &body) {
        Ok(request) => GenRequest {
            stream: request.stream || gemini_stream,
            ..request
        },
        Err(e) => {
            return Ok(error(
                api,
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                &e.0,
            ));
        }
    };
    Ok(generate(shared, api, request, start).await)
}

/// A `GET` on a WebSocket endpoint: the upgrade, or why there is none.
fn websocket(
    shared: &Arc<SimShared>,
    endpoint: Endpoint,
    req: Request<hyper::body::Incoming>,
) -> Response<SimBody> {
    if !is_upgrade(&req) {
        let (status, message) = NOT_AN_UPGRADE;
        return error(
            Api::Responses,
            status,
            "websocket_upgrade_required",
            message,
        );
    }
    match upgrade(shared, endpoint, req) {
        Ok(response) => response,
        Err(reason) => {
            let message = format!("The WebSocket upgrade was refused: {reason}.");
            error(
                Api::Responses,
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                &message,
            )
        }
    }
}

/// Gemini's two generation methods, named at the end of the model's path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GeminiMethod {
    /// `:streamGenerateContent`.
    Stream,
    /// `:generateContent`.
    Whole,
}

/// The Gemini method of `/v1beta/models/{model}:{method}` (or `/v1/models/…`), if the path is one.
fn gemini_method(path: &str) -> Option<GeminiMethod> {
    let model = path
        .strip_prefix("/v1beta/models/")
        .or_else(|| path.strip_prefix("/v1/models/"))?;
    if model.ends_with(":streamGenerateContent") {
        Some(GeminiMethod::Stream)
    } else if model.ends_with(":generateContent") {
        Some(GeminiMethod::Whole)
    } else {
        None
    }
}

/// Whether the query string has the parameter `pair` (`alt=sse`).
fn query_has(query: Option<&str>, pair: &str) -> bool {
    query.is_some_and(|q| q.split('&').any(|p| p == pair))
}

/// Starts a generation: a stream body, or (not streamed) the whole answer after its time.
async fn generate(
    shared: Arc<SimShared>,
    api: Api,
    request: GenRequest,
    start: Instant,
) -> Response<SimBody> {
    let (seq, received_unix_us, guard) = begin(&shared, api);
    if let (Some(replay), true) = (&shared.config.replay, request.stream) {
        let body = ReplayBody::new(
            shared.clone(),
            replay.clone(),
            guard,
            start,
            received_unix_us,
            seq,
        );
        return streamed(SimBody::Replay(Box::new(body)), "text/event-stream", seq);
    }
    let (wire, cadence) = plan(
        &shared,
        api,
        &request,
        seq,
        received_unix_us,
        RealtimeStyle::default(),
    );
    if request.stream {
        let stream = SimStream::new(
            shared.clone(),
            wire,
            cadence,
            guard,
            start,
            received_unix_us,
        );
        let content_type = api.stream_content_type();
        return streamed(SimBody::Stream(Box::new(stream)), content_type, seq);
    }
    whole_answer(&shared, wire, cadence, guard, start).await
}

/// A generated stream for a request that came over a WebSocket (a Responses API
/// `response.create`, a Realtime response), arrived at `start`. Its frames are SSE events whose
/// data the WebSocket session sends as messages.
pub(crate) fn websocket_stream(
    shared: &Arc<SimShared>,
    api: Api,
    request: &GenRequest,
    realtime: RealtimeStyle,
    start: Instant,
) -> SimStream {
    let (seq, received_unix_us, guard) = begin(shared, api);
    let (wire, cadence) = plan(shared, api, request, seq, received_unix_us, realtime);
    SimStream::new(
        shared.clone(),
        wire,
        cadence,
        guard,
        start,
        received_unix_us,
    )
}

/// Numbers a new generation, logs its arrival and counts it started: its sequence number, its
/// arrival in wall-clock microseconds, and the guard that counts how it ends.
fn begin(shared: &Arc<SimShared>, api: Api) -> (u64, u64, StreamGuard) {
    let received_unix_us = micros(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default(),
    );
    let seq = shared.next_seq.fetch_add(1, Ordering::Relaxed);
    if let Some(timeline) = &shared.timeline {
        timeline.record(Record::Request {
            stream: seq,
            path: path_of(api),
            received_unix_us,
        });
    }
    (
        seq,
        received_unix_us,
        StreamGuard::start(shared.stats.clone()),
    )
}

/// What generation `seq` writes and when: its wire (the API's shape, its output and usage) and
/// its cadence.
fn plan(
    shared: &SimShared,
    api: Api,
    request: &GenRequest,
    seq: u64,
    received_unix_us: u64,
    realtime: RealtimeStyle,
) -> (Wire, StreamCadence) {
    let config = &shared.config;
    let wanted = request.max_tokens.unwrap_or(config.tokens).max(1);
    let tokens = wanted.min(config.max_tokens_cap);
    let output = plan_output(config, api, request, tokens);
    let finish = if output.tool_calls > 0 {
        Finish::ToolCalls
    } else if request.max_tokens.is_some() || wanted > tokens {
        Finish::Length
    } else {
        Finish::Stop
    };
    let prompt_tokens = request.prompt_tokens();
    let phases = &request.phases;
    let wire = Wire {
        api,
        seq,
        created: received_unix_us / 1_000_000,
        model_json: shared.model_json.clone(),
        word_seed: config.seed ^ seq.rotate_left(32),
        prompt_tokens,
        output,
        finish,
        usage: match config.usage {
            super::UsageMode::Always => true,
            super::UsageMode::Request => request.include_usage,
            super::UsageMode::Never => false,
        },
        continuous_usage: request.continuous_usage,
        reasoning_field: phases.reasoning_field.unwrap_or(config.reasoning_field),
        responses_reasoning: phases
            .responses_reasoning
            .unwrap_or(config.responses_reasoning),
        written: 0,
        realtime,
    };
    let prompt_cost = config
        .ttft_per_prompt_token
        .checked_mul(u32::try_from(prompt_tokens).unwrap_or(u32::MAX))
        .unwrap_or(Duration::MAX);
    let ttft = config.ttft.saturating_add(prompt_cost);
    let cadence = StreamCadence::new(config, seq, ttft, output)
        .with_stall_at(request.stall_at)
        .with_think_pause(phases.think_pause.unwrap_or(config.think_pause));
    (wire, cadence)
}

/// What a stream outputs: `content` answer tokens, and the reasoning and tool calls the flags or
/// the request ask for (each at most `--max-tokens-cap`), in the shape the API can carry.
fn plan_output(config: &SimConfig, api: Api, request: &GenRequest, content: u64) -> Output {
    let phases = &request.phases;
    let cap = config.max_tokens_cap;
    let mut reasoning = phases
        .reasoning_tokens
        .unwrap_or(config.reasoning_tokens)
        .min(cap);
    if !api.streams_reasoning() {
        reasoning = 0;
    }
    if let Some(budget) = phases.reasoning_budget {
        reasoning = reasoning.min(budget);
    }
    let tool_call_tokens = phases
        .tool_call_tokens
        .unwrap_or(config.tool_call_tokens)
        .clamp(1, cap);
    let tool_calls = if api.has_tool_calls() {
        phases
            .tool_calls
            .unwrap_or(config.tool_calls)
            .min(cap / tool_call_tokens)
    } else {
        0
    };
    Output {
        reasoning,
        content,
        tool_calls,
        tool_call_tokens,
        think_tags: api.think_tags(phases.think_tags.unwrap_or(config.think_tags)),
    }
}

/// The head of a streamed answer (generated or replayed): `content_type` (SSE, or Ollama's
/// NDJSON), not cached, and the stream's sequence number in [`STREAM_HEADER`].
fn streamed(body: SimBody, content_type: &'static str, seq: u64) -> Response<SimBody> {
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(STREAM_HEADER, HeaderValue::from(seq));
    response
}

/// Waits out every decode step, then answers with the whole output in one JSON document.
async fn whole_answer(
    shared: &SimShared,
    wire: Wire,
    mut cadence: StreamCadence,
    mut guard: StreamGuard,
    start: Instant,
) -> Response<SimBody> {
    while let Some(step) = cadence.next_step(&shared.config, guard.active()) {
        tokio::time::sleep_until(start + step.offset).await;
    }
    guard.complete();
    let body = wire.whole_body(&shared.config.model);
    let mut response = json_response(StatusCode::OK, &body);
    response
        .headers_mut()
        .insert(STREAM_HEADER, HeaderValue::from(wire.seq));
    response
}

/// `GET /v1/models`: the one configured model.
fn models(shared: &SimShared) -> Response<SimBody> {
    let body = json!({
        "object": "list",
        "data": [{
            "id": shared.config.model,
            "object": "model",
            "created": 0,
            "owned_by": "metronome-sim",
        }],
    });
    json_response(StatusCode::OK, &body)
}

/// An error in the API's own shape (Anthropic's differs from OpenAI's).
fn error(api: Api, status: StatusCode, kind: &str, message: &str) -> Response<SimBody> {
    let body = match api {
        Api::Anthropic => json!({
            "type": "error",
            "error": {"type": kind, "message": message},
        }),
        Api::Ollama => json!({ "error": message }),
        Api::Gemini => json!({
            "error": {"code": status.as_u16(), "message": message, "status": "INVALID_ARGUMENT"},
        }),
        _ => json!({
            "error": {"message": message, "type": kind, "param": null, "code": status.as_u16()},
        }),
    };
    json_response(status, &body)
}

/// A JSON response.
fn json_response(status: StatusCode, body: &serde_json::Value) -> Response<SimBody> {
    full(status, "application/json", body.to_string())
}

/// A ready-made response.
fn full(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<SimBody> {
    let mut response = Response::new(SimBody::Full(Some(body.into())));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// The route of each API, for the timeline.
fn path_of(api: Api) -> &'static str {
    match api {
        Api::Chat => "/v1/chat/completions",
        Api::Completions => "/v1/completions",
        Api::Tgi => "/generate_stream",
        Api::Anthropic => "/v1/messages",
        Api::Responses => "/v1/responses",
        Api::Ollama => "/api/chat",
        Api::Gemini => "/v1beta/models/*:streamGenerateContent",
        Api::Realtime => "/v1/realtime",
    }
}
