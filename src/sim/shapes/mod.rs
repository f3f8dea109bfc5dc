//! The wire formats the sim speaks, one module per API: OpenAI chat and completions chunks as
//! vLLM sends them ([`openai`]), TGI's native `/generate_stream` ([`tgi`]), Anthropic Messages
//! ([`anthropic`]), the OpenAI Responses API ([`responses`]), Ollama's native NDJSON ([`ollama`])
//! Gemini's `streamGenerateContent?alt=sse` ([`gemini`]) and the Realtime API's server events
//! ([`realtime`], sent over a WebSocket only).
//!
//! A stream is a preamble (events before the first token), one decode step after another and a
//! trailer (finish, usage, end marker). Its output runs in segments ([`Segment`]: a thinking block,
//! the text, each tool call); a format opens the first segment in the preamble, closes one and
//! opens the next in the step that crosses between them, and closes the last in the trailer.
//! Each piece is written straight into the frame's buffer: no intermediate values, so the only
//! allocation per frame is the frame itself. The text is pseudo-words (` idea17` while
//! thinking, ` tok17` in the answer, `arg17` in tool-call arguments) that are a pure function of
//! the seed, the stream and the token number, so any part of the output can be written again
//! later (TGI's `generated_text`, the Responses API's `.done` events) without keeping it.

mod anthropic;
mod gemini;
mod ollama;
mod openai;
mod realtime;
mod responses;
mod tgi;

use std::fmt::Write as _;
use std::ops::Range;
use std::sync::Arc;

use bytes::BytesMut;

use super::config::{ReasoningField, ResponsesReasoning, ThinkTags};
use super::phases::{Output, Phase, Segment};

/// Which API a request came in on, and so which shape its response has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Api {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completions,
    /// TGI's `POST /generate_stream`.
    Tgi,
    /// Anthropic's `POST /v1/messages`.
    Anthropic,
    /// The OpenAI Responses API, `POST /v1/responses`.
    Responses,
    /// Ollama's `POST /api/chat`.
    Ollama,
    /// Gemini's `POST /v1beta/models/{model}:streamGenerateContent` (and `:generateContent`).
    Gemini,
    /// The OpenAI Realtime API, `GET /v1/realtime` upgraded to a WebSocket.
    Realtime,
}

// === impl Api ===

impl Api {
    /// Every API the sim speaks.
    #[cfg(test)]
    pub(crate) const ALL: [Api; 8] = [
        Api::Chat,
        Api::Completions,
        Api::Tgi,
        Api::Anthropic,
        Api::Responses,
        Api::Ollama,
        Api::Gemini,
        Api::Realtime,
    ];

    /// Whether the API has a field or block of its own for reasoning; without one a reasoning
    /// model's thinking travels inline in the text.
    pub(crate) fn has_reasoning_field(self) -> bool {
        !matches!(self, Api::Completions | Api::Tgi | Api::Realtime)
    }

    /// Whether the API streams the model's reasoning at all (the Realtime API does not).
    pub(crate) fn streams_reasoning(self) -> bool {
        self != Api::Realtime
    }

    /// Whether the API carries tool calls.
    pub(crate) fn has_tool_calls(self) -> bool {
        !matches!(self, Api::Completions | Api::Tgi)
    }

    /// How this API carries reasoning that a configuration wants carried as `wanted`: an API with
    /// no reasoning field carries it inline whatever a reasoning parser would do.
    pub(crate) fn think_tags(self, wanted: ThinkTags) -> ThinkTags {
        match wanted {
            ThinkTags::Parser if !self.has_reasoning_field() => ThinkTags::Inline,
            other => other,
        }
    }

    /// The media type of a streamed answer.
    pub(crate) fn stream_content_type(self) -> &'static str {
        match self {
            Api::Ollama => "application/x-ndjson",
            _ => "text/event-stream",
        }
    }
}

/// Why the output ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finish {
    /// The model chose to stop (the sim's default length was used).
    Stop,
    /// The request's token limit (or the sim's cap) was reached.
    Length,
    /// The model called tools and waits for their results.
    ToolCalls,
}

/// One stream's fixed facts, enough to write any of its events.
#[derive(Debug, Clone)]
pub(crate) struct Wire {
    /// The API whose shape is written.
    pub api: Api,
    /// The stream's sequence number, part of every ID.
    pub seq: u64,
    /// Unix seconds at the request's arrival (`created`).
    pub created: u64,
    /// The model name as a JSON string literal, quotes included (escaped once at start-up).
    pub model_json: std::sync::Arc<str>,
    /// Seed of the stream's words.
    pub word_seed: u64,
    /// Prompt tokens reported in usage.
    pub prompt_tokens: u64,
    /// What the stream outputs, phase by phase.
    pub output: Output,
    /// Why the output ends.
    pub finish: Finish,
    /// Whether the OpenAI shapes end with a usage chunk.
    pub usage: bool,
    /// Whether every OpenAI token chunk carries the running usage (vLLM's
    /// `stream_options.continuous_usage_stats`).
    pub continuous_usage: bool,
    /// OpenAI chat: the delta field(s) of the reasoning.
    pub reasoning_field: ReasoningField,
    /// Responses API: the events of the reasoning.
    pub responses_reasoning: ResponsesReasoning,
    /// Events written so far: the Responses API numbers every event (`sequence_number`), the
    /// Realtime API names it (`event_id`).
    pub written: u64,
    /// Realtime API: the interface's event names and whether the response speaks.
    pub realtime: RealtimeStyle,
}

/// How a Realtime response is written: in the beta interface's event names or the GA ones, as
/// text or as speech, and in which session's conversation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RealtimeStyle {
    /// The beta interface (`OpenAI-Beta: realtime=v1`): `response.text.delta` and its kin.
    pub beta: bool,
    /// Base64 of one token's audio when the response speaks (each step then sends its
    /// transcript and its audio); `None` when it writes text.
    pub audio: Option<Arc<str>>,
    /// The WebSocket session's number, in the `conversation_id`.
    pub session: u64,
}

/// The name of the function every sim tool call calls.
const TOOL_NAME: &str = "lookup";

/// How a format writes the think tags: as they are, or with `<` and `>` escaped as Go's
/// `encoding/json` writes them (Ollama).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tags {
    Plain,
    GoEscaped,
}

// === impl Wire ===

impl Wire {
    /// Events sent before the first decode step, each in its own frame.
    pub(crate) fn preamble_len(&self) -> usize {
        match self.api {
            Api::Chat | Api::Completions => openai::preamble_len(self),
            Api::Anthropic => anthropic::preamble_len(self),
            Api::Responses => responses::preamble_len(self),
            Api::Realtime => realtime::preamble_len(self),
            Api::Tgi | Api::Ollama | Api::Gemini => 0,
        }
    }

    /// Writes preamble event `i` (`i < preamble_len()`).
    pub(crate) fn write_preamble(&mut self, i: usize, buf: &mut BytesMut) {
        match self.api {
            Api::Chat | Api::Completions => openai::write_preamble(self, i, buf),
            Api::Anthropic => anthropic::write_preamble(self, i, buf),
            Api::Responses => responses::write_preamble(self, i, buf),
            Api::Realtime => realtime::write_preamble(self, i, buf),
            Api::Tgi | Api::Ollama | Api::Gemini => {}
        }
    }

    /// Writes the decode step of tokens `first..first + tokens` (all of one run, see
    /// [`Output::run_end`]) with the events that close and open segments before it, and returns
    /// the token events written: one, one per token (TGI), or none (a step inside a tool call
    /// that the API sends whole once it is complete).
    pub(crate) fn write_step(&mut self, first: u64, tokens: u32, buf: &mut BytesMut) -> u32 {
        let range = first..first + u64::from(tokens);
        match self.api {
            Api::Chat | Api::Completions => openai::write_step(self, range, buf),
            Api::Tgi => tgi::write_step(self, range, buf),
            Api::Anthropic => anthropic::write_step(self, range, buf),
            Api::Responses => responses::write_step(self, range, buf),
            Api::Ollama => ollama::write_step(self, range, buf),
            Api::Gemini => gemini::write_step(self, range, buf),
            Api::Realtime => realtime::write_step(self, range, buf),
        }
    }

    /// Events sent after the last decode step, each in its own frame.
    pub(crate) fn trailer_len(&self) -> usize {
        match self.api {
            Api::Chat | Api::Completions => openai::trailer_len(self),
            Api::Anthropic => anthropic::trailer_len(self),
            Api::Responses => responses::trailer_len(self),
            Api::Realtime => realtime::trailer_len(self),
            Api::Tgi | Api::Ollama | Api::Gemini => 1,
        }
    }

    /// Writes trailer event `i` (`i < trailer_len()`).
    pub(crate) fn write_trailer(&mut self, i: usize, buf: &mut BytesMut) {
        match self.api {
            Api::Chat | Api::Completions => openai::write_trailer(self, i, buf),
            Api::Tgi => tgi::write_trailer(self, buf),
            Api::Anthropic => anthropic::write_trailer(self, i, buf),
            Api::Responses => responses::write_trailer(self, i, buf),
            Api::Ollama => ollama::write_trailer(self, buf),
            Api::Gemini => gemini::write_trailer(self, buf),
            Api::Realtime => realtime::write_trailer(self, i, buf),
        }
    }

    /// Room trailer event `i` needs beyond a fixed head: the ones that repeat the whole output.
    pub(crate) fn trailer_size_hint(&self, i: usize) -> usize {
        let whole = usize::try_from(self.output.total()).unwrap_or(0) * 10;
        match (self.api, i) {
            (Api::Tgi, _) | (Api::Responses, _) => 256 + whole,
            (Api::Realtime, _) => realtime::trailer_size_hint(self),
            _ => 256,
        }
    }

    /// The whole response of a request that did not ask for a stream, as its API shapes it.
    pub(crate) fn whole_body(&self, model: &str) -> serde_json::Value {
        match self.api {
            Api::Chat | Api::Completions => openai::whole(self, model),
            Api::Tgi => tgi::whole(self),
            Api::Anthropic => anthropic::whole(self, model),
            Api::Responses => responses::whole(self, model),
            Api::Ollama => ollama::whole(self, model),
            Api::Gemini => gemini::whole(self, model),
            // Only streamed, over a WebSocket.
            Api::Realtime => serde_json::Value::Null,
        }
    }

    /// The stream's ID as its API spells it.
    pub(crate) fn id(&self) -> String {
        match self.api {
            Api::Chat => format!("chatcmpl-sim-{}", self.seq),
            Api::Completions => format!("cmpl-sim-{}", self.seq),
            Api::Tgi => format!("tgi-sim-{}", self.seq),
            Api::Anthropic => format!("msg_sim_{}", self.seq),
            Api::Responses | Api::Realtime => format!("resp_sim_{}", self.seq),
            Api::Ollama | Api::Gemini => format!("sim-{}", self.seq),
        }
    }

    /// The visible text of tokens `range` as one string: for whole answers and tests.
    pub(crate) fn text_of(&self, range: Range<u64>) -> String {
        let mut buf = BytesMut::new();
        self.write_text(range, Tags::Plain, &mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// The arguments of tool call `k` as JSON text: for whole answers and tests.
    pub(crate) fn arguments_of(&self, k: u64) -> String {
        let mut buf = BytesMut::new();
        self.write_arguments(self.output.range(Segment::ToolCall(k)), false, &mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// The text the reader sees as the answer: the content, after the thinking when that travels
    /// inline (a server without a reasoning parser returns both in its content).
    pub(crate) fn answer_text(&self) -> String {
        self.text_of(self.output.range(Segment::Text))
    }

    /// The thinking, when it has a field of its own.
    pub(crate) fn reasoning_text(&self) -> Option<String> {
        self.output
            .has_thinking_segment()
            .then(|| self.text_of(self.output.range(Segment::Thinking)))
    }

    /// Reasoning tokens a server with a reasoning parser reports in its usage (one without a
    /// parser does not know them, so it reports 0).
    pub(crate) fn reported_reasoning_tokens(&self) -> u64 {
        if self.output.has_thinking_segment() {
            self.output.reasoning
        } else {
            0
        }
    }

    /// The text of tokens `range` (thinking words, think tags, answer words), JSON-safe as
    /// written (no quotes, backslashes or controls).
    fn write_text(&self, range: Range<u64>, tags: Tags, buf: &mut BytesMut) {
        let reasoning = self.output.reasoning;
        for index in range {
            match self.output.phase(index) {
                Phase::Reasoning => {
                    let open = index == 0 && self.output.think_tags == ThinkTags::Inline;
                    let close =
                        index + 1 == reasoning && self.output.think_tags != ThinkTags::Parser;
                    if open {
                        write_tag(buf, "think", tags);
                    }
                    if close {
                        write_tag(buf, "/think", tags);
                    }
                    if !open && !close {
                        let _ = write!(buf, " idea{}", self.word(index));
                    }
                }
                Phase::Content => {
                    let _ = write!(buf, " tok{}", self.word(index));
                }
                Phase::ToolCall => {}
            }
        }
    }

    /// The argument text of tool-call tokens `range`: fragments of `{"query": "arg1 arg2 …"}`,
    /// the first token opening the object and the last closing it. `quoted` escapes it for the
    /// inside of a JSON string (the argument deltas), otherwise it is the JSON itself.
    fn write_arguments(&self, range: Range<u64>, quoted: bool, buf: &mut BytesMut) {
        let quote = if quoted { "\\\"" } else { "\"" };
        for index in range {
            let Segment::ToolCall(k) = self.output.segment(index) else {
                continue;
            };
            let call = self.output.range(Segment::ToolCall(k));
            if index == call.start {
                let _ = write!(buf, "{{{quote}query{quote}: {quote}arg{}", self.word(index));
            } else {
                let _ = write!(buf, " arg{}", self.word(index));
            }
            if index + 1 == call.end {
                let _ = write!(buf, "{quote}}}");
            }
        }
    }

    /// The word number of token `index`: splitmix64 of the stream's word seed and the index.
    fn word(&self, index: u64) -> u64 {
        let mut z = self
            .word_seed
            .wrapping_add(index.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % 1000
    }

    /// The tool call ID of call `k`, with the API's prefix (written where it goes, not built).
    fn call_id(&self, prefix: &'static str, k: u64) -> CallId {
        CallId {
            prefix,
            seq: self.seq,
            k,
        }
    }
}

/// A tool call's ID: the API's prefix, the stream and the call.
#[derive(Debug, Clone, Copy)]
struct CallId {
    prefix: &'static str,
    seq: u64,
    k: u64,
}

impl std::fmt::Display for CallId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}_{}", self.prefix, self.seq, self.k)
    }
}

/// The events a format writes around its segments (blocks, items): how many open and close each,
/// and how to write event `j` of them.
struct SegmentEvents {
    opens: fn(Segment) -> usize,
    closes: fn(Segment) -> usize,
    open: fn(&mut Wire, Segment, usize, &mut BytesMut),
    close: fn(&mut Wire, Segment, usize, &mut BytesMut),
}

// === impl SegmentEvents ===

impl SegmentEvents {
    /// When token `token` starts a segment other than the first: the events that close the one
    /// before and open the new one.
    fn cross(&self, w: &mut Wire, token: u64, buf: &mut BytesMut) {
        if let Some((closed, opened)) = w.output.boundary_at(token) {
            for j in 0..(self.closes)(closed) {
                (self.close)(w, closed, j, buf);
            }
            for j in 0..(self.opens)(opened) {
                (self.open)(w, opened, j, buf);
            }
        }
    }
}

/// Writes `<name>` as the format spells it.
fn write_tag(buf: &mut BytesMut, name: &str, tags: Tags) {
    let (open, close) = match tags {
        Tags::Plain => ("<", ">"),
        Tags::GoEscaped => ("\\u003c", "\\u003e"),
    };
    buf.extend_from_slice(open.as_bytes());
    buf.extend_from_slice(name.as_bytes());
    buf.extend_from_slice(close.as_bytes());
}

/// Starts an SSE event: its `event:` line if named, then `data: `.
fn begin(buf: &mut BytesMut, name: Option<&str>) {
    if let Some(name) = name {
        buf.extend_from_slice(b"event: ");
        buf.extend_from_slice(name.as_bytes());
        buf.extend_from_slice(b"\n");
    }
    buf.extend_from_slice(b"data: ");
}

/// Ends an SSE event.
fn end(buf: &mut BytesMut) {
    buf.extend_from_slice(b"\n\n");
}

#[cfg(test)]
pub(crate) mod testing {
    //! What the shape tests share: a wire, a whole stream written with its events parsed, and
    //! the phase of each token event as the proxy's reader of that API would see it.

    use super::*;
    use crate::scan::{scan_all, Framing};

    /// A wire for `api` whose stream outputs `output`.
    pub(crate) fn wire(api: Api, mut output: Output) -> Wire {
        output.think_tags = api.think_tags(output.think_tags);
        Wire {
            api,
            seq: 3,
            created: 1_700_000_000,
            model_json: "\"sim-model\"".into(),
            word_seed: 42,
            prompt_tokens: 5,
            output,
            finish: Finish::Length,
            usage: true,
            continuous_usage: false,
            reasoning_field: ReasoningField::ReasoningContent,
            responses_reasoning: ResponsesReasoning::Summary,
            written: 0,
            realtime: RealtimeStyle::default(),
        }
    }

    /// A reasoning agent: `r` reasoning tokens, `c` answer tokens, `n` tool calls of `a` tokens.
    pub(crate) fn agent(r: u64, c: u64, n: u64, a: u64, think_tags: ThinkTags) -> Output {
        Output {
            reasoning: r,
            content: c,
            tool_calls: n,
            tool_call_tokens: a,
            think_tags,
        }
    }

    /// One written stream: its events (SSE type or "" and parsed data; `[DONE]` is `null`) and,
    /// per decode step, the number of token events the step wrote.
    pub(crate) struct Written {
        pub events: Vec<(String, serde_json::Value)>,
        pub step_events: Vec<u32>,
        /// The phase of each decode step.
        pub step_phases: Vec<Phase>,
        pub bytes: Vec<u8>,
        /// The thinking was opened in the prompt: the stream starts inside it (a stream that
        /// does not think starts in its answer even so, as a template that closes the thinking
        /// in the prompt too makes it).
        pub opened_in_prompt: bool,
    }

    /// Writes a whole stream in steps of one token, except the answer's second step, which
    /// takes 3 tokens when the answer has room (a multi-token step, as speculative decoding
    /// makes).
    pub(crate) fn write_all(w: &mut Wire) -> Written {
        let multi = w.output.answer_start() + 1;
        write_in_steps(w, |token| if token == multi { 3 } else { 1 })
    }

    /// Writes a whole stream whose step at token `t` wants `step(t)` tokens (cut at the end
    /// of its run, as the cadence cuts it).
    pub(crate) fn write_in_steps(w: &mut Wire, step: impl Fn(u64) -> u64) -> Written {
        let mut buf = BytesMut::new();
        for i in 0..w.preamble_len() {
            w.write_preamble(i, &mut buf);
        }
        let mut step_events = Vec::new();
        let mut step_phases = Vec::new();
        let mut token = 0;
        while token < w.output.total() {
            let room = w.output.run_end(token) - token;
            let tokens = step(token).clamp(1, room);
            step_phases.push(w.output.phase(token));
            step_events.push(w.write_step(token, tokens as u32, &mut buf));
            token += tokens;
        }
        for i in 0..w.trailer_len() {
            w.write_trailer(i, &mut buf);
        }
        let framing = if w.api == Api::Ollama {
            Framing::Ndjson
        } else {
            Framing::Sse
        };
        let events = scan_all(framing, &buf, 1 << 20)
            .events
            .into_iter()
            .map(|(kind, data, _)| {
                let kind = String::from_utf8(kind).unwrap();
                let value = if data == b"[DONE]" {
                    serde_json::Value::Null
                } else {
                    serde_json::from_slice(&data)
                        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&data)))
                };
                (kind, value)
            })
            .collect();
        Written {
            events,
            step_events,
            step_phases,
            bytes: buf.to_vec(),
            opened_in_prompt: w.output.think_tags == ThinkTags::OpenInPrompt
                && w.output.reasoning > 0,
        }
    }

    /// What an event carries, read from the API's fields as a client reads them: text (the
    /// answer, or thinking between think tags), reasoning in a field of its own, tool-call
    /// arguments, or nothing a reader sees.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub(crate) enum Carries {
        Text(String),
        Reasoning,
        ToolCall,
    }

    fn non_empty(v: &serde_json::Value, pointer: &str) -> Option<String> {
        v.pointer(pointer)
            .and_then(serde_json::Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    }

    /// What event `v` of `api` carries.
    pub(crate) fn carries(api: Api, v: &serde_json::Value) -> Option<Carries> {
        let text = |pointer: &str| non_empty(v, pointer).map(Carries::Text);
        let field = |pointer: &str, what: Carries| non_empty(v, pointer).map(|_| what);
        match api {
            Api::Chat => text("/choices/0/delta/content")
                .or_else(|| {
                    field(
                        "/choices/0/delta/tool_calls/0/function/arguments",
                        Carries::ToolCall,
                    )
                })
                .or_else(|| field("/choices/0/delta/reasoning_content", Carries::Reasoning))
                .or_else(|| field("/choices/0/delta/reasoning", Carries::Reasoning)),
            Api::Completions => text("/choices/0/text"),
            Api::Tgi if v.pointer("/token/special") == Some(&serde_json::Value::Bool(true)) => None,
            Api::Tgi => text("/token/text"),
            Api::Anthropic => match v.pointer("/delta/type")?.as_str()? {
                "text_delta" => text("/delta/text"),
                "thinking_delta" => field("/delta/thinking", Carries::Reasoning),
                "input_json_delta" => field("/delta/partial_json", Carries::ToolCall),
                _ => None,
            },
            Api::Responses => match v["type"].as_str()? {
                "response.output_text.delta" => text("/delta"),
                "response.reasoning_text.delta" | "response.reasoning_summary_text.delta" => {
                    field("/delta", Carries::Reasoning)
                }
                "response.function_call_arguments.delta" => field("/delta", Carries::ToolCall),
                _ => None,
            },
            Api::Realtime => match v["type"].as_str()? {
                "response.output_text.delta"
                | "response.text.delta"
                | "response.output_audio_transcript.delta"
                | "response.audio_transcript.delta" => text("/delta"),
                "response.output_audio.delta" | "response.audio.delta" => None,
                "response.function_call_arguments.delta" => field("/delta", Carries::ToolCall),
                _ => None,
            },
            Api::Ollama => text("/message/content")
                .or_else(|| {
                    v.pointer("/message/tool_calls/0/function")
                        .map(|_| Carries::ToolCall)
                })
                .or_else(|| field("/message/thinking", Carries::Reasoning)),
            Api::Gemini => {
                let parts = v.pointer("/candidates/0/content/parts")?.as_array()?;
                let is_thought = |p: &serde_json::Value| p["thought"] == true;
                let shown =
                    |p: &serde_json::Value| p["text"].as_str().is_some_and(|t| !t.is_empty());
                let answer: String = parts
                    .iter()
                    .filter(|p| !is_thought(p))
                    .filter_map(|p| p["text"].as_str())
                    .collect();
                if !answer.is_empty() {
                    Some(Carries::Text(answer))
                } else if parts.iter().any(|p| p.get("functionCall").is_some()) {
                    Some(Carries::ToolCall)
                } else {
                    parts
                        .iter()
                        .any(|p| is_thought(p) && shown(p))
                        .then_some(Carries::Reasoning)
                }
            }
        }
    }

    /// The phase of each event of a written stream (`None`: no token event). Text is thinking
    /// from an opening `<think>` (or from the start when the thinking was opened in the prompt)
    /// through the event with `</think>`.
    pub(crate) fn event_phases(
        written: &Written,
        api: Api,
        opened_in_prompt: bool,
    ) -> Vec<Option<Phase>> {
        let mut thinking = opened_in_prompt.then_some(true);
        written
            .events
            .iter()
            .map(|(_, v)| match carries(api, v)? {
                Carries::Reasoning => Some(Phase::Reasoning),
                Carries::ToolCall => Some(Phase::ToolCall),
                Carries::Text(text) => {
                    if !*thinking.get_or_insert(text.starts_with("<think>")) {
                        return Some(Phase::Content);
                    }
                    if text.contains("</think>") {
                        thinking = Some(false);
                    }
                    Some(Phase::Reasoning)
                }
            })
            .collect()
    }

    /// The phases of the token events, in order, run-length encoded: `[(Reasoning, 4), ...]`.
    pub(crate) fn phase_runs(written: &Written, api: Api) -> Vec<(Phase, usize)> {
        let opened = written.opened_in_prompt;
        let mut runs: Vec<(Phase, usize)> = Vec::new();
        for phase in event_phases(written, api, opened).into_iter().flatten() {
            match runs.last_mut() {
                Some((last, n)) if *last == phase => *n += 1,
                _ => runs.push((phase, 1)),
            }
        }
        runs
    }

    /// For each event of type `kind`: the numbers at `index` and the strings at `kind_of` (the
    /// blocks or items a stream opens, in order).
    pub(crate) fn opened<'a>(
        written: &'a Written,
        kind: &str,
        index: &str,
        kind_of: &str,
    ) -> Vec<(u64, &'a str)> {
        written
            .events
            .iter()
            .filter(|(k, _)| k == kind)
            .filter_map(|(_, v)| Some((v.get(index)?.as_u64()?, v.pointer(kind_of)?.as_str()?)))
            .collect()
    }

    /// Concatenates the strings at `pointer` of the events whose phase is `phase`.
    pub(crate) fn joined(written: &Written, api: Api, phase: Phase, pointer: &str) -> String {
        let opened = written.opened_in_prompt;
        written
            .events
            .iter()
            .zip(event_phases(written, api, opened))
            .filter(|(_, p)| *p == Some(phase))
            .filter_map(|((_, v), _)| v.pointer(pointer).and_then(serde_json::Value::as_str))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;
    use proptest::prelude::*;

    const APIS: [Api; 8] = Api::ALL;
    const TAGS: [ThinkTags; 3] = [
        ThinkTags::Parser,
        ThinkTags::Inline,
        ThinkTags::OpenInPrompt,
    ];
    const FIELDS: [ReasoningField; 3] = [
        ReasoningField::ReasoningContent,
        ReasoningField::Reasoning,
        ReasoningField::Both,
    ];

    proptest! {
        /// For every API, output plan and cut into decode steps, a client reading the wire
        /// finds each step's token events in the step's phase, in order, and the answer text
        /// whole.
        #[test]
        fn every_shape_writes_each_phase_exactly(
            api in 0..APIS.len(),
            (reasoning, content, tool_calls, tool_call_tokens) in (0u64..6, 1u64..6, 0u64..3, 1u64..4),
            tags in 0..TAGS.len(),
            field in 0..FIELDS.len(),
            summary in any::<bool>(),
            steps in proptest::collection::vec(1u64..4, 1..6),
        ) {
            let api = APIS[api];
            let output = Output {
                reasoning,
                content,
                tool_calls: if api.has_tool_calls() { tool_calls } else { 0 },
                tool_call_tokens,
                think_tags: TAGS[tags],
            };
            let mut w = wire(api, output);
            w.reasoning_field = FIELDS[field];
            w.responses_reasoning = if summary { ResponsesReasoning::Summary } else { ResponsesReasoning::Text };
            w.finish = if w.output.tool_calls > 0 { Finish::ToolCalls } else { Finish::Stop };
            let written = write_in_steps(&mut w, |t| steps[t as usize % steps.len()]);
            let mut expected: Vec<(Phase, usize)> = Vec::new();
            for (phase, events) in written.step_phases.iter().zip(&written.step_events) {
                let events = *events as usize;
                match expected.last_mut() {
                    _ if events == 0 => {}
                    Some((last, n)) if last == phase => *n += events,
                    _ => expected.push((*phase, events)),
                }
            }
            prop_assert_eq!(phase_runs(&written, api), expected);
            let opened = written.opened_in_prompt;
            let text: String = written
                .events
                .iter()
                .filter_map(|(_, v)| match carries(api, v) {
                    Some(Carries::Text(t)) => Some(t),
                    _ => None,
                })
                .collect();
            prop_assert_eq!(text, w.answer_text());
            prop_assert_eq!(
                event_phases(&written, api, opened).iter().flatten().count(),
                written.step_events.iter().sum::<u32>() as usize
            );
            if api == Api::Responses {
                for (i, (_, v)) in written.events.iter().enumerate() {
                    prop_assert_eq!(&v["sequence_number"], &serde_json::json!(i));
                }
            }
        }
    }

    #[test]
    fn words_repeat_for_the_same_seed() {
        let w = wire(Api::Chat, Output::answer(4));
        let text = w.answer_text();
        assert_eq!(text, wire(Api::Chat, Output::answer(4)).answer_text());
        assert!(text.starts_with(" tok"));
        let other = Wire {
            word_seed: 43,
            ..wire(Api::Chat, Output::answer(4))
        };
        assert_ne!(text, other.answer_text());
    }

    #[test]
    fn inline_thinking_is_wrapped_in_think_tags_each_a_token() {
        let w = wire(Api::Chat, agent(4, 2, 0, 1, ThinkTags::Inline));
        let thinking = w.text_of(0..4);
        assert!(thinking.starts_with("<think> idea"), "{thinking}");
        assert!(thinking.ends_with("</think>"), "{thinking}");
        assert_eq!(w.text_of(0..1), "<think>");
        assert_eq!(w.text_of(3..4), "</think>");
        let one = wire(Api::Chat, agent(1, 2, 0, 1, ThinkTags::Inline));
        assert_eq!(one.text_of(0..1), "<think></think>");
        let open = wire(Api::Chat, agent(3, 2, 0, 1, ThinkTags::OpenInPrompt));
        let thinking = open.text_of(0..3);
        assert!(thinking.starts_with(" idea") && thinking.ends_with("</think>"));
        assert!(!thinking.contains("<think>"));
        assert_eq!(open.reasoning_text(), None);
        assert_eq!(open.answer_text(), open.text_of(0..5));
    }

    #[test]
    fn tool_arguments_join_into_json() {
        let w = wire(Api::Chat, agent(0, 1, 2, 4, ThinkTags::Parser));
        for k in 0..2 {
            let args: serde_json::Value = serde_json::from_str(&w.arguments_of(k)).unwrap();
            let query = args["query"].as_str().unwrap();
            assert_eq!(query.split(' ').count(), 4, "{query}");
            assert!(query.starts_with("arg"));
        }
        let one = wire(Api::Chat, agent(0, 1, 1, 1, ThinkTags::Parser));
        let args: serde_json::Value = serde_json::from_str(&one.arguments_of(0)).unwrap();
        assert!(args["query"].as_str().unwrap().starts_with("arg"));
    }
}
